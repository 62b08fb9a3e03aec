//! The cap on client connections served at once (`server.max_connections`).
//!
//! Pingora spawns a task for every accepted connection and keeps no count, so a flood of
//! connections (idle, or sending a head slowly) grows memory with their number. [`ConnectionCap`]
//! wraps the proxy's application: a connection holds one of `max_connections` slots for as long
//! as the proxy serves it (every request on it, HTTP/1 keep-alive and HTTP/2 alike); one that
//! finds no free slot is closed at once, before anything is read or allocated for it. Closing
//! rather than queueing keeps the cost of a refused connection at its socket: a queue would have
//! to be bounded too, and while the slots are taken by slow clients, each of those is evicted
//! by the head deadline (`server.header_read_timeout`) or an idle timeout anyway.
//!
//! The slots are per process (one semaphore shared by the worker threads), acquired without
//! waiting, once per connection: nothing here runs per request.

use async_trait::async_trait;
use pingora_core::apps::ServerApp;
use pingora_core::protocols::Stream;
use pingora_core::server::ShutdownWatch;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// A [`ServerApp`] that serves at most `max` connections at once through `inner`.
pub struct ConnectionCap<A> {
    inner: Arc<A>,
    slots: Arc<Semaphore>,
    max: usize,
}

impl<A> ConnectionCap<A> {
    /// `inner` serves each connection that gets one of the `max` slots.
    pub fn new(inner: A, max: usize) -> Self {
        let max = max.min(Semaphore::MAX_PERMITS);
        ConnectionCap {
            inner: Arc::new(inner),
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// How many connections are being served, read from anywhere (the drain waits for an
    /// HTTP/2 connection to send what its finished streams left in its buffers).
    pub fn serving(&self) -> impl Fn() -> u64 + Send + 'static {
        let (slots, max) = (self.slots.clone(), self.max);
        move || max.saturating_sub(slots.available_permits()) as u64
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for ConnectionCap<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let Ok(_slot) = self.slots.try_acquire() else {
            log::debug!("server.max_connections reached: connection closed");
            return None;
        };
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}
