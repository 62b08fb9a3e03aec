//! gzip coding for the tests: the scripted origin codes bodies with it, and the tests decode what
//! the proxy sends to compare it byte for byte with what the origin meant.

use std::io::{Read, Write};

/// gzip-compresses `data`.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).expect("gzip write");
    enc.finish().expect("gzip finish")
}

/// Decompresses gzip `data`; panics if it is not valid gzip.
pub fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid gzip data");
    out
}
