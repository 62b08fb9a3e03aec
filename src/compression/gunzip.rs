//! Streaming gzip decoding for clients that do not take the stored gzip copy.
//!
//! Each body chunk is decoded as it passes, so a multi-megabyte object never sits decoded in
//! memory; concatenated gzip members (RFC 1952 §2.2) are decoded as one stream.

use bytes::Bytes;
use flate2::write::MultiGzDecoder;
use std::io::Write;

/// A gzip decoder fed one body chunk at a time.
pub struct Gunzip {
    decoder: MultiGzDecoder<Vec<u8>>,
}

impl Default for Gunzip {
    fn default() -> Self {
        Self::new()
    }
}

impl Gunzip {
    /// A decoder at the start of a gzip stream.
    pub fn new() -> Self {
        Gunzip {
            decoder: MultiGzDecoder::new(Vec::new()),
        }
    }

    /// Decodes `chunk`; on `end`, checks the stream is complete. Returns what was decoded so far
    /// (possibly empty); an error means the stored body is not valid gzip.
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> std::io::Result<Bytes> {
        self.decoder.write_all(chunk)?;
        if end {
            self.decoder.try_finish()?;
        } else {
            self.decoder.flush()?;
        }
        Ok(Bytes::from(std::mem::take(self.decoder.get_mut())))
    }
}

/// Decodes a complete stored gzip body at once, for a hit whose decoded length should go out as
/// `Content-Length` in one write. `None` when the body is not valid gzip or decodes to more than
/// `limit` bytes (the caller then streams it instead: the bound keeps a small, highly compressed
/// body from becoming a large buffer).
pub fn gunzip_complete(chunks: &[Bytes], limit: usize) -> Option<Bytes> {
    use std::io::Read;
    let joined;
    let coded: &[u8] = match chunks {
        [only] => only,
        _ => {
            joined = chunks.concat();
            &joined
        }
    };
    let mut plain = Vec::with_capacity(coded.len().saturating_mul(4).min(limit));
    flate2::read::MultiGzDecoder::new(coded)
        .take(limit as u64 + 1)
        .read_to_end(&mut plain)
        .ok()?;
    (plain.len() <= limit).then(|| Bytes::from(plain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn complete_bodies_decode_at_once_within_the_limit() {
        let plain: Vec<u8> = (0..50_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        let coded = Bytes::from(gzip(&plain));
        let split = [coded.slice(..100), coded.slice(100..)];
        assert_eq!(
            gunzip_complete(std::slice::from_ref(&coded), 1 << 20).unwrap(),
            plain
        );
        assert_eq!(gunzip_complete(&split, 1 << 20).unwrap(), plain);
        assert_eq!(gunzip_complete(&split, plain.len()).unwrap(), plain);
        assert!(gunzip_complete(&split, plain.len() - 1).is_none());
        assert!(gunzip_complete(&[Bytes::from_static(b"not gzip")], 1 << 20).is_none());
    }

    #[test]
    fn decodes_across_arbitrary_chunk_boundaries() {
        let plain: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let coded = gzip(&plain);
        for size in [1, 7, 4096, coded.len()] {
            let mut g = Gunzip::new();
            let mut out = Vec::new();
            let chunks: Vec<&[u8]> = coded.chunks(size).collect();
            for (i, c) in chunks.iter().enumerate() {
                out.extend_from_slice(&g.feed(c, i + 1 == chunks.len()).unwrap());
            }
            assert_eq!(out, plain, "chunk size {size}");
        }
    }

    #[test]
    fn corrupt_input_is_an_error() {
        let mut g = Gunzip::new();
        assert!(g.feed(b"definitely not gzip", true).is_err());
    }
}
