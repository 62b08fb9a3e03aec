//! The byte-bounded object index: the complete objects this node holds, in TinyUFO, each charged
//! the bytes it occupies, so that their sum never exceeds the configured bound.
//!
//! Every object is charged its body, its header bytes, the wire form of its head that fast hits
//! keep ([`WireHead::charge_for`], charged up front so the bound holds however it is served) and a
//! fixed overhead ([`OBJECT_OVERHEAD`]).
//! TinyUFO weighs items in `u16` units, so charges are rounded *up* to a unit sized for the
//! largest admissible object; the sum of charges therefore never exceeds the limit, and the exact
//! bytes held are counted beside it. TinyUFO indexes by a 64-bit hash of the key, so the full
//! 128-bit key is kept with each object and checked on every read. The index keeps the
//! [`VariantIndex`] and the [`ScopeIndex`] in step with what it holds: an object leaves them
//! when evicted, replaced or removed.

use super::scopes::{ScopeIndex, INDEX_ENTRY_CHARGE};
use super::variants::VariantIndex;
use crate::storage::ban_list::scope::EntryScopes;
use crate::storage::object::{Body, StoredMeta, OBJECT_OVERHEAD};
use crate::storage::wire_head::WireHead;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tinyufo::TinyUfo;

/// A stored object: metadata (replaceable on revalidation) and an immutable body.
pub(super) struct MemoryObject {
    pub(super) key: u128,
    /// The primary key (without variance) this object is a variant of; equal to `key` when the
    /// object does not vary.
    pub(super) primary: u128,
    pub(super) meta: RwLock<Arc<StoredMeta>>,
    pub(super) body: Body,
    /// Bytes charged to the budget when inserted.
    pub(super) charged: usize,
    /// When this node stops trusting its copy (near-cache mode, see
    /// [`MemoryTier::set_local_ttl`](super::MemoryTier::set_local_ttl)).
    pub(super) local_until: Option<Instant>,
    /// This node filled it and its write to the shared tier has not landed yet: until it has,
    /// the shared tier holds an older answer (or none), so this copy is trusted past
    /// `local_until` (see [`super::SharedWriteInFlight`]).
    pub(super) shared_writes_in_flight: AtomicU32,
    /// What purges and bans can name it by (its URL, host, path, tags); `None` when the tier
    /// has no ban list.
    pub(super) scopes: Option<Box<EntryScopes>>,
}

/// The complete objects held, and the bytes they are charged.
pub(super) struct ObjectIndex {
    objects: TinyUfo<u128, Arc<MemoryObject>>,
    /// Serializes inserts: TinyUFO evicts for an item and then admits it, so two concurrent puts
    /// could each make room for one item and together overshoot the bound.
    insert_lock: Mutex<()>,
    variants: VariantIndex,
    scopes: ScopeIndex,
    /// Bytes per TinyUFO weight unit.
    unit: usize,
    limit: usize,
    max_object_size: usize,
    max_charge: usize,
    bytes: AtomicUsize,
    count: AtomicUsize,
    evictions: AtomicU64,
}

impl ObjectIndex {
    /// An index holding at most `limit` bytes, admitting objects whose body is at most
    /// `max_object_size` bytes; `estimated_objects` sizes the admission sketch.
    pub(super) fn new(limit: usize, max_object_size: usize, estimated_objects: usize) -> Self {
        // headers of a maximal object are budgeted at 64 KiB
        let max_charge = max_object_size + OBJECT_OVERHEAD + 64 * 1024;
        let unit = max_charge.div_ceil(u16::MAX as usize).max(64);
        ObjectIndex {
            objects: TinyUfo::new(limit / unit, estimated_objects.max(16)),
            insert_lock: Mutex::new(()),
            variants: VariantIndex::default(),
            scopes: ScopeIndex::default(),
            unit,
            limit,
            max_object_size,
            max_charge,
            bytes: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    /// The largest body this index admits (`cache.max_object_size`).
    pub(super) fn max_object_size(&self) -> usize {
        self.max_object_size
    }

    /// The object stored under exactly `key` (not another key with the same 64-bit hash).
    pub(super) fn get(&self, key: u128) -> Option<Arc<MemoryObject>> {
        self.objects.get(&key).filter(|obj| obj.key == key)
    }

    /// Inserts a complete object, replacing any previous one; returns it if it was admitted.
    pub(super) fn insert(
        &self,
        key: u128,
        primary: u128,
        meta: Arc<StoredMeta>,
        body: Body,
        local_until: Option<Instant>,
        scopes: Option<Box<EntryScopes>>,
    ) -> Option<Arc<MemoryObject>> {
        let scope_charge = scopes.as_ref().map_or(0, |s| {
            s.heap_bytes() + INDEX_ENTRY_CHARGE * (1 + s.tags.len())
        });
        let charged = body.charge()
            + meta.header_bytes()
            + WireHead::charge_for(&meta.header)
            + OBJECT_OVERHEAD
            + scope_charge;
        if charged > self.max_charge || charged > self.limit {
            return None;
        }
        let weight = charged.div_ceil(self.unit) as u16;
        let object = Arc::new(MemoryObject {
            key,
            primary,
            meta: RwLock::new(meta),
            body,
            charged,
            local_until,
            shared_writes_in_flight: AtomicU32::new(0),
            scopes,
        });
        let _serialized = self.insert_lock.lock();
        self.remove_locked(key);
        self.variants.add(primary, key);
        if let Some(scopes) = &object.scopes {
            self.scopes.add(key, scopes);
        }
        let mut admitted = true;
        for evicted in self.objects.force_put(key, object.clone(), weight) {
            if evicted.data.key == key {
                admitted = false;
                self.variants.forget(evicted.data.primary, key);
                if let Some(scopes) = &evicted.data.scopes {
                    self.scopes.forget(key, scopes);
                }
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
        admitted.then_some(object)
    }

    /// Removes the object under `key`; returns whether there was one.
    pub(super) fn remove(&self, key: u128) -> bool {
        let _serialized = self.insert_lock.lock();
        self.remove_locked(key)
    }

    /// Removes `object` if it is still the one stored under its key (not a newer one stored
    /// since it was looked up); returns whether it was.
    pub(super) fn remove_exact(&self, object: &Arc<MemoryObject>) -> bool {
        let _serialized = self.insert_lock.lock();
        match self.get(object.key) {
            Some(current) if Arc::ptr_eq(&current, object) => self.remove_locked(object.key),
            _ => false,
        }
    }

    /// The variant keys stored under the primary key `primary`.
    pub(super) fn variants_of(&self, primary: u128) -> Vec<u128> {
        self.variants.of(primary)
    }

    /// The keys stored under the host hash `host`.
    pub(super) fn of_host(&self, host: u64) -> Vec<u128> {
        self.scopes.of_host(host)
    }

    /// The keys stored with the tag hash `tag`.
    pub(super) fn tagged(&self, tag: u64) -> Vec<u128> {
        self.scopes.tagged(tag)
    }

    /// Every key stored.
    pub(super) fn all_keys(&self) -> Vec<u128> {
        self.scopes.all()
    }

    /// Removes the object under the primary key `primary` and every variant stored under it;
    /// returns whether there was any.
    pub(super) fn remove_with_variants(&self, primary: u128) -> bool {
        let _serialized = self.insert_lock.lock();
        let mut removed = self.remove_locked(primary);
        for variant in self.variants.take(primary) {
            removed |= self.remove_locked(variant);
        }
        removed
    }

    /// Bytes charged for all objects held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Objects held.
    pub(super) fn objects(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The bound on [`Self::bytes`].
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// Objects evicted (or rejected by admission) to stay within the limit.
    pub(super) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    fn account_eviction(&self, object: &MemoryObject) {
        self.variants.forget(object.primary, object.key);
        if let Some(scopes) = &object.scopes {
            self.scopes.forget(object.key, scopes);
        }
        self.bytes.fetch_sub(object.charged, Ordering::Relaxed);
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes an object and its charge; callers hold `insert_lock`.
    fn remove_locked(&self, key: u128) -> bool {
        match self.objects.remove(&key) {
            Some(old) => {
                self.variants.forget(old.primary, old.key);
                if let Some(scopes) = &old.scopes {
                    self.scopes.forget(old.key, scopes);
                }
                self.bytes.fetch_sub(old.charged, Ordering::Relaxed);
                self.count.fetch_sub(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::fill;
    use super::super::MemoryTier;
    use bytes::Bytes;
    use pingora_cache::storage::Storage;
    use pingora_cache::trace::Span;
    use pingora_cache::{CacheKey, CacheMeta};
    use pingora_http::ResponseHeader;
    use std::time::{Duration, SystemTime};

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
