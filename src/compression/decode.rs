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
use bytes::{Buf, Bytes};
use std::io::{self, Write};
use zstd::stream::raw::Operation;

/// Stored compressed bodies up to this size are decoded whole for a hit to a client that does not
/// take their coding (the fast path's, and the standard path's from a complete stored object);
/// larger ones stream through [`Decoder`], chunked.
pub const WHOLE_DECODE_MAX_STORED: usize = 64 * 1024;

/// The most a body decoded whole may decode to (a bound on the buffer a small, highly compressed
/// body could become); one that decodes to more streams instead.
pub const WHOLE_DECODE_MAX_DECODED: usize = 1024 * 1024;

/// Output each step of a decoder writes at most before the caller's bound is checked again.
const STEP: usize = 32 * 1024;

/// The largest window a `zstd` body may ask for: RFC 9659 §3 limits the `zstd` content coding to
/// 8 MB (window log 23), as browsers do; a frame asking for more is refused, not given the
/// library's default of 128 MiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// A decoder given a body's chunks as they come ([`Self::push`]) and asked for what they decode
/// to in pieces of a bounded size ([`Self::pull`]). The origin chooses how much one chunk decodes
/// to (a few kilobytes of br can decode to hundreds of megabytes), so output is never made for
/// more than one piece at a time: the rest of the input waits here, coded.
pub struct Decoder {
    inner: Inner,
    /// Input given and not decoded yet.
    input: Bytes,
    /// The end of the body was given: once its input is decoded, the coded stream must be
    /// complete.
    ended: bool,
    /// The end was checked (nothing more comes out).
    finished: bool,
    /// Some input was given: an empty body is an empty stream in any coding (an origin's
    /// `Content-Encoding: gzip` on a `Content-Length: 0` answer), not a stream cut short.
    took_input: bool,
}

// (the gzip decoder is the largest: a decoder is boxed where it is kept, `CompressionCtx` and
// `DecodingReader`, and lives on the stack only for a whole decode)
#[allow(clippy::large_enum_variant)]
enum Inner {
    Gzip(flate2::write::MultiGzDecoder<Vec<u8>>),
    Br(Box<BrotliDecoding>),
    /// With the hint of its last step: 0 when a frame has just ended.
    Zstd(zstd::stream::raw::Decoder<'static>, usize),
}

/// The brotli decoder's state, driven step by step.
struct BrotliDecoding {
    state: brotli::BrotliState<StandardAlloc, StandardAlloc, StandardAlloc>,
    total_out: usize,
    done: bool,
}

type StandardAlloc = brotli::enc::StandardAlloc;

impl Decoder {
    /// A decoder at the start of a stream in `coding`; `None` for a coding Lacquer does not
    /// decode (identity and [`ContentCoding::Other`]).
    pub fn new(coding: ContentCoding) -> Option<Self> {
        let inner = match coding {
            ContentCoding::Gzip => Inner::Gzip(flate2::write::MultiGzDecoder::new(Vec::new())),
            ContentCoding::Br => {
                let mut state = brotli::BrotliState::new(
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                    StandardAlloc::default(),
                );
                // the content coding is RFC 7932's brotli: windows up to 16 MiB, not the
                // library's large-window extension (up to 1 GiB)
                state.large_window = false;
                Inner::Br(Box::new(BrotliDecoding {
                    state,
                    total_out: 0,
                    done: false,
                }))
            }
            ContentCoding::Zstd => {
                let mut decoder = zstd::stream::raw::Decoder::new().ok()?;
                decoder
                    .set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(
                        ZSTD_WINDOW_LOG_MAX,
                    ))
                    .ok()?;
                Inner::Zstd(decoder, 0)
            }
            ContentCoding::Identity | ContentCoding::Other => return None,
        };
        Some(Decoder {
            inner,
            input: Bytes::new(),
            ended: false,
            finished: false,
            took_input: false,
        })
    }

    /// Gives the decoder the body's next `chunk`; `end`: it is the last.
    pub fn push(&mut self, chunk: Bytes, end: bool) {
        self.took_input |= !chunk.is_empty();
        if self.input.is_empty() {
            self.input = chunk;
        } else if !chunk.is_empty() {
            let mut joined = Vec::with_capacity(self.input.len() + chunk.len());
            joined.extend_from_slice(&self.input);
            joined.extend_from_slice(&chunk);
            self.input = Bytes::from(joined);
        }
        self.ended |= end;
    }

    /// The next piece of the decoded body: at most about `max` bytes (one step more at most)
    /// decoded from the input given so far. Empty when that input is all decoded (after the end:
    /// and the stream was checked complete); an error when the body is not valid in its coding or
    /// ends before its coded stream does.
    pub fn pull(&mut self, max: usize) -> io::Result<Bytes> {
        let mut out = Vec::new();
        while out.len() < max && !self.finished {
            if self.input.is_empty() && !self.ended {
                self.drain(&mut out)?;
                break;
            }
            if self.input.is_empty() {
                // the end: what the decoder holds, then the check that the stream is complete
                if self.finish(&mut out)? {
                    self.finished = true;
                }
                continue;
            }
            let read = self.step(&mut out)?;
            self.input.advance(read);
        }
        Ok(Bytes::from(out))
    }

    /// Decodes a prefix of the input into `out` (about [`STEP`] bytes of output at most);
    /// returns how much input it took.
    fn step(&mut self, out: &mut Vec<u8>) -> io::Result<usize> {
        match &mut self.inner {
            Inner::Gzip(d) => {
                // flate2 decodes what fits its 32 KiB buffer per `write` and takes only that input
                let read = d.write(&self.input)?;
                out.append(d.get_mut());
                if read == 0 {
                    return Err(invalid("gzip decoder took no input"));
                }
                Ok(read)
            }
            Inner::Br(b) => {
                if b.done {
                    return Err(invalid("data after the end of the brotli stream"));
                }
                let (read, result) = brotli_step(b, &self.input, out);
                match result {
                    brotli::BrotliResult::ResultFailure => Err(invalid("brotli stream not valid")),
                    brotli::BrotliResult::ResultSuccess => {
                        b.done = true;
                        Ok(read)
                    }
                    _ => Ok(read),
                }
            }
            Inner::Zstd(d, hint) => {
                let start = out.len();
                out.resize(start + STEP, 0);
                let status = d.run_on_buffers(&self.input, &mut out[start..]);
                let status = status.inspect_err(|_| out.truncate(start))?;
                out.truncate(start + status.bytes_written);
                *hint = status.remaining;
                Ok(status.bytes_read)
            }
        }
    }

    /// What the decoder holds decoded from input it already took (before more input comes).
    fn drain(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        match &mut self.inner {
            Inner::Gzip(d) => {
                d.flush()?;
                out.append(d.get_mut());
            }
            Inner::Br(b) => {
                if !b.done {
                    let (_, result) = brotli_step(b, &[], out);
                    if let brotli::BrotliResult::ResultFailure = result {
                        return Err(invalid("brotli stream not valid"));
                    }
                    if let brotli::BrotliResult::ResultSuccess = result {
                        b.done = true;
                    }
                }
            }
            Inner::Zstd(..) => {
                // nothing held back: each step ends with its output
            }
        }
        Ok(())
    }

    /// At the end of the input: more of what the decoder holds into `out`; `true` once nothing
    /// more comes and the coded stream was found complete.
    fn finish(&mut self, out: &mut Vec<u8>) -> io::Result<bool> {
        if !self.took_input {
            return Ok(true);
        }
        match &mut self.inner {
            Inner::Gzip(d) => {
                d.try_finish()?;
                out.append(d.get_mut());
                Ok(true)
            }
            Inner::Br(b) => {
                if b.done {
                    return Ok(true);
                }
                let before = out.len();
                match brotli_step(b, &[], out).1 {
                    brotli::BrotliResult::ResultSuccess => {
                        b.done = true;
                        Ok(true)
                    }
                    brotli::BrotliResult::NeedsMoreOutput if out.len() > before => Ok(false),
                    brotli::BrotliResult::ResultFailure => Err(invalid("brotli stream not valid")),
                    _ => Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "brotli stream cut short",
                    )),
                }
            }
            Inner::Zstd(d, hint) => {
                if *hint == 0 {
                    // the last step ended a frame and gave out all of it
                    return Ok(true);
                }
                // what the decoder still holds of the input it took
                let start = out.len();
                out.resize(start + STEP, 0);
                let status = d.run_on_buffers(&[], &mut out[start..]);
                let status = status.inspect_err(|_| out.truncate(start))?;
                out.truncate(start + status.bytes_written);
                if status.bytes_written == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "zstd stream cut short",
                    ));
                }
                *hint = status.remaining;
                Ok(false)
            }
        }
    }

    /// Decodes `chunk` whole; on `end`, checks the stream is complete. For tests and callers
    /// that bound the input themselves: the output is as large as the chunk decodes to.
    #[cfg(test)]
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> io::Result<Bytes> {
        self.push(Bytes::copy_from_slice(chunk), end);
        let mut out = Vec::new();
        loop {
            let piece = self.pull(usize::MAX)?;
            if piece.is_empty() {
                return Ok(Bytes::from(out));
            }
            out.extend_from_slice(&piece);
        }
    }
}

/// One step of the brotli decoder over `input`, its output appended to `out` (at most
/// [`STEP`] bytes): the input it took and the decoder's result.
fn brotli_step(
    b: &mut BrotliDecoding,
    input: &[u8],
    out: &mut Vec<u8>,
) -> (usize, brotli::BrotliResult) {
    let start = out.len();
    out.resize(start + STEP, 0);
    let (mut available_in, mut input_offset) = (input.len(), 0);
    let (mut available_out, mut output_offset) = (STEP, 0);
    let result = brotli::BrotliDecompressStream(
        &mut available_in,
        &mut input_offset,
        input,
        &mut available_out,
        &mut output_offset,
        &mut out[start..],
        &mut b.total_out,
        &mut b.state,
    );
    out.truncate(start + output_offset);
    (input_offset, result)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Decodes a complete stored body in `coding` at once, for a hit whose decoded length should go
/// out as `Content-Length` in one write. `None` when the body is not valid in its coding, the
/// coding is not one Lacquer decodes, or it decodes to more than `limit` bytes (the caller then
/// streams it instead: the bound keeps a small, highly compressed body from becoming a large
/// buffer).
pub fn decode_complete(coding: ContentCoding, chunks: &[Bytes], limit: usize) -> Option<Bytes> {
    decode_whole(coding, chunks, limit).ok().flatten()
}

/// [`decode_complete`], telling a body that is not valid in its coding (`Err`) from one that
/// decodes to more than `limit` bytes or whose coding Lacquer does not decode (`Ok(None)`).
pub fn decode_whole(
    coding: ContentCoding,
    chunks: &[Bytes],
    limit: usize,
) -> io::Result<Option<Bytes>> {
    let Some(mut decoder) = Decoder::new(coding) else {
        return Ok(None);
    };
    let mut pieces: Vec<Bytes> = Vec::new();
    let mut decoded = 0;
    let last = chunks.len().saturating_sub(1);
    for (i, chunk) in chunks.iter().enumerate() {
        decoder.push(chunk.clone(), i == last);
        loop {
            let piece = decoder.pull(limit + 1 - decoded)?;
            if piece.is_empty() {
                break;
            }
            decoded += piece.len();
            if decoded > limit {
                return Ok(None);
            }
            pieces.push(piece);
        }
    }
    if chunks.is_empty() {
        // an empty body: an empty stream in any coding (see `Decoder::took_input`)
        return Ok(Some(Bytes::new()));
    }
    Ok(Some(joined(pieces)))
}

/// `pieces` of a decoded body as one `Bytes`: a lone piece as it is, several copied together.
pub fn joined(mut pieces: Vec<Bytes>) -> Bytes {
    match pieces.len() {
        0 => Bytes::new(),
        1 => pieces.pop().expect("one piece"),
        _ => Bytes::from(pieces.concat()),
    }
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
    fn an_empty_body_is_an_empty_stream_in_every_coding() {
        for coding in ContentCoding::DECODABLE {
            let mut decoder = Decoder::new(coding).unwrap();
            assert_eq!(decoder.feed(b"", true).unwrap(), Bytes::new(), "{coding:?}");
            assert_eq!(decode_whole(coding, &[], 10).unwrap(), Some(Bytes::new()));
            let empty = [Bytes::new()];
            assert_eq!(
                decode_whole(coding, &empty, 10).unwrap(),
                Some(Bytes::new())
            );
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
    #[test]
    fn a_body_that_expands_far_comes_out_in_bounded_pieces() {
        let plain = vec![0u8; 16 << 20];
        for coding in ContentCoding::DECODABLE {
            let coded = encode(coding, &plain);
            assert!(
                coded.len() < 64 * 1024,
                "{coding:?}: {} coded bytes",
                coded.len()
            );
            let mut decoder = Decoder::new(coding).unwrap();
            decoder.push(Bytes::from(coded), true);
            let (mut total, mut largest) = (0, 0);
            loop {
                let piece = decoder.pull(256 * 1024).unwrap();
                if piece.is_empty() {
                    break;
                }
                assert!(piece.iter().all(|&b| b == 0));
                total += piece.len();
                largest = largest.max(piece.len());
            }
            assert_eq!(total, plain.len(), "{coding:?}");
            assert!(
                largest <= 256 * 1024 + 2 * STEP,
                "{coding:?}: a piece of {largest}"
            );
        }
    }

    #[test]
    fn a_zstd_window_over_8_mib_is_refused() {
        let plain = sample(1000);
        for (window_log, valid) in [(23, true), (24, false)] {
            let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            encoder
                .set_parameter(zstd::zstd_safe::CParameter::WindowLog(window_log))
                .unwrap();
            // a frame that does not say its size keeps the window it declares
            encoder.include_contentsize(false).unwrap();
            encoder.write_all(&plain).unwrap();
            let coded = encoder.finish().unwrap();
            let mut decoder = Decoder::new(ContentCoding::Zstd).unwrap();
            assert_eq!(
                decoder.feed(&coded, true).is_ok(),
                valid,
                "window log {window_log}"
            );
            let whole = decode_whole(ContentCoding::Zstd, &[Bytes::from(coded)], 1 << 20);
            assert_eq!(whole.is_ok(), valid, "window log {window_log}");
        }
    }
}
