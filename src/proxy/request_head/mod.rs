//! The checks of a request head that Pingora leaves to the proxy, made first in `request_filter`
//! before anything reads the request for caching or forwarding.
//!
//! Pingora already refuses what breaks its own parsing: duplicate `Host`, userinfo, a `Host`
//! that differs from an absolute-form target's authority, conflicting `Content-Length`s, a
//! `Transfer-Encoding` that does not end in `chunked` (`docs/security.md` has the whole list).
//! What is left is what matters to a shared cache and to the origin behind it:
//!
//! * **The authority** ([`authority`]): `Host` (or `:authority`) must be RFC 3986 authority
//!   syntax, and an HTTP/1.1 request must carry a `Host` (RFC 9112 §3.2): 400 otherwise. The host
//!   is the first part of the cache key; one that may hold `/`, `?` or `#` could make two
//!   different requests share a key.
//! * **The target**: origin-form (`/...`), absolute-form with an `http` or `https` scheme, or `*`
//!   for OPTIONS; 400 otherwise, so the path part of the key always starts with `/`. Pingora
//!   keeps only the path of an absolute-form target in the request's URI (the target itself goes
//!   to the origin as received) and refuses a `Host` that differs from its authority; when an
//!   HTTP/1.0 request has no `Host`, the target's authority is inserted as its `Host` (RFC 9112
//!   §3.2.2: the target's authority is the one that counts), so the key and the origin both use
//!   it.
//! * **One `Content-Length`**: Pingora accepts `Content-Length: 5, 5` and two identical lines
//!   (RFC 9110 §8.6 allows it) and frames the body by that one value, but forwarded the field as
//!   received; an origin that cannot read the list would frame differently. The field is
//!   rewritten to the single value ([`framing`]).
//! * **A body on GET or HEAD**: such a request is never answered from or stored in the cache (the
//!   key does not include the body), only forwarded; the caller keeps [`Admitted::uncacheable_body`].
//!   An h2 request whose stream the client already closed is not one of them: it ends here, unanswered
//!   and unforwarded ([`Refusal::ClientGone`]).
//!
//! Everything here runs once per request, on the hit path too: two header lookups and a
//! table-driven pass over the host's bytes (measured: `docs/benchmarks.md`, issue 19).

pub mod authority;
pub mod framing;

use http::{header, Method, Version};
use pingora_http::authority::{is_http_family_scheme, raw_target_authority, RawTargetAuthority};
use pingora_http::RequestHeader;
use pingora_proxy::Session;
use std::future::Future;

/// Why a request head is refused: with 400, or, for [`Refusal::ClientGone`], with nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2).
    MissingHost,
    /// More than one `Host` field line (RFC 9112 §3.2).
    SeveralHosts,
    /// `Host` or `:authority` is not RFC 3986 authority syntax.
    InvalidAuthority,
    /// The request target is neither origin-form, absolute-form nor `*` for OPTIONS.
    InvalidTarget,
    /// A `Content-Length` the framing check let through but that is not one number.
    InvalidContentLength,
    /// The client closed the request's h2 stream before it was read: nothing is answered.
    ClientGone,
}

impl Refusal {
    /// For the debug log.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MissingHost => "HTTP/1.1 request without Host",
            Refusal::SeveralHosts => "more than one Host",
            Refusal::InvalidAuthority => "Host or :authority is not an RFC 3986 authority",
            Refusal::InvalidTarget => "request target not in origin or absolute form",
            Refusal::ClientGone => "the client closed the stream before its request was read",
            Refusal::InvalidContentLength => "Content-Length is not one number",
        }
    }
}

/// What a head that passed the checks needs changed before it goes on.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rewrites {
    /// `Content-Length` came as several lines or a list: the one value to send instead.
    pub content_length: Option<u64>,
    /// An absolute-form target without `Host`: its authority, to send as `Host`.
    pub host: Option<Vec<u8>>,
}

/// A request head that passed the checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admitted {
    /// A GET or HEAD with a body: forwarded, never answered from or stored in the cache.
    pub uncacheable_body: bool,
}

/// What the header fields say about the authority and the framing.
#[derive(Debug, Default)]
struct Fields<'a> {
    several_hosts: bool,
    host: Option<&'a [u8]>,
    /// `Some` when `Content-Length` came as several lines or a list: the one value to send.
    content_length_to_rewrite: Option<u64>,
}

/// Checks the head (see the module doc); `Ok` with what to change when it may go on.
pub fn check(req: &RequestHeader) -> Result<Rewrites, Refusal> {
    let fields = scan(req)?;
    if fields.several_hosts {
        return Err(Refusal::SeveralHosts);
    }
    let target_authority = target_authority(req)?;
    let mut rewrites = Rewrites {
        content_length: fields.content_length_to_rewrite,
        host: None,
    };
    match (fields.host, target_authority) {
        (Some(host), _) => {
            // Pingora has refused a Host that differs from an absolute-form authority
            if !authority::is_valid(host) {
                return Err(Refusal::InvalidAuthority);
            }
        }
        (None, _) if req.version == Version::HTTP_11 => return Err(Refusal::MissingHost),
        (None, Some(target)) => {
            if !authority::is_valid(target) {
                return Err(Refusal::InvalidAuthority);
            }
            rewrites.host = Some(target.to_vec());
        }
        // HTTP/2 (`:authority`), or HTTP/1.0 in origin-form without Host
        (None, None) => {
            if let Some(authority) = req.uri.authority() {
                if !authority::is_valid(authority.as_str().as_bytes()) {
                    return Err(Refusal::InvalidAuthority);
                }
            }
        }
    }
    Ok(rewrites)
}

/// The `Host` lines and the `Content-Length` lines: two lookups, whatever the number of fields
/// (cheaper than a pass over a browser's dozen fields).
fn scan(req: &RequestHeader) -> Result<Fields<'_>, Refusal> {
    let mut hosts = req.headers.get_all(header::HOST).iter();
    let host = hosts.next().map(|value| value.as_bytes());
    let several_hosts = hosts.next().is_some();
    let mut lengths = framing::ContentLengths::default();
    for value in req.headers.get_all(header::CONTENT_LENGTH) {
        lengths.add(value.as_bytes());
    }
    Ok(Fields {
        several_hosts,
        host,
        content_length_to_rewrite: lengths
            .to_rewrite()
            .map_err(|_| Refusal::InvalidContentLength)?,
    })
}

/// Judges the request target as received (Pingora's `raw_path`): origin-form (starts with `/`;
/// `Ok(None)`), absolute-form with an `http` or `https` scheme (`Ok(Some(its authority))`; an
/// empty path, as in `http://a.example?q`, is keyed as `/`), or `*` for OPTIONS. Anything else
/// is refused. (Pingora answers CONNECT, the only user of authority-form, with 405 before this.)
fn target_authority(req: &RequestHeader) -> Result<Option<&[u8]>, Refusal> {
    let target = req.raw_path();
    if target.first() == Some(&b'/') {
        return Ok(None);
    }
    if target == b"*" && req.method == Method::OPTIONS {
        return Ok(None);
    }
    match raw_target_authority(target) {
        RawTargetAuthority::Absolute {
            scheme, authority, ..
        } if is_http_family_scheme(scheme) => Ok(Some(authority)),
        _ => Err(Refusal::InvalidTarget),
    }
}

/// `request_filter`: checks the head, rewrites a listed `Content-Length` to its one value, and
/// says whether a GET or HEAD carries a body. `Err`: answer 400 (see [`refuse`]).
pub fn on_request(session: &mut Session) -> Result<Admitted, Refusal> {
    let rewrites = check(session.req_header())?;
    if let Some(length) = rewrites.content_length {
        session
            .req_header_mut()
            .insert_header(header::CONTENT_LENGTH, length)
            .map_err(|_| Refusal::InvalidContentLength)?;
    }
    if let Some(host) = rewrites.host {
        session
            .req_header_mut()
            .insert_header(header::HOST, host)
            .map_err(|_| Refusal::InvalidAuthority)?;
    }
    let method = &session.req_header().method;
    let safe = *method == Method::GET || *method == Method::HEAD;
    // Pingora reads the body's framing once per request anyway (to drain it for keep-alive)
    let body = safe && !session.is_body_empty();
    if body && h2_stream_closed(session) {
        return Err(Refusal::ClientGone);
    }
    Ok(Admitted {
        uncacheable_body: body,
    })
}

/// Whether the request's h2 stream has already ended: the client reset it, or its connection
/// closed, before the request got here. The h2 crate then no longer remembers that the request
/// had ended its stream (it ends a stream's receiving half with the connection's error), so the
/// request looks like one whose body is still coming; without this check a GET from a closed
/// connection was forwarded, uncached, to the origin (a client closing connections full of
/// requests, as h2load does when it stops, made the origin fetch each one).
fn h2_stream_closed(session: &mut Session) -> bool {
    let Some(closed) = session.downstream_session.watch_h2_stream_close() else {
        return false;
    };
    let mut closed = std::pin::pin!(closed);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    closed.as_mut().poll(&mut cx).is_ready()
}

/// Answers a refused head: 400, and the connection is closed (Pingora does not keep a
/// connection after an error response). Returns that the request is answered.
pub async fn refuse(session: &mut Session, why: Refusal) -> pingora_error::Result<bool> {
    log::debug!("request refused: {}", why.as_str());
    if why == Refusal::ClientGone {
        // nobody to answer: the request ends here, unforwarded
        return Ok(true);
    }
    session.respond_error(400).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, target: &str, fields: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("GET", target.as_bytes(), None).unwrap();
        req.set_version(version);
        for (name, value) in fields {
            req.append_header(name.to_string(), *value).unwrap();
        }
        req
    }

    fn untouched() -> Result<Rewrites, Refusal> {
        Ok(Rewrites::default())
    }

    #[test]
    fn a_plain_request_passes_untouched() {
        let req = request(Version::HTTP_11, "/a?b", &[("host", "shop.example")]);
        assert_eq!(check(&req), untouched());
    }

    #[test]
    fn host_is_required_on_http_1_1_only() {
        let bare = request(Version::HTTP_11, "/", &[]);
        assert_eq!(check(&bare), Err(Refusal::MissingHost));
        let old = request(Version::HTTP_10, "/", &[]);
        assert_eq!(check(&old), untouched());
        let absolute = request(Version::HTTP_11, "http://shop.example/", &[]);
        assert_eq!(check(&absolute), Err(Refusal::MissingHost));
    }

    #[test]
    fn an_absolute_target_without_host_gives_its_authority_as_host() {
        let absolute_old = request(Version::HTTP_10, "http://Shop.example:81/x", &[]);
        let rewrites = check(&absolute_old).unwrap();
        assert_eq!(rewrites.host.as_deref(), Some(&b"Shop.example:81"[..]));
        let with_host = request(
            Version::HTTP_11,
            "http://shop.example/x",
            &[("host", "shop.example")],
        );
        assert_eq!(check(&with_host), untouched());
    }

    #[test]
    fn host_must_be_one_authority() {
        let slash = request(
            Version::HTTP_11,
            "/v/app.js",
            &[("host", "shop.example/assets")],
        );
        assert_eq!(check(&slash), Err(Refusal::InvalidAuthority));
        let two = request(
            Version::HTTP_11,
            "/",
            &[("host", "shop.example"), ("host", "shop.example")],
        );
        assert_eq!(check(&two), Err(Refusal::SeveralHosts));
    }

    #[test]
    fn the_target_starts_with_a_slash_unless_absolute_or_options_star() {
        let star = request(Version::HTTP_11, "*", &[("host", "a")]);
        assert_eq!(check(&star), Err(Refusal::InvalidTarget));
        let mut options = RequestHeader::build("OPTIONS", b"*", None).unwrap();
        options.insert_header("host", "a").unwrap();
        assert_eq!(check(&options), untouched());
        let absolute = request(Version::HTTP_11, "http://a/x", &[("host", "a")]);
        assert_eq!(check(&absolute), untouched());
        let empty_path = request(Version::HTTP_11, "http://a?x", &[("host", "a")]);
        assert_eq!(check(&empty_path), untouched());
        for bad in ["a.example", "a.example/x", "ftp://a/x"] {
            let req = request(Version::HTTP_11, bad, &[("host", "a")]);
            assert_eq!(check(&req), Err(Refusal::InvalidTarget), "{bad}");
        }
    }

    #[test]
    fn a_listed_or_repeated_content_length_is_rewritten_to_its_value() {
        let list = request(
            Version::HTTP_11,
            "/",
            &[("host", "a"), ("content-length", "5, 5")],
        );
        assert_eq!(check(&list).unwrap().content_length, Some(5));
        let repeated = request(
            Version::HTTP_11,
            "/",
            &[
                ("host", "a"),
                ("content-length", "5"),
                ("content-length", "5"),
            ],
        );
        assert_eq!(check(&repeated).unwrap().content_length, Some(5));
        let single = request(
            Version::HTTP_11,
            "/",
            &[("host", "a"), ("content-length", "5")],
        );
        assert_eq!(check(&single), untouched());
    }
}
