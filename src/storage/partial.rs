//! Partial objects (RFC 9111 §3.3-3.4): a stored `206` covering one contiguous byte span of a
//! representation whose complete length is known, and how two spans of one representation
//! combine.
//!
//! A partial object is kept apart from complete objects: under a key of its own that no
//! complete-object lookup (Pingora's, the fast path's, memcached's) ever reads, so a complete
//! object is never served from a partial one. Its head is the `206` as stored (status 206,
//! `Content-Range`, the span's `Content-Length`); its freshness is that of the complete
//! representation it is part of. Two spans combine only when they are parts of the same
//! representation, which RFC 9111 §3.4 asks to be shown by a strong validator: both carry the
//! same strong `ETag`. When the spans overlap or touch, their union is kept; when it covers the
//! whole representation, it becomes a complete `200` object and is stored as one (see
//! `proxy/partial_content.rs`).

use super::object::{Body, StoredMeta};
use bytes::Bytes;
use http::header;
use pingora_http::ResponseHeader;
use std::sync::Arc;

/// The bytes `[start, end)` of a representation `complete` bytes long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSpan {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
    /// The complete representation's length.
    pub complete: usize,
}

impl ByteSpan {
    /// The span a `206`'s `Content-Range` names (`bytes first-last/complete`); `None` for any other
    /// status, an unknown complete length (`/*`), or an invalid range.
    pub fn of(head: &ResponseHeader) -> Option<ByteSpan> {
        if head.status != http::StatusCode::PARTIAL_CONTENT {
            return None;
        }
        let value = head.headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
        let (unit, rest) = value.trim().split_once(' ')?;
        if !unit.eq_ignore_ascii_case("bytes") {
            return None;
        }
        let (range, complete) = rest.trim().split_once('/')?;
        let (first, last) = range.split_once('-')?;
        let number = |text: &str| text.trim().parse::<usize>().ok();
        let (first, last, complete) = (number(first)?, number(last)?, number(complete)?);
        (first <= last && last < complete).then_some(ByteSpan {
            start: first,
            end: last + 1,
            complete,
        })
    }

    /// Bytes in the span.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the span is empty (never, for a span read from a `Content-Range`).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// Whether the span is the whole representation.
    pub fn is_whole(&self) -> bool {
        self.start == 0 && self.end == self.complete
    }

    /// Whether `[start, end)` lies inside the span.
    pub fn covers(&self, start: usize, end: usize) -> bool {
        self.start <= start && end <= self.end
    }

    /// The `Content-Range` value for the span.
    pub fn content_range(&self) -> String {
        format!("bytes {}-{}/{}", self.start, self.end - 1, self.complete)
    }
}

/// A stored partial object: the `206` head and freshness, the span and its bytes.
#[derive(Clone)]
pub struct PartialObject {
    /// The stored head (a `206` naming [`Self::span`]) and the representation's freshness.
    pub meta: Arc<StoredMeta>,
    /// The bytes of the span, in the chunks they arrived in.
    pub body: Body,
    /// Which bytes of the representation the body is.
    pub span: ByteSpan,
}

impl PartialObject {
    /// A partial object from its stored parts, when the head names a span the body fills.
    pub fn new(meta: Arc<StoredMeta>, body: Body) -> Option<Self> {
        let span = ByteSpan::of(&meta.header)?;
        (span.len() == body.len()).then_some(PartialObject { meta, body, span })
    }
}

/// The head of the complete representation a `206` is part of: status 200, no `Content-Range`,
/// the complete `Content-Length`. The cache policy judges this head (a `206` itself is not a
/// storable status), and a combined complete object is stored under it.
pub fn complete_head(partial: &ResponseHeader, span: ByteSpan) -> ResponseHeader {
    let mut head = partial.clone();
    let _ = head.set_status(http::StatusCode::OK);
    head.remove_header(&header::CONTENT_RANGE);
    let _ = head.insert_header(header::CONTENT_LENGTH, span.complete);
    head
}

/// The head of a `206` for `span` of the representation `complete` is the head of.
pub fn partial_head(complete: &ResponseHeader, span: ByteSpan) -> ResponseHeader {
    let mut head = complete.clone();
    let _ = head.set_status(http::StatusCode::PARTIAL_CONTENT);
    let _ = head.insert_header(header::CONTENT_RANGE, span.content_range());
    let _ = head.insert_header(header::CONTENT_LENGTH, span.len());
    head.remove_header(&header::ACCEPT_RANGES);
    head
}

/// The strong `ETag` of a response, if it has one (a weak one cannot show two parts belong to
/// one representation).
pub fn strong_etag(head: &ResponseHeader) -> Option<&[u8]> {
    let etag = head.headers.get(header::ETAG)?.as_bytes();
    (etag.starts_with(b"\"") && etag.len() >= 2).then_some(etag)
}

/// Whether two responses are parts of one representation: the same strong `ETag` and the same
/// complete length (RFC 9111 §3.4).
pub fn same_representation(
    a: &ResponseHeader,
    a_span: ByteSpan,
    b: &ResponseHeader,
    b_span: ByteSpan,
) -> bool {
    a_span.complete == b_span.complete
        && strong_etag(a).is_some_and(|etag| strong_etag(b) == Some(etag))
}

/// The union of two spans of one representation and its bytes, when they overlap or touch;
/// `None` when a gap separates them. Where they overlap, `newer`'s bytes are kept.
pub fn combine(
    older: (ByteSpan, &[Bytes]),
    newer: (ByteSpan, &[Bytes]),
) -> Option<(ByteSpan, Vec<Bytes>)> {
    let (old_span, old) = older;
    let (new_span, new) = newer;
    if old_span.complete != new_span.complete
        || old_span.start > new_span.end
        || new_span.start > old_span.end
    {
        return None;
    }
    let span = ByteSpan {
        start: old_span.start.min(new_span.start),
        end: old_span.end.max(new_span.end),
        complete: new_span.complete,
    };
    let mut chunks = Vec::new();
    // the older bytes before the newer span, the newer span, the older bytes after it
    chunks.extend(slice(old, old_span.start, span.start, new_span.start));
    chunks.extend(new.iter().cloned());
    chunks.extend(slice(old, old_span.start, new_span.end, old_span.end));
    Some((span, chunks))
}

/// The chunks of `body` (whose first byte is byte `body_start` of the representation) that hold
/// bytes `[from, to)` of the representation, sliced without copying.
pub fn slice(body: &[Bytes], body_start: usize, from: usize, to: usize) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut chunk_start = body_start;
    for chunk in body {
        let chunk_end = chunk_start + chunk.len();
        let (lo, hi) = (from.max(chunk_start), to.min(chunk_end));
        if lo < hi {
            out.push(chunk.slice(lo - chunk_start..hi - chunk_start));
        }
        chunk_start = chunk_end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_206(range: &str, etag: Option<&str>) -> ResponseHeader {
        let mut h = ResponseHeader::build(206, None).unwrap();
        h.insert_header("content-range", range).unwrap();
        if let Some(etag) = etag {
            h.insert_header("etag", etag).unwrap();
        }
        h
    }

    fn span(start: usize, end: usize, complete: usize) -> ByteSpan {
        ByteSpan {
            start,
            end,
            complete,
        }
    }

    fn joined(chunks: &[Bytes]) -> Vec<u8> {
        chunks.concat()
    }

    #[test]
    fn content_range_is_read_strictly() {
        assert_eq!(
            ByteSpan::of(&head_206("bytes 0-4/10", None)),
            Some(span(0, 5, 10))
        );
        assert_eq!(
            ByteSpan::of(&head_206("Bytes  5-9/10", None)),
            Some(span(5, 10, 10))
        );
        for bad in [
            "bytes 0-4/*",
            "bytes 5-4/10",
            "bytes 0-10/10",
            "items 0-4/10",
            "bytes */10",
        ] {
            assert_eq!(ByteSpan::of(&head_206(bad, None)), None, "{bad}");
        }
        let mut ok = head_206("bytes 0-4/10", None);
        ok.set_status(200).unwrap();
        assert_eq!(ByteSpan::of(&ok), None, "only a 206 names a span");
        assert_eq!(span(3, 8, 10).content_range(), "bytes 3-7/10");
    }

    #[test]
    fn heads_convert_between_the_part_and_the_whole() {
        let part = head_206("bytes 0-4/10", Some("\"e\""));
        let whole = complete_head(&part, span(0, 5, 10));
        assert_eq!(whole.status, 200);
        assert!(whole.headers.get("content-range").is_none());
        assert_eq!(whole.headers.get("content-length").unwrap(), "10");
        let again = partial_head(&whole, span(6, 9, 10));
        assert_eq!(again.status, 206);
        assert_eq!(again.headers.get("content-range").unwrap(), "bytes 6-8/10");
        assert_eq!(again.headers.get("content-length").unwrap(), "3");
    }

    #[test]
    fn only_the_same_strong_etag_and_length_make_one_representation() {
        let a = head_206("bytes 0-4/10", Some("\"v1\""));
        let s = span(0, 5, 10);
        assert!(same_representation(
            &a,
            s,
            &head_206("bytes 5-9/10", Some("\"v1\"")),
            span(5, 10, 10)
        ));
        assert!(!same_representation(
            &a,
            s,
            &head_206("bytes 5-9/10", Some("\"v2\"")),
            span(5, 10, 10)
        ));
        assert!(!same_representation(
            &a,
            s,
            &head_206("bytes 5-10/11", Some("\"v1\"")),
            span(5, 11, 11)
        ));
        let weak = head_206("bytes 0-4/10", Some("W/\"v1\""));
        assert!(!same_representation(&weak, s, &weak, s));
        let none = head_206("bytes 0-4/10", None);
        assert!(!same_representation(&none, s, &none, s));
    }

    #[test]
    fn touching_and_overlapping_spans_combine_and_a_gap_does_not() {
        let digits = b"0123456789";
        let part = |from: usize, to: usize| vec![Bytes::copy_from_slice(&digits[from..to])];
        let (whole, chunks) = combine(
            (span(0, 5, 10), &part(0, 5)),
            (span(5, 10, 10), &part(5, 10)),
        )
        .unwrap();
        assert!(whole.is_whole());
        assert_eq!(joined(&chunks), digits);
        // overlapping, the newer part in the middle of the older one
        let older = vec![Bytes::from_static(b"01"), Bytes::from_static(b"234567")];
        let (s, chunks) = combine((span(0, 8, 10), &older), (span(3, 6, 10), &part(3, 6))).unwrap();
        assert_eq!(s, span(0, 8, 10));
        assert_eq!(joined(&chunks), &digits[..8]);
        // the newer part before the older one
        let (s, chunks) = combine(
            (span(6, 10, 10), &part(6, 10)),
            (span(2, 7, 10), &part(2, 7)),
        )
        .unwrap();
        assert_eq!(s, span(2, 10, 10));
        assert_eq!(joined(&chunks), &digits[2..]);
        assert!(combine(
            (span(0, 3, 10), &part(0, 3)),
            (span(5, 10, 10), &part(5, 10))
        )
        .is_none());
    }

    #[test]
    fn slicing_crosses_chunks_without_copying() {
        let body = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"defg")];
        assert_eq!(joined(&slice(&body, 10, 12, 15)), b"cde");
        assert_eq!(joined(&slice(&body, 10, 10, 17)), b"abcdefg");
        assert!(slice(&body, 10, 17, 20).is_empty());
    }
}
