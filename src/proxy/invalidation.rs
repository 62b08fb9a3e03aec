//! Invalidation by unsafe methods (RFC 9111 §4.4).
//!
//! A successful POST, PUT, DELETE, PATCH (or any method not known to be safe) changes the resource,
//! so the cache must not keep serving what it stored for the target URI, nor for the URIs in
//! `Location` and `Content-Location` when they are on the same host. Every variant stored under
//! those URIs goes, as for a PURGE ([`super::purge`]), through the invalidation service: here, in
//! memcached, and (when something was stored) on every other node through the cluster's log.

use super::cache_key;
use super::headers::IpText;
use crate::invalidation::target::Target;
use crate::invalidation::{Invalidator, Request};
use http::{Method, StatusCode};
use pingora_http::{RequestHeader, ResponseHeader};
use std::net::IpAddr;

/// `upstream_response_filter`: when `resp` is a successful answer to an unsafe `req`, purges the
/// request's URI and the same-host URIs the response points to. `client` (the address the purge
/// is recorded as asked by) is only worked out then: most responses answer safe methods.
pub async fn on_upstream_response(
    invalidator: &'static Invalidator,
    req: &RequestHeader,
    resp: &ResponseHeader,
    client: impl FnOnce() -> Option<IpAddr>,
) {
    if invalidates(&req.method, resp.status) {
        // boxed: the purges' state (3.5 KB) stays out of this future, and so out of
        // `upstream_response_filter`'s, boxed for every answer an origin sends
        Box::pin(purge(invalidator, req, resp, client)).await;
    }
}

/// The purges of [`on_upstream_response`], for an answer that invalidates.
async fn purge(
    invalidator: &'static Invalidator,
    req: &RequestHeader,
    resp: &ResponseHeader,
    client: impl FnOnce() -> Option<IpAddr>,
) {
    let host = cache_key::request_host(req);
    let asked_by = asked_by(client(), &req.method, resp.status);
    // the resource changed whichever scheme it was reached by: both pages go
    for path in targets(host, req, resp) {
        for https in [false, true] {
            let request = Request {
                target: Target::page(https, host, &path),
                soft: false,
                asked_by: asked_by.clone(),
                wait: false,
                only_if_stored: true,
            };
            if let Err(refused) = invalidator.invalidate_quietly(request).await {
                log::warn!(
                    "invalidation of {} refused: {}",
                    // the request took its target: described again only when refused
                    Target::page(https, host, &path).describe(),
                    refused.0
                );
            }
        }
    }
}

/// Who asked for an unsafe method's invalidation, as its record says: `192.0.2.7 (POST 200)`.
/// Written without `format!` (the client's address by [`IpText`], the status by three digits):
/// `format!` and `IpAddr`'s `Display` cost about 3,000 of a POST's 74,000 instructions
/// (`bench/miss_instructions.sh --kind post`), for a text read only when the URL had something
/// stored or debug logging is on.
fn asked_by(client: Option<IpAddr>, method: &Method, status: StatusCode) -> String {
    let ip = client.map(IpText::new);
    let client = ip.as_ref().map_or("unknown", IpText::as_str);
    let method = method.as_str();
    let mut text = String::with_capacity(client.len() + method.len() + 7);
    text.push_str(client);
    text.push_str(" (");
    text.push_str(method);
    text.push(' ');
    // a status is three digits (`StatusCode` holds 100 to 999)
    let code = status.as_u16();
    for digit in [code / 100, code / 10 % 10, code % 10] {
        text.push(char::from(b'0' + digit as u8));
    }
    text.push(')');
    text
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
    // as keys compare hosts: an empty port is none, a final dot names the same host
    if cache_key::keyed_host_text(authority.as_str()) != cache_key::keyed_host_text(host) {
        return None;
    }
    Some(
        uri.path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_string(),
    )
}

/// The paths (with query) an invalidating response removes on `host` (the request's, as sent):
/// the target URI and same-host `Location` / `Content-Location`.
fn targets(host: &str, req: &RequestHeader, resp: &ResponseHeader) -> Vec<String> {
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
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asked_by_names_the_client_the_method_and_the_status() {
        let v4 = Some(IpAddr::from([192, 0, 2, 7]));
        assert_eq!(
            asked_by(v4, &Method::POST, StatusCode::OK),
            "192.0.2.7 (POST 200)"
        );
        let v6 = Some("2001:db8::1".parse().unwrap());
        assert_eq!(
            asked_by(v6, &Method::DELETE, StatusCode::SEE_OTHER),
            "2001:db8::1 (DELETE 303)"
        );
        let frob = Method::from_bytes(b"FROB").unwrap();
        assert_eq!(
            asked_by(None, &frob, StatusCode::from_u16(999).unwrap()),
            "unknown (FROB 999)"
        );
    }

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
        // an empty port is none, as in the key
        assert_eq!(
            same_host_target("a.test:", "http://a.test/z"),
            Some("/z".into())
        );
        assert_eq!(
            same_host_target("a.test", "http://a.test:/z"),
            Some("/z".into())
        );
    }
}
