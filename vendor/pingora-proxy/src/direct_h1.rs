// LACQUER PATCH (direct forwarding): this file is new.

//! The request head an HTTP/1 upstream gets, prepared exactly as [`HttpProxy`]'s own HTTP/1
//! exchange prepares it, for a caller that makes the exchange itself.
//!
//! Lacquer forwards requests it will not cache (a POST, a URL last answered `no-store`) over its
//! own sequential HTTP/1 exchange rather than through the proxy's phases, its connector pool and
//! its two-task body relay: those cost most of a forwarded request's instructions. What the
//! origin receives must stay the same, so the steps `proxy_1to1` takes on the request head
//! around `upstream_request_filter` are offered here, unchanged, in two halves:
//! [`h1_upstream_request`] before the filter, [`finish_h1_upstream_request`] after it.
//!
//! [`HttpProxy`]: crate::HttpProxy

use crate::proxy_common::{
    finalize_h1_upstream_request_framing, reconcile_upstream_authority,
    sanitize_h1_upstream_request, set_h1_host_from_authority,
};
use crate::Session;
use http::Version;
use pingora_core::protocols::http::authority::{raw_target_authority, validate_request_authority};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::RequestHeader;

/// LACQUER PATCH (room for added fields): the fields a request forwarded by a proxy has room
/// for beyond its own.
pub const FIELDS_A_PROXY_ADDS: usize = 6;

/// A request head on its way to an HTTP/1 upstream, between the two halves of its preparation.
pub struct H1UpstreamRequest {
    /// The head: the client's, with its field names' case, hop-by-hop fields removed.
    pub head: RequestHeader,
    downstream_had_host: bool,
}

/// The first half, as `proxy_1to1` does it before `upstream_request_filter`: the client's head
/// copied with its field names' case, HTTP/1.1 (an HTTP/2 request's `:authority` as `Host`), and
/// the peer's hop-by-hop policy applied. For an HTTP/1 or HTTP/2 (not custom) downstream
/// session.
pub fn h1_upstream_request(session: &Session, peer: &HttpPeer) -> Result<H1UpstreamRequest> {
    let mut head = session.req_header().clone();
    // room for the fields a proxy adds to the request it forwards (`Via`, `X-Forwarded-*`...),
    // made before the case map is built so that both maps have it: added one by one, they grew
    // (rehashed) both maps two or three times per request
    head.reserve_fields(FIELDS_A_PROXY_ADDS);
    session.downstream_session.restore_header_case(&mut head);
    let downstream_had_host = head.headers.contains_key(http::header::HOST);
    head.set_version(Version::HTTP_11);
    if session.req_header().version == Version::HTTP_2 {
        set_h1_host_from_authority(&mut head).map_err(|e| e.into_down())?;
    }
    sanitize_h1_upstream_request(
        &mut head,
        peer.options.http_upstream_request_policy,
        session.req_header().version == Version::HTTP_11,
    )
    .map_err(|e| e.into_down())?;
    Ok(H1UpstreamRequest {
        head,
        downstream_had_host,
    })
}

/// The second half, as `proxy_1to1` does it after `upstream_request_filter`: the authority
/// reconciled with a `Host` the filters set, `Host` restored where the request had one, the
/// authority validated, and a body without framing sent chunked.
pub fn finish_h1_upstream_request(
    request: H1UpstreamRequest,
    downstream_has_body: bool,
) -> Result<RequestHeader> {
    let H1UpstreamRequest {
        mut head,
        downstream_had_host,
    } = request;
    reconcile_upstream_authority(&mut head).map_err(|e| e.into_in())?;
    let target_has_authority = raw_target_authority(head.raw_path()).authority().is_some();
    if downstream_had_host || head.uri.authority().is_some() || target_has_authority {
        set_h1_host_from_authority(&mut head).map_err(|e| e.into_in())?;
    }
    validate_request_authority(&head).map_err(|e| e.into_in())?;
    finalize_h1_upstream_request_framing(&mut head, downstream_has_body)?;
    Ok(head)
}
