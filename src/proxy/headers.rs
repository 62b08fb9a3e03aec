//! Header rewriting at the proxy boundary: hop-by-hop fields, fields meant for this cache only,
//! `Via`, and forwarding headers.
//!
//! Pingora 0.9 already strips hop-by-hop fields from requests it forwards upstream (including the
//! fields a `Connection` header nominates). Responses are our job: whatever the origin marks as
//! hop-by-hop must neither be stored nor passed on (RFC 9110 §7.6.1).

use crate::config::ForwardedHeaders;
use http::header::{self, HeaderMap, HeaderName};
use pingora_http::{RequestHeader, ResponseHeader};
use std::net::IpAddr;

/// Hop-by-hop response fields removed before a response is stored or forwarded (with
/// `Connection` and the fields it names). `Transfer-Encoding` is left to Pingora, which re-frames
/// bodies itself.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

/// `X-Forwarded-For` and its companions, named once (a name given as text is parsed on every
/// lookup).
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Whether `fields` holds any of the names in `list`: one pass over the message's (few) field
/// names, each compared with the list, instead of one hashed removal per listed name. Removing
/// a list of absent fields one by one cost a few hundred instructions per name on every miss
/// and pass (measured with `bench/miss_instructions.sh`), and they are absent in nearly every
/// message.
pub fn holds_any(fields: &HeaderMap, list: &[HeaderName]) -> bool {
    fields.keys().any(|name| list.contains(name))
}

/// Removes hop-by-hop fields from an upstream response, including those named by `Connection`.
pub fn strip_hop_by_hop(resp: &mut ResponseHeader) {
    let nominated: Vec<HeaderName> = resp
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    if nominated.is_empty() && !holds_any(&resp.headers, &HOP_BY_HOP) {
        return;
    }
    for name in nominated {
        // never let an origin make us drop framing or identity fields
        if name != header::CONTENT_LENGTH
            && name != header::TRANSFER_ENCODING
            && name != header::DATE
        {
            resp.remove_header(&name);
        }
    }
    // a 101's `Upgrade` and `Connection` are put back by `super::upgrade`
    for name in &HOP_BY_HOP {
        resp.remove_header(name);
    }
}

/// Gives a response from the origin that has no `Date` the time it was received (RFC 9110
/// §6.6.1: a recipient with a clock "MUST record the time it was received and append a
/// corresponding Date header field ... if it is cached or forwarded downstream"). It runs before
/// the response is stored, so the stored head and every hit carry that `Date`, and
/// `If-Modified-Since` can be judged against it (RFC 9111 §4.3.2).
pub fn add_date_if_missing(resp: &mut ResponseHeader) {
    if !resp.status.is_informational() && !resp.headers.contains_key(header::DATE) {
        let now = pingora_core::protocols::http::date::get_cached_date();
        let _ = resp.insert_header(header::DATE, now);
    }
}

/// Fields meant for this cache only, removed from every response to a client: the targeted
/// cache-control fields (RFC 9213; unless `cache.forward_targeted_fields`) and the tag field
/// (unless `invalidation.forward_tag_header`).
#[derive(Debug, Clone, Default)]
pub struct ForUsOnly {
    names: Vec<HeaderName>,
    fingerprint: u64,
}

impl ForUsOnly {
    /// The fields called `names` (names that are not valid field names are never present).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> ForUsOnly {
        let names: Vec<HeaderName> = names
            .into_iter()
            .filter_map(|n| HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok())
            .collect();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&names, &mut hasher);
        let fingerprint = std::hash::Hasher::finish(&hasher);
        ForUsOnly { names, fingerprint }
    }

    /// The same for the same fields: a head stripped of them once (the fast path's kept wire
    /// form) is stripped for as long as the fingerprint is the same, across reloads.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether `name` is one of them.
    pub fn includes(&self, name: &HeaderName) -> bool {
        self.names.contains(name)
    }

    /// Removes them from a response going to a client.
    ///
    /// Runs on every response: the common case (none present) is one pass over the response's
    /// field names comparing lengths and bytes, without hashing the names removed.
    pub fn strip(&self, resp: &mut ResponseHeader) {
        if !resp.headers.keys().any(|name| self.names.contains(name)) {
            return;
        }
        for name in &self.names {
            resp.remove_header(name);
        }
    }
}

/// Our `Via` entry (RFC 9110 §7.6.3) for a message received with the given protocol version.
pub fn via_value(version: http::Version, pseudonym: &str) -> String {
    format!("{} {pseudonym}", VIA_PROTOCOLS[via_index(version)])
}

/// The protocol part of a `Via` entry, by [`via_index`].
const VIA_PROTOCOLS: [&str; 4] = ["1.0", "1.1", "2", "3"];

/// Where a protocol version's `Via` entry stands in [`VIA_PROTOCOLS`] (HTTP/0.9 counts as 1.1).
fn via_index(version: http::Version) -> usize {
    match version {
        http::Version::HTTP_10 => 0,
        http::Version::HTTP_2 => 2,
        http::Version::HTTP_3 => 3,
        _ => 1,
    }
}

/// Our `Via` entries for each protocol version, rendered once at start-up: every response and
/// every upstream request carries one, so it should cost a reference-count increment, not a
/// `format!` and a validation.
pub struct ViaValues {
    by_version: [http::HeaderValue; 4],
}

impl ViaValues {
    /// Renders the entries for a configured pseudonym (validated by the config loader).
    pub fn new(pseudonym: &str) -> Result<Self, http::header::InvalidHeaderValue> {
        let render = |proto: &str| http::HeaderValue::try_from(format!("{proto} {pseudonym}"));
        Ok(ViaValues {
            by_version: [
                render(VIA_PROTOCOLS[0])?,
                render(VIA_PROTOCOLS[1])?,
                render(VIA_PROTOCOLS[2])?,
                render(VIA_PROTOCOLS[3])?,
            ],
        })
    }

    /// The entry for a message received with `version`.
    pub fn for_version(&self, version: http::Version) -> http::HeaderValue {
        self.by_version[via_index(version)].clone()
    }

    /// [`Self::for_version`], borrowed (written out as text by the fast path).
    pub fn borrowed_for_version(&self, version: http::Version) -> &http::HeaderValue {
        &self.by_version[via_index(version)]
    }
}

/// Adds forwarding information about the client to an upstream request: `client` (our peer) is
/// appended to `X-Forwarded-For` / `Forwarded`; `X-Forwarded-Proto` and `-Host` are set when the
/// request has none (`proxy::forwarding` has removed an untrusted client's own); `tls` is the
/// request's scheme (`https`) as resolved there.
pub fn add_forwarded(
    req: &mut RequestHeader,
    style: ForwardedHeaders,
    client: Option<IpAddr>,
    tls: bool,
) {
    let Some(client) = client else { return };
    if matches!(
        style,
        ForwardedHeaders::XForwardedFor | ForwardedHeaders::Both
    ) {
        let xff = match req
            .headers
            .get(X_FORWARDED_FOR)
            .and_then(|v| v.to_str().ok())
        {
            Some(existing) if !existing.trim().is_empty() => format!("{existing}, {client}"),
            _ => client.to_string(),
        };
        let _ = req.insert_header("x-forwarded-for", xff);
        if !req.headers.contains_key(X_FORWARDED_PROTO) {
            let _ = req.insert_header("x-forwarded-proto", if tls { "https" } else { "http" });
        }
        if let Some(host) = req.headers.get(header::HOST).cloned() {
            if !req.headers.contains_key(X_FORWARDED_HOST) {
                let _ = req.insert_header("x-forwarded-host", host);
            }
        }
    }
    if matches!(style, ForwardedHeaders::Forwarded | ForwardedHeaders::Both) {
        let node = match client {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let proto = if tls { "https" } else { "http" };
        let element = format!("for={node};proto={proto}");
        let value = match req
            .headers
            .get(header::FORWARDED)
            .and_then(|v| v.to_str().ok())
        {
            Some(existing) if !existing.trim().is_empty() => format!("{existing}, {element}"),
            _ => element,
        };
        let _ = req.insert_header(header::FORWARDED, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_nominated_fields_are_removed() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("connection", "close, x-secret").unwrap();
        resp.insert_header("x-secret", "1").unwrap();
        resp.insert_header("keep-alive", "timeout=5").unwrap();
        resp.insert_header("content-length", "3").unwrap();
        strip_hop_by_hop(&mut resp);
        assert!(resp.headers.get("x-secret").is_none());
        assert!(resp.headers.get("keep-alive").is_none());
        assert!(resp.headers.get("connection").is_none());
        assert!(resp.headers.get("content-length").is_some());
    }

    #[test]
    fn forwarding_headers_append() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header("x-forwarded-for", "10.0.0.1").unwrap();
        add_forwarded(
            &mut req,
            ForwardedHeaders::Both,
            Some("127.0.0.2".parse().unwrap()),
            false,
        );
        assert_eq!(req.headers["x-forwarded-for"], "10.0.0.1, 127.0.0.2");
        assert_eq!(req.headers["forwarded"], "for=127.0.0.2;proto=http");
    }

    #[test]
    fn via_entries_name_the_protocol_version_received() {
        let via = ViaValues::new("lacquer").unwrap();
        for (version, expected) in [
            (http::Version::HTTP_09, "1.1 lacquer"),
            (http::Version::HTTP_10, "1.0 lacquer"),
            (http::Version::HTTP_11, "1.1 lacquer"),
            (http::Version::HTTP_2, "2 lacquer"),
            (http::Version::HTTP_3, "3 lacquer"),
        ] {
            assert_eq!(via.for_version(version), expected);
            assert_eq!(via_value(version, "lacquer"), expected);
        }
    }

    #[test]
    fn for_us_only_removes_only_the_named_fields() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("cache-control", "no-store").unwrap();
        resp.insert_header("cdn-cache-control", "max-age=10")
            .unwrap();
        resp.insert_header("lacquer-cache-control", "max-age=20")
            .unwrap();
        resp.insert_header("surrogate-key", "a b").unwrap();
        ForUsOnly::new(["Lacquer-Cache-Control", "surrogate-key", "not a name"]).strip(&mut resp);
        assert!(resp.headers.get("lacquer-cache-control").is_none());
        assert!(resp.headers.get("surrogate-key").is_none());
        assert!(resp.headers.get("cdn-cache-control").is_some());
        assert!(resp.headers.get("cache-control").is_some());
    }
}
