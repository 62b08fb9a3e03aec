//! Who the client is and how it reached us, when Lacquer stands behind load balancers or TLS
//! terminators (`proxy.trusted_proxies`), and what the origin is told about it.
//!
//! The peer of a connection is the socket's (or, on a `proxy_protocol` listener, the address the
//! PROXY header named: `crate::proxy_protocol`). When that peer is trusted, what it reports is
//! believed: the client address is the rightmost `X-Forwarded-For` (else `Forwarded: for=`)
//! entry that is not itself a trusted proxy, the scheme is its `X-Forwarded-Proto` (else
//! `Forwarded: proto=`), and `X-Forwarded-Host` / `-Port` go on as sent. From any other peer
//! those fields are the client's own words: they are removed, with the other request fields
//! origins commonly let change a response but that the cache key does not contain (a client
//! could otherwise store a page made for its own `X-Forwarded-Host` for everyone), and replaced
//! with what Lacquer saw: the peer address, the listener's scheme (`https` on TLS listeners).
//!
//! The resolved client address is the one `cache.purge_from`, fairness and the access log use;
//! the resolved scheme is part of the cache key ([`super::cache_key`]).

use super::headers::{holds_any, ClientFields, X_FORWARDED_FOR};
use crate::config::address_range::AddressRange;
use http::header::{self, HeaderName};
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use std::net::IpAddr;

/// Request fields that origins (frameworks, their proxy-aware middleware) let change a response
/// and that are not in the cache key, with the forwarding fields themselves: from an untrusted
/// peer none of them reaches the origin.
/// (A `static`: a `const` array of `HeaderName`s is built and dropped wherever it is used.)
static UNKEYED_FROM_UNTRUSTED: [HeaderName; 12] = [
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-http-method-override"),
    X_FORWARDED_FOR,
    header::FORWARDED,
];

/// The peer of the connection: the socket's, or the client a PROXY protocol header named.
#[inline]
pub fn peer_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|addr| addr.as_inet())
        .map(|inet| inet.ip())
}

/// Whether the connection itself is TLS (a `tls.listen` listener).
#[inline]
fn listener_is_tls(session: &Session) -> bool {
    session.digest().is_some_and(|d| d.ssl_digest.is_some())
}

/// Whether `peer` is one whose forwarding fields are believed.
#[inline]
fn is_trusted(trusted: &[AddressRange], peer: Option<IpAddr>) -> bool {
    !trusted.is_empty() && peer.is_some_and(|ip| trusted.iter().any(|range| range.contains(ip)))
}

/// Whether the request came over HTTPS: the listener's scheme, or what a trusted peer reports.
/// With no trusted proxies configured (the default) this is only the listener's.
#[inline]
pub fn is_https(session: &Session, trusted: &[AddressRange]) -> bool {
    // (the hit path: nothing but the listener's TLS check unless proxies are trusted)
    if !trusted.is_empty() && is_trusted(trusted, peer_ip(session)) {
        if let Some(https) = reported_https(session.req_header()) {
            return https;
        }
    }
    listener_is_tls(session)
}

/// The client's address: the peer's, or, from a trusted peer, the one its forwarding fields name.
pub fn client_ip(session: &Session, trusted: &[AddressRange]) -> Option<IpAddr> {
    let peer = peer_ip(session);
    if !is_trusted(trusted, peer) {
        return peer;
    }
    // (a trusted peer: its report is read only now, for PURGE, fairness and the log)
    match reported_client(session.req_header(), trusted) {
        Reported::Nothing => peer,
        Reported::Client(ip) => Some(ip),
        Reported::Unknown => None,
    }
}

/// The scheme a trusted peer reports: `X-Forwarded-Proto`, else `Forwarded: proto=`; the first
/// entry (the one the first proxy saw) counts.
fn reported_https(req: &RequestHeader) -> Option<bool> {
    let proto = req
        .headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(|v| v.trim().to_string())
        .or_else(|| forwarded_params(req, "proto").into_iter().next())?;
    Some(proto.eq_ignore_ascii_case("https"))
}

/// The client a trusted peer reports: walking `X-Forwarded-For` (else `Forwarded: for=`) from the
/// right, the first address that is not a trusted proxy (the leftmost if all are); `None` when
/// that entry cannot be read (an obfuscated or `unknown` node, bytes that are not an address):
/// the client is then unknown, never the trusted peer itself. Only a peer that reports no chain
/// at all is its own client ([`client_ip`]).
///
/// Each field value is split as bytes: a value holding a byte past ASCII (which `to_str`
/// refuses) once dropped the whole line, the entry the trusted proxy appended with it, and the
/// client became the `Forwarded` field it wrote itself, or the proxy: a PURGE through nginx's
/// `$proxy_add_x_forwarded_for` from anywhere was taken for one from the proxy's host.
fn reported_client(req: &RequestHeader, trusted: &[AddressRange]) -> Reported {
    let mut chain: Vec<Option<IpAddr>> = field_entries(req, &X_FORWARDED_FOR)
        .iter()
        .map(|entry| parse_node(entry))
        .collect();
    if chain.is_empty() {
        chain = forwarded_params(req, "for")
            .iter()
            .map(|node| parse_node(node))
            .collect();
    }
    if chain.is_empty() {
        return Reported::Nothing;
    }
    for entry in chain.iter().rev() {
        match entry {
            Some(ip) if trusted.iter().any(|range| range.contains(*ip)) => continue,
            Some(ip) => return Reported::Client(*ip),
            None => return Reported::Unknown,
        }
    }
    match chain[0] {
        Some(ip) => Reported::Client(ip),
        None => Reported::Unknown,
    }
}

/// What a trusted peer's forwarding fields say of the client ([`reported_client`]).
#[derive(Debug, PartialEq)]
enum Reported {
    /// No chain: the peer is its own client.
    Nothing,
    Client(IpAddr),
    /// A client the chain names but that cannot be read.
    Unknown,
}

/// The comma-separated entries of every `name` field, in order, trimmed, each read from its
/// bytes (an entry that is not UTF-8 comes out unreadable, not dropped with its line).
fn field_entries(req: &RequestHeader, name: &http::HeaderName) -> Vec<String> {
    req.headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|entry| String::from_utf8_lossy(entry).trim().to_string())
        .filter(|entry| !entry.is_empty())
        .collect()
}

/// An address as forwarding fields write it: `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]`,
/// `[2001:db8::1]:4711`, `2001:db8::1`, possibly quoted. Obfuscated and `unknown` nodes are none.
fn parse_node(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    let (host, _port) = text.rsplit_once(':')?;
    host.parse().ok()
}

/// The values of one parameter (`for`, `proto`) in every element of the `Forwarded` fields
/// (RFC 7239), in order.
fn forwarded_params(req: &RequestHeader, name: &str) -> Vec<String> {
    field_entries(req, &header::FORWARDED)
        .iter()
        .flat_map(|element| element.split(';'))
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| key.trim().eq_ignore_ascii_case(name))
        .map(|(_, value)| value.trim().trim_matches('"').to_string())
        .collect()
}

/// `upstream_request_filter`: from an untrusted peer, the forwarding fields and the unkeyed
/// fields of [`UNKEYED_FROM_UNTRUSTED`] are removed before `headers::add_forwarded_with` writes
/// ours. Returns whether the peer's own fields were kept (it is trusted) or removed.
pub fn on_upstream_request(
    session: &Session,
    req: &mut RequestHeader,
    trusted: &[AddressRange],
) -> ClientFields {
    if is_trusted(trusted, peer_ip(session)) {
        return ClientFields::Kept;
    }
    // nearly every request holds none of them: one pass over its names says so
    if holds_any(&req.headers, &UNKEYED_FROM_UNTRUSTED) {
        for name in &UNKEYED_FROM_UNTRUSTED {
            req.remove_header(name);
        }
    }
    ClientFields::Removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fields: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        for (name, value) in fields {
            req.append_header(name.to_string(), *value).unwrap();
        }
        req
    }

    fn ranges(list: &[&str]) -> Vec<AddressRange> {
        list.iter()
            .map(|r| AddressRange::parse(r).unwrap())
            .collect()
    }

    #[test]
    fn the_client_is_the_rightmost_untrusted_forwarded_for_entry() {
        let trusted = ranges(&["10.0.0.0/8"]);
        let req = request(&[
            ("x-forwarded-for", "203.0.113.9, 198.51.100.7"),
            ("x-forwarded-for", "10.1.2.3"),
        ]);
        assert_eq!(
            reported_client(&req, &trusted),
            Reported::Client("198.51.100.7".parse().unwrap())
        );
        let all_trusted = request(&[("x-forwarded-for", "10.0.0.1, 10.0.0.2")]);
        assert_eq!(
            reported_client(&all_trusted, &trusted),
            Reported::Client("10.0.0.1".parse().unwrap())
        );
        assert_eq!(reported_client(&request(&[]), &trusted), Reported::Nothing);
    }

    #[test]
    fn an_entry_that_cannot_be_read_makes_the_client_unknown_never_the_proxy() {
        let trusted = ranges(&["127.0.0.0/8"]);
        // a client's own line with a byte past ASCII, the trusted proxy's entry appended to it
        let mut req = RequestHeader::build("PURGE", b"/", None).unwrap();
        let line = http::HeaderValue::from_bytes(b"203.0.113.5\x80, 198.51.100.7").unwrap();
        req.append_header("x-forwarded-for", line).unwrap();
        req.append_header("forwarded", "for=127.0.0.1").unwrap();
        assert_eq!(
            reported_client(&req, &trusted),
            Reported::Client("198.51.100.7".parse().unwrap())
        );
        // the entry reached walking from the right is not an address: unknown
        for chain in [
            "127.0.0.1, 203.0.113.5\u{e9}",
            "127.0.0.1, unknown, 127.0.0.2",
        ] {
            let req = request(&[("x-forwarded-for", chain)]);
            assert_eq!(
                reported_client(&req, &trusted),
                Reported::Unknown,
                "{chain}"
            );
        }
        let obfuscated = request(&[("forwarded", "for=_hidden, for=127.0.0.1")]);
        assert_eq!(reported_client(&obfuscated, &trusted), Reported::Unknown);
        // an empty entry (a stray comma) is no entry
        let sloppy = request(&[("x-forwarded-for", "198.51.100.7,")]);
        assert_eq!(
            reported_client(&sloppy, &trusted),
            Reported::Client("198.51.100.7".parse().unwrap())
        );
    }

    #[test]
    fn forwarded_for_and_proto_are_read_when_x_forwarded_is_absent() {
        let trusted = ranges(&["10.0.0.0/8"]);
        let req = request(&[(
            "forwarded",
            "for=\"[2001:db8::7]:4711\";proto=https, for=10.0.0.9",
        )]);
        assert_eq!(
            reported_client(&req, &trusted),
            Reported::Client("2001:db8::7".parse().unwrap())
        );
        assert_eq!(reported_https(&req), Some(true));
        assert_eq!(reported_https(&request(&[])), None);
        assert_eq!(
            reported_https(&request(&[("x-forwarded-proto", "http")])),
            Some(false)
        );
    }

    #[test]
    fn nodes_parse_with_ports_brackets_and_quotes() {
        for (text, ip) in [
            ("192.0.2.1", "192.0.2.1"),
            ("192.0.2.1:80", "192.0.2.1"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("\"[2001:db8::1]\"", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
        ] {
            assert_eq!(parse_node(text), Some(ip.parse().unwrap()), "{text}");
        }
        assert_eq!(parse_node("unknown"), None);
        assert_eq!(parse_node("_hidden"), None);
    }

    #[test]
    fn nobody_is_trusted_by_default() {
        assert!(!is_trusted(&[], Some("127.0.0.1".parse().unwrap())));
        assert!(!is_trusted(&ranges(&["10.0.0.0/8"]), None));
        assert!(is_trusted(
            &ranges(&["10.0.0.0/8"]),
            Some("10.9.9.9".parse().unwrap())
        ));
    }
}
