//! The memcached cluster: which server holds a key, and whether that server is usable.
//!
//! Each server counts consecutive failures; at `failure_limit` it is ejected for `retry_after`,
//! after which the next operation is a probe. While a server is out, its keys are misses: they are
//! *not* rehashed onto the other servers (unless `rehash_on_eject`), because a rehashed key would
//! leave a stale copy behind when the server returns (the twemproxy/mcrouter trap). Every failure
//! costs at most the operation timeout; nothing here ever fails a client request.

use crate::batch::GetBatcher;
use crate::cas_token::CasToken;
use crate::client::ServerClient;
use crate::error::McError;
use crate::ketama::KetamaRing;
use crate::pool::ServerConfig;
use crate::protocol::CasOutcome;
use crate::server_stats::ServerStatsSnapshot;
use bytes::Bytes;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The most keys one batched multi-get carries (see [`GetBatcher`]).
const MAX_BATCH_KEYS: usize = 32;

/// What a [`Cluster`] is built from: its servers, the pool and time bounds of each server's
/// client, and the ejection rule. Its own type, so this crate knows nothing of how an
/// application configures it (Lacquer fills it from `[cache.memcached]`).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The servers, in the order every node must list them (ketama ties are broken by order).
    pub servers: Vec<ClusterServer>,
    /// Most connections open at once to each server; also the most get batches in flight to it.
    pub pool_size: usize,
    /// Bound on opening one TCP connection.
    pub connect_timeout: Duration,
    /// Bound on a whole operation, including pool wait, connect and one retry.
    pub op_timeout: Duration,
    /// Consecutive failures after which a server is ejected.
    pub failure_limit: u32,
    /// How long an ejected server stays out before the next operation probes it.
    pub retry_after: Duration,
    /// Whether an ejected server's keys go to the next server on the ring instead of missing.
    pub rehash_on_eject: bool,
}

/// One server of a [`ClusterConfig`].
#[derive(Debug, Clone)]
pub struct ClusterServer {
    /// The name ketama hashes (`host:port` as written), so every node must spell it the same.
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its share of the keys relative to the others (libmemcached's weighted ketama).
    pub weight: u32,
}

/// One server and its health.
struct Node {
    name: String,
    client: ServerClient,
    /// Single gets (the hit path) go through here, so concurrent ones share round trips.
    gets: GetBatcher,
    consecutive_failures: AtomicU32,
    ejected_until: Mutex<Option<Instant>>,
}

/// Counters an operator reads in `/stats`.
#[derive(Debug, Default)]
pub struct ClusterCounters {
    pub errors: AtomicU64,
    pub ejections: AtomicU64,
    pub skipped_ejected: AtomicU64,
}

/// One server as [`Cluster::server_reports`] describes it.
#[derive(Debug, Clone)]
pub struct ServerReport {
    /// As configured (`host:port`).
    pub name: String,
    /// Ejected right now: its keys are misses.
    pub ejected: bool,
    /// Connections open to it, idle or in use.
    pub open_connections: usize,
    /// Its latency, batch sizes, failures and timeouts since start.
    pub stats: ServerStatsSnapshot,
}

/// What a delete that its caller reports on found (see [`Cluster::delete_reporting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The server held the key and removed it.
    Deleted,
    /// The server answered: it did not hold the key.
    NotFound,
    /// The server is ejected: nothing was sent (its keys are misses meanwhile).
    Skipped,
    /// The server was asked and did not answer (timeout, connection error, server error).
    Failed,
}

/// The configured servers, placed on a libmemcached-compatible ketama ring.
pub struct Cluster {
    ring: KetamaRing,
    nodes: Vec<Node>,
    failure_limit: u32,
    retry_after: Duration,
    rehash_on_eject: bool,
    op_timeout: Duration,
    /// Failure and ejection counters.
    pub counters: ClusterCounters,
}

impl Cluster {
    /// Builds the ring and one pooled client per server; connects lazily.
    pub fn new(config: &ClusterConfig) -> Self {
        let ring = KetamaRing::new(
            &config
                .servers
                .iter()
                .map(|s| (s.name.clone(), s.weight))
                .collect::<Vec<_>>(),
        );
        let nodes = config
            .servers
            .iter()
            .map(|s| Node {
                name: s.name.clone(),
                client: ServerClient::new(ServerConfig {
                    addr: s.addr,
                    pool_size: config.pool_size,
                    connect_timeout: config.connect_timeout,
                    op_timeout: config.op_timeout,
                }),
                gets: GetBatcher::new(config.pool_size, MAX_BATCH_KEYS),
                consecutive_failures: AtomicU32::new(0),
                ejected_until: Mutex::new(None),
            })
            .collect();
        Cluster {
            ring,
            nodes,
            failure_limit: config.failure_limit,
            retry_after: config.retry_after,
            rehash_on_eject: config.rehash_on_eject,
            op_timeout: config.op_timeout,
            counters: ClusterCounters::default(),
        }
    }

    fn usable(&self, index: usize) -> bool {
        match *self.nodes[index].ejected_until.lock() {
            Some(until) => Instant::now() >= until,
            None => true,
        }
    }

    /// The server for `key`, or `None` when it is ejected (and rehashing is off).
    fn node_for(&self, key: &[u8]) -> Option<usize> {
        self.place(key, true)
    }

    /// Where `key` lives now; `count_skip`: an ejected server passed over is counted (an
    /// operation skipped), not merely looked at.
    fn place(&self, key: &[u8], count_skip: bool) -> Option<usize> {
        let index = self.ring.server_for(key)?;
        if self.usable(index) {
            return Some(index);
        }
        if count_skip {
            self.counters
                .skipped_ejected
                .fetch_add(1, Ordering::Relaxed);
        }
        if self.rehash_on_eject {
            self.ring.server_for_excluding(key, |i| self.usable(i))
        } else {
            None
        }
    }

    /// Counts an operation's outcome against its server. A server that answered, even with
    /// `SERVER_ERROR` (a value too large, out of memory), is reachable: only a server that did
    /// not answer (refused, reset, timed out, unreadable) counts towards ejection.
    fn record<T>(&self, index: usize, result: Result<T, McError>) -> Option<T> {
        let node = &self.nodes[index];
        let answered = |node: &Node| {
            if node.consecutive_failures.swap(0, Ordering::Relaxed) >= self.failure_limit {
                *node.ejected_until.lock() = None;
                log::info!("memcached {} is back in service", node.name);
            }
        };
        match result {
            Ok(value) => {
                answered(node);
                Some(value)
            }
            Err(McError::ServerError(e)) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                node.client.stats().on_failure(false);
                log::debug!("memcached {} refused an operation: {e}", node.name);
                answered(node);
                None
            }
            Err(e) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                node.client
                    .stats()
                    .on_failure(matches!(e, McError::Timeout));
                let failures = node.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= self.failure_limit {
                    let mut until = node.ejected_until.lock();
                    let newly = until.is_none_or(|t| Instant::now() >= t);
                    *until = Some(Instant::now() + self.retry_after);
                    if newly {
                        self.counters.ejections.fetch_add(1, Ordering::Relaxed);
                        log::warn!(
                            "memcached {} ejected for {:?} after {failures} consecutive failures: {e}",
                            node.name,
                            self.retry_after
                        );
                    }
                } else {
                    log::debug!("memcached {} failed ({failures}): {e}", node.name);
                }
                None
            }
        }
    }

    /// Whether the server that holds `placement_key` cannot be counted on right now: it is
    /// ejected (and its keys are misses), or its last operation failed. A caller that has just
    /// seen a miss asks this to tell "nothing stored" from "nobody answered", and then spends
    /// nothing more on that server for the request: a failing server costs one `op_timeout`,
    /// not one per operation.
    pub fn server_failing(&self, placement_key: &[u8]) -> bool {
        match self.place(placement_key, false) {
            Some(index) => {
                self.nodes[index]
                    .consecutive_failures
                    .load(Ordering::Relaxed)
                    > 0
            }
            None => true,
        }
    }

    /// Fetches one value; any failure is a miss.
    /// Concurrent gets to one server share round trips (see [`GetBatcher`]); a failed batch
    /// counts as one failure of the server, however many gets it carried. A get queued behind
    /// a slow batch still costs at most `op_timeout` in all.
    pub async fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.get_with(key, key).await
    }

    /// Fetches one value stored on the server of `placement_key` (as [`Self::get`]).
    pub async fn get_with(&self, placement_key: &[u8], key: &[u8]) -> Option<Bytes> {
        let index = self.node_for(placement_key)?;
        let node = &self.nodes[index];
        // One deadline for the wait in the queue and the batch itself, and one timer for the
        // leader (the pool's, at that instant): when the server does not answer, the leader's
        // timeout is counted against the server, so a frozen server is ejected however many
        // gets it swallows.
        let deadline = tokio::time::Instant::now() + self.op_timeout;
        node.gets
            .get(key, deadline, |keys| async move {
                let result = node.client.get_multi_by(&keys, deadline).await;
                self.record(index, result)
            })
            .await
    }

    /// Fetches several values that live with `placement_key` (chunks of one object are placed by
    /// their object's key, so one pipelined request fetches them all).
    pub async fn get_multi_with(
        &self,
        placement_key: &[u8],
        keys: &[Vec<u8>],
    ) -> Option<Vec<Option<Bytes>>> {
        let index = self.node_for(placement_key)?;
        let result = self.nodes[index].client.get_multi(keys).await;
        self.record(index, result)
    }

    /// Stores one value on the server of `placement_key`; returns whether it was stored.
    pub async fn set_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> bool {
        let Some(index) = self.node_for(placement_key) else {
            return false;
        };
        let result = self.nodes[index].client.set(key, value, ttl_secs).await;
        self.record(index, result).is_some()
    }

    /// Stores `value` under `key` on the server of `placement_key` only if `key` is absent
    /// ([`ServerClient::add_retried`]: retried on a stale connection, for a writer that looks at
    /// what is there when it is not stored): `Some(true)` when stored, `Some(false)` when the
    /// key was there, `None` when the server could not be asked.
    pub async fn add_retried_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Option<bool> {
        let index = self.node_for(placement_key)?;
        let result = self.nodes[index]
            .client
            .add_retried(key, value, ttl_secs)
            .await;
        self.record(index, result)
    }

    /// Fetches one value and its CAS token from the server of `placement_key`
    /// ([`ServerClient::gets`]): `Some(None)` on a miss, `None` when the server could not be
    /// asked. Not batched with other gets: a writer deciding whether to replace a value asks it.
    pub async fn gets_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
    ) -> Option<Option<(Bytes, CasToken)>> {
        let index = self.node_for(placement_key)?;
        let result = self.nodes[index].client.gets(key).await;
        self.record(index, result)
    }

    /// Replaces the value under `key` on the server of `placement_key` only if it is still the
    /// one [`Self::gets_with`] read with `token` ([`ServerClient::cas`]); `None` when the server
    /// could not be asked.
    pub async fn cas_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
        token: CasToken,
    ) -> Option<CasOutcome> {
        let index = self.node_for(placement_key)?;
        let result = self.nodes[index]
            .client
            .cas(key, value, ttl_secs, token)
            .await;
        self.record(index, result)
    }

    /// The most one operation may take ([`ClusterConfig::op_timeout`]).
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Stores `key` only if it is absent (memcached `add`): `Some(true)` when this call stored
    /// it, `Some(false)` when it was already there, `None` when the server could not be asked.
    pub async fn add(&self, key: &[u8], value: Bytes, ttl_secs: u32) -> Option<bool> {
        self.add_with(key, key, value, ttl_secs).await
    }

    /// [`Self::add`] on the server of `placement_key`: a fill lease lives with the object it
    /// guards, so the lease is lost, found or unreachable exactly when the object is.
    pub async fn add_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Option<bool> {
        let index = self.node_for(placement_key)?;
        let added = self.nodes[index].client.add(key, value, ttl_secs);
        self.within_op_timeout(index, added).await
    }

    /// [`Self::add_with`] that also returns the CAS token of the value it stored
    /// ([`ServerClient::add_token`]): `Some(Some(token))` when stored, `Some(None)` when the key
    /// was there, `None` when the server could not be asked.
    pub async fn add_token_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Option<Option<CasToken>> {
        let index = self.node_for(placement_key)?;
        let added = self.nodes[index].client.add_token(key, value, ttl_secs);
        self.within_op_timeout(index, added).await
    }

    /// `operation` on server `index`, given at most `op_timeout`, its outcome recorded: a
    /// timeout is a failure of the server like any other (and counts towards ejection).
    async fn within_op_timeout<T>(
        &self,
        index: usize,
        operation: impl std::future::Future<Output = Result<T, McError>>,
    ) -> Option<T> {
        let result = tokio::time::timeout(self.op_timeout, operation)
            .await
            .unwrap_or(Err(McError::Timeout));
        self.record(index, result)
    }

    /// Stores `value` under `key` on the server of `placement_key`, only if `key` is there
    /// (memcached `replace`): `Some(true)` when it was replaced, `Some(false)` when it was absent
    /// (and stays absent), `None` when the server could not be asked: unlike a `set`, it never
    /// brings back a value deleted meanwhile. (Lacquer renewed its fill leases this way; it now
    /// reads them and compares and swaps, [`Self::gets_with`] and [`Self::cas_with`], so that a
    /// renewal does not overwrite a lease another claimant made since.)
    pub async fn replace_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Option<bool> {
        let index = self.node_for(placement_key)?;
        let replaced = self.nodes[index].client.replace(key, value, ttl_secs);
        self.within_op_timeout(index, replaced).await
    }

    /// Deletes one value; returns whether the server answered.
    pub async fn delete(&self, key: &[u8]) -> bool {
        self.delete_with(key, key).await.is_some()
    }

    /// Deletes one value stored on the server of `placement_key`; returns whether the value was
    /// there (`Some(true)`), or not (`Some(false)`), or `None` when the server did not answer
    /// or is ejected.
    pub async fn delete_with(&self, placement_key: &[u8], key: &[u8]) -> Option<bool> {
        let index = self.node_for(placement_key)?;
        let result = self.nodes[index].client.delete(key).await;
        self.record(index, result)
    }

    /// Deletes one value stored on the server of `placement_key` only if its CAS token is still
    /// `token` ([`ServerClient::delete_cas`]); `None` when the server did not answer or is
    /// ejected.
    pub async fn delete_cas_with(
        &self,
        placement_key: &[u8],
        key: &[u8],
        token: CasToken,
    ) -> Option<CasOutcome> {
        let index = self.node_for(placement_key)?;
        let result = self.nodes[index].client.delete_cas(key, token).await;
        self.record(index, result)
    }

    /// Deletes one value and says what happened, and on which server (by index; `None` when
    /// the ring is empty): for callers that must report what they could and could not reach.
    /// The outcome is the owner's: while it is ejected, the value is deleted from the server
    /// standing in for it (`rehash_on_eject`), but the owner, which may come back with its old
    /// copy, is reported `Skipped`.
    pub async fn delete_reporting(&self, key: &[u8]) -> (Option<usize>, DeleteOutcome) {
        let Some(owner) = self.ring.server_for(key) else {
            return (None, DeleteOutcome::Skipped);
        };
        let Some(index) = self.node_for(key) else {
            return (Some(owner), DeleteOutcome::Skipped);
        };
        let result = self.nodes[index].client.delete(key).await;
        let outcome = match self.record(index, result) {
            _ if index != owner => DeleteOutcome::Skipped,
            Some(true) => DeleteOutcome::Deleted,
            Some(false) => DeleteOutcome::NotFound,
            None => DeleteOutcome::Failed,
        };
        (Some(owner), outcome)
    }

    /// Every server, in configured order, with whether it is ejected now and its operation
    /// counters (for metrics and the status page).
    pub fn server_reports(&self) -> Vec<ServerReport> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, node)| ServerReport {
                name: node.name.clone(),
                ejected: !self.usable(i),
                open_connections: node.client.open_connections(),
                stats: node.client.stats().read(),
            })
            .collect()
    }

    /// Names of the servers currently ejected.
    pub fn ejected(&self) -> Vec<String> {
        (0..self.nodes.len())
            .filter(|i| !self.usable(*i))
            .map(|i| self.nodes[i].name.clone())
            .collect()
    }
}

/// Operations on one server chosen by index rather than by key, for data that every server holds
/// a copy of (Lacquer's invalidation log): a copy on each server survives the loss of any of
/// them. Ejection still applies: an ejected server is not asked until its probe is due, and
/// failures count towards ejection as for any operation.
impl Cluster {
    /// How many servers are configured.
    pub fn server_count(&self) -> usize {
        self.nodes.len()
    }

    /// The name of server `index` (`host:port` as configured).
    pub fn server_name(&self, index: usize) -> &str {
        &self.nodes[index].name
    }

    /// The server ketama places `key` on, whether or not it is ejected.
    pub fn owner(&self, key: &[u8]) -> Option<usize> {
        self.ring.server_for(key)
    }

    /// Whether server `index` is in service (not ejected, or its probe is due).
    pub fn is_usable(&self, index: usize) -> bool {
        self.usable(index)
    }

    /// Fetches `keys` from server `index` in one pipelined round trip; `None` when the server is
    /// ejected or did not answer.
    pub async fn get_multi_on(&self, index: usize, keys: &[Vec<u8>]) -> Option<Vec<Option<Bytes>>> {
        if !self.usable(index) {
            return None;
        }
        let result = self.nodes[index].client.get_multi(keys).await;
        self.record(index, result)
    }

    /// Stores one value on server `index`; returns whether it was stored.
    pub async fn set_on(&self, index: usize, key: &[u8], value: Bytes, ttl_secs: u32) -> bool {
        if !self.usable(index) {
            return false;
        }
        let result = self.nodes[index].client.set(key, value, ttl_secs).await;
        self.record(index, result).is_some()
    }

    /// Appends `value` to the value under `key` on server `index` only if the key is there
    /// (never creating it): [`Appended::Refused`] when it is not stored, the key being absent
    /// or its value full (memcached answers `NOT_STORED` to both).
    pub async fn append_if_present_on(&self, index: usize, key: &[u8], value: Bytes) -> Appended {
        if !self.usable(index) {
            return Appended::Unanswered;
        }
        match self.flag_or_failure(index, self.nodes[index].client.append(key, value).await) {
            Ok(true) => Appended::Stored,
            Ok(false) => Appended::Refused,
            Err(failed) => failed,
        }
    }

    /// The flag a storage command on server `index` answered (counted as [`Self::record`]
    /// does), or what its failure means for an append: `SERVER_ERROR` refused it, anything else
    /// left it unanswered.
    fn flag_or_failure(
        &self,
        index: usize,
        result: Result<bool, McError>,
    ) -> Result<bool, Appended> {
        let refused = matches!(result, Err(McError::ServerError(_)));
        match self.record(index, result) {
            Some(flag) => Ok(flag),
            None if refused => Err(Appended::Refused),
            None => Err(Appended::Unanswered),
        }
    }

    /// Appends `value` to the value under `key` on server `index`, creating it (with
    /// `ttl_secs`) when absent; says whether the bytes were stored ([`Appended`]). Concurrent
    /// writers each get their bytes in whole: memcached appends atomically, and a writer that
    /// loses the race to create the key appends instead.
    pub async fn append_on(
        &self,
        index: usize,
        key: &[u8],
        value: Bytes,
        ttl_secs: u32,
    ) -> Appended {
        if !self.usable(index) {
            return Appended::Unanswered;
        }
        let client = &self.nodes[index].client;
        for _ in 0..2 {
            match self.flag_or_failure(index, client.append(key, value.clone()).await) {
                Ok(true) => return Appended::Stored,
                Ok(false) => {}
                Err(failed) => return failed,
            }
            match self.flag_or_failure(index, client.add(key, value.clone(), ttl_secs).await) {
                Ok(true) => return Appended::Stored,
                // another writer created it meanwhile: append to theirs
                Ok(false) => {}
                Err(failed) => return failed,
            }
        }
        // the key is there and takes no more (memcached answers `NOT_STORED` to an append that
        // would pass its item size limit)
        Appended::Refused
    }
}

/// What an append to one server did ([`Cluster::append_on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The bytes are stored.
    Stored,
    /// The server answered and did not store them: the value would pass its item size limit
    /// (`NOT_STORED` to the append while the key is there), or it answered `SERVER_ERROR`
    /// (out of memory, too large).
    Refused,
    /// The server did not answer (or is ejected, and was not asked).
    Unanswered,
}
