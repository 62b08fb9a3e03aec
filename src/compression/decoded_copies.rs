//! Decoded copies of small gzip-stored bodies, for clients that do not take gzip.
//!
//! Lacquer stores one copy of a page, gzip-coded, and decodes it for a client that does not take
//! gzip. On a hit, decoding is then most of the work: an 8 KB page takes longer to inflate than
//! the rest of the hit together. So the fast path keeps what it decoded, in a TinyUFO of its own
//! bounded by `cache.compression.decoded_copies` bytes (on top of `cache.memory_size`; 0 turns
//! it off). nginx keeps an identity copy of every page for the same reason; here only the pages
//! identity clients actually ask for, and only as long as they are asked for, take the memory.
//!
//! A decoded copy is only ever served for the stored object it was made from. It is found with
//! the stored object's identity: the primary key hash, the variance and the instant the object
//! was created, kept to the nanosecond. The stored object is always looked up first (a purged
//! URL never gets here), and a refill has a new creation instant, so an old decoded copy is
//! never served. A revalidation (304) keeps the body, and so keeps its copy.

use crate::observe::metrics::per_thread::PerThread;
use bytes::Bytes;
use pingora_cache::key::HashBinary;
use std::time::SystemTime;
use tinyufo::TinyUfo;

/// Bookkeeping charged per copy on top of its bytes (the entry, its key and TinyUFO's bucket).
const COPY_OVERHEAD: usize = 128;

/// Bytes per TinyUFO weight unit (its weights are `u16`; a copy is at most
/// [`crate::compression::decode::WHOLE_DECODE_MAX_DECODED`], 16,386 units).
const WEIGHT_UNIT: usize = 64;

/// Which stored object a decoded copy was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredIdentity {
    /// The hash of the URL's primary cache key.
    pub primary: HashBinary,
    /// The variance of the stored object (its `Vary` variant), if any.
    pub variance: Option<HashBinary>,
    /// When the stored object was created (filled).
    pub created: SystemTime,
}

impl StoredIdentity {
    fn cache_key(&self) -> u64 {
        let word = |bin: &HashBinary| u64::from_le_bytes(bin[..8].try_into().expect("8 bytes"));
        word(&self.primary) ^ self.variance.as_ref().map_or(0, word).rotate_left(1)
    }
}

#[derive(Clone)]
struct DecodedCopy {
    of: StoredIdentity,
    body: Bytes,
}

/// The decoded copies, shared by all worker threads.
pub struct DecodedCopies {
    copies: TinyUfo<u64, DecodedCopy>,
    /// Copies served, and bodies decoded and offered (per thread: this is a hit path).
    counts: PerThread<2>,
}

/// What the decoded copies have done since start (for `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedCopyCounts {
    /// Responses served from a kept copy.
    pub served: u64,
    /// Bodies decoded and offered for keeping (a copy missing or turned away).
    pub offered: u64,
}

impl DecodedCopies {
    /// Room for `capacity` bytes of copies; `None` when `capacity` is 0 (the feature is off).
    pub fn new(capacity: usize) -> Option<Self> {
        (capacity > 0).then(|| DecodedCopies {
            // sized for 8 KB pages; TinyUFO only uses the estimate to size its tables
            copies: TinyUfo::new((capacity / WEIGHT_UNIT).max(1), (capacity / 8192).max(16)),
            counts: PerThread::default(),
        })
    }

    /// The decoded body of the stored object `of`, if a copy of exactly that object is kept.
    pub fn get(&self, of: &StoredIdentity) -> Option<Bytes> {
        let copy = self
            .copies
            .get(&of.cache_key())
            .filter(|copy| copy.of == *of)
            .map(|copy| copy.body);
        if copy.is_some() {
            self.counts.local().add(0, 1);
        }
        copy
    }

    /// Copies served and bodies offered since start.
    pub fn counts(&self) -> DecodedCopyCounts {
        let [served, offered] = self.counts.sum();
        DecodedCopyCounts { served, offered }
    }

    /// Offers the decoded body of `of`; TinyUFO admits it if it is used more than what it would
    /// evict.
    pub fn put(&self, of: StoredIdentity, body: Bytes) {
        self.counts.local().add(1, 1);
        let weight = body.len() + COPY_OVERHEAD;
        let weight = u16::try_from(weight.div_ceil(WEIGHT_UNIT)).unwrap_or(u16::MAX);
        self.copies
            .put(of.cache_key(), DecodedCopy { of, body }, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn identity(primary: u8, variance: Option<u8>, created_ns: u64) -> StoredIdentity {
        StoredIdentity {
            primary: [primary; 16],
            variance: variance.map(|v| [v; 16]),
            created: SystemTime::UNIX_EPOCH + Duration::from_nanos(created_ns),
        }
    }

    #[test]
    fn a_copy_is_served_only_for_the_object_it_was_made_from() {
        let copies = DecodedCopies::new(1 << 20).unwrap();
        let page = identity(1, None, 1_000);
        copies.put(page, Bytes::from_static(b"decoded"));
        assert_eq!(copies.get(&page).as_deref(), Some(&b"decoded"[..]));
        // the same URL refilled a nanosecond later, another variant, another URL
        assert_eq!(copies.get(&identity(1, None, 1_001)), None);
        assert_eq!(copies.get(&identity(1, Some(2), 1_000)), None);
        assert_eq!(copies.get(&identity(3, None, 1_000)), None);
    }

    #[test]
    fn zero_capacity_turns_copies_off() {
        assert!(DecodedCopies::new(0).is_none());
    }
}
