//! Fill coalescing across nodes: one origin fetch per URL for the whole cluster.
//!
//! Pingora's cache lock coalesces the misses of one process: the first request fetches, the others
//! wait and are woken as the fill lands. This module is its cross-node counterpart, through the
//! memcached cluster every node shares:
//!
//! * **Claim**: for a URL memcached does not have, the first node to `add` the URL's lease key
//!   (`{namespace}:fill:{primary hash}`) fetches it from the origin (`FillClaim::Ours`).
//!   Requests on the claiming node itself take the standard path, where Pingora's cache lock
//!   coalesces them (`FillClaim::ThisNode`); one claim per URL is out per node at a time.
//! * **Wait**: requests on the other nodes look for the holder's fill every 10 ms, where the
//!   caller says (the fast path: this node's memory tier, then memcached), and are served by it
//!   ([`FillLeases::on_shared_miss`]).
//! * **Release**: a fill that stored nothing deletes the lease when its request ends
//!   ([`HeldLease::on_request_end`]), so the waiters fetch for themselves at once instead of
//!   being held behind an uncacheable response; a stored fill leaves the lease to expire, since
//!   the waiters find the entry first.
//! * **Expiry**: the lease expires after `fill_lease` (default 3 s) on its own, so a node that
//!   dies mid-fill holds the others up for at most that long; a waiter gives up then too.
//!
//! `fill_lease = 0` switches coordination off (`FillClaim::Uncoordinated`); so does memcached
//! not answering the claim.

use super::shared_counters::SharedCounters;
use bytes::Bytes;
use lacquer_memcached::Cluster;
use parking_lot::Mutex;
use pingora_cache::key::{CacheHashKey, HashBinary};
use pingora_cache::CacheKey;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a request waiting for another node's fill looks for it.
const FILL_POLL: Duration = Duration::from_millis(10);

/// Who fills a URL nobody has stored yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FillClaim {
    /// This node: it took the lease.
    Ours,
    /// Another node holds the lease and is fetching it now.
    Theirs,
    /// Nobody coordinates: leases are off or memcached could not be asked. Fill here.
    Uncoordinated,
    /// A request on this node holds the lease: Pingora's cache lock coalesces the rest here, and
    /// wakes them the moment the fill lands.
    ThisNode,
}

/// What a waiting request saw when it looked for the fill (see [`FillLeases::on_shared_miss`]).
pub enum Sighting<T> {
    /// The fill is there and can be served.
    Arrived(T),
    /// Nothing is there yet.
    NotYet,
    /// Something is there that the caller cannot serve itself (stale, another variant, ...): the
    /// standard path must decide.
    Elsewhere,
}

/// What a request whose URL memcached does not have does next.
pub enum AfterSharedMiss<T> {
    /// Another node (or a request on this one) filled it while this request waited: serve it.
    Filled(T),
    /// Fetch it on the standard path. `lease`: this request holds the cluster's lease and must
    /// end it ([`HeldLease::on_request_end`]). `known_missing`: memcached still has nothing under
    /// the URL, so the standard path need not ask it again.
    FillHere {
        lease: Option<HeldLease>,
        known_missing: bool,
    },
}

impl<T> AfterSharedMiss<T> {
    fn fill_here(known_missing: bool) -> Self {
        AfterSharedMiss::FillHere {
            lease: None,
            known_missing,
        }
    }
}

/// The cluster's fill leases, as seen from this node.
pub struct FillLeases {
    cluster: Arc<Cluster>,
    namespace: String,
    /// How long a lease lasts; zero means fills are not coordinated across nodes.
    lease: Duration,
    /// Primary keys whose lease a request on this node is claiming (`false`) or holds (`true`).
    local_fills: Mutex<HashMap<HashBinary, bool>>,
    /// `fills_claimed` and `fills_awaited` are counted here.
    counters: Arc<SharedCounters>,
}

/// The lease a request holds on its URL's fill, until its request ends. (Boxed: the request
/// context that carries it is built and moved for every request, and few hold one.)
pub struct HeldLease(Box<Held>);

struct Held {
    leases: &'static FillLeases,
    primary: HashBinary,
    lease_key: String,
}

/// Unmarks a URL as being claimed on this node when its claim fails or the claiming request is
/// dropped mid-`add`.
struct PendingClaim<'a> {
    fills: &'a Mutex<HashMap<HashBinary, bool>>,
    primary: HashBinary,
}

impl Drop for PendingClaim<'_> {
    fn drop(&mut self) {
        self.fills.lock().remove(&self.primary);
    }
}

impl FillLeases {
    /// Leases of `lease` length (zero: off) in `cluster`, under `namespace`.
    pub fn new(
        cluster: Arc<Cluster>,
        namespace: &str,
        lease: Duration,
        counters: Arc<SharedCounters>,
    ) -> Self {
        FillLeases {
            cluster,
            namespace: namespace.to_string(),
            lease,
            local_fills: Mutex::default(),
            counters,
        }
    }

    fn lease_key(&self, key: &CacheKey) -> String {
        format!("{}:fill:{}", self.namespace, key.primary())
    }

    /// After memcached had nothing for `key`: claims the fill for this request, or, when another
    /// node holds the lease, waits for that fill and returns it. `look` looks for the fill once
    /// (the caller knows where, and what of it may be served); it runs every 10 ms until the fill
    /// arrives, until what it finds is [`Sighting::Elsewhere`], or until the lease is released or
    /// expires (then this request fetches for itself). A page rendered once is then rendered
    /// once for the whole cluster, not once per node.
    pub async fn on_shared_miss<T, F, Fut>(
        &'static self,
        key: &CacheKey,
        mut look: F,
    ) -> AfterSharedMiss<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Sighting<T>>,
    {
        match self.claim(key).await {
            FillClaim::Ours => {
                return AfterSharedMiss::FillHere {
                    lease: Some(HeldLease(Box::new(Held {
                        leases: self,
                        primary: key.primary_bin(),
                        lease_key: self.lease_key(key),
                    }))),
                    known_missing: true,
                }
            }
            FillClaim::Uncoordinated | FillClaim::ThisNode => {
                return AfterSharedMiss::fill_here(true)
            }
            FillClaim::Theirs => {}
        }
        let deadline = Instant::now() + self.lease;
        loop {
            tokio::time::sleep(FILL_POLL).await;
            match look().await {
                Sighting::Arrived(fill) => {
                    self.counters.fills_awaited.fetch_add(1, Ordering::Relaxed);
                    return AfterSharedMiss::Filled(fill);
                }
                Sighting::Elsewhere => return AfterSharedMiss::fill_here(false),
                Sighting::NotYet => {}
            }
            if Instant::now() >= deadline || !self.still_claimed(key).await {
                return AfterSharedMiss::fill_here(true);
            }
        }
    }

    /// Claims the fill of `key` for this node, unless another node or another request here has.
    async fn claim(&self, key: &CacheKey) -> FillClaim {
        if self.lease.is_zero() {
            return FillClaim::Uncoordinated;
        }
        let primary = key.primary_bin();
        // one claim per URL per node: a request arriving while another local request's `add` is
        // out waits for its outcome (at most op_timeout), then follows it
        let started = Instant::now();
        loop {
            {
                let mut fills = self.local_fills.lock();
                match fills.get(&primary) {
                    Some(true) => return FillClaim::ThisNode,
                    Some(false) => {}
                    None => {
                        fills.insert(primary, false);
                        break;
                    }
                }
            }
            if started.elapsed() > self.cluster.op_timeout() {
                return FillClaim::Uncoordinated;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // unmarks the URL when the claim fails, and when this request is dropped mid-`add`
        let pending = PendingClaim {
            fills: &self.local_fills,
            primary,
        };
        let ttl = self.lease.as_secs() as u32;
        let lease = self.lease_key(key);
        match self
            .cluster
            .add(lease.as_bytes(), Bytes::from_static(b"1"), ttl)
            .await
        {
            Some(true) => {
                std::mem::forget(pending);
                self.local_fills.lock().insert(primary, true);
                self.counters.fills_claimed.fetch_add(1, Ordering::Relaxed);
                FillClaim::Ours
            }
            Some(false) => FillClaim::Theirs,
            None => FillClaim::Uncoordinated,
        }
    }

    /// `key`'s URL was purged: a lease on it belongs to a fill from before the purge (or one
    /// that will find the URL purged), so it is deleted and the nodes that miss the URL now
    /// fetch it at once instead of waiting for the lease to expire.
    pub async fn on_purge(&self, key: &CacheKey) {
        if !self.lease.is_zero() {
            self.cluster.delete(self.lease_key(key).as_bytes()).await;
        }
    }

    /// Whether another node's lease on `key`'s fill is still held.
    async fn still_claimed(&self, key: &CacheKey) -> bool {
        self.cluster
            .get(self.lease_key(key).as_bytes())
            .await
            .is_some()
    }
}

impl HeldLease {
    /// The request that holds the lease is over (`logging`). When its fill `stored` nothing, the
    /// lease is deleted too: the nodes waiting for it then fetch for themselves at once instead
    /// of at the lease's expiry. A stored fill leaves the lease to expire; the waiters find the
    /// entry first.
    pub fn on_request_end(self, stored: bool) {
        let Held {
            leases,
            primary,
            lease_key,
        } = *self.0;
        leases.local_fills.lock().remove(&primary);
        if stored {
            return;
        }
        tokio::spawn(async move {
            leases.cluster.delete(lease_key.as_bytes()).await;
        });
    }
}
