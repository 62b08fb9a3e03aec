//! Compression on store: an identity response of a compressible type is coded once, on its way
//! into the cache, in the configured coding (`cache.compression.coding`: gzip, br or zstd), so
//! every later hit serves (or decodes) the one stored copy.
//!
//! [`wants`] decides from the response head; [`StoreEncoder`] then encodes the body chunk by
//! chunk as Pingora hands it from the origin to the cache writer.

use super::coding::{content_coding, ContentCoding};
use crate::config::compression::CompressionConfig;
use bytes::Bytes;
use pingora_http::ResponseHeader;
use std::io::{self, Write};

/// The largest window (log2 bytes) asked for: 4 MiB, brotli's default, enough for any page.
const MAX_WINDOW_LOG: u32 = 22;

/// The smallest window both brotli and zstd accept.
const MIN_WINDOW_LOG: u32 = 10;

/// Bytes the brotli encoder works through at a time (its default).
const BROTLI_BUFFER: usize = 4096;

/// Whether the coded copy of `resp` is sure to fit `max_object_size`: an incompressible body
/// grows a little when coded (gzip's stored blocks, brotli's and zstd's raw blocks: well under
/// 0.2 % and a few dozen bytes of framing), so a body within [`coded_growth`] of the limit is
/// stored as it came. Coded, a page the cache keeps whole would be over the limit and never
/// kept. A body of unknown length is coded, and judged by its coded length as it streams.
pub fn coded_copy_fits(resp: &ResponseHeader, max_object_size: usize) -> bool {
    content_length(resp)
        .is_none_or(|len| len.saturating_add(coded_growth(max_object_size)) <= max_object_size)
}

/// The most a body of up to `max_object_size` grows when coded (see [`coded_copy_fits`]).
pub fn coded_growth(max_object_size: usize) -> usize {
    max_object_size / 512 + 1024
}

/// Whether an origin response should be coded on store: compression is enabled, the response is
/// a 200 in identity coding, not marked `no-transform` (RFC 9110 §7.7), of a listed type, and not
/// known to be smaller than `min_size`.
pub fn wants(config: &CompressionConfig, resp: &ResponseHeader) -> bool {
    if !config.enabled || resp.status != http::StatusCode::OK {
        return false;
    }
    if content_coding(resp) != ContentCoding::Identity {
        return false;
    }
    let no_transform = resp
        .headers
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("no-transform"));
    if no_transform {
        return false;
    }
    let media_type = resp
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    let Some(media_type) = media_type else {
        return false;
    };
    if !config.compressible(&media_type) {
        return false;
    }
    // without a length the body is streamed, usually generated: worth compressing
    content_length(resp).is_none_or(|len| len >= config.min_size)
}

/// The response's `Content-Length`, if it has a valid one.
pub fn content_length(resp: &ResponseHeader) -> Option<usize> {
    resp.headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
}

/// The window (log2 bytes) for a body of `length` bytes: the smallest that holds it, so that a
/// small page does not make brotli or zstd allocate (and the decoder of every identity client
/// later allocate) megabytes of window for kilobytes of text; the largest when the length is
/// not known.
fn window_log(length: Option<usize>) -> u32 {
    match length {
        Some(len) => {
            (usize::BITS - len.max(1).leading_zeros()).clamp(MIN_WINDOW_LOG, MAX_WINDOW_LOG)
        }
        None => MAX_WINDOW_LOG,
    }
}

/// Rewrites the head of a response about to be coded in `coding`: `Content-Encoding`, no
/// `Content-Length` (the coded length is not known yet), a weak `ETag` (the bytes differ from
/// the origin's representation) and `Vary: Accept-Encoding`.
pub fn adjust_head(resp: &mut ResponseHeader, coding: ContentCoding) {
    let _ = resp.insert_header(http::header::CONTENT_ENCODING, coding.token());
    resp.remove_header(&http::header::CONTENT_LENGTH);
    super::weaken_etag(resp);
    super::add_vary_accept_encoding(resp);
}

/// An encoder fed one origin body chunk at a time.
pub struct StoreEncoder {
    inner: Option<Inner>,
}

enum Inner {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl StoreEncoder {
    /// An encoder for `coding` at `level` (gzip 1..=9, brotli quality 0..=11, zstd 1..=19: the
    /// configuration checks the range) for a body of `length` bytes when known (it sizes the
    /// window); `None` for a coding Lacquer does not encode.
    pub fn new(coding: ContentCoding, level: u32, length: Option<usize>) -> Option<Self> {
        let window = window_log(length);
        let inner = match coding {
            ContentCoding::Gzip => Inner::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::new(level),
            )),
            ContentCoding::Br => Inner::Br(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                BROTLI_BUFFER,
                level,
                window,
            ))),
            ContentCoding::Zstd => {
                let mut encoder =
                    zstd::stream::write::Encoder::new(Vec::new(), level as i32).ok()?;
                if length.is_some() {
                    encoder.window_log(window).ok()?;
                }
                Inner::Zstd(encoder)
            }
            ContentCoding::Identity | ContentCoding::Other => return None,
        };
        Some(StoreEncoder { inner: Some(inner) })
    }

    /// Encodes `chunk`; on `end`, ends the coded stream. Returns the coded bytes produced so far
    /// (often empty: each encoder buffers until it has a block).
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> io::Result<Bytes> {
        let finished = io::Error::other("encoder used after the end of its stream");
        let out = match self.inner.as_mut().ok_or(finished)? {
            Inner::Gzip(e) => {
                e.write_all(chunk)?;
                std::mem::take(e.get_mut())
            }
            Inner::Br(e) => {
                e.write_all(chunk)?;
                std::mem::take(e.get_mut())
            }
            Inner::Zstd(e) => {
                e.write_all(chunk)?;
                std::mem::take(e.get_mut())
            }
        };
        if !end {
            return Ok(Bytes::from(out));
        }
        // each encoder writes its last block and trailer when it is consumed
        let tail = match self.inner.take() {
            Some(Inner::Gzip(e)) => e.finish()?,
            Some(Inner::Br(e)) => e.into_inner(),
            Some(Inner::Zstd(e)) => e.finish()?,
            None => Vec::new(),
        };
        Ok(Bytes::from([out, tail].concat()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::Decoder;
    use super::*;

    fn config() -> CompressionConfig {
        CompressionConfig {
            enabled: true,
            ..CompressionConfig::default()
        }
    }

    fn resp(headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn decides_by_type_size_coding_and_no_transform() {
        let c = config();
        assert!(wants(
            &c,
            &resp(&[
                ("content-type", "text/html; charset=utf-8"),
                ("content-length", "5000")
            ])
        ));
        assert!(wants(&c, &resp(&[("content-type", "application/json")])));
        assert!(!wants(
            &c,
            &resp(&[("content-type", "text/html"), ("content-length", "10")])
        ));
        assert!(!wants(
            &c,
            &resp(&[("content-type", "image/png"), ("content-length", "5000")])
        ));
        assert!(!wants(
            &c,
            &resp(&[("content-type", "text/html"), ("content-encoding", "br")])
        ));
        assert!(!wants(
            &c,
            &resp(&[
                ("content-type", "text/html"),
                ("cache-control", "max-age=5, no-transform")
            ])
        ));
        let off = CompressionConfig {
            enabled: false,
            ..config()
        };
        assert!(!wants(&off, &resp(&[("content-type", "text/html")])));
    }

    #[test]
    fn every_coding_round_trips_through_its_decoder() {
        let plain = b"<html>".repeat(10_000);
        for coding in ContentCoding::DECODABLE {
            let mut enc = StoreEncoder::new(coding, 5, Some(plain.len())).unwrap();
            let mut coded = Vec::new();
            for (i, chunk) in plain.chunks(3000).enumerate() {
                let end = (i + 1) * 3000 >= plain.len();
                coded.extend_from_slice(&enc.feed(chunk, end).unwrap());
            }
            assert!(coded.len() < plain.len() / 10, "{coding:?}");
            assert!(
                enc.feed(b"more", true).is_err(),
                "{coding:?}: used after its end"
            );
            let mut decoder = Decoder::new(coding).unwrap();
            assert_eq!(
                &decoder.feed(&coded, true).unwrap()[..],
                &plain[..],
                "{coding:?}"
            );
        }
        assert!(StoreEncoder::new(ContentCoding::Other, 5, None).is_none());
    }

    #[test]
    fn the_window_fits_the_body() {
        assert_eq!(window_log(Some(0)), MIN_WINDOW_LOG);
        assert_eq!(window_log(Some(8192)), 14);
        assert_eq!(window_log(Some(8191)), 13);
        assert_eq!(window_log(Some(50 << 20)), MAX_WINDOW_LOG);
        assert_eq!(window_log(None), MAX_WINDOW_LOG);
        // a body longer than its announced length still codes and decodes (a wrong
        // Content-Length is the origin's error, not a reason to corrupt the copy)
        let plain = b"0123456789abcdef".repeat(4096);
        for coding in ContentCoding::DECODABLE {
            let mut enc = StoreEncoder::new(coding, 5, Some(1000)).unwrap();
            let coded = enc.feed(&plain, true).unwrap();
            let mut decoder = Decoder::new(coding).unwrap();
            assert_eq!(
                &decoder.feed(&coded, true).unwrap()[..],
                &plain[..],
                "{coding:?}"
            );
        }
    }

    #[test]
    fn the_head_names_the_coding() {
        let mut r = resp(&[("content-length", "5000"), ("etag", "\"e\"")]);
        adjust_head(&mut r, ContentCoding::Br);
        assert_eq!(r.headers.get("content-encoding").unwrap(), "br");
        assert!(r.headers.get("content-length").is_none());
        assert_eq!(r.headers.get("etag").unwrap(), "W/\"e\"");
        assert_eq!(r.headers.get("vary").unwrap(), "Accept-Encoding");
    }
    #[test]
    fn a_body_near_the_size_limit_is_not_coded_and_its_coded_copy_would_fit() {
        let limit = 1 << 20;
        let with_length = |len: usize| {
            let mut resp = ResponseHeader::build(200, None).unwrap();
            resp.insert_header("content-length", len).unwrap();
            resp
        };
        assert!(!coded_copy_fits(&with_length(limit), limit));
        assert!(!coded_copy_fits(&with_length(limit - 100), limit));
        let fits = limit - coded_growth(limit);
        assert!(coded_copy_fits(&with_length(fits), limit));
        assert!(coded_copy_fits(
            &ResponseHeader::build(200, None).unwrap(),
            limit
        ));
        // and what fits does fit, coded in every coding, however incompressible
        let noise: Vec<u8> = (0..fits as u64)
            .map(|i| {
                (i.wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407)
                    >> 33) as u8
            })
            .collect();
        for coding in ContentCoding::DECODABLE {
            let mut encoder = StoreEncoder::new(coding, 5, Some(fits)).unwrap();
            let coded = encoder.feed(&noise, true).unwrap();
            assert!(
                coded.len() <= limit,
                "{coding:?}: {} coded bytes",
                coded.len()
            );
        }
    }
}
