//! Reading a hit: the [`HandleHit`] Pingora drives over a complete object or an in-flight fill,
//! and [`CompleteObject`], the complete object the proxy's hit fast path reads directly.
//!
//! A complete object is served without copying, chunk by chunk, and can be seeked for ranges; an
//! in-flight fill is streamed (see `fill.rs`) and cannot. An object read from elsewhere (a
//! shared-tier hit) is served through the same types, detached: not stored in this tier.

use super::fill::{FillBody, StreamingHit};
use super::index::MemoryObject;
use crate::storage::object::{Body, RangeCursor, StoredMeta};
use crate::storage::tier::Tier;
use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::RwLock;
use pingora_cache::storage::{HandleHit, HitHandler, Storage};
use pingora_cache::trace::SpanHandle;
use pingora_cache::{CacheKey, CacheMeta};
use pingora_error::{Error, ErrorType, Result};
use std::any::Any;
use std::sync::Arc;

/// A complete object, as [`MemoryTier::complete_object`](super::MemoryTier::complete_object)
/// finds it for the proxy's hit fast path: its metadata and body, reference-counted, with no
/// judgement of freshness or variance (those are the caller's).
#[derive(Clone)]
pub struct CompleteObject {
    object: Arc<MemoryObject>,
    meta: Arc<StoredMeta>,
}

impl CompleteObject {
    /// The object as it is now (a revalidation may replace its metadata later).
    pub(super) fn new(object: Arc<MemoryObject>) -> Self {
        let meta = object.meta.read().clone();
        CompleteObject { object, meta }
    }

    /// An object read from elsewhere (a shared-tier hit) and not stored in this tier.
    pub fn detached(meta: StoredMeta, body: Body) -> Self {
        let meta = Arc::new(meta);
        let object = Arc::new(MemoryObject {
            key: DETACHED_KEY,
            primary: 0,
            meta: RwLock::new(meta.clone()),
            charged: 0,
            local_until: None,
            shared_writes_in_flight: Default::default(),
            scopes: None,
            body,
        });
        CompleteObject { object, meta }
    }

    /// The stored metadata (response head, freshness, age reference).
    pub fn meta(&self) -> &StoredMeta {
        &self.meta
    }

    /// The body.
    pub fn body(&self) -> &Body {
        &self.object.body
    }

    /// The body chunks.
    pub fn chunks(&self) -> &[Bytes] {
        self.object.body.chunks()
    }

    /// The memory file holding the whole body, when it is kept in one
    /// ([`crate::storage::object::Body::file`]).
    pub fn body_file(&self) -> Option<&super::BodyFile> {
        self.object.body.file()
    }

    /// The body length.
    pub fn body_len(&self) -> usize {
        self.object.body.len()
    }

    /// A hit handler serving this object's body from the start.
    pub(super) fn into_hit_handler(self) -> HitHandler {
        complete_hit(self.object)
    }
}

/// The index key of a detached object: no object stored in the tier has it (keys are hashes).
const DETACHED_KEY: u128 = 0;

/// The tier a hit handler of the standard path reads from: memcached for a detached object (a
/// shared-tier hit, see [`CompleteObject::detached`]), else this node's memory.
/// Whether the origin's body should wait for this request's client: `reader` (Pingora's miss
/// body reader) is the filling request's own reader of a fill that outgrew the size limit and
/// became a relay (see `fill.rs`), and it is more than `RELAY_WINDOW` behind. Its proxy loop
/// asks before it reads more of the origin's body, since the reader runs in that same loop
/// and the fill's writer cannot wait for it. `reads_no_more`: the client left or has had its
/// whole answer (a 304, a HEAD), so the reader holds nothing back from now on.
pub fn owner_holds_back_origin(reader: &HitHandler, reads_no_more: bool) -> bool {
    match reader.as_any().downcast_ref::<MemoryHit>() {
        Some(MemoryHit::Streaming(hit)) => hit.holds_back_relay(reads_no_more),
        _ => false,
    }
}

pub fn tier_of(handler: &HitHandler) -> Tier {
    match handler.as_any().downcast_ref::<MemoryHit>() {
        Some(MemoryHit::Complete(hit)) if hit.object.key == DETACHED_KEY => Tier::Memcached,
        _ => Tier::Memory,
    }
}

/// The chunks of the whole body `handler` is about to serve, when it serves a complete object
/// (this tier's or a detached shared-tier read) from its start to its end and the body is no
/// longer than `max`: for the standard path to decode a small compressed hit at once, with its
/// length, as the fast path does (`compression::on_downstream_head`). `None` for an in-flight
/// fill, a seeked handler and a longer body.
pub fn whole_body_within(handler: &HitHandler, max: usize) -> Option<Vec<Bytes>> {
    match handler.as_any().downcast_ref::<MemoryHit>() {
        Some(MemoryHit::Complete(hit))
            if hit.object.body.len() <= max && hit.cursor.is_whole(hit.object.body.len()) =>
        {
            Some(hit.object.body.chunks().to_vec())
        }
        _ => None,
    }
}

/// Serves a hit from a complete object.
struct CompleteHit {
    object: Arc<MemoryObject>,
    cursor: RangeCursor,
}

/// The memory tier's hit handler: a complete object or an in-flight fill.
enum MemoryHit {
    Complete(CompleteHit),
    Streaming(StreamingHit),
}

/// A handler serving `object`'s whole body (until a seek narrows it).
pub(super) fn complete_hit(object: Arc<MemoryObject>) -> HitHandler {
    let cursor = RangeCursor::whole(object.body.len());
    Box::new(MemoryHit::Complete(CompleteHit { object, cursor }))
}

/// A handler streaming an in-flight fill, with the fill's metadata.
pub(super) fn streaming_hit(
    meta: &StoredMeta,
    body: Arc<FillBody>,
    owner: bool,
) -> (CacheMeta, HitHandler) {
    let hit = MemoryHit::Streaming(StreamingHit::new(body, owner));
    (meta.to_meta(), Box::new(hit))
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
