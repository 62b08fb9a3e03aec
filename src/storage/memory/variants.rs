//! The variant index: primary key -> the keys of the variants stored under it.
//!
//! A response with `Vary` is stored once per variant, each under its own key (the primary key plus
//! the request's variance), while a purge names only the URL, that is the primary key. This index
//! lets purging a URL purge every variant of it (nginx purges only one). The object index keeps it
//! in step: a variant enters when stored and leaves when evicted, replaced or removed.

use parking_lot::Mutex;
use std::collections::HashMap;

/// Which variant keys are stored under each primary key.
#[derive(Default)]
pub(super) struct VariantIndex {
    by_primary: Mutex<HashMap<u128, Vec<u128>>>,
}

impl VariantIndex {
    /// Records that `key` is stored as a variant of `primary` (nothing when the object does not
    /// vary, i.e. `key` is the primary key itself).
    pub(super) fn add(&self, primary: u128, key: u128) {
        if primary != key {
            self.by_primary.lock().entry(primary).or_default().push(key);
        }
    }

    /// Records that `key`, a variant of `primary`, is no longer stored.
    pub(super) fn forget(&self, primary: u128, key: u128) {
        if primary != key {
            let mut by_primary = self.by_primary.lock();
            if let Some(keys) = by_primary.get_mut(&primary) {
                keys.retain(|k| *k != key);
                if keys.is_empty() {
                    by_primary.remove(&primary);
                }
            }
        }
    }

    /// The variant keys stored under `primary`.
    pub(super) fn of(&self, primary: u128) -> Vec<u128> {
        self.by_primary
            .lock()
            .get(&primary)
            .cloned()
            .unwrap_or_default()
    }

    /// Removes and returns the variant keys stored under `primary`.
    pub(super) fn take(&self, primary: u128) -> Vec<u128> {
        self.by_primary.lock().remove(&primary).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::VariantIndex;

    #[test]
    fn tracks_variants_per_primary_and_ignores_unvaried_objects() {
        let index = VariantIndex::default();
        index.add(1, 1);
        index.add(1, 10);
        index.add(1, 11);
        index.add(2, 20);
        index.forget(1, 10);
        assert_eq!(index.take(1), vec![11]);
        assert!(index.take(1).is_empty());
        index.forget(2, 20);
        assert!(index.take(2).is_empty());
    }
}
