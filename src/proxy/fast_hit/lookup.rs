//! Where the fast path looks for a stored object, and which of what it finds it may serve.
//!
//! The object is looked for in the memory tier, then (when a memcached cluster is configured and
//! the memory tier has nothing under the URL) in memcached, through the same verified read and
//! promotion the tiered store uses. A memcached miss is reported as [`Lookup::Absent`], so the
//! standard path does not ask memcached a second time (unless this node stored the URL just
//! since: see `storage::tiered::PrimaryKnownMissing`).
//!
//! Variants are resolved the way Pingora's state machine does it, with the same
//! [`vary::variance_key`]: the object under the primary key names the `Vary` fields; if the
//! request's variance differs from that object's, the variant is looked up under the key with the
//! request's variance, and must carry exactly that variance and be no older than the object in
//! the primary slot (a purge deletes only that slot: what it held marks every older variant
//! invalid, see [`variant_is_current`]). Freshness is the stored `fresh_until` the policy
//! computed; anything not fresh is [`Lookup::Decline`]d.

use crate::policy::vary;
use crate::proxy::cache_key;
use crate::storage::fill_lease::Sighting;
use crate::storage::memory::{CompleteObject, MemoryTier, NoCompleteObject};
use crate::storage::object::StoredMeta;
use crate::storage::tiered::TieredStorage;
use pingora_cache::key::{CacheHashKey, HashBinary};
use pingora_cache::CacheKey;
use pingora_http::RequestHeader;
use std::time::SystemTime;

/// What a fast-path lookup found.
pub enum Lookup {
    /// A fresh, complete object that is the variant this request selects: serve it.
    Fresh(CompleteObject),
    /// Nothing is stored under the URL in the place looked at.
    Absent,
    /// Something is stored, but the standard path must decide (stale, in flight, another variant).
    Decline,
}

impl From<Lookup> for Sighting<CompleteObject> {
    /// What a request waiting for another node's fill makes of a lookup.
    fn from(found: Lookup) -> Self {
        match found {
            Lookup::Fresh(hit) => Sighting::Arrived(hit),
            Lookup::Absent => Sighting::NotYet,
            Lookup::Decline => Sighting::Elsewhere,
        }
    }
}

/// Looks the request (whose cache key has the primary hash `primary_bin`) up in the memory tier.
pub fn in_memory(
    memory: &MemoryTier,
    req: &RequestHeader,
    primary_bin: HashBinary,
    now: SystemTime,
) -> Lookup {
    let primary = match memory.complete_object(primary_bin) {
        Ok(primary) => primary,
        // a fill in flight is streamed by the standard path's lookup: not absent (a direct miss
        // would fetch it a second time once the filling request has let its lock go)
        Err(NoCompleteObject::Filling) => return Lookup::Decline,
        Err(NoCompleteObject::Absent) => return Lookup::Absent,
    };
    let hit = match primary.meta().variance {
        None => primary,
        Some(stored) => {
            let Some(wanted) = vary::variance_key(&primary.meta().header, req) else {
                return Lookup::Decline;
            };
            if wanted == stored {
                primary
            } else {
                match memory.complete_object(cache_key::variant_bin(primary_bin, wanted)) {
                    Ok(variant) if variant_is_current(variant.meta(), primary.meta(), wanted) => {
                        variant
                    }
                    _ => return Lookup::Decline,
                }
            }
        }
    };
    fresh_or_decline(hit, now)
}

/// Looks the request (whose cache key is `key`) up in memcached, for a request whose URL the
/// memory tier does not hold. Hits are promoted into the memory tier by the read itself, as on
/// the standard path.
pub async fn in_shared(
    tier: &TieredStorage,
    req: &RequestHeader,
    key: &CacheKey,
    now: SystemTime,
) -> Lookup {
    let Some(hit) = tier.read_complete(key).await else {
        return Lookup::Absent;
    };
    let hit = match hit.meta().variance {
        None => hit,
        Some(stored) => {
            let Some(wanted) = vary::variance_key(&hit.meta().header, req) else {
                return Lookup::Decline;
            };
            if wanted == stored {
                hit
            } else {
                let mut variant_key = key.clone();
                variant_key.set_variance_key(wanted);
                match tier.read_complete(&variant_key).await {
                    Some(variant) if variant_is_current(variant.meta(), hit.meta(), wanted) => {
                        variant
                    }
                    _ => return Lookup::Decline,
                }
            }
        }
    };
    fresh_or_decline(hit, now)
}

/// The memory tier, then memcached: where a request waiting for another node's fill looks.
pub async fn everywhere(
    memory: &MemoryTier,
    tier: &TieredStorage,
    req: &RequestHeader,
    key: &CacheKey,
) -> Lookup {
    let now = SystemTime::now();
    match in_memory(memory, req, key.primary_bin(), now) {
        Lookup::Absent => in_shared(tier, req, key, now).await,
        found => found,
    }
}

/// Whether a variant found under its own key may be served: it carries the variance asked for
/// and was created no earlier than the object in the primary slot. This is Pingora's tombstone
/// rule (`valid_after` in `pingora_cache::HttpCache::cache_vary_lookup`), applied the same way
/// here so both paths agree: purging a URL deletes only the primary slot, and whatever fills it
/// next retires every variant stored before the purge, in memcached as in memory.
pub fn variant_is_current(variant: &StoredMeta, primary: &StoredMeta, wanted: HashBinary) -> bool {
    variant.variance == Some(wanted) && variant.created >= primary.created
}

fn fresh_or_decline(hit: CompleteObject, now: SystemTime) -> Lookup {
    if hit.meta().fresh_until > now {
        Lookup::Fresh(hit)
    } else {
        Lookup::Decline
    }
}
