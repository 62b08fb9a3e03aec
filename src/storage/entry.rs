//! The shared-tier entry format: how a cached response is laid out as memcached values.
//!
//! Applications may write entries themselves (see `docs/entry-format.md`), so the format is small,
//! versioned and self-checking: every value carries the full logical key it belongs to and a
//! CRC-32 of everything before it, so a hash collision, a truncated write or a foreign value is
//! detected and treated as a miss, never served.
//!
//! Three kinds of value exist:
//! * a **complete entry** (head, metadata and body in one value);
//! * a **manifest** for bodies larger than one memcached item: head and metadata plus the list of
//!   body chunks, written *last*, so a reader never assembles a partial object;
//! * a **body chunk**, tied to its manifest by a write id.
//!
//! All integers are big-endian.

use super::object::{StoredMeta, FIELDS_ADDED_PER_HIT};
use bytes::{BufMut, Bytes, BytesMut};
use pingora_http::ResponseHeader;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// First bytes of every value.
pub const MAGIC: &[u8; 2] = b"LQ";
/// Current format version.
pub const VERSION: u8 = 1;

/// The most chunks a manifest may list (64 GiB in 1 MiB items): a reader builds one key per
/// chunk before it asks, so a corrupt or hostile count must not make it build billions.
pub const MAX_CHUNKS: u32 = 1 << 16;

/// What a value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Head, metadata and the whole body.
    Complete = 1,
    /// Head, metadata and the list of body chunks.
    Manifest = 2,
    /// One slice of a body.
    Chunk = 3,
}

/// Why a value was rejected. Every rejection is a miss, counted by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryError {
    /// Too short, bad magic, unknown version or kind, or a length that overruns the value.
    Malformed(&'static str),
    /// The CRC-32 does not match: truncated or corrupted.
    Checksum,
    /// A valid value, but for another logical key (hash collision or foreign writer).
    WrongKey,
}

impl std::fmt::Display for EntryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntryError::Malformed(what) => write!(f, "malformed entry: {what}"),
            EntryError::Checksum => f.write_str("entry checksum mismatch"),
            EntryError::WrongKey => f.write_str("entry belongs to another key"),
        }
    }
}

impl std::error::Error for EntryError {}

/// How a manifest's body is split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkList {
    /// Ties chunks to this manifest, so chunks of an older write are never mixed in.
    pub write_id: u64,
    /// Total body length.
    pub body_len: u64,
    /// Number of chunks.
    pub count: u32,
    /// CRC-32 of the whole body, checked after reassembly.
    pub body_crc: u32,
}

/// A decoded head-carrying value.
#[derive(Debug)]
pub struct DecodedEntry {
    pub meta: StoredMeta,
    pub body: EntryBody,
}

/// The body part of a decoded entry.
#[derive(Debug)]
pub enum EntryBody {
    /// The whole body, inline.
    Inline(Bytes),
    /// The body lives in chunks.
    Chunked(ChunkList),
}

fn millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn put_prefix(out: &mut BytesMut, kind: Kind, key: &str) {
    out.put_slice(MAGIC);
    out.put_u8(VERSION);
    out.put_u8(kind as u8);
    out.put_u8(0); // flags, reserved
    out.put_u16(key.len() as u16);
    out.put_slice(key.as_bytes());
}

fn put_meta(out: &mut BytesMut, meta: &StoredMeta) {
    out.put_u64(millis(meta.created));
    out.put_u64(millis(meta.epoch));
    out.put_u64(millis(meta.fresh_until));
    out.put_u32(meta.stale_while_revalidate_sec);
    out.put_u32(meta.stale_if_error_sec);
    match meta.variance {
        Some(v) => {
            out.put_u8(1);
            out.put_slice(&v);
        }
        None => out.put_u8(0),
    }
    let header = &meta.header;
    out.put_u16(header.status.as_u16());
    let headers: Vec<(String, &[u8])> = header
        .headers
        .iter()
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes()))
        .collect();
    out.put_u16(headers.len() as u16);
    for (name, value) in headers {
        out.put_u16(name.len() as u16);
        out.put_slice(name.as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value);
    }
}

fn seal(mut out: BytesMut) -> Bytes {
    let crc = crc32fast::hash(&out);
    out.put_u32(crc);
    out.freeze()
}

/// Encodes a complete entry (head, metadata, whole body).
pub fn encode_complete(key: &str, meta: &StoredMeta, body: &[Bytes]) -> Bytes {
    let body_len: usize = body.iter().map(Bytes::len).sum();
    let mut out = BytesMut::with_capacity(64 + key.len() + meta.header_bytes() + body_len);
    put_prefix(&mut out, Kind::Complete, key);
    put_meta(&mut out, meta);
    out.put_u64(body_len as u64);
    for chunk in body {
        out.put_slice(chunk);
    }
    seal(out)
}

/// Encodes a manifest for a body stored in chunks.
pub fn encode_manifest(key: &str, meta: &StoredMeta, chunks: &ChunkList) -> Bytes {
    let mut out = BytesMut::with_capacity(96 + key.len() + meta.header_bytes());
    put_prefix(&mut out, Kind::Manifest, key);
    put_meta(&mut out, meta);
    out.put_u64(chunks.write_id);
    out.put_u64(chunks.body_len);
    out.put_u32(chunks.count);
    out.put_u32(chunks.body_crc);
    seal(out)
}

/// Encodes body chunk `index` of write `write_id`.
pub fn encode_chunk(key: &str, write_id: u64, index: u32, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(32 + key.len() + data.len());
    put_prefix(&mut out, Kind::Chunk, key);
    out.put_u64(write_id);
    out.put_u32(index);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
    seal(out)
}

/// A bounds-checked reader over a value.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EntryError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|end| *end <= self.data.len())
            .ok_or(EntryError::Malformed("length overruns value"))?;
        let slice = &self.data[self.pos..end];
        self.pos = end;
        Ok(slice)
    }
    /// The next `n` bytes as a slice of `whole`, the value this reader reads (no copy).
    fn slice_of(&mut self, whole: &Bytes, n: usize) -> Result<Bytes, EntryError> {
        let start = self.pos;
        self.take(n)?;
        Ok(whole.slice(start..self.pos))
    }
    fn u8(&mut self) -> Result<u8, EntryError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, EntryError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, EntryError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, EntryError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Checks magic, version, checksum and key; returns the kind and a reader past the key.
fn open<'a>(value: &'a [u8], expected_key: &str) -> Result<(Kind, Reader<'a>), EntryError> {
    if value.len() < 11 {
        return Err(EntryError::Malformed("too short"));
    }
    if &value[..2] != MAGIC {
        return Err(EntryError::Malformed("bad magic"));
    }
    let (payload, crc) = value.split_at(value.len() - 4);
    if crc32fast::hash(payload) != u32::from_be_bytes(crc.try_into().expect("4 bytes")) {
        return Err(EntryError::Checksum);
    }
    let mut reader = Reader {
        data: payload,
        pos: 2,
    };
    if reader.u8()? != VERSION {
        return Err(EntryError::Malformed("unknown version"));
    }
    let kind = match reader.u8()? {
        1 => Kind::Complete,
        2 => Kind::Manifest,
        3 => Kind::Chunk,
        _ => return Err(EntryError::Malformed("unknown kind")),
    };
    let _flags = reader.u8()?;
    let key_len = reader.u16()? as usize;
    if reader.take(key_len)? != expected_key.as_bytes() {
        return Err(EntryError::WrongKey);
    }
    Ok((kind, reader))
}

/// Reads the metadata and head that follow the key. `value` is the whole value `reader` reads:
/// the head's names and values are slices of it, not copies (a caller that keeps the head long,
/// as the memory tier does when it promotes an entry, copies it; see
/// [`super::object::with_room_for_hit_fields`]). The head keeps no case map: the format stores
/// names in lower case, and Pingora writes a head without one with the usual capitals
/// (`Content-Type`), as most origins send them.
fn read_meta(reader: &mut Reader<'_>, value: &Bytes) -> Result<StoredMeta, EntryError> {
    let created = from_millis(reader.u64()?);
    let epoch = from_millis(reader.u64()?);
    let fresh_until = from_millis(reader.u64()?);
    let stale_while_revalidate_sec = reader.u32()?;
    let stale_if_error_sec = reader.u32()?;
    let variance = match reader.u8()? {
        0 => None,
        1 => Some(reader.take(16)?.try_into().expect("16 bytes")),
        _ => return Err(EntryError::Malformed("bad variance flag")),
    };
    let status = reader.u16()?;
    let count = reader.u16()?;
    let hint = Some(usize::from(count) + FIELDS_ADDED_PER_HIT);
    let mut header = ResponseHeader::build_no_case(status, hint)
        .map_err(|_| EntryError::Malformed("bad status"))?;
    for _ in 0..count {
        let name_len = reader.u16()? as usize;
        let name = reader.slice_of(value, name_len)?;
        let value_len = reader.u32()? as usize;
        let field = http::HeaderValue::from_maybe_shared(reader.slice_of(value, value_len)?)
            .map_err(|_| EntryError::Malformed("bad header value"))?;
        header
            .append_header(name, field)
            .map_err(|_| EntryError::Malformed("bad header name"))?;
    }
    Ok(StoredMeta {
        fresh_until,
        created,
        epoch,
        stale_while_revalidate_sec,
        stale_if_error_sec,
        variance,
        header,
        wire_head: Default::default(),
    })
}

/// Decodes a complete entry or a manifest for `expected_key`.
pub fn decode(value: &Bytes, expected_key: &str) -> Result<DecodedEntry, EntryError> {
    let (kind, mut reader) = open(value, expected_key)?;
    let meta = match kind {
        Kind::Chunk => return Err(EntryError::Malformed("chunk where an entry was expected")),
        _ => read_meta(&mut reader, value)?,
    };
    let body = match kind {
        Kind::Complete => {
            let len = reader.u64()? as usize;
            let start = reader.pos;
            reader.take(len)?;
            if reader.pos != reader.data.len() {
                return Err(EntryError::Malformed("trailing bytes"));
            }
            EntryBody::Inline(value.slice(start..start + len))
        }
        _ => {
            let list = ChunkList {
                write_id: reader.u64()?,
                body_len: reader.u64()?,
                count: reader.u32()?,
                body_crc: reader.u32()?,
            };
            // every chunk carries at least one byte, and a reader asks for at most MAX_CHUNKS
            if list.count == 0 || u64::from(list.count) > list.body_len || list.count > MAX_CHUNKS {
                return Err(EntryError::Malformed("implausible chunk count"));
            }
            if reader.pos != reader.data.len() {
                return Err(EntryError::Malformed("trailing bytes"));
            }
            EntryBody::Chunked(list)
        }
    };
    Ok(DecodedEntry { meta, body })
}

/// Decodes body chunk `index` of write `write_id` for `expected_key`, returning its data.
pub fn decode_chunk(
    value: &Bytes,
    expected_key: &str,
    write_id: u64,
    index: u32,
) -> Result<Bytes, EntryError> {
    let (kind, mut reader) = open(value, expected_key)?;
    if kind != Kind::Chunk {
        return Err(EntryError::Malformed("entry where a chunk was expected"));
    }
    if reader.u64()? != write_id || reader.u32()? != index {
        return Err(EntryError::Malformed("chunk of another write"));
    }
    let len = reader.u32()? as usize;
    let start = reader.pos;
    reader.take(len)?;
    Ok(value.slice(start..start + len))
}

/// The body of a manifest's `list` from its chunk `values` (in chunk order, as fetched): every
/// chunk present, of this write and `expected_key`, in order, and the whole matching the
/// manifest's length and CRC-32. `None` when anything is missing or wrong: a miss, never a
/// partial or mixed body.
pub fn assemble_chunks(
    values: Vec<Option<Bytes>>,
    expected_key: &str,
    list: &ChunkList,
) -> Option<Vec<Bytes>> {
    if values.len() != list.count as usize {
        return None;
    }
    let mut chunks = Vec::with_capacity(values.len());
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0u64;
    for (i, value) in values.into_iter().enumerate() {
        let data = decode_chunk(&value?, expected_key, list.write_id, i as u32).ok()?;
        crc.update(&data);
        len += data.len() as u64;
        chunks.push(data);
    }
    (len == list.body_len && crc.finalize() == list.body_crc).then_some(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> StoredMeta {
        let mut header = ResponseHeader::build(200, None).unwrap();
        header.append_header("Content-Type", "text/html").unwrap();
        header.append_header("x-multi", "a").unwrap();
        header.append_header("x-multi", "b").unwrap();
        let now = UNIX_EPOCH + Duration::from_millis(1_795_000_000_123);
        StoredMeta {
            fresh_until: now + Duration::from_secs(60),
            created: now,
            epoch: now,
            stale_while_revalidate_sec: 5,
            stale_if_error_sec: 7,
            variance: Some([3u8; 16]),
            header,
            wire_head: Default::default(),
        }
    }

    #[test]
    fn complete_entry_round_trips() {
        let body = vec![Bytes::from_static(b"hello "), Bytes::from_static(b"world")];
        let value = encode_complete("example.com/a", &meta(), &body);
        let decoded = decode(&value, "example.com/a").unwrap();
        assert_eq!(decoded.meta.fresh_until, meta().fresh_until);
        assert_eq!(decoded.meta.variance, Some([3u8; 16]));
        assert_eq!(decoded.meta.stale_if_error_sec, 7);
        assert_eq!(decoded.meta.header.status, 200);
        let multi: Vec<_> = decoded
            .meta
            .header
            .headers
            .get_all("x-multi")
            .iter()
            .collect();
        assert_eq!(multi.len(), 2);
        match decoded.body {
            EntryBody::Inline(b) => assert_eq!(&b[..], b"hello world"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn corruption_truncation_and_foreign_keys_are_rejected() {
        let value = encode_complete("k", &meta(), &[Bytes::from_static(b"body")]);
        assert_eq!(decode(&value, "other").unwrap_err(), EntryError::WrongKey);
        let truncated = value.slice(..value.len() - 3);
        assert!(decode(&truncated, "k").is_err());
        let mut flipped = value.to_vec();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 1;
        assert_eq!(
            decode(&Bytes::from(flipped), "k").unwrap_err(),
            EntryError::Checksum
        );
        assert!(decode(&Bytes::from_static(b"garbage value"), "k").is_err());
        assert!(decode(&Bytes::new(), "k").is_err());
    }

    #[test]
    fn manifest_and_chunks_round_trip() {
        let list = ChunkList {
            write_id: 42,
            body_len: 10,
            count: 2,
            body_crc: crc32fast::hash(b"0123456789"),
        };
        let manifest = encode_manifest("k", &meta(), &list);
        match decode(&manifest, "k").unwrap().body {
            EntryBody::Chunked(got) => assert_eq!(got, list),
            other => panic!("{other:?}"),
        }
        let chunk = encode_chunk("k", 42, 1, b"56789");
        assert_eq!(&decode_chunk(&chunk, "k", 42, 1).unwrap()[..], b"56789");
        assert!(
            decode_chunk(&chunk, "k", 41, 1).is_err(),
            "chunk of an older write"
        );
        assert!(decode_chunk(&chunk, "k", 42, 0).is_err());
        assert!(decode(&chunk, "k").is_err());
    }
}
