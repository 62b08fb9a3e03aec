//! The hot-hit fast path: fresh, unconditional hits answered from `request_filter`, whole or (from
//! the memory tier) one range of them.
//!
//! Pingora's cache state machine does a lot per hit that the commonest case never needs: it
//! enables per-request cache state, rebuilds `CacheMeta`, runs the lock, vary and range machinery.
//! For a request that is a plain GET or HEAD with no validators, no request directives and no
//! credentials, whose object (or the variant it selects) is stored and fresh, the answer is fully
//! determined: the stored head plus `Age`, and the stored body; with one satisfiable `Range` of a
//! `200` the memory tier holds, a `206` of that part (ranges are what video players and download
//! managers ask, and a large body's part goes from its memory file with `sendfile`, as whole
//! large hits do). This module serves exactly those cases and declines everything else, which
//! then takes the standard path.
//!
//! * [`FastHit::on_request`] is the whole path, in order: [`eligible`], the memory tier, then
//!   memcached ([`lookup`]); when memcached has nothing either, the cluster's fill lease
//!   ([`crate::storage::fill_lease`]) says whether this request fetches or waits for another
//!   node's fill (none is claimed for a URL last answered uncacheable: nothing will fill it,
//!   [`super::hit_for_miss`]); then the [`answer`].
//! * What it learns on the way is kept for the standard path in the request context: the cache
//!   key, that memcached has nothing under the URL (so it is not asked twice), that no tier has
//!   anything under it (a pass may then be forwarded directly: `super::direct_pass`), and the
//!   fill lease this request holds (ended in `logging`).
//!
//! It shares the decisions of the standard path rather than copying them: the cache key is
//! [`super::cache_key`], cacheability of the request is [`CachePolicy::request_cacheable`],
//! freshness is the stored `fresh_until` the policy computed, and `Age` is derived from the same
//! stored epoch Pingora uses. Everything here runs once per hit, so it is measured in
//! instructions per hit (`bench/hit_instructions.sh`); the integration tests exercise it on every
//! hit they make.

pub mod answer;
pub mod lookup;
pub mod pre_serialised;

use super::hit_for_miss::UncacheableUrls;
use super::RequestCtx;
use crate::compression::decoded_copies::DecodedCopies;
use crate::policy::CachePolicy;
use crate::storage::fill_lease::{AfterSharedMiss, FetchedUnderAnotherClaim};
use crate::storage::memory::{CompleteObject, MemoryTier, NoCompleteObject};
use crate::storage::tier::Tier;
use crate::storage::tiered::TieredStorage;
use answer::Answer;
use http::header;
use lookup::Lookup;
use pingora_cache::key::CacheHashKey;
use pingora_cache::CacheKey;
use pingora_http::RequestHeader;
use std::time::SystemTime;

pub use lookup::variant_is_current;

/// Request fields whose presence means the standard path must decide.
const DECLINE_IF_PRESENT: [header::HeaderName; 9] = [
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::AUTHORIZATION,
    // a protocol switch (a WebSocket) is never answered from the cache: `proxy::upgrade`
    header::UPGRADE,
];

/// Whether, and how, the fast path may answer a request, judged on the request alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eligible {
    /// The standard path decides (a field in [`DECLINE_IF_PRESENT`], or a request the cache
    /// does not serve).
    No,
    /// A plain GET or HEAD: the whole stored answer, from any tier.
    Whole,
    /// With `Range` (and no `If-Range`): one range of an object this node's memory tier holds
    /// ([`Answer::for_range`]); anything else the standard path answers.
    Range,
}

/// Whether a request is one the fast path may answer, judged on the request alone.
///
/// One pass over the request's field names (a request carries a handful; each comparison with a
/// standard name is an integer compare) instead of one hashed lookup per declining field.
pub fn eligible(policy: &CachePolicy, req: &RequestHeader) -> Eligible {
    if !policy.request_cacheable(req) {
        return Eligible::No;
    }
    let mut ranged = false;
    for name in req.headers.keys() {
        if *name == header::RANGE {
            ranged = true;
        } else if DECLINE_IF_PRESENT.contains(name) {
            return Eligible::No;
        }
    }
    if ranged {
        Eligible::Range
    } else {
        Eligible::Whole
    }
}

/// What the fast path reads: this node's memory tier, the tiered store in front of memcached
/// when one is configured, and the decoded copies of small compressed bodies.
pub struct FastHit {
    memory: &'static MemoryTier,
    shared: Option<&'static TieredStorage>,
    decoded_copies: Option<&'static DecodedCopies>,
    /// The URLs last answered uncacheable: their memcached misses claim no fill lease.
    uncacheable: &'static UncacheableUrls,
}

impl FastHit {
    /// The fast path over the given storage (the same the standard path uses).
    pub fn new(
        memory: &'static MemoryTier,
        shared: Option<&'static TieredStorage>,
        decoded_copies: Option<&'static DecodedCopies>,
        uncacheable: &'static UncacheableUrls,
    ) -> Self {
        FastHit {
            memory,
            shared,
            decoded_copies,
            uncacheable,
        }
    }

    /// Whether the memory tier holds the URL whose primary hash is `primary`, or is filling it:
    /// a direct miss checks again once it holds the URL's cache lock (`direct_pass`).
    pub fn stored_or_filling(&self, primary: pingora_cache::key::HashBinary) -> bool {
        !matches!(
            self.memory.complete_object(primary),
            Err(NoCompleteObject::Absent)
        )
    }

    /// The decoded copies of small gzip bodies, when kept (for `/metrics`).
    pub fn decoded_copies(&self) -> Option<&'static DecodedCopies> {
        self.decoded_copies
    }

    /// `request_filter`: the answer to `req` when the fast path can give it; `None` when the
    /// standard path must, with what was learned on the way kept in `ctx` (see the module doc).
    pub async fn on_request(
        &self,
        policy: &CachePolicy,
        req: &RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Option<Answer> {
        let ranged = match eligible(policy, req) {
            Eligible::No => return None,
            Eligible::Whole => false,
            Eligible::Range => true,
        };
        let primary = ctx.key.primary_bin(req);
        let now = SystemTime::now();
        let hit = match lookup::in_memory(self.memory, req, primary, now) {
            Lookup::Fresh(hit) if ranged => {
                let answer = Answer::for_range(hit, req, now)?;
                ctx.tier = Some(Tier::Memory);
                return Some(answer);
            }
            Lookup::Fresh(hit) => {
                ctx.tier = Some(Tier::Memory);
                hit
            }
            Lookup::Decline => return None,
            // a range of what memcached holds, or of what the origin will send: the standard
            // path, which learns nothing from this look (as when it declined `Range` unseen)
            Lookup::Absent if ranged => return None,
            Lookup::Absent => {
                let Some(tier) = self.shared else {
                    ctx.nothing_stored = true;
                    return None;
                };
                let key = ctx.key.get(req);
                // (whatever memcached or the lease say, this request's miss is decided here: the
                // standard path does not claim the lease again)
                ctx.shared_miss_decided = true;
                // boxed: a hit from memory, the common case, then neither builds nor copies the
                // state of memcached reads and the fill-lease wait (kilobytes) on every request
                let shared = Box::pin(self.after_memory_miss(tier, req, key, now)).await;
                match shared {
                    // another node's fill, waited for, is read through memcached too
                    Ok(hit) | Err(AfterSharedMiss::Filled(hit)) => {
                        ctx.tier = Some(Tier::Memcached);
                        hit
                    }
                    Err(AfterSharedMiss::FillHere {
                        lease,
                        known_missing,
                    }) => {
                        ctx.fill_lease = lease;
                        ctx.shared_primary_missing = known_missing;
                        ctx.nothing_stored = known_missing;
                        return None;
                    }
                    Err(AfterSharedMiss::UnderAnotherClaim { holder }) => {
                        // fetched under another claim's lease, after waiting for its fill as
                        // long as it may: kept only while that lease stands
                        ctx.fetch_under_another_claim(FetchedUnderAnotherClaim::KeptWhileHeldBy(
                            holder,
                        ));
                        ctx.shared_primary_missing = true;
                        ctx.nothing_stored = true;
                        return None;
                    }
                    Err(AfterSharedMiss::BehindThisNode) => {
                        // behind another request's fill here; should it go to the origin
                        // itself all the same, the standard path claims the lease first
                        ctx.shared_miss_decided = false;
                        ctx.shared_primary_missing = true;
                        ctx.nothing_stored = true;
                        return None;
                    }
                }
            }
        };
        Answer::for_hit(hit, req, primary, now, self.decoded_copies)
    }

    /// The memory tier has nothing under the URL: memcached, and when memcached has nothing
    /// either, the cluster's fill lease. `Ok`: a hit to serve; `Err`: what the fill lease says
    /// (a declined memcached hit is `FillHere` without a lease, memcached not known missing).
    async fn after_memory_miss(
        &self,
        tier: &'static TieredStorage,
        req: &RequestHeader,
        key: &CacheKey,
        now: SystemTime,
    ) -> Result<CompleteObject, AfterSharedMiss<CompleteObject>> {
        match lookup::in_shared(tier, req, key, now).await {
            Lookup::Fresh(hit) => Ok(hit),
            Lookup::Decline => Err(AfterSharedMiss::FillHere {
                lease: None,
                known_missing: false,
            }),
            Lookup::Absent if self.uncacheable.remembered(key.primary_bin()) => {
                // a URL last answered uncacheable will not be filled: no lease to claim, and no
                // request anywhere in the cluster waits for this one (as `hit_for_miss` takes
                // no cache lock for it on this node)
                Err(AfterSharedMiss::FillHere {
                    lease: None,
                    known_missing: true,
                })
            }
            Lookup::Absent => {
                let memory = self.memory;
                let look =
                    move || async move { lookup::everywhere(memory, tier, req, key).await.into() };
                Err(tier.fill_leases().on_shared_miss(key, look).await)
            }
        }
    }
}
