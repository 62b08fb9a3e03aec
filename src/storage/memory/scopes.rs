//! The scope index: host -> keys and tag -> keys of the objects this node holds, so that a ban
//! of a host, a path prefix or a tag finds what it covers here without looking at every object
//! (the memory tier's store, TinyUFO, cannot be iterated). The object index keeps it in step: an
//! object enters when stored and leaves when evicted, replaced or removed, as in
//! [`super::variants`].

use crate::storage::ban_list::scope::EntryScopes;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};

/// Bytes charged per index entry (a set slot and its share of the map), on top of the object.
pub(super) const INDEX_ENTRY_CHARGE: usize = 48;

#[derive(Default)]
struct Maps {
    by_host: HashMap<u64, HashSet<u128>>,
    by_tag: HashMap<u64, HashSet<u128>>,
}

/// Which keys are stored under each host and each tag.
#[derive(Default)]
pub(super) struct ScopeIndex {
    maps: Mutex<Maps>,
}

impl ScopeIndex {
    /// Records that `key` is stored with `scopes`.
    pub(super) fn add(&self, key: u128, scopes: &EntryScopes) {
        let mut maps = self.maps.lock();
        maps.by_host.entry(scopes.host).or_default().insert(key);
        for tag in scopes.tags.iter() {
            maps.by_tag.entry(*tag).or_default().insert(key);
        }
    }

    /// Records that `key`, stored with `scopes`, is no longer stored.
    pub(super) fn forget(&self, key: u128, scopes: &EntryScopes) {
        let mut maps = self.maps.lock();
        remove_from(&mut maps.by_host, scopes.host, key);
        for tag in scopes.tags.iter() {
            remove_from(&mut maps.by_tag, *tag, key);
        }
    }

    /// The keys stored under `host`.
    pub(super) fn of_host(&self, host: u64) -> Vec<u128> {
        let maps = self.maps.lock();
        maps.by_host
            .get(&host)
            .map(|keys| keys.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The keys stored with `tag`.
    pub(super) fn tagged(&self, tag: u64) -> Vec<u128> {
        let maps = self.maps.lock();
        maps.by_tag
            .get(&tag)
            .map(|keys| keys.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Every key stored (every object has a host).
    pub(super) fn all(&self) -> Vec<u128> {
        let maps = self.maps.lock();
        maps.by_host.values().flatten().copied().collect()
    }
}

fn remove_from(map: &mut HashMap<u64, HashSet<u128>>, scope: u64, key: u128) {
    if let Some(keys) = map.get_mut(&scope) {
        keys.remove(&key);
        if keys.is_empty() {
            map.remove(&scope);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ban_list::scope::scope_hash;

    #[test]
    fn keys_are_found_by_host_and_tag_until_forgotten() {
        let index = ScopeIndex::default();
        let a = EntryScopes::new("a.test/1", 1, Box::new([scope_hash("t")]));
        let b = EntryScopes::new("a.test/2", 2, Box::new([]));
        index.add(10, &a);
        index.add(20, &b);
        let mut host = index.of_host(scope_hash("a.test"));
        host.sort();
        assert_eq!(host, vec![10, 20]);
        assert_eq!(index.tagged(scope_hash("t")), vec![10]);
        index.forget(10, &a);
        assert!(index.tagged(scope_hash("t")).is_empty());
        assert_eq!(index.all(), vec![20]);
        index.forget(20, &b);
        assert!(index.all().is_empty());
    }
}
