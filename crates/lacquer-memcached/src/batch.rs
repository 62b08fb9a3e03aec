//! Opportunistic batching of gets to one memcached server.
//!
//! Every hit served from memcached costs a round trip, and on a busy node the round trip's
//! fixed costs (a send that wakes the server, a receive that wakes us, an epoll turn) outweigh
//! the bytes. So gets to one server are batched without waiting for anything: while the server
//! already has [`PARTIAL_BATCHES_IN_FLIGHT`] batches outstanding, new gets queue up; when a
//! batch returns, the first queued caller becomes the next leader and sends everything queued
//! (up to `max_keys`) as one pipelined multi-get, each distinct key once. A queue that holds a
//! full batch does not wait: it leaves at once while fewer than `max_in_flight` batches are out,
//! so a busy node behind a long round trip is not held to two batches per round trip. An idle
//! server sees no delay at all: a get that finds a free slot goes out at once.
//!
//! This is leader/follower hand-off rather than a background task, so there is nothing to spawn
//! and nothing to shut down. A leader whose caller goes away hands leadership on when it drops;
//! the followers of its batch see a miss, which is always safe.

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::Future;
use tokio::sync::oneshot;

/// Batches out at once before new gets queue (unless a full batch is waiting): one on the wire
/// while the next collects. Measured with `bench/memcached_syscalls.sh` (64 clients, 2,000
/// pages, every hit a memcached read): with 8 out (the pool's size, as before) 3.24 syscalls per
/// hit on loopback and 2.87 at 0.1 ms each way; with 2, 2.84 and 2.42; with 1, 2.78 and 2.38
/// (and a queue that waits a whole round trip behind each batch).
pub const PARTIAL_BATCHES_IN_FLIGHT: usize = 2;

/// What a queued get is told.
enum Message {
    /// The value fetched for its key (`None`: a miss or a failed batch).
    Value(Option<Bytes>),
    /// A slot is free: lead the next batch.
    Lead,
}

struct Waiter {
    key: Vec<u8>,
    reply: oneshot::Sender<Message>,
}

struct State {
    queue: VecDeque<Waiter>,
    in_flight: usize,
}

/// Batches concurrent gets to one server; see the module docs.
pub struct GetBatcher {
    state: Mutex<State>,
    max_in_flight: usize,
    max_keys: usize,
}

impl GetBatcher {
    /// A batcher that keeps at most `max_in_flight` batches of at most `max_keys` keys
    /// outstanding (more than [`PARTIAL_BATCHES_IN_FLIGHT`] only when each is full).
    pub fn new(max_in_flight: usize, max_keys: usize) -> Self {
        GetBatcher {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                in_flight: 0,
            }),
            max_in_flight: max_in_flight.max(1),
            max_keys: max_keys.max(1),
        }
    }

    /// Gets `key`, alone or in a batch, by `deadline`. `fetch` performs one multi-get (values in
    /// key order, or `None` when the batch failed), is called once per batch this caller leads,
    /// and must itself end by `deadline`: the leader's only timer is the one inside its fetch
    /// (one timer per hit, not three), and a queued caller waits for its value or its turn to
    /// lead until `deadline` (then it is a miss).
    pub async fn get<F, Fut>(
        &self,
        key: &[u8],
        deadline: tokio::time::Instant,
        fetch: F,
    ) -> Option<Bytes>
    where
        F: FnOnce(Vec<Vec<u8>>) -> Fut,
        Fut: Future<Output = Option<Vec<Option<Bytes>>>>,
    {
        let queued = {
            let mut state = self.state.lock();
            let slot_free = state.in_flight < PARTIAL_BATCHES_IN_FLIGHT.min(self.max_in_flight);
            let full_batch_waiting =
                state.in_flight < self.max_in_flight && state.queue.len() + 1 >= self.max_keys;
            if slot_free || full_batch_waiting {
                state.in_flight += 1;
                None
            } else {
                let (reply, receiver) = oneshot::channel();
                state.queue.push_back(Waiter {
                    key: key.to_vec(),
                    reply,
                });
                Some(receiver)
            }
        };
        if let Some(receiver) = queued {
            let mut queued = Queued {
                batcher: self,
                receiver,
            };
            match tokio::time::timeout_at(deadline, &mut queued.receiver).await {
                Ok(Ok(Message::Value(value))) => return value,
                Ok(Ok(Message::Lead)) => {}
                // the leader of our batch went away: a miss
                Ok(Err(_)) => return None,
                // out of time in the queue: a miss (a slot handed to us meanwhile goes on to
                // the next waiter, see `release`)
                Err(_) => return None,
            }
        }
        self.lead(key, fetch).await
    }

    /// Sends `own` plus whatever is queued as one multi-get and hands out the values.
    async fn lead<F, Fut>(&self, own: &[u8], fetch: F) -> Option<Bytes>
    where
        F: FnOnce(Vec<Vec<u8>>) -> Fut,
        Fut: Future<Output = Option<Vec<Option<Bytes>>>>,
    {
        let _slot = Slot(self);
        let followers: Vec<Waiter> = {
            let mut state = self.state.lock();
            let take = state.queue.len().min(self.max_keys - 1);
            state.queue.drain(..take).collect()
        };
        // each distinct key once; `slots[i]` is the position of follower i's key
        let mut keys: Vec<Vec<u8>> = vec![own.to_vec()];
        let mut slots = Vec::with_capacity(followers.len());
        for waiter in &followers {
            let position = match keys.iter().position(|k| *k == waiter.key) {
                Some(position) => position,
                None => {
                    keys.push(waiter.key.clone());
                    keys.len() - 1
                }
            };
            slots.push(position);
        }
        let values = fetch(keys).await;
        for (waiter, position) in followers.into_iter().zip(slots) {
            let value = values
                .as_ref()
                .and_then(|v| v.get(position).cloned().flatten());
            // a follower that gave up is simply not told
            let _ = waiter.reply.send(Message::Value(value));
        }
        values.and_then(|mut v| v.swap_remove(0))
    }

    /// Frees a batch slot and passes it to the first queued caller still waiting.
    fn release(&self) {
        let mut state = self.state.lock();
        state.in_flight -= 1;
        while let Some(waiter) = state.queue.pop_front() {
            if waiter.reply.send(Message::Lead).is_ok() {
                state.in_flight += 1;
                return;
            }
        }
    }

    /// Batches outstanding and gets queued behind them (for tests and diagnostics).
    pub fn load(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.in_flight, state.queue.len())
    }
}

/// A queued get's receiver. A get that stops waiting (out of time, or its caller gone) just as
/// a slot is handed to it would otherwise take the slot with it: the hand-off is passed on.
struct Queued<'a> {
    batcher: &'a GetBatcher,
    receiver: oneshot::Receiver<Message>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Ok(Message::Lead) = self.receiver.try_recv() {
            self.batcher.release();
        }
    }
}

/// A batch slot, released (and handed on) however the leader's future ends.
struct Slot<'a>(&'a GetBatcher);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::sync::Notify;

    fn value_of(key: &[u8]) -> Option<Bytes> {
        (key != b"missing").then(|| Bytes::from([b"v:", key].concat()))
    }

    /// A deadline no test reaches.
    fn far() -> tokio::time::Instant {
        tokio::time::Instant::now() + std::time::Duration::from_secs(3600)
    }

    type Fetched = std::pin::Pin<Box<dyn Future<Output = Option<Vec<Option<Bytes>>>> + Send>>;

    /// A fetch that records its batches and waits for `gate` before answering.
    fn gated_fetch(
        batches: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
        gate: Arc<Notify>,
    ) -> impl FnOnce(Vec<Vec<u8>>) -> Fetched {
        move |keys| {
            Box::pin(async move {
                batches.lock().push(keys.clone());
                gate.notified().await;
                Some(keys.iter().map(|k| value_of(k)).collect())
            })
        }
    }

    /// A task getting `key` by `deadline` through `batcher`, its batches fetched by
    /// [`gated_fetch`].
    fn spawn_get(
        batcher: &Arc<GetBatcher>,
        batches: &Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
        gate: &Arc<Notify>,
        key: &'static [u8],
        deadline: tokio::time::Instant,
    ) -> tokio::task::JoinHandle<Option<Bytes>> {
        let (batcher, batches, gate) = (batcher.clone(), batches.clone(), gate.clone());
        tokio::spawn(async move { batcher.get(key, deadline, gated_fetch(batches, gate)).await })
    }

    #[tokio::test]
    async fn an_idle_server_gets_each_key_at_once() {
        let batcher = GetBatcher::new(2, 16);
        let calls = AtomicUsize::new(0);
        for key in [&b"a"[..], b"b", b"missing"] {
            let got = batcher
                .get(key, far(), |keys| {
                    calls.fetch_add(1, Ordering::Relaxed);
                    async move { Some(keys.iter().map(|k| value_of(k)).collect()) }
                })
                .await;
            assert_eq!(got, value_of(key));
        }
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        assert_eq!(batcher.load(), (0, 0));
    }

    #[tokio::test]
    async fn gets_queued_behind_a_busy_server_go_out_as_one_deduplicated_batch() {
        let batcher = Arc::new(GetBatcher::new(1, 16));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        for key in ["first", "x", "y", "x", "missing", "x"] {
            tasks.push((
                key,
                spawn_get(&batcher, &batches, &gate, key.as_bytes(), far()),
            ));
            // let each task reach the batcher in order
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
        }
        assert_eq!(
            batcher.load(),
            (1, 5),
            "one batch out, five queued behind it"
        );
        // release batches one at a time until every task is done
        while tasks.iter().any(|(_, t)| !t.is_finished()) {
            gate.notify_one();
            tokio::task::yield_now().await;
        }
        for (key, task) in tasks {
            let got = task.await.unwrap();
            assert_eq!(got, value_of(key.as_bytes()), "{key}");
        }
        let batches = batches.lock();
        assert_eq!(batches.len(), 2, "{batches:?}");
        assert_eq!(batches[0], vec![b"first".to_vec()]);
        let second: Vec<&[u8]> = batches[1].iter().map(|k| &k[..]).collect();
        assert_eq!(second, vec![&b"x"[..], b"y", b"missing"]);
        assert_eq!(batcher.load(), (0, 0));
    }

    #[tokio::test]
    async fn a_cancelled_leader_hands_its_slot_to_the_next_queued_get() {
        let batcher = Arc::new(GetBatcher::new(1, 16));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let leader = spawn_get(&batcher, &batches, &gate, b"a", far());
        tokio::task::yield_now().await;
        let follower = spawn_get(&batcher, &batches, &gate, b"b", far());
        tokio::task::yield_now().await;
        assert_eq!(batcher.load(), (1, 1));
        leader.abort();
        let _ = leader.await;
        // the follower was handed the slot and leads its own batch
        while batches.lock().len() < 2 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        assert_eq!(follower.await.unwrap(), value_of(b"b"));
        assert_eq!(batcher.load(), (0, 0));
    }

    #[tokio::test]
    async fn a_queued_get_out_of_time_is_a_miss_and_leaks_no_slot() {
        let batcher = Arc::new(GetBatcher::new(1, 16));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let leader = spawn_get(&batcher, &batches, &gate, b"a", far());
        tokio::task::yield_now().await;
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(50);
        let late = spawn_get(&batcher, &batches, &gate, b"b", soon);
        tokio::task::yield_now().await;
        assert_eq!(batcher.load(), (1, 1));
        assert_eq!(
            late.await.unwrap(),
            None,
            "out of time in the queue: a miss"
        );
        gate.notify_one();
        assert_eq!(leader.await.unwrap(), value_of(b"a"));
        // the slot the late get would have been handed is free again
        assert_eq!(batcher.load(), (0, 0));
        let again = batcher
            .get(b"c", far(), |keys| async move {
                Some(keys.iter().map(|k| value_of(k)).collect())
            })
            .await;
        assert_eq!(again, value_of(b"c"));
        assert_eq!(batches.lock().len(), 1, "the late get never led a batch");
    }

    #[tokio::test]
    async fn a_slot_handed_to_a_get_that_stopped_waiting_goes_to_the_next() {
        let batcher = Arc::new(GetBatcher::new(1, 16));
        let (reply, receiver) = oneshot::channel();
        // a queued get whose hand-off arrives as it gives up: `release` counted the slot as
        // its own
        batcher.state.lock().in_flight = 1;
        assert!(reply.send(Message::Lead).is_ok());
        drop(Queued {
            batcher: &batcher,
            receiver,
        });
        assert_eq!(batcher.load(), (0, 0), "the slot was released, not kept");
    }

    #[tokio::test]
    async fn beyond_two_batches_out_a_get_waits_unless_a_full_batch_is_queued() {
        let batcher = Arc::new(GetBatcher::new(8, 4));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let keys = ["a", "b", "c", "d", "e", "f", "g"];
        for (i, key) in keys.into_iter().enumerate() {
            tasks.push((
                key,
                spawn_get(&batcher, &batches, &gate, key.as_bytes(), far()),
            ));
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            let expected = match i {
                // two batches go out at once
                0 | 1 => (i + 1, 0),
                // then gets queue
                2..=4 => (2, i - 1),
                // the fourth queued get makes a full batch: it leaves without waiting
                5 => (3, 0),
                _ => (3, 1),
            };
            assert_eq!(batcher.load(), expected, "after {key}");
        }
        while tasks.iter().any(|(_, t)| !t.is_finished()) {
            gate.notify_one();
            tokio::task::yield_now().await;
        }
        for (key, task) in tasks {
            let got = task.await.unwrap();
            assert_eq!(got, value_of(key.as_bytes()), "{key}");
        }
        let batches = batches.lock();
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, 1, 4, 1], "{batches:?}");
        assert_eq!(batcher.load(), (0, 0));
    }
}
