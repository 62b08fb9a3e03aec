//! Upstream selection: which origin replica a request is forwarded to, and how we connect.
//!
//! The pieces, one concept per module:
//! * [`backend`]: a replica's live state (in-flight count, health verdicts) and the
//!   [`backend::InFlight`] guard that keeps the count honest on every exit path;
//! * [`replicas`]: the replicas now, one per address of each configured backend, swapped whole;
//! * [`resolver`]: origin host names looked up again every `balancer.resolve_interval`;
//! * [`algorithms`]: `round_robin`, `least_loaded`, `consistent`, `random_two_choices`;
//! * [`health`]: active HTTP probes with rise/fall thresholds, run as a background service;
//! * [`passive`]: outlier ejection from live traffic (connect errors, timeouts, 5xx);
//! * [`retry`]: which failures may be retried on another backend;
//! * [`timeouts`]: connect / first byte / idle / total, applied to each peer;
//! * [`tls`]: TLS to `https` origins (SNI, verification roots, client certificate);
//! * [`concurrency`]: a backend's `max_in_flight`, with its bounded queue;
//! * [`fairness`]: the per-client cap on requests going upstream;
//! * [`idle_connections`]: kept-alive origin connections of passes forwarded directly.
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
pub mod idle_connections;
pub mod passive;
pub mod replicas;
pub mod resolver;
pub mod retry;
pub mod timeouts;
pub mod tls;

use crate::config::balancing::{Algorithm, BalancerConfig};
use crate::config::Config;
use algorithms::Rng;
use backend::{Backend, InFlight};
use pingora_core::upstreams::peer::HttpPeer;
use replicas::{ReplicaSet, Replicas};
use retry::RetryPolicy;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use attempts::RequestUpstream;

/// The origin replicas, their live state and the configured way to choose among them.
/// Cheap to clone: the replicas are shared with the resolver, the health checker and the admin
/// listener.
#[derive(Debug, Clone)]
pub struct Upstream {
    inner: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    replicas: Arc<Replicas>,
    config: BalancerConfig,
    proxy: crate::config::ProxyConfig,
    retry: RetryPolicy,
    turn: AtomicU64,
    rng: Rng,
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
    /// Builds the pool from the validated config: a replica for each address of each backend,
    /// every one healthy.
    pub fn new(config: &Config) -> Self {
        Upstream::around(Arc::new(Replicas::new(&config.balancer)), config)
    }

    /// The same replicas (as the resolver keeps them, with their in-flight counts, health
    /// verdicts and counters, which the health checker and `/stats` share) under a reloaded
    /// config's algorithm, retries, timeouts, passive checks and origin TLS files. The backend
    /// list itself is a restart-only key (`crate::lifecycle::restart_keys`), so `config` names
    /// the same backends; the addresses a name has now are the resolver's, not the reload's.
    pub fn reconfigured(&self, config: &Config) -> Self {
        self.inner.replicas.reconfigure(&config.balancer.backends);
        Upstream::around(self.inner.replicas.clone(), config)
    }

    fn around(replicas: Arc<Replicas>, config: &Config) -> Self {
        Upstream {
            inner: Arc::new(Pool {
                replicas,
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

    /// The replicas, shared with the resolver, the health checker and the admin listener.
    pub fn replicas(&self) -> &Arc<Replicas> {
        &self.inner.replicas
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
    /// checker can be wrong, an error is certain). Then, except for `consistent`, backends at
    /// their `max_in_flight` are passed over while another candidate has a free slot
    /// ([`with_free_slots`]). `None` only for an empty pool.
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
        let set = pool.replicas.load();
        let backends = &set.backends;
        let members: Vec<usize> = (0..backends.len())
            .filter(|&i| in_group(&set, &backends[i], group))
            .collect();
        let mut untried: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&i| !tried.contains(&backends[i].addr))
            .collect();
        if untried.is_empty() {
            untried = members;
        }
        let healthy: Vec<usize> = untried
            .iter()
            .copied()
            .filter(|&i| backends[i].is_available(now))
            .collect();
        let candidates = if healthy.is_empty() { untried } else { healthy };
        let candidates = with_free_slots(backends, candidates, pool.config.algorithm);
        let pos = match pool.config.algorithm {
            Algorithm::RoundRobin => set.round_robin.pick(backends, &candidates),
            Algorithm::LeastLoaded => {
                let turn = pool.turn.fetch_add(1, Ordering::Relaxed);
                algorithms::least_loaded(backends, &candidates, turn)
            }
            Algorithm::Consistent => algorithms::consistent(backends, &candidates, key),
            Algorithm::RandomTwoChoices => {
                algorithms::random_two_choices(backends, &candidates, &pool.rng)
            }
        }?;
        Some(self.selection_of(&backends[candidates[pos]]))
    }

    /// An attempt on `backend`, with this upstream's timeouts: the one a choice above made, or
    /// a failed attempt's backend once more (its pooled connection was dead: see `attempts`).
    pub fn selection_of(&self, backend: &Arc<Backend>) -> Selection {
        let pool = &self.inner;
        let mut peer = pool.replicas.peer(backend);
        timeouts::apply(&mut peer, &pool.config.timeouts, &pool.proxy);
        Selection {
            in_flight: InFlight::start(backend.clone()),
            peer,
        }
    }

    /// Whether some backend of `group` has not been attempted yet. A connect failure is only worth
    /// retrying elsewhere: the same address refused (or timed out) a moment ago.
    pub fn has_untried(&self, group: Option<&str>, tried: &[std::net::SocketAddr]) -> bool {
        let set = self.inner.replicas.load();
        set.backends
            .iter()
            .any(|b| in_group(&set, b, group) && !tried.contains(&b.addr))
    }

    /// The first origin as configured, used as `Host` when a request has none.
    pub fn host(&self) -> &str {
        &self.inner.config.backends[0].name
    }
}

/// `candidates` less the backends at their `max_in_flight`, when that leaves any; all of them
/// when every one is full (the chosen one's queue then decides: wait, or 503).
///
/// Before 2026-12-07 a full replica was chosen as any other: with `queue.length = 0`, round
/// robin sent every other request to it, answered 503 at once while the other replica sat idle
/// (with a queue, it waited there instead); the 503 is decided before anything is sent, but not
/// retried elsewhere (`tests/retry_idempotency_attacks.rs`). nginx's round robin likewise skips
/// a server at its `max_conns`. `consistent` keeps its choice: the key's replica holds its
/// cached state, and moving keys each time it is busy would scatter them; its queue is the tool
/// there. A
/// slot seen free here may be taken before this request asks for it; it then queues as before.
/// Costs nothing when no candidate is full (no backend with `max_in_flight`, say).
fn with_free_slots(
    backends: &[Arc<Backend>],
    candidates: Vec<usize>,
    algorithm: Algorithm,
) -> Vec<usize> {
    if algorithm == Algorithm::Consistent || !candidates.iter().any(|&i| backends[i].is_full()) {
        return candidates;
    }
    let free: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&i| !backends[i].is_full())
        .collect();
    if free.is_empty() {
        candidates
    } else {
        free
    }
}

/// Whether `backend` serves requests sent to `group` (see [`Upstream::select_in`]).
fn in_group(set: &ReplicaSet, backend: &Backend, group: Option<&str>) -> bool {
    match group {
        Some(_) => backend.group.as_deref() == group,
        None => backend.group.is_none() || !set.any_ungrouped,
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

    #[tokio::test]
    async fn a_full_backend_is_passed_over_while_another_has_a_free_slot() {
        let list = "[[upstreams]]\naddress = \"127.0.0.1:1\"\nmax_in_flight = 1\n\
                    [[upstreams]]\naddress = \"127.0.0.1:2\"\nmax_in_flight = 1\n\
                    [balancer]\nalgorithm = \"round_robin\"\n";
        let up = Upstream::new(&Config::from_toml(list).unwrap());
        let first = up.replicas().load().backends[0].clone();
        let _held = first.limit.as_ref().unwrap().acquire().await.unwrap();
        for _ in 0..6 {
            let chosen = up.select(b"k", &[]).unwrap().in_flight.backend().addr;
            assert_eq!(chosen.port(), 2, "round robin skips the full replica");
        }
        let second = up.replicas().load().backends[1].clone();
        let _also = second.limit.as_ref().unwrap().acquire().await.unwrap();
        let ports: std::collections::HashSet<u16> = (0..4)
            .map(|_| {
                up.select(b"k", &[])
                    .unwrap()
                    .in_flight
                    .backend()
                    .addr
                    .port()
            })
            .collect();
        assert_eq!(
            ports.len(),
            2,
            "all full: every replica is a candidate again"
        );
    }

    #[test]
    fn unhealthy_backends_are_skipped_while_others_are_up() {
        let up = upstream(&[1, 2, 3]);
        up.replicas().load().backends[1].set_active_up(false);
        for _ in 0..20 {
            let chosen = up.select(b"k", &[]).unwrap().in_flight.backend().addr;
            assert_ne!(chosen.port(), 2);
        }
        for b in &up.replicas().load().backends {
            b.set_active_up(false);
        }
        assert!(up.select(b"k", &[]).is_some(), "all down: still try one");
    }
}
