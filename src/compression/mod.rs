//! Compression done once: one stored representation per object, served correctly to every client.
//!
//! The lesson from lighttpd's mod_mcpage: store a page compressed once, then serve each client what
//! it accepts from that one copy. Lacquer does it like this:
//!
//! * **Upstream**: a request that may be cached is forwarded with Lacquer's own `Accept-Encoding`
//!   (the configured coding first, then the other codings it decodes: `gzip` by default), whatever
//!   the client sent, so the stored copy is compressed when the origin can make it
//!   ([`upstream_accept_encoding`]).
//! * **On store**: an identity response of a compressible type is coded on its way into the cache
//!   in the configured coding (gzip, br or zstd) when `[cache.compression]` is enabled
//!   ([`encode_on_store`]).
//! * **Downstream**: a gzip, br or zstd body goes as-is to clients that accept its coding and is
//!   decoded on the fly, streaming, for those that do not ([`decode`]): no `Content-Encoding`, no
//!   stale `Content-Length`, a weak `ETag`, `Vary: Accept-Encoding` kept. A coding is never sent
//!   to a client that did not ask for it when Lacquer can decode it ([`accept`] decides).
//! * **Variants**: since a copy in one of those codings can serve everyone, `Accept-Encoding`
//!   does not split their variants (see [`crate::policy::vary`]).
//! * **Codings Lacquer does not know** (`deflate`, `compress`, private ones, stacked codings) are
//!   the origin's business (RFC 9110 §8.4): such a response passes through exactly as sent and
//!   is stored like any other, keyed by its `Vary` (`Accept-Encoding` included, when listed). It
//!   is never refused, refetched or transformed.
//!
//! [`CompressionCtx`] carries the per-request state between Pingora's phases; the proxy calls
//! the `on_*` functions from the matching phase.

pub mod accept;
pub mod coding;
pub mod decode;
pub mod decoded_copies;
pub mod decoding_reader;
pub mod encode_on_store;

pub use coding::{content_coding, ContentCoding};

use bytes::Bytes;
use decode::Decoder;
use encode_on_store::StoreEncoder;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};

use crate::config::compression::CompressionConfig;

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

/// Whether one stored copy of this response serves every client whatever it accepts: it is in
/// identity or in a coding Lacquer decodes. Only then does `Accept-Encoding` not split variants.
pub fn serves_every_client(resp: &ResponseHeader) -> bool {
    content_coding(resp) != ContentCoding::Other
}

/// The coding a stored or fetched response must be decoded from for this client: it is in gzip,
/// br or zstd and the client does not take that coding. Range requests and the fast path step
/// aside for such responses.
pub fn needs_decoding(req: &RequestHeader, resp: &ResponseHeader) -> Option<ContentCoding> {
    let coding = content_coding(resp);
    (coding.decodable() && !accept::request_accepts(req, coding)).then_some(coding)
}

/// The `Accept-Encoding` to send upstream, or `None` to forward the client's own: a request that
/// may be cached asks for the configured coding (then the others Lacquer decodes), so that the
/// one stored copy is compressed.
pub fn upstream_accept_encoding(
    config: &CompressionConfig,
    cache_enabled: bool,
) -> Option<&'static str> {
    cache_enabled.then(|| config.upstream_accept_encoding())
}

/// Per-request compression state, kept in the proxy's request context.
#[derive(Default)]
pub struct CompressionCtx {
    /// The encoder for a response being coded on its way into the cache (boxed, like the
    /// decoder: the context is built for every request, hits included, and these are large).
    store_encoder: Option<Box<StoreEncoder>>,
    /// How a compressed response goes to a client that does not take its coding.
    decoding: Option<Decoding>,
}

/// A compressed response's body on its way to a client that does not take its coding.
enum Decoding {
    /// Decoded as it passes (boxed: the context is built for every request): by the body filter
    /// ([`on_downstream_body`]), or in bounded pieces by a caller that writes each
    /// ([`on_downstream_body_in_pieces`]).
    Streaming(Box<Decoder>),
    /// Decoded by the body reader the response is sent from ([`decode_in_reader`]): the filter
    /// passes its pieces on.
    InReader,
    /// Decoded whole before its head went out (a small stored body, see
    /// [`decode::WHOLE_DECODE_MAX_STORED`]): sent in place of the first chunk of the stored body,
    /// and the stored chunks dropped (`None` once sent).
    Whole(Option<Bytes>),
}

/// `upstream_response_filter`: starts compression on store when the response is going into the
/// cache (`will_store`). Every coding the origin chose passes as it is, and says `Vary:
/// Accept-Encoding` when it is one Lacquer decodes: this answer, stored or not, goes to clients
/// that do not take that coding decoded, so what a client gets depends on its `Accept-Encoding`
/// (RFC 9110 §12.5.5), whether the origin said so or not. Without it a cache in front of
/// Lacquer could keep the gzip answer one client got and give it to clients that cannot read it.
pub fn on_upstream_response(
    config: &CompressionConfig,
    ctx: &mut CompressionCtx,
    req: &RequestHeader,
    resp: &mut ResponseHeader,
    stored_up_to: Option<usize>,
) {
    if content_coding(resp).decodable() {
        add_vary_accept_encoding(resp);
    }
    ctx.store_encoder = None;
    let Some(max_object_size) = stored_up_to else {
        return;
    };
    if req.method != http::Method::HEAD
        && encode_on_store::wants(config, resp)
        && encode_on_store::coded_copy_fits(resp, max_object_size)
    {
        let length = encode_on_store::content_length(resp);
        if let Some(encoder) = StoreEncoder::new(config.coding, config.level, length) {
            encode_on_store::adjust_head(resp, config.coding);
            ctx.store_encoder = Some(Box::new(encoder));
        }
    }
}

/// `upstream_response_body_filter`: codes the body when compression on store started.
pub fn on_upstream_body(
    ctx: &mut CompressionCtx,
    body: &mut Option<Bytes>,
    end: bool,
) -> Result<()> {
    let Some(encoder) = ctx.store_encoder.as_mut() else {
        return Ok(());
    };
    let input = body.take().unwrap_or_default();
    let coded = encoder
        .feed(&input, end)
        .map_err(|e| Error::because(ErrorType::InternalError, "compression on store", e))?;
    *body = Some(coded);
    if end {
        ctx.store_encoder = None;
    }
    Ok(())
}

/// Rewrites the head of a compressed response for its decoded body: no `Content-Encoding`, no
/// length (the caller sets the decoded one if it knows it), no `Accept-Ranges`, a weak `ETag` and
/// `Vary: Accept-Encoding`. Shared by the streaming decode and the fast path's whole-body decode.
pub fn rewrite_head_for_decoded_body(resp: &mut ResponseHeader) {
    resp.remove_header(&http::header::CONTENT_ENCODING);
    resp.remove_header(&http::header::CONTENT_LENGTH);
    resp.remove_header(&http::header::ACCEPT_RANGES);
    weaken_etag(resp);
    add_vary_accept_encoding(resp);
}

/// `response_filter`: for a compressed response to a client that does not take its coding,
/// rewrites the head for the decoded body and starts the decoder. `stored_body` is the whole body
/// this response will carry when it is a small complete stored object (a hit, see
/// `storage::memory::whole_body_within`): such a body is decoded now and its head given the
/// decoded `Content-Length`, as the fast path sends the same hit. Any other body, or one that
/// does not decode within [`decode::WHOLE_DECODE_MAX_DECODED`], is decoded as it passes, chunked.
/// A stored body found not valid in its coding before anything was sent fails the request before
/// its head (an error answer: Pingora's hit path sends it as a `500`), never a `200` cut short,
/// which a client reading to the close cannot tell from a whole one; clients that take the
/// coding still get it as it is.
pub fn on_downstream_head(
    ctx: &mut CompressionCtx,
    req: &RequestHeader,
    resp: &mut ResponseHeader,
    stored_body: Option<&[Bytes]>,
) -> Result<()> {
    ctx.decoding = None;
    let Some(coding) = needs_decoding(req, resp) else {
        return Ok(());
    };
    rewrite_head_for_decoded_body(resp);
    let has_body =
        !matches!(resp.status.as_u16(), 204 | 304 | 100..=199) && req.method != http::Method::HEAD;
    if !has_body {
        return Ok(());
    }
    let whole = match stored_body {
        Some(chunks) => decode::decode_whole(coding, chunks, decode::WHOLE_DECODE_MAX_DECODED)
            .or_else(|e| {
                Error::e_because(
                    ErrorType::HTTPStatus(502),
                    "the stored body is not valid in its coding",
                    e,
                )
            })?,
        None => None,
    };
    if let Some(plain) = whole {
        if resp
            .insert_header(http::header::CONTENT_LENGTH, plain.len())
            .is_ok()
        {
            ctx.decoding = Some(Decoding::Whole(Some(plain)));
            return Ok(());
        }
    }
    if req.version == http::Version::HTTP_11 {
        // the decoded length is unknown until the end: chunked (h2 drops this field)
        let _ = resp.insert_header(http::header::TRANSFER_ENCODING, "chunked");
    }
    ctx.decoding = Decoder::new(coding).map(|decoder| Decoding::Streaming(Box::new(decoder)));
    Ok(())
}

/// The most one call of the body filter may decode one chunk to. The filter returns one piece
/// per chunk, so what a chunk decodes to is held at once: beyond this (a ratio of 128 to 1 for the
/// 64 KiB an origin's read gives) the body is taken for a decompression bomb and the response is
/// cut. Bodies read from storage are decoded in the reader instead ([`decode_in_reader`]), and
/// Lacquer's own relays write pieces ([`on_downstream_body_in_pieces`]): neither has this bound.
pub const FILTER_DECODE_MAX: usize = 8 * 1024 * 1024;

/// `response_body_filter`: decodes the body when [`on_downstream_head`] started a decoder, or
/// sends the body it decoded whole in place of the stored chunks. All of a chunk is decoded in
/// the call (at most [`FILTER_DECODE_MAX`]).
pub fn on_downstream_body(
    ctx: &mut CompressionCtx,
    body: &mut Option<Bytes>,
    end: bool,
) -> Result<()> {
    match ctx.decoding.as_mut() {
        None | Some(Decoding::InReader) => return Ok(()),
        Some(Decoding::Whole(plain)) => *body = plain.take(),
        Some(Decoding::Streaming(decoder)) => {
            decoder.push(body.take().unwrap_or_default(), end);
            let mut pieces = Vec::new();
            let mut decoded = 0;
            loop {
                let piece = pull_for_client(decoder, decoding_reader::PIECE)?;
                if piece.is_empty() {
                    break;
                }
                decoded += piece.len();
                if decoded > FILTER_DECODE_MAX {
                    return Error::e_explain(
                        ErrorType::InternalError,
                        "decoding for client: one chunk decodes to more than 8 MiB",
                    );
                }
                pieces.push(piece);
            }
            *body = Some(decode::joined(pieces));
        }
    }
    if end {
        ctx.decoding = None;
    }
    Ok(())
}

/// The decoder's next piece for a client ([`Decoder::pull`]), its failure the request's error.
fn pull_for_client(decoder: &mut Decoder, max: usize) -> Result<Bytes> {
    decoder
        .pull(max)
        .map_err(|e| Error::because(ErrorType::InternalError, "decoding for client", e))
}

/// Whether the response's body is decoded as it passes, for a caller that writes each piece
/// itself to take [`on_downstream_body_in_pieces`]'s way (every other body takes the filter's).
pub fn decodes_in_pieces(ctx: &CompressionCtx) -> bool {
    matches!(ctx.decoding, Some(Decoding::Streaming(_)))
}

/// The body filter for a caller that writes each piece itself (Lacquer's own relays): gives the
/// decoder `body` (the next chunk, or `None` to go on with the last) and puts in its place the
/// next decoded piece, of at most [`decoding_reader::PIECE`] bytes. `true` while more pieces
/// follow from what was given: the caller writes this one, then calls again with `None`, and
/// writes the end of the body only with the last piece. Responses not decoded piece by piece go
/// through [`on_downstream_body`] once (`false`).
pub fn on_downstream_body_in_pieces(
    ctx: &mut CompressionCtx,
    body: &mut Option<Bytes>,
    end: bool,
) -> Result<bool> {
    let Some(Decoding::Streaming(decoder)) = ctx.decoding.as_mut() else {
        on_downstream_body(ctx, body, end)?;
        return Ok(false);
    };
    if let Some(chunk) = body.take() {
        decoder.push(chunk, end);
    } else if end {
        decoder.push(Bytes::new(), true);
    }
    let piece = pull_for_client(decoder, decoding_reader::PIECE)?;
    let more = !piece.is_empty();
    *body = more.then_some(piece);
    if !more && end {
        ctx.decoding = None;
    }
    Ok(more)
}

/// `response_filter`, after [`on_downstream_head`]: a body sent from `reader` (a hit's, or a
/// filling miss's) is decoded there, in bounded pieces ([`decoding_reader`]), instead of by the
/// body filter.
pub fn decode_in_reader(ctx: &mut CompressionCtx, reader: &mut pingora_cache::storage::HitHandler) {
    if let Some(Decoding::Streaming(_)) = ctx.decoding {
        let Some(Decoding::Streaming(decoder)) = ctx.decoding.replace(Decoding::InReader) else {
            unreachable!("matched above");
        };
        decoding_reader::DecodingReader::wrap(reader, *decoder);
    }
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

    fn req(accept_encoding: Option<&str>) -> RequestHeader {
        let mut r = RequestHeader::build("GET", b"/", None).unwrap();
        if let Some(ae) = accept_encoding {
            r.insert_header("accept-encoding", ae).unwrap();
        }
        r
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

    #[test]
    fn a_known_coding_is_decoded_only_for_clients_that_refuse_it() {
        let br = resp(&[("content-encoding", "br")]);
        assert_eq!(needs_decoding(&req(None), &br), Some(ContentCoding::Br));
        assert_eq!(
            needs_decoding(&req(Some("gzip")), &br),
            Some(ContentCoding::Br)
        );
        assert_eq!(needs_decoding(&req(Some("gzip, br")), &br), None);
        let zstd = resp(&[("content-encoding", "zstd")]);
        assert_eq!(needs_decoding(&req(Some("br, zstd")), &zstd), None);
        assert_eq!(
            needs_decoding(&req(Some("*, zstd;q=0")), &zstd),
            Some(ContentCoding::Zstd)
        );
        // never judged: an unknown coding, or none
        let unknown = resp(&[("content-encoding", "x-private")]);
        assert_eq!(needs_decoding(&req(None), &unknown), None);
        assert!(!serves_every_client(&unknown));
        assert!(serves_every_client(&zstd));
        assert_eq!(needs_decoding(&req(None), &resp(&[])), None);
    }
    fn gzip(plain: &[u8]) -> Bytes {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(plain).unwrap();
        Bytes::from(encoder.finish().unwrap())
    }

    /// Runs the body filter over `chunks` as Pingora would, returning what the client gets.
    fn sent(ctx: &mut CompressionCtx, chunks: &[Bytes]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            let mut body = Some(chunk.clone());
            on_downstream_body(ctx, &mut body, i + 1 == chunks.len()).unwrap();
            out.extend_from_slice(&body.unwrap_or_default());
        }
        out
    }

    #[test]
    fn a_small_stored_body_is_decoded_whole_with_its_length() {
        let plain = b"lacquer ".repeat(500);
        let coded = gzip(&plain);
        let (first, rest) = coded.split_at(coded.len() / 2);
        let chunks = [Bytes::copy_from_slice(first), Bytes::copy_from_slice(rest)];
        let mut ctx = CompressionCtx::default();
        let mut head = resp(&[("content-encoding", "gzip"), ("content-length", "9")]);
        on_downstream_head(&mut ctx, &req(None), &mut head, Some(&chunks)).unwrap();
        let length = plain.len().to_string();
        assert_eq!(head.headers.get("content-length").unwrap(), &length[..]);
        assert!(head.headers.get("transfer-encoding").is_none());
        assert!(head.headers.get("content-encoding").is_none());
        assert_eq!(sent(&mut ctx, &chunks), plain);
        assert!(ctx.decoding.is_none());
    }

    #[test]
    fn any_other_body_is_decoded_as_it_passes_chunked() {
        let plain = b"lacquer ".repeat(500);
        let coded = gzip(&plain);
        let corrupt = Bytes::from(coded[..coded.len() - 4].to_vec());
        let mut ctx = CompressionCtx::default();
        let mut head = resp(&[("content-encoding", "gzip"), ("content-length", "9")]);
        let refused = on_downstream_head(&mut ctx, &req(None), &mut head, Some(&[corrupt]));
        assert_eq!(refused.unwrap_err().etype(), &ErrorType::HTTPStatus(502));
        let large = gzip(&vec![b'x'; decode::WHOLE_DECODE_MAX_DECODED + 1]);
        for stored in [None, Some(&[large][..])] {
            let mut ctx = CompressionCtx::default();
            let mut head = resp(&[("content-encoding", "gzip"), ("content-length", "9")]);
            on_downstream_head(&mut ctx, &req(None), &mut head, stored).unwrap();
            assert!(head.headers.get("content-length").is_none());
            assert_eq!(head.headers.get("transfer-encoding").unwrap(), "chunked");
            assert!(matches!(ctx.decoding, Some(Decoding::Streaming(_))));
        }
        // a HEAD request gets neither, and no length it could not check
        let mut ctx = CompressionCtx::default();
        let mut head = resp(&[("content-encoding", "gzip"), ("content-length", "9")]);
        let mut head_req = req(None);
        head_req.set_method(http::Method::HEAD);
        on_downstream_head(&mut ctx, &head_req, &mut head, Some(&[coded])).unwrap();
        assert!(head.headers.get("content-length").is_none());
        assert!(ctx.decoding.is_none());
    }
}
