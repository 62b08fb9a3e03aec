//! Decoding a stored gzip, brotli or zstd copy for a client that does not take its coding.
//!
//! [`Decoder`] decodes each body chunk as it passes, so a multi-megabyte object never sits
//! decoded in memory; concatenated gzip members (RFC 1952 §2.2) and zstd frames are decoded as
//! one stream, and the end of the body is checked to end the coded stream (a truncated copy is
//! an error, not a short body). [`decode_complete`] decodes a small stored body at once (up to
//! [`WHOLE_DECODE_MAX_STORED`] coded, [`WHOLE_DECODE_MAX_DECODED`] decoded), so that a hit of it
//! goes out with its decoded `Content-Length` on either path: the fast path's and the standard
//! path's hits of one object are framed alike.
//!
//! The decoders are the crates Pingora's own compression module uses (`flate2`, `brotli`,
//! `zstd`), so they add nothing to the build.

use super::coding::ContentCoding;
use bytes::Bytes;
use std::io::{self, Read, Write};

/// Stored compressed bodies up to this size are decoded whole for a hit to a client that does not
/// take their coding (the fast path's, and the standard path's from a complete stored object);
/// larger ones stream through [`Decoder`], chunked.
pub const WHOLE_DECODE_MAX_STORED: usize = 64 * 1024;

/// The most a body decoded whole may decode to (a bound on the buffer a small, highly compressed
/// body could become); one that decodes to more streams instead.
pub const WHOLE_DECODE_MAX_DECODED: usize = 1024 * 1024;

/// Bytes the brotli decoder works through at a time (its default).
const BROTLI_BUFFER: usize = 4096;

/// A decoder fed one body chunk at a time.
pub struct Decoder {
    inner: Inner,
}

enum Inner {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Br(Box<brotli::DecompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

impl Decoder {
    /// A decoder at the start of a stream in `coding`; `None` for a coding Lacquer does not
    /// decode (identity and [`ContentCoding::Other`]).
    pub fn new(coding: ContentCoding) -> Option<Self> {
        let inner = match coding {
            ContentCoding::Gzip => Inner::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
            ContentCoding::Br => Inner::Br(Box::new(brotli::DecompressorWriter::new(
                Vec::new(),
                BROTLI_BUFFER,
            ))),
            ContentCoding::Zstd => Inner::Zstd(zstd::stream::write::Decoder::new(Vec::new()).ok()?),
            ContentCoding::Identity | ContentCoding::Other => return None,
        };
        Some(Decoder { inner })
    }

    /// Decodes `chunk`; on `end`, checks the stream is complete. Returns what was decoded so far
    /// (possibly empty); an error means the stored body is not valid in its coding.
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> io::Result<Bytes> {
        let out = match &mut self.inner {
            Inner::Gzip(d) => {
                d.write_all(chunk)?;
                if end {
                    d.try_finish()?;
                } else {
                    d.flush()?;
                }
                d.get_mut()
            }
            Inner::Br(d) => {
                d.write_all(chunk)?;
                if end {
                    d.close()?;
                }
                d.get_mut()
            }
            Inner::Zstd(d) => {
                d.write_all(chunk)?;
                if end {
                    d.do_finish()?;
                } else {
                    d.flush()?;
                }
                d.get_mut()
            }
        };
        Ok(Bytes::from(std::mem::take(out)))
    }
}

/// Decodes a complete stored body in `coding` at once, for a hit whose decoded length should go
/// out as `Content-Length` in one write. `None` when the body is not valid in its coding, the
/// coding is not one Lacquer decodes, or it decodes to more than `limit` bytes (the caller then
/// streams it instead: the bound keeps a small, highly compressed body from becoming a large
/// buffer).
pub fn decode_complete(coding: ContentCoding, chunks: &[Bytes], limit: usize) -> Option<Bytes> {
    let joined;
    let coded: &[u8] = match chunks {
        [only] => only,
        _ => {
            joined = chunks.concat();
            &joined
        }
    };
    let mut plain = Vec::with_capacity(coded.len().saturating_mul(4).min(limit));
    let bound = limit as u64 + 1;
    let read = match coding {
        ContentCoding::Gzip => flate2::read::MultiGzDecoder::new(coded)
            .take(bound)
            .read_to_end(&mut plain),
        ContentCoding::Br => brotli::Decompressor::new(coded, BROTLI_BUFFER)
            .take(bound)
            .read_to_end(&mut plain),
        ContentCoding::Zstd => zstd::stream::read::Decoder::with_buffer(coded)
            .and_then(|d| d.take(bound).read_to_end(&mut plain)),
        ContentCoding::Identity | ContentCoding::Other => return None,
    };
    read.ok()?;
    (plain.len() <= limit).then(|| Bytes::from(plain))
}

#[cfg(test)]
mod tests {
    use super::super::encode_on_store::StoreEncoder;
    use super::*;

    /// `plain` coded in `coding` by the encoder compression on store uses.
    fn encode(coding: ContentCoding, plain: &[u8]) -> Vec<u8> {
        let mut encoder = StoreEncoder::new(coding, 5, Some(plain.len())).unwrap();
        encoder.feed(plain, true).unwrap().to_vec()
    }

    fn sample(len: u32) -> Vec<u8> {
        (0..len).flat_map(|i| (i % 251).to_le_bytes()).collect()
    }

    #[test]
    fn complete_bodies_decode_at_once_within_the_limit() {
        let plain = sample(50_000);
        for coding in ContentCoding::DECODABLE {
            let coded = Bytes::from(encode(coding, &plain));
            let split = [coded.slice(..100), coded.slice(100..)];
            let whole = std::slice::from_ref(&coded);
            assert_eq!(
                decode_complete(coding, whole, 1 << 20).unwrap(),
                plain,
                "{coding:?}"
            );
            assert_eq!(decode_complete(coding, &split, 1 << 20).unwrap(), plain);
            assert_eq!(decode_complete(coding, &split, plain.len()).unwrap(), plain);
            assert!(decode_complete(coding, &split, plain.len() - 1).is_none());
            let garbage = [Bytes::from_static(b"definitely not coded")];
            assert!(decode_complete(coding, &garbage, 1 << 20).is_none());
        }
        assert!(decode_complete(ContentCoding::Other, &[Bytes::new()], 10).is_none());
    }

    #[test]
    fn decodes_across_arbitrary_chunk_boundaries() {
        let plain = sample(200_000);
        for coding in ContentCoding::DECODABLE {
            let coded = encode(coding, &plain);
            for size in [1, 7, 4096, coded.len()] {
                let mut decoder = Decoder::new(coding).unwrap();
                let mut out = Vec::new();
                let chunks: Vec<&[u8]> = coded.chunks(size).collect();
                for (i, c) in chunks.iter().enumerate() {
                    out.extend_from_slice(&decoder.feed(c, i + 1 == chunks.len()).unwrap());
                }
                assert_eq!(out, plain, "{coding:?}, chunk size {size}");
            }
        }
    }

    #[test]
    fn corrupt_or_truncated_input_is_an_error() {
        let plain = sample(20_000);
        for coding in ContentCoding::DECODABLE {
            let mut decoder = Decoder::new(coding).unwrap();
            assert!(
                decoder.feed(b"definitely not coded", true).is_err(),
                "{coding:?}"
            );
            let coded = encode(coding, &plain);
            let mut decoder = Decoder::new(coding).unwrap();
            let cut = decoder.feed(&coded[..coded.len() / 2], true);
            assert!(
                cut.is_err(),
                "{coding:?}: a truncated stream must not end quietly"
            );
        }
        assert!(Decoder::new(ContentCoding::Identity).is_none());
        assert!(Decoder::new(ContentCoding::Other).is_none());
    }
}
