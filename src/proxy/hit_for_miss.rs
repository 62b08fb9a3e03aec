//! Which URLs answered uncacheable last time, remembered, so that their next misses skip the
//! cache lock but keep the lookup (Varnish calls it hit-for-miss).
//!
//! Without it every request for a `no-store` page is a miss that holds Pingora's cache lock until
//! its response head arrives: concurrent requests for a slow `no-store` URL queue behind the lock
//! holder, and only then each goes to the origin itself (twice the origin's latency for them).
//! A remembered URL is looked up as usual (a stored copy is still served, graced and revalidated)
//! but its miss takes no lock, so those requests reach the origin side by side; with a memcached
//! tier, the fast path claims no cluster fill lease for it either (`super::fast_hit`), and with
//! nothing stored its request is forwarded directly (`super::direct_pass`). When the lookup
//! finds a stored copy (a URL whose answers mix `private` and public), the lock is put back
//! before Pingora takes it for the stale copy, so its revalidation still coalesces.
//!
//! (Hit-for-pass, which skips the lookup too, lost grace, revalidation and coalescing on such
//! mixed URLs at every expiry: `docs/benchmarks.md`, issue 18 item 1.)
//!
//! The set is Pingora's predictor (`pingora_cache::predictor`: a sharded LRU of primary-key
//! hashes, 16,384 in all), consulted here rather than handed to Pingora (which would skip the
//! lookup). Only reasons that belong to the URL are remembered: `no-store`, `private`, no
//! freshness. An error status is transient, `Authorization` and `Set-Cookie` belong to one
//! request or response. A storable answer clears the mark.

use crate::policy::{REASON_NO_FRESHNESS, REASON_NO_STORE, REASON_PRIVATE};
use pingora_cache::key::HashBinary;
use pingora_cache::lock::CacheKeyLockImpl;
use pingora_cache::predictor::{CacheablePredictor, Predictor};
use pingora_cache::{CacheKey, CacheOptionOverrides, RespCacheable};
use pingora_proxy::Session;

/// Shards of the remembered set (each has its own lock).
const SHARDS: usize = 16;
/// URLs remembered per shard: 16,384 in all, least recently marked forgotten first.
const PER_SHARD: usize = 1024;

/// The process's URLs last answered uncacheable, shared by every request.
pub struct UncacheableUrls {
    set: Predictor<SHARDS>,
}

impl UncacheableUrls {
    /// One set for the process's life (the proxy keeps `&'static` references to its parts).
    pub fn leak() -> &'static UncacheableUrls {
        Box::leak(Box::new(UncacheableUrls {
            set: Predictor::new(PER_SHARD, Some(not_the_urls_own)),
        }))
    }

    /// Whether the URL of primary hash `primary` answered uncacheable last time: its miss takes
    /// no cache lock. Taking the hash, not the key: the set reads nothing else, and a pass that
    /// only asks this needs no key text built (an allocation and a copy of the URL).
    pub fn remembered(&self, primary: HashBinary) -> bool {
        !self.set.cacheable_prediction(&hash_only(primary))
    }

    /// Remembers or forgets the URL of primary hash `primary` after the storing decision on its
    /// answer.
    pub fn on_decision(&self, primary: HashBinary, decision: &RespCacheable) {
        let key = hash_only(primary);
        match decision {
            RespCacheable::Cacheable(_) => {
                self.set.mark_cacheable(&key);
            }
            RespCacheable::Uncacheable(reason) => {
                self.set.mark_uncacheable(&key, *reason);
            }
        }
    }
}

/// A key for Pingora's predictor, which reads only its primary hash: no text (nothing allocated).
fn hash_only(primary: HashBinary) -> CacheKey {
    let mut key = CacheKey::new(Vec::new(), "");
    key.set_primary_bin_override(primary);
    key
}

/// `cache_hit_filter` of a request enabled without the lock: the lookup found a stored copy, so
/// the lock goes back on (Pingora takes it next for a stale copy: its revalidation coalesces).
pub fn on_stored_copy_found(
    session: &mut Session,
    lock: &'static CacheKeyLockImpl,
    overrides: CacheOptionOverrides,
) {
    session.cache.set_cache_lock(Some(lock), Some(overrides));
}

/// Whether an uncacheable reason of the policy is one not to remember (see the module doc).
fn not_the_urls_own(reason: &'static str) -> bool {
    !matches!(
        reason,
        REASON_NO_STORE | REASON_PRIVATE | REASON_NO_FRESHNESS
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{REASON_AUTHORIZATION, REASON_SET_COOKIE, REASON_STATUS};
    use pingora_cache::key::CacheHashKey;
    use pingora_cache::NoCacheReason;

    #[test]
    fn only_the_urls_own_reasons_are_remembered() {
        let urls = UncacheableUrls::leak();
        let uncacheable = |reason| RespCacheable::Uncacheable(NoCacheReason::Custom(reason));
        for reason in [REASON_NO_STORE, REASON_PRIVATE, REASON_NO_FRESHNESS] {
            let key = CacheKey::new(format!("shop.example/{reason}"), "").primary_bin();
            assert!(!urls.remembered(key));
            urls.on_decision(key, &uncacheable(reason));
            assert!(urls.remembered(key), "{reason}");
        }
        for reason in [REASON_STATUS, REASON_AUTHORIZATION, REASON_SET_COOKIE] {
            let key = CacheKey::new(format!("shop.example/{reason}"), "").primary_bin();
            urls.on_decision(key, &uncacheable(reason));
            assert!(!urls.remembered(key), "{reason}");
        }
    }
}
