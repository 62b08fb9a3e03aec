//! brotli and zstd for the tests, beside [`super::gzip`](mod@super::gzip): the scripted origin codes bodies with
//! them, and the tests decode what the proxy sends to compare it byte for byte with what the
//! origin meant. Coded by the crates themselves, independently of Lacquer's own encoders.

use std::io::{Read, Write};

/// `data` coded in `coding` (`"gzip"`, `"br"` or `"zstd"`).
pub fn encode(coding: &str, data: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => super::gzip::gzip(data),
        "br" => {
            let mut out = Vec::new();
            {
                let mut w = brotli::CompressorWriter::new(&mut out, 4096, 9, 22);
                w.write_all(data).expect("brotli write");
            }
            out
        }
        "zstd" => zstd::stream::encode_all(data, 3).expect("zstd encode"),
        other => panic!("no encoder for {other}"),
    }
}

/// `data` decoded from `coding`; panics if it is not valid in that coding.
pub fn decode(coding: &str, data: &[u8]) -> Vec<u8> {
    match coding {
        "gzip" => super::gzip::gunzip(data),
        "br" => {
            let mut out = Vec::new();
            brotli::Decompressor::new(data, 4096)
                .read_to_end(&mut out)
                .expect("valid brotli data");
            out
        }
        "zstd" => zstd::stream::decode_all(data).expect("valid zstd data"),
        other => panic!("no decoder for {other}"),
    }
}

/// Whether an `Accept-Encoding` value lists `coding` with a weight above zero (enough for the
/// origin scripts: no `*`).
pub fn lists_coding(accept_encoding: &str, coding: &str) -> bool {
    accept_encoding.split(',').any(|item| {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        name.eq_ignore_ascii_case(coding) && !refused
    })
}
