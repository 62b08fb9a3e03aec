//! The shared-tier entry decoder on arbitrary values: no panic, no slice outside the value, and
//! no entry that the reader would serve with framing that disagrees with its body.
//!
//! Each input is tried twice: as a value read from memcached (almost always a checksum
//! mismatch), and as the payload of a value whose CRC-32 is appended, so the fuzzer explores
//! what lies behind the checksum.

#![no_main]

use bytes::Bytes;
use lacquer::storage::entry::{self, EntryBody};
use lacquer::storage::shared_framing::{framing_agrees, reframe};
use libfuzzer_sys::fuzz_target;

/// The logical key the seeds are written for.
const KEY: &str = "shop.example/fuzz";

fuzz_target!(|data: &[u8]| {
    check(&Bytes::copy_from_slice(data));
    let mut sealed = data.to_vec();
    sealed.extend_from_slice(&crc32fast::hash(data).to_be_bytes());
    check(&Bytes::from(sealed));
});

fn check(value: &Bytes) {
    if let Ok(decoded) = entry::decode(value, KEY) {
        match decoded.body {
            EntryBody::Inline(body) => {
                assert!(body.len() <= value.len(), "a body longer than its value");
                let mut meta = decoded.meta;
                if reframe(&mut meta, body.len()).is_ok() {
                    assert!(
                        framing_agrees(&meta, body.len()),
                        "served framing disagrees with the body: {:?}",
                        meta.header
                    );
                }
            }
            EntryBody::Chunked(list) => {
                assert!(list.count >= 1 && u64::from(list.count) <= list.body_len);
                assert!(list.count <= entry::MAX_CHUNKS);
            }
        }
    }
    for index in 0..2 {
        if let Ok(data) = entry::decode_chunk(value, KEY, 7, index) {
            assert!(data.len() <= value.len());
        }
    }
}
