//! Partial content (RFC 9111 §3.3-3.4), when `[cache.partial]` is enabled: a `206` from the
//! origin is stored, a later range inside it is answered from it, and a range beyond it fetches
//! only the missing part and combines the two, into a complete stored response when they make
//! one.
//!
//! The room is entered after Pingora's lookup found no complete object for the URL
//! (`proxy_upstream_filter`, [`PartialContent::on_miss`]), for a `GET` with one byte range and
//! no validators or directives (anything else takes the standard path, which fetches the whole
//! response). There, with the URL's stored partial object (`storage::partial`, this node's
//! memory tier only):
//!
//! * the range lies inside it and it is fresh: a `206` from it, `Cache-Status: hit` (a complete
//!   object is never served from it: only ranges it holds);
//! * the range starts inside it or after it and ends after it, and it has a strong `ETag`: the
//!   missing tail is fetched (`Range: bytes=<end>-`, `If-Range: <etag>`), the client gets its
//!   range from the stored bytes and the fetched ones, and the two are combined
//!   (`fwd=partial`);
//! * otherwise the client's own range is forwarded.
//!
//! Forwarded ranges ask for identity (a range of a compressed copy cannot be decoded), and the
//! `206` that comes back is stored when it is one representation's bytes (`Content-Range` with a
//! known length, no coding, no `Vary` but `Accept-Encoding`) and the policy would store the
//! complete response, with the same freshness: the request rules' overrides (`ttl`, `grace`, no
//! `Set-Cookie` under `cache_anonymous_only`) included. It is combined with the stored part when both carry the same strong `ETag`
//! and the spans overlap or touch; when the union is the whole representation it is stored as a
//! complete `200` in the memory tier before the last byte reaches the client (and written to
//! memcached in the background, as a finished fill is), and the part is dropped. A `200` instead (the origin ignores ranges, or `If-Range` failed) is the standard
//! path's: it is stored whole and the client's range is served from it; it supersedes the part.

use super::cache_status::{CacheStatus, Forward};
use crate::compression::{content_coding, ContentCoding};
use crate::policy::{freshness, vary};
use crate::storage::memory::MemoryTier;
use crate::storage::object::{owned_chunk, StoredMeta};
use crate::storage::partial::{self, ByteSpan, PartialObject};
use crate::storage::tiered::TieredStorage;
use bytes::{Buf, Bytes};
use http::header;
use pingora_cache::key::HashBinary;
use pingora_cache::{CacheKey, CacheMeta, CachePhase, RespCacheable};
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{RangeType, Session};
use std::ops::Range;
use std::time::SystemTime;

/// Request fields that leave a range request to the standard path: validators (the stored part
/// is not evaluated against them) and the client's cache directives.
const LEAVE_TO_STANDARD_PATH: [header::HeaderName; 7] = [
    header::IF_RANGE,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::CACHE_CONTROL,
    header::PRAGMA,
];

/// The partial-content room: where partial objects and completed objects are kept (this node's
/// memory tier), and the shared tier a completed object is also written to, when there is one.
pub struct PartialContent {
    memory: &'static MemoryTier,
    shared: Option<&'static TieredStorage>,
}

/// What partial content is doing for one request, kept in the request context (empty, one null
/// pointer, for every request it is not involved in).
#[derive(Default)]
pub struct PartialCtx(Option<Box<PartialState>>);

struct PartialState {
    primary: HashBinary,
    plan: Plan,
    collecting: Option<Collecting>,
    rewrite: Option<Rewrite>,
    /// The origin's `206` is being stored (for `Cache-Status: stored`).
    storing: bool,
    /// The fetched tail completes the stored part (`Cache-Status: fwd=partial`).
    completes: bool,
}

/// What is asked of the origin.
enum Plan {
    /// The client's own range, and a stored part of the same URL to combine with, if any.
    Forward {
        range: http::HeaderValue,
        earlier: Option<PartialObject>,
    },
    /// The stored part's missing tail, for a client range `client` starting inside or after it.
    Tail {
        earlier: PartialObject,
        client: Range<usize>,
    },
}

/// An origin `206` on its way into storage.
struct Collecting {
    key: CacheKey,
    /// The complete representation's head (a `200` with the complete length) and freshness.
    meta: CacheMeta,
    span: ByteSpan,
    chunks: Vec<Bytes>,
    received: usize,
    /// A stored part of the same representation to combine with.
    earlier: Option<PartialObject>,
}

/// The client's range served from the stored part's bytes and the fetched tail.
struct Rewrite {
    /// Stored bytes the client asked for, sent before the fetched ones.
    prefix: Vec<Bytes>,
    /// Fetched bytes before the client's range.
    skip: usize,
    /// Fetched bytes still to send.
    remaining: usize,
    span: ByteSpan,
}

/// A range answered from a stored partial object.
pub struct PartialHit {
    /// The `206` head (stored head, `Content-Range`, `Content-Length`, `Age`), which the proxy
    /// completes with `Cache-Status` and `Via`.
    pub head: Box<ResponseHeader>,
    body: Vec<Bytes>,
    ttl: i64,
}

impl PartialHit {
    /// How this cache handled the request: a hit.
    pub fn cache_status(&self) -> CacheStatus {
        CacheStatus {
            hit: true,
            ttl: Some(self.ttl),
            ..Default::default()
        }
    }

    /// Writes the head and the body to the client.
    pub async fn send(self, session: &mut Session) -> Result<()> {
        session.write_response_header(self.head, false).await?;
        let last = self.body.len().saturating_sub(1);
        for (i, chunk) in self.body.into_iter().enumerate() {
            session.write_response_body(Some(chunk), i == last).await?;
        }
        Ok(())
    }
}

impl PartialContent {
    /// The room over the memory tier and, when configured, the shared tier.
    pub fn new(memory: &'static MemoryTier, shared: Option<&'static TieredStorage>) -> Self {
        PartialContent { memory, shared }
    }

    /// `proxy_upstream_filter`, after a lookup that found no complete object: the answer from a
    /// stored part when it holds the range, else what to ask the origin (kept in `ctx`).
    pub fn on_miss(
        &self,
        phase: CachePhase,
        req: &RequestHeader,
        primary: HashBinary,
        ctx: &mut PartialCtx,
        now: SystemTime,
    ) -> Option<PartialHit> {
        ctx.0 = None;
        if phase != CachePhase::Miss {
            return None;
        }
        let range = single_range(req)?;
        let earlier = self.memory.partial_object(primary);
        let plan = match earlier {
            None => Plan::Forward {
                range,
                earlier: None,
            },
            Some(earlier) => match resolve(req, earlier.span.complete) {
                RangeType::Single(wanted) => {
                    let span = earlier.span;
                    if span.covers(wanted.start, wanted.end) && earlier.meta.fresh_until > now {
                        return Some(hit(&earlier, wanted, now));
                    }
                    let combinable = partial::strong_etag(&earlier.meta.header).is_some();
                    if combinable && wanted.start >= span.start && wanted.end > span.end {
                        Plan::Tail {
                            earlier,
                            client: wanted,
                        }
                    } else {
                        Plan::Forward {
                            range,
                            earlier: combinable.then_some(earlier),
                        }
                    }
                }
                // unsatisfiable against the stored length: the origin says what is true now
                _ => Plan::Forward {
                    range,
                    earlier: None,
                },
            },
        };
        ctx.0 = Some(Box::new(PartialState {
            primary,
            plan,
            collecting: None,
            rewrite: None,
            storing: false,
            completes: false,
        }));
        None
    }

    /// `upstream_response_filter`: a `200` supersedes the stored part; a `206` of one
    /// representation that the policy would store starts being collected, and a tail that
    /// completes the stored part sets up the client's range from both. `decide` is the storing
    /// decision a complete response of this request gets (the policy with the request rules'
    /// overrides), asked about the complete head the `206` is part of; `key` is the URL's cache
    /// key, asked for only when something will be stored.
    pub fn on_upstream_response(
        &self,
        resp: &ResponseHeader,
        decide: impl FnOnce(&ResponseHeader) -> RespCacheable,
        ctx: &mut PartialCtx,
        key: impl FnOnce() -> CacheKey,
    ) {
        let Some(state) = ctx.0.as_mut() else {
            return;
        };
        if resp.status == http::StatusCode::OK {
            self.memory.remove_partial(state.primary);
            return;
        }
        let Some(span) = ByteSpan::of(resp) else {
            return;
        };
        let one_representation = content_coding(resp) == ContentCoding::Identity
            && vary::vary_names(resp).all(|name| name == "accept-encoding");
        if !one_representation {
            return;
        }
        let complete = partial::complete_head(resp, span);
        let RespCacheable::Cacheable(meta) = decide(&complete) else {
            return;
        };
        let earlier = match &state.plan {
            Plan::Forward { earlier, .. } => earlier.as_ref(),
            Plan::Tail { earlier, .. } => Some(earlier),
        }
        .filter(|e| partial::same_representation(&e.meta.header, e.span, resp, span))
        .cloned();
        if let (
            Plan::Tail {
                earlier: stored,
                client,
            },
            Some(_),
        ) = (&state.plan, &earlier)
        {
            if span.start == stored.span.end && span.end >= client.end {
                state.rewrite = Some(Rewrite::new(stored, span, client.clone()));
                state.completes = true;
            }
        }
        state.collecting = Some(Collecting {
            key: key(),
            meta,
            span,
            chunks: Vec::new(),
            received: 0,
            earlier,
        });
        state.storing = true;
    }

    /// `upstream_response_body_filter`: collects the `206`; at its end, stores it (combined with
    /// the stored part when they join), as a complete object when the union is whole.
    pub fn on_upstream_body(&self, ctx: &mut PartialCtx, body: &Option<Bytes>, end: bool) {
        let Some(state) = ctx.0.as_mut() else {
            return;
        };
        let Some(collecting) = state.collecting.as_mut() else {
            return;
        };
        if let Some(data) = body {
            collecting.received += data.len();
            if collecting.received > collecting.span.len() {
                // more than the Content-Range promised: not stored
                state.collecting = None;
                return;
            }
            collecting.chunks.push(owned_chunk(data));
        }
        if end {
            if let Some(done) = state.collecting.take() {
                if done.received == done.span.len() {
                    self.store(state.primary, done);
                }
            }
        }
    }

    /// Stores a collected `206`: combined with the earlier part when they join, as a complete
    /// object when the union is the whole representation, else as the URL's partial object.
    fn store(&self, primary: HashBinary, done: Collecting) {
        let Collecting {
            key,
            meta,
            span,
            chunks,
            earlier,
            ..
        } = done;
        let combined = earlier
            .as_ref()
            .and_then(|e| partial::combine((e.span, e.body.chunks()), (span, &chunks)));
        let (span, chunks) = combined.unwrap_or((span, chunks));
        let mut stored = StoredMeta::from_meta(&meta);
        // slices of the earlier part are copied, so the object owns exactly what it is charged,
        // in one block as a fill's body is
        let body = crate::storage::memory::owned_body(&chunks);
        if span.is_whole() {
            // stored before the last byte reaches the client, so its next request finds it
            if self.memory.store_complete(&key, stored, body) {
                self.memory.remove_partial(primary);
                if let Some(shared) = self.shared {
                    shared.share(key);
                }
            }
            return;
        }
        stored.header = partial::partial_head(&stored.header, span);
        self.memory.store_partial(&key, stored, body);
    }
}

impl Rewrite {
    /// The client's `client` range from the stored part `stored` and the fetched tail `fetched`.
    fn new(stored: &PartialObject, fetched: ByteSpan, client: Range<usize>) -> Self {
        let from_stored = client.start.min(stored.span.end);
        Rewrite {
            prefix: partial::slice(
                stored.body.chunks(),
                stored.span.start,
                from_stored,
                stored.span.end,
            ),
            skip: client.start.saturating_sub(fetched.start),
            remaining: client.end - client.start.max(fetched.start),
            span: ByteSpan {
                start: client.start,
                end: client.end,
                complete: fetched.complete,
            },
        }
    }
}

/// `upstream_request_filter`: the range to ask the origin for, in identity.
pub fn on_upstream_request(ctx: &PartialCtx, upstream: &mut RequestHeader) -> Result<()> {
    let Some(state) = &ctx.0 else {
        return Ok(());
    };
    match &state.plan {
        Plan::Forward { range, .. } => {
            upstream.insert_header(header::RANGE, range.clone())?;
        }
        Plan::Tail { earlier, .. } => {
            upstream.insert_header(header::RANGE, format!("bytes={}-", earlier.span.end))?;
            if let Some(etag) = partial::strong_etag(&earlier.meta.header) {
                upstream.insert_header(header::IF_RANGE, etag)?;
            }
        }
    }
    upstream.insert_header(header::ACCEPT_ENCODING, "identity")?;
    Ok(())
}

/// The `206` on its way into storage (`PartialContent::on_upstream_response`) is not kept:
/// fetched while another claim held the URL's fill lease (`MissClaim::Elsewhere`), it is refused
/// as the tiered store refuses such a fill. Only the storing: the client's range (and a fetched
/// tail's rewrite with a stored part) is served as before.
pub fn keep_nothing(ctx: &mut PartialCtx) {
    if let Some(state) = ctx.0.as_mut() {
        state.collecting = None;
        state.storing = false;
    }
}

/// `response_filter`: `Cache-Status` says the `206` was stored, and `fwd=partial` when it
/// completed a stored part.
pub fn on_cache_status(ctx: &PartialCtx, status: &mut CacheStatus) {
    let Some(state) = &ctx.0 else {
        return;
    };
    if state.storing {
        status.stored = true;
        status.detail = None;
    }
    if state.completes {
        status.fwd = Some(Forward::Partial);
    }
}

/// `response_filter`: the head of the client's range, when it is served from a stored part and
/// a fetched tail.
pub fn on_downstream_head(ctx: &PartialCtx, resp: &mut ResponseHeader) -> Result<()> {
    let Some(rewrite) = ctx.0.as_ref().and_then(|s| s.rewrite.as_ref()) else {
        return Ok(());
    };
    resp.insert_header(header::CONTENT_RANGE, rewrite.span.content_range())?;
    resp.insert_header(header::CONTENT_LENGTH, rewrite.span.len())?;
    Ok(())
}

/// `response_body_filter`: the client's range from the stored bytes, then the fetched ones.
pub fn on_downstream_body(ctx: &mut PartialCtx, body: &mut Option<Bytes>) {
    let Some(rewrite) = ctx.0.as_mut().and_then(|s| s.rewrite.as_mut()) else {
        return;
    };
    let mut parts = std::mem::take(&mut rewrite.prefix);
    if let Some(mut data) = body.take() {
        let skip = rewrite.skip.min(data.len());
        data.advance(skip);
        rewrite.skip -= skip;
        let take = rewrite.remaining.min(data.len());
        data.truncate(take);
        rewrite.remaining -= take;
        if !data.is_empty() {
            parts.push(data);
        }
    }
    *body = match parts.len() {
        0 => None,
        1 => parts.pop(),
        _ => Some(Bytes::from(parts.concat())),
    };
}

/// The client's `Range` value, when the request is one the room handles: a `GET` with one
/// `bytes` range and none of [`LEAVE_TO_STANDARD_PATH`].
fn single_range(req: &RequestHeader) -> Option<http::HeaderValue> {
    if req.method != http::Method::GET
        || req
            .headers
            .keys()
            .any(|name| LEAVE_TO_STANDARD_PATH.contains(name))
    {
        return None;
    }
    let mut values = req.headers.get_all(header::RANGE).iter();
    let (value, None) = (values.next()?, values.next()) else {
        return None;
    };
    let text = value.to_str().ok()?.trim();
    let (unit, set) = text.split_once('=')?;
    (unit.trim().eq_ignore_ascii_case("bytes") && !set.contains(',')).then(|| value.clone())
}

/// The client's range against a representation `complete` bytes long, read as the standard path
/// reads it for a complete object (Pingora's own range filter).
fn resolve(req: &RequestHeader, complete: usize) -> RangeType {
    let mut whole = ResponseHeader::build(200, Some(2)).expect("static status");
    let _ = whole.insert_header(header::CONTENT_LENGTH, complete);
    pingora_proxy::range_header_filter(req, &mut whole, Some(2))
}

/// The `206` for `wanted` from a stored part that holds it.
fn hit(stored: &PartialObject, wanted: Range<usize>, now: SystemTime) -> PartialHit {
    let span = ByteSpan {
        start: wanted.start,
        end: wanted.end,
        complete: stored.span.complete,
    };
    let mut head = Box::new(partial::partial_head(&stored.meta.header, span));
    let age = now
        .duration_since(stored.meta.epoch)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let _ = head.insert_header(header::AGE, age);
    head.set_version(http::Version::HTTP_11);
    PartialHit {
        head,
        body: partial::slice(
            stored.body.chunks(),
            stored.span.start,
            wanted.start,
            wanted.end,
        ),
        ttl: freshness::remaining_secs(stored.meta.fresh_until, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::object::Body;

    fn req(fields: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("GET", b"/v", None).unwrap();
        for (k, v) in fields {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn only_single_byte_ranges_without_validators_or_directives_are_handled() {
        assert!(single_range(&req(&[("range", "bytes=0-4")])).is_some());
        assert!(single_range(&req(&[("range", "Bytes=-5")])).is_some());
        assert!(single_range(&req(&[("range", "bytes=0-4,6-7")])).is_none());
        assert!(single_range(&req(&[("range", "lines=1-2")])).is_none());
        assert!(single_range(&req(&[])).is_none());
        assert!(single_range(&req(&[("range", "bytes=0-4"), ("if-range", "\"e\"")])).is_none());
        assert!(single_range(&req(&[
            ("range", "bytes=0-4"),
            ("cache-control", "no-cache")
        ]))
        .is_none());
        let mut head = req(&[("range", "bytes=0-4")]);
        head.set_method(http::Method::HEAD);
        assert!(single_range(&head).is_none());
    }

    #[test]
    fn ranges_resolve_as_the_standard_path_resolves_them() {
        let single = |r: &str| match resolve(&req(&[("range", r)]), 10) {
            RangeType::Single(range) => Some(range),
            _ => None,
        };
        assert_eq!(single("bytes=0-4"), Some(0..5));
        assert_eq!(single("bytes=-3"), Some(7..10));
        assert_eq!(single("bytes=5-"), Some(5..10));
        assert_eq!(single("bytes=8-100"), Some(8..10));
        assert!(matches!(
            resolve(&req(&[("range", "bytes=20-30")]), 10),
            RangeType::Invalid
        ));
    }

    fn stored_part(span: ByteSpan, bytes: &'static [u8]) -> PartialObject {
        let mut head = ResponseHeader::build(206, None).unwrap();
        head.insert_header("content-range", span.content_range())
            .unwrap();
        let mut meta = StoredMeta::empty();
        meta.header = head;
        PartialObject::new(
            std::sync::Arc::new(meta),
            Body::from_chunks(vec![Bytes::from_static(bytes)]),
        )
        .unwrap()
    }

    fn rewritten(mut ctx: PartialCtx, fetched: &[&'static [u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in fetched {
            let mut body = Some(Bytes::from_static(chunk));
            on_downstream_body(&mut ctx, &mut body);
            out.extend_from_slice(&body.unwrap_or_default());
        }
        out
    }

    fn ctx_with(rewrite: Rewrite) -> PartialCtx {
        PartialCtx(Some(Box::new(PartialState {
            primary: [0; 16],
            plan: Plan::Forward {
                range: http::HeaderValue::from_static("bytes=0-"),
                earlier: None,
            },
            collecting: None,
            rewrite: Some(rewrite),
            storing: false,
            completes: false,
        })))
    }

    #[test]
    fn a_client_range_is_served_from_the_stored_part_and_the_fetched_tail() {
        let stored = stored_part(
            ByteSpan {
                start: 0,
                end: 5,
                complete: 10,
            },
            b"01234",
        );
        let fetched = ByteSpan {
            start: 5,
            end: 10,
            complete: 10,
        };
        // starting inside the stored part
        let ctx = ctx_with(Rewrite::new(&stored, fetched, 3..10));
        assert_eq!(rewritten(ctx, &[b"56", b"789"]), b"3456789");
        // starting after it, ending before the end
        let ctx = ctx_with(Rewrite::new(&stored, fetched, 7..9));
        assert_eq!(rewritten(ctx, &[b"56", b"789"]), b"78");
        // exactly the missing part
        let ctx = ctx_with(Rewrite::new(&stored, fetched, 5..10));
        assert_eq!(rewritten(ctx, &[b"5678", b"9"]), b"56789");
    }
}
