//! The tiered store: this node's memory tier in front of the memcached cluster shared by all nodes.
//!
//! * **Lookup**: memory first; on a memory miss, memcached. A memcached hit is checked (format,
//!   CRC-32, echoed key, every chunk) and promoted into memory, where it is trusted for the short
//!   `local_ttl` only, so hot objects are served locally yet stay coherent with the cluster.
//! * **Fill**: the origin's response streams into the memory tier as before; when it completes,
//!   the entry is written to memcached in a spawned task, off the client's critical path, unless
//!   memcached holds a newer answer for the key (fills land out of order:
//!   [`TieredStorage::store_unless_newer`]). Bodies larger than one item go in chunks, with the
//!   manifest written last.
//! * **Purge**: removes this node's copy and the memcached entry ([`TieredStorage::delete_shared`]
//!   says what the delete reached). Reaching the other nodes, and entries a delete could not
//!   reach, is [`crate::invalidation`]'s: every entry read from memcached is judged by the
//!   node's [`BanList`] before it is served or promoted, so an entry a purge or ban covers is a
//!   miss (or, after a soft one, stale) wherever it comes back from, and an entry older than the
//!   bans' retention is not trusted.
//! * **Fill coalescing** across nodes is [`super::fill_lease`]'s, over the same cluster.
//!
//! Anything wrong in memcached (unreachable server, timeout, garbage, a missing chunk) is a miss
//! and is counted; it never fails a request.

use super::decoded_values::DecodedValues;
use super::entry::{self, ChunkList, EntryBody};
use super::fill_lease::{Claim, FetchedUnderAnotherClaim, FillLeases};
use super::guarded_fills::{GuardedFill, GuardedFills};
use super::memory::{CompleteObject, MemoryMiss, MemoryTier, SharedWriteInFlight};
use super::object::{with_room_for_hit_fields, Body, StoredMeta};
use super::shared_counters::{BackgroundTask, SharedCounters};
use super::shared_framing;
use crate::config::memcached::MemcachedConfig;
use crate::policy::vary;
use crate::storage::ban_list::scope::EntryScopes;
use crate::storage::ban_list::{ms_after, BanList, Verdict, SHORT_RETENTION};
use async_trait::async_trait;
use bytes::Bytes;
use lacquer_memcached::{
    usable_cas_token, CasOutcome, Cluster, ClusterConfig, ClusterServer, DeleteOutcome,
};
use pingora_cache::key::{CacheHashKey, CompactCacheKey};
use pingora_cache::storage::{
    HandleMiss, HitHandler, MissFinishType, MissHandler, PurgeOutcome, PurgeTarget, PurgeType,
    Storage,
};
use pingora_cache::trace::SpanHandle;
use pingora_cache::{CacheKey, CacheMeta};
use pingora_error::Result;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Room left in each memcached item for the entry's own header (key, metadata, checksum).
const ITEM_HEADROOM: usize = 16 * 1024;
/// memcached reads TTLs above 30 days as absolute times.
const MAX_TTL_SECS: u64 = 30 * 24 * 3600;
/// How long a memcached read waits for a node that just started to read the invalidation log.
const CATCH_UP_PATIENCE: Duration = Duration::from_secs(2);
/// The most writes kept to be judged after a later read of the log
/// ([`TieredStorage::judge_later`]), by memcached key; beyond it a write is deleted instead (it
/// cannot be judged, and must not be left to outlive a purge).
const MAX_UNJUDGED: usize = 10_000;
/// Room left, before a short-lived record leaves the cluster's log, for the clocks and the read
/// that finds it (see [`TieredStorage::judge_later`]).
const LOG_MARGIN: Duration = Duration::from_secs(60);

/// The memcached key of a cache key: `{namespace}:{hex of Pingora's combined Blake2b-128 hash}`.
/// Always 36+ printable bytes without whitespace, within memcached's 250-byte limit.
///
/// The same text as `format!("{namespace}:{}", key.combined())`, written with the `hex` crate:
/// Pingora's `combined()` formats each byte through `fmt` (about 4,000 instructions per key,
/// on every memcached hit; measured with `bench/hit_instructions.sh --memcached`).
pub fn memcached_key(namespace: &str, key: &impl CacheHashKey) -> String {
    namespaced_hex(namespace, "", &key.combined_bin())
}

/// `{namespace}:{infix}{hash in hex}`, the shape of every memcached key of a URL; without
/// `format!` and Pingora's byte-by-byte `hex2str`, which cost a miss about 3,000 instructions
/// per key.
pub(crate) fn namespaced_hex(namespace: &str, infix: &str, hash: &[u8; 16]) -> String {
    let mut digits = [0u8; 32];
    hex::encode_to_slice(hash, &mut digits).expect("16 bytes are 32 hex digits");
    let mut out = String::with_capacity(namespace.len() + 1 + infix.len() + digits.len());
    out.push_str(namespace);
    out.push(':');
    out.push_str(infix);
    out.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
    out
}

/// The logical key echoed inside every value: the primary key, plus `#` and the variance in hex.
pub fn logical_key(key: &CacheKey) -> String {
    let primary = String::from_utf8_lossy(key.primary_key()).into_owned();
    match key.variance() {
        Some(v) => format!("{primary}#{v}"),
        None => primary,
    }
}

/// [`logical_key`]`(key)`, made where [`DecodedValues`] keeps it: for a key with no variance
/// (every URL but a variant's), one allocation, not the `String`'s and a copy of it.
fn logical_key_shared(key: &CacheKey) -> Arc<str> {
    match key.variance() {
        None => Arc::from(&*String::from_utf8_lossy(key.primary_key())),
        Some(_) => logical_key(key).into(),
    }
}

/// Whether `logical` is [`logical_key`]`(key)`, without building it for a key with no variance
/// (the bytes are compared: equal ones are valid UTF-8, which `logical_key` keeps as it is).
fn logical_key_is(key: &CacheKey, logical: &str) -> bool {
    match key.variance() {
        None if logical.as_bytes() == key.primary_key() => true,
        _ => logical_key(key) == logical,
    }
}

fn chunk_key(mc_key: &str, write_id: u64, index: u32) -> String {
    format!("{mc_key}:{write_id:016x}:{index}")
}

/// The memory tier in front of the memcached cluster.
pub struct TieredStorage {
    memory: &'static MemoryTier,
    cluster: Arc<Cluster>,
    namespace: String,
    chunk_size: usize,
    item_size: usize,
    keep: Duration,
    /// Cluster-wide coalescing of fills, over the same cluster.
    fill_leases: FillLeases,
    /// The purges and bans entries read from memcached are judged by.
    bans: &'static BanList,
    next_write: AtomicU64,
    /// The last few values read for the fast path, decoded once (see [`DecodedValues`]).
    decoded: DecodedValues,
    /// What the shared tier has done.
    pub counters: Arc<SharedCounters>,
    /// Writes not judged yet because the log could not be read ([`TieredStorage::judge_later`]).
    unjudged: parking_lot::Mutex<UnjudgedWrites>,
    /// Fills in flight fetched under another claim's lease, joined only while it stands.
    guarded_fills: GuardedFills,
}

/// A write this node could not judge in time: no read of the cluster's log got an answer for a
/// while after it landed, so a purge covering it may be unknown here (see
/// [`TieredStorage::judge_later`]).
struct UnjudgedWrite {
    key: CacheKey,
    meta: StoredMeta,
    /// False: the write failed, and may land all the same.
    written: bool,
    /// When (ms since the epoch) a purge published before it could have reached the log.
    landed_ms: u64,
    /// Counted as background work until judged: a draining node waits for it as for a write.
    _task: BackgroundTask,
}

/// The writes waiting for a log read to judge them, by memcached key, and whether a task is
/// waiting for that read.
#[derive(Default)]
struct UnjudgedWrites {
    by_key: HashMap<String, UnjudgedWrite>,
    judging: bool,
}

/// How a write of an entry to memcached ended ([`TieredStorage::write_entry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteOutcome {
    /// Stored.
    Written,
    /// Not stored, and nothing of it will land: memcached holds an answer for the key validated
    /// after this one, which stays (see [`TieredStorage::store_unless_newer`]).
    Superseded,
    /// Not stored, or not known to be: the server did not answer (the write may still land).
    Failed,
}

/// How many times a write looks again at a key other writers keep changing before it leaves
/// theirs there ([`TieredStorage::store_unless_newer`]).
const MAX_WRITE_ROUNDS: usize = 3;

/// How much the ban list can be trusted to know every purge that covers a write when it is
/// judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Once a log read begun after the write landed was applied (the usual case).
    InTime,
    /// After a later read, the log having been unreadable meanwhile: a purge covering the entry
    /// was unknown here for a while, and other nodes may have read the entry meanwhile.
    Late,
    /// So late that a short-lived purge covering it may have left the log (and every node's
    /// list) since: no ban found proves nothing.
    TooLate,
}

impl TieredStorage {
    /// Wraps `memory` (already in near-cache mode) with the configured cluster; entries read
    /// from it are judged by `bans`.
    pub fn new(
        memory: &'static MemoryTier,
        config: &MemcachedConfig,
        bans: &'static BanList,
    ) -> Self {
        // a fill's stored object comes back only in near-cache mode (`MemoryMiss::finish_fill`);
        // without it every fill would count as refused and write nothing
        debug_assert!(
            memory.is_near_cache(),
            "the memory tier must be a near cache"
        );
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let cluster = Arc::new(Cluster::new(&cluster_config(config)));
        let counters = Arc::new(SharedCounters::default());
        TieredStorage {
            memory,
            fill_leases: FillLeases::new(
                cluster.clone(),
                &config.namespace,
                config.fill_lease,
                counters.clone(),
                bans,
                memory,
            ),
            cluster,
            bans,
            namespace: config.namespace.clone(),
            chunk_size: config.item_size.saturating_sub(ITEM_HEADROOM).max(1024),
            item_size: config.item_size,
            keep: config.keep,
            next_write: AtomicU64::new(seed),
            decoded: DecodedValues::default(),
            counters,
            unjudged: parking_lot::Mutex::default(),
            guarded_fills: GuardedFills::default(),
        }
    }

    /// The cluster, for `/stats`.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The cluster, shared with the invalidation log that every server keeps a copy of.
    pub fn cluster_handle(&self) -> Arc<Cluster> {
        self.cluster.clone()
    }

    /// The namespace every key of this cluster starts with.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Cluster-wide coalescing of fills (see [`super::fill_lease`]).
    pub fn fill_leases(&self) -> &FillLeases {
        &self.fill_leases
    }

    /// The memcached key of `key` in this cluster's namespace.
    pub fn memcached_key(&self, key: &impl CacheHashKey) -> String {
        memcached_key(&self.namespace, key)
    }

    /// Deletes the memcached entry under `mc_key` (a URL's primary slot), saying which server
    /// holds it and what the delete found there.
    pub async fn delete_shared(&self, mc_key: &str) -> (Option<String>, DeleteOutcome) {
        let (server, outcome) = self.cluster.delete_reporting(mc_key.as_bytes()).await;
        let name = server.map(|i| self.cluster.server_name(i).to_string());
        (name, outcome)
    }

    /// Reads `key` from memcached and promotes a hit into the memory tier (for `local_ttl`); the
    /// one shared read of both the standard lookup and the proxy's hit fast path. The caller
    /// judges freshness and variance.
    pub async fn read_and_promote(&self, key: &CacheKey) -> Option<(StoredMeta, Body)> {
        let (mut meta, body, scopes) = self.shared_lookup(key).await?;
        if !self.memory.promotes() {
            return Some((meta, body));
        }
        // The value was read without a copy and shares its allocation with the connection's
        // read buffer (and the replies around it), and the decoded head's fields are slices of
        // it: what the memory tier keeps owns its bytes.
        meta.header = with_room_for_hit_fields(&meta.header);
        let body = super::memory::owned_body(body.chunks());
        self.memory.promote_with(key, &meta, &body, scopes);
        Some((meta, body))
    }

    /// Reads `key` from memcached for the proxy's hit fast path, as a complete object: as
    /// [`TieredStorage::read_and_promote`], except that when nothing is promoted (`local_ttl` of
    /// 0) a value another request has just decoded is not decoded again ([`DecodedValues`]:
    /// concurrent gets of one key share one value). The caller judges freshness and variance.
    pub async fn read_complete(&self, key: &CacheKey) -> Option<CompleteObject> {
        if self.memory.promotes() {
            let (meta, body) = self.read_and_promote(key).await?;
            return Some(CompleteObject::detached(meta, body));
        }
        self.bans.wait_ready(CATCH_UP_PATIENCE).await;
        let mc_key = memcached_key(&self.namespace, key);
        let Some(value) = self.cluster.get(mc_key.as_bytes()).await else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if let Some((object, logical)) = self.decoded.find(&value) {
            if logical_key_is(key, &logical) {
                let (verdict, _) = self.verdict(key, &logical, object.meta(), false)?;
                let served = self.served(verdict, object);
                if served.is_some() {
                    self.counters.decodes_shared.fetch_add(1, Ordering::Relaxed);
                }
                return served;
            }
        }
        // made once, where a remembered value keeps it
        let logical = logical_key_shared(key);
        let (mut meta, body) = self.decoded_value(&value, &logical)?;
        let bytes = match body {
            EntryBody::Inline(bytes) => bytes,
            chunked @ EntryBody::Chunked(_) => {
                let (meta, body, _) = self.verified(key, &mc_key, &logical, meta, chunked).await?;
                return Some(CompleteObject::detached(meta, body));
            }
        };
        // judged, then reframed, in the order of `verified`
        let (verdict, _) = self.verdict(key, &logical, &meta, false)?;
        if verdict == Verdict::Invalid {
            self.counters.invalidated.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let fields = meta.header.headers.len();
        self.reframed(&mut meta, bytes.len(), &logical)?;
        let object = CompleteObject::detached(meta, Body::from_chunks(vec![bytes]));
        // Not remembered: a value larger than an item (what a hostile server could send, and
        // a remembered value pins its read buffer), and a head the reframing took fields out of
        // (hop-by-hop fields a crafted value carried), whose next readers judge it by the head
        // as it came, as this one did.
        if value.len() <= self.item_size && object.meta().header.headers.len() >= fields {
            self.decoded.remember(value, logical, object.clone());
        }
        self.served(verdict, object)
    }

    /// A complete object read from memcached, as its verdict says it may be served (`None`:
    /// not at all; a copy marked stale when a soft purge or ban covers it), counted.
    fn served(&self, verdict: Verdict, object: CompleteObject) -> Option<CompleteObject> {
        let object = match verdict {
            Verdict::Valid => object,
            Verdict::StaleSince(since) => match object.meta().stale_from(since) {
                None => object,
                Some(until) => {
                    let mut meta = object.meta().clone();
                    meta.fresh_until = until;
                    CompleteObject::detached(meta, object.body().clone())
                }
            },
            Verdict::Invalid => {
                self.counters.invalidated.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some(object)
    }

    /// Fetches and verifies an entry from memcached, and judges it by the ban list: an entry a
    /// purge or ban covers (or older than the bans' retention) is a miss, one a soft purge or
    /// ban covers is returned stale. Also returns the entry's scopes when it is to be promoted.
    async fn shared_lookup(
        &self,
        key: &CacheKey,
    ) -> Option<(StoredMeta, Body, Option<Box<EntryScopes>>)> {
        self.bans.wait_ready(CATCH_UP_PATIENCE).await;
        let mc_key = memcached_key(&self.namespace, key);
        let Some(value) = self.cluster.get(mc_key.as_bytes()).await else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let logical = logical_key(key);
        let (meta, body) = self.decoded_value(&value, &logical)?;
        self.verified(key, &mc_key, &logical, meta, body).await
    }

    /// A memcached value decoded and checked against the logical key it must carry (rejected
    /// and counted when it does not decode).
    fn decoded_value(&self, value: &Bytes, logical: &str) -> Option<(StoredMeta, EntryBody)> {
        match entry::decode(value, logical) {
            Ok(decoded) => Some((decoded.meta, decoded.body)),
            Err(e) => {
                log::debug!("memcached value for {logical} rejected: {e}");
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// A decoded entry judged by the ban list, its body fetched (a chunked one's chunks, only
    /// once the entry is known to be served) and its framing rebuilt; counted as a hit.
    async fn verified(
        &self,
        key: &CacheKey,
        mc_key: &str,
        logical: &str,
        mut meta: StoredMeta,
        body: EntryBody,
    ) -> Option<(StoredMeta, Body, Option<Box<EntryScopes>>)> {
        if meta.variance.is_some() != vary::varies(&meta.header) {
            // a variance without a `Vary` that makes one, or a `Vary` without its variance (a
            // planted entry): the standard path would never match it, the fast path would serve
            // it to every request
            log::debug!("memcached value for {logical} rejected: variance and Vary disagree");
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        // judged before the chunks are fetched: a purged entry costs no more round trips
        let scopes = self.judge(key, logical, &mut meta)?;
        let body = match body {
            EntryBody::Inline(bytes) => Some(Body::from_chunks(vec![bytes])),
            // a body over `max_object_size` (this node's, though another wrote it) is never
            // fetched: every request of it would hold it whole
            EntryBody::Chunked(list) if list.body_len > self.memory.max_object_size() as u64 => {
                log::debug!("memcached value for {logical} rejected: over max_object_size");
                None
            }
            EntryBody::Chunked(list) => self.fetch_chunks(mc_key, logical, &list).await,
        };
        let Some(body) = body else {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        self.reframed(&mut meta, body.len(), logical)?;
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
        Some((meta, body, scopes))
    }

    /// Untrusted input: the head's framing is rebuilt from the body it came with (rejected and
    /// counted when it cannot be).
    fn reframed(&self, meta: &mut StoredMeta, body_len: usize, logical: &str) -> Option<()> {
        if let Err(e) = shared_framing::reframe(meta, body_len) {
            log::debug!("memcached value for {logical} rejected: {e}");
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(())
    }

    /// The ban list's verdict on an entry read from memcached under `key` (whose logical key
    /// is `logical`): `None` when it must not be served; otherwise its scopes if it is to be
    /// promoted, with `meta` marked stale when a soft purge or ban covers it.
    fn judge(
        &self,
        key: &CacheKey,
        logical: &str,
        meta: &mut StoredMeta,
    ) -> Option<Option<Box<EntryScopes>>> {
        let (verdict, scopes) = self.verdict(key, logical, meta, self.memory.promotes())?;
        match verdict {
            Verdict::Valid => {}
            Verdict::StaleSince(since) => {
                if let Some(until) = meta.stale_from(since) {
                    meta.fresh_until = until;
                }
            }
            Verdict::Invalid => {
                self.counters.invalidated.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        Some(scopes.map(Box::new))
    }

    /// The ban list's verdict on an entry, and its scopes when `promotes`; `None` (counted)
    /// when it is older than the bans' retention.
    fn verdict(
        &self,
        key: &CacheKey,
        logical: &str,
        meta: &StoredMeta,
        promotes: bool,
    ) -> Option<(Verdict, Option<EntryScopes>)> {
        let now = SystemTime::now();
        if meta.dated_ahead(now) {
            // no purge issued before its date would cover it: not trusted at all
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.bans.beyond_horizon(meta.validated(), now) {
            self.counters.invalidated.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.bans.is_empty() && !promotes {
            return Some((Verdict::Valid, None));
        }
        let (primary_text, primary) = primary_of(key, logical);
        let scopes = self.bans.scopes_of(primary_text, primary, &meta.header);
        let verdict = self.bans.judge(&scopes, meta.validated());
        Some((verdict, promotes.then_some(scopes)))
    }

    async fn fetch_chunks(&self, mc_key: &str, logical: &str, list: &ChunkList) -> Option<Body> {
        let keys: Vec<Vec<u8>> = (0..list.count)
            .map(|i| chunk_key(mc_key, list.write_id, i).into_bytes())
            .collect();
        let values = self
            .cluster
            .get_multi_with(mc_key.as_bytes(), &keys)
            .await?;
        entry::assemble_chunks(values, logical, list).map(Body::from_chunks)
    }

    fn ttl_secs(&self, meta: &StoredMeta) -> u32 {
        let fresh = meta
            .fresh_until
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        let stale = meta.stale_while_revalidate_sec.max(meta.stale_if_error_sec);
        let ttl = fresh.as_secs() + u64::from(stale) + self.keep.as_secs();
        // never longer than purges and bans are remembered: readers would not trust it anyway
        let horizon = self.bans.retention().as_secs().min(MAX_TTL_SECS);
        ttl.clamp(1, horizon.max(1)) as u32
    }

    /// Writes a complete object to memcached: one value, or chunks and then the manifest; the
    /// value under the key itself only where it replaces no newer answer
    /// ([`TieredStorage::store_unless_newer`]).
    async fn write_entry(&self, key: &CacheKey, meta: &StoredMeta, body: &Body) -> WriteOutcome {
        let mc_key = memcached_key(&self.namespace, key);
        let logical = logical_key(key);
        let ttl = self.ttl_secs(meta);
        if body.len() + ITEM_HEADROOM <= self.item_size {
            let value = entry::encode_complete(&logical, meta, body.chunks());
            return self
                .store_unless_newer(&mc_key, &logical, value, ttl, meta.validated())
                .await;
        }
        let write_id = self.next_write.fetch_add(1, Ordering::Relaxed);
        let flat: Vec<u8> = body.chunks().concat();
        let mut count = 0u32;
        for (i, piece) in flat.chunks(self.chunk_size).enumerate() {
            let value = entry::encode_chunk(&logical, write_id, i as u32, piece);
            let chunk = chunk_key(&mc_key, write_id, i as u32);
            if !self
                .cluster
                .set_with(mc_key.as_bytes(), chunk.as_bytes(), value, ttl)
                .await
            {
                return WriteOutcome::Failed;
            }
            count += 1;
        }
        let list = ChunkList {
            write_id,
            body_len: flat.len() as u64,
            count,
            body_crc: crc32fast::hash(&flat),
        };
        // the manifest goes last: until it is there, readers see a miss, never a partial body
        let manifest = entry::encode_manifest(&logical, meta, &list);
        let outcome = self
            .store_unless_newer(&mc_key, &logical, manifest, ttl, meta.validated())
            .await;
        if outcome == WriteOutcome::Superseded {
            // no manifest will ever list these chunks
            for i in 0..count {
                let chunk = chunk_key(&mc_key, write_id, i);
                self.cluster
                    .delete_with(mc_key.as_bytes(), chunk.as_bytes())
                    .await;
            }
        }
        outcome
    }

    /// Stores `value`, an entry (or manifest) of `logical` validated at `validated`, under
    /// `mc_key`, unless memcached holds an answer for the key validated later: fills land out
    /// of order (a fill whose request waited at the origin while a purge went through, and a
    /// newer one fetched after the purge on another node), and the later one written first must
    /// stay, not be replaced by the older one (which its writer would then delete once it reads
    /// the purge, leaving nothing for every node to refetch).
    ///
    /// The common case after a miss costs what a `set` did, one round trip: an `add`, the key
    /// being absent. When something is there, it is read with its CAS token and compared: an
    /// answer validated no later than this one (a revalidation's 304 moves the time on, so a
    /// refreshed entry replaces the one it refreshes), and anything that is not an entry of this
    /// key (garbage, a foreign value), is replaced with a compare-and-swap, so a write that
    /// landed in between is looked at in turn; one validated later stays. A key deleted in
    /// between (a purge) is added again, as a `set` after the delete would have been: judging
    /// that write is [`TieredStorage::judge_written`]'s. A server run without CAS tokens (`-C`)
    /// refuses every compare-and-swap: there, what was read as older is replaced by a `replace`.
    async fn store_unless_newer(
        &self,
        mc_key: &str,
        logical: &str,
        value: Bytes,
        ttl: u32,
        validated: SystemTime,
    ) -> WriteOutcome {
        let key = mc_key.as_bytes();
        for _ in 0..MAX_WRITE_ROUNDS {
            match self
                .cluster
                .add_retried_with(key, key, value.clone(), ttl)
                .await
            {
                None => return WriteOutcome::Failed,
                Some(true) => return WriteOutcome::Written,
                Some(false) => {}
            }
            let (stored, token) = match self.cluster.gets_with(key, key).await {
                None => return WriteOutcome::Failed,
                // deleted since the add: added again
                Some(None) => continue,
                Some(Some(found)) => found,
            };
            // an entry dated further ahead than clocks differ is garbage, not a newer answer
            let newer = entry::decode(&stored, logical).is_ok_and(|there| {
                there.meta.validated() > validated && !there.meta.dated_ahead(SystemTime::now())
            });
            if newer {
                return WriteOutcome::Superseded;
            }
            let Some(token) = usable_cas_token(token) else {
                // a server run without CAS tokens (`-C`) refuses every compare-and-swap, so an
                // older answer (a stale entry kept for revalidation, `keep`) could never be
                // replaced, and every node would refetch the page on each read of it until it
                // expired: replaced by a `replace` of what was just read as older (only an
                // answer written in between would be overwritten, as every write did before
                // the compare)
                match self
                    .cluster
                    .replace_with(key, key, value.clone(), ttl)
                    .await
                {
                    None => return WriteOutcome::Failed,
                    Some(true) => return WriteOutcome::Written,
                    // deleted since it was read: added again
                    Some(false) => continue,
                }
            };
            match self
                .cluster
                .cas_with(key, key, value.clone(), ttl, token)
                .await
            {
                None => return WriteOutcome::Failed,
                Some(CasOutcome::Stored) => return WriteOutcome::Written,
                // written or deleted since it was read: looked at again
                Some(CasOutcome::Changed | CasOutcome::Gone) => {}
            }
        }
        // other writers kept writing the key while this one looked: theirs stay, and nothing
        // of this write landed (every attempt was answered "not stored")
        WriteOutcome::Superseded
    }

    /// Judges an entry this node has just written to memcached once more, when every purge and
    /// ban that could cover it is known here, and deletes it if one does (unless a newer answer
    /// has replaced it since).
    ///
    /// A purge is published to the cluster's log after its delete of the URL's entry and of its
    /// fill lease are answered (by at most two `op_timeout`s; a publication that misses a server
    /// makes the ban long-lived instead, see `invalidation`), and this node reads the log every
    /// `poll_interval`, also while it drains.
    /// So a fill that began before a purge, on this node or another, can be judged valid when
    /// it is stored and written after the purge's delete. Readers judge the entry banned, but
    /// only for as long as the ban is kept: a purge whose delete was answered is kept for
    /// [`SHORT_RETENTION`] only, after which the
    /// entry (kept for its freshness lifetime) would be served again on every node. Waiting for
    /// a log read that began two `op_timeout`s after the write landed closes that gap. When the
    /// entry's server does not answer the read-back or the delete, the purge is kept for the
    /// whole retention instead ([`BanList::keep_url_purge`]), here and, republished by the
    /// invalidation service, on every node: the entry outlives no purge. When that read does
    /// not come (the log could not be read: every server frozen or unreachable), the write is
    /// not judged by the list as it stands, which may lack the purge: it waits for a later read
    /// ([`TieredStorage::judge_later`]).
    ///
    /// `written` is false for a write that failed: it may have landed all the same (a server
    /// that froze carries out what is in its socket when it thaws), so a purge that covers it
    /// is kept as for an entry that could not be deleted.
    async fn judge_written(&'static self, key: &CacheKey, meta: &StoredMeta, written: bool) {
        let publication = self.cluster.op_timeout() * 2;
        let landed_ms = ms_after(SystemTime::now()) + publication.as_millis() as u64;
        if !self.bans.wait_log_read_from(landed_ms, publication).await {
            // the list may lack the very purge that covers this write: not judged by it
            self.judge_later(UnjudgedWrite {
                key: key.clone(),
                meta: meta.clone(),
                written,
                landed_ms,
                _task: self.counters.background_task(),
            });
            return;
        }
        self.judge_by_bans(key, meta, written, Judged::InTime).await;
    }

    /// Keeps a write [`TieredStorage::judge_written`] could not judge (no read of the log got
    /// an answer since it landed, every server frozen or unreachable) until a read does, and
    /// judges it then as a write judged in time would be; one found banned is judged late,
    /// so its purge is also kept for the whole retention: nodes may have forgotten it, or read
    /// the entry, meanwhile. Judged by an incomplete list instead, the entry would stay in
    /// memcached for its freshness lifetime while a short-lived purge that covers it is
    /// forgotten after five minutes, and then be served everywhere: the purge undone.
    ///
    /// Kept per memcached key (the oldest write of a key is the one a purge covers first, so
    /// judging it is enough), at most [`MAX_UNJUDGED`] keys; beyond that a write is deleted from
    /// memcached at once, unjudged. One judged later than short-lived records stay in the log
    /// (five minutes, less [`LOG_MARGIN`]) after it landed is deleted unless a newer answer
    /// replaced it, whatever the list says: a purge that covered it may be gone from the log.
    fn judge_later(&'static self, write: UnjudgedWrite) {
        self.counters
            .writes_judged_late
            .fetch_add(1, Ordering::Relaxed);
        let mc_key = memcached_key(&self.namespace, &write.key);
        let mut unjudged = self.unjudged.lock();
        let full = unjudged.by_key.len() >= MAX_UNJUDGED;
        match unjudged.by_key.get_mut(&mc_key) {
            Some(kept) => {
                // one failed write of the key may still land: the read-back vouches for none
                let written = kept.written && write.written;
                let landed_ms = kept.landed_ms.max(write.landed_ms);
                if write.meta.validated() < kept.meta.validated() {
                    *kept = write;
                }
                kept.written = written;
                kept.landed_ms = landed_ms;
            }
            None if full => {
                drop(unjudged);
                log::warn!(
                    "memcached: more than {MAX_UNJUDGED} writes wait for a read of the \
                     invalidation log to be judged; {} is deleted unjudged",
                    logical_key(&write.key)
                );
                tokio::spawn(async move {
                    let write = write;
                    self.cluster
                        .delete_with(mc_key.as_bytes(), mc_key.as_bytes())
                        .await;
                    drop(write);
                });
                return;
            }
            None => {
                unjudged.by_key.insert(mc_key, write);
            }
        }
        if !std::mem::replace(&mut unjudged.judging, true) {
            tokio::spawn(self.judge_unjudged());
        }
    }

    /// Judges the writes [`TieredStorage::judge_later`] kept, each once a read of the log begun
    /// after it landed has been applied; ends when none is left.
    async fn judge_unjudged(&'static self) {
        loop {
            let oldest = {
                let mut unjudged = self.unjudged.lock();
                let oldest = unjudged.by_key.values().map(|w| w.landed_ms).min();
                if oldest.is_none() {
                    unjudged.judging = false;
                }
                oldest
            };
            let Some(oldest) = oldest else {
                return;
            };
            let read_from = self.bans.log_read_since(oldest).await;
            let due: Vec<UnjudgedWrite> = self
                .unjudged
                .lock()
                .by_key
                .extract_if(|_, w| w.landed_ms <= read_from)
                .map(|(_, w)| w)
                .collect();
            let log_tells_for = SHORT_RETENTION
                .min(self.bans.retention())
                .saturating_sub(LOG_MARGIN);
            let now_ms = ms_after(SystemTime::now());
            for write in due {
                let late = Duration::from_millis(now_ms.saturating_sub(write.landed_ms));
                let judged = if late > log_tells_for {
                    Judged::TooLate
                } else {
                    Judged::Late
                };
                log::info!(
                    "memcached: {} judged {:?} after its write, once the invalidation log \
                     could be read ({judged:?})",
                    logical_key(&write.key),
                    late
                );
                self.judge_by_bans(&write.key, &write.meta, write.written, judged)
                    .await;
            }
        }
    }

    /// Judges a write by the bans known here (see [`TieredStorage::judge_written`]): one a hard
    /// purge or ban covers (or, [`Judged::TooLate`], any) is deleted unless a newer answer
    /// replaced it; when it could not be, or it was judged late, a purge of its URL is kept for
    /// the whole retention.
    async fn judge_by_bans(&self, key: &CacheKey, meta: &StoredMeta, written: bool, when: Judged) {
        if self.bans.is_empty() && when != Judged::TooLate {
            return;
        }
        let logical = logical_key(key);
        // a soft purge or ban is kept for the whole retention (readers serve the entry stale
        // meanwhile): only a hard one is the writer's to act on
        let covered = |meta: &StoredMeta| {
            matches!(
                self.verdict(key, &logical, meta, false),
                Some((Verdict::Invalid, _))
            )
        };
        let banned = covered(meta);
        if !banned && when != Judged::TooLate {
            return;
        }
        // what the key holds now: this write, or a newer answer written since (the refetch
        // after the purge), which stays
        let mc_key = memcached_key(&self.namespace, key);
        // asked of the key's own server only: while it is ejected, a stand-in
        // (`rehash_on_eject`) would answer for a key the owner may still hold
        let owner_usable = self
            .cluster
            .owner(mc_key.as_bytes())
            .is_some_and(|owner| self.cluster.is_usable(owner));
        let looked = if written && owner_usable {
            self.cluster
                .get_multi_with(mc_key.as_bytes(), &[mc_key.as_bytes().to_vec()])
                .await
        } else {
            None
        };
        let reached = match looked.map(|values| values.into_iter().next().flatten()) {
            // the server did not answer (frozen, failing, ejected)
            None => false,
            // gone already
            Some(None) => true,
            Some(Some(value)) => {
                let replaced =
                    self.decoded_value(&value, &logical)
                        .is_some_and(|(now_there, _)| {
                            if banned {
                                !covered(&now_there)
                            } else {
                                // judged too late to trust the list: only a newer answer stays
                                now_there.validated() > meta.validated()
                            }
                        });
                if replaced {
                    true
                } else {
                    match self.cluster.delete_reporting(mc_key.as_bytes()).await.1 {
                        DeleteOutcome::Deleted => {
                            self.counters
                                .written_then_banned
                                .fetch_add(1, Ordering::Relaxed);
                            true
                        }
                        DeleteOutcome::NotFound => true,
                        DeleteOutcome::Skipped | DeleteOutcome::Failed => false,
                    }
                }
            }
        };
        // Judged in time, the purge was known everywhere for as long as the entry was there.
        // Judged late, it may not have been (and this node's copy of the list lacked it): kept
        // like one whose entry stays.
        if reached && (when == Judged::InTime || !banned) {
            return;
        }
        // The entry stays in memcached, for as long as its TTL (up to the retention): a
        // short-lived purge must not be forgotten before it, here or on any node.
        let (primary_text, primary) = primary_of(key, &logical);
        // the drain waits for the purge's publication as for this write
        let task = self.counters.background_task();
        if self.bans.keep_url_purge(primary, primary_text, Some(task)) {
            self.counters.purges_kept.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "memcached: {primary_text} was written after its purge and could not be \
                 deleted, or was judged late; the purge is kept for the whole retention"
            );
        } else if !banned {
            log::warn!(
                "memcached: {primary_text} could not be judged by the bans in time, nor deleted"
            );
        }
    }

    /// Shares a complete object this node stored outside a fill (parts combined, see
    /// `proxy/partial_content.rs`, or its head refreshed by a `304`): what the memory tier holds
    /// for `key` is written to memcached in the background, as a finished fill is.
    pub fn share(&'static self, key: CacheKey) {
        let stored = self.memory.stored_for_sharing(&key);
        self.spawn_write(key, stored, WriteOf::Share);
    }

    /// Writes `stored` (`None`: the memory tier did not keep it, so nothing will be written) to
    /// memcached under `key`, in the background; a fill's written entry ends the URL's fill
    /// lease ([`FillLeases::on_written`], which confirms it was there all along when the fill
    /// was the lease's).
    fn spawn_write(&'static self, key: CacheKey, stored: Option<SharedWriteInFlight>, of: WriteOf) {
        let Some(in_flight) = stored else {
            // a fill that admission or a ban refused, or (`share`) a copy evicted meanwhile:
            // nodes waiting for it would never see it (but another claim's lease is its own)
            if !matches!(of, WriteOf::UnderAnotherClaim) {
                self.fill_leases.on_write_failed(&key, of.leased());
            }
            return;
        };
        let task = self.counters.background_task();
        tokio::spawn(async move {
            let (meta, body) = in_flight.contents();
            let outcome = self.write_entry(&key, &meta, &body).await;
            // memcached has it now (or never will): the copy is trusted for `local_ttl` only
            drop(in_flight);
            drop(body);
            match outcome {
                WriteOutcome::Written => {
                    if let WriteOf::Fill { leased } = of {
                        self.fill_leases.on_written(&key, leased).await;
                    }
                    self.counters.writes.fetch_add(1, Ordering::Relaxed);
                    self.judge_written(&key, &meta, true).await;
                }
                WriteOutcome::Superseded => {
                    // memcached has a newer answer: waiters for this fill are served that one
                    if let WriteOf::Fill { leased } = of {
                        self.fill_leases.on_written(&key, leased).await;
                    }
                    self.counters
                        .writes_superseded
                        .fetch_add(1, Ordering::Relaxed);
                }
                WriteOutcome::Failed => {
                    self.counters.write_failures.fetch_add(1, Ordering::Relaxed);
                    // nodes waiting for this fill would never see it (but another claim's
                    // lease is its own)
                    if !matches!(of, WriteOf::UnderAnotherClaim) {
                        self.fill_leases.on_write_failed(&key, of.leased());
                    }
                    // a write its server did not answer may still land (a frozen server
                    // carries it out when it thaws)
                    self.judge_written(&key, &meta, false).await;
                }
            }
            drop(task);
        });
    }
}

/// What a write to memcached is ([`TieredStorage::spawn_write`]): a fill's, which ends the URL's
/// fill lease, or a copy shared outside a fill ([`TieredStorage::share`]), which does not.
#[derive(Debug, Clone, Copy)]
enum WriteOf {
    /// A fill's; `leased`: the claim by which this node's lease on the URL was held for it
    /// ([`FillLeases::holds`]), so the lease is confirmed when it is deleted after the write,
    /// and deleted only if it is still that claim's.
    Fill {
        leased: Option<Claim>,
    },
    /// A fill fetched under another claim's lease and kept because that lease still stood when
    /// it ended ([`FetchedUnderAnotherClaim::KeptWhileHeldBy`]): the lease is that claim's, and
    /// neither the write nor its failure touches it. (Deleted after the write, as a fill with no
    /// claim deletes whatever lease is there, it cost that claim its fill: its next renewal found
    /// the lease gone, its fill was taken for lost and refused, and its node, marking the URL
    /// purged as of then, refused this entry and fetched once more; found 2026-12-07 by a
    /// breaker helper, `tests/kept_while_held_breaks.rs`.) The nodes waiting for that claim's
    /// fill find this entry as they look for it.
    UnderAnotherClaim,
    Share,
}

impl WriteOf {
    /// The claim of the lease the write was a fill of, if any.
    fn leased(self) -> Option<Claim> {
        match self {
            WriteOf::Fill { leased } => leased,
            WriteOf::UnderAnotherClaim | WriteOf::Share => None,
        }
    }
}

/// The primary key's text (the logical key's part before a variant's `#`) and hash of `key`,
/// whose logical key is `logical`: what bans name an entry by.
fn primary_of<'a>(key: &CacheKey, logical: &'a str) -> (&'a str, u128) {
    let text = logical.split('#').next().unwrap_or(logical);
    (text, u128::from_be_bytes(key.primary_bin()))
}

/// The tiered store as seen by a request whose primary key the hit fast path has just looked up
/// in memcached and not found: the primary lookup reads the memory tier only (which may have
/// been filled since), so a miss costs one memcached round trip, not two; memcached is read
/// again only for a copy this node stored within the last [`JUST_STORED`] and no longer trusts
/// (a fill the request waited for on the cache lock, already written). Everything else,
/// including variant lookups, fills and purges, is the tiered store's.
pub struct PrimaryKnownMissing {
    tier: &'static TieredStorage,
}

/// How recently a copy must have been stored for a request that found memcached empty to read
/// memcached again ([`PrimaryKnownMissing`]): a waiter on the cache lock wakes as the fill it
/// waited for lands, well within this even on a loaded machine.
const JUST_STORED: Duration = Duration::from_secs(1);

impl PrimaryKnownMissing {
    /// A view of `tier`; one per process is enough, as it holds no per-request state.
    pub fn new(tier: &'static TieredStorage) -> Self {
        PrimaryKnownMissing { tier }
    }
}

#[async_trait]
impl Storage for PrimaryKnownMissing {
    async fn lookup(
        &'static self,
        key: &CacheKey,
        trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        if key.variance().is_none() {
            if let Some(hit) = self.tier.memory.lookup(key, trace).await? {
                return Ok(Some(hit));
            }
            // Stored here just now and already untrusted (`local_ttl`): the fill this request
            // waited for on the cache lock, whose write to memcached landed before it woke.
            // Memcached has it now. (Not for an older copy, nor from a failing server: then
            // memcached is as the fast path found it.)
            if !self.tier.memory.stored_within(key, JUST_STORED)
                || self.tier.fill_leases.server_failing(key)
            {
                return Ok(None);
            }
            self.tier.lookup(key, trace).await
        } else {
            self.tier.lookup(key, trace).await
        }
    }

    async fn lookup_streaming_write(
        &'static self,
        key: &CacheKey,
        streaming_write_tag: Option<&[u8]>,
        trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        self.tier
            .lookup_streaming_write(key, streaming_write_tag, trace)
            .await
    }

    async fn get_miss_handler(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        trace: &SpanHandle,
    ) -> Result<MissHandler> {
        self.tier.get_miss_handler(key, meta, trace).await
    }

    async fn purge(
        &'static self,
        target: PurgeTarget<'_>,
        purge_type: PurgeType,
        trace: &SpanHandle,
    ) -> Result<PurgeOutcome> {
        self.tier.purge(target, purge_type, trace).await
    }

    async fn update_meta(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        trace: &SpanHandle,
    ) -> Result<bool> {
        self.tier.update_meta(key, meta, trace).await
    }

    fn support_streaming_partial_write(&self) -> bool {
        self.tier.support_streaming_partial_write()
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync + 'static) {
        self
    }
}

/// A fill that, once complete in memory, is also written to memcached.
struct TieredMiss {
    inner: Box<MemoryMiss>,
    key: CacheKey,
    tier: &'static TieredStorage,
    /// Fetched while another claim held the URL's lease ([`FetchedUnderAnotherClaim`]): refused
    /// when it finishes, or unless that claim's lease still stands then.
    under_another_claim: Option<FetchedUnderAnotherClaim>,
    /// Such a fill is listed until it finishes, so that later requests join it only while that
    /// lease stands ([`GuardedFills`]).
    _listed: Option<GuardedFill>,
}

#[async_trait]
impl HandleMiss for TieredMiss {
    async fn write_body(&mut self, data: Bytes, eof: bool) -> Result<()> {
        self.inner.write_body(data, eof).await
    }

    async fn finish(self: Box<Self>) -> Result<MissFinishType> {
        let TieredMiss {
            inner,
            key,
            tier,
            under_another_claim,
            _listed,
        } = *self;
        let refused = match under_another_claim {
            None => false,
            Some(FetchedUnderAnotherClaim::Refused(_)) => true,
            Some(FetchedUnderAnotherClaim::KeptWhileHeldBy(holder)) => {
                !tier.fill_leases.still_held_by(&key, holder).await
            }
        };
        if refused {
            // its readers have it; nothing is stored, nothing written, and the lease is the
            // other claim's to end
            inner.refuse();
            tier.fill_leases.on_fill_under_another_claim(&key);
            return Ok((*inner).finish_fill()?.0);
        }
        // what this fill stored is written, not what the key holds by then (a fill a ban refused
        // leaves an older copy there)
        // whether the fill was this node's lease's, asked before the request ends (and with it
        // the lease's mark here), which may be before the write lands
        let leased = tier.fill_leases.holds(&key);
        if tier.fill_leases.unguarded(&key) {
            // went to the origin unguarded: not stored (so `stored` is `None`, and the lease, if
            // it landed, is released by `on_write_failed`)
            inner.refuse();
            tier.fill_leases.on_unguarded_fill(&key);
        }
        let (finished, stored) = (*inner).finish_fill()?;
        let of = match (under_another_claim, leased) {
            // kept while another claim's lease stood: that lease is left to its claim
            (Some(FetchedUnderAnotherClaim::KeptWhileHeldBy(_)), None) => {
                WriteOf::UnderAnotherClaim
            }
            _ => WriteOf::Fill { leased },
        };
        tier.spawn_write(key, stored, of);
        Ok(finished)
    }

    fn streaming_write_tag(&self) -> Option<&[u8]> {
        self.inner.streaming_write_tag()
    }
}

#[async_trait]
impl Storage for TieredStorage {
    async fn lookup(
        &'static self,
        key: &CacheKey,
        trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        // (a fill in flight fetched under another claim's lease is joined only while it stands)
        self.guarded_fills
            .before_joining(key, &self.fill_leases)
            .await;
        if let Some(hit) = self.memory.lookup(key, trace).await? {
            return Ok(Some(hit));
        }
        let Some((meta, body)) = self.read_and_promote(key).await else {
            return Ok(None);
        };
        Ok(Some(MemoryTier::detached_hit(&meta, body)))
    }

    async fn lookup_streaming_write(
        &'static self,
        key: &CacheKey,
        streaming_write_tag: Option<&[u8]>,
        trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        self.memory
            .lookup_streaming_write(key, streaming_write_tag, trace)
            .await
    }

    async fn get_miss_handler(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        _trace: &SpanHandle,
    ) -> Result<MissHandler> {
        let inner = self.memory.start_fill(key, meta);
        let under_another_claim = meta.extensions().get::<FetchedUnderAnotherClaim>().copied();
        let listed = under_another_claim
            .map(|mark| self.guarded_fills.list(key, mark, inner.let_go_handle()));
        Ok(Box::new(TieredMiss {
            inner,
            key: key.clone(),
            tier: self,
            under_another_claim,
            _listed: listed,
        }))
    }

    async fn purge(
        &'static self,
        target: PurgeTarget<'_>,
        purge_type: PurgeType,
        trace: &SpanHandle,
    ) -> Result<PurgeOutcome> {
        let local = self.memory.purge(target, purge_type, trace).await?;
        let compact: &CompactCacheKey = target.key();
        let mc_key = memcached_key(&self.namespace, compact);
        let shared = self.cluster.delete(mc_key.as_bytes()).await;
        Ok(match local {
            PurgeOutcome::NotFound if shared => PurgeOutcome::Purged(None),
            other => other,
        })
    }

    async fn update_meta(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        trace: &SpanHandle,
    ) -> Result<bool> {
        let updated = self.memory.update_meta(key, meta, trace).await?;
        if updated {
            self.share(key.clone());
        }
        Ok(updated)
    }

    fn support_streaming_partial_write(&self) -> bool {
        self.memory.support_streaming_partial_write()
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync + 'static) {
        self
    }
}

/// The part of `[cache.memcached]` the transport reads, in the transport crate's own terms
/// (`lacquer-memcached` knows nothing of Lacquer's configuration).
fn cluster_config(config: &MemcachedConfig) -> ClusterConfig {
    ClusterConfig {
        servers: config
            .servers
            .iter()
            .map(|s| ClusterServer {
                name: s.name.clone(),
                addr: s.addr,
                weight: s.weight,
            })
            .collect(),
        pool_size: config.pool_size,
        connect_timeout: config.connect_timeout,
        op_timeout: config.op_timeout,
        failure_limit: config.failure_limit,
        retry_after: config.retry_after,
        rehash_on_eject: config.rehash_on_eject,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memcached_key_is_the_namespace_and_pingoras_combined_hash_in_hex() {
        for url in ["/", "/page/1", "/a?b=c"] {
            let mut key = crate::proxy::cache_key::of_url("example.com", url);
            assert_eq!(memcached_key("lq", &key), format!("lq:{}", key.combined()));
            key.set_variance_key([7; 16]);
            assert_eq!(
                memcached_key("other", &key),
                format!("other:{}", key.combined())
            );
        }
    }
}
