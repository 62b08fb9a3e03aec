//! Per-client fairness: a cap on how many requests one client may have going upstream at once,
//! so one greedy client cannot take every origin slot.
//!
//! A client is its address, or the value of `fairness.key_header` (say an API key) when the
//! request carries it. Only requests that will go upstream are admitted here (the proxy calls
//! [`Fairness::on_upstream_request`] after the cache lookup), so cache hits never count. Over the
//! cap, a request is rejected at once (`429` with `Retry-After`) or, in `queue` mode, waits for a
//! slot in a bounded per-client queue for at most `queue_timeout`.
//!
//! An [`Admission`] holds the slot until dropped; the proxy keeps it in the request context, so
//! the slot is given back on every exit path.

use crate::config::fairness::{ExcessPolicy, FairnessConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The per-client slots, shared by all requests.
#[derive(Debug, Clone)]
pub struct Fairness {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: FairnessConfig,
    clients: Mutex<HashMap<String, Arc<ClientSlots>>>,
}

#[derive(Debug)]
struct ClientSlots {
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// A request's place in its client's queue, given back however its wait ends (a slot, the
/// timeout, or the request dropped: its client left).
struct QueuePlace<'a>(&'a AtomicUsize);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves when the client of `session`, whose request body is all read, closes its
/// connection (or it fails); bytes of a pipelined request are kept for it (Pingora's
/// `read_body_or_idle`), and then this waits for ever.
async fn client_gone(session: &mut pingora_proxy::Session) -> Box<pingora_error::Error> {
    loop {
        if let Err(e) = session.downstream_session.read_body_or_idle(true).await {
            return e;
        }
    }
}

/// A request's slot; given back when dropped.
#[derive(Debug)]
pub struct Admission {
    permit: Option<OwnedSemaphorePermit>,
    key: String,
    inner: Arc<Inner>,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client is at its cap (and the queue, if any, is full).
    OverCap,
    /// Queued, but no slot came free within `queue_timeout`.
    QueueTimeout,
}

impl Fairness {
    /// Slots for the validated settings.
    pub fn new(config: FairnessConfig) -> Self {
        Fairness {
            inner: Arc::new(Inner {
                config,
                clients: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The header that identifies a client, if configured (lowercase).
    pub fn key_header(&self) -> Option<&str> {
        self.inner.config.key_header.as_deref()
    }

    /// Seconds a rejected client is told to wait.
    pub fn retry_after_secs(&self) -> u64 {
        self.inner.config.retry_after_secs
    }

    /// Takes a slot for client `key`, waiting in queue mode.
    pub async fn admit(&self, key: String) -> Result<Admission, Refusal> {
        let config = &self.inner.config;
        let slots = {
            let mut clients = self.inner.clients.lock().expect("fairness lock");
            clients
                .entry(key.clone())
                .or_insert_with(|| {
                    Arc::new(ClientSlots {
                        permits: Arc::new(Semaphore::new(config.max_in_flight)),
                        waiting: AtomicUsize::new(0),
                    })
                })
                .clone()
        };
        let admitted = |permit| Admission {
            permit: Some(permit),
            key: key.clone(),
            inner: self.inner.clone(),
        };
        if let Ok(permit) = slots.permits.clone().try_acquire_owned() {
            return Ok(admitted(permit));
        }
        let refused = |slots: Arc<ClientSlots>, why| {
            drop(slots);
            self.inner.forget_if_idle(&key);
            Err(why)
        };
        if config.on_excess == ExcessPolicy::Reject {
            return refused(slots, Refusal::OverCap);
        }
        if slots.waiting.fetch_add(1, Ordering::SeqCst) >= config.queue_size {
            slots.waiting.fetch_sub(1, Ordering::SeqCst);
            return refused(slots, Refusal::OverCap);
        }
        let place = QueuePlace(&slots.waiting);
        let waited =
            tokio::time::timeout(config.queue_timeout, slots.permits.clone().acquire_owned()).await;
        drop(place);
        match waited {
            Ok(Ok(permit)) => Ok(admitted(permit)),
            _ => refused(slots, Refusal::QueueTimeout),
        }
    }

    /// `proxy_upstream_filter`: admits the request under its client's cap, keeping the slot in
    /// `request` until the request ends, or answers it `429`. Returns whether it may go upstream.
    pub async fn on_upstream_request(
        &self,
        session: &mut pingora_proxy::Session,
        client: Option<std::net::IpAddr>,
        request: &mut super::RequestUpstream,
    ) -> pingora_error::Result<bool> {
        let key = client_key(session, self.key_header(), client);
        // a request waiting in its client's queue gives its place up when its client leaves
        // (before 2026-12-08 a gone client's request kept it until a slot came or
        // `queue_timeout` passed, and the client's next requests were refused meanwhile:
        // `tests/fairness_attacks.rs`). Watched only when the request's body is all read (the
        // watch reads the connection: a GET's, or a direct pass's, whose body is read first).
        let admitted = if session.downstream_session.is_body_done() {
            tokio::select! {
                // a slot free at once is taken without a read of the client's connection
                biased;
                admitted = self.admit(key) => admitted,
                gone = client_gone(session) => return Err(gone),
            }
        } else {
            self.admit(key).await
        };
        match admitted {
            Ok(admission) => {
                request.admission = Some(admission);
                Ok(true)
            }
            Err(_) => {
                respond_too_many(session, self.retry_after_secs()).await?;
                Ok(false)
            }
        }
    }

    /// Requests waiting in the queue for a slot, over every client (for `/metrics`).
    pub fn waiting(&self) -> usize {
        let clients = self.inner.clients.lock().expect("fairness lock");
        clients
            .values()
            .map(|slots| slots.waiting.load(Ordering::Relaxed))
            .sum()
    }

    /// Clients with slots held or requests waiting (for tests and stats).
    pub fn tracked_clients(&self) -> usize {
        self.inner.clients.lock().expect("fairness lock").len()
    }
}

impl Inner {
    /// Drops a client's entry once nobody holds or waits for its slots, so the map only
    /// holds active clients.
    fn forget_if_idle(&self, key: &str) {
        let mut clients = self.clients.lock().expect("fairness lock");
        let idle = clients.get(key).is_some_and(|slots| {
            Arc::strong_count(slots) == 1
                && slots.permits.available_permits() == self.config.max_in_flight
        });
        if idle {
            clients.remove(key);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.inner.forget_if_idle(&self.key);
    }
}

/// The client a request counts against: `header:<value>` when the key header is configured and
/// present, else `addr:<ip>`.
pub fn client_key(
    session: &pingora_proxy::Session,
    key_header: Option<&str>,
    ip: Option<std::net::IpAddr>,
) -> String {
    let from_header = key_header.and_then(|name| {
        session
            .req_header()
            .headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    });
    match (from_header, ip) {
        (Some(value), _) => format!("header:{value}"),
        (None, Some(ip)) => format!("addr:{ip}"),
        (None, None) => "addr:-".to_string(),
    }
}

/// Answers `429 Too Many Requests` with `Retry-After`, uncacheable.
pub async fn respond_too_many(
    session: &mut pingora_proxy::Session,
    retry_after_secs: u64,
) -> pingora_error::Result<()> {
    let mut head = pingora_http::ResponseHeader::build(429, Some(4))?;
    head.insert_header(http::header::RETRY_AFTER, retry_after_secs.to_string())?;
    head.insert_header(http::header::CACHE_CONTROL, "no-store")?;
    head.insert_header(http::header::CONTENT_LENGTH, "0")?;
    session.write_response_header(Box::new(head), true).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(on_excess: ExcessPolicy) -> FairnessConfig {
        FairnessConfig {
            max_in_flight: 2,
            key_header: None,
            on_excess,
            queue_size: 1,
            queue_timeout: Duration::from_secs(30),
            retry_after_secs: 1,
        }
    }

    #[tokio::test]
    async fn reject_mode_caps_each_client_separately() {
        let f = Fairness::new(config(ExcessPolicy::Reject));
        let a1 = f.admit("a".into()).await.unwrap();
        let _a2 = f.admit("a".into()).await.unwrap();
        assert_eq!(f.admit("a".into()).await.unwrap_err(), Refusal::OverCap);
        let _b1 = f.admit("b".into()).await.unwrap();
        drop(a1);
        let _a3 = f.admit("a".into()).await.unwrap();
    }

    #[tokio::test]
    async fn queue_mode_waits_for_a_slot_and_bounds_the_queue() {
        let f = Fairness::new(config(ExcessPolicy::Queue));
        let a1 = f.admit("a".into()).await.unwrap();
        let _a2 = f.admit("a".into()).await.unwrap();
        let f2 = f.clone();
        let queued = tokio::spawn(async move { f2.admit("a".into()).await.map(|_| ()) });
        // wait until the spawned request is queued, then the queue (size 1) is full
        while f.inner.clients.lock().unwrap()["a"]
            .waiting
            .load(Ordering::SeqCst)
            == 0
        {
            tokio::task::yield_now().await;
        }
        assert_eq!(f.admit("a".into()).await.unwrap_err(), Refusal::OverCap);
        drop(a1);
        assert_eq!(queued.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn idle_clients_are_forgotten() {
        let f = Fairness::new(config(ExcessPolicy::Reject));
        let a = f.admit("a".into()).await.unwrap();
        assert_eq!(f.tracked_clients(), 1);
        drop(a);
        assert_eq!(f.tracked_clients(), 0);
    }
}
