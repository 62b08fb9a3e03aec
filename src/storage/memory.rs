//! The memory tier: a byte-bounded in-process cache on TinyUFO (S3-FIFO eviction, TinyLFU admission).
//!
//! # Why it looks like this
//! * **Hard byte bound.** Every object is charged its body, its header bytes and a fixed
//!   overhead ([`OBJECT_OVERHEAD`]). TinyUFO weighs items in `u16` units, so charges are rounded
//!   *up* to a unit sized for the largest admissible object; the sum of charges therefore never
//!   exceeds `memory_size`. [`MemoryTier::stats`] reports the exact bytes held.
//! * **Decoded metadata.** Objects keep [`StoredMeta`], not serialized `CacheMeta`.
//! * **Streaming fills.** A miss writes into an in-flight entry; concurrent lookups of the same key
//!   stream the body as it arrives (`support_streaming_partial_write`). A reader never sees a
//!   truncated body as complete: if the writer is dropped before `finish`, readers get an error.
//! * **Collision safety.** The full 128-bit combined key is kept with each object and checked on
//!   lookup, since TinyUFO indexes by a 64-bit hash of it.

use super::object::{owned_chunk, Body, RangeCursor, StoredMeta, OBJECT_OVERHEAD};
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use pingora_cache::eviction::CacheEntryKey;
use pingora_cache::key::{CacheHashKey, CompactCacheKey};
use pingora_cache::storage::{
    streaming_write::U64WriteId, HandleHit, HandleMiss, HitHandler, MissFinishType, MissHandler,
    PurgeOutcome, PurgeTarget, PurgeType, Storage,
};
use pingora_cache::trace::SpanHandle;
use pingora_cache::{CacheKey, CacheMeta};
use pingora_error::{Error, ErrorType, Result};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;
use tinyufo::TinyUfo;
use tokio::sync::watch;

/// A stored object: metadata (replaceable on revalidation) and an immutable body.
struct MemoryObject {
    key: u128,
    /// The primary key (without variance) this object is a variant of; equal to `key` when the
    /// object does not vary.
    primary: u128,
    meta: RwLock<Arc<StoredMeta>>,
    body: Body,
    /// Bytes charged to the budget when inserted.
    charged: usize,
    /// When this node stops trusting its copy (near-cache mode, see [`MemoryTier::set_local_ttl`]).
    local_until: Option<std::time::Instant>,
}

/// Progress of an in-flight fill, broadcast to streaming readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FillState {
    /// This many chunks are readable so far.
    Partial(usize),
    /// All chunks written; the body is complete.
    Complete,
    /// The writer went away before finishing: the body is incomplete and must not be served.
    Aborted,
}

/// The body of an in-flight fill, shared between the writer and streaming readers.
struct FillBody {
    chunks: RwLock<Vec<Bytes>>,
    state: watch::Sender<FillState>,
}

/// An in-flight fill as seen by lookups.
struct InFlight {
    write_id: u64,
    meta: Arc<StoredMeta>,
    body: Arc<FillBody>,
}

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
}

/// The in-process memory tier. See the module docs for its guarantees.
pub struct MemoryTier {
    objects: TinyUfo<u128, Arc<MemoryObject>>,
    in_flight: Mutex<HashMap<u128, Vec<InFlight>>>,
    in_flight_count: AtomicUsize,
    /// Serializes inserts: TinyUFO evicts for an item and then admits it, so two concurrent puts
    /// could each make room for one item and together overshoot the bound.
    insert_lock: Mutex<()>,
    /// Primary key -> keys of the variants stored under it, so purging a URL purges every
    /// variant (nginx purges only one).
    variants: Mutex<HashMap<u128, Vec<u128>>>,
    /// Near-cache mode: how long an object is trusted locally (None: until evicted or stale).
    local_ttl: Option<std::time::Duration>,
    next_write_id: AtomicU64,
    /// Bytes per TinyUFO weight unit.
    unit: usize,
    limit: usize,
    max_charge: usize,
    bytes: AtomicUsize,
    count: AtomicUsize,
    evictions: AtomicU64,
}

fn key_of(hash: [u8; 16]) -> u128 {
    u128::from_be_bytes(hash)
}

impl MemoryTier {
    /// Creates a tier holding at most `limit` bytes, admitting objects whose body is at most
    /// `max_object_size` bytes; `estimated_objects` sizes the admission sketch.
    pub fn new(limit: usize, max_object_size: usize, estimated_objects: usize) -> Self {
        // headers of a maximal object are budgeted at 64 KiB
        let max_charge = max_object_size + OBJECT_OVERHEAD + 64 * 1024;
        let unit = max_charge.div_ceil(u16::MAX as usize).max(64);
        MemoryTier {
            objects: TinyUfo::new(limit / unit, estimated_objects.max(16)),
            in_flight: Mutex::new(HashMap::new()),
            in_flight_count: AtomicUsize::new(0),
            insert_lock: Mutex::new(()),
            variants: Mutex::new(HashMap::new()),
            local_ttl: None,
            next_write_id: AtomicU64::new(1),
            unit,
            limit,
            max_charge,
            bytes: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// A leaked, `'static` tier as Pingora's cache API requires.
    pub fn leak(self) -> &'static MemoryTier {
        Box::leak(Box::new(self))
    }

    /// What the tier holds now.
    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            bytes: self.bytes.load(Ordering::Relaxed),
            objects: self.count.load(Ordering::Relaxed),
            limit: self.limit,
            evictions: self.evictions.load(Ordering::Relaxed),
            in_flight: self.in_flight_count.load(Ordering::Relaxed),
        }
    }

    /// The complete object stored under `key` for the proxy's hit fast path, if there is one and
    /// no fill of it is in flight. Freshness and variance are the caller's to judge.
    pub fn complete_object(&self, key: [u8; 16]) -> Option<FreshHit> {
        let key = key_of(key);
        if self.in_flight_count.load(Ordering::Acquire) != 0
            && self.get_in_flight(key, None).is_some()
        {
            return None;
        }
        let object = self.get_object(key)?;
        let meta = object.meta.read().clone();
        Some(FreshHit { object, meta })
    }

    fn get_object(&self, key: u128) -> Option<Arc<MemoryObject>> {
        let object = self.objects.get(&key).filter(|obj| obj.key == key)?;
        match object.local_until {
            Some(until) if std::time::Instant::now() >= until => None,
            _ => Some(object),
        }
    }

    /// Makes this tier a near cache in front of a shared tier: every object is trusted for at most
    /// `ttl` after it was stored here, then looked up in the shared tier again. This bounds how
    /// long a purge made through another node can go unseen here.
    pub fn set_local_ttl(&mut self, ttl: std::time::Duration) {
        self.local_ttl = Some(ttl);
    }

    /// Stores a complete object obtained elsewhere (a shared-tier hit) under `key`.
    pub fn promote(&self, key: &CacheKey, meta: StoredMeta, body: Body) -> bool {
        self.insert(
            key_of(key.combined_bin()),
            key_of(key.primary_bin()),
            Arc::new(meta),
            body,
        )
    }

    /// The metadata and body stored under `key`, for writing them to a shared tier.
    pub fn stored_parts(&self, key: &CacheKey) -> Option<(Arc<StoredMeta>, Body)> {
        // not `get_object`: the writer wants what was just stored, even when this node's own
        // trust in it has already run out (a `local_ttl` of zero)
        let key = key_of(key.combined_bin());
        let object = self.objects.get(&key).filter(|obj| obj.key == key)?;
        let meta = object.meta.read().clone();
        Some((meta, object.body.clone()))
    }

    /// A fast-path hit over an object read from elsewhere (a shared-tier hit) and not stored here.
    pub fn detached_fresh_hit(meta: StoredMeta, body: Body) -> FreshHit {
        let meta = Arc::new(meta);
        let object = Arc::new(MemoryObject {
            key: 0,
            primary: 0,
            meta: RwLock::new(meta.clone()),
            charged: 0,
            local_until: None,
            body,
        });
        FreshHit { object, meta }
    }

    /// A hit handler over a body that is not (or not yet) stored here.
    pub fn detached_hit(meta: &StoredMeta, body: Body) -> (CacheMeta, HitHandler) {
        let object = Arc::new(MemoryObject {
            key: 0,
            primary: 0,
            meta: RwLock::new(Arc::new(meta.clone())),
            charged: 0,
            local_until: None,
            body,
        });
        let cursor = RangeCursor::whole(object.body.len());
        (
            meta.to_meta(),
            Box::new(MemoryHit::Complete(CompleteHit { object, cursor })),
        )
    }

    fn get_in_flight(
        &self,
        key: u128,
        write_id: Option<u64>,
    ) -> Option<(Arc<StoredMeta>, Arc<FillBody>)> {
        if self.in_flight_count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let map = self.in_flight.lock();
        let fills = map.get(&key)?;
        let fill = match write_id {
            Some(id) => fills.iter().find(|f| f.write_id == id)?,
            None => fills.first()?,
        };
        Some((fill.meta.clone(), fill.body.clone()))
    }

    fn remove_in_flight(&self, key: u128, write_id: u64) {
        let mut map = self.in_flight.lock();
        if let Some(fills) = map.get_mut(&key) {
            let before = fills.len();
            fills.retain(|f| f.write_id != write_id);
            if fills.len() != before {
                self.in_flight_count.fetch_sub(1, Ordering::Release);
            }
            if fills.is_empty() {
                map.remove(&key);
            }
        }
    }

    /// Inserts a complete object, replacing any previous one; returns whether it was admitted.
    fn insert(&self, key: u128, primary: u128, meta: Arc<StoredMeta>, body: Body) -> bool {
        let charged = body.charge() + meta.header_bytes() + OBJECT_OVERHEAD;
        if charged > self.max_charge || charged > self.limit {
            return false;
        }
        let weight = charged.div_ceil(self.unit) as u16;
        let object = Arc::new(MemoryObject {
            key,
            primary,
            meta: RwLock::new(meta),
            body,
            charged,
            local_until: self.local_ttl.map(|ttl| std::time::Instant::now() + ttl),
        });
        let _serialized = self.insert_lock.lock();
        self.remove_key(key);
        if primary != key {
            self.variants.lock().entry(primary).or_default().push(key);
        }
        let mut admitted = true;
        for evicted in self.objects.force_put(key, object, weight) {
            if evicted.data.key == key {
                admitted = false;
                self.forget_variant(&evicted.data);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            } else {
                self.account_eviction(&evicted.data);
            }
        }
        // counted after evictions, so a concurrent reader of the stats never sees an overshoot
        if admitted {
            self.bytes.fetch_add(charged, Ordering::Relaxed);
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    fn account_eviction(&self, object: &MemoryObject) {
        self.forget_variant(object);
        self.bytes.fetch_sub(object.charged, Ordering::Relaxed);
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    fn forget_variant(&self, object: &MemoryObject) {
        if object.primary != object.key {
            let mut variants = self.variants.lock();
            if let Some(keys) = variants.get_mut(&object.primary) {
                keys.retain(|k| *k != object.key);
                if keys.is_empty() {
                    variants.remove(&object.primary);
                }
            }
        }
    }

    /// Removes an object and its charge; callers hold `insert_lock`.
    fn remove_key(&self, key: u128) -> bool {
        match self.objects.remove(&key) {
            Some(old) => {
                self.forget_variant(&old);
                self.bytes.fetch_sub(old.charged, Ordering::Relaxed);
                self.count.fetch_sub(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// An object found by [`MemoryTier::complete_object`]: its metadata and body, reference-counted.
pub struct FreshHit {
    object: Arc<MemoryObject>,
    meta: Arc<StoredMeta>,
}

impl FreshHit {
    /// The stored metadata (response head, freshness, age reference).
    pub fn meta(&self) -> &StoredMeta {
        &self.meta
    }

    /// The body chunks.
    pub fn chunks(&self) -> &[Bytes] {
        self.object.body.chunks()
    }

    /// The body length.
    pub fn body_len(&self) -> usize {
        self.object.body.len()
    }
}

/// Serves a hit from a complete object.
struct CompleteHit {
    object: Arc<MemoryObject>,
    cursor: RangeCursor,
}

/// Serves a hit by streaming an in-flight fill.
struct StreamingHit {
    body: Arc<FillBody>,
    state: watch::Receiver<FillState>,
    next_chunk: usize,
}

impl StreamingHit {
    async fn read(&mut self) -> Result<Option<Bytes>> {
        loop {
            let state = *self.state.borrow_and_update();
            {
                let chunks = self.body.chunks.read();
                if self.next_chunk < chunks.len() {
                    let chunk = chunks[self.next_chunk].clone();
                    self.next_chunk += 1;
                    return Ok(Some(chunk));
                }
            }
            match state {
                FillState::Complete => return Ok(None),
                FillState::Aborted => {
                    return Error::e_explain(ErrorType::InternalError, "cache fill aborted")
                }
                FillState::Partial(_) => {}
            }
            if self.state.changed().await.is_err() {
                // writer dropped without marking completion
                if *self.state.borrow() != FillState::Complete {
                    return Error::e_explain(ErrorType::InternalError, "cache fill abandoned");
                }
            }
        }
    }
}

enum MemoryHit {
    Complete(CompleteHit),
    Streaming(StreamingHit),
}

#[async_trait]
impl HandleHit for MemoryHit {
    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        match self {
            MemoryHit::Complete(hit) => Ok(hit.cursor.next(hit.object.body.chunks())),
            MemoryHit::Streaming(hit) => hit.read().await,
        }
    }

    async fn finish(
        self: Box<Self>,
        _storage: &'static (dyn Storage + Sync),
        _key: &CacheKey,
        _trace: &SpanHandle,
    ) -> Result<()> {
        Ok(())
    }

    fn can_seek(&self) -> bool {
        matches!(self, MemoryHit::Complete(_))
    }

    fn seek(&mut self, start: usize, end: Option<usize>) -> Result<()> {
        match self {
            MemoryHit::Complete(hit) => hit
                .cursor
                .seek(hit.object.body.len(), start, end)
                .or_else(|e| Error::e_explain(ErrorType::InternalError, e)),
            MemoryHit::Streaming(_) => {
                Error::e_explain(ErrorType::InternalError, "cannot seek a streaming fill")
            }
        }
    }

    fn should_count_access(&self) -> bool {
        matches!(self, MemoryHit::Complete(_))
    }

    fn get_eviction_weight(&self) -> usize {
        match self {
            MemoryHit::Complete(hit) => hit.object.charged,
            MemoryHit::Streaming(_) => 0,
        }
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }

    fn as_any_mut(&mut self) -> &mut (dyn Any + Send + Sync) {
        self
    }
}

/// Writes a fill; on `finish` the object becomes visible as complete.
struct MemoryMiss {
    tier: &'static MemoryTier,
    key: u128,
    primary: u128,
    write_id: U64WriteId,
    meta: Arc<StoredMeta>,
    body: Arc<FillBody>,
    finished: bool,
}

#[async_trait]
impl HandleMiss for MemoryMiss {
    async fn write_body(&mut self, data: Bytes, _eof: bool) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let count = {
            let mut chunks = self.body.chunks.write();
            chunks.push(owned_chunk(&data));
            chunks.len()
        };
        // completion itself is signalled by `finish`, after the object is indexed
        self.body.state.send_replace(FillState::Partial(count));
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<MissFinishType> {
        let chunks = self.body.chunks.read().clone();
        let body = Body::from_chunks(chunks);
        let size = body.len();
        // index the complete object before dropping the in-flight entry, so lookups never see a gap
        self.tier
            .insert(self.key, self.primary, self.meta.clone(), body);
        self.body.state.send_replace(FillState::Complete);
        self.finished = true;
        self.tier.remove_in_flight(self.key, self.write_id.into());
        Ok(MissFinishType::Created(size))
    }

    fn streaming_write_tag(&self) -> Option<&[u8]> {
        Some(self.write_id.as_bytes())
    }
}

impl Drop for MemoryMiss {
    fn drop(&mut self) {
        if !self.finished {
            self.body.state.send_replace(FillState::Aborted);
            self.tier.remove_in_flight(self.key, self.write_id.into());
        }
    }
}

fn streaming_hit(meta: &StoredMeta, body: Arc<FillBody>) -> (CacheMeta, HitHandler) {
    let state = body.state.subscribe();
    let hit = MemoryHit::Streaming(StreamingHit {
        body,
        state,
        next_chunk: 0,
    });
    (meta.to_meta(), Box::new(hit))
}

impl MemoryTier {
    fn lookup_key(&'static self, key: u128) -> Option<(CacheMeta, HitHandler)> {
        // prefer an in-flight fill, so a refreshed object is visible while it is being written
        if let Some((meta, body)) = self.get_in_flight(key, None) {
            return Some(streaming_hit(&meta, body));
        }
        let object = self.get_object(key)?;
        let meta = object.meta.read().to_meta();
        let cursor = RangeCursor::whole(object.body.len());
        Some((
            meta,
            Box::new(MemoryHit::Complete(CompleteHit { object, cursor })),
        ))
    }

    fn purge_key(&self, target: &CompactCacheKey) -> bool {
        let key = key_of(target.combined_bin());
        let removed_fill = {
            let mut map = self.in_flight.lock();
            match map.remove(&key) {
                Some(fills) => {
                    for fill in &fills {
                        fill.body.state.send_replace(FillState::Aborted);
                    }
                    self.in_flight_count
                        .fetch_sub(fills.len(), Ordering::Release);
                    true
                }
                None => false,
            }
        };
        let _serialized = self.insert_lock.lock();
        let mut removed = self.remove_key(key) || removed_fill;
        // purging a URL (no variance given) purges all its variants too
        if target.variance.is_none() {
            let variant_keys = self.variants.lock().remove(&key).unwrap_or_default();
            for variant in variant_keys {
                removed |= self.remove_key(variant);
            }
        }
        removed
    }
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
        match write_id.and_then(|id| self.get_in_flight(key, Some(id))) {
            Some((meta, body)) => Ok(Some(streaming_hit(&meta, body))),
            None => Ok(self.lookup_key(key)),
        }
    }

    async fn get_miss_handler(
        &'static self,
        key: &CacheKey,
        meta: &CacheMeta,
        _trace: &SpanHandle,
    ) -> Result<MissHandler> {
        let primary = key_of(key.primary_bin());
        let key = key_of(key.combined_bin());
        let write_id = self.next_write_id.fetch_add(1, Ordering::Relaxed);
        let mut meta = StoredMeta::from_meta(meta);
        // Pingora's `created` has whole seconds; variants are retired by comparing it with the
        // primary slot's (see `proxy::fast_hit::variant_is_current`), so a purge and a refill
        // within one second must still order: record when this fill started, to the nanosecond.
        meta.created = meta.created.max(SystemTime::now());
        let meta = Arc::new(meta);
        let (state, _) = watch::channel(FillState::Partial(0));
        let body = Arc::new(FillBody {
            chunks: RwLock::new(Vec::new()),
            state,
        });
        self.in_flight
            .lock()
            .entry(key)
            .or_default()
            .push(InFlight {
                write_id,
                meta: meta.clone(),
                body: body.clone(),
            });
        self.in_flight_count.fetch_add(1, Ordering::Release);
        Ok(Box::new(MemoryMiss {
            tier: self,
            key,
            primary,
            write_id: write_id.into(),
            meta,
            body,
            finished: false,
        }))
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
        let Some(object) = self.get_object(key) else {
            return Ok(PurgeOutcome::NotFound);
        };
        let mut guard = object.meta.write();
        let mut meta = (**guard).clone();
        meta.fresh_until = SystemTime::now()
            .checked_sub(std::time::Duration::from_secs(1))
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
        match self.get_object(key_of(key.combined_bin())) {
            Some(object) => {
                *object.meta.write() = Arc::new(StoredMeta::from_meta(meta));
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

#[cfg(test)]
mod tests {
    use super::*;
    use pingora_cache::trace::Span;
    use pingora_http::ResponseHeader;
    use std::time::Duration;

    fn meta() -> CacheMeta {
        let header = ResponseHeader::build(200, None).unwrap();
        let now = SystemTime::now();
        CacheMeta::new(now + Duration::from_secs(60), now, 0, 0, header)
    }

    async fn fill(tier: &'static MemoryTier, key: &CacheKey, body: &[u8]) {
        let span = Span::inactive().handle();
        let mut miss = tier.get_miss_handler(key, &meta(), &span).await.unwrap();
        for chunk in body.chunks(4096) {
            miss.write_body(Bytes::copy_from_slice(chunk), false)
                .await
                .unwrap();
        }
        miss.finish().await.unwrap();
    }

    async fn read_all(hit: &mut HitHandler) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(b) = hit.read_body().await.unwrap() {
            out.extend_from_slice(&b);
        }
        out
    }

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
    async fn byte_bound_holds_when_overfilled() {
        let limit = 32 << 20;
        let tier = MemoryTier::new(limit, 1 << 20, 4096).leak();
        let body = vec![7u8; 262_144];
        for i in 0..(3 * limit / body.len()) {
            fill(tier, &CacheKey::new(format!("/obj/{i}"), ""), &body).await;
            assert!(tier.stats().bytes <= limit, "{:?}", tier.stats());
        }
        let stats = tier.stats();
        assert!(stats.evictions > 0);
        assert!(
            stats.bytes > limit / 2,
            "tier should stay well used: {stats:?}"
        );
    }

    #[tokio::test]
    async fn streaming_reader_sees_whole_body_or_error() {
        let tier = MemoryTier::new(4 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/s", "");
        let mut miss = tier.get_miss_handler(&key, &meta(), &span).await.unwrap();
        miss.write_body(Bytes::from_static(b"hello "), false)
            .await
            .unwrap();
        let (_, mut reader) = tier.lookup(&key, &span).await.unwrap().unwrap();
        let reading = tokio::spawn(async move { read_all(&mut reader).await });
        miss.write_body(Bytes::from_static(b"world"), true)
            .await
            .unwrap();
        miss.finish().await.unwrap();
        assert_eq!(reading.await.unwrap(), b"hello world");

        // an abandoned fill makes its streaming readers fail instead of ending early
        let key2 = CacheKey::new("/t", "");
        let mut miss = tier.get_miss_handler(&key2, &meta(), &span).await.unwrap();
        miss.write_body(Bytes::from_static(b"partial"), false)
            .await
            .unwrap();
        let (_, mut reader) = tier.lookup(&key2, &span).await.unwrap().unwrap();
        assert_eq!(&reader.read_body().await.unwrap().unwrap()[..], b"partial");
        drop(miss);
        assert!(reader.read_body().await.is_err());
        assert!(tier.lookup(&key2, &span).await.unwrap().is_none());
    }
}

#[cfg(test)]
mod concurrency_tests {
    use super::*;
    use pingora_cache::trace::Span;
    use pingora_http::ResponseHeader;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn byte_bound_holds_under_concurrent_fills() {
        let limit = 32 << 20;
        let tier = MemoryTier::new(limit, 1 << 20, 4096).leak();
        let mut tasks = Vec::new();
        for t in 0..8 {
            tasks.push(tokio::spawn(async move {
                let span = Span::inactive().handle();
                for i in 0..48 {
                    let key = CacheKey::new(format!("/c/{t}/{i}"), "");
                    let now = SystemTime::now();
                    let header = ResponseHeader::build(200, None).unwrap();
                    let meta = CacheMeta::new(now + Duration::from_secs(60), now, 0, 0, header);
                    let mut miss = tier.get_miss_handler(&key, &meta, &span).await.unwrap();
                    for _ in 0..4 {
                        miss.write_body(Bytes::from(vec![1u8; 65_536]), false)
                            .await
                            .unwrap();
                        tokio::task::yield_now().await;
                    }
                    miss.finish().await.unwrap();
                    let stats = tier.stats();
                    assert!(stats.bytes <= limit, "{stats:?}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(tier.stats().bytes <= limit, "{:?}", tier.stats());
    }
}
