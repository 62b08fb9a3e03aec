//! The hot-hit fast path: fresh, unconditional, non-range hits answered from `request_filter`.
//!
//! Pingora's cache state machine does a lot per hit that the commonest case never needs: it
//! enables per-request cache state, rebuilds `CacheMeta`, runs the lock, vary and range machinery.
//! For a request that is a plain GET or HEAD with no validators, no `Range`, no request
//! directives and no credentials, whose object (or the variant it selects) is stored and fresh,
//! the answer is fully determined: the stored head plus `Age`, and the stored body. This module
//! serves exactly that case and declines everything else, which then takes the standard path.
//!
//! The object is looked for in the memory tier, then (when a memcached cluster is configured and
//! the memory tier has nothing under the URL) in memcached, through the same verified read and
//! promotion the tiered store uses. A memcached miss is remembered for the request
//! ([`Lookup::Absent`]), so the standard path does not ask memcached a second time.
//!
//! It shares the decisions of the standard path rather than copying them: the cache key is
//! [`super::cache_key_for`], cacheability of the request is [`CachePolicy::request_cacheable`],
//! freshness is the stored `fresh_until` the policy computed, and `Age` is derived from the same
//! stored epoch Pingora uses. The integration tests exercise it on every hit they make.

use super::cache_key_for;
use crate::compression::decoded_copies::{DecodedCopies, StoredIdentity};
use crate::compression::{self, gunzip::gunzip_complete};
use crate::policy::{vary, CachePolicy};
use crate::storage::memory::{CompleteObject, MemoryTier};
use crate::storage::tiered::{FillClaim, TieredStorage};
use http::header;
use pingora_cache::key::CacheHashKey;
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::SystemTime;

/// Request fields whose presence means the standard path must decide.
const DECLINE_IF_PRESENT: [header::HeaderName; 9] = [
    header::RANGE,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_MATCH,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::AUTHORIZATION,
];

/// Whether a request is one the fast path may answer, judged on the request alone.
///
/// One pass over the request's field names (a request carries a handful; each comparison with a
/// standard name is an integer compare) instead of one hashed lookup per declining field.
pub fn eligible(policy: &CachePolicy, req: &RequestHeader) -> bool {
    policy.request_cacheable(req)
        && !req
            .headers
            .keys()
            .any(|name| DECLINE_IF_PRESENT.contains(name))
}

/// What a fast-path lookup found.
pub enum Lookup {
    /// A fresh, complete object that is the variant this request selects: serve it.
    Fresh(CompleteObject),
    /// Nothing is stored under the URL in the place looked at.
    Absent,
    /// Something is stored, but the standard path must decide (stale, in flight, another variant).
    Decline,
}

/// Looks the request up in the memory tier.
///
/// Variants are resolved the way Pingora's state machine does it, with the same
/// [`vary::variance_key`]: the object under the primary key names the `Vary` fields; if the
/// request's variance differs from that object's, the variant is looked up under the key with the
/// request's variance, and must carry exactly that variance and be no older than the object in
/// the primary slot (a purge deletes only that slot: what it held marks every older variant
/// invalid, see [`variant_is_current`]).
pub fn lookup(memory: &MemoryTier, req: &RequestHeader, now: SystemTime) -> Lookup {
    let mut key = cache_key_for(req);
    // hash the primary key once; the variant key is derived from this hash
    let primary_bin = key.primary_bin();
    key.set_primary_bin_override(primary_bin);
    let Some(primary) = memory.complete_object(primary_bin) else {
        return Lookup::Absent;
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
                key.set_variance_key(wanted);
                match memory.complete_object(key.combined_bin()) {
                    Some(variant) if variant_is_current(variant.meta(), primary.meta(), wanted) => {
                        variant
                    }
                    _ => return Lookup::Decline,
                }
            }
        }
    };
    fresh_or_decline(hit, now)
}

/// Looks the request up in memcached, for a request whose URL the memory tier does not hold.
/// Hits are promoted into the memory tier by the read itself, as on the standard path.
pub async fn shared_lookup(tier: &TieredStorage, req: &RequestHeader, now: SystemTime) -> Lookup {
    let mut key = cache_key_for(req);
    let Some((meta, body)) = tier.read_and_promote(&key).await else {
        return Lookup::Absent;
    };
    let hit = match meta.variance {
        None => CompleteObject::detached(meta, body),
        Some(stored) => {
            let Some(wanted) = vary::variance_key(&meta.header, req) else {
                return Lookup::Decline;
            };
            if wanted == stored {
                CompleteObject::detached(meta, body)
            } else {
                key.set_variance_key(wanted);
                match tier.read_and_promote(&key).await {
                    Some((variant, body)) if variant_is_current(&variant, &meta, wanted) => {
                        CompleteObject::detached(variant, body)
                    }
                    _ => return Lookup::Decline,
                }
            }
        }
    };
    fresh_or_decline(hit, now)
}

/// How often a request waiting for another node's fill looks for it.
const FILL_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// What a request whose URL memcached does not have should do.
pub enum AfterSharedMiss {
    /// Another node (or a request on this one) filled it while this request waited: serve it.
    Filled(CompleteObject),
    /// Fetch it on the standard path. `holds_lease`: this request took the cluster's fill lease
    /// and must release it if the fill stores nothing. `known_missing`: memcached still has
    /// nothing under the URL, so the standard path need not ask it again.
    FillHere {
        holds_lease: bool,
        known_missing: bool,
    },
}

/// After memcached had nothing for the URL: claims the fill for this request, or, when another
/// node (or another request here) holds the cluster's fill lease, waits for that fill to reach
/// this node's memory tier or memcached, and serves it (see [`TieredStorage::claim_fill`]). A
/// page rendered once is then rendered once for the whole cluster, not once per node. The wait
/// ends when the fill arrives, when the lease is released or expires (then this request fetches
/// for itself), or when what arrives is something the standard path must decide.
pub async fn after_shared_miss(
    memory: &MemoryTier,
    tier: &TieredStorage,
    req: &RequestHeader,
) -> AfterSharedMiss {
    let key = cache_key_for(req);
    match tier.claim_fill(&key).await {
        FillClaim::Ours => {
            return AfterSharedMiss::FillHere {
                holds_lease: true,
                known_missing: true,
            }
        }
        FillClaim::Uncoordinated | FillClaim::ThisNode => {
            return AfterSharedMiss::FillHere {
                holds_lease: false,
                known_missing: true,
            }
        }
        FillClaim::Theirs => {}
    }
    let deadline = std::time::Instant::now() + tier.fill_lease();
    let decide_elsewhere = AfterSharedMiss::FillHere {
        holds_lease: false,
        known_missing: false,
    };
    loop {
        tokio::time::sleep(FILL_POLL).await;
        let now = SystemTime::now();
        let found = match lookup(memory, req, now) {
            Lookup::Absent => shared_lookup(tier, req, now).await,
            found => found,
        };
        match found {
            Lookup::Fresh(hit) => {
                tier.counters
                    .fills_awaited
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return AfterSharedMiss::Filled(hit);
            }
            Lookup::Decline => return decide_elsewhere,
            Lookup::Absent => {}
        }
        if std::time::Instant::now() >= deadline || !tier.fill_still_claimed(&key).await {
            return AfterSharedMiss::FillHere {
                holds_lease: false,
                known_missing: true,
            };
        }
    }
}

/// Whether a variant found under its own key may be served: it carries the variance asked for
/// and was created no earlier than the object in the primary slot. This is Pingora's tombstone
/// rule (`valid_after` in `pingora_cache::HttpCache::cache_vary_lookup`), applied the same way
/// here so both paths agree: purging a URL deletes only the primary slot, and whatever fills it
/// next retires every variant stored before the purge, in memcached as in memory.
pub fn variant_is_current(
    variant: &crate::storage::object::StoredMeta,
    primary: &crate::storage::object::StoredMeta,
    wanted: pingora_cache::key::HashBinary,
) -> bool {
    variant.variance == Some(wanted) && variant.created >= primary.created
}

fn fresh_or_decline(hit: CompleteObject, now: SystemTime) -> Lookup {
    if hit.meta().fresh_until > now {
        Lookup::Fresh(hit)
    } else {
        Lookup::Decline
    }
}

/// Stored gzip bodies up to this size are decoded whole on the fast path for a client that does
/// not take gzip; larger ones stream through the decoder on the standard path.
pub const WHOLE_DECODE_MAX_STORED: usize = 64 * 1024;

/// The most a body decoded whole on the fast path may decode to (a bound on the buffer a small,
/// highly compressed body could become).
pub const WHOLE_DECODE_MAX_DECODED: usize = 1024 * 1024;

/// For a client that does not take the stored gzip copy: the body decoded whole, with `head`
/// rewritten for it (see [`compression::rewrite_head_for_decoded_body`]) and carrying the decoded
/// `Content-Length`, so head and body leave in one write instead of chunked pieces. `None` for
/// HEAD, large bodies and bodies that are not valid gzip: the standard path streams those.
///
/// With `copies`, a body decoded once is kept there and served again while the stored object is
/// the same one (see [`DecodedCopies`]).
pub fn decode_for_identity_client(
    hit: &CompleteObject,
    req: &RequestHeader,
    head: &mut ResponseHeader,
    copies: Option<&DecodedCopies>,
) -> Option<bytes::Bytes> {
    if req.method == http::Method::HEAD || hit.body_len() > WHOLE_DECODE_MAX_STORED {
        return None;
    }
    let kept = copies.map(|copies| {
        let of = StoredIdentity {
            primary: cache_key_for(req).primary_bin(),
            variance: hit.meta().variance,
            created: hit.meta().created,
        };
        (copies, of)
    });
    let plain = match kept.and_then(|(copies, of)| copies.get(&of)) {
        Some(plain) => plain,
        None => {
            let plain = gunzip_complete(hit.chunks(), WHOLE_DECODE_MAX_DECODED)?;
            if let Some((copies, of)) = kept {
                copies.put(of, plain.clone());
            }
            plain
        }
    };
    compression::rewrite_head_for_decoded_body(head);
    head.insert_header(header::CONTENT_LENGTH, plain.len())
        .ok()?;
    Some(plain)
}

/// Builds the response head for a fast hit: the stored head, `Age` (RFC 9111 §4), and chunked
/// framing when the stored response has no length. Returns the head and the remaining TTL.
pub fn response_head(hit: &CompleteObject, now: SystemTime) -> (Box<ResponseHeader>, i64) {
    let meta = hit.meta();
    let mut head = Box::new(meta.header.clone());
    let age = now
        .duration_since(meta.epoch)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let _ = head.insert_header(header::AGE, age);
    head.set_version(http::Version::HTTP_11);
    let no_body = matches!(head.status.as_u16(), 204 | 304);
    if !no_body && !head.headers.contains_key(header::CONTENT_LENGTH) {
        let _ = head.insert_header(header::CONTENT_LENGTH, hit.body_len());
    }
    let ttl = meta
        .fresh_until
        .duration_since(now)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    (head, ttl)
}
