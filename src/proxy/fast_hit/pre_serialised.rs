//! Fast hits answered over HTTP/1 with the stored head's kept wire form.
//!
//! A fast hit's head is the stored head with `Age`, `Cache-Status` and `Via` added, the fields
//! meant for this cache only removed, `Content-Length` when the origin sent none, and, on a
//! `200`, `Accept-Ranges: bytes` (as the standard path's range filter adds it). Built per
//! hit, that is a header-map clone, its edits, Pingora's serialisation and the drop: about a
//! third of a 1 KB hit's user-space instructions. All of it but `Age`, `Cache-Status` and `Via` is
//! the same for every hit of an object, so it is serialised once, on the object's first fast hit,
//! and kept with the stored metadata ([`WireHead`]); each hit then writes that, its three lines,
//! and the body in one write through Pingora's `write_serialized_response` (a vendored patch,
//! which adds `Connection` and, when missing, `Date`, and keeps the session's framing, keep-alive
//! and status as a head written by Pingora would). A body kept in a memory file
//! (`storage::memory::mapped`) goes to a plain TCP client from the file, with `sendfile`.
//!
//! Only answers whose head nothing else edits go this way: no hook, no rule editing response
//! heads, the stored body as it is (not decoded for the client), an HTTP/1 client, and a stored
//! head that frames its body by length as Pingora would (no `Transfer-Encoding`, a
//! `Content-Length` that is the body's). Every other answer is built as before
//! ([`super::answer::Answer::head`]).

use super::answer::Answer;
use crate::proxy::headers::ForUsOnly;
use crate::storage::memory::CompleteObject;
use crate::storage::wire_head::WireHead;
use http::{header, HeaderName};
use pingora_core::protocols::http::ServerSession as HttpSession;
use pingora_error::Result;
use pingora_http::written_without_case;
use pingora_proxy::Session;

/// An answer that can be sent with its kept wire head.
pub struct PreSerialised<'a> {
    hit: &'a CompleteObject,
    age: u64,
    wire: &'a WireHead,
}

impl Answer {
    /// This answer with its object's wire head (built now if this is its first such hit), when it
    /// may be sent that way (see the module doc; the caller has checked hooks and rules) to the
    /// client of `session`. `for_us_only` and `announcing` (`Cache-Status` is added) are the
    /// settings the wire head depends on.
    pub fn pre_serialised(
        &self,
        session: &Session,
        for_us_only: &ForUsOnly,
        announcing: bool,
    ) -> Option<PreSerialised<'_>> {
        let (hit, age, stored) = self.parts();
        let HttpSession::H1(h1) = &*session.downstream_session else {
            return None;
        };
        if !stored || h1.response_written().is_some() {
            return None;
        }
        let made_for = for_us_only.fingerprint().wrapping_mul(2) | u64::from(announcing);
        let kept = &hit.meta().wire_head;
        let wire = kept.get_or_init(|| build(hit, for_us_only, announcing, made_for))?;
        // built under other settings (a reload since): not used, the standard way instead
        (wire.made_for == made_for).then_some(PreSerialised { hit, age, wire })
    }
}

impl PreSerialised<'_> {
    /// Writes the answer: the wire head, `Age`, the lines `our_fields` appends (`Cache-Status`,
    /// `Via`), and the body (none for HEAD).
    pub async fn send(
        self,
        session: &mut Session,
        our_fields: impl FnOnce(&mut String),
    ) -> Result<()> {
        let mut lines = String::with_capacity(128);
        lines.push_str("Age: ");
        lines.push_str(itoa::Buffer::new().format(self.age));
        lines.push_str("\r\n");
        our_fields(&mut lines);
        let HttpSession::H1(h1) = &mut *session.downstream_session else {
            unreachable!("checked by `Answer::pre_serialised`");
        };
        let status = self.hit.meta().header.status;
        let head: [&[u8]; 2] = [&self.wire.bytes, lines.as_bytes()];
        // a body kept in a memory file goes to a plain TCP client with `sendfile`
        // (`storage::memory::mapped`); the hit holds the file until the write returns
        let file = super::answer::file_body(self.hit, 0);
        h1.write_serialized_response_with_file(
            status,
            &head,
            self.wire.has_date,
            self.hit.chunks(),
            file,
        )
        .await
    }
}

/// The wire form of `hit`'s head as the standard way would send it, less `Age`, `Cache-Status`
/// (when `announcing`), `Via` and `Connection`; `None` when the head cannot be sent that way.
///
/// Written from the stored head as it is, skipping the fields left out, rather than from an
/// edited copy: a copy of the head (both maps), its removals and its drop cost about a thousand
/// instructions on each hit that builds a wire head, which is every hit read from memcached with
/// `local_ttl = "0s"` (each read decodes a new object). The fields keep the stored order; a
/// `Content-Length` the origin did not send comes last, as an inserted field would.
fn build(
    hit: &CompleteObject,
    for_us_only: &ForUsOnly,
    announcing: bool,
    made_for: u64,
) -> Option<WireHead> {
    let stored = &hit.meta().header;
    let status = stored.status;
    if status.is_informational()
        // stripped after `Age` and `Content-Length` are added, the standard way: rare, not copied
        || for_us_only.includes(&header::AGE)
        || for_us_only.includes(&header::CONTENT_LENGTH)
    {
        return None;
    }
    // One pass over the fields finds the framing (a `Transfer-Encoding`, the `Content-Length`
    // values) and the length of the lines, so that the bytes are allocated once, at their
    // length when no field is left out, and never moved to a smaller block.
    let mut framing = Framing::default();
    let mut field_bytes = 0;
    for (name, value) in &stored.headers {
        framing.see(name, value);
        field_bytes += name.as_str().len() + value.len() + 4;
    }
    if framing.chunked {
        return None;
    }
    let no_body = matches!(status.as_u16(), 204 | 304);
    let add_length = match framing.length() {
        Some(length) if length != hit.body_len() => return None,
        None if !no_body && framing.lengths > 0 => return None,
        None => !no_body,
        Some(_) => false,
    };
    // a 200 says its ranges may be asked for, as the standard path's range filter has it say
    let ranges = status == http::StatusCode::OK;
    let left_out = |name: &HeaderName| {
        name == header::AGE
            || name == header::CONNECTION
            || (announcing && name.as_str() == "cache-status")
            || (ranges && name == header::ACCEPT_RANGES)
            || for_us_only.includes(name)
    };
    let reason = stored.get_reason_phrase().unwrap_or_default();
    let mut digits = itoa::Buffer::new();
    let length_line = if add_length {
        let digits = digits.format(hit.body_len());
        Some((written_without_case(&header::CONTENT_LENGTH), digits))
    } else {
        None
    };
    let length_bytes = length_line.map_or(0, |(name, digits)| name.len() + digits.len() + 4);
    let ranges_line = ranges.then(|| written_without_case(&header::ACCEPT_RANGES));
    let ranges_bytes = ranges_line.map_or(0, |name| name.len() + ": bytes\r\n".len());
    let status_line = "HTTP/1.1 200 \r\n".len() + reason.len();
    let mut bytes = Vec::with_capacity(status_line + field_bytes + length_bytes + ranges_bytes);
    bytes.extend_from_slice(b"HTTP/1.1 ");
    bytes.extend_from_slice(status.as_str().as_bytes());
    bytes.push(b' ');
    bytes.extend_from_slice(reason.as_bytes());
    bytes.extend_from_slice(b"\r\n");
    let mut line = |name: &[u8], value: &[u8]| {
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(b"\r\n");
    };
    // the names as the origin wrote them when the head keeps their case (pingora-http keeps its
    // case map in the field map's order; without one this iterator is empty), else the names'
    // titled forms, as pingora-http writes a head
    let mut cases = stored.case_header_iter();
    let mut has_date = false;
    for (name, value) in &stored.headers {
        let case = cases.next();
        if left_out(name) {
            continue;
        }
        has_date |= name == header::DATE;
        let written = case.map_or(written_without_case(name).as_bytes(), |(c, _)| c.as_slice());
        line(written, value.as_bytes());
    }
    if let Some((name, digits)) = length_line {
        line(name.as_bytes(), digits.as_bytes());
    }
    if let Some(name) = ranges_line {
        line(name.as_bytes(), b"bytes");
    }
    Some(WireHead {
        made_for,
        has_date,
        // kept for as long as the object is: allocated at its length (above), this moves
        // nothing unless fields were left out
        bytes: bytes.into_boxed_slice(),
    })
}

/// What a head's fields say of its framing, seen one by one.
#[derive(Default)]
struct Framing<'a> {
    /// A `Transfer-Encoding` is among them.
    chunked: bool,
    /// How many `Content-Length` fields there are.
    lengths: usize,
    /// The last `Content-Length`'s value.
    length: Option<&'a http::HeaderValue>,
}

impl<'a> Framing<'a> {
    fn see(&mut self, name: &HeaderName, value: &'a http::HeaderValue) {
        if name == header::TRANSFER_ENCODING {
            self.chunked = true;
        } else if name == header::CONTENT_LENGTH {
            self.lengths += 1;
            self.length = Some(value);
        }
    }

    /// The head's `Content-Length`, when it has exactly one valid one.
    fn length(&self) -> Option<usize> {
        if self.lengths != 1 {
            return None;
        }
        self.length?.to_str().ok()?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::object::{Body, StoredMeta};
    use bytes::Bytes;
    use pingora_cache::CacheMeta;
    use pingora_http::ResponseHeader;
    use std::time::{Duration, SystemTime};

    fn object(fields: &[(&str, String)], body: &'static [u8]) -> CompleteObject {
        object_with(ResponseHeader::build(200, None).unwrap(), fields, body)
    }

    fn object_without_case(fields: &[(&str, String)], body: &'static [u8]) -> CompleteObject {
        object_with(
            ResponseHeader::build_no_case(200, None).unwrap(),
            fields,
            body,
        )
    }

    fn object_with(
        mut head: ResponseHeader,
        fields: &[(&str, String)],
        body: &'static [u8],
    ) -> CompleteObject {
        for (name, value) in fields {
            head.append_header(name.to_string(), value).unwrap();
        }
        let now = SystemTime::now();
        let meta = CacheMeta::new(now + Duration::from_secs(60), now, 0, 0, head);
        CompleteObject::detached(
            StoredMeta::from_meta(&meta),
            Body::from_chunks(vec![Bytes::from_static(body)]),
        )
    }

    /// The head's `Content-Length`, when it has exactly one valid one (as `build` judged it
    /// before it saw the framing in its pass over the fields).
    fn content_length(head: &ResponseHeader) -> Option<usize> {
        let mut values = head.headers.get_all(header::CONTENT_LENGTH).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        value.to_str().ok()?.parse().ok()
    }

    /// The wire head as this module built it before: the stored head copied, edited and
    /// serialised by pingora-http.
    fn edited_copy(hit: &CompleteObject, for_us_only: &ForUsOnly, announcing: bool) -> Vec<u8> {
        let mut head = hit.meta().header.clone();
        if content_length(&head).is_none() {
            head.insert_header(header::CONTENT_LENGTH, hit.body_len())
                .unwrap();
        }
        head.remove_header(&header::AGE);
        head.remove_header(&header::CONNECTION);
        if announcing {
            head.remove_header("cache-status");
        }
        for_us_only.strip(&mut head);
        if head.status == http::StatusCode::OK {
            head.insert_header(header::ACCEPT_RANGES, "bytes").unwrap();
        }
        let mut bytes = format!(
            "HTTP/1.1 200 {}\r\n",
            head.get_reason_phrase().unwrap_or_default()
        )
        .into_bytes();
        head.header_to_h1_wire(&mut bytes);
        bytes
    }

    fn lines(bytes: &[u8]) -> Vec<&[u8]> {
        let mut lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
        lines.sort();
        lines
    }

    /// Written from the stored head without a copy, the wire head has the lines the edited copy
    /// had (names in the stored case, the fields left out gone, `Content-Length` added when
    /// missing), in the stored order, and says whether a `Date` is among them.
    #[test]
    fn the_wire_head_has_the_lines_an_edited_copy_had() {
        let body: &'static [u8] = b"<html>a page</html>";
        let for_us_only = ForUsOnly::new(["Lacquer-Debug", "Date"]);
        let heads: [Vec<(&str, String)>; 3] = [
            vec![
                ("Content-Type", "text/html".to_string()),
                ("Age", "12".to_string()),
                ("X-Multi", "a".to_string()),
                ("Cache-Status", "upstream; hit".to_string()),
                ("x-multi", "b".to_string()),
                ("Connection", "close".to_string()),
                ("ETag", "\"v1\"".to_string()),
            ],
            vec![
                ("lacquer-debug", "1".to_string()),
                ("Date", "Tue, 24 Nov 2026 04:00:00 GMT".to_string()),
                ("content-length", body.len().to_string()),
                ("X-Request-Id", "r-1".to_string()),
            ],
            vec![("cache-control", "max-age=60".to_string())],
        ];
        for (fields, case) in heads.iter().flat_map(|f| [(f, true), (f, false)]) {
            let hit = if case {
                object(fields, body)
            } else {
                // as a head decoded from memcached is: no case map, names written titled
                object_without_case(fields, body)
            };
            for (announcing, for_us_only) in [(true, &for_us_only), (false, &ForUsOnly::new([]))] {
                let wire = build(&hit, for_us_only, announcing, 0).expect("built");
                let before = edited_copy(&hit, for_us_only, announcing);
                assert_eq!(
                    lines(&wire.bytes),
                    lines(&before),
                    "{}",
                    String::from_utf8_lossy(&wire.bytes)
                );
                let names: Vec<String> = std::str::from_utf8(&wire.bytes)
                    .unwrap()
                    .lines()
                    .skip(1)
                    .map(|l| l.split(':').next().unwrap().to_ascii_lowercase())
                    .collect();
                // the stored map's order (a name's values together), nothing moved by a removal
                let expected: Vec<String> = hit
                    .meta()
                    .header
                    .headers
                    .iter()
                    .map(|(name, _)| name.as_str().to_string())
                    .filter(|name| {
                        let left_out = ["age", "connection"].contains(&name.as_str())
                            || (announcing && name == "cache-status")
                            || for_us_only
                                .includes(&HeaderName::from_bytes(name.as_bytes()).unwrap());
                        !left_out
                    })
                    .collect();
                assert_eq!(names[..expected.len()], expected[..], "the stored order");
                if case {
                    let cased = std::str::from_utf8(&wire.bytes).unwrap();
                    assert!(fields.iter().all(|(name, _)| {
                        expected.contains(&name.to_ascii_lowercase())
                            == cased.contains(&format!("\r\n{name}: "))
                    }));
                }
                let dated = names.iter().any(|n| n == "date");
                assert_eq!(wire.has_date, dated);
            }
        }
    }

    /// `build` as it was before it found the framing in its pass over the fields and allocated
    /// the bytes at their length: the reference its wire heads must match byte for byte.
    fn old_build(
        hit: &CompleteObject,
        for_us_only: &ForUsOnly,
        announcing: bool,
        made_for: u64,
    ) -> Option<WireHead> {
        let stored = &hit.meta().header;
        let status = stored.status;
        if status.is_informational()
            || stored.headers.contains_key(header::TRANSFER_ENCODING)
            || for_us_only.includes(&header::AGE)
            || for_us_only.includes(&header::CONTENT_LENGTH)
        {
            return None;
        }
        let no_body = matches!(status.as_u16(), 204 | 304);
        let add_length = match content_length(stored) {
            Some(length) if length != hit.body_len() => return None,
            None if !no_body && stored.headers.contains_key(header::CONTENT_LENGTH) => return None,
            None => !no_body,
            Some(_) => false,
        };
        let ranges = status == http::StatusCode::OK;
        let left_out = |name: &HeaderName| {
            name == header::AGE
                || name == header::CONNECTION
                || (announcing && name.as_str() == "cache-status")
                || (ranges && name == header::ACCEPT_RANGES)
                || for_us_only.includes(name)
        };
        let mut bytes = Vec::with_capacity(512);
        bytes.extend_from_slice(b"HTTP/1.1 ");
        bytes.extend_from_slice(status.as_str().as_bytes());
        bytes.push(b' ');
        bytes.extend_from_slice(stored.get_reason_phrase().unwrap_or_default().as_bytes());
        bytes.extend_from_slice(b"\r\n");
        let mut line = |name: &[u8], value: &[u8]| {
            bytes.extend_from_slice(name);
            bytes.extend_from_slice(b": ");
            bytes.extend_from_slice(value);
            bytes.extend_from_slice(b"\r\n");
        };
        let mut cases = stored.case_header_iter();
        let mut has_date = false;
        for (name, value) in &stored.headers {
            let case = cases.next();
            if left_out(name) {
                continue;
            }
            has_date |= name == header::DATE;
            let written = case.map_or(written_without_case(name).as_bytes(), |(c, _)| c.as_slice());
            line(written, value.as_bytes());
        }
        if add_length {
            line(
                written_without_case(&header::CONTENT_LENGTH).as_bytes(),
                itoa::Buffer::new().format(hit.body_len()).as_bytes(),
            );
        }
        if ranges {
            line(
                written_without_case(&header::ACCEPT_RANGES).as_bytes(),
                b"bytes",
            );
        }
        Some(WireHead {
            made_for,
            has_date,
            bytes: bytes.into_boxed_slice(),
        })
    }

    fn object_with_status(
        status: u16,
        fields: &[(&str, String)],
        body: &'static [u8],
        case: bool,
    ) -> CompleteObject {
        let head = if case {
            ResponseHeader::build(status, None).unwrap()
        } else {
            ResponseHeader::build_no_case(status, None).unwrap()
        };
        object_with(head, fields, body)
    }

    /// The wire head is the one `build` wrote before, byte for byte, with the same `has_date`,
    /// and is refused where it was: many fields, repeated names, fields left out (`Age`,
    /// `Connection`, `Cache-Status`, the fields for us only), `Content-Length` missing, wrong,
    /// repeated or unparsable, `Transfer-Encoding`, bodiless statuses, with and without a case
    /// map.
    #[test]
    fn the_wire_head_is_the_one_built_before() {
        let body: &'static [u8] = b"<html>a page</html>";
        let length = body.len().to_string();
        let mut many: Vec<(&str, String)> = (0..60)
            .map(|i| {
                let name = ["X-Field-A", "x-field-b", "Set-Cookie", "Vary", "Link"][i % 5];
                (name, format!("value {i}"))
            })
            .collect();
        many.push(("Content-Length", length.clone()));
        many.push(("Date", "Tue, 24 Nov 2026 04:00:00 GMT".to_string()));
        let heads: Vec<(u16, Vec<(&str, String)>)> = vec![
            (200, many),
            (
                200,
                vec![
                    ("Content-Type", "text/html".to_string()),
                    ("Age", "3".to_string()),
                    ("Connection", "keep-alive".to_string()),
                    ("Cache-Status", "other; hit".to_string()),
                    ("Lacquer-Debug", "1".to_string()),
                    ("Surrogate-Key", "a b".to_string()),
                    ("content-length", length.clone()),
                ],
            ),
            (200, vec![("Content-Type", "text/plain".to_string())]),
            (404, vec![("content-length", "7".to_string())]),
            (
                200,
                vec![
                    ("content-length", length.clone()),
                    ("content-length", length.clone()),
                ],
            ),
            (200, vec![("content-length", "1x".to_string())]),
            (200, vec![("transfer-encoding", "chunked".to_string())]),
            (204, vec![("ETag", "\"e\"".to_string())]),
            (304, vec![("content-length", "99".to_string())]),
            (203, vec![("X-Empty", String::new())]),
        ];
        let settings = [
            (true, ForUsOnly::new(["Lacquer-Debug", "Surrogate-Key"])),
            (false, ForUsOnly::new([])),
            (true, ForUsOnly::new(["Age"])),
            (false, ForUsOnly::new(["content-length"])),
        ];
        for ((status, fields), case) in heads.iter().flat_map(|h| [(h, true), (h, false)]) {
            let body: &'static [u8] = if matches!(status, 204 | 304) {
                b""
            } else {
                body
            };
            let hit = object_with_status(*status, fields, body, case);
            for (announcing, for_us_only) in &settings {
                let new = build(&hit, for_us_only, *announcing, 7);
                let old = old_build(&hit, for_us_only, *announcing, 7);
                match (new, old) {
                    (None, None) => {}
                    (Some(new), Some(old)) => {
                        assert_eq!(
                            String::from_utf8_lossy(&new.bytes),
                            String::from_utf8_lossy(&old.bytes)
                        );
                        assert_eq!(new.has_date, old.has_date);
                        assert_eq!(new.made_for, old.made_for);
                    }
                    (new, old) => panic!(
                        "{status} {fields:?}: built {} before, {} now",
                        old.is_some(),
                        new.is_some()
                    ),
                }
            }
        }
    }

    /// What a built wire head occupies (its bytes and the struct, before allocator rounding)
    /// never exceeds what its object was charged for it, nor falls far below (a charge that
    /// grossly overstates would shrink the cache for nothing).
    #[test]
    fn the_charge_for_a_wire_head_covers_what_is_built() {
        let body: &'static [u8] = b"<html>a page</html>";
        let small = vec![
            ("content-type", "text/html".to_string()),
            ("cache-control", "max-age=60".to_string()),
            ("date", "Tue, 24 Nov 2026 04:00:00 GMT".to_string()),
            ("content-length", body.len().to_string()),
        ];
        let many: Vec<(&str, String)> = (0..40)
            .map(|i| ("x-long-field", format!("value {i} {}", "v".repeat(i * 7))))
            .collect();
        let no_length = vec![("content-type", "text/plain".to_string())];
        for fields in [small, many, no_length] {
            let hit = object(&fields, body);
            let wire = build(&hit, &ForUsOnly::new([]), true, 0).expect("built");
            let built = wire.bytes.len() + std::mem::size_of::<WireHead>();
            let charged = WireHead::charge_for(&hit.meta().header);
            assert!(charged >= built, "{charged} charged for {built} built");
            assert!(
                charged <= built * 2 + 128,
                "{charged} charged for {built} built"
            );
        }
    }
}
