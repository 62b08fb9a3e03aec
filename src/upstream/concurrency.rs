//! A backend's `max_in_flight`: at most that many requests on it at once, the next ones waiting
//! in a bounded queue, first come first served, for at most `balancer.queue.timeout`; a request
//! that finds the queue full, or waits too long, is answered 503.
//!
//! This protects replicas that can serve one request at a time (a Unicorn worker, a serial
//! application server): with `max_in_flight = 1` such a replica never sees two requests at once,
//! and the proxy, not the replica's listen backlog, holds the line. The slot is taken in
//! `upstream_peer` and kept in the request context until the request ends, so it covers the
//! whole exchange, body included. tokio's semaphore is the queue (it is fair: waiters are served
//! in order); the count of waiters bounds it.

use pingora_error::{Error, ErrorType, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limit of one backend and its queue.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
    queue_length: usize,
    queue_timeout: Duration,
}

/// One request's place on a limited backend; the slot frees when this drops.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

/// Counts one waiter until dropped, however the wait ends (a slot, the timeout, the client
/// going away).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConcurrencyLimit {
    /// `max_in_flight` slots, up to `queue_length` requests waiting, each at most `queue_timeout`.
    pub fn new(max_in_flight: u32, queue_length: u32, queue_timeout: Duration) -> Self {
        ConcurrencyLimit {
            slots: Arc::new(Semaphore::new(max_in_flight as usize)),
            queued: AtomicUsize::new(0),
            queue_length: queue_length as usize,
            queue_timeout,
        }
    }

    /// Requests waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Whether every slot is taken now (a request would wait in the queue, or be refused).
    pub fn is_full(&self) -> bool {
        self.slots.available_permits() == 0
    }

    /// A slot: at once when one is free, else after waiting in the queue; a 503 error when the
    /// queue is full or the wait ends.
    pub async fn acquire(&self) -> Result<Slot> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot(permit));
        }
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.queue_length {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Error::e_explain(
                ErrorType::HTTPStatus(503),
                "backend at max_in_flight and its queue is full",
            );
        }
        let _waiting = Waiting(&self.queued);
        match tokio::time::timeout(self.queue_timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot(permit)),
            _ => Error::e_explain(
                ErrorType::HTTPStatus(503),
                "waited balancer.queue.timeout for a slot on a backend at max_in_flight",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_queue_and_overflow() {
        let limit = Arc::new(ConcurrencyLimit::new(1, 1, Duration::from_secs(30)));
        let first = limit.acquire().await.unwrap();
        let waiter = {
            let limit = limit.clone();
            tokio::spawn(async move { limit.acquire().await.map(|_| ()) })
        };
        while limit.queued() == 0 {
            tokio::task::yield_now().await;
        }
        let overflow = limit.acquire().await.unwrap_err();
        assert_eq!(overflow.etype(), &ErrorType::HTTPStatus(503));
        drop(first);
        waiter.await.unwrap().unwrap();
        assert_eq!(limit.queued(), 0);
    }

    #[tokio::test]
    async fn a_wait_ends_at_the_queue_timeout() {
        let limit = ConcurrencyLimit::new(1, 4, Duration::from_millis(100));
        let _held = limit.acquire().await.unwrap();
        let late = limit.acquire().await.unwrap_err();
        assert_eq!(late.etype(), &ErrorType::HTTPStatus(503));
        assert_eq!(limit.queued(), 0);
    }
}
