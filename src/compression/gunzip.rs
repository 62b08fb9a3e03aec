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
