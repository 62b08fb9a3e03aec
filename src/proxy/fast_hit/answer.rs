//! The fast path's answer to a hit: the stored head plus `Age`, and the stored body (or, for a
//! client that does not take the stored copy's coding, gzip, br or zstd, the body decoded whole;
//! or, for a request of one range, a `206` of that part of the stored body).

use crate::compression::decode::{
    decode_complete, WHOLE_DECODE_MAX_DECODED, WHOLE_DECODE_MAX_STORED,
};
use crate::compression::decoded_copies::{DecodedCopies, StoredIdentity};
use crate::compression::{self, ContentCoding};
use crate::policy::freshness;
use crate::proxy::cache_status::CacheStatus;
use crate::storage::memory::CompleteObject;
use bytes::Bytes;
use http::header;
use pingora_cache::key::HashBinary;
use pingora_core::protocols::http::ServerSession as HttpSession;
use pingora_core::protocols::l4::stream::FileBody;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{RangeType, Session};
use std::ops::Range;
use std::time::SystemTime;

/// A hit the fast path answers: the stored head (built for the client with `Age` and framing,
/// which the proxy completes with `Cache-Status` and `Via`, or sent in its kept wire form, see
/// [`super::pre_serialised`]) and the body.
pub struct Answer {
    hit: CompleteObject,
    /// Seconds since the stored epoch, for `Age`.
    age: u64,
    /// Remaining freshness in seconds, for `Cache-Status`.
    ttl: i64,
    body: AnswerBody,
}

enum AnswerBody {
    /// A HEAD request, or a stored response without a body.
    None,
    /// The stored body, chunk by chunk.
    Stored,
    /// The stored compressed body decoded for a client that does not take its coding, with the
    /// head rewritten for it.
    Decoded(Option<Box<ResponseHeader>>, Bytes),
    /// One range of the stored body (RFC 9110 §14), with the `206` head made for it (its
    /// `Content-Range` and `Content-Length`); no range for a HEAD request.
    Part(Option<Box<ResponseHeader>>, Option<Range<usize>>),
}

impl Answer {
    /// The answer to `req` from `hit` at `now`, or `None` when the standard path must serve it (a
    /// compressed copy for a client that does not take its coding that is too large, or a HEAD
    /// request, or not valid in its coding: those stream through the decoder there). `primary` is the request's
    /// primary hash; `copies` the kept decoded copies, if configured.
    pub fn for_hit(
        hit: CompleteObject,
        req: &RequestHeader,
        primary: HashBinary,
        now: SystemTime,
        copies: Option<&DecodedCopies>,
    ) -> Option<Answer> {
        let meta = hit.meta();
        let (age, ttl) = age_and_ttl(&hit, now);
        if let Some(coding) = compression::needs_decoding(req, &meta.header) {
            let mut head = response_head(&hit, age, true);
            let plain = decode_for_client(coding, &hit, req, primary, &mut head, copies)?;
            return Some(Answer {
                hit,
                age,
                ttl,
                body: AnswerBody::Decoded(Some(head), plain),
            });
        }
        let body = if req.method == http::Method::HEAD || hit.body_len() == 0 {
            AnswerBody::None
        } else {
            AnswerBody::Stored
        };
        Some(Answer {
            hit,
            age,
            ttl,
            body,
        })
    }

    /// The answer to `req`, which asks for a range (RFC 9110 §14), from `hit` at `now`: a `206`
    /// of that part of the stored body, with the head the standard path would send
    /// (`pingora_proxy::range_header_filter`, as `LacquerProxy::range_header_filter` calls it).
    /// `None`, for the standard path to answer, unless the request names one satisfiable range of
    /// a `200` whose stored body, of a stored length, the client takes as it is: several ranges,
    /// an unsatisfiable or unreadable one, another status, a head without a length (a 204; every
    /// other stored head has one: `storage::object::framed_by_length`) and a body to decode for
    /// the client are answered there.
    pub fn for_range(hit: CompleteObject, req: &RequestHeader, now: SystemTime) -> Option<Answer> {
        let meta = hit.meta();
        if compression::needs_decoding(req, &meta.header).is_some()
            || !meta.header.headers.contains_key(header::CONTENT_LENGTH)
        {
            // (the standard path's range filter needs the stored length too, and without one
            // sends the body whole)
            return None;
        }
        let (age, ttl) = age_and_ttl(&hit, now);
        let mut head = response_head(&hit, age, true);
        let RangeType::Single(range) =
            pingora_proxy::range_header_filter(req, &mut head, Some(crate::proxy::RANGES_MAX))
        else {
            return None;
        };
        if range.end > hit.body_len() {
            // a stored length other than the body's: never served as a part
            return None;
        }
        let part = (req.method != http::Method::HEAD).then_some(range);
        Some(Answer {
            hit,
            age,
            ttl,
            body: AnswerBody::Part(Some(head), part),
        })
    }

    /// How this cache handled the request, for `Cache-Status` and the log: a hit.
    pub fn cache_status(&self) -> CacheStatus {
        CacheStatus {
            hit: true,
            ttl: Some(self.ttl),
            ..Default::default()
        }
    }

    /// The head to send: the stored one with `Age` and framing (or rewritten for the decoded
    /// body), for the proxy to complete and [`Self::send`]. Without `keep_case` (an HTTP/2
    /// client, whose field names go out in lowercase anyway) the stored names' case is not
    /// copied: half the maps to clone and to add to.
    pub fn head(&mut self, keep_case: bool) -> Box<ResponseHeader> {
        match &mut self.body {
            AnswerBody::Decoded(head @ Some(_), _) | AnswerBody::Part(head @ Some(_), _) => {
                head.take().expect("matched Some")
            }
            _ => response_head(&self.hit, self.age, keep_case),
        }
    }

    /// The stored object, `Age` and whether the stored head and body are sent as they are (not
    /// decoded, not a part), for [`super::pre_serialised`].
    pub(super) fn parts(&self) -> (&CompleteObject, u64, bool) {
        let stored = matches!(self.body, AnswerBody::None | AnswerBody::Stored);
        (&self.hit, self.age, stored)
    }

    /// Writes `head` (from [`Self::head`], completed) and the body to the client.
    pub async fn send(self, session: &mut Session, head: Box<ResponseHeader>) -> Result<()> {
        match self.body {
            AnswerBody::None => session.write_response_header(head, true).await,
            AnswerBody::Decoded(_, plain) => {
                session.write_response_header(head, false).await?;
                session.write_response_body(Some(plain), true).await
            }
            // boxed: its state would otherwise make every hit's future larger
            AnswerBody::Stored if self.hit.body_len() >= VECTORED_MIN_BODY => {
                Box::pin(send_whole(session, head, self.hit)).await
            }
            AnswerBody::Stored => send_chunks(session, head, self.hit.chunks()).await,
            AnswerBody::Part(_, None) => session.write_response_header(head, true).await,
            AnswerBody::Part(_, Some(range)) => {
                Box::pin(send_part(session, head, self.hit, range)).await
            }
        }
    }
}

/// Stored bodies at least this long go to an HTTP/1.1 client with the head in one vectored
/// write (Pingora's `write_response_header_and_body`, a vendored patch): a 100 KB body left in
/// three `send`s. Smaller ones fit the write buffer and leave in one `send` either way, on the
/// path the 1 KB hit's instruction count was measured on.
const VECTORED_MIN_BODY: usize = 16 * 1024;

/// Writes `head` and the body of `hit` ([`send_vectored`]).
async fn send_whole(
    session: &mut Session,
    head: Box<ResponseHeader>,
    hit: CompleteObject,
) -> Result<()> {
    send_vectored(session, head, hit.chunks(), file_body(&hit, 0)).await
}

/// Parts of a body in a memory file at least this long go from the file with `sendfile`; shorter
/// ones are copied from memory, as whole bodies too short to be kept in a file are.
const PART_FROM_FILE_MIN: usize = 64 * 1024;

/// Writes `head` and the bytes `range` of the body of `hit` ([`send_vectored`]): slices of its
/// chunks, or, for a part of [`PART_FROM_FILE_MIN`] or more, that part of its memory file.
async fn send_part(
    session: &mut Session,
    head: Box<ResponseHeader>,
    hit: CompleteObject,
    range: Range<usize>,
) -> Result<()> {
    let file = file_body(&hit, range.start).filter(|_| range.len() >= PART_FROM_FILE_MIN);
    send_vectored(session, head, &part_of(hit.chunks(), range), file).await
}

/// The bytes `range` of a body kept as `chunks`, as slices of them (nothing copied).
fn part_of(chunks: &[Bytes], range: Range<usize>) -> Vec<Bytes> {
    let mut part = Vec::new();
    let mut at = 0;
    for chunk in chunks {
        let (start, end) = (at, at + chunk.len());
        at = end;
        if end <= range.start || chunk.is_empty() {
            continue;
        }
        if start >= range.end {
            break;
        }
        part.push(chunk.slice(range.start.max(start) - start..range.end.min(end) - start));
    }
    part
}

/// Writes `head` and `body` to an HTTP/1.1 client in one vectored write, or, when `file` holds
/// the body's bytes, from it over plain TCP (other sessions: chunk by chunk). The caller keeps
/// the file open until this returns.
async fn send_vectored(
    session: &mut Session,
    mut head: Box<ResponseHeader>,
    body: &[Bytes],
    file: Option<FileBody<'_>>,
) -> Result<()> {
    let HttpSession::H1(h1) = &mut *session.downstream_session else {
        return send_chunks(session, head, body).await;
    };
    // the head through the downstream modules, as `Session::write_response_header` does
    session
        .downstream_modules_ctx
        .response_header_filter(&mut head, false)
        .await?;
    // a body kept in a memory file goes to a plain TCP client with `sendfile`
    // (`storage::memory::mapped`), as on the pre-serialised path
    h1.write_response_header_and_body_with_file(head, body, file)
        .await?;
    session.write_response_body(None, true).await
}

/// Writes `head` and `chunks` chunk by chunk.
async fn send_chunks(
    session: &mut Session,
    head: Box<ResponseHeader>,
    chunks: &[Bytes],
) -> Result<()> {
    session.write_response_header(head, false).await?;
    for (i, chunk) in chunks.iter().enumerate() {
        session
            .write_response_body(Some(chunk.clone()), i + 1 == chunks.len())
            .await?;
    }
    Ok(())
}

/// For a client that does not take the stored copy's `coding`: the body decoded whole, with `head`
/// rewritten for it (see [`compression::rewrite_head_for_decoded_body`]) and carrying the decoded
/// `Content-Length`, so head and body leave in one write instead of chunked pieces. `None` for
/// HEAD, large bodies and bodies that are not valid in their coding: the standard path streams
/// those.
///
/// With `copies`, a body decoded once is kept there and served again while the stored object is
/// the same one (see [`DecodedCopies`]).
fn decode_for_client(
    coding: ContentCoding,
    hit: &CompleteObject,
    req: &RequestHeader,
    primary: HashBinary,
    head: &mut ResponseHeader,
    copies: Option<&DecodedCopies>,
) -> Option<Bytes> {
    if req.method == http::Method::HEAD || hit.body_len() > WHOLE_DECODE_MAX_STORED {
        return None;
    }
    let kept = copies.map(|copies| {
        let of = StoredIdentity {
            primary,
            variance: hit.meta().variance,
            created: hit.meta().created,
        };
        (copies, of)
    });
    let plain = match kept.and_then(|(copies, of)| copies.get(&of)) {
        Some(plain) => plain,
        None => {
            let plain = decode_complete(coding, hit.chunks(), WHOLE_DECODE_MAX_DECODED)?;
            if let Some((copies, of)) = kept {
                copies.put(of, plain.clone());
            }
            plain
        }
    };
    compression::rewrite_head_for_decoded_body(head);
    head.insert_header(header::CONTENT_LENGTH, plain.len())
        .ok()?;
    Some(plain)
}

/// `Age` (seconds since the stored epoch, RFC 9111 §4.2.3) and the remaining freshness in seconds
/// (for `Cache-Status`) of `hit` at `now`.
fn age_and_ttl(hit: &CompleteObject, now: SystemTime) -> (u64, i64) {
    let meta = hit.meta();
    let age = now
        .duration_since(meta.epoch)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    (age, freshness::remaining_secs(meta.fresh_until, now))
}

/// The memory file holding `hit`'s body, when it is kept in one, as the body to send from
/// `offset` on (`storage::memory::mapped`).
pub(super) fn file_body(hit: &CompleteObject, offset: usize) -> Option<FileBody<'_>> {
    hit.body_file().map(|file| FileBody {
        fd: file.fd(),
        offset: offset as u64,
    })
}

/// Builds the response head for a fast hit: the stored head, `Age` (RFC 9111 §4), and the body's
/// `Content-Length` when the stored head has none; with the stored names' case when `keep_case`.
fn response_head(hit: &CompleteObject, age: u64, keep_case: bool) -> Box<ResponseHeader> {
    let stored = &hit.meta().header;
    let mut head = Box::new(if keep_case {
        stored.clone()
    } else {
        // no case map: `From<Parts>` builds the case-less variant
        ResponseHeader::from(stored.as_owned_parts())
    });
    let _ = head.insert_header(header::AGE, age);
    head.set_version(http::Version::HTTP_11);
    let no_body = matches!(head.status.as_u16(), 204 | 304);
    if !no_body && !head.headers.contains_key(header::CONTENT_LENGTH) {
        let _ = head.insert_header(header::CONTENT_LENGTH, hit.body_len());
    }
    if keep_case && head.status == http::StatusCode::OK {
        // its ranges may be asked for, as the standard path's range filter says (a part or a
        // decoded body, built from this head, takes it off again, as there). Not for an HTTP/2
        // client: the field cost an h2 hit about 1,000 more instructions (+3 %, callgrind), so
        // its fast-path hits go without it, unlike its standard-path hits (left, noted)
        let _ = head.insert_header(header::ACCEPT_RANGES, "bytes");
    }
    head
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks() -> Vec<Bytes> {
        ["abc", "defg", "", "hij"]
            .into_iter()
            .map(|text| Bytes::from_static(text.as_bytes()))
            .collect()
    }

    fn joined(part: &[Bytes]) -> String {
        part.iter()
            .map(|chunk| std::str::from_utf8(chunk).unwrap())
            .collect()
    }

    #[test]
    fn a_part_is_the_bytes_of_its_range_across_chunks() {
        let whole = "abcdefghij";
        for start in 0..=whole.len() {
            for end in start..=whole.len() {
                let part = part_of(&chunks(), start..end);
                assert_eq!(joined(&part), &whole[start..end], "{start}..{end}");
                assert!(part.iter().all(|chunk| !chunk.is_empty()) || start == end);
            }
        }
    }
}
