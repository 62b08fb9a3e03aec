//! The origin replicas as they are now: one per address of each configured backend, the list
//! swapped whole when the resolver finds that a host name's addresses changed.
//!
//! A configured backend (`[[upstreams]]` entry or `upstream`) is an *entry*; each of its
//! addresses is a *replica* ([`Backend`]) with the entry's weight, group, `max_in_flight` and TLS.
//! A literal `IP:PORT` entry has one replica for the process's life; a `HOSTNAME:PORT` entry has
//! one per address the name resolves to, and [`Replicas::follow`] re-bases it on each new lookup:
//! an address that stays keeps its replica (in-flight count, health verdicts, passive ejection,
//! queue), a new one gets a fresh replica (healthy), a vanished one leaves the list (requests on
//! it finish: they hold its `Arc`). The request path reads the list with one atomic load
//! ([`Replicas::load`]); the round-robin scores live with the list ([`ReplicaSet`]), so a new
//! list starts a new round. The entries themselves (their TLS settings) are replaced by a reload
//! ([`Replicas::reconfigure`]); everything else about them is restart-only.

use super::algorithms::RoundRobin;
use super::backend::Backend;
use crate::config::balancing::{BackendConfig, BalancerConfig, QueueConfig};
use arc_swap::{ArcSwap, Guard};
use pingora_core::upstreams::peer::HttpPeer;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The replicas of every entry, shared by the balancer (across reloads), the resolver, the health
/// checker and the admin listener.
#[derive(Debug)]
pub struct Replicas {
    current: ArcSwap<ReplicaSet>,
    /// The configured backends, in configuration order, as the running configuration has them.
    entries: ArcSwap<Vec<BackendConfig>>,
    /// The queue of each replica with a `max_in_flight` (restart-only).
    queue: QueueConfig,
    /// `balancer.max_in_flight`, for entries without their own (restart-only).
    default_max_in_flight: Option<u32>,
    /// Look-ups of each entry's name that failed or found nothing, since start.
    lookup_failures: Vec<AtomicU64>,
}

/// One version of the replica list.
#[derive(Debug)]
pub struct ReplicaSet {
    /// Entry by entry in configuration order; an entry's addresses in ascending order.
    pub backends: Vec<Arc<Backend>>,
    /// Smooth weighted round-robin scores, one per replica of this list.
    pub round_robin: RoundRobin,
    /// Some replica has no group (so the default pool is those replicas, not all).
    pub any_ungrouped: bool,
}

impl ReplicaSet {
    fn new(backends: Vec<Arc<Backend>>) -> Self {
        ReplicaSet {
            round_robin: RoundRobin::new(backends.len()),
            any_ungrouped: backends.iter().any(|b| b.group.is_none()),
            backends,
        }
    }
}

/// What [`Replicas::follow`] changed for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// Addresses that got a replica.
    pub added: Vec<SocketAddr>,
    /// Addresses whose replica left the list.
    pub removed: Vec<SocketAddr>,
}

impl Replicas {
    /// A replica for each address the entries had when the configuration was loaded.
    pub fn new(config: &BalancerConfig) -> Self {
        let backends = config
            .backends
            .iter()
            .enumerate()
            .flat_map(|(entry, backend)| {
                sorted(backend.address.addrs().to_vec())
                    .into_iter()
                    .map(move |addr| (entry, backend, addr))
            })
            .map(|(entry, backend, addr)| {
                replica(
                    backend,
                    addr,
                    entry,
                    config.default_max_in_flight,
                    &config.queue,
                )
            })
            .collect();
        Replicas {
            current: ArcSwap::from_pointee(ReplicaSet::new(backends)),
            lookup_failures: config.backends.iter().map(|_| AtomicU64::new(0)).collect(),
            entries: ArcSwap::from_pointee(config.backends.clone()),
            queue: config.queue.clone(),
            default_max_in_flight: config.default_max_in_flight,
        }
    }

    /// The replicas now: one atomic load, no lock.
    pub fn load(&self) -> Guard<Arc<ReplicaSet>> {
        self.current.load()
    }

    /// The configured backends, as the running configuration has them.
    pub fn entries(&self) -> Guard<Arc<Vec<BackendConfig>>> {
        self.entries.load()
    }

    /// A reload's backends: the same entries (the list is restart-only), with what a reload may
    /// change about them (their TLS files read again). Replicas keep their state.
    pub fn reconfigure(&self, backends: &[BackendConfig]) {
        if backends.len() == self.lookup_failures.len() {
            self.entries.store(Arc::new(backends.to_vec()));
        }
    }

    /// A Pingora peer for `backend`: its address, over TLS with its entry's current settings.
    pub fn peer(&self, backend: &Backend) -> HttpPeer {
        let mut peer = HttpPeer::new(backend.addr, false, String::new());
        if let Some(tls) = self
            .entries
            .load()
            .get(backend.entry)
            .and_then(|e| e.tls.as_ref())
        {
            tls.apply(&mut peer);
        }
        peer
    }

    /// Counts a failed or empty look-up of entry `entry`'s name.
    pub fn count_lookup_failure(&self, entry: usize) {
        if let Some(count) = self.lookup_failures.get(entry) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Failed or empty look-ups since start, per entry (`None` for an entry that is an address).
    pub fn lookup_failures(&self) -> Vec<(String, Option<u64>)> {
        self.entries()
            .iter()
            .zip(&self.lookup_failures)
            .map(|(entry, count)| {
                let count = entry.address.name().map(|_| count.load(Ordering::Relaxed));
                (entry.name.clone(), count)
            })
            .collect()
    }

    /// Makes entry `entry`'s replicas the addresses `addrs` (a new look-up of its name, not
    /// empty): replicas of addresses that stay are kept, new addresses get fresh ones, the others
    /// leave. Swaps the list only when something changed; returns what did. Called by the
    /// resolver only (one writer).
    pub fn follow(&self, entry: usize, addrs: Vec<SocketAddr>) -> Option<Moved> {
        let addrs = sorted(addrs);
        let entries = self.entries();
        let config = entries.get(entry)?;
        let current = self.current.load_full();
        let before: Vec<SocketAddr> = current
            .backends
            .iter()
            .filter(|b| b.entry == entry)
            .map(|b| b.addr)
            .collect();
        if before == addrs {
            return None;
        }
        let replica_for = |addr: SocketAddr| {
            current
                .backends
                .iter()
                .find(|b| b.entry == entry && b.addr == addr)
                .cloned()
                .unwrap_or_else(|| {
                    replica(config, addr, entry, self.default_max_in_flight, &self.queue)
                })
        };
        let mut backends = Vec::with_capacity(current.backends.len() + addrs.len());
        for e in 0..entries.len() {
            if e == entry {
                backends.extend(addrs.iter().map(|&addr| replica_for(addr)));
            } else {
                let kept = current.backends.iter().filter(|b| b.entry == e).cloned();
                backends.extend(kept);
            }
        }
        self.current.store(Arc::new(ReplicaSet::new(backends)));
        Some(Moved {
            added: addrs
                .iter()
                .filter(|a| !before.contains(a))
                .copied()
                .collect(),
            removed: before.into_iter().filter(|a| !addrs.contains(a)).collect(),
        })
    }
}

/// A fresh (healthy) replica at `addr` of entry `entry`, limited by its own `max_in_flight` or
/// else `balancer.max_in_flight`.
fn replica(
    config: &BackendConfig,
    addr: SocketAddr,
    entry: usize,
    default_max_in_flight: Option<u32>,
    queue: &QueueConfig,
) -> Arc<Backend> {
    let max_in_flight = config.max_in_flight.or(default_max_in_flight);
    Arc::new(Backend::with_queue(
        config,
        addr,
        entry,
        max_in_flight,
        queue,
    ))
}

fn sorted(mut addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    addrs.sort();
    addrs.dedup();
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::upstream::backend::InFlight;

    fn replicas(toml: &str) -> Replicas {
        Replicas::new(&Config::from_toml(toml).unwrap().balancer)
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn addrs(r: &Replicas) -> Vec<(usize, SocketAddr)> {
        r.load()
            .backends
            .iter()
            .map(|b| (b.entry, b.addr))
            .collect()
    }

    #[test]
    fn a_new_lookup_keeps_surviving_replicas_and_their_state() {
        let r = replicas(
            "[[upstreams]]\naddress = \"127.0.0.1:1\"\n\
             [[upstreams]]\naddress = \"localhost:2\"\nweight = 3\n\
             [[upstreams]]\naddress = \"127.0.0.1:3\"\n",
        );
        assert_eq!(
            addrs(&r),
            [
                (0, addr("127.0.0.1:1")),
                (1, addr("127.0.0.1:2")),
                (2, addr("127.0.0.1:3"))
            ]
        );
        let kept = r.load().backends[1].clone();
        let _busy = InFlight::start(kept.clone());
        kept.set_active_up(false);

        let moved = r.follow(1, vec![addr("127.0.0.9:2"), addr("127.0.0.1:2")]);
        assert_eq!(
            moved,
            Some(Moved {
                added: vec![addr("127.0.0.9:2")],
                removed: vec![]
            })
        );
        assert_eq!(
            addrs(&r),
            [
                (0, addr("127.0.0.1:1")),
                (1, addr("127.0.0.1:2")),
                (1, addr("127.0.0.9:2")),
                (2, addr("127.0.0.1:3"))
            ]
        );
        let set = r.load();
        assert!(Arc::ptr_eq(&set.backends[1], &kept), "the replica stayed");
        assert_eq!((kept.in_flight(), kept.active_up()), (1, false));
        let fresh = &set.backends[2];
        assert_eq!((fresh.weight, fresh.active_up()), (3, true));
        drop(set);

        // the same addresses in another order change nothing
        assert_eq!(
            r.follow(1, vec![addr("127.0.0.9:2"), addr("127.0.0.1:2")]),
            None
        );
        let moved = r.follow(1, vec![addr("127.0.0.9:2")]).unwrap();
        assert_eq!(moved.removed, [addr("127.0.0.1:2")]);
        assert_eq!(addrs(&r).len(), 3);
        assert_eq!(
            kept.in_flight(),
            1,
            "a request on a vanished replica goes on"
        );
    }
}
