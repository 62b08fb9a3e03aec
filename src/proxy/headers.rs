//! Header rewriting at the proxy boundary: hop-by-hop fields, fields meant for this cache only,
//! `Via`, and forwarding headers.
//!
//! Pingora 0.9 already strips hop-by-hop fields from requests it forwards upstream (including the
//! fields a `Connection` header nominates). Responses are our job: whatever the origin marks as
//! hop-by-hop must neither be stored nor passed on (RFC 9110 §7.6.1).

use crate::config::ForwardedHeaders;
use http::header::{self, HeaderMap, HeaderName};
use pingora_http::{RequestHeader, ResponseHeader};
use smallvec::SmallVec;
use std::net::IpAddr;

/// Hop-by-hop response fields removed before a response is stored or forwarded (with
/// `Connection` and the fields it names). `Transfer-Encoding` is left to Pingora, which re-frames
/// bodies itself.
/// (A `static`: a `const` array of `HeaderName`s is built and dropped wherever it is used.)
static HOP_BY_HOP: [HeaderName; 6] = [
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

/// The name of a field Lacquer adds to a head, with the text it is written as. Added this way,
/// a name is neither parsed back from text nor copied (pingora-http patch "names parsed once"):
/// given as text it was parsed on every add, given as a `HeaderName` it was written out as text
/// and parsed back (about 1,000 instructions per added field, `bench/miss_instructions.sh`).
/// Each is written as a head without a case map writes its name
/// (`pingora_http::written_without_case`: the titled form Pingora has for it, else lowercase),
/// so that the head is written the same with a case map as without one (a unit test checks).
pub type AddedName = (HeaderName, &'static str);

/// `Via` (RFC 9110 §7.6.3), on forwarded requests and on answers.
pub const VIA: AddedName = (header::VIA, "via");
/// `Accept-Encoding`, as a forwarded request asks for the coding the cache stores.
pub const ACCEPT_ENCODING: AddedName = (header::ACCEPT_ENCODING, "Accept-Encoding");
/// `Cache-Status` (RFC 9211), on answers.
pub const CACHE_STATUS: AddedName = (HeaderName::from_static("cache-status"), "cache-status");
const ADDED_X_FORWARDED_FOR: AddedName = (X_FORWARDED_FOR, "x-forwarded-for");
const ADDED_X_FORWARDED_PROTO: AddedName = (X_FORWARDED_PROTO, "x-forwarded-proto");
const ADDED_X_FORWARDED_HOST: AddedName = (X_FORWARDED_HOST, "x-forwarded-host");
const ADDED_FORWARDED: AddedName = (header::FORWARDED, "forwarded");

/// Whether `fields` holds any of the names in `list`: one pass over the message's (few) field
/// names, each compared with the list, instead of one hashed removal per listed name. Removing
/// a list of absent fields one by one cost a few hundred instructions per name on every miss
/// and pass (measured with `bench/miss_instructions.sh`), and they are absent in nearly every
/// message.
pub fn holds_any(fields: &HeaderMap, list: &[HeaderName]) -> bool {
    fields.keys().any(|name| list.contains(name))
}

/// Fields a `Connection` header may not make us remove: framing and identity.
static NEVER_NOMINATED: [HeaderName; 3] = [
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::DATE,
];

/// Removes hop-by-hop fields from an upstream response, including those named by `Connection`.
///
/// Runs on every response from an origin. Only `Connection` (itself in the list) nominates
/// others, so a response holding none of [`HOP_BY_HOP`] has nothing to strip: one pass over its
/// few names says so. Most origins send `Connection: keep-alive`; then its tokens are read once,
/// the fields to remove are picked in one more pass over the names present (each compared with
/// the tokens) and only those are removed, instead of a hashed removal of every listed and nominated name
/// (about 1,500 instructions per miss and pass, `bench/miss_instructions.sh`).
pub fn strip_hop_by_hop(resp: &mut ResponseHeader) {
    if !holds_any(&resp.headers, &HOP_BY_HOP) {
        return;
    }
    let doomed: SmallVec<[HeaderName; 4]> = {
        // the nominated names, read once (not once per field of the response), held without an
        // allocation for the usual few (two `Vec`s here cost about 900 instructions per answer)
        let nominated: SmallVec<[&str; 4]> = resp
            .headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .collect();
        let nominated = |name: &HeaderName| {
            nominated
                .iter()
                .any(|token| token.eq_ignore_ascii_case(name.as_str()))
        };
        // a 101's `Upgrade` and `Connection` are put back by `super::upgrade`
        resp.headers
            .keys()
            .filter(|name| {
                HOP_BY_HOP.contains(name) || (!NEVER_NOMINATED.contains(name) && nominated(name))
            })
            .cloned()
            .collect()
    };
    for name in &doomed {
        resp.remove_header(name);
    }
}

/// Leaves an origin's answer with the length fields it may carry on: none on a `204` (RFC 9110
/// §8.6: "A server MUST NOT send a Content-Length header field in any response with a status
/// code of 1xx or 204", RFC 9112 §6.1 likewise for `Transfer-Encoding`), and one
/// `Content-Length` where the origin repeated the same length (two fields, or the list `N, N`),
/// as RFC 9110 §8.6 lets a recipient take them, written without leading zeros. Pingora frames the body it reads from the
/// origin the same way already (different lengths it refuses); passed on as they came, the
/// repeats reached clients, whose parsers refuse such a head (many front proxies do) or read
/// another length from it, and the `204`'s fields were stored and sent on every hit from this
/// node's memory, while a node reading the same entry from memcached sent none.
///
/// Runs on every answer from an origin: a head with at most one plain `Content-Length` (nearly
/// every one) is looked at once and left.
pub fn settle_length_fields(resp: &mut ResponseHeader) {
    if resp.status == http::StatusCode::NO_CONTENT {
        if resp.headers.contains_key(header::CONTENT_LENGTH) {
            resp.remove_header(&header::CONTENT_LENGTH);
        }
        if resp.headers.contains_key(header::TRANSFER_ENCODING) {
            resp.remove_header(&header::TRANSFER_ENCODING);
        }
        return;
    }
    let mut values = resp.headers.get_all(header::CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return;
    };
    let leading_zero = first.len() > 1 && first.as_bytes()[0] == b'0';
    if values.next().is_none() && !leading_zero && !first.as_bytes().contains(&b',') {
        return;
    }
    let mut lengths = resp
        .headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(|part| {
            let digits = part.trim_ascii();
            (!digits.is_empty() && digits.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(digits).ok()?.parse::<u64>().ok())
                .flatten()
        });
    let Some(Some(length)) = lengths.next() else {
        return;
    };
    if lengths.all(|other| other == Some(length)) {
        let _ = resp.insert_header(header::CONTENT_LENGTH, length);
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

/// Whether the request may still hold forwarding fields of its own when
/// [`add_forwarded_with`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFields {
    /// The peer is trusted: its `X-Forwarded-*` / `Forwarded` fields were kept.
    Kept,
    /// The peer is not trusted: `proxy::forwarding` removed them all, so none is looked up.
    Removed,
}

/// Adds forwarding information about the client to an upstream request: `client` (our peer) is
/// appended to `X-Forwarded-For` / `Forwarded`; `X-Forwarded-Proto` and `-Host` are set when the
/// request has none (`proxy::forwarding` has removed an untrusted client's own); `tls` is the
/// request's scheme (`https`) as resolved there.
///
/// This looks the request's own fields up; the proxy calls [`add_forwarded_with`], which skips
/// that when they were removed.
pub fn add_forwarded(
    req: &mut RequestHeader,
    style: ForwardedHeaders,
    client: Option<IpAddr>,
    tls: bool,
) {
    add_forwarded_with(req, style, client, tls, ClientFields::Kept)
}

/// [`add_forwarded`], told whether the request may still hold forwarding fields of its own.
///
/// Runs on every forwarded request: from an untrusted peer (the default) the fields are known to
/// be absent and are not looked up, the address is written without `format!`, and the scheme is
/// a static value (this was about 6,000 instructions per miss and pass,
/// `bench/miss_instructions.sh`).
pub fn add_forwarded_with(
    req: &mut RequestHeader,
    style: ForwardedHeaders,
    client: Option<IpAddr>,
    tls: bool,
    fields: ClientFields,
) {
    let Some(client) = client else { return };
    let kept = fields == ClientFields::Kept;
    let proto = if tls { "https" } else { "http" };
    if matches!(
        style,
        ForwardedHeaders::XForwardedFor | ForwardedHeaders::Both
    ) {
        let node = IpText::new(client);
        let existing = kept
            .then(|| req.headers.get(X_FORWARDED_FOR))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.trim().is_empty());
        let xff = match existing {
            Some(existing) => {
                http::HeaderValue::try_from(format!("{existing}, {}", node.as_str())).ok()
            }
            None => http::HeaderValue::from_str(node.as_str()).ok(),
        };
        if let Some(xff) = xff {
            let _ = req.insert_header(ADDED_X_FORWARDED_FOR, xff);
        }
        if !(kept && req.headers.contains_key(X_FORWARDED_PROTO)) {
            let _ = req.insert_header(
                ADDED_X_FORWARDED_PROTO,
                http::HeaderValue::from_static(proto),
            );
        }
        if let Some(host) = req.headers.get(header::HOST).cloned() {
            if !(kept && req.headers.contains_key(X_FORWARDED_HOST)) {
                let _ = req.insert_header(ADDED_X_FORWARDED_HOST, host);
            }
        }
    }
    if matches!(style, ForwardedHeaders::Forwarded | ForwardedHeaders::Both) {
        let node = match client {
            IpAddr::V4(v4) => IpText::new(IpAddr::V4(v4)).as_str().to_owned(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let element = format!("for={node};proto={proto}");
        let existing = kept
            .then(|| req.headers.get(header::FORWARDED))
            .flatten()
            .and_then(|v| v.to_str().ok());
        let value = match existing {
            Some(existing) if !existing.trim().is_empty() => format!("{existing}, {element}"),
            _ => element,
        };
        let _ = req.insert_header(ADDED_FORWARDED, value);
    }
}

/// An address as text, written on the stack: `IpAddr`'s `Display` goes through the formatter
/// (padding, width) and `to_string` allocates, about 1,300 instructions for an IPv4 address on
/// every forwarded request; an IPv4 address is written digit by digit here, an IPv6 one (rarer)
/// with `Display` into the same buffer.
pub(crate) struct IpText {
    bytes: [u8; 45],
    len: usize,
}

impl IpText {
    pub(crate) fn new(ip: IpAddr) -> IpText {
        let mut text = IpText {
            bytes: [0; 45],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            IpAddr::V6(v6) => {
                use std::io::Write;
                let mut cursor = std::io::Cursor::new(&mut text.bytes[..]);
                // 45 bytes hold the longest form (an IPv4-mapped address written out in full)
                let _ = write!(cursor, "{v6}");
                text.len = cursor.position() as usize;
            }
        }
        text
    }

    fn push(&mut self, byte: u8) {
        self.bytes[self.len] = byte;
        self.len += 1;
    }

    pub(crate) fn as_str(&self) -> &str {
        // only ASCII digits, dots, colons and hex digits are written
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_names_are_written_as_a_head_without_a_case_map_writes_them() {
        for (name, text) in [
            VIA,
            ACCEPT_ENCODING,
            CACHE_STATUS,
            ADDED_X_FORWARDED_FOR,
            ADDED_X_FORWARDED_PROTO,
            ADDED_X_FORWARDED_HOST,
            ADDED_FORWARDED,
        ] {
            assert_eq!(pingora_http::written_without_case(&name), text);
        }
    }

    #[test]
    fn an_origins_length_fields_are_settled() {
        let settled = |status: u16, fields: &[(&str, &str)]| -> Vec<String> {
            let mut resp = ResponseHeader::build(status, None).unwrap();
            for (name, value) in fields {
                resp.append_header(name.to_string(), *value).unwrap();
            }
            settle_length_fields(&mut resp);
            let mut left: Vec<String> = ["content-length", "transfer-encoding"]
                .iter()
                .flat_map(|name| resp.headers.get_all(*name).iter())
                .map(|v| v.to_str().unwrap().to_string())
                .collect();
            left.sort();
            left
        };
        let cl = "content-length";
        assert_eq!(settled(200, &[(cl, "3")]), ["3"]);
        assert_eq!(settled(200, &[(cl, "0")]), ["0"]);
        assert_eq!(settled(200, &[(cl, "3"), (cl, "3")]), ["3"]);
        assert_eq!(settled(200, &[(cl, "3, 3")]), ["3"]);
        assert_eq!(settled(200, &[(cl, "003")]), ["3"]);
        assert_eq!(
            settled(200, &[(cl, "3"), (cl, "4")]),
            ["3", "4"],
            "left to refuse"
        );
        assert_eq!(settled(200, &[(cl, "3, x")]), ["3, x"], "left to refuse");
        assert_eq!(settled(204, &[(cl, "5")]), Vec::<String>::new());
        assert_eq!(
            settled(204, &[("transfer-encoding", "chunked")]),
            Vec::<String>::new()
        );
        assert_eq!(
            settled(304, &[(cl, "5")]),
            ["5"],
            "a 304 may carry the length"
        );
    }

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

    /// The removal as it was written before it was made cheaper: every listed and nominated
    /// name removed by hashed lookup. `strip_hop_by_hop` must leave exactly what this leaves.
    fn strip_hop_by_hop_by_name(resp: &mut ResponseHeader) {
        let nominated: Vec<HeaderName> = resp
            .headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in nominated {
            if !NEVER_NOMINATED.contains(&name) {
                resp.remove_header(&name);
            }
        }
        for name in &HOP_BY_HOP {
            resp.remove_header(name);
        }
    }

    fn fields_of(resp: &ResponseHeader) -> Vec<(String, Vec<u8>)> {
        resp.headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn hop_by_hop_removal_leaves_what_removal_by_name_left() {
        let responses: &[&[(&str, &[u8])]] = &[
            &[("content-type", b"text/html"), ("content-length", b"3")],
            &[("connection", b"keep-alive"), ("server", b"nginx")],
            &[
                ("Connection", b"Keep-Alive, X-Secret"),
                ("x-secret", b"1"),
                ("keep-alive", b"timeout=5"),
            ],
            &[
                (
                    "connection",
                    b"close, content-length, Date, transfer-encoding",
                ),
                ("content-length", b"3"),
                ("date", b"Mon, 23 Nov 2026 00:00:00 GMT"),
            ],
            &[
                ("connection", b" x-a ,, X-B\t"),
                ("connection", b"x-c"),
                ("x-a", b"1"),
                ("x-b", b"2"),
                ("x-c", b"3"),
                ("x-d", b"4"),
            ],
            &[
                ("connection", b"x-a, bad name, \xff"),
                ("x-a", b"1"),
                ("te", b"trailers"),
                ("trailer", b"x"),
                ("upgrade", b"h2c"),
            ],
            &[("proxy-connection", b"keep-alive"), ("x-kept", b"1")],
            &[("connection", b"\xffx-a"), ("x-a", b"1")],
            &[("x-one", b"1"), ("upgrade", b"websocket"), ("x-two", b"2")],
        ];
        for fields in responses {
            let mut head = ResponseHeader::build(200, None).unwrap();
            for (name, value) in *fields {
                head.append_header(
                    name.to_string(),
                    http::HeaderValue::from_bytes(value).unwrap(),
                )
                .unwrap();
            }
            let mut by_name = head.clone();
            strip_hop_by_hop_by_name(&mut by_name);
            strip_hop_by_hop(&mut head);
            assert_eq!(fields_of(&head), fields_of(&by_name), "{fields:?}");
            // the case-preserving names stay in step with the values (Pingora zips them)
            let mut wire = Vec::new();
            head.header_to_h1_wire(&mut wire);
            let mut by_name_wire = Vec::new();
            by_name.header_to_h1_wire(&mut by_name_wire);
            assert_eq!(wire, by_name_wire);
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let mut v4 = vec![0u32, 1, 9, 10, 99, 100, 255, 256, 0x7f00_0001, u32::MAX];
        // a spread of addresses, each octet through 0..=255 in turn
        v4.extend((0..=255u32).map(|o| o | o << 9 | (o * 7 % 256) << 16 | (255 - o) << 24));
        for bits in v4 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(bits));
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
        for text in [
            "::",
            "::1",
            "2001:db8::7",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:255.255.255.255",
            "::ffff:10.0.0.1",
            "fe80::1:2:3:4",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
    }

    #[test]
    fn removed_client_fields_are_not_looked_up_but_written_alike() {
        for style in [
            ForwardedHeaders::XForwardedFor,
            ForwardedHeaders::Forwarded,
            ForwardedHeaders::Both,
        ] {
            for (client, tls) in [("192.0.2.7", false), ("2001:db8::7", true)] {
                let client: IpAddr = client.parse().unwrap();
                let mut looked_up = RequestHeader::build("GET", b"/", None).unwrap();
                looked_up.insert_header("host", "example.com").unwrap();
                let mut removed = looked_up.clone();
                add_forwarded(&mut looked_up, style, Some(client), tls);
                add_forwarded_with(
                    &mut removed,
                    style,
                    Some(client),
                    tls,
                    ClientFields::Removed,
                );
                let fields = |req: &RequestHeader| {
                    req.headers
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                        .collect::<Vec<_>>()
                };
                assert_eq!(fields(&removed), fields(&looked_up), "{style:?} {client}");
            }
        }
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.insert_header("host", "example.com").unwrap();
        add_forwarded_with(
            &mut req,
            ForwardedHeaders::Both,
            Some("2001:db8::7".parse().unwrap()),
            true,
            ClientFields::Removed,
        );
        assert_eq!(req.headers["x-forwarded-for"], "2001:db8::7");
        assert_eq!(req.headers["x-forwarded-proto"], "https");
        assert_eq!(req.headers["x-forwarded-host"], "example.com");
        assert_eq!(
            req.headers["forwarded"],
            "for=\"[2001:db8::7]\";proto=https"
        );
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
