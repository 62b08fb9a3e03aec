//! One purge or ban as the cluster's invalidation log carries it: small, self-delimiting and
//! self-checking, so that records appended by many nodes to one memcached value can be read
//! back one by one, and a damaged one skipped.
//!
//! Layout (integers big-endian): record length (2, not counting itself), then
//! `LI` | version 1 | kind (1: url, 2: tag, 3: host, 4: prefix) | flags (bit 0: soft, bit 1:
//! short-lived, see [`Record::short_lived`]) |
//! issued at (8, ms since the Unix epoch) | issuer (8) | sequence (8) |
//! first text (2 + n: the URL's host, the tag, the host, or the prefix's host, empty for every
//! host) | second text (2 + n: the URL's path, or the prefix; empty otherwise) |
//! asked by (1 + n) | CRC-32 of everything after the length (4).

use super::target::Target;
use bytes::{BufMut, Bytes, BytesMut};

const MAGIC: &[u8; 2] = b"LI";
const VERSION: u8 = 1;
/// The longest `asked_by` kept (longer ones are cut).
const MAX_ASKED_BY: usize = 255;
/// The longest text a target may have (a URL's path, a tag, a host, a prefix); longer targets
/// are refused before a record is made.
pub const MAX_TARGET_TEXT: usize = 8192;

/// Which node issued a record, and its place among that node's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordId {
    /// The issuing process's random instance id.
    pub issuer: u64,
    /// Counts that issuer's records from 1.
    pub seq: u64,
}

/// One purge or ban.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: RecordId,
    /// When it was issued: entries created before this are covered (ms since the Unix epoch).
    pub issued_ms: u64,
    /// Mark stale instead of invalid.
    pub soft: bool,
    /// The issuer deleted what it covers from memcached (a hard purge of a URL whose delete its
    /// server answered, and that found no fill lease: a leased fill in flight may be written
    /// after the delete), so the ban need only outlive memory copies and fills in flight: it is
    /// kept for minutes, not for the whole retention.
    pub short_lived: bool,
    pub target: Target,
    /// Who asked, for the logs of every node.
    pub asked_by: String,
}

impl Record {
    /// The record's bytes, length prefix included, ready to append to a log value.
    pub fn encode(&self) -> Bytes {
        let (kind, first, second) = match &self.target {
            Target::Url { host, path } => (1u8, host.as_str(), path.as_str()),
            Target::Tag(tag) => (2, tag.as_str(), ""),
            Target::Host(host) => (3, host.as_str(), ""),
            Target::Prefix { host, prefix } => (4, host.as_deref().unwrap_or(""), prefix.as_str()),
        };
        let asked_by = &self.asked_by[..self.asked_by.floor_char_boundary(MAX_ASKED_BY)];
        let mut body = BytesMut::with_capacity(48 + first.len() + second.len() + asked_by.len());
        body.put_slice(MAGIC);
        body.put_u8(VERSION);
        body.put_u8(kind);
        body.put_u8(u8::from(self.soft) | u8::from(self.short_lived) << 1);
        body.put_u64(self.issued_ms);
        body.put_u64(self.id.issuer);
        body.put_u64(self.id.seq);
        for text in [first, second] {
            body.put_u16(text.len() as u16);
            body.put_slice(text.as_bytes());
        }
        body.put_u8(asked_by.len() as u8);
        body.put_slice(asked_by.as_bytes());
        body.put_u32(crc32fast::hash(&body));
        let mut out = BytesMut::with_capacity(2 + body.len());
        out.put_u16(body.len() as u16);
        out.put_slice(&body);
        out.freeze()
    }
}

/// The records in `log` from byte `from` on, and the offset after the last one found: a reader
/// that keeps the offset reads only what was appended since.
///
/// memcached's `append` is atomic, so a record is never half there: bytes that do not frame a
/// record (a length running past the end, a body without the magic or with a bad CRC) are
/// damaged or planted by whoever else can write to memcached, and the next record may start at
/// any later byte, so the read goes on one byte further. Before, such bytes were taken for a
/// record still being appended and ended the read: two bytes planted in a bucket's key before
/// its first record hid every record appended after them from every node. A well-framed record
/// this node cannot use (another kind or host) is skipped whole.
///
/// The offset returned is the end of `log`: every record in it is whole, and the next one
/// appended starts there. (Until 2026-12-08 it was the end of the last record found, so a value
/// holding only junk was scanned again from its start at every poll: with a crafted megabyte
/// of candidate frames, each asking for a 64 KiB CRC, a node read no log for minutes,
/// `tests/log_overflow_attacks.rs`.)
pub fn decode_from(log: &[u8], from: usize) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut pos = from.min(log.len());
    while let Some(len_bytes) = log.get(pos..pos + 2) {
        let len = usize::from(u16::from_be_bytes([len_bytes[0], len_bytes[1]]));
        match log
            .get(pos + 2..pos + 2 + len)
            .filter(|body| well_framed(body))
        {
            Some(body) => {
                records.extend(decode_one(body));
                pos += 2 + len;
            }
            None => pos += 1,
        }
    }
    (records, log.len())
}

/// Whether `body` is a record's frame: the magic and this version first, field lengths that
/// add up to the body's (each text at most [`MAX_TARGET_TEXT`]), and its CRC-32 last. The
/// lengths are checked before the CRC, which costs the whole body: junk rarely gets that far.
/// (A record of another version is not framed: its bytes are stepped through one by one.)
fn well_framed(body: &[u8]) -> bool {
    let Some((payload, crc)) = body.len().checked_sub(4).map(|at| body.split_at(at)) else {
        return false;
    };
    payload.starts_with(MAGIC)
        && payload.get(2) == Some(&VERSION)
        && fields_fill(payload)
        && crc32fast::hash(payload).to_be_bytes() == crc
}

/// Whether a record payload's length fields (two texts, then `asked_by`) end exactly at its end.
fn fields_fill(payload: &[u8]) -> bool {
    // magic, version, kind, flags, issued, issuer, seq
    const FIXED: usize = 2 + 1 + 1 + 1 + 8 + 8 + 8;
    let text_end = |at: usize| {
        let len = usize::from(u16::from_be_bytes(
            payload.get(at..at + 2)?.try_into().ok()?,
        ));
        (len <= MAX_TARGET_TEXT).then_some(at + 2 + len)
    };
    let Some(second) = text_end(FIXED) else {
        return false;
    };
    let Some(asked_by) = text_end(second) else {
        return false;
    };
    payload
        .get(asked_by)
        .is_some_and(|&len| asked_by + 1 + usize::from(len) == payload.len())
}

/// The record in a well-framed `body` ([`well_framed`]), if this node can use it.
fn decode_one(body: &[u8]) -> Option<Record> {
    let payload = &body[..body.len() - 4];
    let mut r = Reader(payload);
    if r.take(2)? != MAGIC || r.u8()? != VERSION {
        return None;
    }
    let kind = r.u8()?;
    let flags = r.u8()?;
    let issued_ms = r.u64()?;
    let id = RecordId {
        issuer: r.u64()?,
        seq: r.u64()?,
    };
    let first = r.text16()?;
    let second = r.text16()?;
    let asked_by_len = usize::from(r.u8()?);
    let asked_by = String::from_utf8(r.take(asked_by_len)?.to_vec()).ok()?;
    let target = match kind {
        1 => Target::Url {
            host: first,
            path: second,
        },
        2 => Target::Tag(first),
        3 => Target::Host(first),
        4 => Target::Prefix {
            host: (!first.is_empty()).then_some(first),
            prefix: second,
        },
        _ => return None,
    };
    if target.host_problem().is_some() {
        // no node makes one (`Invalidator::invalidate` refuses it): damaged or hostile
        return None;
    }
    Some(Record {
        id,
        issued_ms,
        soft: flags & 1 == 1,
        short_lived: flags & 2 == 2,
        target,
        asked_by,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn text16(&mut self) -> Option<String> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().ok()?);
        String::from_utf8(self.take(usize::from(len))?.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, target: Target) -> Record {
        Record {
            id: RecordId { issuer: 7, seq },
            issued_ms: 1_700_000_000_123,
            soft: seq.is_multiple_of(2),
            short_lived: seq.is_multiple_of(3),
            target,
            asked_by: "127.0.0.1 (deploy)".into(),
        }
    }

    #[test]
    fn records_round_trip_and_are_read_incrementally() {
        let all = [
            record(1, Target::url("Shop.example:81", "/a?b=c")),
            record(2, Target::Tag("product-7".into())),
            record(3, Target::Host("shop.example".into())),
            record(
                4,
                Target::Prefix {
                    host: None,
                    prefix: "/img/".into(),
                },
            ),
            record(
                5,
                Target::Prefix {
                    host: Some("a.test".into()),
                    prefix: "/x".into(),
                },
            ),
        ];
        let mut log = Vec::new();
        for r in &all[..3] {
            log.extend_from_slice(&r.encode());
        }
        let (first, offset) = decode_from(&log, 0);
        assert_eq!(first, all[..3]);
        assert_eq!(offset, log.len());
        // records appended since are read from where the last read ended (memcached appends
        // whole: no record is ever half there)
        log.extend_from_slice(&all[3].encode());
        log.extend_from_slice(&all[4].encode());
        let (rest, end) = decode_from(&log, offset);
        assert_eq!(rest, all[3..]);
        assert_eq!(end, log.len());
    }

    #[test]
    fn a_damaged_record_is_skipped_and_the_rest_read() {
        let mut log = record(1, Target::Tag("a".into())).encode().to_vec();
        let second = log.len();
        log.extend_from_slice(&record(2, Target::Tag("b".into())).encode());
        log[5] ^= 0xff;
        log[second + 10] ^= 0x01;
        log.extend_from_slice(&record(3, Target::Tag("c".into())).encode());
        let (records, end) = decode_from(&log, 0);
        assert_eq!(records, vec![record(3, Target::Tag("c".into()))]);
        assert_eq!(end, log.len());
    }

    #[test]
    fn bytes_planted_before_or_between_records_hide_none_appended_after() {
        let wanted = [
            record(1, Target::Tag("a".into())),
            record(2, Target::Tag("b".into())),
        ];
        // a length that runs past the end, then records appended after it
        let mut log = vec![0xff, 0xff];
        assert_eq!(decode_from(&log, 0), (vec![], 2));
        log.extend_from_slice(&wanted[0].encode());
        let (found, end) = decode_from(&log, 0);
        assert_eq!(found, wanted[..1]);
        assert_eq!(end, log.len());
        assert_eq!(decode_from(&log, 2), (wanted[..1].to_vec(), log.len()));
        // junk between two records, with the magic in it, and junk left at the end
        log.extend_from_slice(b"\x00\x07LIjunk!");
        log.extend_from_slice(&wanted[1].encode());
        log.extend_from_slice(&[0x00, 0x40, b'L']);
        let (found, end) = decode_from(&log, 0);
        assert_eq!(found, wanted);
        assert_eq!(end, log.len(), "junk is scanned once, not at every read");
    }

    #[test]
    fn junk_framed_like_records_costs_no_crc_unless_its_lengths_add_up() {
        let real = record(1, Target::Tag("a".into())).encode();
        // candidates asking for the largest body at every fourth byte (`\xff\xffLI`)
        let mut log: Vec<u8> = b"\xff\xffLI".repeat(64 * 1024);
        log.extend_from_slice(&real);
        let (found, end) = decode_from(&log, 0);
        assert_eq!(found, vec![record(1, Target::Tag("a".into()))]);
        assert_eq!(end, log.len());
        let body = &real[2..];
        assert!(well_framed(body));
        // the same record with a length field that does not add up is not framed
        let mut bad = body.to_vec();
        bad[2 + 1 + 1 + 1 + 24] ^= 0x01;
        assert!(!fields_fill(&bad[..bad.len() - 4]));
        assert!(!well_framed(&bad));
    }

    #[test]
    fn a_record_whose_host_no_key_holds_is_skipped() {
        // no node writes one (the invalidator refuses such targets); a hostile writer could
        let mut log = record(1, Target::url("a/b", "/x")).encode().to_vec();
        log.extend_from_slice(&record(2, Target::Host("a b".into())).encode());
        log.extend_from_slice(&record(3, Target::url("https://", "/x")).encode());
        let kept = record(4, Target::url("https://shop.example:8443", "/x"));
        log.extend_from_slice(&kept.encode());
        let (records, end) = decode_from(&log, 0);
        assert_eq!(records, vec![kept]);
        assert_eq!(end, log.len());
    }

    #[test]
    fn a_long_asker_is_cut() {
        let mut long = record(1, Target::Tag("a".into()));
        long.asked_by = "é".repeat(200);
        let (records, _) = decode_from(&long.encode(), 0);
        assert!(records[0].asked_by.len() <= MAX_ASKED_BY);
        assert!(long.asked_by.starts_with(&records[0].asked_by));
    }
}
