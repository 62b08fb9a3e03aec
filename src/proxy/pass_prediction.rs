//! Which URLs answer uncacheable, remembered, so that later requests for them pass straight to
//! the origin: no lookup and no cache lock (Varnish calls it hit-for-pass).
//!
//! Without it every request for a `no-store` page is treated as a miss: looked up, and holding
//! Pingora's cache lock until its response head arrives. Concurrent requests for the same page
//! then queue behind that lock, one response head at a time, before each learns the page is not
//! stored and goes to the origin itself: an API endpoint or a dynamic page behind the cache was
//! served at a third of nginx's rate (`bench/pass_through.sh`, see `docs/benchmarks.md`).
//!
//! This is Pingora's own predictor (`pingora_cache::predictor`: an LRU of primary-key hashes,
//! sharded), told which of the policy's reasons belong to the URL rather than to the moment or
//! to one request: `no-store`, `private`, and no freshness at all (`crate::policy`). An error
//! status is transient (and must leave stale-if-error to work), `Authorization` and `Set-Cookie`
//! belong to one request or response, `Vary: *`, `must-understand` and a too-large body are
//! rare: those are not remembered, and the next request is a miss as before.
//!
//! A remembered URL is still served from the cache when a fresh response is stored under it (the
//! fast path looks before anything else), and the first of its responses the policy finds
//! storable again is stored and clears the mark (Pingora re-admits a bypassed response that
//! turned cacheable).

use crate::policy::{REASON_NO_FRESHNESS, REASON_NO_STORE, REASON_PRIVATE};
use pingora_cache::predictor::{CacheablePredictor, Predictor};

/// Shards of the remembered set (each has its own lock).
const SHARDS: usize = 16;
/// URLs remembered per shard: 16,384 in all, least recently marked forgotten first.
const PER_SHARD: usize = 1024;

/// The process's set of URLs last answered uncacheable, shared by every request.
pub fn leak() -> &'static (dyn CacheablePredictor + Sync) {
    Box::leak(Box::new(Predictor::<SHARDS>::new(
        PER_SHARD,
        Some(not_the_urls_own),
    )))
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
    use pingora_cache::{CacheKey, NoCacheReason};

    #[test]
    fn only_the_urls_own_reasons_are_remembered() {
        let predictor = leak();
        for reason in [REASON_NO_STORE, REASON_PRIVATE, REASON_NO_FRESHNESS] {
            let key = CacheKey::new(format!("shop.example/{reason}"), "");
            assert!(predictor.cacheable_prediction(&key));
            predictor.mark_uncacheable(&key, NoCacheReason::Custom(reason));
            assert!(!predictor.cacheable_prediction(&key), "{reason}");
            predictor.mark_cacheable(&key);
            assert!(predictor.cacheable_prediction(&key), "{reason}");
        }
        for reason in [REASON_STATUS, REASON_AUTHORIZATION, REASON_SET_COOKIE] {
            let key = CacheKey::new(format!("shop.example/{reason}"), "");
            predictor.mark_uncacheable(&key, NoCacheReason::Custom(reason));
            assert!(predictor.cacheable_prediction(&key), "{reason}");
        }
    }
}
