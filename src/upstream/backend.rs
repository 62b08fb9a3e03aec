//! One origin replica at run time: its address and weight, the requests it has in flight, and
//! the two health verdicts (active probes and passive outlier ejection) that decide whether it
//! is offered traffic. A configured backend has one replica per address (`super::replicas`).

use super::concurrency::ConcurrencyLimit;
use crate::config::balancing::{BackendConfig, QueueConfig};
use crate::observe::metrics::histogram::{Histogram, SharedHistogram};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A backend and its live state, shared by every request and the health checker.
#[derive(Debug)]
pub struct Backend {
    /// As configured (`host:port`), for logs, the `Host` fallback and health probes.
    pub name: String,
    /// Where requests go: the configured address, or one the name resolved to.
    pub addr: SocketAddr,
    /// `addr` as text: the replica's identity in `/stats`, `/metrics` and `consistent` hashing
    /// (the same on every node that resolves the name alike).
    pub address: String,
    /// The configured backend this replica is an address of (its position in the list).
    pub entry: usize,
    /// Relative share of traffic.
    pub weight: u32,
    /// The backend group request rules may choose (`None`: the default pool).
    pub group: Option<String>,
    in_flight: AtomicUsize,
    /// Requests sent here since start (a retry counts on the backend it went to).
    requests: AtomicU64,
    /// Failures counted by the passive check since start.
    failures: AtomicU64,
    /// Passive ejections since start.
    ejections: AtomicU64,
    /// Time from sending a request here to its response head.
    response_time: SharedHistogram,
    /// Verdict of the active health checker; `true` until probes say otherwise.
    active_up: AtomicBool,
    /// Passive ejection: failures seen in the window, and when an ejection ends.
    passive: Mutex<PassiveState>,
    /// `max_in_flight` and its queue, when configured.
    pub limit: Option<ConcurrencyLimit>,
}

#[derive(Debug, Default)]
struct PassiveState {
    failures: VecDeque<Instant>,
    ejected_until: Option<Instant>,
}

impl Backend {
    /// The replica at `addr` of the backend `config` (entry `entry` of the list), considered
    /// healthy.
    pub fn new(config: &BackendConfig, addr: SocketAddr, entry: usize) -> Self {
        Backend {
            name: config.name.clone(),
            addr,
            address: addr.to_string(),
            entry,
            weight: config.weight,
            group: config.group.clone(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            response_time: SharedHistogram::default(),
            active_up: AtomicBool::new(true),
            passive: Mutex::new(PassiveState::default()),
            limit: None,
        }
    }

    /// The replica in a log line: its name, and the address when the name is a host name
    /// (`app.internal:8080 at 10.0.0.7:8080`).
    pub fn label(&self) -> std::borrow::Cow<'_, str> {
        if self.name == self.address {
            self.name.as_str().into()
        } else {
            format!("{} at {}", self.name, self.address).into()
        }
    }

    /// Counts a response head that took `elapsed` from the attempt's start.
    pub fn record_response_time(&self, elapsed: std::time::Duration) {
        self.response_time.observe(elapsed);
    }

    /// Response times since start (for `/metrics`).
    pub fn response_times(&self) -> Histogram {
        self.response_time.read()
    }

    /// [`Self::new`], with at most `max_in_flight` requests at once (the entry's own, or
    /// `balancer.max_in_flight`), the others queued as `queue` says.
    pub fn with_queue(
        config: &BackendConfig,
        addr: SocketAddr,
        entry: usize,
        max_in_flight: Option<u32>,
        queue: &QueueConfig,
    ) -> Self {
        let mut backend = Backend::new(config, addr, entry);
        backend.limit =
            max_in_flight.map(|max| ConcurrencyLimit::new(max, queue.length, queue.timeout));
        backend
    }

    /// Whether this backend has `max_in_flight` and all its slots are taken.
    pub fn is_full(&self) -> bool {
        self.limit.as_ref().is_some_and(|l| l.is_full())
    }

    /// Requests waiting for a slot under `max_in_flight`.
    pub fn queued(&self) -> usize {
        self.limit.as_ref().map_or(0, |l| l.queued())
    }

    /// Requests currently sent to this backend and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether this backend should be offered traffic now.
    pub fn is_available(&self, now: Instant) -> bool {
        self.active_up.load(Ordering::Relaxed) && !self.is_ejected(now)
    }

    /// Whether passive checks have this backend in its cool-down.
    pub fn is_ejected(&self, now: Instant) -> bool {
        let state = self.passive.lock().expect("passive state lock");
        state.ejected_until.is_some_and(|until| now < until)
    }

    /// Sets the active checker's verdict; returns whether it changed.
    pub fn set_active_up(&self, up: bool) -> bool {
        self.active_up.swap(up, Ordering::Relaxed) != up
    }

    /// The active checker's current verdict.
    pub fn active_up(&self) -> bool {
        self.active_up.load(Ordering::Relaxed)
    }

    /// Counts one failure at `now`; ejects the backend for `cooldown` once `limit` failures fall
    /// inside `window`. Returns `true` when this failure started an ejection.
    pub fn record_failure(
        &self,
        now: Instant,
        limit: u32,
        window: std::time::Duration,
        cooldown: std::time::Duration,
    ) -> bool {
        let mut state = self.passive.lock().expect("passive state lock");
        if state.ejected_until.is_some_and(|until| now < until) {
            return false;
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        while state
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            state.failures.pop_front();
        }
        state.failures.push_back(now);
        if state.failures.len() >= limit as usize {
            state.failures.clear();
            state.ejected_until = Some(now + cooldown);
            self.ejections.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }
}

impl Backend {
    /// Requests sent, failures counted and ejections, since start (for `/stats`).
    pub fn totals(&self) -> BackendTotals {
        BackendTotals {
            requests: self.requests.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            ejections: self.ejections.load(Ordering::Relaxed),
        }
    }
}

/// A backend's counters since start, as the admin endpoint reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendTotals {
    /// Requests sent (a retry counts on the backend it went to).
    pub requests: u64,
    /// Failures the passive check counted (5xx and connection errors outside an ejection).
    pub failures: u64,
    /// Times the passive check ejected the backend.
    pub ejections: u64,
}

/// Counts one request in flight on a backend until dropped, so the count falls on every exit
/// path: success, upstream error, retry on another backend, or the client going away.
#[derive(Debug)]
pub struct InFlight {
    backend: Arc<Backend>,
}

impl InFlight {
    /// Starts counting a request on `backend`.
    pub fn start(backend: Arc<Backend>) -> Self {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        backend.requests.fetch_add(1, Ordering::Relaxed);
        InFlight { backend }
    }

    /// The backend this request went to.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.backend.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn backend() -> Arc<Backend> {
        let addr = "127.0.0.1:1".parse().unwrap();
        let config = BackendConfig {
            name: "127.0.0.1:1".into(),
            address: crate::config::origin_address::OriginAddress::Literal(addr),
            weight: 1,
            group: None,
            max_in_flight: None,
            tls: None,
        };
        Arc::new(Backend::new(&config, addr, 0))
    }

    #[test]
    fn in_flight_falls_when_the_guard_drops() {
        let b = backend();
        let g1 = InFlight::start(b.clone());
        let g2 = InFlight::start(b.clone());
        assert_eq!(b.in_flight(), 2);
        drop(g1);
        assert_eq!(b.in_flight(), 1);
        drop(g2);
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn failures_inside_the_window_eject_for_the_cooldown() {
        let b = backend();
        let t0 = Instant::now();
        let (w, c) = (Duration::from_secs(10), Duration::from_secs(5));
        assert!(!b.record_failure(t0, 3, w, c));
        // the first failure leaves the window before the third arrives
        assert!(!b.record_failure(t0 + Duration::from_secs(8), 3, w, c));
        assert!(!b.record_failure(t0 + Duration::from_secs(12), 3, w, c));
        let t = t0 + Duration::from_secs(13);
        assert!(b.record_failure(t, 3, w, c));
        assert!(!b.is_available(t + Duration::from_secs(1)));
        assert!(b.is_available(t + Duration::from_secs(6)));
    }
}
