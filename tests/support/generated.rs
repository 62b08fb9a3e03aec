//! Deterministic body content: bytes a test origin can stream at any length without holding them,
//! and a test can recompute at any offset to check that what the proxy delivered (whole, ranged,
//! reassembled from memcached chunks) is exactly what the origin sent.

/// Size of the pieces a generated body is written and verified in.
pub const GENERATED_CHUNK: usize = 64 * 1024;

fn gen_word(index: u64, seed: u8) -> [u8; 8] {
    // splitmix64 of the 8-byte word index, keyed by the seed.
    let mut z = index
        .wrapping_add((seed as u64).wrapping_mul(0xA24B_AED4_963E_E407))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// Fills `buf` with the generated content for `seed` starting at byte `offset` of the
/// stream, i.e. `buf[k]` = byte `offset + k` of a [`Body::Generated`] body.
pub fn fill_generated(buf: &mut [u8], offset: usize, seed: u8) {
    let mut k = 0;
    // Unaligned head.
    while k < buf.len() && (offset + k) & 7 != 0 {
        let i = offset + k;
        buf[k] = gen_word((i / 8) as u64, seed)[i % 8];
        k += 1;
    }
    // Whole words.
    while k + 8 <= buf.len() {
        let i = offset + k;
        buf[k..k + 8].copy_from_slice(&gen_word((i / 8) as u64, seed));
        k += 8;
    }
    // Tail.
    while k < buf.len() {
        let i = offset + k;
        buf[k] = gen_word((i / 8) as u64, seed)[i % 8];
        k += 1;
    }
}

/// The first `len` bytes of the generated content for `seed` (what a
/// `Body::Generated { len, seed }` body contains).
pub fn generated_bytes(len: usize, seed: u8) -> Vec<u8> {
    generated_range(0, len, seed)
}

/// Bytes `offset .. offset + len` of the generated content for `seed` (for Range tests).
pub fn generated_range(offset: usize, len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_generated(&mut v, offset, seed);
    v
}

/// Whether `data` equals bytes `offset .. offset + data.len()` of the generated
/// content for `seed`. Uses only a 64 KiB scratch buffer.
pub fn verify_generated(data: &[u8], seed: u8, offset: usize) -> bool {
    generated_mismatch(data, seed, offset).is_none()
}

/// Index into `data` of the first byte that differs from the generated content for
/// `seed` starting at `offset`, or `None` if all match.
pub fn generated_mismatch(data: &[u8], seed: u8, offset: usize) -> Option<usize> {
    let mut scratch = vec![0u8; GENERATED_CHUNK];
    let mut pos = 0;
    while pos < data.len() {
        let n = GENERATED_CHUNK.min(data.len() - pos);
        fill_generated(&mut scratch[..n], offset + pos, seed);
        if data[pos..pos + n] != scratch[..n] {
            let k = data[pos..pos + n]
                .iter()
                .zip(&scratch[..n])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(pos + k);
        }
        pos += n;
    }
    None
}

/// Asserts that `body` is the generated page of `len` bytes and seed `seed` (its length, then
/// its bytes), a failure naming `what`.
pub fn assert_generated_page(body: &[u8], len: usize, seed: u8, what: &str) {
    assert_eq!(body.len(), len, "{what}: length");
    assert_eq!(
        generated_mismatch(body, seed, 0),
        None,
        "{what}: the bytes differ"
    );
}
