//! A manifest and its chunks on arbitrary values: assembly never panics, yields a body only when
//! it has exactly the manifest's length and CRC-32, and that body is served with framing that
//! agrees with it.
//!
//! Input layout: a sequence of records `[length: u16 BE][payload]`. The first is a manifest's
//! payload, the next ones its chunks' payloads, each sealed with its CRC-32 (so the fuzzer works
//! behind the checksums); a record of length `0xFFFF` stands for a chunk memcached did not have.

#![no_main]

use bytes::Bytes;
use lacquer::storage::entry::{self, EntryBody};
use lacquer::storage::shared_framing::{framing_agrees, reframe};
use libfuzzer_sys::fuzz_target;

const KEY: &str = "shop.example/fuzz";
/// Manifests listing more chunks are skipped: the decoder's own bound is tested elsewhere, and
/// this keeps each run short.
const MOST_CHUNKS: u32 = 16;

/// The next record, or `None` at the end of the input; `Some(None)` for a missing value.
fn next_record<'a>(input: &mut &'a [u8]) -> Option<Option<&'a [u8]>> {
    if input.len() < 2 {
        return None;
    }
    let len = u16::from_be_bytes([input[0], input[1]]);
    *input = &input[2..];
    if len == u16::MAX {
        return Some(None);
    }
    let len = usize::from(len).min(input.len());
    let (record, rest) = input.split_at(len);
    *input = rest;
    Some(Some(record))
}

fn seal(payload: &[u8]) -> Bytes {
    let mut value = payload.to_vec();
    value.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    Bytes::from(value)
}

fuzz_target!(|data: &[u8]| {
    let mut input = data;
    let Some(Some(manifest)) = next_record(&mut input) else {
        return;
    };
    let Ok(decoded) = entry::decode(&seal(manifest), KEY) else {
        return;
    };
    let EntryBody::Chunked(list) = decoded.body else {
        return;
    };
    if list.count > MOST_CHUNKS {
        return;
    }
    let mut values = Vec::new();
    while let Some(record) = next_record(&mut input) {
        values.push(record.map(seal));
    }
    let Some(chunks) = entry::assemble_chunks(values, KEY, &list) else {
        return;
    };
    let body: Vec<u8> = chunks.concat();
    assert_eq!(body.len() as u64, list.body_len, "a body of another length");
    assert_eq!(
        crc32fast::hash(&body),
        list.body_crc,
        "a body of another CRC"
    );
    let mut meta = decoded.meta;
    if reframe(&mut meta, body.len()).is_ok() {
        assert!(framing_agrees(&meta, body.len()), "{:?}", meta.header);
    }
});
