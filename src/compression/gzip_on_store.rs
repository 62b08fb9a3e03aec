//! Compression on store: an identity response of a compressible type is gzip-coded once, on its
//! way into the cache, so every later hit serves (or decodes) the one stored copy.
//!
//! [`StoreGzip::wants`] decides from the response head; [`StoreGzip`] then encodes the body chunk
//! by chunk as Pingora hands it from the origin to the cache writer.

use super::{content_coding, ContentCoding};
use crate::config::compression::CompressionConfig;
use bytes::Bytes;
use flate2::write::GzEncoder;
use pingora_http::ResponseHeader;
use std::io::Write;

/// A gzip encoder fed one origin body chunk at a time.
pub struct StoreGzip {
    encoder: GzEncoder<Vec<u8>>,
}

impl StoreGzip {
    /// Whether an origin response should be gzip-coded on store: compression is enabled, the
    /// response is a 200 in identity coding, not marked `no-transform` (RFC 9110 §7.7), of a
    /// listed type, and not known to be smaller than `min_size`.
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
        let length = resp
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<usize>().ok());
        // without a length the body is streamed, usually generated: worth compressing
        length.is_none_or(|len| len >= config.min_size)
    }

    /// Rewrites the head of a response about to be gzip-coded: `Content-Encoding: gzip`, no
    /// `Content-Length` (the coded length is not known yet), a weak `ETag` (the bytes differ from
    /// the origin's representation) and `Vary: Accept-Encoding`.
    pub fn adjust_head(resp: &mut ResponseHeader) {
        let _ = resp.insert_header(http::header::CONTENT_ENCODING, "gzip");
        resp.remove_header(&http::header::CONTENT_LENGTH);
        super::weaken_etag(resp);
        super::add_vary_accept_encoding(resp);
    }

    /// An encoder at `level` (1 fastest .. 9 smallest).
    pub fn new(level: u32) -> Self {
        StoreGzip {
            encoder: GzEncoder::new(Vec::new(), flate2::Compression::new(level)),
        }
    }

    /// Encodes `chunk`; on `end`, writes the gzip trailer. Returns the coded bytes produced so far
    /// (often empty: deflate buffers until it has a block).
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> std::io::Result<Bytes> {
        self.encoder.write_all(chunk)?;
        if end {
            self.encoder.try_finish()?;
        }
        Ok(Bytes::from(std::mem::take(self.encoder.get_mut())))
    }
}

#[cfg(test)]
mod tests {
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
        assert!(StoreGzip::wants(
            &c,
            &resp(&[
                ("content-type", "text/html; charset=utf-8"),
                ("content-length", "5000")
            ])
        ));
        assert!(StoreGzip::wants(
            &c,
            &resp(&[("content-type", "application/json")])
        ));
        assert!(!StoreGzip::wants(
            &c,
            &resp(&[("content-type", "text/html"), ("content-length", "10")])
        ));
        assert!(!StoreGzip::wants(
            &c,
            &resp(&[("content-type", "image/png"), ("content-length", "5000")])
        ));
        assert!(!StoreGzip::wants(
            &c,
            &resp(&[("content-type", "text/html"), ("content-encoding", "br")])
        ));
        assert!(!StoreGzip::wants(
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
        assert!(!StoreGzip::wants(
            &off,
            &resp(&[("content-type", "text/html")])
        ));
    }

    #[test]
    fn round_trips_through_gunzip() {
        let plain = b"<html>".repeat(10_000);
        let mut enc = StoreGzip::new(6);
        let mut coded = Vec::new();
        for (i, chunk) in plain.chunks(3000).enumerate() {
            let end = (i + 1) * 3000 >= plain.len();
            coded.extend_from_slice(&enc.feed(chunk, end).unwrap());
        }
        assert!(coded.len() < plain.len() / 10);
        let mut g = super::super::gunzip::Gunzip::new();
        assert_eq!(&g.feed(&coded, true).unwrap()[..], &plain[..]);
    }
}
