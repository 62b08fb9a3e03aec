//! Interim responses (RFC 9110 §15.2): `102 Processing`, `103 Early Hints` and any other 1xx but
//! `101` that an origin sends before its final response.
//!
//! A proxy forwards them as they come, so a browser can start on the hinted stylesheets while
//! the origin still renders the page. Pingora passes each one through the same phases as the
//! final response (`upstream_response_filter`, then `response_filter`), but it is not the
//! response: it is never stored (Pingora's cache skips 1xx), and nothing the proxy concludes
//! from a response may be concluded from it. So the phases hand an interim response to this
//! module and return: it is cleaned of hop-by-hop fields on the way in, and carries our `Via`
//! (RFC 9110 §7.6.3, every forwarded message) but no `Cache-Status`, which describes the final
//! response, on the way out. Its fields never reach the stored final response: that is the
//! origin's own final head.
//!
//! On HTTP/1.1, clients get the interim responses before the final one, on a miss as on a pass.
//! On h2, Pingora 0.9.1 drops them when writing to the client (its h2 server writes one response
//! head per stream), so h2 clients get the final response alone; `docs/conformance.md` names the
//! pingora-core change that would send them as h2 interim HEADERS frames.

use super::headers;
use pingora_http::ResponseHeader;

/// Whether a response head is an interim response rather than the final one (1xx other than
/// `101 Switching Protocols`, which ends the exchange).
pub fn is_interim(resp: &ResponseHeader) -> bool {
    resp.status.is_informational() && resp.status != http::StatusCode::SWITCHING_PROTOCOLS
}

/// `upstream_response_filter`, for an interim response: hop-by-hop fields removed, nothing else
/// learned from it (not the upstream status, not the cache decision, not the coding).
pub fn on_upstream_interim(resp: &mut ResponseHeader) {
    headers::strip_hop_by_hop(resp);
}

/// `response_filter`, for an interim response: our `Via` entry, when configured, and nothing
/// that describes the final response.
pub fn on_downstream_interim(resp: &mut ResponseHeader, via: Option<http::HeaderValue>) {
    if let Some(via) = via {
        let _ = resp.append_header(http::header::VIA, via);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_1xx_other_than_101_are_interim() {
        for status in [100, 102, 103, 199] {
            assert!(is_interim(&ResponseHeader::build(status, None).unwrap()));
        }
        for status in [101, 200, 204, 304] {
            assert!(!is_interim(&ResponseHeader::build(status, None).unwrap()));
        }
    }

    #[test]
    fn an_interim_response_keeps_its_hints_and_gets_only_via() {
        let mut hints = ResponseHeader::build(103, None).unwrap();
        hints
            .append_header("link", "</style.css>; rel=preload; as=style")
            .unwrap();
        hints.append_header("connection", "keep-alive").unwrap();
        on_upstream_interim(&mut hints);
        on_downstream_interim(
            &mut hints,
            Some(http::HeaderValue::from_static("1.1 lacquer")),
        );
        assert!(hints.headers.get("connection").is_none());
        assert_eq!(hints.headers.get("via").unwrap(), "1.1 lacquer");
        assert!(hints.headers.get("cache-status").is_none());
        assert!(hints.headers.get("link").is_some());
    }
}
