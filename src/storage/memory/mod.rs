//! The memory tier: a byte-bounded in-process cache on TinyUFO (S3-FIFO eviction, TinyLFU admission).
//!
//! This file owns [`MemoryTier`]: the tier as a Pingora [`Storage`], how long this node trusts what
//! it holds (near-cache mode, `local_ttl`), and its [`MemoryStats`]. It is built from:
//! * `index.rs`: the byte-bounded object index over TinyUFO (charges, eviction, collision check);
//! * `variants.rs`: primary key -> variant keys, so purging a URL purges every variant;
//! * `scopes.rs`: host -> keys and tag -> keys, so a ban finds what it covers here;
//! * `fill.rs`: in-flight fills, their writer and the readers that stream them;
//! * `mapped.rs`: large bodies in memory mappings of their own, unmapped when evicted;
//! * `hit.rs`: the hit handlers, and [`CompleteObject`] for the proxy's hit fast path.
//!
//! It also holds this node's partial objects ([`crate::storage::partial`]), each under a key of
//! its own derived from its URL's primary key ([`MemoryTier::partial_object`]): charged, evicted
//! and purged with everything else, never found by a complete-object lookup, never written to
//! the shared tier.
//!
//! # Why it looks like this
//! * **Hard byte bound.** Every object is charged its body, its header bytes (as a header map
//!   and as the wire form fast hits keep) and a fixed overhead; the sum of charges never exceeds
//!   `memory_size`. [`MemoryTier::stats`] reports the
//!   exact bytes held.
//! * **Decoded metadata.** Objects keep [`StoredMeta`], not serialized `CacheMeta`.
//! * **Streaming fills.** A miss writes into an in-flight entry; concurrent lookups of the same key
//!   stream the body as it arrives (`support_streaming_partial_write`). A reader never sees a
//!   truncated body as complete: if the writer is dropped before `finish`, readers get an error.
//! * **Collision safety.** The full 128-bit combined key is kept with each object and checked on
//!   lookup, since TinyUFO indexes by a 64-bit hash of it.
//! * **Invalidation applied on arrival.** With a [`BanList`], a purge or ban is applied to the
//!   objects it covers when it arrives ([`MemoryTier::invalidate`]), and an object about to be
//!   stored is judged by the bans known then (a fill that started before a ban may end after
//!   it), so a hit never consults the ban list: the hit path costs what it did.

mod fill;
mod hit;
mod index;
mod mapped;
mod scopes;
mod variants;

pub use hit::{owner_holds_back_origin, tier_of, whole_body_within, CompleteObject};

use super::object::{Body, StoredMeta};
use super::partial::PartialObject;
use crate::storage::ban_list::scope::{EntryScopes, Scope};
use crate::storage::ban_list::{BanList, Verdict};
use async_trait::async_trait;
use fill::InFlightFills;
pub use fill::{FillLetGo, MemoryMiss};
use hit::{complete_hit, streaming_hit};
use index::{MemoryObject, ObjectIndex};
pub(crate) use mapped::owned_body;
pub use mapped::{memory_files, BodyFile};
use pingora_cache::eviction::CacheEntryKey;
use pingora_cache::key::{CacheHashKey, CompactCacheKey};
use pingora_cache::storage::{
    streaming_write::U64WriteId, HitHandler, MissHandler, PurgeOutcome, PurgeTarget, PurgeType,
    Storage,
};
use pingora_cache::trace::SpanHandle;
use pingora_cache::{CacheKey, CacheMeta};
use pingora_error::Result;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Counters describing what the memory tier holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes charged for all objects currently held (body + headers + overhead).
    pub bytes: usize,
    /// Objects currently held.
    pub objects: usize,
    /// The configured bound on `bytes`.
    pub limit: usize,
    /// Objects evicted (or rejected by admission) to stay within `limit`.
    pub evictions: u64,
    /// Fills currently being written.
    pub in_flight: usize,
    /// Large bodies held in memory files now, sent to clients with `sendfile` (`mapped`): the
    /// tier's, and those of objects evicted or purged while a client is still being sent them.
    /// Each is an open descriptor, at most a quarter of the open-file limit. The process's count
    /// (the files are one budget), not this tier's alone.
    pub files: usize,
}

/// What a purge or ban did to this node's memory tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Touched {
    /// Objects stored under their URL (a response without `Vary`, or the variant in the URL's
    /// primary slot) removed, or marked stale by a soft one.
    pub objects: usize,
    /// Other variants of a URL removed or marked stale.
    pub variants: usize,
    /// A fill of the URL in flight was let go of (a hard purge of a URL): nothing stored, but
    /// an answer was on its way to being stored, so the purge's time stamp matters to the
    /// refill after it (`invalidation`'s wait past the stamp).
    pub fill_let_go: bool,
}

impl Touched {
    /// Nothing stored was removed or marked stale (a fill let go of is not stored).
    pub fn removed_nothing(&self) -> bool {
        self.objects == 0 && self.variants == 0
    }
}

/// The in-process memory tier. See the module docs for its guarantees.
pub struct MemoryTier {
    index: ObjectIndex,
    fills: InFlightFills,
    /// Near-cache mode: how long an object is trusted locally (None: until evicted or stale).
    /// Zero means shared-tier hits are not promoted at all.
    local_ttl: Option<Duration>,
    /// The purges and bans objects are judged by when stored (None: no invalidation beyond
    /// `Storage::purge`, as in the unit tests).
    bans: Option<&'static BanList>,
}

/// Where an object being stored comes from, for the bans that judge it
/// ([`BanList::judge_fetched`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Fetched from the origin by this node (a fill, a part, an assembled representation).
    Fetched,
    /// Read from the shared tier.
    Promoted,
}

/// Why [`MemoryTier::complete_object`] has no object to give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCompleteObject {
    /// A fill of it is in flight (a lookup of the standard path streams it).
    Filling,
    /// Nothing is stored under the key, or nothing this node still trusts.
    Absent,
}

/// An object this node has just filled, trusted here while its write to the shared tier is
/// on its way; dropped when the write has landed or failed. (The trust is set when the fill is
/// indexed, before its in-flight entry goes, so no lookup sees a gap; the write task holds
/// this guard, and ends it.)
///
/// Until the write lands, the shared tier holds an older answer, a banned one or none, and
/// this copy is the newest there is: with a short `local_ttl` (zero: the copy is never trusted
/// otherwise) the requests that waited on the cache lock for this fill, and those arriving
/// meanwhile, would find nothing here, read the shared tier's older answer or nothing, and ask
/// the origin again, one after another. A purge or ban of the URL on this node still takes
/// the copy out at once; once the write has landed, the shared tier has this answer and the
/// copy is trusted for `local_ttl` from when it was stored, as before.
///
/// Counted, not flagged: a fill's write and a `share()` of the same object (its head refreshed by
/// a `304`) may be in flight together, and the copy stays trusted until both have ended.
pub struct SharedWriteInFlight(Arc<MemoryObject>);

impl SharedWriteInFlight {
    /// Trusts `object` until the returned guard is dropped.
    fn start(object: Arc<MemoryObject>) -> SharedWriteInFlight {
        object
            .shared_writes_in_flight
            .fetch_add(1, Ordering::AcqRel);
        SharedWriteInFlight(object)
    }

    /// The metadata and body to write.
    pub fn contents(&self) -> (Arc<StoredMeta>, Body) {
        (self.0.meta.read().clone(), self.0.body.clone())
    }
}

impl Drop for SharedWriteInFlight {
    fn drop(&mut self) {
        self.0
            .shared_writes_in_flight
            .fetch_sub(1, Ordering::AcqRel);
    }
}

fn key_of(hash: [u8; 16]) -> u128 {
    u128::from_be_bytes(hash)
}

/// Flipped in a URL's primary key to make the key of its partial object ("PARTIAL" in ASCII in
/// the high bytes): a key no complete-object lookup computes, since those are the primary key or
/// a hash of it with a variance.
const PARTIAL_KEY_FLIP: u128 = 0x5041_5254_4941_4c00_0000_0000_0000_0001;

fn partial_key(primary: [u8; 16]) -> u128 {
    key_of(primary) ^ PARTIAL_KEY_FLIP
}

impl MemoryTier {
    /// Creates a tier holding at most `limit` bytes, admitting objects whose body is at most
    /// `max_object_size` bytes; `estimated_objects` sizes the admission sketch.
    pub fn new(limit: usize, max_object_size: usize, estimated_objects: usize) -> Self {
        MemoryTier {
            index: ObjectIndex::new(limit, max_object_size, estimated_objects),
            fills: InFlightFills::default(),
            local_ttl: None,
            bans: None,
        }
    }

    /// Judges objects by `bans` when they are stored, and indexes them by host and tags so
    /// that [`MemoryTier::invalidate`] finds what a ban covers.
    pub fn set_ban_list(&mut self, bans: &'static BanList) {
        self.bans = Some(bans);
    }

    /// A leaked, `'static` tier as Pingora's cache API requires.
    pub fn leak(self) -> &'static MemoryTier {
        Box::leak(Box::new(self))
    }

    /// What the tier holds now.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            bytes: self.index.bytes(),
            objects: self.index.objects(),
            limit: self.index.limit(),
            evictions: self.index.evictions(),
            in_flight: self.fills.count(),
            files: mapped::memory_files(),
        }
    }

    /// The complete object stored under `key` for the proxy's hit fast path, if there is one and
    /// no fill of it is in flight; else which of the two it is. Freshness and variance are the
    /// caller's to judge.
    pub fn complete_object(&self, key: [u8; 16]) -> Result<CompleteObject, NoCompleteObject> {
        let key = key_of(key);
        if self.fills.is_filling(key) {
            return Err(NoCompleteObject::Filling);
        }
        self.trusted_object(key)
            .map(CompleteObject::new)
            .ok_or(NoCompleteObject::Absent)
    }

    /// The partial object stored for the URL whose primary key hash is `primary`, unless this node
    /// no longer trusts it (near-cache mode). Freshness is the caller's to judge.
    pub fn partial_object(&self, primary: [u8; 16]) -> Option<PartialObject> {
        let object = self.trusted_object(partial_key(primary))?;
        let meta = object.meta.read().clone();
        PartialObject::new(meta, object.body.clone())
    }

    /// Stores the partial object of the URL whose cache key is `key`, replacing the one it had;
    /// returns whether it was admitted. Purges and bans reach it as they reach the URL's complete
    /// object (by the URL, its host and the tags in its head); a purge of the URL removes it with
    /// the URL's variants.
    pub fn store_partial(&self, key: &CacheKey, meta: StoredMeta, body: Body) -> bool {
        let primary = key.primary_bin();
        let scopes = self.scopes_of(key, &meta.header);
        self.insert(
            partial_key(primary),
            key_of(primary),
            Arc::new(meta),
            body,
            scopes,
            Source::Fetched,
        )
        .is_some()
    }

    /// Stores a complete object assembled outside a fill (parts of a representation combined,
    /// see [`crate::storage::partial`]) under `key`, as a fill would store it; returns whether
    /// it was admitted.
    pub fn store_complete(&self, key: &CacheKey, meta: StoredMeta, body: Body) -> bool {
        let scopes = self.scopes_of(key, &meta.header);
        self.insert(
            key_of(key.combined_bin()),
            key_of(key.primary_bin()),
            Arc::new(meta),
            body,
            scopes,
            Source::Fetched,
        )
        .is_some()
    }

    /// Removes the partial object of the URL whose primary key hash is `primary` (a complete
    /// object supersedes it); returns whether there was one.
    pub fn remove_partial(&self, primary: [u8; 16]) -> bool {
        self.index.remove(partial_key(primary))
    }

    /// Makes this tier a near cache in front of a shared tier: every object is trusted for at most
    /// `ttl` after it was stored here (or, for this node's own fill, until its write to the shared
    /// tier has ended, if that is later: [`SharedWriteInFlight`]), then looked up in the shared
    /// tier again. This bounds how long a purge made through another node can go unseen here
    /// when the invalidation log does not bring it sooner. A `ttl` of zero keeps no copy
    /// of shared-tier hits (see [`Self::promote`]).
    pub fn set_local_ttl(&mut self, ttl: Duration) {
        self.local_ttl = Some(ttl);
    }

    /// Stores a complete object obtained elsewhere (a shared-tier hit) under `key`, trusted for
    /// `local_ttl`; returns whether it was stored. With a `local_ttl` of zero nothing is: the copy
    /// would never be trusted, so storing it would only evict objects that are.
    pub fn promote(&self, key: &CacheKey, meta: &StoredMeta, body: &Body) -> bool {
        if !self.promotes() {
            return false;
        }
        let scopes = self.scopes_of(key, &meta.header);
        self.promote_with(key, meta, body, scopes)
    }

    /// [`MemoryTier::promote`] for a caller that has already computed the entry's scopes.
    pub fn promote_with(
        &self,
        key: &CacheKey,
        meta: &StoredMeta,
        body: &Body,
        scopes: Option<Box<EntryScopes>>,
    ) -> bool {
        if !self.promotes() {
            return false;
        }
        self.insert(
            key_of(key.combined_bin()),
            key_of(key.primary_bin()),
            Arc::new(meta.clone()),
            body.clone(),
            scopes,
            Source::Promoted,
        )
        .is_some()
    }

    /// Whether this tier is a near cache in front of a shared tier (`local_ttl` set).
    pub fn is_near_cache(&self) -> bool {
        self.local_ttl.is_some()
    }

    /// `cache.max_object_size`: the largest body this node caches, read from memcached too.
    pub fn max_object_size(&self) -> usize {
        self.index.max_object_size()
    }

    /// Whether shared-tier hits are kept here at all (not with a `local_ttl` of zero).
    pub fn promotes(&self) -> bool {
        !self.local_ttl.is_some_and(|ttl| ttl.is_zero())
    }

    /// What purges and bans can name an object stored under `key` with `header` by; `None`
    /// without a ban list.
    pub fn scopes_of(
        &self,
        key: &CacheKey,
        header: &pingora_http::ResponseHeader,
    ) -> Option<Box<EntryScopes>> {
        let bans = self.bans?;
        let text = String::from_utf8_lossy(key.primary_key());
        let primary = key_of(key.primary_bin());
        Some(Box::new(bans.scopes_of(&text, primary, header)))
    }

    /// Applies a purge or ban that arrived (from this node or another): every object under
    /// `scope` validated before `before` (see [`StoredMeta::validated`]) is removed, or with `soft`
    /// marked stale from `before` on (so grace, `stale-while-revalidate` and revalidation still
    /// serve it), and a hard purge of a URL lets go of the fills of it in flight (nothing of them
    /// is stored or joined; the readers they have get the rest). Objects fetched or revalidated
    /// since are left alone.
    pub fn invalidate(&self, scope: &Scope, before: SystemTime, soft: bool) -> Touched {
        let keys = match scope {
            Scope::Url(primary) => {
                let mut keys = vec![*primary];
                keys.extend(self.index.variants_of(*primary));
                keys
            }
            Scope::Tag(tag) => self.index.tagged(*tag),
            Scope::Host(host)
            | Scope::Prefix {
                host: Some(host), ..
            } => self.index.of_host(*host),
            Scope::Prefix { host: None, .. } => self.index.all_keys(),
        };
        let mut touched = Touched::default();
        for key in keys {
            let Some(object) = self.index.get(key) else {
                continue;
            };
            let covered = match (&object.scopes, scope) {
                (_, Scope::Url(primary)) => object.primary == *primary,
                (Some(scopes), _) => scope.covers(scopes),
                (None, _) => false,
            };
            if !covered || object.meta.read().validated() >= before {
                continue;
            }
            let done = if soft {
                soften(&object, before);
                true
            } else {
                self.index.remove_exact(&object)
            };
            if done && object.key == object.primary {
                touched.objects += 1;
            } else if done {
                touched.variants += 1;
            }
        }
        if let (Scope::Url(primary), false) = (scope, soft) {
            touched.fill_let_go = self.fills.disown(*primary);
        }
        touched
    }

    /// What is stored under `key`, for writing it to a shared tier, trusted while that write is
    /// on its way ([`SharedWriteInFlight`]).
    pub fn stored_for_sharing(&self, key: &CacheKey) -> Option<SharedWriteInFlight> {
        // not `trusted_object`: the writer wants what was just stored, even when this node's own
        // trust in it has already run out (a `local_ttl` of zero)
        let object = self.index.get(key_of(key.combined_bin()))?;
        Some(SharedWriteInFlight::start(object))
    }

    /// Starts a fill of `key` whose stored object the caller will write to a shared tier
    /// ([`MemoryMiss::finish_fill`]); the memory tier's own miss handler, as a type.
    pub fn start_fill(&'static self, key: &CacheKey, meta: &CacheMeta) -> Box<MemoryMiss> {
        Box::new(MemoryMiss::start(self, key, meta))
    }

    /// Whether an object was stored under `key` (a fill, or a shared-tier hit promoted) less
    /// than `within` ago, trusted here or not. Only in near-cache mode, where that is known.
    pub fn stored_within(&self, key: &CacheKey, within: Duration) -> bool {
        let (Some(ttl), Some(object)) =
            (self.local_ttl, self.index.get(key_of(key.combined_bin())))
        else {
            return false;
        };
        // trusted from when it was stored for `local_ttl`
        object
            .local_until
            .is_some_and(|until| until + within > Instant::now() + ttl)
    }

    /// A fill has just been indexed as `object`, and the tiered store will write it to the
    /// shared tier: it is trusted until that write ends ([`SharedWriteInFlight`]), from now on,
    /// before the fill's in-flight entry (which lookups find until then) is dropped. Only in
    /// near-cache mode, the only one with a shared tier.
    fn awaits_shared_write(&self, object: Arc<MemoryObject>) -> Option<SharedWriteInFlight> {
        self.local_ttl?;
        Some(SharedWriteInFlight::start(object))
    }

    /// A hit handler over a body that is not (or not yet) stored here.
    pub fn detached_hit(meta: &StoredMeta, body: Body) -> (CacheMeta, HitHandler) {
        let object = CompleteObject::detached(meta.clone(), body);
        (meta.to_meta(), object.into_hit_handler())
    }

    /// The object under `key`, unless this node no longer trusts its copy (near-cache mode).
    fn trusted_object(&self, key: u128) -> Option<Arc<MemoryObject>> {
        let object = self.index.get(key)?;
        match object.local_until {
            Some(until)
                if Instant::now() >= until
                    && object.shared_writes_in_flight.load(Ordering::Acquire) == 0 =>
            {
                None
            }
            _ => Some(object),
        }
    }

    /// Inserts a complete object, trusted for `local_ttl` from now; returns it if it was
    /// admitted. With a ban list, the object is judged first: one a purge or ban covers is not
    /// stored (a soft one stores it stale), and one a ban covers that arrived while it was
    /// being stored is taken out again.
    fn insert(
        &self,
        key: u128,
        primary: u128,
        meta: Arc<StoredMeta>,
        body: Body,
        scopes: Option<Box<EntryScopes>>,
        from: Source,
    ) -> Option<Arc<MemoryObject>> {
        let judge = |bans: &BanList, entry: &EntryScopes, validated| match from {
            Source::Fetched => bans.judge_fetched(entry, validated),
            Source::Promoted => bans.judge(entry, validated),
        };
        let local_until = self.local_ttl.map(|ttl| Instant::now() + ttl);
        let (Some(bans), Some(entry)) = (self.bans, scopes.as_deref()) else {
            return self
                .index
                .insert(key, primary, meta, body, local_until, scopes);
        };
        let generation = bans.generation();
        let meta = match judge(bans, entry, meta.validated()) {
            Verdict::Valid => meta,
            Verdict::StaleSince(since) => stale_since(&meta, since),
            Verdict::Invalid => return None,
        };
        let object = self
            .index
            .insert(key, primary, meta, body, local_until, scopes)?;
        if bans.generation() != generation {
            // a ban came in while it was stored: judged again, by the bans it may have missed
            match object
                .scopes
                .as_deref()
                .map(|s| judge(bans, s, object.meta.read().validated()))
            {
                Some(Verdict::Invalid) => {
                    self.index.remove_exact(&object);
                    return None;
                }
                Some(Verdict::StaleSince(since)) => soften(&object, since),
                _ => {}
            }
        }
        Some(object)
    }

    fn lookup_key(&'static self, key: u128) -> Option<(CacheMeta, HitHandler)> {
        // prefer an in-flight fill, so a refreshed object is visible while it is being written
        // (unless a ban issued since its request covers it)
        if let Some((meta, body)) = self.fills.joinable(key, self.bans) {
            return Some(streaming_hit(&meta, body, false));
        }
        let object = self.trusted_object(key)?;
        let meta = object.meta.read().to_meta();
        Some((meta, complete_hit(object)))
    }

    fn purge_key(&self, target: &CompactCacheKey) -> bool {
        let key = key_of(target.combined_bin());
        let removed_fill = self.fills.disown(key);
        // purging a URL (no variance given) purges all its variants too
        let removed = if target.variance.is_none() {
            self.index.remove_with_variants(key)
        } else {
            self.index.remove(key)
        };
        removed || removed_fill
    }
}

/// `meta` marked stale from `since` on ([`StoredMeta::stale_from`]; the ban's stamp is rounded
/// up to the millisecond, see `ms_after`).
fn stale_since(meta: &Arc<StoredMeta>, since: SystemTime) -> Arc<StoredMeta> {
    let Some(until) = meta.stale_from(since) else {
        return meta.clone();
    };
    let mut stale = (**meta).clone();
    stale.fresh_until = until;
    Arc::new(stale)
}

/// Marks a stored object stale from `since` on.
fn soften(object: &MemoryObject, since: SystemTime) {
    let mut meta = object.meta.write();
    *meta = stale_since(&meta, since);
}

#[async_trait]
impl Storage for MemoryTier {
    async fn lookup(
        &'static self,
        key: &CacheKey,
        _trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        Ok(self.lookup_key(key_of(key.combined_bin())))
    }

    async fn lookup_streaming_write(
        &'static self,
        key: &CacheKey,
        streaming_write_tag: Option<&[u8]>,
        _trace: &SpanHandle,
    ) -> Result<Option<(CacheMeta, HitHandler)>> {
        let key = key_of(key.combined_bin());
        let write_id = streaming_write_tag
            .and_then(|tag| U64WriteId::try_from(tag).ok())
            .map(u64::from);
        match write_id.and_then(|id| self.fills.get(key, id)) {
            Some((meta, body)) => Ok(Some(streaming_hit(&meta, body, true))),
            None => Ok(self.lookup_key(key)),
        }
    }

    async fn get_miss_handler(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        _trace: &SpanHandle,
    ) -> Result<MissHandler> {
        Ok(self.start_fill(key, meta))
    }

    async fn purge(
        &'static self,
        target: PurgeTarget<'_>,
        _purge_type: PurgeType,
        _trace: &SpanHandle,
    ) -> Result<PurgeOutcome> {
        if matches!(target, PurgeTarget::Exact(CacheEntryKey::Identified { .. })) {
            return Ok(PurgeOutcome::NotFound);
        }
        if self.purge_key(target.key()) {
            Ok(PurgeOutcome::Purged(None))
        } else {
            Ok(PurgeOutcome::NotFound)
        }
    }

    async fn expire(
        &'static self,
        target: PurgeTarget<'_>,
        _trace: &SpanHandle,
    ) -> Result<PurgeOutcome> {
        if matches!(target, PurgeTarget::Exact(CacheEntryKey::Identified { .. })) {
            return Ok(PurgeOutcome::NotFound);
        }
        let key = key_of(target.key().combined_bin());
        let Some(object) = self.trusted_object(key) else {
            return Ok(PurgeOutcome::NotFound);
        };
        let mut guard = object.meta.write();
        let mut meta = (**guard).clone();
        meta.fresh_until = SystemTime::now()
            .checked_sub(Duration::from_secs(1))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        *guard = Arc::new(meta);
        Ok(PurgeOutcome::Expired)
    }

    async fn update_meta(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        _trace: &SpanHandle,
    ) -> Result<bool> {
        match self.trusted_object(key_of(key.combined_bin())) {
            Some(object) => {
                let mut updated = Arc::new(StoredMeta::from_meta(meta));
                let scopes = self.scopes_of(key, &updated.header);
                // a purge or ban issued after the revalidation was sent covers its 304 too: a
                // soft one keeps the entry stale (it was softened meanwhile, and the 304 would
                // have made it fresh again), a hard one took it out. Judged by when the request
                // was sent, but the entry keeps its `created`: moved to the revalidation's time,
                // it would retire the URL's other variants (`variant_is_current`)
                if let (Some(bans), Some(scopes)) = (self.bans, scopes.as_deref()) {
                    let validated = fill::request_sent(meta)
                        .map_or(updated.validated(), |sent| sent.min(updated.validated()));
                    match bans.judge_fetched(scopes, validated) {
                        Verdict::Valid => {}
                        Verdict::StaleSince(since) => updated = stale_since(&updated, since),
                        Verdict::Invalid => {
                            self.index.remove_exact(&object);
                            return Ok(false);
                        }
                    }
                }
                if scopes.as_ref().map(|s| &s.tags) != object.scopes.as_ref().map(|s| &s.tags) {
                    // the origin's 304 changed the tags: stored again, so the index follows
                    let body = object.body.clone();
                    let stored = self
                        .index
                        .insert(
                            object.key,
                            object.primary,
                            updated,
                            body,
                            object.local_until,
                            scopes,
                        )
                        .is_some();
                    return Ok(stored);
                }
                *object.meta.write() = updated;
                Ok(true)
            }
            // evicted meanwhile: nothing to update, the next request refetches
            None => Ok(false),
        }
    }

    fn support_streaming_partial_write(&self) -> bool {
        true
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync + 'static) {
        self
    }
}

/// Helpers the tests of every part of the tier share: they drive it through Pingora's API.
#[cfg(test)]
mod test_support {
    use super::MemoryTier;
    use bytes::Bytes;
    use pingora_cache::storage::{HitHandler, Storage};
    use pingora_cache::trace::Span;
    use pingora_cache::{CacheKey, CacheMeta};
    use pingora_http::ResponseHeader;
    use std::time::{Duration, SystemTime};

    /// Metadata of a response fresh for a minute.
    pub fn meta() -> CacheMeta {
        let header = ResponseHeader::build(200, None).unwrap();
        let now = SystemTime::now();
        CacheMeta::new(now + Duration::from_secs(60), now, 0, 0, header)
    }

    /// Fills `key` with `body` through a miss handler, in 4 KiB writes.
    pub async fn fill(tier: &'static MemoryTier, key: &CacheKey, body: &[u8]) {
        let span = Span::inactive().handle();
        let mut miss = tier.get_miss_handler(key, &meta(), &span).await.unwrap();
        for chunk in body.chunks(4096) {
            miss.write_body(Bytes::copy_from_slice(chunk), false)
                .await
                .unwrap();
        }
        miss.finish().await.unwrap();
    }

    /// Reads a hit's whole body.
    pub async fn read_all(hit: &mut HitHandler) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(b) = hit.read_body().await.unwrap() {
            out.extend_from_slice(&b);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{fill, read_all};
    use super::*;
    use pingora_cache::trace::Span;
    use pingora_http::ResponseHeader;

    #[tokio::test]
    async fn write_then_read_and_purge() {
        let tier = MemoryTier::new(4 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/a", "");
        assert!(tier.lookup(&key, &span).await.unwrap().is_none());
        let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        fill(tier, &key, &body).await;
        let (_, mut hit) = tier.lookup(&key, &span).await.unwrap().unwrap();
        assert_eq!(read_all(&mut hit).await, body);
        assert_eq!(tier.stats().objects, 1);
        let outcome = tier
            .purge(
                PurgeTarget::Active(&key.to_compact()),
                PurgeType::Invalidation,
                &span,
            )
            .await
            .unwrap();
        assert_eq!(outcome, PurgeOutcome::Purged(None));
        assert!(tier.lookup(&key, &span).await.unwrap().is_none());
        assert_eq!(tier.stats().bytes, 0);
    }

    #[tokio::test]
    async fn a_soft_purge_makes_the_object_stale_at_once_though_its_stamp_is_rounded_up() {
        let tier = MemoryTier::new(4 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/soft", "");
        fill(tier, &key, b"body").await;
        // a ban's stamp is the purge's instant rounded up to the millisecond: up to 1 ms ahead
        let stamp = SystemTime::now() + Duration::from_millis(1);
        let touched = tier.invalidate(&Scope::Url(key_of(key.primary_bin())), stamp, true);
        assert_eq!(touched.objects, 1);
        let (meta, _) = tier.lookup(&key, &span).await.unwrap().unwrap();
        assert!(
            meta.fresh_until() <= SystemTime::now(),
            "still fresh after a soft purge"
        );
    }

    #[tokio::test]
    async fn a_partial_object_is_never_a_complete_one_and_goes_with_a_purge() {
        let tier = MemoryTier::new(4 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/partial", "");
        let primary = key.primary_bin();
        let mut head = ResponseHeader::build(206, None).unwrap();
        head.insert_header("content-range", "bytes 0-4/10").unwrap();
        let mut meta = StoredMeta::from_meta(&test_support::meta());
        meta.header = head;
        let body = Body::from_chunks(vec![bytes::Bytes::from_static(b"01234")]);
        assert!(tier.store_partial(&key, meta, body));
        let partial = tier.partial_object(primary).unwrap();
        assert_eq!(partial.span.content_range(), "bytes 0-4/10");
        // no complete-object lookup finds it
        assert!(tier.lookup(&key, &span).await.unwrap().is_none());
        assert!(tier.complete_object(primary).is_err());
        // a purge of the URL takes it too
        let outcome = tier
            .purge(
                PurgeTarget::Active(&key.to_compact()),
                PurgeType::Invalidation,
                &span,
            )
            .await
            .unwrap();
        assert_eq!(outcome, PurgeOutcome::Purged(None));
        assert!(tier.partial_object(primary).is_none());
        assert_eq!(tier.stats().bytes, 0);
    }

    #[tokio::test]
    async fn with_a_zero_local_ttl_a_copy_is_trusted_while_any_of_its_shared_writes_is_in_flight() {
        let span = Span::inactive().handle();
        let key = CacheKey::new("/written", "");
        let meta = StoredMeta::from_meta(&test_support::meta());
        let body = Body::from_chunks(vec![bytes::Bytes::from_static(b"just filled")]);
        let mut tier = MemoryTier::new(4 << 20, 1 << 20, 1024);
        tier.set_local_ttl(Duration::ZERO);
        let tier = tier.leak();
        assert!(tier.store_complete(&key, meta, body));
        assert!(
            tier.lookup(&key, &span).await.unwrap().is_none(),
            "trusted with no write in flight"
        );
        let fill_write = tier.stored_for_sharing(&key).unwrap();
        let refresh_write = tier.stored_for_sharing(&key).unwrap();
        assert!(tier.lookup(&key, &span).await.unwrap().is_some());
        drop(refresh_write);
        assert!(
            tier.lookup(&key, &span).await.unwrap().is_some(),
            "one write ending ended the other's trust"
        );
        drop(fill_write);
        assert!(tier.lookup(&key, &span).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn promotion_follows_local_ttl_and_a_zero_ttl_keeps_no_copy() {
        let span = Span::inactive().handle();
        let key = CacheKey::new("/promoted", "");
        let meta = StoredMeta::from_meta(&test_support::meta());
        let body = Body::from_chunks(vec![bytes::Bytes::from_static(b"from the shared tier")]);

        let mut near = MemoryTier::new(4 << 20, 1 << 20, 1024);
        near.set_local_ttl(Duration::from_secs(60));
        let near = near.leak();
        assert!(near.promote(&key, &meta, &body));
        let (_, mut hit) = near.lookup(&key, &span).await.unwrap().unwrap();
        assert_eq!(read_all(&mut hit).await, b"from the shared tier");
        assert_eq!(near.stats().objects, 1);

        let mut untrusting = MemoryTier::new(4 << 20, 1 << 20, 1024);
        untrusting.set_local_ttl(Duration::ZERO);
        let untrusting = untrusting.leak();
        assert!(!untrusting.promote(&key, &meta, &body));
        assert!(untrusting.lookup(&key, &span).await.unwrap().is_none());
        // (`files` is the process's, which other tests' large bodies count)
        let stats = untrusting.stats();
        assert_eq!(
            MemoryStats { files: 0, ..stats },
            MemoryStats {
                limit: 4 << 20,
                ..MemoryStats::default()
            }
        );
    }
}
