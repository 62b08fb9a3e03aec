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
use http::HeaderName;
use pingora_http::ResponseHeader;
use std::cell::RefCell;
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
    if usize::from(count) > MAX_STORED_FIELDS {
        // a head no origin can send (and a map the fields Lacquer adds to it would overflow)
        return Err(EntryError::Malformed("too many header fields"));
    }
    // The head is built as `ResponseHeader::build_no_case(status, hint)` builds it, and its
    // fields appended as `append_header` appends them to a head without a case map, but on the
    // field map itself: through `append_header`, each field paid about 70 instructions of
    // conversions and error wrapping around the append.
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status =
        http::StatusCode::from_u16(status).map_err(|_| EntryError::Malformed("bad status"))?;
    parts
        .headers
        .reserve((usize::from(count) + FIELDS_ADDED_PER_HIT).min(MAX_RESERVED_FIELDS));
    for _ in 0..count {
        let name_len = reader.u16()? as usize;
        let name = field_name(reader.take(name_len)?)?;
        let value_len = reader.u32()? as usize;
        let raw = without_surrounding_whitespace(reader.slice_of(value, value_len)?);
        let field = http::HeaderValue::from_maybe_shared(raw)
            .map_err(|_| EntryError::Malformed("bad header value"))?;
        // fails only past the map's largest size
        parts
            .headers
            .try_append(name, field)
            .map_err(|_| EntryError::Malformed("bad header name"))?;
    }
    let header = ResponseHeader::from(parts);
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

/// The most header fields an entry's head may have: Pingora reads an origin's head of at most
/// 256 fields, and Lacquer adds a few; room to spare for an application's own entries. A planted
/// head of 24,576 fields made every node panic on adding `Content-Length` or `Age` to its map
/// (past `http`'s largest map), on every request of its URL.
pub const MAX_STORED_FIELDS: usize = 1024;

/// A field value without the spaces and tabs around it, as an HTTP/1 parser reads a field line
/// (RFC 9110 §5.5): a value from an entry, written by anyone with access to memcached, must be
/// one an HTTP/2 client accepts too (RFC 9113 §8.2.1 makes surrounding whitespace malformed).
fn without_surrounding_whitespace(mut value: Bytes) -> Bytes {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    if value.first().is_some_and(is_ows) || value.last().is_some_and(is_ows) {
        let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
        let end = value
            .iter()
            .rposition(|b| !is_ows(b))
            .map_or(start, |i| i + 1);
        value = value.slice(start..end);
    }
    value
}

/// The most fields a decoded head's map reserves room for, as `pingora_http` bounds a size
/// hint (its `http_header_map_upper_bound`): a count of up to 65,535 is the entry's word.
const MAX_RESERVED_FIELDS: usize = 4096;

/// Sets of [`FieldNames`] (two names each).
const NAME_SETS: usize = 64;
/// The longest name [`FieldNames`] keeps: a longer one is parsed each time it is read.
const NAME_KEPT_MAX: usize = 64;

/// The field names last parsed from entries, by the bytes they were parsed from: two per set,
/// the set chosen by a few of the bytes.
///
/// Every field of every entry read from memcached had its name parsed (`HeaderName::from_bytes`:
/// each byte mapped and checked, the standard names matched, a custom one copied): about 240
/// instructions a field, a quarter of a decode, though an origin's entries carry the same few
/// names over and over. Parsing is a function of the bytes alone, so bytes equal to bytes already
/// parsed are the same name, and a name kept is served as a clone; any other bytes, a hostile
/// name among them, are parsed, and refused when they are not a name. A name refused is never
/// kept, and what a hostile writer can do to the table is push names out of it.
struct FieldNames {
    sets: [[Option<KeptName>; 2]; NAME_SETS],
}

/// A name in [`FieldNames`]: the bytes it was parsed from, and what they parsed into.
type KeptName = (Box<[u8]>, HeaderName);

thread_local! {
    static FIELD_NAMES: RefCell<FieldNames> = const {
        RefCell::new(FieldNames {
            sets: [const { [const { None }, const { None }] }; NAME_SETS],
        })
    };
}

/// The set of [`FieldNames`] that keeps the name parsed from `raw` (not empty).
fn name_set(raw: &[u8]) -> usize {
    let n = raw.len();
    let mixed = (n as u64)
        | u64::from(raw[0]) << 8
        | u64::from(raw[n / 4]) << 16
        | u64::from(raw[n / 2]) << 24
        | u64::from(raw[3 * n / 4]) << 32
        | u64::from(raw[n - 1]) << 40;
    (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % NAME_SETS
}

/// The field name stored as `raw`, as `HeaderName::from_bytes` parses it (names are stored in
/// lower case, but one in capitals is read as it always was), from [`FieldNames`] when the same
/// bytes were parsed before; a malformed entry when `raw` is not a valid name.
fn field_name(raw: &[u8]) -> Result<HeaderName, EntryError> {
    let parse = |raw: &[u8]| {
        HeaderName::from_bytes(raw).map_err(|_| EntryError::Malformed("bad header name"))
    };
    if raw.is_empty() || raw.len() > NAME_KEPT_MAX {
        return parse(raw);
    }
    let set = name_set(raw);
    FIELD_NAMES.with(|names| {
        let mut names = names.borrow_mut();
        let ways = &mut names.sets[set];
        for (kept, name) in ways.iter().flatten() {
            if **kept == *raw {
                return Ok(name.clone());
            }
        }
        let name = parse(raw)?;
        // the newer in the first way, the one it pushes aside in the second
        ways.swap(0, 1);
        ways[0] = Some((raw.into(), name.clone()));
        Ok(name)
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

    /// A complete entry for key `k` whose head has the fields `fields` exactly as given (names
    /// and values as raw bytes, as an application might write them), and whose field count is
    /// `count` (the number of fields when `None`).
    fn raw_entry(fields: &[(&[u8], &[u8])], count: Option<u16>, body: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        put_prefix(&mut out, Kind::Complete, "k");
        out.put_u64(1_795_000_000_123);
        out.put_u64(1_795_000_000_123);
        out.put_u64(1_795_000_060_123);
        out.put_u32(0);
        out.put_u32(0);
        out.put_u8(0);
        out.put_u16(200);
        out.put_u16(count.unwrap_or(fields.len() as u16));
        for (name, value) in fields {
            out.put_u16(name.len() as u16);
            out.put_slice(name);
            out.put_u32(value.len() as u32);
            out.put_slice(value);
        }
        out.put_u64(body.len() as u64);
        out.put_slice(body);
        seal(out)
    }

    /// The head's fields, in order, as names and values.
    fn fields_of(header: &ResponseHeader) -> Vec<(String, Vec<u8>)> {
        header
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect()
    }

    /// Names and values are untrusted: a name that is not a field name, a value with a control
    /// byte, a length past the value's end, or more fields counted than written, is a malformed
    /// entry, read once or again (the second read of a name is looked up where the names read
    /// before are kept), and a bad name is refused where a valid one read before is kept in the
    /// set it falls in.
    #[test]
    fn hostile_names_values_and_lengths_are_refused() {
        let good: &[u8] = b"text/html";
        let bad_names: [&[u8]; 10] = [
            b"",
            b"content type",
            b"content-type:",
            b"content-typ\0",
            b"x-a\r\nx-b",
            b"x-\xff",
            b"x-\xc3\xa9",
            b"(x)",
            b"x\ty",
            b"x-a-name-longer-than-those-kept-with-a space-in-it-and-more-bytes-to-go",
        ];
        for _ in 0..2 {
            // a valid name of each length read first, kept where a bad one may look
            for name in bad_names {
                let valid = vec![b'a'; name.len().max(1)];
                let value = raw_entry(&[(&valid, good)], None, b"body");
                assert!(decode(&value, "k").is_ok(), "{}", name.len());
            }
            for name in bad_names {
                let value = raw_entry(&[(b"content-type", good), (name, good)], None, b"body");
                assert_eq!(
                    decode(&value, "k").unwrap_err(),
                    EntryError::Malformed("bad header name"),
                    "{:?}",
                    String::from_utf8_lossy(&name[..name.len().min(20)])
                );
            }
        }
        // bytes that differ from a kept name's only where the set is not chosen by
        for bad in [
            &b"c ntent-type"[..],
            b"c\0ntent-type",
            b"c\rntent-type",
            b"c:ntent-type",
        ] {
            assert_eq!(name_set(bad), name_set(b"content-type"));
            let kept = raw_entry(&[(b"content-type", good)], None, b"body");
            assert!(decode(&kept, "k").is_ok());
            let value = raw_entry(&[(bad, good)], None, b"body");
            assert_eq!(
                decode(&value, "k").unwrap_err(),
                EntryError::Malformed("bad header name")
            );
        }
        for bad in [
            &b"a\rb"[..],
            b"a\nb",
            b"a\0b",
            b"\x7f",
            b"v\r\nx-injected: 1",
        ] {
            let value = raw_entry(&[(b"x-field", bad)], None, b"body");
            assert_eq!(
                decode(&value, "k").unwrap_err(),
                EntryError::Malformed("bad header value")
            );
        }
        // lengths pointing past the end: more fields counted than written, a name or a value
        // longer than what follows
        let value = raw_entry(&[(b"x-field", b"v")], Some(2), b"");
        assert!(matches!(decode(&value, "k"), Err(EntryError::Malformed(_))));
        for (at, patch) in [(0usize, [0xffu8, 0xff]), (2 + 7, [0x7f, 0xff])] {
            let mut value = raw_entry(&[(b"x-field", b"v")], None, b"").to_vec();
            // the first field's name length, or the top half of its value length
            let fields = 7 + 1 + 8 * 3 + 4 * 2 + 1 + 2 + 2;
            value[fields + at..fields + at + 2].copy_from_slice(&patch);
            let len = value.len();
            let crc = crc32fast::hash(&value[..len - 4]);
            value[len - 4..].copy_from_slice(&crc.to_be_bytes());
            assert_eq!(
                decode(&Bytes::from(value), "k").unwrap_err(),
                EntryError::Malformed("length overruns value")
            );
        }
    }

    /// A head with many fields, repeated names, names in capitals and names longer than those
    /// kept decodes, read once or again, into the fields parsing each name gives, in order.
    #[test]
    fn many_and_repeated_names_decode_as_parsed_each_time() {
        let long = "x-".repeat(40);
        let names: Vec<String> = (0..300)
            .map(|i| match i % 7 {
                0 => "content-type".to_string(),
                1 => format!("x-field-{}", i % 150),
                2 => "Set-Cookie".to_string(),
                3 => "X-Capitals".to_string(),
                4 => long.clone(),
                5 => format!("x-{i}"),
                _ => "date".to_string(),
            })
            .collect();
        let values: Vec<String> = (0..300).map(|i| format!("value {i}")).collect();
        let fields: Vec<(&[u8], &[u8])> = names
            .iter()
            .zip(&values)
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect();
        let value = raw_entry(&fields, None, b"body");
        let mut expected = ResponseHeader::build_no_case(200, None).unwrap();
        for (name, value) in &fields {
            let name = HeaderName::from_bytes(name).unwrap();
            expected
                .append_header(name, http::HeaderValue::from_bytes(value).unwrap())
                .unwrap();
        }
        for _ in 0..3 {
            let decoded = decode(&value, "k").unwrap();
            assert_eq!(fields_of(&decoded.meta.header), fields_of(&expected));
        }
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
