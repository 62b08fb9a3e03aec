//! Idle kept-alive connections to the origins, for passes forwarded directly
//! (`crate::proxy::direct_pass`).
//!
//! Pingora's own pool watches each idle connection with a task spawned at every release (a
//! read and a timer, a oneshot to hand the connection back, the pool's node for the peer
//! removed and rebuilt around each reuse): 8-9 % of a forwarded request's instructions
//! (`docs/benchmarks.md`). Here nothing watches an idle connection. Each one is checked when
//! it is taken instead, the way Pingora checks its own at reuse: one read that must find
//! nothing to read (data the origin sent unasked, or its close, discards the connection), and
//! an age under the peer's idle timeout. A connection the origin closed therefore waits, half
//! closed, until it is taken or pushed out: at most `per_peer` per origin address, the
//! `upstream_keepalive_pool` bound.
//!
//! The most recently used connection is taken first (the one least likely to have been closed
//! by the origin's own idle timer); the oldest is dropped when a peer's list is full.

use pingora_core::protocols::Stream;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// One idle connection and until when it may be reused.
struct Idle {
    stream: Stream,
    expires: Option<Instant>,
}

impl Idle {
    fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|at| at <= now)
    }
}

/// The idle connections of every origin address, keyed by Pingora's reuse hash of the peer
/// (address, TLS settings, SNI: what makes two peers' connections interchangeable).
pub struct IdleConnections {
    peers: Mutex<HashMap<u64, Vec<Idle>>>,
    per_peer: usize,
}

impl IdleConnections {
    /// Keeps at most `per_peer` idle connections per peer (none when 0).
    pub fn new(per_peer: usize) -> Self {
        IdleConnections {
            peers: Mutex::new(HashMap::new()),
            per_peer,
        }
    }

    /// An idle connection to the peer `key` that is still usable, if one is kept.
    pub fn take(&self, key: u64) -> Option<Stream> {
        let now = Instant::now();
        loop {
            let idle = self.peers.lock().ok()?.get_mut(&key)?.pop()?;
            let Idle {
                mut stream,
                expires,
            } = idle;
            if expires.is_some_and(|at| at <= now) {
                continue;
            }
            if quiet(&mut stream) {
                return Some(stream);
            }
        }
    }

    /// Keeps `stream`, whose last exchange with the peer `key` ended cleanly, for
    /// `idle_timeout` (the peer's; `None`: no limit).
    pub fn put(&self, key: u64, stream: Stream, idle_timeout: Option<Duration>) {
        if self.per_peer == 0 {
            return;
        }
        let now = Instant::now();
        let idle = Idle {
            stream,
            expires: idle_timeout.map(|d| now + d),
        };
        let dropped: Vec<Idle> = {
            let Ok(mut peers) = self.peers.lock() else {
                return;
            };
            let list = peers.entry(key).or_default();
            let mut dropped: Vec<Idle> = Vec::new();
            if list.first().is_some_and(|oldest| oldest.expired(now)) {
                let kept = list.split_off(list.partition_point(|i| i.expired(now)));
                dropped = std::mem::replace(list, kept);
            }
            if list.len() >= self.per_peer {
                dropped.push(list.remove(0));
            }
            list.push(idle);
            dropped
        };
        // closed outside the lock
        drop(dropped);
    }

    /// Idle connections kept now, over every peer (for tests and stats).
    pub fn len(&self) -> usize {
        self.peers
            .lock()
            .map(|peers| peers.values().map(Vec::len).sum())
            .unwrap_or(0)
    }

    /// Whether no idle connection is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether an idle connection has nothing to read: no close, no error, no bytes the origin sent
/// unasked (which would be read as the answer to the next request). Pingora's reuse check.
fn quiet(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    // unconstrained: tokio's budget could make a ready read look pending here
    let read = std::pin::pin!(tokio::task::unconstrained(stream.read(&mut byte)));
    let mut cx = Context::from_waker(Waker::noop());
    read.poll(&mut cx).is_pending()
}
