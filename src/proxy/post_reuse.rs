//! Reusing a POST response for later GETs of the same URL (RFC 9110 §9.3.3, RFC 9111 §4), behind
//! `cache.reuse_post_responses` (off by default).
//!
//! RFC 9110 §9.3.3: "Responses to POST requests are only cacheable when they include explicit
//! freshness information and a Content-Location header field that has the same value as the
//! POST's target URI", and a cache may then use it for later GET and HEAD requests. Such a
//! response says "this is now the representation of the URL", so storing it saves the GET that
//! would otherwise follow (a form that answers with the updated page).
//!
//! Off by default because it lets a POST, whose outcome depends on its body and on who sent it,
//! decide what every later GET of the URL receives: an application that echoes a
//! `Content-Location` and a `max-age` on a POST answer it did not mean for everyone (a page
//! saying "your comment was posted", rendered for one user) would have that page served to
//! all, which no other response can cause without the origin's own GET. An operator turns it on
//! for origins known to follow §9.3.3.
//!
//! What is stored: a `200` to a POST whose `Content-Location` names the request's target (the
//! same path and query, on the same host if absolute), with explicit freshness (`s-maxage`,
//! `max-age` or `Expires`, not heuristic, default or override) and everything the policy asks of
//! any stored response ([`CachePolicy::post_response_decision`]); not a response with `Vary` or
//! `Content-Encoding` (their variant and coding were chosen for the POST's request, which no GET
//! key records). Its body is kept as it streams to the client ([`on_upstream_body`], at most
//! `cache.max_object_size`) and written under the URL's key when the request has ended well
//! ([`on_request_end`], from `logging`, after invalidation (RFC 9111 §4.4) removed the old entry,
//! and once the millisecond that invalidation's stamp covers has passed).

use super::invalidation;
use crate::policy::CachePolicy;
use crate::storage::ban_list::{ms_after, past_the_stamp};
use bytes::Bytes;
use pingora_cache::storage::Storage;
use pingora_cache::trace::Span;
use pingora_cache::{CacheKey, CacheMeta, RespCacheable};
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::SystemTime;

/// A POST response being kept for later GETs: its metadata and the body received so far.
pub struct PostReuse {
    meta: CacheMeta,
    body: Vec<Bytes>,
    len: usize,
    complete: bool,
}

/// `upstream_response_filter`: whether `resp` to the POST `req` may be stored for later GETs; if
/// so, what its body will be collected into.
pub fn on_upstream_response(
    policy: &CachePolicy,
    req: &RequestHeader,
    resp: &ResponseHeader,
    request_time: SystemTime,
) -> Option<Box<PostReuse>> {
    if req.method != http::Method::POST
        || resp.status != http::StatusCode::OK
        || resp.headers.contains_key(http::header::VARY)
        || resp.headers.contains_key(http::header::CONTENT_ENCODING)
        || !names_the_target(req, resp)
    {
        return None;
    }
    match policy.post_response_decision(req, resp, request_time) {
        RespCacheable::Cacheable(meta) => Some(Box::new(PostReuse {
            meta,
            body: Vec::new(),
            len: 0,
            complete: false,
        })),
        RespCacheable::Uncacheable(_) => None,
    }
}

/// `upstream_response_body_filter`: keeps each chunk; a body larger than `max_size` is not kept.
pub fn on_upstream_body(
    reuse: &mut Option<Box<PostReuse>>,
    body: &Option<Bytes>,
    end_of_stream: bool,
    max_size: usize,
) {
    let Some(kept) = reuse else {
        return;
    };
    if let Some(chunk) = body {
        kept.len += chunk.len();
        if kept.len > max_size {
            *reuse = None;
            return;
        }
        kept.body.push(chunk.clone());
    }
    kept.complete |= end_of_stream;
}

/// `logging`: stores the whole response under `key` (the URL's GET key) when its body arrived
/// complete and the request ended without an error. A failed write leaves the cache as it was.
pub async fn on_request_end(
    kept: Box<PostReuse>,
    storage: &'static (dyn Storage + Sync),
    key: &CacheKey,
    failed: bool,
) {
    if failed || !kept.complete {
        return;
    }
    // The purge this POST made (RFC 9111 §4.4, in `upstream_response_filter`) covers whatever
    // was stored up to the millisecond after it was issued (ban stamps round up, so that a fill
    // racing a purge is covered): a store begun within that millisecond, the common case with a
    // fast origin, was judged purged and never served. Begin it after.
    past_the_stamp(ms_after(SystemTime::now())).await;
    if let Err(e) = store_whole(storage, key, &kept.meta, kept.body).await {
        log::warn!("storing a POST response for reuse failed: {e}");
    }
}

/// Stores a response received whole, `meta` and `body`, under `key`, through the storage's own
/// miss handler (what Pingora's cache state machine does for a miss it stores). Also used for
/// the storable answer to a pass forwarded directly (`super::direct_pass`).
pub async fn store_whole(
    storage: &'static (dyn Storage + Sync),
    key: &CacheKey,
    meta: &CacheMeta,
    body: Vec<Bytes>,
) -> pingora_error::Result<()> {
    let span = Span::inactive().handle();
    let mut miss = storage.get_miss_handler(key, meta, &span).await?;
    for chunk in body {
        miss.write_body(chunk, false).await?;
    }
    miss.finish().await.map(|_| ())
}

/// Whether the response's one `Content-Location` names the request's target URI.
fn names_the_target(req: &RequestHeader, resp: &ResponseHeader) -> bool {
    let mut values = resp.headers.get_all(http::header::CONTENT_LOCATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
    value
        .to_str()
        .ok()
        .and_then(|v| invalidation::same_host_target(super::cache_key::request_host(req), v))
        .is_some_and(|path| path == target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn policy() -> CachePolicy {
        let toml = "upstream = \"127.0.0.1:1\"\n[cache]\nreuse_post_responses = true";
        CachePolicy::new(&Config::from_toml(toml).unwrap().cache)
    }

    fn post() -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/form?id=1", None).unwrap();
        req.insert_header("host", "shop.example").unwrap();
        req
    }

    fn offered(headers: &[(&str, &str)]) -> bool {
        let resp = crate::policy::test_headers::response(headers);
        on_upstream_response(&policy(), &post(), &resp, SystemTime::now()).is_some()
    }

    #[test]
    fn only_a_post_answer_naming_its_target_with_explicit_freshness() {
        let fresh = ("cache-control", "max-age=60");
        assert!(offered(&[fresh, ("content-location", "/form?id=1")]));
        assert!(offered(&[
            fresh,
            ("content-location", "http://SHOP.example/form?id=1")
        ]));
        assert!(!offered(&[fresh, ("content-location", "/form?id=2")]));
        assert!(!offered(&[
            fresh,
            ("content-location", "http://other.example/form?id=1")
        ]));
        assert!(!offered(&[fresh]));
        let here = ("content-location", "/form?id=1");
        assert!(!offered(&[here]), "no freshness");
        assert!(
            !offered(&[here, ("last-modified", "Sat, 01 Jan 2022 00:00:00 GMT")]),
            "heuristic freshness is not explicit"
        );
        assert!(!offered(&[here, ("cache-control", "max-age=60, no-store")]));
        assert!(!offered(&[here, fresh, ("vary", "accept-language")]));
        assert!(!offered(&[here, fresh, ("set-cookie", "a=b")]));
        let expires =
            httpdate::fmt_http_date(SystemTime::now() + std::time::Duration::from_secs(60));
        assert!(offered(&[here, ("expires", &expires)]));
    }
}
