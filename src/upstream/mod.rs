//! Upstream selection: which origin replica a request is forwarded to, and how we connect.
//!
//! The pieces, one concept per module:
//! * [`backend`]: a replica's live state (in-flight count, health verdicts) and the
//!   [`InFlight`](backend::InFlight) guard that keeps the count honest on every exit path;
//! * [`algorithms`]: `round_robin`, `least_loaded`, `consistent`, `random_two_choices`;
//! * [`health`]: active HTTP probes with rise/fall thresholds, run as a background service;
//! * [`passive`]: outlier ejection from live traffic (connect errors, timeouts, 5xx);
//! * [`retry`]: which failures may be retried on another backend;
//! * [`timeouts`]: connect / first byte / idle / total, applied to each peer;
//! * [`tls`]: TLS to `https` origins (SNI, verification roots, client certificate);
//! * [`concurrency`]: a backend's `max_in_flight`, with its bounded queue;
//! * [`fairness`]: the per-client cap on requests going upstream.
//!
//! * [`attempts`]: one request's attempts, phase by phase ([`RequestUpstream`] and the `on_*`
//!   methods the proxy calls from its upstream phases).
//!
//! [`Upstream::select`] chooses a backend; the proxy's `upstream_peer` phase calls it once per
//! attempt (through [`Upstream::on_peer`]), with the backends already tried excluded.

pub mod algorithms;
pub mod attempts;
pub mod backend;
pub mod concurrency;
pub mod fairness;
pub mod health;
pub mod passive;
pub mod retry;
pub mod timeouts;
pub mod tls;

use crate::config::balancing::{Algorithm, BalancerConfig};
use crate::config::Config;
use algorithms::{Rng, RoundRobin};
use backend::{Backend, InFlight};
use pingora_core::upstreams::peer::HttpPeer;
use retry::RetryPolicy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use attempts::RequestUpstream;

/// The origin replicas, their live state and the configured way to choose among them.
/// Cheap to clone: the state is shared with the health checker.
#[derive(Debug, Clone)]
pub struct Upstream {
    inner: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    backends: Vec<Arc<Backend>>,
    config: BalancerConfig,
    proxy: crate::config::ProxyConfig,
    retry: RetryPolicy,
    round_robin: RoundRobin,
    turn: AtomicU64,
    rng: Rng,
    /// Some backend has no group (so the default pool is those backends, not all).
    any_ungrouped: bool,
}

/// One attempt's choice: the backend (counted in flight while this lives) and its peer.
#[derive(Debug)]
pub struct Selection {
    /// Keeps the backend's in-flight count up until the request ends or moves on.
    pub in_flight: InFlight,
    /// Where to connect, with this upstream's timeouts.
    pub peer: HttpPeer,
}

impl Upstream {
    /// Builds the pool from the validated config; every backend starts healthy.
    pub fn new(config: &Config) -> Self {
        let backends: Vec<Arc<Backend>> = config
            .balancer
            .backends
            .iter()
            .map(|b| Arc::new(Backend::with_queue(b, &config.balancer.queue)))
            .collect();
        Upstream::around(backends, config)
    }

    /// The same backends (their in-flight counts, health verdicts and counters, which the
    /// health checker and `/stats` share) under a reloaded config's algorithm, retries,
    /// timeouts and passive checks. The backend list itself is a restart-only key
    /// (`crate::lifecycle::restart_keys`), so `config` names the same backends.
    pub fn reconfigured(&self, config: &Config) -> Self {
        Upstream::around(self.inner.backends.clone(), config)
    }

    fn around(backends: Vec<Arc<Backend>>, config: &Config) -> Self {
        Upstream {
            inner: Arc::new(Pool {
                round_robin: RoundRobin::new(backends.len()),
                any_ungrouped: backends.iter().any(|b| b.group.is_none()),
                backends,
                retry: RetryPolicy {
                    attempts: config.balancer.retries,
                },
                config: config.balancer.clone(),
                proxy: config.proxy.clone(),
                turn: AtomicU64::new(0),
                rng: Rng::new(),
            }),
        }
    }

    /// The backends, in configuration order.
    pub fn backends(&self) -> &[Arc<Backend>] {
        &self.inner.backends
    }

    /// The balancer settings.
    pub fn config(&self) -> &BalancerConfig {
        &self.inner.config
    }

    /// The retry budget and rules for every request.
    fn retry(&self) -> RetryPolicy {
        self.inner.retry
    }

    /// Chooses a backend for one attempt. `key` is the cache key (for `consistent`), `tried`
    /// the addresses already attempted for this request. Untried backends come first; when
    /// every one was tried (one backend, say, whose pooled connection was reset), all are
    /// candidates again, the retry budget bounding the attempts. Among those, healthy backends
    /// are preferred; when none is healthy, any is used rather than failing outright (a
    /// checker can be wrong, an error is certain). `None` only for an empty pool.
    pub fn select(&self, key: &[u8], tried: &[std::net::SocketAddr]) -> Option<Selection> {
        self.select_in(None, key, tried)
    }

    /// [`Self::select`] among the backends of `group` (a request rule's `backend_group`);
    /// `None` is the default pool: the backends without a group, or all of them when every
    /// backend has one.
    pub fn select_in(
        &self,
        group: Option<&str>,
        key: &[u8],
        tried: &[std::net::SocketAddr],
    ) -> Option<Selection> {
        let pool = &self.inner;
        let now = Instant::now();
        let members: Vec<usize> = (0..pool.backends.len())
            .filter(|&i| self.in_group(&pool.backends[i], group))
            .collect();
        let mut untried: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| !tried.contains(&pool.backends[i].addr))
            .collect();
        if untried.is_empty() {
            untried = members;
        }
        let healthy: Vec<usize> = untried
            .iter()
            .copied()
            .filter(|&i| pool.backends[i].is_available(now))
            .collect();
        let candidates = if healthy.is_empty() { untried } else { healthy };
        let pos = match pool.config.algorithm {
            Algorithm::RoundRobin => pool.round_robin.pick(&pool.backends, &candidates),
            Algorithm::LeastLoaded => {
                let turn = pool.turn.fetch_add(1, Ordering::Relaxed);
                algorithms::least_loaded(&pool.backends, &candidates, turn)
            }
            Algorithm::Consistent => algorithms::consistent(&pool.backends, &candidates, key),
            Algorithm::RandomTwoChoices => {
                algorithms::random_two_choices(&pool.backends, &candidates, &pool.rng)
            }
        }?;
        let backend = pool.backends[candidates[pos]].clone();
        let mut peer = backend.peer();
        timeouts::apply(&mut peer, &pool.config.timeouts, &pool.proxy);
        Some(Selection {
            in_flight: InFlight::start(backend),
            peer,
        })
    }

    /// Whether some backend of `group` has not been attempted yet. A connect failure is only worth
    /// retrying elsewhere: the same address refused (or timed out) a moment ago.
    pub fn has_untried(&self, group: Option<&str>, tried: &[std::net::SocketAddr]) -> bool {
        self.inner
            .backends
            .iter()
            .any(|b| self.in_group(b, group) && !tried.contains(&b.addr))
    }

    /// Whether `backend` serves requests sent to `group` (see [`Self::select_in`]).
    fn in_group(&self, backend: &Backend, group: Option<&str>) -> bool {
        match group {
            Some(_) => backend.group.as_deref() == group,
            None => backend.group.is_none() || !self.inner.any_ungrouped,
        }
    }

    /// The first origin as configured, used as `Host` when a request has none.
    pub fn host(&self) -> &str {
        &self.inner.backends[0].name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(ports: &[u16]) -> Upstream {
        let list = ports
            .iter()
            .map(|p| format!("[[upstreams]]\naddress = \"127.0.0.1:{p}\"\n"))
            .collect::<String>();
        Upstream::new(&Config::from_toml(&list).unwrap())
    }

    #[test]
    fn retries_prefer_untried_backends_then_reuse_them() {
        let up = upstream(&[1, 2]);
        let a = up.select(b"k", &[]).unwrap().in_flight.backend().addr;
        let second = up.select(b"k", &[a]).unwrap().in_flight.backend().addr;
        assert_ne!(a, second);
        // both tried: a third attempt still gets a backend
        assert!(up.select(b"k", &[a, second]).is_some());
    }

    #[test]
    fn unhealthy_backends_are_skipped_while_others_are_up() {
        let up = upstream(&[1, 2, 3]);
        up.backends()[1].set_active_up(false);
        for _ in 0..20 {
            let chosen = up.select(b"k", &[]).unwrap().in_flight.backend().addr;
            assert_ne!(chosen.port(), 2);
        }
        for b in up.backends() {
            b.set_active_up(false);
        }
        assert!(up.select(b"k", &[]).is_some(), "all down: still try one");
    }
}
