//! PURGE: removing a URL from the cache on request, for the clients `cache.purge_from` lists.
//!
//! Whether a request is a purge, and whether its client may purge, is decided once, in
//! `request_filter` ([`on_request`]), and kept in the request context as a [`PurgeRequest`]. A
//! PURGE from a listed client (loopback by default) is [`PurgeRequest::Allowed`]; from any other
//! client it is refused with 405 there and then ([`refuse`]), as Varnish's customary `acl purge`
//! does.
//!
//! An allowed PURGE is carried out there too ([`carry_out`]) by the invalidation service, as a
//! purge through the admin API is: this node's copy of the URL and of every variant, the URL's
//! entry in memcached, and, through the cluster's invalidation log, every other node's copy
//! within the poll interval (see [`crate::invalidation`]). `Soft-Purge: 1` marks them stale
//! instead. The answer has an empty body and says what was reached in `Lacquer-Purge`
//! (`here=1+0; memcached=deleted; published=3/3; pending=none`): 200 when something was stored,
//! 404 when nothing was, 202 when part of it is pending (a server did not answer; retried in the
//! background, and the old entry is not served meanwhile), 503 when no memcached server took it,
//! 405 when the cache is disabled. It does not wait for the other nodes (the admin API can).
//!
//! The PURGE is decided before the request rules run, but what it removes is the key a GET of
//! its URL would use, so the rules are applied to a GET copy of it first ([`keyed_as_a_get`]):
//! `PURGE /page?utm_source=x` under `drop_query = ["utm_"]` purges `/page`, the page that GET
//! stored.

use crate::invalidation::target::Target;
use crate::invalidation::{Invalidator, Request};
use crate::proxy::cache_key;
use crate::rules::RequestRules;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use std::borrow::Cow;
use std::net::IpAddr;

/// The purge decision for one request, kept in the request context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PurgeRequest {
    /// Not a PURGE.
    #[default]
    None,
    /// A PURGE from a client in `cache.purge_from`: Pingora's purge path answers it.
    Allowed,
    /// A PURGE from any other client: answered 405 in `request_filter`.
    Refused,
}

impl PurgeRequest {
    /// Whether this request is a purge to carry out.
    pub fn allowed(self) -> bool {
        self == PurgeRequest::Allowed
    }
}

/// `request_filter`: decides whether the request is a PURGE and whether `client` may send one.
/// `purge_from` is `cache.purge_from`.
#[inline]
pub fn on_request(
    method: &http::Method,
    client: impl FnOnce() -> Option<IpAddr>,
    purge_from: &[crate::config::address_range::AddressRange],
) -> PurgeRequest {
    if method.as_str() != "PURGE" {
        return PurgeRequest::None;
    }
    let listed = client().is_some_and(|ip| purge_from.iter().any(|range| range.contains(ip)));
    if listed {
        PurgeRequest::Allowed
    } else {
        PurgeRequest::Refused
    }
}

/// Answers a refused PURGE: 405, as for a method this server does not allow. Returns that the
/// request is answered.
pub async fn refuse(session: &mut Session) -> Result<bool> {
    session.respond_error(405).await?;
    Ok(true)
}

/// Carries out an allowed PURGE of the request's URL from `client` and answers it (see the
/// module docs); `cache_enabled` is `cache.enabled`, `https` the request's scheme (the key has
/// it), `rules` the request rules a GET of the URL would meet. The URL's page of the other
/// scheme is purged too, and the answer is about the request's own. Returns that the request
/// is answered.
pub async fn carry_out(
    session: &mut Session,
    invalidator: &'static Invalidator,
    cache_enabled: bool,
    client: Option<IpAddr>,
    https: bool,
    rules: &RequestRules,
) -> Result<bool> {
    if !cache_enabled {
        session.respond_error(405).await?;
        return Ok(true);
    }
    let soft = session
        .req_header()
        .headers
        .get("soft-purge")
        .is_some_and(|v| matches!(v.as_bytes(), b"1" | b"true" | b"yes"));
    // the GET copy is dropped here, before anything is awaited
    let (own, other) = {
        let req = keyed_as_a_get(session.req_header(), rules);
        let path = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let host = cache_key::request_host(&req);
        let request_for = |https: bool| Request {
            target: Target::page(https, host, path),
            soft,
            asked_by: format!(
                "{} (PURGE)",
                client.map_or_else(|| "unknown".to_string(), |ip| ip.to_string())
            ),
            wait: false,
            only_if_stored: false,
        };
        (request_for(https), request_for(!https))
    };
    if let Err(refused) = invalidator.invalidate(other).await {
        log::warn!("purge of the other scheme's page refused: {}", refused.0);
    }
    let (status, summary) = match invalidator.invalidate(own).await {
        Ok(report) if !report.complete => (report.status(), report.summary()),
        Ok(report) if report.found() => (200, report.summary()),
        Ok(report) => (404, report.summary()),
        Err(refused) => (400, refused.0),
    };
    let mut head = ResponseHeader::build(status, Some(2))?;
    head.insert_header(http::header::CONTENT_LENGTH, 0)?;
    head.insert_header("lacquer-purge", summary)?;
    session.write_response_header(Box::new(head), true).await?;
    Ok(true)
}

/// The PURGE as a GET of its URL would be keyed: with request rules, a GET copy of it that they
/// have rewritten (the query they drop or sort, a `Host` they set); without, the request itself.
pub fn keyed_as_a_get<'a>(
    purge: &'a RequestHeader,
    rules: &RequestRules,
) -> Cow<'a, RequestHeader> {
    if rules.rules().is_empty() {
        return Cow::Borrowed(purge);
    }
    let mut get = purge.clone();
    get.set_method(http::Method::GET);
    // what else the rules decide (pass, TTL, ...) is about serving a GET, not about its key
    let _verdict = rules.on_request(&mut get);
    Cow::Owned(get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::address_range::AddressRange;

    #[test]
    fn only_a_purge_from_a_listed_client_is_allowed() {
        let ranges = [AddressRange::parse("192.0.2.0/24").unwrap()];
        let purge = http::Method::from_bytes(b"PURGE").unwrap();
        let from = |ip: &str| {
            let ip: IpAddr = ip.parse().unwrap();
            move || Some(ip)
        };
        assert_eq!(
            on_request(&purge, from("192.0.2.1"), &ranges),
            PurgeRequest::Allowed
        );
        // loopback is not special: only the list decides
        assert_eq!(
            on_request(&purge, from("127.0.0.1"), &ranges),
            PurgeRequest::Refused
        );
        assert_eq!(on_request(&purge, || None, &ranges), PurgeRequest::Refused);
        assert_eq!(
            on_request(&http::Method::GET, from("192.0.2.1"), &ranges),
            PurgeRequest::None
        );
    }
}
