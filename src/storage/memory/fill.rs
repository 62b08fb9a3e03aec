//! In-flight fills: the writer Pingora's miss path drives ([`MemoryMiss`]), the registry lookups
//! find it in ([`InFlightFills`]), and the readers that stream it while it is written
//! ([`StreamingHit`]).
//!
//! A miss writes into an in-flight entry; concurrent lookups of the same key stream the body as it
//! arrives (`support_streaming_partial_write`). On `finish` the object is indexed as complete
//! before the in-flight entry goes, so lookups never see a gap. A reader never sees a truncated
//! body as complete: if the writer is dropped before `finish`, readers get an error.
//!
//! A body whose length the origin declared is copied into one allocation of that length, and
//! stored as slices of it ([`BodyBuffer`]): a cached object is one block the allocator can hand
//! back whole when it is evicted, not dozens of read-sized pieces mixed into the same pages as
//! the process's short-lived I/O buffers. Under churn of large objects those pieces kept pages
//! half used, and RSS about 1.3 times the bytes the tier held (docs/benchmarks.md, "Memory").
//! A large body's block is a memory mapping of its own (`mapped`), unmapped when it is evicted.
//!
//! A body that outgrows `cache.max_object_size` while it streams (an origin that announced no
//! length) will not be stored, but its readers already have its head and part of its body: the
//! fill becomes a *relay* for them ([`FillBody::relay`]). Lookups no longer find it, chunks are
//! no longer copied, and a chunk is let go as soon as every reader has passed it. The writer
//! waits while a reader in another request is more than [`RELAY_WINDOW`] behind (so a relay
//! holds about that much per reader, not the body); the filling request's own client
//! ([`StreamingHit`] with `owner`) is kept in step by its proxy loop instead
//! (`owner_holds_back_origin`), since that reader runs in the writer's own task. Before, such a
//! fill failed its readers and the request mid-body: a 500, or a body cut short.
//!
//! A hard purge of the URL lets go of its fills ([`InFlightFills::disown`]): the answer in
//! flight must not be stored or joined after the purge, but the requests already reading it came
//! before the purge, and get it whole, as from any fill ([`FillBody::disowned`]). Not as from a
//! relay: a relay waits for its slowest reader, so one client that had joined the fill and read
//! nothing held every other reader (the direct miss's own client too) for 60 s once the URL was
//! purged, where the fill would have gone at the origin's pace without the purge.

use super::mapped::MappedBody;
use super::{key_of, MemoryTier, SharedWriteInFlight};
use crate::policy::RequestSent;
use crate::storage::ban_list::scope::EntryScopes;
use crate::storage::ban_list::{BanList, Verdict};
use crate::storage::object::{framed_by_length, owned_chunk, Body, StoredMeta};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};
use pingora_cache::key::CacheHashKey;
use pingora_cache::storage::{streaming_write::U64WriteId, HandleMiss, MissFinishType};
use pingora_cache::{CacheKey, CacheMeta};
use pingora_error::{Error, ErrorType, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};
use tokio::sync::{watch, Notify};

/// How far a reader of a relaying fill may fall behind its writer, in bytes (each chunk counted
/// `CHUNK_WEIGHT` more), before the writer (and so the origin's body) waits for it: what a relay
/// holds per reader.
pub const RELAY_WINDOW: usize = 1 << 20;

/// How long the writer of a relaying fill waits for a reader that takes nothing at all; such a
/// reader is then cut off (its read fails), so one stalled client cannot hold the origin's
/// connection, and every other reader, for longer.
const STALLED_RELAY_READER: Duration = Duration::from_secs(60);

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
pub(super) struct FillBody {
    chunks: RwLock<FillChunks>,
    state: watch::Sender<FillState>,
    /// Set once the body outgrew `cache.max_object_size`: nothing will be stored, and the fill
    /// only carries the body to the readers it already has (see the module docs).
    relay: AtomicBool,
    /// Set once a hard purge let go of the fill ([`InFlightFills::disown`]): nothing will be
    /// stored, and no lookup joins it; its readers read it as any fill's.
    disowned: AtomicBool,
    /// Where each reader is, for a relaying fill to let go of what all have read.
    readers: Mutex<Vec<Weak<ReaderPosition>>>,
    /// A reader of a relaying fill moved on or went away.
    reader_moved: Notify,
}

/// The chunks of a fill; a relaying fill drops the ones every reader has passed, so the list
/// starts at chunk `first`.
#[derive(Default)]
struct FillChunks {
    first: usize,
    list: VecDeque<Bytes>,
    /// For each chunk in `list`, the [`weight`](Self::weight) written before it, so what a
    /// reader lags by is one subtraction however many chunks it is behind.
    starts: VecDeque<usize>,
    /// Bytes written so far, each chunk counted [`CHUNK_WEIGHT`] more.
    weight: usize,
}

/// What a chunk costs a relay beyond its bytes (its `Bytes` and list entries), so that an
/// origin sending tiny chunks fills a reader's window with a few thousand of them, not a million.
const CHUNK_WEIGHT: usize = 64;

impl FillChunks {
    /// Chunks written so far, dropped ones included.
    fn written(&self) -> usize {
        self.first + self.list.len()
    }

    fn push(&mut self, chunk: Bytes) {
        self.starts.push_back(self.weight);
        self.weight += chunk.len() + CHUNK_WEIGHT;
        self.list.push_back(chunk);
    }

    /// Drops the chunks before chunk `until`.
    fn drop_before(&mut self, until: usize) {
        let passed = until.saturating_sub(self.first).min(self.list.len());
        self.list.drain(..passed);
        self.starts.drain(..passed);
        self.first += passed;
    }

    /// What is held from chunk `from` on: its bytes, each chunk counted [`CHUNK_WEIGHT`] more.
    fn held_from(&self, from: usize) -> usize {
        match self.starts.get(from.saturating_sub(self.first)) {
            Some(start) => self.weight - start,
            None => 0,
        }
    }
}

/// One reader's progress through a fill.
struct ReaderPosition {
    /// The next chunk it reads.
    next_chunk: AtomicUsize,
    /// The filling request's own reader (Pingora's miss body reader).
    owner: bool,
    /// No longer read: its client went away, or it fell too far behind a relay and was cut off.
    detached: AtomicBool,
}

/// An in-flight fill as seen by lookups.
struct InFlight {
    write_id: u64,
    meta: Arc<StoredMeta>,
    body: Arc<FillBody>,
    /// What bans can name the fill by (with a ban list): a lookup judges the fill by them
    /// before it joins it ([`InFlightFills::joinable`]).
    scopes: Option<Arc<EntryScopes>>,
}

/// The fills being written now, by key (a key may have several: a refresh starts while the
/// previous fill still streams).
pub(super) struct InFlightFills {
    by_key: Mutex<HashMap<u128, Vec<InFlight>>>,
    /// How many fills `by_key` holds, read without the lock so the hit path skips it when idle.
    count: AtomicUsize,
    next_write_id: AtomicU64,
}

impl Default for InFlightFills {
    fn default() -> Self {
        InFlightFills {
            by_key: Mutex::new(HashMap::new()),
            count: AtomicUsize::new(0),
            next_write_id: AtomicU64::new(1),
        }
    }
}

impl InFlightFills {
    /// Fills currently being written.
    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether a fill of `key` is being written.
    pub(super) fn is_filling(&self, key: u128) -> bool {
        self.count.load(Ordering::Acquire) != 0
            && self
                .by_key
                .lock()
                .get(&key)
                .is_some_and(|fills| fills.iter().any(|fill| !fill.body.is_disowned()))
    }

    /// The fill of `key` with the given write id (its writer's own request reads it; others
    /// look fills up through [`Self::joinable`]).
    pub(super) fn get(&self, key: u128, write_id: u64) -> Option<(Arc<StoredMeta>, Arc<FillBody>)> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let by_key = self.by_key.lock();
        let fill = by_key.get(&key)?.iter().find(|f| f.write_id == write_id)?;
        Some((fill.meta.clone(), fill.body.clone()))
    }

    /// The oldest fill of `key` a lookup may join: not one that a purge or ban issued since its
    /// request was sent covers. A URL purge abandons the URL's fills, but a tag, host or
    /// prefix ban names fills it cannot list; without this a request after such a ban (even one
    /// every node confirmed) was served the answer in flight, from before the ban. A soft ban
    /// covers it too: the request fetches for itself rather than take a fill already stale.
    pub(super) fn joinable(
        &self,
        key: u128,
        bans: Option<&BanList>,
    ) -> Option<(Arc<StoredMeta>, Arc<FillBody>)> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let by_key = self.by_key.lock();
        // the oldest the bans leave (a refill started after the ban is after it)
        let fill = by_key
            .get(&key)?
            .iter()
            .filter(|fill| !fill.body.is_disowned())
            .find(|fill| match (bans, fill.scopes.as_deref()) {
                (Some(bans), Some(scopes)) => {
                    bans.judge_fetched(scopes, fill.meta.validated()) == Verdict::Valid
                }
                _ => true,
            })?;
        Some((fill.meta.clone(), fill.body.clone()))
    }

    /// Registers a new fill of `key`; returns its write id and the body its writer fills.
    fn start(
        &self,
        key: u128,
        meta: Arc<StoredMeta>,
        scopes: Option<Arc<EntryScopes>>,
    ) -> (u64, Arc<FillBody>) {
        let write_id = self.next_write_id.fetch_add(1, Ordering::Relaxed);
        let (state, _) = watch::channel(FillState::Partial(0));
        let body = Arc::new(FillBody {
            chunks: RwLock::new(FillChunks::default()),
            state,
            relay: AtomicBool::new(false),
            disowned: AtomicBool::new(false),
            readers: Mutex::new(Vec::new()),
            reader_moved: Notify::new(),
        });
        self.by_key.lock().entry(key).or_default().push(InFlight {
            write_id,
            meta,
            body: body.clone(),
            scopes,
        });
        self.count.fetch_add(1, Ordering::Release);
        (write_id, body)
    }

    fn remove(&self, key: u128, write_id: u64) {
        let mut by_key = self.by_key.lock();
        if let Some(fills) = by_key.get_mut(&key) {
            let before = fills.len();
            fills.retain(|f| f.write_id != write_id);
            if fills.len() != before {
                self.count.fetch_sub(1, Ordering::Release);
            }
            if fills.is_empty() {
                by_key.remove(&key);
            }
        }
    }

    /// Lets go of every fill of `key`, for a hard purge of its URL; returns whether there was
    /// one. No lookup joins it from now on and nothing of it is stored, but the readers it
    /// already has (its own request's client, and requests that joined it before the purge) get
    /// the rest of the body, at the origin's pace as before the purge (it does not become a
    /// relay, which waits for its slowest reader). Their requests came before the purge: the
    /// answer in flight is theirs. Before, the fill was aborted, and every one of those clients
    /// had its answer cut mid-body.
    pub(super) fn disown(&self, key: u128) -> bool {
        let by_key = self.by_key.lock();
        let Some(fills) = by_key.get(&key) else {
            return false;
        };
        for fill in fills {
            fill.body.disowned.store(true, Ordering::Release);
        }
        true
    }
}

/// A fill of the memory tier: the body is copied in as it arrives, and lookups stream it; on
/// `finish` the object becomes visible as complete.
pub struct MemoryMiss {
    tier: &'static MemoryTier,
    key: u128,
    primary: u128,
    write_id: U64WriteId,
    meta: Arc<StoredMeta>,
    body: Arc<FillBody>,
    /// What purges and bans can name the object by, stored with it.
    scopes: Option<Box<EntryScopes>>,
    /// Where the body's chunks are copied.
    buffer: BodyBuffer,
    /// The body length the stored head declares (one `Content-Length`; a head with
    /// `Transfer-Encoding` declares none: `StoredMeta::from_meta` drops both).
    declared: Option<usize>,
    /// Bytes written so far.
    written: usize,
    /// `cache.max_object_size`: past it the fill becomes a relay.
    limit: usize,
    finished: bool,
}

/// `meta` as stored, dated when its request was sent. A `Date` has whole seconds, so `created`
/// (the reception less the answer's age) can be up to a second early; variants are retired by
/// comparing it with the primary slot's (see `proxy::fast_hit::variant_is_current`), so a purge
/// and a refill within one second must still order: the entry is dated when its request was
/// sent, to the nanosecond (the policy's `RequestSent`; a meta without one, now). Not when the
/// answer came: a purge issued while the origin prepared it may have changed the resource, and
/// must cover the entry (`StoredMeta::validated`); dated by its arrival, the answer was stored
/// after the purge and served as if it had never happened.
fn dated_by_request(meta: &CacheMeta) -> StoredMeta {
    let mut stored = StoredMeta::from_meta(meta);
    let sent = request_sent(meta).unwrap_or_else(SystemTime::now);
    stored.created = stored.created.max(sent);
    stored
}

/// When the request that brought `meta` was sent, if the policy said (`RequestSent`).
pub(super) fn request_sent(meta: &CacheMeta) -> Option<SystemTime> {
    meta.extensions().get::<RequestSent>().map(|sent| sent.0)
}

impl MemoryMiss {
    /// Starts a fill of `key` in `tier`, visible to lookups from now on.
    pub(super) fn start(tier: &'static MemoryTier, cache_key: &CacheKey, meta: &CacheMeta) -> Self {
        let primary = key_of(cache_key.primary_bin());
        let key = key_of(cache_key.combined_bin());
        let meta = dated_by_request(meta);
        let scopes = tier.scopes_of(cache_key, &meta.header);
        let limit = tier.index.max_object_size();
        let declared = declared_length(&meta);
        let buffer = BodyBuffer::new(declared, limit);
        let meta = Arc::new(meta);
        let judged_by = scopes.as_deref().map(|scopes| Arc::new(scopes.clone()));
        let (write_id, body) = tier.fills.start(key, meta.clone(), judged_by);
        MemoryMiss {
            tier,
            key,
            primary,
            write_id: write_id.into(),
            meta,
            body,
            scopes,
            buffer,
            declared,
            written: 0,
            limit,
            finished: false,
        }
    }

    /// Past the size limit: the fill is a relay (see the module docs).
    fn relaying(&self) -> bool {
        self.written > self.limit
    }

    /// The body outgrew the size limit: from now on the fill only carries it to its readers.
    fn start_relay(&mut self) {
        self.body.relay.store(true, Ordering::Release);
        // no reader joins from now on: lookups fetch for themselves, as for any pass
        self.tier.fills.remove(self.key, self.write_id.into());
        self.buffer = BodyBuffer::Heap(BytesMut::new());
    }

    /// Lets go of the chunks every reader has passed, then waits while a reader in another
    /// request is more than [`RELAY_WINDOW`] behind. A reader that takes nothing for
    /// [`STALLED_RELAY_READER`] is cut off. An error once no reader is left: nobody wants the
    /// rest of the body (the writer then stops, as a fill abandoned for its size did before).
    async fn keep_relay_in_step(&self) -> Result<()> {
        loop {
            let moved = self.body.reader_moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let Some(lagging) = self.body.trim_relay() else {
                return Error::e_explain(
                    ErrorType::InternalError,
                    "cache fill over cache.max_object_size has no reader left",
                );
            };
            if lagging.is_empty() {
                return Ok(());
            }
            if tokio::time::timeout(STALLED_RELAY_READER, moved)
                .await
                .is_err()
            {
                for reader in lagging {
                    if !reader.owner {
                        reader.detached.store(true, Ordering::Release);
                    }
                }
                // they learn at their next read; the state's change wakes one waiting now
                self.body.state.send_modify(|_| {});
            }
        }
    }
}

impl FillBody {
    /// Whether a hard purge let go of the fill ([`InFlightFills::disown`]): lookups skip it, but
    /// it stays listed so its own request still finds it by write id.
    fn is_disowned(&self) -> bool {
        self.disowned.load(Ordering::Acquire)
    }

    /// A relaying fill's housekeeping: drops the chunks every live reader has passed; returns
    /// the readers in other requests that are more than [`RELAY_WINDOW`] behind, or `None`
    /// when no reader is left.
    fn trim_relay(&self) -> Option<Vec<Arc<ReaderPosition>>> {
        let mut chunks = self.chunks.write();
        let mut readers = self.readers.lock();
        readers.retain(|r| r.strong_count() > 0);
        let live: Vec<Arc<ReaderPosition>> = readers
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|r| !r.detached.load(Ordering::Acquire))
            .collect();
        drop(readers);
        let written = chunks.written();
        let Some(slowest) = live
            .iter()
            .map(|r| r.next_chunk.load(Ordering::Acquire))
            .min()
        else {
            chunks.drop_before(written);
            return None;
        };
        chunks.drop_before(slowest);
        let lagging = live
            .into_iter()
            .filter(|r| {
                !r.owner && chunks.held_from(r.next_chunk.load(Ordering::Acquire)) > RELAY_WINDOW
            })
            .collect();
        Some(lagging)
    }
}

/// The body length the stored response head declares, if it does (one valid `Content-Length`).
fn declared_length(meta: &StoredMeta) -> Option<usize> {
    let mut values = meta
        .header
        .headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok()?.parse().ok()
}

/// The memory a fill's body is copied into: one allocation of the declared length, handed out
/// as a slice per incoming chunk, so the stored body owns exactly one block of exactly its size;
/// for a large body that block is a memory mapping of its own ([`MappedBody::for_body`]).
/// A body of undeclared length, a chunk that would overrun the declared length, and a declared
/// length over `cache.max_object_size` (the object will not be kept) get a buffer per chunk.
enum BodyBuffer {
    Heap(BytesMut),
    Mapped(MappedBody),
}

impl BodyBuffer {
    fn new(declared: Option<usize>, max_object_size: usize) -> Self {
        let capacity = declared.filter(|&n| n <= max_object_size).unwrap_or(0);
        match MappedBody::for_body(capacity) {
            Some(mapped) => BodyBuffer::Mapped(mapped),
            None => BodyBuffer::Heap(BytesMut::with_capacity(capacity)),
        }
    }

    /// A copy of `data` the stored body can keep.
    fn copy(&mut self, data: &[u8]) -> Bytes {
        match self {
            BodyBuffer::Mapped(mapped) => mapped.copy(data).unwrap_or_else(|| owned_chunk(data)),
            BodyBuffer::Heap(spare) => {
                if spare.capacity() - spare.len() < data.len() {
                    return owned_chunk(data);
                }
                spare.extend_from_slice(data);
                if spare.len() == spare.capacity() {
                    // the last chunk (or the only one: then the body is a plain exact-size `Bytes`)
                    std::mem::take(spare).freeze()
                } else {
                    spare.split().freeze()
                }
            }
        }
    }

    /// The memory file whose bytes are the whole body, when its mapping has one and every
    /// chunk went into it.
    fn file(&self) -> Option<super::BodyFile> {
        match self {
            BodyBuffer::Mapped(mapped) => mapped.file(),
            BodyBuffer::Heap(_) => None,
        }
    }

    /// Whether part of the allocation was never written: the body came out shorter than declared.
    fn has_unused_room(&self) -> bool {
        match self {
            BodyBuffer::Mapped(mapped) => mapped.has_unused_room(),
            BodyBuffer::Heap(spare) => spare.capacity() > 0,
        }
    }
}

#[async_trait]
impl HandleMiss for MemoryMiss {
    async fn write_body(&mut self, data: Bytes, _eof: bool) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let was_relaying = self.relaying();
        self.written += data.len();
        if !was_relaying && self.relaying() {
            self.start_relay();
        }
        let count = {
            // a relayed chunk is not kept: it is held only until its readers have it
            let chunk = match self.relaying() {
                true => data,
                false => self.buffer.copy(&data),
            };
            let mut chunks = self.body.chunks.write();
            chunks.push(chunk);
            chunks.written()
        };
        // completion itself is signalled by `finish`, after the object is indexed
        self.body.state.send_replace(FillState::Partial(count));
        if self.relaying() {
            self.keep_relay_in_step().await?;
        }
        Ok(())
    }

    async fn finish(self: Box<Self>) -> Result<MissFinishType> {
        Ok((*self).finish_fill()?.0)
    }

    fn streaming_write_tag(&self) -> Option<&[u8]> {
        Some(self.write_id.as_bytes())
    }
}

/// A handle on one fill by which something other than its writer lets go of it, as
/// [`MemoryMiss::refuse`] does (`storage::guarded_fills`: a fill whose guard went while it
/// streams), this fill alone: another fill of the same key is not touched.
#[derive(Clone)]
pub struct FillLetGo(Arc<FillBody>);

impl FillLetGo {
    /// Lets go of the fill: no lookup joins it from now on, nothing of it is stored, its
    /// readers get the rest. Whether it was held until now.
    pub fn let_go(&self) -> bool {
        !self.0.disowned.swap(true, Ordering::AcqRel)
    }
}

impl MemoryMiss {
    /// A handle by which this fill can be let go of from elsewhere ([`FillLetGo`]).
    pub fn let_go_handle(&self) -> FillLetGo {
        FillLetGo(self.body.clone())
    }

    /// Lets go of this fill as a hard purge does ([`InFlightFills::disown`]), for this fill
    /// alone: nothing of it will be stored, no lookup joins it, its readers get the rest. For a
    /// fill its caller will not keep (`FillLeases::on_unguarded_fill`).
    pub fn refuse(&self) {
        self.body.disowned.store(true, Ordering::Release);
    }

    /// Ends the fill: the object is indexed (unless admission or a ban refuses it) and lookups
    /// are woken. In near-cache mode, an object stored is returned trusted until the caller has
    /// written it to the shared tier: that object, not whatever the key holds by then.
    pub fn finish_fill(mut self) -> Result<(MissFinishType, Option<SharedWriteInFlight>)> {
        if self.relaying() || self.body.is_disowned() {
            // the readers have every byte; nothing is stored
            self.body.state.send_replace(FillState::Complete);
            self.finished = true;
            // a fill disowned by a purge is still listed, so its own request finds it by write id
            // (a size relay was unlisted at once)
            self.tier.fills.remove(self.key, self.write_id.into());
            return Ok((MissFinishType::Created(0), None));
        }
        let chunks: Vec<Bytes> = self.body.chunks.read().list.iter().cloned().collect();
        let body = if self.buffer.has_unused_room() {
            // shorter than declared: keep an exact copy, not the whole declared allocation
            super::owned_body(&chunks)
        } else {
            Body::from_chunks(chunks).with_file(self.buffer.file())
        };
        let size = body.len();
        // a body stored without its length (sent chunked, compressed on store) is now whole;
        // one that came as long as its head said (nearly every one) is framed already
        let as_declared =
            self.declared == Some(size) && self.meta.header.status != http::StatusCode::NO_CONTENT;
        let meta = match (!as_declared).then(|| framed_by_length(&self.meta, size)) {
            Some(Some(framed)) => Arc::new(framed),
            _ => self.meta.clone(),
        };
        // index the complete object before dropping the in-flight entry, so lookups never see a gap
        let scopes = self.scopes.take();
        let shared_write = self
            .tier
            .insert(
                self.key,
                self.primary,
                meta,
                body,
                scopes,
                super::Source::Fetched,
            )
            .and_then(|object| self.tier.awaits_shared_write(object));
        self.body.state.send_replace(FillState::Complete);
        self.finished = true;
        self.tier.fills.remove(self.key, self.write_id.into());
        Ok((MissFinishType::Created(size), shared_write))
    }
}

impl Drop for MemoryMiss {
    fn drop(&mut self) {
        if !self.finished {
            self.body.state.send_replace(FillState::Aborted);
            self.tier.fills.remove(self.key, self.write_id.into());
        }
    }
}

/// Reads an in-flight fill chunk by chunk, waiting for the writer when it has caught up.
pub(super) struct StreamingHit {
    body: Arc<FillBody>,
    state: watch::Receiver<FillState>,
    position: Arc<ReaderPosition>,
}

impl StreamingHit {
    /// A reader from the first chunk of `body`; `owner` for the filling request's own reader.
    pub(super) fn new(body: Arc<FillBody>, owner: bool) -> Self {
        let state = body.state.subscribe();
        let position = Arc::new(ReaderPosition {
            next_chunk: AtomicUsize::new(0),
            owner,
            detached: AtomicBool::new(false),
        });
        {
            // under the chunks' lock, so a relay's trim counts it or is seen by it
            let chunks = body.chunks.read();
            if chunks.first > 0 {
                // the fill turned into a relay and let go of its start just now
                position.detached.store(true, Ordering::Relaxed);
            }
            body.readers.lock().push(Arc::downgrade(&position));
        }
        StreamingHit {
            body,
            state,
            position,
        }
    }

    /// Whether this reader is the filling request's own, of a fill that became a relay, and
    /// more than [`RELAY_WINDOW`] behind it. `reads_no_more`: it will not be read again (its
    /// client left, or had its whole answer), so it must hold nothing back (it is detached, and
    /// the answer is `false`).
    pub(super) fn holds_back_relay(&self, reads_no_more: bool) -> bool {
        if !self.position.owner || !self.body.relay.load(Ordering::Acquire) {
            return false;
        }
        if reads_no_more {
            self.position.detached.store(true, Ordering::Release);
            self.body.reader_moved.notify_one();
            return false;
        }
        let next = self.position.next_chunk.load(Ordering::Relaxed);
        self.body.chunks.read().held_from(next) > RELAY_WINDOW
    }

    /// The next chunk; `None` once the fill is complete and read; an error if it was abandoned.
    pub(super) async fn read(&mut self) -> Result<Option<Bytes>> {
        loop {
            let state = *self.state.borrow_and_update();
            if self.position.detached.load(Ordering::Acquire) {
                return Error::e_explain(
                    ErrorType::InternalError,
                    "cache fill turned into a relay that this reader fell behind",
                );
            }
            {
                let chunks = self.body.chunks.read();
                let next = self.position.next_chunk.load(Ordering::Relaxed);
                if next < chunks.written() {
                    let chunk = chunks.list[next - chunks.first].clone();
                    self.position.next_chunk.store(next + 1, Ordering::Release);
                    drop(chunks);
                    if self.body.relay.load(Ordering::Acquire) {
                        self.body.reader_moved.notify_one();
                    }
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

impl Drop for StreamingHit {
    fn drop(&mut self) {
        if self.body.relay.load(Ordering::Acquire) {
            self.body.reader_moved.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{meta, read_all};
    use super::super::MemoryTier;
    use bytes::Bytes;
    use pingora_cache::storage::Storage;
    use pingora_cache::trace::Span;
    use pingora_cache::CacheKey;

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

    #[tokio::test]
    async fn a_purged_fill_finishes_for_its_readers_and_stores_nothing() {
        use crate::storage::ban_list::scope::Scope;
        use pingora_cache::key::CacheHashKey;
        let tier = MemoryTier::new(4 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/purged", "");
        let mut miss = tier.get_miss_handler(&key, &meta(), &span).await.unwrap();
        let (_, mut owner) = tier
            .lookup_streaming_write(&key, miss.streaming_write_tag(), &span)
            .await
            .unwrap()
            .unwrap();
        let (_, mut joined) = tier.lookup(&key, &span).await.unwrap().unwrap();
        miss.write_body(Bytes::from_static(b"before "), false)
            .await
            .unwrap();
        let primary = super::super::key_of(key.primary_bin());
        tier.invalidate(&Scope::Url(primary), std::time::SystemTime::now(), false);
        // no lookup joins it now, and the fast path does not wait for it
        assert!(tier.lookup(&key, &span).await.unwrap().is_none());
        assert!(!tier.fills.is_filling(primary));
        // its own request still finds it by write id
        let again = tier
            .lookup_streaming_write(&key, miss.streaming_write_tag(), &span)
            .await
            .unwrap();
        assert!(again.is_some(), "the filling request's reader");
        miss.write_body(Bytes::from_static(b"after"), true)
            .await
            .unwrap();
        miss.finish().await.unwrap();
        assert_eq!(read_all(&mut owner).await, b"before after");
        assert_eq!(read_all(&mut joined).await, b"before after");
        assert!(
            tier.lookup(&key, &span).await.unwrap().is_none(),
            "not stored"
        );
        assert_eq!(tier.fills.count(), 0, "unlisted once finished");
    }

    #[tokio::test]
    async fn a_purged_fill_waits_for_no_reader() {
        use crate::storage::ban_list::scope::Scope;
        use pingora_cache::key::CacheHashKey;
        let tier = MemoryTier::new(16 << 20, 8 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/purged-stalled", "");
        let mut miss = tier.get_miss_handler(&key, &meta(), &span).await.unwrap();
        // a reader in another request that reads nothing yet
        let (_, mut stalled) = tier.lookup(&key, &span).await.unwrap().unwrap();
        miss.write_body(piece(256 << 10, 0), false).await.unwrap();
        let primary = super::super::key_of(key.primary_bin());
        tier.invalidate(&Scope::Url(primary), std::time::SystemTime::now(), false);
        // far more than a relay's window past the stalled reader: no write waits for it
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for i in 1..12u8 {
            let mut write = Box::pin(miss.write_body(piece(256 << 10, i), false));
            assert!(
                std::future::Future::poll(write.as_mut(), &mut cx).is_ready(),
                "write {i} waited"
            );
        }
        miss.finish().await.unwrap();
        let expected: Vec<u8> = (0..12u8).flat_map(|i| vec![i; 256 << 10]).collect();
        assert_eq!(read_all(&mut stalled).await, expected);
        assert!(
            tier.lookup(&key, &span).await.unwrap().is_none(),
            "not stored"
        );
        assert_eq!(tier.fills.count(), 0, "unlisted once finished");
    }

    /// `n` bytes, all `byte`.
    fn piece(n: usize, byte: u8) -> Bytes {
        Bytes::from(vec![byte; n])
    }

    #[tokio::test]
    async fn a_fill_past_the_size_limit_relays_to_its_readers_and_stores_nothing() {
        use super::RELAY_WINDOW;
        // max_object_size 1 MiB
        let tier = MemoryTier::new(16 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/big", "");
        let mut miss = tier.get_miss_handler(&key, &meta(), &span).await.unwrap();
        let (_, mut owner) = tier
            .lookup_streaming_write(&key, miss.streaming_write_tag(), &span)
            .await
            .unwrap()
            .unwrap();
        let (_, mut other) = tier.lookup(&key, &span).await.unwrap().unwrap();
        let quarter = 256 << 10;
        assert_eq!(RELAY_WINDOW, 4 * quarter);
        for i in 0..4 {
            miss.write_body(piece(quarter, i), false).await.unwrap();
        }
        let mut read = other.read_body().await.unwrap().unwrap().to_vec();
        read.extend_from_slice(&other.read_body().await.unwrap().unwrap());
        // the limit is crossed: lookups no longer join the fill; `other` is 3 pieces behind
        miss.write_body(piece(quarter, 4), false).await.unwrap();
        assert!(tier.lookup(&key, &span).await.unwrap().is_none());
        // now more than a window behind (4 pieces and their chunks' weight): the writer waits
        let mut write = Box::pin(miss.write_body(piece(quarter, 5), false));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(std::future::Future::poll(write.as_mut(), &mut cx).is_pending());
        read.extend_from_slice(&other.read_body().await.unwrap().unwrap());
        write.await.unwrap();
        // the owner is not waited for (its proxy loop keeps it in step): it has read nothing
        let writing = async move {
            miss.write_body(piece(quarter, 6), true).await.unwrap();
            miss.finish().await.unwrap();
        };
        let reading = async {
            while let Some(chunk) = other.read_body().await.unwrap() {
                read.extend_from_slice(&chunk);
            }
        };
        tokio::join!(writing, reading);
        let mut owner_read = Vec::new();
        while let Some(chunk) = owner.read_body().await.unwrap() {
            owner_read.extend_from_slice(&chunk);
        }
        let expected: Vec<u8> = (0..7u8).flat_map(|i| vec![i; quarter]).collect();
        assert_eq!(read, expected, "a reader in another request");
        assert_eq!(owner_read, expected, "the filling request's own reader");
        assert!(
            tier.lookup(&key, &span).await.unwrap().is_none(),
            "not stored"
        );
    }

    #[tokio::test]
    async fn a_relay_lets_go_of_what_its_readers_passed_and_ends_when_none_is_left() {
        let tier = MemoryTier::new(16 << 20, 1 << 20, 1024).leak();
        let span = Span::inactive().handle();
        let key = CacheKey::new("/big", "");
        let mut miss = tier.get_miss_handler(&key, &meta(), &span).await.unwrap();
        let (_, mut reader) = tier.lookup(&key, &span).await.unwrap().unwrap();
        let fill = tier.fills.joinable(
            super::super::key_of(pingora_cache::key::CacheHashKey::combined_bin(&key)),
            None,
        );
        let (_, body) = fill.unwrap();
        for i in 0..8u8 {
            miss.write_body(piece(256 << 10, i), false).await.unwrap();
            let chunk = reader.read_body().await.unwrap().unwrap();
            assert_eq!(chunk, piece(256 << 10, i));
        }
        // past the limit, what the only reader has read is let go at the next write
        miss.write_body(piece(10, 9), false).await.unwrap();
        let held: usize = body.chunks.read().list.iter().map(Bytes::len).sum();
        assert_eq!(held, 10);
        // the reader leaves: no one wants the rest, the writer is told so
        drop(reader);
        assert!(miss.write_body(piece(10, 10), false).await.is_err());
    }

    #[test]
    fn a_declared_body_is_one_allocation_sliced_per_chunk() {
        let mut buffer = super::BodyBuffer::new(Some(11), 1 << 20);
        let hello = buffer.copy(b"hello ");
        assert!(buffer.has_unused_room());
        let world = buffer.copy(b"world");
        assert_eq!((&hello[..], &world[..]), (&b"hello "[..], &b"world"[..]));
        assert_eq!(
            hello.as_ptr() as usize + hello.len(),
            world.as_ptr() as usize
        );
        assert!(!buffer.has_unused_room());
        // beyond the declared length: a buffer of its own
        assert_eq!(&buffer.copy(b"!")[..], b"!");
    }

    #[test]
    fn an_undeclared_or_oversized_body_gets_a_buffer_per_chunk() {
        for mut buffer in [
            super::BodyBuffer::new(None, 1 << 20),
            super::BodyBuffer::new(Some(2 << 20), 1 << 20),
        ] {
            assert!(!buffer.has_unused_room());
            let a = buffer.copy(b"abc");
            let b = buffer.copy(b"def");
            assert_eq!((&a[..], &b[..]), (&b"abc"[..], &b"def"[..]));
        }
    }
}
