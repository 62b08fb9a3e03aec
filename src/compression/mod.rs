//! Compression done once: one stored representation per object, served correctly to every client.
//!
//! The lesson from lighttpd's mod_mcpage: store a page compressed once, then serve each client what
//! it accepts from that one copy. Lacquer does it like this:
//!
//! * **Upstream**: a request that may be cached is forwarded with `Accept-Encoding: gzip`, whatever
//!   the client sent, so the stored copy is gzip when the origin can make it ([`upstream_accept_encoding`]).
//! * **On store**: an identity response of a compressible type is gzip-coded on its way into the
//!   cache when `[cache.compression]` is enabled ([`gzip_on_store`]).
//! * **Downstream**: a gzip body goes as-is to clients that accept gzip and is decoded on the fly,
//!   streaming, for those that do not ([`gunzip`]): no `Content-Encoding`, no stale
//!   `Content-Length`, a weak `ETag`, `Vary: Accept-Encoding` kept. gzip is never sent to a client
//!   that did not ask for it ([`accept`] decides).
//! * **Variants**: since a gzip or identity copy can serve everyone, `Accept-Encoding` does not
//!   split variants (see [`crate::policy::vary`]). A coding Lacquer cannot decode (br, zstd, ...)
//!   is therefore never stored; it is passed to a client that accepts it, and for one that does not
//!   the fetch is retried once asking the origin for identity.
//!
//! [`CompressionCtx`] carries the per-request state between Pingora's phases; the proxy calls
//! the `on_*` functions from the matching phase.

pub mod accept;
pub mod decoded_copies;
pub mod gunzip;
pub mod gzip_on_store;

use accept::AcceptEncoding;
use bytes::Bytes;
use gunzip::Gunzip;
use gzip_on_store::StoreGzip;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};

use crate::config::compression::CompressionConfig;

/// The content-coding of a response, as far as Lacquer can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentCoding {
    /// No `Content-Encoding` (or `identity`).
    Identity,
    /// Exactly `gzip` (or `x-gzip`): Lacquer can decode it.
    Gzip,
    /// Anything else, including stacked codings: Lacquer cannot transform it.
    Other,
}

/// Reads a response's `Content-Encoding`.
pub fn content_coding(resp: &ResponseHeader) -> ContentCoding {
    // the common case, one field with one coding, without splitting
    let mut fields = resp.headers.get_all(http::header::CONTENT_ENCODING).iter();
    match (fields.next(), fields.next()) {
        (None, _) => return ContentCoding::Identity,
        (Some(only), None) => {
            let coding = only.as_bytes();
            if coding.eq_ignore_ascii_case(b"gzip") {
                return ContentCoding::Gzip;
            }
            if coding.eq_ignore_ascii_case(b"identity") {
                return ContentCoding::Identity;
            }
        }
        _ => {}
    }
    let mut codings = resp
        .headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"));
    match (codings.next(), codings.next()) {
        (None, _) => ContentCoding::Identity,
        (Some(c), None) if c.eq_ignore_ascii_case("gzip") || c.eq_ignore_ascii_case("x-gzip") => {
            ContentCoding::Gzip
        }
        _ => ContentCoding::Other,
    }
}

/// Makes a strong `ETag` weak (RFC 9110 §8.8.1: the transformed bytes are a different
/// representation); drops a malformed one, as nginx does.
pub fn weaken_etag(resp: &mut ResponseHeader) {
    let Some(etag) = resp.headers.get(http::header::ETAG) else {
        return;
    };
    let bytes = etag.as_bytes();
    if bytes.starts_with(b"W/") {
        return;
    }
    if bytes.starts_with(b"\"") {
        let weak = [b"W/", bytes].concat();
        if let Ok(value) = http::HeaderValue::from_bytes(&weak) {
            let _ = resp.insert_header(http::header::ETAG, value);
            return;
        }
    }
    resp.remove_header(&http::header::ETAG);
}

/// Adds `Accept-Encoding` to `Vary` unless it (or `*`) is already listed.
pub fn add_vary_accept_encoding(resp: &mut ResponseHeader) {
    let listed = crate::policy::vary::vary_names(resp).any(|n| n == "accept-encoding" || n == "*");
    if !listed {
        let _ = resp.append_header(http::header::VARY, "Accept-Encoding");
    }
}

/// Whether a response with this coding may be stored: only gzip and identity, the codings every
/// client can be served from.
pub fn storable(resp: &ResponseHeader) -> bool {
    content_coding(resp) != ContentCoding::Other
}

/// Whether a stored or fetched response must be decoded for this client (it is gzip and the
/// client does not take gzip). Range requests and the fast path step aside for such responses.
pub fn needs_gunzip(req: &RequestHeader, resp: &ResponseHeader) -> bool {
    content_coding(resp) == ContentCoding::Gzip && !accept::request_accepts_gzip(req)
}

/// The `Accept-Encoding` to send upstream, or `None` to forward the client's own.
///
/// A request that may be cached asks for gzip so that the one stored copy is compressed; after
/// an origin answered with a coding the client cannot take, the retry asks for identity.
pub fn upstream_accept_encoding(
    ctx: &mut CompressionCtx,
    cache_enabled: bool,
) -> Option<&'static str> {
    ctx.retry_requested = false;
    let replaced = if ctx.identity_retry {
        Some("identity")
    } else if cache_enabled {
        Some("gzip")
    } else {
        None
    };
    ctx.replaced_accept_encoding = replaced.is_some();
    replaced
}

/// Whether the error ending this attempt is this module asking for the identity retry, which the
/// proxy's `error_while_proxy` must leave as it is (nothing has reached the client yet, and the
/// backend did nothing wrong).
pub fn retry_requested(ctx: &CompressionCtx) -> bool {
    ctx.retry_requested
}

/// Per-request compression state, kept in the proxy's request context.
#[derive(Default)]
pub struct CompressionCtx {
    /// Set after an origin answered with a coding the client refuses: the next attempt asks for
    /// identity.
    identity_retry: bool,
    /// The current attempt ended in our own request for that retry (see [`retry_requested`]).
    retry_requested: bool,
    /// Whether the origin was sent our `Accept-Encoding` rather than the client's: only then is
    /// a coding the client refuses Lacquer's to correct (otherwise the origin answered the
    /// client's own request, and its answer passes as before).
    replaced_accept_encoding: bool,
    /// The encoder for a response being gzip-coded on its way into the cache (boxed, like the
    /// decoder: the context is built for every request, hits included, and these are large).
    store_gzip: Option<Box<StoreGzip>>,
    /// The decoder for a gzip response going to a client that does not take gzip.
    gunzip: Option<Box<Gunzip>>,
}

/// `upstream_response_filter`: refuses (and retries once) a coding the client cannot take, and
/// starts compression on store when the response is going into the cache (`will_store`).
pub fn on_upstream_response(
    config: &CompressionConfig,
    ctx: &mut CompressionCtx,
    req: &RequestHeader,
    resp: &mut ResponseHeader,
    will_store: bool,
) -> Result<()> {
    ctx.store_gzip = None;
    let coding = content_coding(resp);
    if coding == ContentCoding::Other && ctx.replaced_accept_encoding {
        let accepts = resp
            .headers
            .get(http::header::CONTENT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| AcceptEncoding::parse(req).accepts(c.trim()));
        if !accepts {
            let first_attempt = !ctx.identity_retry;
            ctx.identity_retry = true;
            let mut e = Error::explain(
                ErrorType::HTTPStatus(502),
                "origin sent a content-coding the client does not accept",
            );
            // one more attempt, asking for identity; a second refusal ends in 502
            e.set_retry(first_attempt);
            ctx.retry_requested = first_attempt;
            return Err(e);
        }
    }
    if coding == ContentCoding::Other {
        return Ok(());
    }
    if will_store && req.method != http::Method::HEAD && StoreGzip::wants(config, resp) {
        StoreGzip::adjust_head(resp);
        ctx.store_gzip = Some(Box::new(StoreGzip::new(config.level)));
    }
    Ok(())
}

/// `upstream_response_body_filter`: gzip-codes the body when compression on store started.
pub fn on_upstream_body(
    ctx: &mut CompressionCtx,
    body: &mut Option<Bytes>,
    end: bool,
) -> Result<()> {
    let Some(encoder) = ctx.store_gzip.as_mut() else {
        return Ok(());
    };
    let input = body.take().unwrap_or_default();
    let coded = encoder
        .feed(&input, end)
        .map_err(|e| Error::because(ErrorType::InternalError, "gzip on store", e))?;
    *body = Some(coded);
    if end {
        ctx.store_gzip = None;
    }
    Ok(())
}

/// Rewrites the head of a gzip response for its decoded body: no `Content-Encoding`, no length
/// (the caller sets the decoded one if it knows it), no `Accept-Ranges`, a weak `ETag` and
/// `Vary: Accept-Encoding`. Shared by the streaming decode and the fast path's whole-body decode.
pub fn rewrite_head_for_decoded_body(resp: &mut ResponseHeader) {
    resp.remove_header(&http::header::CONTENT_ENCODING);
    resp.remove_header(&http::header::CONTENT_LENGTH);
    resp.remove_header(&http::header::ACCEPT_RANGES);
    weaken_etag(resp);
    add_vary_accept_encoding(resp);
}

/// `response_filter`: for a gzip response to a client that does not take gzip, rewrites the
/// head for the decoded body and starts the decoder.
pub fn on_downstream_head(
    ctx: &mut CompressionCtx,
    req: &RequestHeader,
    resp: &mut ResponseHeader,
) {
    ctx.gunzip = None;
    if !needs_gunzip(req, resp) {
        return;
    }
    rewrite_head_for_decoded_body(resp);
    let has_body =
        !matches!(resp.status.as_u16(), 204 | 304 | 100..=199) && req.method != http::Method::HEAD;
    if has_body {
        if req.version == http::Version::HTTP_11 {
            // the decoded length is unknown until the end: chunked (h2 drops this field)
            let _ = resp.insert_header(http::header::TRANSFER_ENCODING, "chunked");
        }
        ctx.gunzip = Some(Box::new(Gunzip::new()));
    }
}

/// `response_body_filter`: decodes the body when [`on_downstream_head`] started a decoder.
pub fn on_downstream_body(
    ctx: &mut CompressionCtx,
    body: &mut Option<Bytes>,
    end: bool,
) -> Result<()> {
    let Some(decoder) = ctx.gunzip.as_mut() else {
        return Ok(());
    };
    let input = body.take().unwrap_or_default();
    let plain = decoder
        .feed(&input, end)
        .map_err(|e| Error::because(ErrorType::InternalError, "gunzip for client", e))?;
    *body = Some(plain);
    if end {
        ctx.gunzip = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn codings() {
        assert_eq!(content_coding(&resp(&[])), ContentCoding::Identity);
        assert_eq!(
            content_coding(&resp(&[("content-encoding", "identity")])),
            ContentCoding::Identity
        );
        assert_eq!(
            content_coding(&resp(&[("content-encoding", "GZIP")])),
            ContentCoding::Gzip
        );
        assert_eq!(
            content_coding(&resp(&[("content-encoding", "br")])),
            ContentCoding::Other
        );
        assert_eq!(
            content_coding(&resp(&[("content-encoding", "gzip, br")])),
            ContentCoding::Other
        );
    }

    #[test]
    fn etags_are_weakened_or_dropped() {
        let mut r = resp(&[("etag", "\"abc\"")]);
        weaken_etag(&mut r);
        assert_eq!(r.headers.get("etag").unwrap(), "W/\"abc\"");
        weaken_etag(&mut r);
        assert_eq!(r.headers.get("etag").unwrap(), "W/\"abc\"");
        let mut bad = resp(&[("etag", "abc")]);
        weaken_etag(&mut bad);
        assert!(bad.headers.get("etag").is_none());
    }

    #[test]
    fn vary_is_added_once() {
        let mut r = resp(&[("vary", "Accept-Language, accept-encoding")]);
        add_vary_accept_encoding(&mut r);
        assert_eq!(r.headers.get_all("vary").iter().count(), 1);
        let mut r = resp(&[]);
        add_vary_accept_encoding(&mut r);
        assert_eq!(r.headers.get("vary").unwrap(), "Accept-Encoding");
    }
}
