//! Values read from memcached, decoded once: the complete objects the last few values became.
//!
//! Concurrent gets of one key leave as one: the client's batcher sends each distinct key once
//! and hands every waiter a clone of the same value (`lacquer_memcached`'s `batch`). With no
//! memory tier to promote into (`local_ttl = "0s"`), each waiter then decoded that value again
//! (CRC, head fields parsed, framing checked) and built its own wire head for the answer: about
//! 8,000 instructions of a memcached-tier hit's 39,000 (`bench/hit_instructions.sh
//! --memcached`), repeated for every client of a popular page.
//!
//! [`DecodedValues`] keeps the last few values with the object each was decoded into. A value is
//! recognised by its bytes: the same value handed to several waiters of one batch (found at once,
//! by where its bytes are), or the same entry read again by a later request, in another batch
//! and buffer (found by comparing the bytes, a `memcmp` that stops at the first difference: the
//! logical key near a value's start tells two pages apart). Decoding is a function of the value's
//! bytes alone (and of the logical key, which the caller checks), so equal bytes decode into an
//! equal object, and a later reader served the remembered one gets what decoding its own value
//! would have given, and that value is dropped. What a remembered object is not spared is
//! judgement: the ban list, freshness and variance are still the caller's on every read, so a
//! purge between two reads of one value is seen by the second; and an entry replaced in
//! memcached is other bytes, decoded anew.

use super::memory::CompleteObject;
use bytes::Bytes;
use parking_lot::Mutex;
use std::sync::Arc;

/// Values remembered: one per batch in flight to one server (two) and room for a second server.
/// Each pins the read buffer its value was split from (a value is remembered only when it is no
/// larger than an item: `TieredStorage::read_complete`).
const SLOTS: usize = 4;

/// A value and what it was decoded into.
struct Decoded {
    value: Bytes,
    /// The logical key echoed inside the value (checked when it was decoded).
    logical: Arc<str>,
    object: CompleteObject,
}

/// The last few memcached values decoded for the fast path, by their bytes; see the module doc.
pub struct DecodedValues {
    slots: Mutex<Slots>,
}

struct Slots {
    decoded: [Option<Decoded>; SLOTS],
    /// The slot the next value goes into (the oldest).
    next: usize,
}

impl Default for DecodedValues {
    fn default() -> Self {
        DecodedValues {
            slots: Mutex::new(Slots {
                decoded: Default::default(),
                next: 0,
            }),
        }
    }
}

impl DecodedValues {
    /// The object `value` was decoded into, with the logical key it carries, when `value` is one
    /// of those remembered (the same bytes, wherever they are: see the module doc).
    pub fn find(&self, value: &Bytes) -> Option<(CompleteObject, Arc<str>)> {
        // under the lock, only a cheap look (length, place, first bytes); the whole comparison
        // of a candidate, up to an item's size, is made after it is let go
        let mut candidates: [Option<(Bytes, CompleteObject, Arc<str>)>; SLOTS] = Default::default();
        {
            let slots = self.slots.lock();
            let looked_alike = slots
                .decoded
                .iter()
                .flatten()
                .filter(|d| maybe_same(&d.value, value));
            for (candidate, d) in candidates.iter_mut().zip(looked_alike) {
                *candidate = Some((d.value.clone(), d.object.clone(), d.logical.clone()));
            }
        }
        candidates
            .into_iter()
            .flatten()
            .find(|(remembered, _, _)| same(remembered, value))
            .map(|(_, object, logical)| (object, logical))
    }

    /// Remembers that `value` (carrying `logical`) was decoded into `object`, in place of the
    /// value remembered longest; once only (the readers of one value wake together, and more
    /// than one may have decoded it).
    pub fn remember(&self, value: Bytes, logical: Arc<str>, object: CompleteObject) {
        // a value that looks the same (length, first bytes) is compared whole outside the lock:
        // the same bytes are not remembered twice; other bytes (another version of the page)
        // take that slot
        let looked_alike = {
            let slots = self.slots.lock();
            slots.decoded.iter().enumerate().find_map(|(i, d)| {
                d.as_ref()
                    .filter(|d| maybe_same(&d.value, &value))
                    .map(|d| (i, d.value.clone()))
            })
        };
        if looked_alike
            .as_ref()
            .is_some_and(|(_, remembered)| same(remembered, &value))
        {
            return;
        }
        let mut slots = self.slots.lock();
        let still_there = |i: usize, remembered: &Bytes| {
            slots.decoded[i]
                .as_ref()
                .is_some_and(|d| d.value.as_ptr() == remembered.as_ptr())
        };
        let index = match looked_alike {
            Some((i, remembered)) if still_there(i, &remembered) => i,
            _ => {
                let next = slots.next;
                slots.next = (next + 1) % SLOTS;
                next
            }
        };
        // the slot's old value is dropped after the lock is let go
        let old = slots.decoded[index].replace(Decoded {
            value,
            logical,
            object,
        });
        drop(slots);
        drop(old);
    }
}

/// Whether two values are the same bytes: the same place (one batch's value, cloned), or an
/// equal copy (see the module doc).
fn same(a: &Bytes, b: &Bytes) -> bool {
    a.len() == b.len() && (a.as_ptr() == b.as_ptr() || a[..] == b[..])
}

/// How many first bytes [`maybe_same`] compares: an entry's logical key starts at byte 7.
const LOOK: usize = 128;

/// Whether two values may be the same bytes: the same length, and the same place or the same
/// first [`LOOK`] bytes. Cheap enough to run under the slots' lock.
fn maybe_same(a: &Bytes, b: &Bytes) -> bool {
    a.len() == b.len()
        && (a.as_ptr() == b.as_ptr() || a[..a.len().min(LOOK)] == b[..b.len().min(LOOK)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::object::{Body, StoredMeta};

    fn object_of(value: &Bytes) -> CompleteObject {
        CompleteObject::detached(StoredMeta::empty(), Body::from_chunks(vec![value.clone()]))
    }

    #[test]
    fn a_value_is_found_by_its_bytes_wherever_they_are() {
        let decoded = DecodedValues::default();
        let value = Bytes::from((0..100u8).collect::<Vec<u8>>());
        decoded.remember(value.clone(), "k".into(), object_of(&value));
        let (found, logical) = decoded.find(&value.clone()).expect("the same value");
        assert_eq!(&*logical, "k");
        assert_eq!(found.chunks(), std::slice::from_ref(&value));
        // the same bytes read again, into another buffer
        let (found, _) = decoded
            .find(&Bytes::copy_from_slice(&value))
            .expect("an equal copy");
        assert_eq!(found.chunks(), std::slice::from_ref(&value));
        // a part of the value, or one byte changed, is another value
        assert!(decoded.find(&value.slice(..50)).is_none());
        assert!(decoded.find(&value.slice(1..)).is_none());
        let mut changed = value.to_vec();
        changed[99] ^= 1;
        assert!(decoded.find(&Bytes::from(changed)).is_none());
    }

    #[test]
    fn another_version_that_looks_the_same_takes_its_slot_and_each_is_found_only_as_itself() {
        let decoded = DecodedValues::default();
        // the same first LOOK bytes and length, another last byte: another version of a page
        let old = Bytes::from(vec![1u8; LOOK + 10]);
        let mut newer = vec![1u8; LOOK + 10];
        newer[LOOK + 9] = 2;
        let newer = Bytes::from(newer);
        let other = Bytes::from(vec![3u8; 10]);
        decoded.remember(old.clone(), "k".into(), object_of(&old));
        decoded.remember(other.clone(), "o".into(), object_of(&other));
        assert!(decoded.find(&newer).is_none(), "found as the older version");
        decoded.remember(newer.clone(), "k".into(), object_of(&newer));
        let (found, _) = decoded
            .find(&Bytes::copy_from_slice(&newer))
            .expect("the newer");
        assert_eq!(found.chunks(), std::slice::from_ref(&newer));
        assert!(
            decoded.find(&old).is_none(),
            "the older version kept its slot"
        );
        assert!(
            decoded.find(&other).is_some(),
            "another value was pushed out"
        );
    }

    #[test]
    fn a_value_is_remembered_once() {
        let decoded = DecodedValues::default();
        let values: Vec<Bytes> = (0..SLOTS).map(|i| Bytes::from(vec![i as u8; 10])).collect();
        for value in &values {
            decoded.remember(value.clone(), "k".into(), object_of(value));
            // its other readers, who decoded it too
            decoded.remember(value.clone(), "k".into(), object_of(value));
        }
        for value in &values {
            assert!(
                decoded.find(value).is_some(),
                "a second copy pushed a value out"
            );
        }
    }

    #[test]
    fn the_value_remembered_longest_is_the_one_forgotten() {
        let decoded = DecodedValues::default();
        let values: Vec<Bytes> = (0..=SLOTS)
            .map(|i| Bytes::from(vec![i as u8; 10]))
            .collect();
        for value in &values {
            decoded.remember(value.clone(), "k".into(), object_of(value));
        }
        assert!(decoded.find(&values[0]).is_none());
        for value in &values[1..] {
            assert!(decoded.find(value).is_some());
        }
    }
}
