//! Invalidation by unsafe methods (RFC 9111 §4.4).
//!
//! A successful POST, PUT, DELETE, PATCH (or any method not known to be safe) changes the resource,
//! so the cache must not keep serving what it stored for the target URI, nor for the URIs in
//! `Location` and `Content-Location` when they are on the same host. Every variant stored under
//! those URIs goes: the storage's purge of a URL takes its variants with it (and, with a memcached
//! cluster, the URL's entry there), as for a PURGE ([`super::purge`]).

use super::cache_key;
use http::{Method, StatusCode};
use pingora_cache::storage::{PurgeTarget, PurgeType, Storage};
use pingora_cache::trace::Span;
use pingora_cache::CacheKey;
use pingora_http::{RequestHeader, ResponseHeader};

/// `upstream_response_filter`: when `resp` is a successful answer to an unsafe `req`, removes
/// what `storage` holds for the request's URI and the same-host URIs the response points to.
pub async fn on_upstream_response(
    storage: &'static (dyn Storage + Sync),
    req: &RequestHeader,
    resp: &ResponseHeader,
) {
    if invalidates(&req.method, resp.status) {
        let keys = targets(cache_key::request_host(req), req, resp);
        purge(storage, &keys).await;
    }
}

/// Whether a response to `method` with `status` invalidates: an unsafe method and a non-error
/// status (2xx or 3xx).
pub fn invalidates(method: &Method, status: StatusCode) -> bool {
    let safe = matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    !safe && (status.is_success() || status.is_redirection())
}

/// The same-host path and query a `Location` / `Content-Location` value points to, if any
/// (also how [`super::post_reuse`] checks that a POST answer names its own target).
pub fn same_host_target(host: &str, value: &str) -> Option<String> {
    let value = value.trim();
    if value.starts_with('/') && !value.starts_with("//") {
        return Some(value.to_string());
    }
    let uri: http::Uri = value.parse().ok()?;
    let authority = uri.authority()?;
    if !authority.as_str().eq_ignore_ascii_case(host) {
        return None;
    }
    Some(
        uri.path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_string(),
    )
}

/// The cache keys an invalidating response removes: the target URI and same-host
/// `Location` / `Content-Location`. `host` is the request's, as sent.
fn targets(host: &str, req: &RequestHeader, resp: &ResponseHeader) -> Vec<CacheKey> {
    let mut paths = vec![req
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string()];
    for name in [http::header::LOCATION, http::header::CONTENT_LOCATION] {
        for value in resp.headers.get_all(name) {
            if let Some(path) = value.to_str().ok().and_then(|v| same_host_target(host, v)) {
                paths.push(path);
            }
        }
    }
    paths.sort();
    paths.dedup();
    paths.iter().map(|p| cache_key::of_url(host, p)).collect()
}

/// Purges each key (and its variants) from the storage.
async fn purge(storage: &'static (dyn Storage + Sync), keys: &[CacheKey]) {
    let span = Span::inactive().handle();
    for key in keys {
        let compact = key.to_compact();
        if let Err(e) = storage
            .purge(
                PurgeTarget::Active(&compact),
                PurgeType::Invalidation,
                &span,
            )
            .await
        {
            log::warn!("invalidation of {compact} failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_successful_unsafe_methods_invalidate() {
        assert!(invalidates(&Method::POST, StatusCode::OK));
        assert!(invalidates(&Method::DELETE, StatusCode::SEE_OTHER));
        assert!(invalidates(
            &Method::from_bytes(b"FROB").unwrap(),
            StatusCode::OK
        ));
        assert!(!invalidates(&Method::GET, StatusCode::OK));
        assert!(!invalidates(
            &Method::POST,
            StatusCode::INTERNAL_SERVER_ERROR
        ));
        assert!(!invalidates(&Method::PUT, StatusCode::NOT_FOUND));
    }

    #[test]
    fn location_targets_must_be_same_host() {
        assert_eq!(same_host_target("a.test", "/x?y"), Some("/x?y".into()));
        assert_eq!(
            same_host_target("a.test", "http://A.test/z"),
            Some("/z".into())
        );
        assert_eq!(same_host_target("a.test", "http://b.test/z"), None);
        assert_eq!(same_host_target("a.test", "//b.test/z"), None);
    }
}
