//! What a stored response is: decoded metadata plus a body kept as the chunks it arrived in.
//!
//! Pingora's own `MemCache` keeps `CacheMeta` serialized (MessagePack + zstd) and decodes it on
//! every hit. We keep the decoded parts instead and rebuild a `CacheMeta` from them, which costs one
//! header-map clone. Bodies are `Bytes` chunks, so a 50 MB object is never copied into one buffer
//! and a hit hands out reference-counted slices.

use super::memory::BodyFile;
use super::wire_head::KeptWireHead;
use bytes::Bytes;
use pingora_cache::key::HashBinary;
use pingora_cache::CacheMeta;
use pingora_http::ResponseHeader;
use std::time::{Duration, SystemTime};

/// Fixed per-object bookkeeping charged to the memory budget on top of header and body bytes
/// (the object struct, the TinyUFO bucket and index entry, the `Arc`s).
pub const OBJECT_OVERHEAD: usize = 256;

/// Bookkeeping charged per body chunk (the `Bytes` handle and its shared header).
pub const CHUNK_OVERHEAD: usize = 64;

/// Fields a hit adds to the stored head on its way out: `Age`, `Cache-Status`, `Via`, and
/// `Content-Length` when the origin sent none.
pub const FIELDS_ADDED_PER_HIT: usize = 4;

/// A copy of `header` whose field maps have room for [`FIELDS_ADDED_PER_HIT`] more fields, and
/// whose values and case names own their bytes.
///
/// Every hit clones the stored head and adds those fields. A header map clone keeps the index
/// table's size, so a stored head that is full at its size would be rehashed (both the field map
/// and Pingora's case-preserving name map) on every hit: measured, ~860 instructions per hit for
/// a typical 9-field response. Pingora parses a response head into slices of its read buffer
/// (4 KiB or more), which a plain clone would keep alive for as long as the object is stored.
///
/// A head that has the room already (one read from an origin has it: pingora-core patch 0019)
/// is cloned, which keeps its index table and trims its entries, and given its own bytes. One
/// without it grows once and is cloned again, which drops the spare entry capacity the growth
/// reserved and keeps only the larger index table (a few dozen bytes per map).
pub fn with_room_for_hit_fields(header: &ResponseHeader) -> ResponseHeader {
    let mut copy = header.clone();
    copy.own_field_bytes();
    if copy.room_for_fields() >= FIELDS_ADDED_PER_HIT {
        return copy;
    }
    copy.reserve_fields(FIELDS_ADDED_PER_HIT);
    copy.clone()
}

/// Removes the transfer framing an origin's head carried (`Transfer-Encoding`, and with it every
/// `Content-Length`, which it overrides: RFC 9112 §6.3) from a head about to be stored.
///
/// A stored body is the decoded payload, whole: its framing on the way out is decided per answer
/// from its length. Kept, an origin's `Transfer-Encoding: chunked` went out on every HTTP/1.1
/// fast hit beside the `Content-Length` the hit adds for a head without one: a message framed
/// two ways, which a front proxy trusting the length reads as the end of the answer plus the
/// start of another (response splitting; `tests/h2_attacks.rs`).
pub fn drop_transfer_framing(head: &mut ResponseHeader) {
    if head.headers.contains_key(http::header::TRANSFER_ENCODING) {
        head.remove_header(&http::header::TRANSFER_ENCODING);
        head.remove_header(&http::header::CONTENT_LENGTH);
    }
}

/// A copy of `meta` whose head frames a body of `body_len` bytes by that length, when its head
/// does not already (one `Content-Length` equal to it, no `Transfer-Encoding`; a 204 neither);
/// `None` when it does.
///
/// An answer the origin sent chunked, or delimited by closing, or that was compressed on its way
/// into the store, is stored without a length. The memory tier frames it by its length once it
/// is whole, with the reframing a read from memcached gets (`shared_framing::reframe`): otherwise every hit of
/// it went out chunked and a `Range` of it got the whole body (`200`) from this node's memory
/// while another node, reading the same object from memcached, answered `206`.
pub fn framed_by_length(meta: &StoredMeta, body_len: usize) -> Option<StoredMeta> {
    use super::shared_framing::{framing_agrees, reframe};
    if framing_agrees(meta, body_len) {
        return None;
    }
    // (a clone's kept wire head starts empty: it is built from the reframed head)
    let mut framed = meta.clone();
    reframe(&mut framed, body_len).ok()?;
    Some(framed)
}

/// Copies an incoming chunk into a buffer of exactly its size, so a stored body owns exactly the
/// memory it is charged for and never pins a larger network read buffer behind a small slice.
pub fn owned_chunk(data: &[u8]) -> Bytes {
    Bytes::copy_from_slice(data)
}

/// How much later than a node's clock an entry read from memcached may be dated: the clocks of
/// the cluster's nodes, and of applications writing entries, differ by less (NTP keeps them
/// within milliseconds). See [`StoredMeta::dated_ahead`].
pub const CLOCK_SKEW_ALLOWED: Duration = Duration::from_secs(60);

/// The decoded fields of a `CacheMeta`, enough to rebuild an equivalent one on every hit.
#[derive(Debug, Clone)]
pub struct StoredMeta {
    pub fresh_until: SystemTime,
    pub created: SystemTime,
    /// The reference point for `Age`: `updated`, or the epoch override when one was set.
    pub epoch: SystemTime,
    pub stale_while_revalidate_sec: u32,
    pub stale_if_error_sec: u32,
    pub variance: Option<HashBinary>,
    pub header: ResponseHeader,
    /// `header`'s wire form for fast-path hits, built on the first (see [`KeptWireHead`]).
    pub wire_head: KeptWireHead,
}

impl StoredMeta {
    /// When this entry turns stale under a soft purge or ban stamped `since`, or `None` when it
    /// is stale by then anyway. Not later than now: a ban's stamp is rounded up to the
    /// millisecond, and a request that arrives within that millisecond after a soft purge
    /// returned must already find the entry stale. The one rule of both tiers.
    pub fn stale_from(&self, since: SystemTime) -> Option<SystemTime> {
        let since = since.min(SystemTime::now());
        (self.fresh_until > since).then_some(since)
    }

    /// Placeholder metadata for internal entries that are never served.
    pub fn empty() -> Self {
        StoredMeta {
            fresh_until: SystemTime::UNIX_EPOCH,
            created: SystemTime::UNIX_EPOCH,
            epoch: SystemTime::UNIX_EPOCH,
            stale_while_revalidate_sec: 0,
            stale_if_error_sec: 0,
            variance: None,
            header: ResponseHeader::build(200, None).expect("static status"),
            wire_head: KeptWireHead::default(),
        }
    }

    /// When the stored content was last known current: received from the origin, or confirmed
    /// by a 304 since (Pingora keeps `created` from the first fetch and moves the epoch).
    /// Purges and bans cover entries validated before them.
    pub fn validated(&self) -> SystemTime {
        self.created.max(self.epoch)
    }

    /// Whether this entry says it was validated later than `now` by more than clocks differ
    /// ([`CLOCK_SKEW_ALLOWED`]). Such an entry, read from memcached (an application's clock or
    /// code wrong, a node's clock far ahead), would escape every purge and ban issued before its
    /// date (they cover entries validated before them) and stop Lacquer's own writes from
    /// replacing it (a write never replaces a newer answer): it is refused as malformed.
    pub fn dated_ahead(&self, now: SystemTime) -> bool {
        self.validated() > now + CLOCK_SKEW_ALLOWED
    }

    /// Captures the parts of `meta` that survive storage.
    pub fn from_meta(meta: &CacheMeta) -> Self {
        StoredMeta {
            fresh_until: meta.fresh_until(),
            created: meta.created(),
            epoch: meta.epoch(),
            stale_while_revalidate_sec: meta.stale_while_revalidate_sec(),
            stale_if_error_sec: meta.stale_if_error_sec(),
            variance: meta.variance(),
            header: {
                let mut head = with_room_for_hit_fields(meta.response_header());
                drop_transfer_framing(&mut head);
                head
            },
            wire_head: KeptWireHead::default(),
        }
    }

    /// Rebuilds a `CacheMeta` equivalent to the stored one.
    pub fn to_meta(&self) -> CacheMeta {
        let mut meta = CacheMeta::new(
            self.fresh_until,
            self.created,
            self.stale_while_revalidate_sec,
            self.stale_if_error_sec,
            self.header.clone(),
        );
        if self.epoch != self.created {
            meta.set_epoch_override(self.epoch);
        }
        if let Some(variance) = self.variance {
            meta.set_variance(variance);
        }
        meta
    }

    /// Approximate heap bytes of the header (names, values, map overhead).
    pub fn header_bytes(&self) -> usize {
        let fields: usize = self
            .header
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 48)
            .sum();
        // the case-preserving name map doubles the names
        fields * 2 + 128
    }
}

/// A complete body: its chunks and total length, and the memory file they are views of when a
/// large body is kept in one.
#[derive(Debug, Clone, Default)]
pub struct Body {
    chunks: Vec<Bytes>,
    len: usize,
    file: Option<BodyFile>,
}

impl Body {
    /// Builds a body from chunks that own their memory (see [`owned_chunk`]). Empty chunks are
    /// left out: a body is never served as a zero-length piece, which chunked framing would read
    /// as its end.
    pub fn from_chunks(mut chunks: Vec<Bytes>) -> Self {
        chunks.retain(|chunk| !chunk.is_empty());
        let len = chunks.iter().map(Bytes::len).sum();
        Body {
            chunks,
            len,
            file: None,
        }
    }

    /// This body with `file`, whose bytes from its start are this body's chunks, in order (a
    /// file of another length is not kept).
    pub fn with_file(self, file: Option<BodyFile>) -> Self {
        let file = file.filter(|file| file.len() == self.len);
        Body { file, ..self }
    }

    /// The memory file holding the whole body, when it is kept in one: a hit may send it from
    /// there (`sendfile`) rather than from the chunks.
    pub fn file(&self) -> Option<&BodyFile> {
        self.file.as_ref()
    }

    /// Total body length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes charged to a memory budget for this body: data plus per-chunk bookkeeping.
    pub fn charge(&self) -> usize {
        self.len + self.chunks.len() * CHUNK_OVERHEAD
    }

    /// Whether the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stored chunks, in order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }
}

/// Reads a byte range of a chunked body chunk by chunk, without copying.
#[derive(Debug, Clone)]
pub struct RangeCursor {
    /// Next absolute offset to return.
    pos: usize,
    /// Exclusive end offset.
    end: usize,
    /// Index of the chunk holding `pos`, and that chunk's absolute start offset.
    chunk: usize,
    chunk_start: usize,
}

impl RangeCursor {
    /// A cursor over the whole body.
    pub fn whole(len: usize) -> Self {
        RangeCursor {
            pos: 0,
            end: len,
            chunk: 0,
            chunk_start: 0,
        }
    }

    /// Whether the cursor has returned nothing yet of a body of `len` bytes and will return all
    /// of it.
    pub fn is_whole(&self, len: usize) -> bool {
        self.pos == 0 && self.end == len
    }

    /// Repositions to `[start, end)`; `end` beyond the body is clamped.
    pub fn seek(&mut self, len: usize, start: usize, end: Option<usize>) -> Result<(), String> {
        if start >= len && len > 0 {
            return Err(format!("seek start {start} beyond body length {len}"));
        }
        self.pos = start;
        self.end = end.map_or(len, |e| e.min(len));
        self.chunk = 0;
        self.chunk_start = 0;
        Ok(())
    }

    /// Returns the next slice of `chunks` within the range, or `None` at the end.
    pub fn next(&mut self, chunks: &[Bytes]) -> Option<Bytes> {
        if self.pos >= self.end {
            return None;
        }
        while let Some(chunk) = chunks.get(self.chunk) {
            let chunk_end = self.chunk_start + chunk.len();
            if self.pos < chunk_end {
                let from = self.pos - self.chunk_start;
                let to = chunk.len().min(self.end - self.chunk_start);
                self.pos = self.chunk_start + to;
                return Some(chunk.slice(from..to));
            }
            self.chunk += 1;
            self.chunk_start = chunk_end;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn collect(body: &Body, cursor: &mut RangeCursor) -> Vec<u8> {
        let mut out = Vec::new();
        while let Some(b) = cursor.next(body.chunks()) {
            out.extend_from_slice(&b);
        }
        out
    }

    /// An origin's transfer framing never reaches the stored head: `Transfer-Encoding` goes with
    /// every `Content-Length` beside it (which it overrides); a head framed by length alone keeps it.
    #[test]
    fn a_stored_head_drops_the_origins_transfer_framing() {
        let stored = |fields: &[(&str, &str)]| {
            let mut origin = ResponseHeader::build(200, None).unwrap();
            for (name, value) in fields {
                origin.append_header(name.to_string(), *value).unwrap();
            }
            origin.append_header("Cache-Control", "max-age=60").unwrap();
            let now = SystemTime::now();
            let meta = CacheMeta::new(now, now, 0, 0, origin);
            StoredMeta::from_meta(&meta).header
        };
        let chunked = stored(&[("Transfer-Encoding", "chunked")]);
        assert!(!chunked.headers.contains_key("transfer-encoding"));
        assert!(!chunked.headers.contains_key("content-length"));
        let both = stored(&[("Content-Length", "5"), ("Transfer-Encoding", "chunked")]);
        assert!(!both.headers.contains_key("transfer-encoding"));
        assert!(!both.headers.contains_key("content-length"));
        let by_length = stored(&[("Content-Length", "5")]);
        assert_eq!(by_length.headers.get("content-length").unwrap(), "5");
        assert_eq!(
            by_length.headers.get("cache-control").unwrap(),
            "max-age=60"
        );
    }

    #[test]
    fn stored_head_keeps_fields_case_order_and_room_for_the_hit_fields() {
        let mut origin = ResponseHeader::build(203, None).unwrap();
        origin.set_reason_phrase(Some("Cached Elsewhere")).unwrap();
        for (name, value) in [
            ("Content-Type", "text/html"),
            ("X-Custom-Thing", "1"),
            ("link", "</a.css>; rel=preload"),
            ("Link", "</b.js>; rel=preload"),
            ("ETag", "\"v1\""),
        ] {
            origin.append_header(name.to_string(), value).unwrap();
        }
        let stored = with_room_for_hit_fields(&origin);
        assert_eq!(stored.status, origin.status);
        assert_eq!(stored.get_reason_phrase(), Some("Cached Elsewhere"));
        let wire = |h: &ResponseHeader| {
            let mut buf = Vec::new();
            h.header_to_h1_wire(&mut buf);
            String::from_utf8(buf).unwrap()
        };
        assert_eq!(wire(&stored), wire(&origin));
        assert!(wire(&stored).contains("X-Custom-Thing: 1"));
    }

    #[test]
    fn a_hit_adds_its_fields_to_the_stored_head_without_growing_the_maps() {
        // twelve fields fill a header map's sixteen-slot index exactly
        let mut origin = ResponseHeader::build(200, None).unwrap();
        for i in 0..12 {
            origin.append_header(format!("X-Field-{i}"), "v").unwrap();
        }
        let stored = with_room_for_hit_fields(&origin);
        let mut hit = stored.clone();
        let capacity = hit.headers.capacity();
        for name in ["Age", "Cache-Status", "Via", "Content-Length"] {
            hit.insert_header(name, "1").unwrap();
        }
        assert_eq!(hit.headers.capacity(), capacity);
    }

    #[test]
    fn a_head_with_room_is_copied_with_fields_of_its_own() {
        // as Pingora reads a head: values (and case names) are slices of one read buffer, and
        // the maps have room for four more fields (pingora-core patch 0019)
        let buffer = Bytes::from(
            b"Content-Type: text/html\r\nX-Custom-Thing: 1\r\nLink: </a.css>\r\nLink: </b.js>\r\n"
                .repeat(64),
        );
        let mut origin = ResponseHeader::build(200, Some(4 + FIELDS_ADDED_PER_HIT)).unwrap();
        for (name, value) in [
            (0..12, 14..23),
            (25..39, 41..42),
            (44..48, 50..58),
            (60..64, 66..73),
        ] {
            let value = HeaderValue::from_maybe_shared(buffer.slice(value)).unwrap();
            origin.append_header(buffer.slice(name), value).unwrap();
        }
        assert!(origin.room_for_fields() >= FIELDS_ADDED_PER_HIT);
        let stored = with_room_for_hit_fields(&origin);
        let wire = |h: &ResponseHeader| {
            let mut buf = Vec::new();
            h.header_to_h1_wire(&mut buf);
            String::from_utf8(buf).unwrap()
        };
        assert_eq!(wire(&stored), wire(&origin));
        let inside = |p: *const u8| buffer.as_ptr_range().contains(&p);
        assert!(origin
            .headers
            .values()
            .any(|v| inside(v.as_bytes().as_ptr())));
        assert!(
            stored
                .headers
                .values()
                .all(|v| !inside(v.as_bytes().as_ptr())),
            "a stored value still points into the read buffer"
        );
        assert!(origin
            .case_header_iter()
            .any(|(n, _)| inside(n.as_slice().as_ptr())));
        assert!(
            stored
                .case_header_iter()
                .all(|(n, _)| !inside(n.as_slice().as_ptr())),
            "a stored name still points into the read buffer"
        );
        assert!(wire(&stored).contains("X-Custom-Thing: 1\r\n"));
        let mut hit = stored.clone();
        let capacity = hit.headers.capacity();
        for name in ["Age", "Cache-Status", "Via", "Content-Length"] {
            hit.insert_header(name, "1").unwrap();
        }
        assert_eq!(hit.headers.capacity(), capacity);
    }

    #[test]
    fn cursor_reads_ranges_across_chunks() {
        let chunks: Vec<Bytes> = (0..4)
            .map(|i| Bytes::from(vec![b'a' + i as u8; 100_000]))
            .collect();
        let body = Body::from_chunks(chunks);
        assert_eq!(body.len(), 400_000);
        let mut cursor = RangeCursor::whole(body.len());
        assert_eq!(collect(&body, &mut cursor).len(), 400_000);
        cursor.seek(body.len(), 99_998, Some(100_002)).unwrap();
        assert_eq!(collect(&body, &mut cursor), b"aabb");
        assert!(cursor.seek(body.len(), 400_000, None).is_err());
    }

    #[test]
    fn owned_chunks_do_not_share_the_source_buffer() {
        let big = Bytes::from(vec![9u8; 65_536]);
        let small = owned_chunk(&big[..10]);
        assert_eq!(small.len(), 10);
        assert_ne!(small.as_ptr(), big.as_ptr());
    }
}
