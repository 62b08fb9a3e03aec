//! Fills in flight that another claim's fill lease guards: later requests join them only while
//! that lease stands.
//!
//! A fill fetched while another node's claim held the URL's lease
//! ([`FetchedUnderAnotherClaim`]) is guarded by that lease only while it stands: once that
//! claim's fill fails and releases it, a POST through a third node finds neither an entry nor a
//! lease and is published to no one. The fill itself is judged when it finishes (refused, or
//! kept only if the lease still names its holder); but until then it streams in this node's
//! memory tier, and a request arriving after such a POST would join it and be served the page
//! as it was before the POST (`takeover_breaks::a_request_after_a_post_is_not_served_a_fill_...`).
//! So each such fill is listed here by its key with the holder of the lease it went out under,
//! and a lookup that may join it reads the lease first ([`FillLeases::still_held_by`]): gone, or
//! another claim's, the node lets go of the URL's fills as a purge does
//! ([`MemoryTier::let_go_of_fills`]): their readers get the rest, no new request joins them,
//! nothing of them is stored, and the request fetches under a claim of its own.
//!
//! The requests coalesced behind such a fill on this node's cache lock pay one memcached read
//! each as they join; every other lookup pays one atomic load (nothing listed).

use super::fill_lease::{FetchedUnderAnotherClaim, FillLeases, LeaseHolder};
use super::memory::MemoryTier;
use parking_lot::Mutex;
use pingora_cache::key::CacheHashKey;
use pingora_cache::CacheKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The fills in flight on this node fetched under another claim's lease, by key (variant
/// included), with the holders of the leases they went out under.
#[derive(Default)]
pub struct GuardedFills {
    /// How many are listed: a lookup with none listed asks nothing more.
    listed: AtomicUsize,
    by_key: Mutex<HashMap<[u8; 16], Vec<LeaseHolder>>>,
}

/// One listed fill, unlisted when dropped (its fill finished, was refused, or its request
/// failed).
pub struct GuardedFill {
    fills: &'static GuardedFills,
    key: [u8; 16],
    holder: LeaseHolder,
}

impl GuardedFills {
    /// Lists the fill of `key` that `mark` says was fetched under another claim's lease, until
    /// the returned guard is dropped.
    pub fn list(&'static self, key: &CacheKey, mark: FetchedUnderAnotherClaim) -> GuardedFill {
        let key = key.combined_bin();
        let holder = mark.holder();
        self.by_key.lock().entry(key).or_default().push(holder);
        self.listed.fetch_add(1, Ordering::Release);
        GuardedFill {
            fills: self,
            key,
            holder,
        }
    }

    /// Before a lookup of `key` that may join a fill in flight: if a fill of it listed here went
    /// out under a lease that is gone or another claim's now, this node lets go of the key's
    /// fills (see the module docs). One memcached read per listed holder, only for a key with a
    /// listed fill.
    pub async fn before_joining(&self, key: &CacheKey, leases: &FillLeases, memory: &MemoryTier) {
        if self.listed.load(Ordering::Acquire) == 0 {
            return;
        }
        let holders = match self.by_key.lock().get(&key.combined_bin()) {
            Some(holders) => holders.clone(),
            None => return,
        };
        for holder in holders {
            if !leases.still_held_by(key, holder).await {
                if memory.let_go_of_fills(key) {
                    log::debug!(
                        "a fill in flight fetched under another claim's lease, which is gone, is \
                         joined by no more requests"
                    );
                }
                return;
            }
        }
    }
}

impl Drop for GuardedFill {
    fn drop(&mut self) {
        let mut by_key = self.fills.by_key.lock();
        if let Some(holders) = by_key.get_mut(&self.key) {
            if let Some(at) = holders.iter().position(|holder| *holder == self.holder) {
                holders.swap_remove(at);
                self.fills.listed.fetch_sub(1, Ordering::Release);
            }
            if holders.is_empty() {
                by_key.remove(&self.key);
            }
        }
    }
}
