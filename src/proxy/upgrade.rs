//! Protocol upgrades (`Upgrade: websocket`, and any other protocol the origin accepts): the
//! request goes to the origin with its upgrade intact, the `101 Switching Protocols` comes back
//! with its `Upgrade` and `Connection`, and Pingora then tunnels bytes both ways until either side
//! closes.
//!
//! Pingora already runs the tunnel (its HTTP/1 sessions switch to raw bytes after a 101). What a
//! proxy built on it must not do is what breaks WebSockets behind most of them: strip `Upgrade`
//! and `Connection` as hop-by-hop fields on the way in or out. Here:
//!
//! * [`UpgradeRequest::of`] (`request_filter`) decides once whether the request asks for a switch,
//!   by Pingora's own rule (HTTP/1.1 with an `Upgrade` field), so its tunnel state machine and
//!   ours agree. Such a request never touches the cache: no lookup, nothing stored.
//! * [`on_peer`] (`upstream_peer`) tells Pingora to leave the request's upgrade fields to us
//!   (its default forwards `websocket` only) and gives the attempt the tunnel's idle timeout.
//! * [`on_upstream_request`] (`upstream_request_filter`) does the hop-by-hop normalization
//!   Pingora then skips: fields the client's `Connection` nominates are removed, `Upgrade` keeps
//!   the protocols offered (but `h2c`, which is HTTP/2 itself, not a protocol to tunnel) and
//!   `Connection: upgrade` carries it. An `Upgrade` the client did not nominate in `Connection`
//!   (RFC 9110 §7.8 requires it) is not forwarded: the origin sees an ordinary request. Nor is
//!   the upgrade of a request with a chunked body (a server may ignore an `Upgrade`): a 101 that
//!   came back before that body's end switched both sides to raw bytes mid-chunk, and the origin
//!   read the rest of the client's chunk framing as chunk data (found 2026-12-08,
//!   `tests/tunnel_flaky_attacks.rs`; a body of a known length is forwarded whole, then the
//!   tunnel's bytes, and stays an upgrade).
//! * [`switch_was_offered`] (`upstream_response_filter`) refuses a 101 to anything the forwarded
//!   request did not offer.
//! * [`on_upstream_response`] (`upstream_response_filter`) keeps a 101's `Upgrade` and
//!   `Connection: upgrade` (every other hop-by-hop field is still removed).
//!
//! The tunnel's idle timeout (`proxy.tunnel_idle_timeout`) ends a tunnel in which neither side
//! has sent anything for that long (Pingora's tunnel loop restarts its timer on traffic either
//! way): a WebSocket where only the server pushes, or only the client sends, stays up. (nginx's
//! `proxy_read_timeout` bounds the origin's side alone, and cuts a client-only stream.) The access
//! log writes one line when the tunnel ends, status 101, cache word `tunnel`.
//!
//! HTTP/2 clients: WebSockets over HTTP/2 need extended CONNECT (RFC 8441). Pingora 0.9.1 cannot
//! carry it (see `docs/conformance.md`), so Lacquer does not advertise
//! `SETTINGS_ENABLE_CONNECT_PROTOCOL`, and browsers then open their WebSockets over HTTP/1.1, which
//! works on the same TLS listener (ALPN offers `http/1.1`).

use http::header::{self, HeaderName, HeaderValue};
use pingora_core::upstreams::peer::{H1UpgradePolicy, HttpPeer};
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::Duration;

/// Fields that belong to one connection and never go on, whatever `Connection` says (RFC 9110
/// §7.6.1, and the ones Pingora strips from ordinary requests).
const HOP_BY_HOP: [&str; 7] = [
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "http2-settings",
];

/// Fields that a client's `Connection` may not make us drop: the origin needs them, and we set
/// the forwarding ones ourselves.
const PROTECTED: [&str; 5] = [
    "host",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "forwarded",
];

/// Whether a request asks to switch protocols, decided once in `request_filter`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpgradeRequest {
    /// An ordinary request.
    #[default]
    None,
    /// HTTP/1.1 with an `Upgrade` field: forwarded as an upgrade (or, if malformed, as an ordinary
    /// request), never cached.
    Requested,
}

impl UpgradeRequest {
    /// Pingora's own test (`is_upgrade_req`): HTTP/1.1 and an `Upgrade` field. Using the same
    /// rule keeps its check that the request and the 101 agree from refusing our tunnels.
    #[inline]
    pub fn of(req: &RequestHeader) -> UpgradeRequest {
        if req.version == http::Version::HTTP_11 && req.headers.contains_key(header::UPGRADE) {
            UpgradeRequest::Requested
        } else {
            UpgradeRequest::None
        }
    }

    /// Whether the request asks for an upgrade.
    #[inline]
    pub fn requested(self) -> bool {
        self == UpgradeRequest::Requested
    }
}

/// `upstream_peer`: for an upgrade request, the upgrade fields are ours to normalize (Pingora's
/// default would drop every protocol but `websocket`), and the attempt waits for the origin at
/// most `idle` between bytes, which is the tunnel's idle timeout once it is open.
pub fn on_peer(peer: &mut HttpPeer, idle: Duration) {
    peer.options.http_upstream_request_policy.h1_upgrade = H1UpgradePolicy::Preserve;
    peer.options.read_timeout = Some(idle);
}

/// `upstream_request_filter`: the hop-by-hop normalization of an upgrade request (Pingora skips
/// it when asked to preserve the upgrade): nominated and standard hop-by-hop fields go, the
/// offered protocols (less `h2c`) stay in `Upgrade`, announced by `Connection: upgrade`. Returns
/// whether the request still asks for an upgrade.
pub fn on_upstream_request(req: &mut RequestHeader) -> bool {
    let forwarded = forwarded_protocols(req);
    let nominated: Vec<HeaderName> = list_items(&req.headers, header::CONNECTION)
        .filter(|token| !token.eq_ignore_ascii_case(b"upgrade"))
        .filter_map(|token| HeaderName::from_bytes(token).ok())
        .collect();
    for name in nominated {
        if !PROTECTED.contains(&name.as_str()) {
            req.remove_header(&name);
        }
    }
    for name in HOP_BY_HOP {
        req.remove_header(name);
    }
    req.remove_header(&header::CONNECTION);
    req.remove_header(&header::UPGRADE);
    match forwarded {
        Some(protocols) => {
            let _ = req.insert_header(header::UPGRADE, protocols);
            let _ = req.insert_header(header::CONNECTION, HeaderValue::from_static("upgrade"));
            true
        }
        _ => false,
    }
}

/// The protocols a request goes on with as an upgrade ([`on_upstream_request`]): its offered
/// ones ([`offered_protocols`]) when its `Connection` nominates `upgrade` and its body is not
/// chunked; `None`: it goes on as an ordinary request.
fn forwarded_protocols(req: &RequestHeader) -> Option<HeaderValue> {
    let nominated = list_items(&req.headers, header::CONNECTION)
        .any(|token| token.eq_ignore_ascii_case(b"upgrade"));
    let chunked_body = req.headers.contains_key(header::TRANSFER_ENCODING);
    offered_protocols(req).filter(|_| nominated && !chunked_body)
}

/// The protocols of the request's `Upgrade` fields, in order, without `h2c`; `None` if none is
/// left.
fn offered_protocols(req: &RequestHeader) -> Option<HeaderValue> {
    let kept: Vec<&str> = req
        .headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty() && !p.eq_ignore_ascii_case("h2c"))
        .collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_str(&kept.join(", ")).ok()
}

/// Whether a 101 switches to what the client's request `req` offered, as forwarded
/// ([`on_upstream_request`]: nominated in `Connection`, `h2c` left out): the 101 names the new
/// protocol(s) in `Upgrade` (RFC 9110 §15.2.2), each of them one the request offered (§7.8: a
/// server must not switch to a protocol the client did not ask for). A name without a version
/// matches an offer of that name with one. Any other 101 (none named, one never offered, or
/// `h2c`, which Lacquer never forwards) is refused: it would turn the client's connection into a
/// tunnel the client did not ask for (found 2026-12-08, `tests/tunnel_flaky_attacks.rs`).
pub fn switch_was_offered(req: &RequestHeader, resp: &ResponseHeader) -> bool {
    let Some(offered) = forwarded_protocols(req) else {
        return false;
    };
    let offered: Vec<&str> = offered
        .to_str()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .collect();
    let mut named = list_items(&resp.headers, header::UPGRADE).peekable();
    named.peek().is_some()
        && named.all(|protocol| {
            offered.iter().any(|offer| {
                let offer = offer.as_bytes();
                let offer_name = offer.split(|&b| b == b'/').next().unwrap_or_default();
                protocol.eq_ignore_ascii_case(offer) || protocol.eq_ignore_ascii_case(offer_name)
            })
        })
}

/// The items of every `name` field of `headers`, a comma-separated list (`Connection`,
/// `Upgrade`), trimmed, empty ones left out.
fn list_items(headers: &http::HeaderMap, name: HeaderName) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(name)
        .into_iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|item| item.trim_ascii())
        .filter(|item| !item.is_empty())
}

/// `upstream_response_filter`, before the hop-by-hop fields are stripped: the `Upgrade` of a 101,
/// to put back with `Connection: upgrade` by [`restore_switch_fields`].
pub fn on_upstream_response(resp: &ResponseHeader) -> Option<HeaderValue> {
    if resp.status != http::StatusCode::SWITCHING_PROTOCOLS {
        return None;
    }
    resp.headers.get(header::UPGRADE).cloned()
}

/// Puts a 101's `Upgrade` back, announced by `Connection: upgrade`, after every hop-by-hop field
/// (including whatever the origin's `Connection` nominated) was removed.
pub fn restore_switch_fields(resp: &mut ResponseHeader, upgrade: HeaderValue) {
    let _ = resp.insert_header(header::UPGRADE, upgrade);
    let _ = resp.insert_header(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fields: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/chat", None).unwrap();
        for (name, value) in fields {
            req.append_header(name.to_string(), *value).unwrap();
        }
        req
    }

    #[test]
    fn an_upgrade_is_requested_by_an_http11_upgrade_field() {
        assert!(UpgradeRequest::of(&request(&[("upgrade", "websocket")])).requested());
        assert!(!UpgradeRequest::of(&request(&[])).requested());
        let mut old = request(&[("upgrade", "websocket")]);
        old.set_version(http::Version::HTTP_10);
        assert!(!UpgradeRequest::of(&old).requested());
    }

    #[test]
    fn the_upgrade_goes_on_with_connection_upgrade_and_nominated_fields_go() {
        let mut req = request(&[
            ("host", "a.test"),
            ("connection", "keep-alive, Upgrade, x-hop, host"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        assert!(on_upstream_request(&mut req));
        assert_eq!(req.headers["upgrade"], "websocket");
        assert_eq!(req.headers["connection"], "upgrade");
        assert!(req.headers.get("x-hop").is_none());
        assert!(req.headers.get("keep-alive").is_none());
        assert_eq!(req.headers["host"], "a.test", "protected from nomination");
        assert!(req.headers.get("sec-websocket-key").is_some());
    }

    #[test]
    fn other_protocols_are_kept_and_h2c_is_not() {
        let mut req = request(&[
            ("connection", "upgrade, http2-settings"),
            ("upgrade", "h2c, foo/2"),
            ("http2-settings", "AAMAAABkAAQAAP__"),
        ]);
        assert!(on_upstream_request(&mut req));
        assert_eq!(req.headers["upgrade"], "foo/2");
        assert!(req.headers.get("http2-settings").is_none());

        let mut only_h2c = request(&[("connection", "upgrade"), ("upgrade", "h2c")]);
        assert!(!on_upstream_request(&mut only_h2c));
        assert!(only_h2c.headers.get("upgrade").is_none());
        assert!(only_h2c.headers.get("connection").is_none());
    }

    #[test]
    fn an_upgrade_not_nominated_by_connection_is_not_forwarded() {
        let mut req = request(&[("upgrade", "websocket")]);
        assert!(!on_upstream_request(&mut req));
        assert!(req.headers.get("upgrade").is_none());
    }

    #[test]
    fn a_101_must_name_a_protocol_the_request_offered() {
        let switch = |upgrade: Option<&str>| {
            let mut resp = ResponseHeader::build(101, None).unwrap();
            if let Some(upgrade) = upgrade {
                resp.insert_header("upgrade", upgrade).unwrap();
            }
            resp
        };
        let ws = request(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket, foo/2, h2c"),
        ]);
        assert!(switch_was_offered(&ws, &switch(Some("websocket"))));
        assert!(switch_was_offered(&ws, &switch(Some("WebSocket"))));
        assert!(switch_was_offered(&ws, &switch(Some("foo/2"))));
        assert!(switch_was_offered(&ws, &switch(Some("foo"))));
        assert!(!switch_was_offered(&ws, &switch(Some("foo/3"))));
        assert!(!switch_was_offered(&ws, &switch(Some("h2c"))));
        assert!(!switch_was_offered(&ws, &switch(Some("websocket, bar"))));
        assert!(!switch_was_offered(&ws, &switch(Some(""))));
        assert!(!switch_was_offered(&ws, &switch(None)));
        // an upgrade the request did not nominate in `Connection` was not forwarded
        let not_nominated = request(&[("upgrade", "websocket")]);
        assert!(!switch_was_offered(
            &not_nominated,
            &switch(Some("websocket"))
        ));
        // nor one with a chunked body
        let chunked = request(&[
            ("connection", "upgrade"),
            ("upgrade", "websocket"),
            ("transfer-encoding", "chunked"),
        ]);
        assert!(!switch_was_offered(&chunked, &switch(Some("websocket"))));
        let mut forwarded = chunked.clone();
        assert!(!on_upstream_request(&mut forwarded));
        assert!(forwarded.headers.get("upgrade").is_none());
    }

    #[test]
    fn a_101_keeps_its_upgrade_with_connection_upgrade() {
        let mut resp = ResponseHeader::build(101, None).unwrap();
        resp.insert_header("upgrade", "websocket").unwrap();
        resp.insert_header("connection", "Upgrade, x-private")
            .unwrap();
        resp.insert_header("x-private", "1").unwrap();
        let upgrade = on_upstream_response(&resp).unwrap();
        crate::proxy::headers::strip_hop_by_hop(&mut resp);
        restore_switch_fields(&mut resp, upgrade);
        assert_eq!(resp.headers["upgrade"], "websocket");
        assert_eq!(resp.headers["connection"], "upgrade");
        assert!(resp.headers.get("x-private").is_none());

        let ok = ResponseHeader::build(200, None).unwrap();
        assert!(on_upstream_response(&ok).is_none());
    }
}
