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
//! another claim's, the node lets go of that fill as a purge would ([`FillLetGo`]): its readers
//! get the rest, no new request joins it, nothing of it is stored, and the request fetches under
//! a claim of its own. Another fill of the same key (this node's own claim's, say) is left be.
//!
//! The requests coalesced behind such a fill on this node's cache lock pay one memcached read
//! each as they join; every other lookup pays one atomic load (nothing listed).

use super::fill_lease::{FetchedUnderAnotherClaim, FillLeases, LeaseHolder};
use super::memory::FillLetGo;
use parking_lot::Mutex;
use pingora_cache::key::CacheHashKey;
use pingora_cache::CacheKey;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The fills in flight on this node fetched under another claim's lease, by key (variant
/// included), with the holders of the leases they went out under.
#[derive(Default)]
pub struct GuardedFills {
    /// How many are listed: a lookup with none listed asks nothing more.
    listed: AtomicUsize,
    /// Numbers the listings, so that each guard unlists its own.
    next: AtomicU64,
    by_key: Mutex<HashMap<[u8; 16], Vec<Listed>>>,
}

/// One fill as listed.
#[derive(Clone)]
struct Listed {
    number: u64,
    holder: LeaseHolder,
    fill: FillLetGo,
}

/// One listed fill, unlisted when dropped (its fill finished, was refused, or its request
/// failed).
pub struct GuardedFill {
    fills: &'static GuardedFills,
    key: [u8; 16],
    number: u64,
}

impl GuardedFills {
    /// Lists `fill`, of `key`, which `mark` says was fetched under another claim's lease, until
    /// the returned guard is dropped.
    pub fn list(
        &'static self,
        key: &CacheKey,
        mark: FetchedUnderAnotherClaim,
        fill: FillLetGo,
    ) -> GuardedFill {
        let key = key.combined_bin();
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        self.by_key.lock().entry(key).or_default().push(Listed {
            number,
            holder: mark.holder(),
            fill,
        });
        self.listed.fetch_add(1, Ordering::Release);
        GuardedFill {
            fills: self,
            key,
            number,
        }
    }

    /// Before a lookup of `key` that may join a fill in flight: each fill of it listed here
    /// whose lease is gone or another claim's now is let go of (see the module docs). One
    /// memcached read per listed fill, only for a key with one.
    pub async fn before_joining(&self, key: &CacheKey, leases: &FillLeases) {
        if self.listed.load(Ordering::Acquire) == 0 {
            return;
        }
        let listed = match self.by_key.lock().get(&key.combined_bin()) {
            Some(listed) => listed.clone(),
            None => return,
        };
        for Listed { holder, fill, .. } in listed {
            if !leases.still_held_by(key, holder).await && fill.let_go() {
                log::debug!(
                    "a fill in flight fetched under another claim's lease, which is gone, is \
                     joined by no more requests"
                );
            }
        }
    }
}

impl Drop for GuardedFill {
    fn drop(&mut self) {
        let mut by_key = self.fills.by_key.lock();
        if let Some(listed) = by_key.get_mut(&self.key) {
            if let Some(at) = listed.iter().position(|l| l.number == self.number) {
                listed.swap_remove(at);
                self.fills.listed.fetch_sub(1, Ordering::Release);
            }
            if listed.is_empty() {
                by_key.remove(&self.key);
            }
        }
    }
}
