//! Decoding in the body reader: a stored or filling body that a client gets decoded, read through
//! [`DecodingReader`] in pieces of a bounded size.
//!
//! Pingora's standard path sends a hit's body, and a miss's body while it fills the cache, from a
//! [`HitHandler`]: it reads one chunk, runs the body filter over it and writes what the filter
//! returns, one piece per chunk read. Decoded in the filter, one chunk of a few kilobytes of br can
//! become hundreds of megabytes held at once (a decompression bomb, from a hostile origin or an
//! entry planted in memcached). Wrapped in a `DecodingReader`, the reader returns the decoded body
//! itself, at most [`PIECE`] bytes per read, and takes the next coded chunk only when the decoder
//! has given out all it made of the last: the memory a client's decoding holds is one piece and the
//! decoder's window, however far the body expands. The body filter then leaves the pieces alone.

use super::decode::Decoder;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_cache::storage::{HandleHit, HitHandler, Storage};
use pingora_cache::trace::SpanHandle;
use pingora_cache::CacheKey;
use pingora_error::Result;
use std::any::Any;

/// The most a decoded body's piece holds (one decoder step more at most): a size the downstream
/// writes take in one go, small beside what a bomb expands to.
pub const PIECE: usize = 256 * 1024;

/// A body reader that decodes what it reads from the reader it wraps (see the module doc).
pub struct DecodingReader {
    inner: HitHandler,
    decoder: Decoder,
    /// The wrapped reader has said its body ended.
    inner_done: bool,
}

impl DecodingReader {
    /// `reader`'s body, decoded by `decoder` (a fresh one, at the body's start).
    pub fn wrap(reader: &mut HitHandler, decoder: Decoder) {
        let inner = std::mem::replace(reader, Box::new(Emptied));
        *reader = Box::new(DecodingReader {
            inner,
            decoder,
            inner_done: false,
        });
    }
}

#[async_trait]
impl HandleHit for DecodingReader {
    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        loop {
            let piece = super::pull_for_client(&mut self.decoder, PIECE)?;
            if !piece.is_empty() {
                return Ok(Some(piece));
            }
            if self.inner_done {
                return Ok(None);
            }
            match self.inner.read_body().await? {
                Some(chunk) => self.decoder.push(chunk, false),
                None => {
                    self.inner_done = true;
                    self.decoder.push(Bytes::new(), true);
                }
            }
        }
    }

    async fn finish(
        self: Box<Self>,
        storage: &'static (dyn Storage + Sync),
        key: &CacheKey,
        trace: &SpanHandle,
    ) -> Result<()> {
        self.inner.finish(storage, key, trace).await
    }

    fn should_count_access(&self) -> bool {
        self.inner.should_count_access()
    }

    fn get_eviction_weight(&self) -> usize {
        self.inner.get_eviction_weight()
    }

    /// The wrapped reader, so that what looks at the storage's own reader still finds it (the
    /// tier a hit came from, whether a fill's own reader holds its origin back).
    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self.inner.as_any()
    }

    fn as_any_mut(&mut self) -> &mut (dyn Any + Send + Sync) {
        self.inner.as_any_mut()
    }
}

/// What a reader's place holds for the instant it is moved into its wrapper.
struct Emptied;

#[async_trait]
impl HandleHit for Emptied {
    async fn read_body(&mut self) -> Result<Option<Bytes>> {
        Ok(None)
    }

    async fn finish(
        self: Box<Self>,
        _storage: &'static (dyn Storage + Sync),
        _key: &CacheKey,
        _trace: &SpanHandle,
    ) -> Result<()> {
        Ok(())
    }

    fn as_any(&self) -> &(dyn Any + Send + Sync) {
        self
    }

    fn as_any_mut(&mut self) -> &mut (dyn Any + Send + Sync) {
        self
    }
}
