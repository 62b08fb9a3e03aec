//! Entries read from memcached are untrusted input: their framing is recomputed from the body.
//!
//! The shared tier is written by every node and, by design, by applications
//! (`docs/entry-format.md`); the entry's CRC proves only that the value arrived as written, not
//! that what was written is sound. A head whose `Content-Length` disagrees with its body would be
//! served as a hit and leave the client (or the next response on its connection) waiting for
//! bytes that never come, or reading the rest of the body as the next response. So every entry
//! read from memcached, complete or assembled from chunks, is reframed by [`reframe`] before it
//! is served or promoted: the body is the truth, the head's framing is rebuilt from it.

use super::entry::EntryError;
use super::object::StoredMeta;
use crate::policy::freshness::storable_status;
use http::header;

/// Rebuilds the framing of `meta`'s head for a body of `body_len` bytes: every `Content-Length`,
/// `Transfer-Encoding` and hop-by-hop field goes, and one `Content-Length` equal to the body's
/// length is set (none on a 204, which must have no body). An entry with a status this cache
/// never stores (1xx, 206, 304, out of range), or a 204 or 205 with a body, is rejected.
pub fn reframe(meta: &mut StoredMeta, body_len: usize) -> Result<(), EntryError> {
    let head = &mut meta.header;
    if !storable_status(head.status) {
        return Err(EntryError::Malformed("status never stored"));
    }
    let no_content = head.status == http::StatusCode::NO_CONTENT;
    if no_content && body_len > 0 {
        return Err(EntryError::Malformed("a body on a 204"));
    }
    if head.status == http::StatusCode::RESET_CONTENT && body_len > 0 {
        // RFC 9110 §15.3.6: a 205 MUST NOT carry content (a planted one did, and was served)
        return Err(EntryError::Malformed("a body on a 205"));
    }
    crate::proxy::headers::strip_hop_by_hop(head);
    if !no_content && framed_as(head, body_len) {
        // as the writer left it (the usual case): nothing to rebuild
        return Ok(());
    }
    head.remove_header(&header::CONTENT_LENGTH);
    head.remove_header(&header::TRANSFER_ENCODING);
    if !no_content {
        head.insert_header(header::CONTENT_LENGTH, body_len)
            .map_err(|_| EntryError::Malformed("Content-Length not settable"))?;
    }
    Ok(())
}

/// Whether `head` (not a 204) carries exactly one `Content-Length`, equal to `body_len`, and no
/// `Transfer-Encoding`.
fn framed_as(head: &pingora_http::ResponseHeader, body_len: usize) -> bool {
    if head.headers.contains_key(header::TRANSFER_ENCODING) {
        return false;
    }
    let mut lengths = head.headers.get_all(header::CONTENT_LENGTH).iter();
    match (lengths.next(), lengths.next()) {
        (Some(length), None) => {
            length.as_bytes() == itoa::Buffer::new().format(body_len).as_bytes()
        }
        _ => false,
    }
}

/// Whether `meta`'s head frames a body of `body_len` bytes exactly as [`reframe`] leaves it:
/// one `Content-Length` equal to the length (none for a 204, with no body), no
/// `Transfer-Encoding`. The fuzz targets check every served entry with it, and the memory tier
/// every fill that did not come as long as its head declared (`object::framed_by_length`).
pub fn framing_agrees(meta: &StoredMeta, body_len: usize) -> bool {
    let head = &meta.header;
    let lengths: Vec<_> = head
        .headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .collect();
    let no_te = !head.headers.contains_key(header::TRANSFER_ENCODING);
    if head.status == http::StatusCode::NO_CONTENT {
        return body_len == 0 && lengths.is_empty() && no_te;
    }
    no_te && lengths.len() == 1 && lengths[0].as_bytes() == body_len.to_string().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora_http::ResponseHeader;

    fn meta_with(status: u16, fields: &[(&str, &str)]) -> StoredMeta {
        let mut header = ResponseHeader::build(status, None).unwrap();
        for (name, value) in fields {
            header.append_header(name.to_string(), *value).unwrap();
        }
        StoredMeta {
            header,
            ..StoredMeta::empty()
        }
    }

    #[test]
    fn a_length_that_disagrees_with_the_body_is_replaced() {
        let mut meta = meta_with(
            200,
            &[
                ("content-length", "1000"),
                ("content-length", "7"),
                ("transfer-encoding", "chunked"),
                ("connection", "close, x-secret"),
                ("x-secret", "1"),
                ("content-type", "text/html"),
            ],
        );
        assert!(!framing_agrees(&meta, 10));
        reframe(&mut meta, 10).unwrap();
        assert!(framing_agrees(&meta, 10));
        let head = &meta.header.headers;
        assert!(head.get("connection").is_none() && head.get("x-secret").is_none());
        assert_eq!(head.get("content-type").unwrap(), "text/html");
    }

    #[test]
    fn only_a_length_written_exactly_as_the_body_is_long_is_kept() {
        let mut framed = meta_with(200, &[("content-length", "10"), ("etag", "\"a\"")]);
        reframe(&mut framed, 10).unwrap();
        assert!(framing_agrees(&framed, 10));
        assert_eq!(framed.header.headers.get("etag").unwrap(), "\"a\"");
        // the same number written otherwise is not the writer's framing: replaced
        for written in ["+10", "010", " 10", "10, 10"] {
            let mut meta = meta_with(200, &[("content-length", written)]);
            reframe(&mut meta, 10).unwrap();
            assert!(framing_agrees(&meta, 10), "{written:?}");
            assert_eq!(meta.header.headers.get("content-length").unwrap(), "10");
        }
    }

    #[test]
    fn a_missing_length_is_added_and_a_204_carries_none() {
        let mut meta = meta_with(200, &[]);
        reframe(&mut meta, 0).unwrap();
        assert_eq!(meta.header.headers.get("content-length").unwrap(), "0");
        let mut empty = meta_with(204, &[("content-length", "5")]);
        reframe(&mut empty, 0).unwrap();
        assert!(framing_agrees(&empty, 0));
        assert!(empty.header.headers.get("content-length").is_none());
    }

    #[test]
    fn statuses_never_stored_and_a_204_or_205_with_a_body_are_rejected() {
        for status in [100, 101, 206, 304] {
            assert!(reframe(&mut meta_with(status, &[]), 0).is_err(), "{status}");
        }
        assert!(reframe(&mut meta_with(204, &[]), 3).is_err());
        assert!(reframe(&mut meta_with(205, &[]), 3).is_err());
        assert!(reframe(&mut meta_with(205, &[]), 0).is_ok());
    }
}
