//! PURGE: removing a URL from the cache on request, for the clients `cache.purge_from` lists.
//!
//! Whether a request is a purge, and whether its client may purge, is decided once, in
//! `request_filter` ([`on_request`]), and kept in the request context as a [`PurgeRequest`]. A
//! PURGE from a listed client (loopback by default) is [`PurgeRequest::Allowed`]; from any other
//! client it is refused with 405 there and then ([`refuse`]), as Varnish's customary `acl purge`
//! does. The later phases read that decision instead of judging the request again:
//! `request_cache_filter` enables the cache for an allowed purge (its method is otherwise not
//! cacheable), and `is_purge` hands it to Pingora's purge path.
//!
//! What a purge removes is the storage's business (`Storage::purge` on the configured store): this
//! node's copy of the URL and of every variant, and, with a memcached cluster, the URL's entry
//! there (`storage::tiered`). The answer is Pingora's, with an empty body: 200 when something
//! was stored, 404 when nothing was, 405 when the cache is off for the request (disabled, or the
//! PURGE said `Cache-Control: no-store`), 500 when the storage failed.

use pingora_error::Result;
use pingora_proxy::Session;
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

/// `request_filter`, for an allowed PURGE: removes the URL's page of the other scheme (the key
/// has the scheme, a PURGE names a URL); Pingora's purge path then removes the request's own.
pub async fn other_scheme(
    storage: &'static (dyn pingora_cache::storage::Storage + Sync),
    https: bool,
    req: &pingora_http::RequestHeader,
) {
    let path = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let key = super::cache_key::of_scheme_url(!https, super::cache_key::request_host(req), path);
    super::invalidation::purge(storage, &[key]).await;
}

/// Answers a refused PURGE: 405, as for a method this server does not allow. Returns that the
/// request is answered.
pub async fn refuse(session: &mut Session) -> Result<bool> {
    session.respond_error(405).await?;
    Ok(true)
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
