// LACQUER PATCH (inline self-wake): this file is not in the published crate.
//
//! A future that is polled again at once when it wakes itself while being polled.
//!
//! The two halves of an HTTP/1 proxy exchange (`proxy_1to1`) run in one task, joined, and talk
//! through channels: when the upstream half reads the response head it sends it to the downstream
//! half, whose receiver registered the task's own waker. That wakes the task while it is running,
//! which tokio handles as a yield: the task goes to the back of the run queue and, when another
//! worker is parked, that worker is unparked (a `futex` wake, and the parked worker's `futex`
//! wait returning) to come and steal it. On a runtime with two or more workers that was nearly
//! two system calls and a cross-thread hand-over per forwarded request, for a wake-up that needs
//! nothing but another poll of the same future.
//!
//! [`InlineWake`] gives the inner future a waker of its own. A wake while the inner future is
//! being polled is recorded and answered by polling it again here (a bounded number of times, so
//! a future that keeps waking itself still yields to the scheduler); a wake at any other time,
//! from any thread, goes to the task's waker as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// The inner future is being polled.
const POLLING: u8 = 1;
/// The inner future's waker was called.
const WOKEN: u8 = 2;

/// How many times in a row a self-waking future is polled again before it is left to the
/// scheduler (tokio's own cooperative budget makes a busy future wake itself, and that must
/// still yield).
const MAX_INLINE_POLLS: usize = 4;

/// The waker handed to the inner future.
struct Wakeup {
    state: AtomicU8,
    /// The task's waker, as of the last poll.
    task: Mutex<Option<Waker>>,
}

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.fetch_or(WOKEN, Ordering::AcqRel) & POLLING != 0 {
            // `InlineWake::poll` sees WOKEN and polls again
            return;
        }
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

/// `inner`, polled again at once when it wakes itself during a poll (see the module docs).
/// `inner` is `Unpin`: pin a large future where it is (`std::pin::pin!`) and pass the `Pin<&mut
/// _>`, which neither moves nor boxes it.
pub(crate) struct InlineWake<F> {
    inner: F,
    wakeup: Arc<Wakeup>,
    waker: Waker,
}

impl<F: Future + Unpin> InlineWake<F> {
    pub(crate) fn new(inner: F) -> Self {
        let wakeup = Arc::new(Wakeup {
            state: AtomicU8::new(0),
            task: Mutex::new(None),
        });
        InlineWake {
            inner,
            waker: Waker::from(wakeup.clone()),
            wakeup,
        }
    }
}

impl<F: Future + Unpin> Future for InlineWake<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        {
            let mut task = this.wakeup.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_INLINE_POLLS {
            // (a wake recorded before this store is answered by the poll that follows it)
            this.wakeup.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(output) = Pin::new(&mut this.inner).poll(&mut inner_cx) {
                this.wakeup.state.store(0, Ordering::Release);
                return Poll::Ready(output);
            }
            if this
                .wakeup
                .state
                .compare_exchange(POLLING, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // not woken during the poll: a later wake goes to the task's waker
                return Poll::Pending;
            }
        }
        // still waking itself: leave it to the scheduler
        this.wakeup.state.store(0, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task that polls it.
    struct CountingWake(AtomicUsize);

    impl Wake for CountingWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself `times` times, once per poll, then is ready.
    struct SelfWaking {
        times: usize,
        polls: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.times {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn task_waker() -> (Arc<CountingWake>, Waker) {
        let count = Arc::new(CountingWake(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_wake_during_the_poll_is_answered_by_polling_again() {
        let (count, waker) = task_waker();
        let mut cx = Context::from_waker(&waker);
        let mut future = InlineWake::new(SelfWaking { times: 2, polls: 0 });
        // (SelfWaking is Unpin)
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Ready(3));
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "the task was never woken");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_still_yields() {
        let (count, waker) = task_waker();
        let mut cx = Context::from_waker(&waker);
        let mut future = InlineWake::new(SelfWaking {
            times: 100,
            polls: 0,
        });
        assert_eq!(Pin::new(&mut future).poll(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "left to the scheduler");
    }

    #[tokio::test]
    async fn a_wake_after_the_poll_reaches_the_task() {
        // the inner future waits on a channel that another task sends to later
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u8>(1);
        let sender = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            tx.send(7).await.unwrap();
        });
        let received = InlineWake::new(std::pin::pin!(async move { rx.recv().await })).await;
        assert_eq!(received, Some(7));
        sender.await.unwrap();
    }
}
