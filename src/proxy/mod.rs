//! The proxy: Lacquer's request path as Pingora's phase-named callbacks.
//!
//! [`LacquerProxy`] is a dispatcher: each phase hands the request to the module that owns the
//! concern, and [`RequestCtx`] carries what they learn from phase to phase. In the order a request
//! meets them (see the picture in `docs/architecture.md`):
//!
//! 1. `request_filter`: [`request_head`] checks what Pingora leaves unchecked in the head (the
//!    authority, the target form; refused: 400), sends one `Content-Length` on, and notes a GET or
//!    HEAD with a body (never cached); [`forwarding`] resolves the scheme (for the key) and, when
//!    asked, the client address through trusted proxies; [`purge`] answers a PURGE (refused: 405;
//!    allowed: carried out across the cluster by `crate::invalidation`); the request rules
//!    (`crate::rules`) are applied; [`fast_hit`] answers fresh, plain hits from storage without
//!    Pingora's cache machinery.
//! 2. `request_cache_filter`: whether the cache is used at all (method, client `no-store`,
//!    config); if so, it is enabled with our storage and the cache lock, which a URL last
//!    answered uncacheable skips on a miss ([`hit_for_miss`]; a stored copy found puts it back).
//! 3. `cache_key_callback`: the key from [`cache_key`] (built once per request);
//!    `cache_vary_filter` adds the variant (`policy::vary`); `cache_hit_filter` applies the
//!    client's directives (`policy::request_directives`).
//! 4. Lookup (Pingora's state machine): a fresh hit is served from storage; concurrent misses wait
//!    on the cache lock so one origin fetch fills the cache for all of them.
//! 5. `proxy_upstream_filter` … `upstream_response_body_filter`: `only-if-cached`, fairness, the
//!    attempts, retries and passive health of `crate::upstream` (and, in `fail_to_proxy`, its
//!    status for a request that failed: 504 on a timeout); a retry never meets the failed
//!    attempt's cache write ([`retried_fill`]); forwarding headers and `Via` ([`headers`]);
//!    [`invalidation`] by unsafe methods; `crate::compression` on the way in.
//!    An interim (1xx) response passes these phases and `response_filter` too, and is handed to
//!    [`interim`] alone: it is forwarded, never stored or judged.
//!    With `[cache.partial]`, [`partial_content`] answers a range from a stored part first,
//!    and otherwise asks the origin for a range and stores the `206` (through to the
//!    downstream phases, which serve a range spanning a part and a fetched tail).
//! 6. `response_cache_filter`: the [`CachePolicy`](crate::policy::CachePolicy) decides whether and how long to store.
//! 7. `response_filter`: `Cache-Status` ([`cache_status`]) and `Via` ([`our_fields`]) on every
//!    response, fields meant for this cache only removed ([`headers::ForUsOnly`]),
//!    `crate::compression` on the way out; `logging` ends the fill lease this request holds, counts the request
//!    ([`metrics_record`]) and writes the [`access_record`].
//!
//! A program that embeds Lacquer adds its own code to phases 1 and 7 through [`hooks`].

pub mod access_record;
pub mod cache_key;
pub mod cache_status;
pub mod direct_pass;
pub mod error_answer;
pub mod fast_hit;
pub mod fill_relay;
pub mod forwarding;
pub mod headers;
pub mod hit_for_miss;
pub mod hooks;
pub mod interim;
pub mod invalidation;
pub mod metrics_record;
pub mod our_fields;
pub mod partial_content;
pub mod post_reuse;
pub mod purge;
pub mod request_head;
pub mod retried_fill;
pub mod upgrade;

use crate::compression::decoded_copies::DecodedCopies;
use crate::compression::{self, CompressionCtx};
use crate::invalidation::Invalidator;
use crate::lifecycle::drain::{InFlightRequests, RequestInFlight};
use crate::lifecycle::live::{Live, LiveSettings, Settings};
use crate::observe::access_log::AccessLog;
use crate::observe::metrics::RequestMetrics;
use crate::policy::request_directives::RequestDirectives;
use crate::policy::{freshness, preconditions, revalidation, vary};
use crate::rules;
use crate::storage::fill_lease::{
    BesideThisNode, FetchedUnderAnotherClaim, HeldLease, LeaseHolder, MissClaim,
};
use crate::storage::memory::{self, owner_holds_back_origin, MemoryTier};
use crate::storage::tier::Tier;
use crate::storage::tiered::{PrimaryKnownMissing, TieredStorage};
use crate::upstream::idle_connections::IdleConnections;
use crate::upstream::{RequestUpstream, Upstream};
use async_trait::async_trait;
use cache_key::RequestKey;
use cache_status::{CacheStatus, Observations};
use fast_hit::FastHit;
use partial_content::{PartialContent, PartialCtx};
use pingora_cache::cache_control::CacheControl;
use pingora_cache::key::HashBinary;
use pingora_cache::lock::{CacheKeyLockImpl, CacheLock};
use pingora_cache::storage::HitHandler;
use pingora_cache::storage::Storage;
use pingora_cache::{CacheKey, CacheMeta, CacheOptionOverrides, ForcedFreshness, RespCacheable};
use pingora_core::connectors::TransportConnector;
use pingora_core::modules::http::HttpModules;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use purge::PurgeRequest;
use request_head::Admitted;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use upgrade::UpgradeRequest;

/// Per-request state carried between phases.
pub struct RequestCtx {
    started: Instant,
    request_time: SystemTime,
    /// The cache key, built on first use (see [`cache_key`]).
    key: RequestKey,
    /// Whether this request is a PURGE, and whether its client may purge (see [`purge`]).
    purge: PurgeRequest,
    /// What the checks of the request head found (see [`request_head`]).
    head: Admitted,
    seen: Observations,
    directives: RequestDirectives,
    cache_status: Option<CacheStatus>,
    /// The fast path looked the URL up in memcached and found nothing there.
    shared_primary_missing: bool,
    /// The fast path found nothing stored under the URL, in any tier (see [`direct_pass`]).
    nothing_stored: bool,
    /// This pass was forwarded directly ([`direct_pass`]; counted in `/metrics`).
    direct_pass: bool,
    /// This miss is forwarded directly ([`direct_pass`]): its origin request and answer are a
    /// miss's (the coding the cache asks for, compression on store), though Pingora's cache
    /// phases are not enabled for it.
    direct_miss: bool,
    /// The cluster's fill lease for this URL, when this request holds it (ended in `logging`).
    fill_lease: Option<HeldLease>,
    /// The fast path looked this request's URL up in memcached and settled its fill lease
    /// (claimed, waited for, or none to claim): the standard path's miss does not claim it
    /// again ([`FillLeases::claim_for_miss`](crate::storage::fill_lease::FillLeases::claim_for_miss)).
    shared_miss_decided: bool,
    /// This request's fetch goes out under a fill lease it does not hold: another node's claim
    /// (its answer marked so that its fill is refused, or kept only while that claim's lease
    /// stands, [`RequestCtx::mark_if_held_elsewhere`]), or another request's here, counted while
    /// it lasts. Boxed: rare, and the context is moved with every request (held by value, these
    /// cost a `no-store` pass about 300 instructions).
    fetched_beside: Option<Box<FetchedBeside>>,
    /// This miss of a URL remembered uncacheable ([`hit_for_miss`]) went to the origin with no
    /// lease claimed (the fast path claims none for such a URL): a storable answer is refused as
    /// one fetched under another claim is ([`RequestCtx::mark_if_held_elsewhere`]). A POST
    /// through another node meanwhile found neither an entry nor a lease and was published to
    /// no one; the URL, forgotten by that answer, is stored by its next miss, which claims.
    /// (Counted `fills_under_another_claim` with those.)
    remembered_unguarded: bool,
    /// The client's `If-Match` / `If-Unmodified-Since` failed against the stored response.
    precondition_failed: bool,
    /// The stored response a 304 was made of goes to this client decoded (it does not take the
    /// stored coding): the 304 carries the decoded body's weak tag and `Vary`.
    not_modified_decoded: bool,
    /// The stored `ETag`, when the origin's 304 named another representation: the stored
    /// response served this once goes out under it, not under the 304's.
    etag_as_stored: Option<http::HeaderValue>,
    /// The origin's 304 to our revalidation, whose fields update the stored head.
    not_modified: Option<Box<ResponseHeader>>,
    compression: CompressionCtx,
    /// What partial content does for this request (see [`partial_content`]).
    partial: PartialCtx,
    /// Backends tried, the one in flight, the fairness slot, timings (see [`crate::upstream`]).
    upstream: RequestUpstream,
    /// The tier the stored response was found in (fast path, or `cache_hit_filter`).
    tier: Option<Tier>,
    /// A POST response being kept for later GETs of its URL (see [`post_reuse`]).
    post_reuse: Option<Box<post_reuse::PostReuse>>,
    /// What the request rules decided for this request (see `crate::rules`).
    rules: rules::Verdict,
    /// Counts this request until it ends, so a draining process waits for it.
    _in_flight: RequestInFlight,
    /// Whether the client asks to switch protocols (see [`upgrade`]); decided in
    /// `request_filter` for requests the fast path declined.
    upgrade: UpgradeRequest,
    /// The cache was enabled without the lock: the URL answered uncacheable last time
    /// ([`hit_for_miss`]).
    lock_skipped: bool,
    /// The read-ahead budget this standard-path request holds, its answer written as proxy
    /// tasks ([`fill_relay::Reservation`]); given back when the request ends.
    read_ahead: Option<fill_relay::Reservation>,
    /// The settings this request started with, kept once it goes past the fast path: every
    /// later phase reads them ([`Live::as_held`]), whatever a reload stored meanwhile.
    settings: Option<Arc<LiveSettings>>,
}

/// The fill lease a request's fetch goes out under without holding it ([`RequestCtx::fetched_beside`]).
enum FetchedBeside {
    /// Another node's claim's ([`MissClaim::Elsewhere`], or
    /// [`AfterSharedMiss::UnderAnotherClaim`](crate::storage::fill_lease::AfterSharedMiss::UnderAnotherClaim)):
    /// how its answer is marked.
    AnotherClaim(FetchedUnderAnotherClaim),
    /// Another request's on this node ([`MissClaim::BesideThisNode`]), counted while held.
    ThisNodesClaim { _counted: BesideThisNode },
}

/// Why a miss's answer fetched while another claim held the URL's fill lease is served and not
/// kept ([`MissClaim::Elsewhere`]): `Cache-Status: ...; fwd=miss; detail=fill-elsewhere`.
const FILL_HELD_ELSEWHERE: &str = "fill-elsewhere";

/// Why a remembered-uncacheable URL's storable answer, fetched with no lease, is served and not
/// kept ([`RequestCtx::remembered_unguarded`]): `Cache-Status: ...; detail=fill-unguarded`.
const FILL_UNGUARDED: &str = "fill-unguarded";

/// The most ranges one request may name and be answered as `multipart/byteranges`; more, and the
/// whole body is sent (Pingora's range filter). The same on the fast path and the standard one.
pub(crate) const RANGES_MAX: usize = 200;

impl RequestCtx {
    /// How this request's answer is marked for a fetch under another node's claim, if it went
    /// out under one ([`FetchedBeside::AnotherClaim`]).
    fn fill_held_elsewhere(&self) -> Option<FetchedUnderAnotherClaim> {
        match self.fetched_beside.as_deref() {
            Some(FetchedBeside::AnotherClaim(mark)) => Some(*mark),
            _ => None,
        }
    }

    /// This request's fetch goes out under another node's claim, its answer to be marked `mark`.
    fn fetch_under_another_claim(&mut self, mark: FetchedUnderAnotherClaim) {
        self.fetched_beside = Some(Box::new(FetchedBeside::AnotherClaim(mark)));
    }

    /// A storable answer of a miss that another claim's lease guarded ([`MissClaim::Elsewhere`])
    /// is marked in its meta ([`FetchedUnderAnotherClaim`]) so that the tiered store refuses its
    /// fill when it finishes: the requests reading it are served, nothing is kept. One fetched
    /// after waiting for that claim as long as it may is marked to be kept only if that claim's
    /// lease still stands then, which only the fill's end can tell (its `Cache-Status` says
    /// nothing of it). (Only this fill: what the URL is remembered as, `hit_for_miss`, is the
    /// policy's decision.)
    fn mark_if_held_elsewhere(&mut self, decision: &mut RespCacheable) {
        if let RespCacheable::Cacheable(meta) = decision {
            let (mark, reason) = match (self.fill_held_elsewhere(), self.remembered_unguarded) {
                (Some(refused @ FetchedUnderAnotherClaim::Refused(_)), _) => {
                    (refused, FILL_HELD_ELSEWHERE)
                }
                // fetched under no lease at all
                (_, true) => (
                    FetchedUnderAnotherClaim::Refused(LeaseHolder::Nobody),
                    FILL_UNGUARDED,
                ),
                (Some(kept_while), false) => {
                    meta.extensions_mut().insert(kept_while);
                    return;
                }
                (None, false) => return,
            };
            meta.extensions_mut().insert(mark);
            self.seen.storable = false;
            self.seen.not_stored_reason = Some(reason);
        }
    }

    /// The answer will not be stored (judged uncacheable, or its fill abandoned): the cluster's
    /// fill lease, when this request holds it, is given up now ([`HeldLease::on_not_stored`]).
    fn give_up_fill_lease(&mut self) {
        if let Some(lease) = self.fill_lease.take() {
            lease.on_not_stored();
        }
    }
}

/// Lacquer's implementation of Pingora's [`ProxyHttp`].
pub struct LacquerProxy {
    /// The settings a reload replaces (config, policy, `Via`, upstream choices, fairness): each
    /// phase loads them once (see [`crate::lifecycle::live`]).
    live: Arc<Live>,
    /// Where Pingora's cache state machine stores and looks up: the memory tier alone, or the
    /// tiered store when a memcached cluster is configured.
    storage: &'static (dyn Storage + Sync),
    /// The tiered store in front of memcached, when one is configured: its fill leases, for the
    /// misses the fast path declined.
    tiered: Option<&'static TieredStorage>,
    /// The tiered store's view for requests whose URL the fast path already found missing in
    /// memcached.
    known_missing: Option<&'static PrimaryKnownMissing>,
    /// The hot-hit fast path (`None` when the cache is disabled).
    fast_hit: Option<FastHit>,
    /// Partial content (`None` unless the cache and `[cache.partial]` are enabled).
    partial: Option<PartialContent>,
    cache_lock: &'static CacheKeyLockImpl,
    /// The URLs last answered uncacheable, whose misses skip the lock ([`hit_for_miss`]).
    uncacheable: &'static hit_for_miss::UncacheableUrls,
    access_log: Option<Arc<AccessLog>>,
    /// Requests in flight, for the drain.
    in_flight: &'static InFlightRequests,
    /// Every finished request is counted here (read by `/metrics` and the status page).
    metrics: &'static RequestMetrics,
    /// Purges (PURGE, unsafe methods) carried out across the cluster.
    invalidator: &'static Invalidator,
    /// The embedding program's own phase hooks (none in the `lacquer` binary).
    hooks: Option<Arc<dyn hooks::PhaseHooks>>,
    /// Idle connections to the origins, for passes forwarded directly ([`direct_pass`]).
    idle_upstream: &'static IdleConnections,
    /// Makes the new origin connections of passes forwarded directly.
    upstream_connector: TransportConnector,
    /// What direct misses hold for clients slower than their fill ([`fill_relay`]).
    read_ahead: &'static fill_relay::ReadAheadBudget,
    /// What the standard path's misses reserve for clients slower than their fill, a whole
    /// object each (see `cache_miss`); apart from `read_ahead`, so neither starves the other.
    standard_read_ahead: &'static fill_relay::ReadAheadBudget,
}

impl LacquerProxy {
    /// `upstream_response_body_filter`'s work, which needs no session: the direct path's fill
    /// relay runs it in a half that has none ([`fill_relay`]).
    fn on_upstream_body(
        &self,
        ctx: &mut RequestCtx,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
    ) -> Result<()> {
        let live = self.settings(ctx);
        live.upstream.on_body(&ctx.upstream)?;
        if end_of_stream {
            // the origin is done with this request: its `max_in_flight` slot is free now, not
            // once the client has taken the rest
            live.upstream.on_body_end(&mut ctx.upstream);
        }
        post_reuse::on_upstream_body(
            &mut ctx.post_reuse,
            body,
            end_of_stream,
            live.policy.max_object_size(),
        );
        compression::on_upstream_body(&mut ctx.compression, body, end_of_stream)?;
        if let Some(partial) = &self.partial {
            partial.on_upstream_body(&mut ctx.partial, body, end_of_stream);
        }
        Ok(())
    }

    /// `response_body_filter`'s work, which needs no session (as [`Self::on_upstream_body`]).
    fn on_downstream_body(
        &self,
        ctx: &mut RequestCtx,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
    ) -> Result<()> {
        compression::on_downstream_body(&mut ctx.compression, body, end_of_stream)?;
        partial_content::on_downstream_body(&mut ctx.partial, body);
        Ok(())
    }

    /// For Lacquer's own relays: writes `data`, the body's next chunk (`ended`: its last), of a
    /// body decoded for the client as it passes (`compression::decodes_in_pieces`), piece by
    /// piece, each of a bounded size. Any other body is written as the filter returns it.
    async fn write_decoded_body(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        mut data: Option<bytes::Bytes>,
        ended: bool,
    ) -> Result<()> {
        loop {
            let more = self.on_downstream_body_in_pieces(ctx, &mut data, ended)?;
            session
                .write_response_body(data.take(), ended && !more)
                .await?;
            if !more {
                return Ok(());
            }
        }
    }

    /// [`Self::on_downstream_body`] for Lacquer's own relays, which write each piece of a body
    /// decoded for the client themselves (`compression::on_downstream_body_in_pieces`): `true`
    /// while more pieces follow (call again with `None`; write the end only with the last).
    fn on_downstream_body_in_pieces(
        &self,
        ctx: &mut RequestCtx,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
    ) -> Result<bool> {
        let more =
            compression::on_downstream_body_in_pieces(&mut ctx.compression, body, end_of_stream)?;
        partial_content::on_downstream_body(&mut ctx.partial, body);
        Ok(more)
    }

    /// Builds the proxy around already created storage (shared with the admin endpoint): the
    /// memory tier, and the tiered store in front of memcached when one is configured.
    pub fn new(
        live: Arc<Live>,
        memory: &'static MemoryTier,
        tiered: Option<&'static TieredStorage>,
        invalidator: &'static Invalidator,
        access_log: Option<Arc<AccessLog>>,
        in_flight: &'static InFlightRequests,
    ) -> Self {
        let settings = live.load_full();
        let config = &settings.config;
        let lock: &'static CacheLock = Box::leak(CacheLock::new_boxed(config.cache.lock_timeout));
        let storage: &'static (dyn Storage + Sync) = match tiered {
            Some(tiered) => tiered,
            None => memory,
        };
        let known_missing = tiered.map(|tier| {
            let view: &'static PrimaryKnownMissing =
                Box::leak(Box::new(PrimaryKnownMissing::new(tier)));
            view
        });
        let uncacheable = hit_for_miss::UncacheableUrls::leak();
        let fast_hit = config.cache.enabled.then(|| {
            let decoded_copies = DecodedCopies::new(config.cache.compression.decoded_copies)
                .map(|copies| &*Box::leak(Box::new(copies)));
            FastHit::new(memory, tiered, decoded_copies, uncacheable)
        });
        let partial = (config.cache.enabled && config.cache.partial.enabled)
            .then(|| PartialContent::new(memory, tiered));
        LacquerProxy {
            tiered,
            known_missing,
            fast_hit,
            partial,
            live,
            invalidator,
            hooks: None,
            storage,
            cache_lock: lock,
            uncacheable,
            access_log,
            in_flight,
            metrics: RequestMetrics::leak(),
            idle_upstream: Box::leak(Box::new(IdleConnections::new(
                config.upstream_keepalive_pool,
            ))),
            upstream_connector: TransportConnector::new(None),
            read_ahead: fill_relay::ReadAheadBudget::leak(config.cache.memory_size / 4),
            standard_read_ahead: fill_relay::ReadAheadBudget::leak(config.cache.memory_size / 4),
        }
    }

    /// A miss about to go to the origin whose fill lease the fast path did not settle (it
    /// declined the request, or found another request here holding the URL) claims the lease
    /// first ([`FillLeases::claim_for_miss`](crate::storage::fill_lease::FillLeases::claim_for_miss)),
    /// on the standard path and the direct one alike.
    ///
    /// So does a request that waited two leases for another claim's fill and goes to the
    /// origin under that claim's lease
    /// ([`AfterSharedMiss::UnderAnotherClaim`](crate::storage::fill_lease::AfterSharedMiss::UnderAnotherClaim)):
    /// queued on this node's cache lock behind the first such fetch, whose fill was refused (that
    /// claim's lease went meanwhile: its fill failed, or landed), it goes to the origin after it,
    /// and the URL may be free by then. Claimed, its fill is guarded by its own lease and kept;
    /// still held by a claim elsewhere, it stays kept only while the lease names the holder it
    /// waited on. Before (found 2026-12-07 by a breaker helper), each such request fetched with
    /// no claim and was refused in turn, one origin fetch per request of the crowd
    /// (`tests/kept_while_held_breaks.rs`).
    async fn claim_unsettled_lease(&self, session: &Session, ctx: &mut RequestCtx) {
        if let Some(tier) = self.tiered {
            let under_another_claim = matches!(
                ctx.fill_held_elsewhere(),
                Some(FetchedUnderAnotherClaim::KeptWhileHeldBy(_))
            );
            if ctx.fill_lease.is_none() && (!ctx.shared_miss_decided || under_another_claim) {
                let key = ctx.key.get(session.req_header());
                match Box::pin(tier.fill_leases().claim_for_miss(key)).await {
                    MissClaim::Held(lease) => {
                        ctx.fill_lease = Some(lease);
                        if under_another_claim {
                            ctx.fetched_beside = None;
                        }
                    }
                    // a claim under which it already fetches keeps its mark: kept only while
                    // that lease names the holder it waited on
                    MissClaim::Elsewhere if under_another_claim => {}
                    MissClaim::Elsewhere => {
                        // read right after the claim found it: the fill is joined only while
                        // the lease names this holder (`storage::guarded_fills`)
                        let holder = Box::pin(tier.fill_leases().holder_now(key)).await;
                        ctx.fetch_under_another_claim(FetchedUnderAnotherClaim::Refused(holder))
                    }
                    // (a mark of refusal an earlier attempt of this request got stays)
                    MissClaim::BesideThisNode(beside)
                        if under_another_claim || ctx.fill_held_elsewhere().is_none() =>
                    {
                        ctx.fetched_beside =
                            Some(Box::new(FetchedBeside::ThisNodesClaim { _counted: beside }))
                    }
                    MissClaim::BesideThisNode(_) => {}
                    MissClaim::Unclaimed => {}
                }
            }
        }
    }

    /// The proxy with an embedding program's [`hooks::PhaseHooks`] in its phases.
    pub fn with_hooks(mut self, hooks: Arc<dyn hooks::PhaseHooks>) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// Adds what every downstream response carries, on both the fast and the standard path:
    /// `Cache-Status` and our `Via`, minus the targeted fields configured to be stripped (RFC
    /// 9213: by default our own); keeps the classification for the access log.
    fn finish_response_head(
        &self,
        live: &LiveSettings,
        head: &mut ResponseHeader,
        req: &RequestHeader,
        status: CacheStatus,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let request_version = req.version;
        live.for_us_only.strip(head);
        live.rules.on_downstream_head(&ctx.rules, head);
        if let Some(hooks) = &self.hooks {
            hooks.response_filter(req, head)?;
        }
        let status = status.served_from(ctx.tier);
        our_fields::add_to_head(live, &status, request_version, head)?;
        ctx.cache_status = Some(status);
        Ok(())
    }

    /// `response_filter`'s work on a final response head, with the cache phase to classify it
    /// by given: Pingora's for the standard path, the one it would be in for a pass forwarded
    /// directly ([`direct_pass`]).
    async fn finish_forwarded_head(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
        phase: pingora_cache::CachePhase,
        ttl: Option<i64>,
    ) -> Result<()> {
        if interim::is_interim(upstream_response) {
            let live = self.settings(ctx);
            let version = session.req_header().version;
            interim::on_downstream_interim(
                upstream_response,
                live.config.proxy.via.then(|| live.via.for_version(version)),
            );
            return Ok(());
        }
        if ctx.precondition_failed && upstream_response.status == http::StatusCode::NOT_MODIFIED {
            preconditions::to_precondition_failed(upstream_response);
        } else if ctx.not_modified_decoded
            && upstream_response.status == http::StatusCode::NOT_MODIFIED
        {
            // the 304 carries the validators of the 200 this client would get: the decoded
            // body's (RFC 9110 §15.4.5; Pingora made it without `Content-Encoding`, so the
            // compression room below no longer sees that this client gets it decoded)
            compression::rewrite_head_for_decoded_body(upstream_response);
        }
        if let Some(tag) = ctx.etag_as_stored.take() {
            // a 304 of another representation updated nothing: the stored bytes keep their tag
            let _ = upstream_response.insert_header(http::header::ETAG, tag);
        }
        let mut status = CacheStatus::classify(phase, &ctx.seen, ctx.upstream.status(), ttl);
        partial_content::on_cache_status(&ctx.partial, &mut status);
        partial_content::on_downstream_head(&ctx.partial, upstream_response)?;
        let stored_body = whole_stored_body_to_decode(session, upstream_response);
        compression::on_downstream_head(
            &mut ctx.compression,
            session.req_header(),
            upstream_response,
            stored_body.as_deref(),
        )?;
        if let Some(reader) = body_reader(session) {
            // a body sent from storage is decoded in its reader, in bounded pieces
            compression::decode_in_reader(&mut ctx.compression, reader);
        }
        let live = self.settings(ctx);
        self.finish_response_head(&live, upstream_response, session.req_header(), status, ctx)
    }

    /// The origin pool (its backends shared with the health checker).
    pub fn upstream(&self) -> Upstream {
        self.live.load().upstream.clone()
    }

    /// The request counters (shared with the admin listener).
    pub fn metrics(&self) -> &'static RequestMetrics {
        self.metrics
    }

    /// What direct misses hold for clients slower than their fill (for `/metrics`).
    pub fn read_ahead(&self) -> [&'static fill_relay::ReadAheadBudget; 2] {
        [self.read_ahead, self.standard_read_ahead]
    }

    /// The decoded copies of small gzip bodies, when kept (for `/metrics`).
    pub fn decoded_copies(&self) -> Option<&'static DecodedCopies> {
        self.fast_hit.as_ref().and_then(FastHit::decoded_copies)
    }

    /// The settings `ctx`'s request reads in this phase: the ones it started with.
    fn settings(&self, ctx: &RequestCtx) -> Settings {
        self.live.as_held(ctx.settings.as_ref())
    }

    fn lock_overrides(live: &LiveSettings) -> CacheOptionOverrides {
        let mut overrides = CacheOptionOverrides::default();
        overrides.wait_timeout = Some(live.config.cache.lock_timeout);
        overrides
    }
}

/// The whole stored body of the hit `session` is serving, when `resp` must be decoded for its
/// client and the body is small enough to decode at once (`compression::decode`): a standard-path
/// hit then goes out with its decoded length, as the fast path sends it. `None` otherwise (no hit
/// in this phase, an in-flight fill, a range, a larger body).
fn whole_stored_body_to_decode(
    session: &mut Session,
    resp: &ResponseHeader,
) -> Option<Vec<bytes::Bytes>> {
    // the phase first: a miss or a pass pays no header lookup here
    if !serves_a_stored_hit(&session.cache.phase()) {
        return None;
    }
    compression::needs_decoding(session.req_header(), resp)?;
    memory::whole_body_within(
        session.cache.hit_handler(),
        compression::decode::WHOLE_DECODE_MAX_STORED,
    )
}

/// Whether a response in cache `phase` is a stored object's, sent from its hit handler: a hit,
/// a stale one, or one revalidated.
fn serves_a_stored_hit(phase: &pingora_cache::CachePhase) -> bool {
    use pingora_cache::CachePhase;
    matches!(
        phase,
        CachePhase::Hit
            | CachePhase::Stale
            | CachePhase::StaleUpdating
            | CachePhase::Revalidated
            | CachePhase::RevalidatedNoCache(_)
    )
}

/// The reader the standard path sends this response's body from, when it sends it from storage:
/// a hit's (or a stale or revalidated one's), or a filling miss's own reader of its fill.
fn body_reader(session: &mut Session) -> Option<&mut pingora_cache::storage::HitHandler> {
    use pingora_cache::CachePhase;
    match session.cache.phase() {
        phase if serves_a_stored_hit(&phase) => Some(session.cache.hit_handler()),
        CachePhase::Miss | CachePhase::Expired => session.cache.miss_body_reader(),
        _ => None,
    }
}

/// A request that ended in an error after its answer's head went out, in an answer delimited by
/// the connection's close (see [`client_socket_of_a_close_delimited_answer`]): the connection is
/// reset when it closes, not ended with a FIN, which would tell the client its answer was whole
/// (RFC 9112 §8). Answers framed by a length or by chunks show their cut themselves; HTTP/2
/// streams are reset by Pingora.
fn reset_if_cut_short_by_close(session: &Session) {
    if let Some(socket) = client_socket_of_a_close_delimited_answer(session) {
        let _ = socket.reset_on_close();
    }
}

/// The client's socket, when the answer whose head went out to it is delimited by the
/// connection's close (no `Content-Length`, and not chunked: an HTTP/1.0 client's decoded body,
/// an origin's close-delimited answer), so that a cut of it must be a reset.
pub(crate) fn client_socket_of_a_close_delimited_answer(
    session: &Session,
) -> Option<&pingora_core::protocols::SocketDigest> {
    let head = session.response_written()?;
    let client = session.req_header().version;
    if client == http::Version::HTTP_2 || head.headers.contains_key(http::header::CONTENT_LENGTH) {
        return None;
    }
    let chunked = head.headers.contains_key(http::header::TRANSFER_ENCODING);
    if chunked && client != http::Version::HTTP_10 {
        return None;
    }
    session
        .downstream_session
        .digest()
        .and_then(|digest| digest.socket_digest.as_deref())
}

/// The client's address as [`forwarding`] resolves it through the trusted proxies of the settings
/// the phase already loaded: the one `purge_from`, fairness and the access log judge.
fn client_ip(session: &Session, live: &LiveSettings) -> Option<IpAddr> {
    forwarding::client_ip(session, &live.config.proxy.trusted_proxies)
}

#[async_trait]
impl ProxyHttp for LacquerProxy {
    type CTX = RequestCtx;

    /// No downstream modules: Pingora's default adds its response compression module at level 0
    /// (off), which Lacquer never turns on (its own `compression` room encodes), yet every
    /// request built it (two allocations) and ran its filters (a boxed future per phase).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    fn new_ctx(&self) -> Self::CTX {
        RequestCtx {
            started: Instant::now(),
            request_time: SystemTime::now(),
            key: RequestKey::default(),
            purge: PurgeRequest::None,
            head: Admitted::default(),
            seen: Observations::default(),
            directives: RequestDirectives::default(),
            cache_status: None,
            shared_primary_missing: false,
            nothing_stored: false,
            direct_pass: false,
            direct_miss: false,
            fill_lease: None,
            shared_miss_decided: false,
            fetched_beside: None,
            remembered_unguarded: false,
            precondition_failed: false,
            not_modified_decoded: false,
            etag_as_stored: None,
            not_modified: None,
            compression: CompressionCtx::default(),
            partial: PartialCtx::default(),
            upstream: RequestUpstream::default(),
            post_reuse: None,
            rules: rules::Verdict::default(),
            tier: None,
            _in_flight: self.in_flight.start(),
            upgrade: UpgradeRequest::None,
            lock_skipped: false,
            read_ahead: None,
            settings: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        ctx.head = match request_head::on_request(session) {
            Ok(admitted) => admitted,
            // boxed: the refusal's write is rare, and kept out of this future's size
            Err(why) => return Box::pin(request_head::refuse(session, why)).await,
        };
        let live = self.live.load();
        // every write of the answer, hit or forwarded, waits at most this long for the client
        session.set_write_timeout(Some(live.config.client_limits.send_timeout));
        if forwarding::is_https(session, &live.config.proxy.trusted_proxies) {
            ctx.key.set_https();
        }
        ctx.purge = purge::on_request(
            &session.req_header().method,
            || client_ip(session, &live),
            &live.config.cache.purge_from,
        );
        match ctx.purge {
            PurgeRequest::None => {}
            // boxed: the refusal's write is rare, and kept out of this future's size
            PurgeRequest::Refused => return Box::pin(purge::refuse(session)).await,
            PurgeRequest::Allowed => {
                let client = client_ip(session, &live);
                let enabled = live.config.cache.enabled;
                let https = ctx.key.is_https();
                let rules = &live.rules;
                // boxed: a purge's future stays out of every other request's
                let purge =
                    purge::carry_out(session, self.invalidator, enabled, client, https, rules);
                return Box::pin(purge).await;
            }
        }
        ctx.rules = live.rules.on_request(session.req_header_mut());
        if let Some(hooks) = &self.hooks {
            if hooks.request_filter(session, &mut ctx.rules).await? {
                return Ok(true);
            }
        }
        ctx.upstream.group = ctx.rules.backend_group.take();
        // a passed request is never answered from the cache
        let fast_hit = self
            .fast_hit
            .as_ref()
            .filter(|_| !ctx.head.uncacheable_body && !ctx.rules.pass);
        let answer = match fast_hit {
            Some(fast_hit) => {
                fast_hit
                    .on_request(&live.policy, session.req_header(), ctx)
                    .await
            }
            _ => None,
        };
        let Some(mut answer) = answer else {
            // kept for the request's later phases, which may run after a reload
            ctx.settings = Some(arc_swap::Guard::into_inner(live));
            let live = self.settings(ctx);
            // (the fast path declines every request with an `Upgrade` field)
            ctx.upgrade = UpgradeRequest::of(session.req_header());
            if ctx.upgrade.requested() {
                session.set_read_timeout(Some(live.config.proxy.tunnel_idle_timeout));
            }
            if let Some(pass) = self.direct_pass(&live, session, ctx) {
                // boxed: the exchange's state stays out of every other request's future
                return Box::pin(self.forward_pass(&live, session, ctx, pass)).await;
            }
            return Ok(false);
        };
        let status = answer.cache_status();
        let head_edited = self.hooks.is_some() || ctx.rules.edits_response_head();
        let announcing = our_fields::announced(&live).is_some();
        let pre_serialised = (!head_edited)
            .then(|| answer.pre_serialised(session, &live.for_us_only, announcing))
            .flatten();
        if let Some(pre_serialised) = pre_serialised {
            let status = &*ctx.cache_status.insert(status.served_from(ctx.tier));
            let version = session.req_header().version;
            let ours = |lines: &mut String| our_fields::write_lines(&live, status, version, lines);
            // boxed: inline, its write's state made this future (every request's, h2 streams'
            // too) larger, copied per request (+500 instructions per h2 hit, measured)
            // a failed write is the client's: nothing more is written to it (not an error
            // answer inside the body it was being sent)
            Box::pin(pre_serialised.send(session, ours))
                .await
                .map_err(|e| e.into_down())?;
            return Ok(true);
        }
        let mut head = answer.head(!session.downstream_session.is_http2());
        self.finish_response_head(&live, &mut head, session.req_header(), status, ctx)?;
        // boxed: inline, its writes' state (1 KB) made this future, every request's, larger
        // than mimalloc's small blocks, copied per request; the pre-serialised path above
        // (HTTP/1) serves most hits without it
        Box::pin(answer.send(session, head))
            .await
            .map_err(|e| e.into_down())?;
        Ok(true)
    }

    fn cache_miss(&self, session: &mut Session, ctx: &mut Self::CTX) {
        session.cache.cache_miss();
        // the miss's client is served from its fill: with its answer written as cancel-safe
        // proxy tasks, the fill goes on at the origin's pace while the client's writes wait, so
        // a client that stops reading does not pace the fill others stream (HTTP/2 sessions:
        // pingora-core 0022; direct misses have `fill_relay`). Its reader of the fill may then
        // keep a whole object for it: only while the budget has room for one
        if ctx.read_ahead.is_none() {
            let object = self.settings(ctx).policy.max_object_size();
            ctx.read_ahead = self.standard_read_ahead.reserve(object);
        }
        session.set_proxy_tasks_enabled(ctx.read_ahead.is_some());
    }

    fn request_cache_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<()> {
        let live = self.settings(ctx);
        if !live.config.cache.enabled {
            ctx.seen.disabled = true;
            return Ok(());
        }
        if ctx.upgrade.requested() {
            ctx.seen.upgrade = true;
            return Ok(());
        }
        let req = session.req_header();
        if !live.policy.request_cacheable(req) {
            ctx.seen.method_not_cacheable = true;
            return Ok(());
        }
        if ctx.head.uncacheable_body {
            // the key does not include the body: forwarded, never looked up or stored
            ctx.seen.bypassed = true;
            ctx.seen.not_stored_reason = Some("request-body");
            return Ok(());
        }
        if ctx.rules.pass {
            // configured not to handle it: RFC 9211's fwd=bypass
            return Ok(());
        }
        if CacheControl::from_req_headers(req).is_some_and(|cc| cc.no_store()) {
            ctx.seen.bypassed = true;
            return Ok(());
        }
        ctx.directives = RequestDirectives::parse(req);
        let storage: &'static (dyn Storage + Sync) = match self.known_missing {
            Some(known_missing) if ctx.shared_primary_missing => known_missing,
            _ => self.storage,
        };
        ctx.lock_skipped = self.uncacheable.remembered(ctx.key.primary_bin(req));
        session.cache.enable(
            storage,
            None,
            None,
            (!ctx.lock_skipped).then_some(self.cache_lock),
            Some(Self::lock_overrides(&live)),
        );
        // no `set_max_file_size_bytes`: Pingora fails a fill past it mid-body (a 500, or the
        // body cut short); the memory tier turns such a fill into a relay for its readers
        // instead (`storage::memory::fill`), and answers that announce a larger length are
        // refused by the policy
        Ok(())
    }

    fn cache_key_callback(&self, session: &Session, ctx: &mut Self::CTX) -> Result<CacheKey> {
        Ok(ctx.key.get(session.req_header()).clone())
    }

    fn cache_vary_filter(
        &self,
        meta: &CacheMeta,
        ctx: &mut Self::CTX,
        req: &RequestHeader,
    ) -> Option<HashBinary> {
        let variance = vary::variance_key(meta.response_header(), req);
        if variance.is_some() && !ctx.upstream.started() {
            // a lookup (not the storing of a fetched response): if it ends in a miss, it missed
            // among stored variants
            ctx.seen.vary_miss = true;
        }
        variance
    }

    async fn cache_hit_filter(
        &self,
        session: &mut Session,
        meta: &CacheMeta,
        hit_handler: &mut HitHandler,
        _is_fresh: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<ForcedFreshness>> {
        ctx.tier = Some(memory::tier_of(hit_handler));
        if std::mem::take(&mut ctx.lock_skipped) {
            let overrides = Self::lock_overrides(&self.settings(ctx));
            hit_for_miss::on_stored_copy_found(session, self.cache_lock, overrides);
        }
        if !ctx.directives.any() {
            return Ok(None);
        }
        let verdict = ctx.directives.judge(
            meta.response_header(),
            meta.age(),
            freshness::remaining_secs(meta.fresh_until(), SystemTime::now()),
            self.settings(ctx).config.cache.honor_client_no_cache,
        );
        if verdict == Some(ForcedFreshness::ForceExpired) {
            ctx.seen.client_forced = true;
        }
        Ok(verdict)
    }

    fn cache_not_modified_filter(
        &self,
        session: &Session,
        resp: &ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<bool> {
        // Pingora can only turn the stored response into a 304; a failed precondition becomes a
        // header-only 304 here and is rewritten to 412 in `response_filter`
        let req = session.req_header();
        let decoded = compression::needs_decoding(req, resp).is_some();
        Ok(match preconditions::evaluate_for(req, resp, decoded) {
            preconditions::Outcome::Proceed => false,
            preconditions::Outcome::NotModified => {
                ctx.not_modified_decoded = decoded;
                true
            }
            preconditions::Outcome::Failed => {
                ctx.precondition_failed = true;
                true
            }
        })
    }

    fn should_serve_stale(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
        error: Option<&pingora_error::Error>,
    ) -> bool {
        match error {
            // stale-while-revalidate: Pingora has already checked the stored window
            None => true,
            // stale-if-error (the response's own, or the configured grace): only for failures
            // of the origin itself, which Cache-Status then reports
            Some(e) if e.esource() == &pingora_error::ErrorSource::Upstream => {
                ctx.seen.origin_failure = Some(cache_status::OriginFailure::of(e));
                true
            }
            Some(_) => false,
        }
    }

    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<bool> {
        if let Some(partial) = &self.partial {
            let req = session.req_header();
            let primary = ctx.key.primary_bin(req);
            let phase = session.cache.phase();
            let now = SystemTime::now();
            if let Some(mut hit) = partial.on_miss(phase, req, primary, &mut ctx.partial, now) {
                let status = hit.cache_status();
                let live = self.settings(ctx);
                self.finish_response_head(&live, &mut hit.head, req, status, ctx)?;
                hit.send(session).await.map_err(|e| e.into_down())?;
                return Ok(false);
            }
        }
        if ctx.directives.only_if_cached {
            // RFC 9111 §5.2.1.7: nothing usable is stored, and the client forbids the origin
            session.respond_error(504).await?;
            return Ok(false);
        }
        if session.cache.phase() == pingora_cache::CachePhase::Miss {
            // a miss the fast path declined: fetched under the URL's lease, as its misses are
            self.claim_unsettled_lease(session, ctx).await;
            // a remembered URL's miss the fast path claimed no lease for (`lock_skipped`: the
            // URL was remembered when the cache was enabled for it)
            ctx.remembered_unguarded = self.tiered.is_some()
                && ctx.lock_skipped
                && ctx.shared_miss_decided
                && ctx.fill_lease.is_none();
        }
        let live = self.settings(ctx);
        match &live.fairness {
            // an upgrade too: a field alone exempted a request, though it went on as an ordinary
            // one, or the origin refused the switch (a slot of a tunnel that opens is given back
            // at its 101, in `upstream_response_filter`)
            Some(cap) => {
                cap.on_upstream_request(session, client_ip(session, &live), &mut ctx.upstream)
                    .await
            }
            None => Ok(true),
        }
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        let live = self.settings(ctx);
        let mut peer = live
            .upstream
            .on_peer(&mut ctx.upstream, || ctx.key.text(session.req_header()))
            .await?;
        if ctx.upgrade.requested() {
            upgrade::on_peer(&mut peer, live.config.proxy.tunnel_idle_timeout);
        }
        Ok(peer)
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Self::CTX,
        mut e: Box<pingora_error::Error>,
    ) -> Box<pingora_error::Error> {
        self.settings(ctx)
            .upstream
            .on_connect_failure(&ctx.upstream, session, &mut e);
        retried_fill::on_retry(session, &e);
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<pingora_error::Error>,
        ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<pingora_error::Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        self.settings(ctx).upstream.on_proxy_error(
            &mut ctx.upstream,
            session,
            &mut e,
            client_reused,
        );
        retried_fill::on_retry(session, &e);
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &pingora_error::Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        // the request is done with the origin: its backend's `max_in_flight` slot and the
        // client's fairness slot go back now, not when the session ends, so that the wait for
        // the rest of a request body (below, at most `error_answer::BODY_DRAIN_WAIT`) holds
        // neither (`tests/error_keepalive_attacks.rs`)
        ctx.upstream.slot = None;
        ctx.upstream.admission = None;
        let code = crate::upstream::attempts::failure_status(e);
        if code == 0 {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        // decided before the answer is written: its `Connection` field says whether it is kept
        let keep = error_answer::keeps_connection(session, e, code).await;
        let written = if keep {
            error_answer::write_keeping_connection(session, code).await
        } else {
            // Pingora's answer turns keep-alive off: the connection may be mid-message
            session.respond_error(code).await
        };
        if let Err(write_error) = &written {
            log::debug!("could not send the {code} error response: {write_error}");
        }
        FailToProxy {
            error_code: code,
            can_reuse_downstream: keep && written.is_ok(),
        }
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let live = self.settings(ctx);
        if ctx.upgrade.requested() {
            upgrade::on_upstream_request(upstream_request);
        }
        let cache_enabled = session.cache.enabled() || ctx.direct_miss;
        if let Some(ae) =
            compression::upstream_accept_encoding(&live.config.cache.compression, cache_enabled)
        {
            upstream_request.insert_header(headers::ACCEPT_ENCODING, ae)?;
        }
        partial_content::on_upstream_request(&ctx.partial, upstream_request)?;
        let client_fields = forwarding::on_upstream_request(
            session,
            upstream_request,
            &live.config.proxy.trusted_proxies,
        );
        headers::add_forwarded_with(
            upstream_request,
            live.config.proxy.forwarded,
            forwarding::peer_ip(session),
            ctx.key.is_https(),
            client_fields,
        );
        if live.config.proxy.via {
            let version = session.req_header().version;
            upstream_request.append_header(headers::VIA, live.via.for_version(version))?;
        }
        if !upstream_request.headers.contains_key(http::header::HOST) {
            let host = upstream_request
                .uri
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_else(|| live.upstream.host().to_string());
            upstream_request.insert_header(http::header::HOST, host)?;
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        if interim::is_interim(upstream_response) {
            interim::on_upstream_interim(upstream_response);
            return Ok(());
        }
        if upstream_response.status == http::StatusCode::SWITCHING_PROTOCOLS
            && !(ctx.upgrade.requested()
                && upgrade::switch_was_offered(session.req_header(), upstream_response))
        {
            // a switch the client never asked for (no upgrade at all, or to a protocol it did
            // not offer, `h2c` among them) would make the client's connection a tunnel to
            // whatever the origin sends next, answers to later requests included: refused, as
            // `direct_pass` refuses it (502; nothing of the origin's answer reaches the client,
            // and the origin's connection is dropped)
            let e = pingora_error::Error::explain(
                pingora_error::ErrorType::InvalidHTTPHeader,
                "101 Switching Protocols to a protocol the request did not offer",
            );
            return Err(e.into_up());
        }
        let live = self.settings(ctx);
        live.upstream
            .on_response(&mut ctx.upstream, upstream_response.status);
        invalidation::on_upstream_response(
            self.invalidator,
            session.req_header(),
            upstream_response,
            || client_ip(session, &live),
        )
        .await;
        let switched = upgrade::on_upstream_response(upstream_response);
        headers::strip_hop_by_hop(upstream_response);
        headers::settle_length_fields(upstream_response);
        if let Some(protocol) = switched {
            upgrade::restore_switch_fields(upstream_response, protocol);
            // the request is over at the origin's side: the tunnel now open does not hold its
            // client's fairness slot for as long as it lasts
            ctx.upstream.admission = None;
        }
        headers::add_date_if_missing(upstream_response);
        rules::on_upstream_response(&ctx.rules, upstream_response);
        if live.config.cache.reuse_post_responses && live.config.cache.enabled {
            ctx.post_reuse = post_reuse::on_upstream_response(
                &live.policy,
                session.req_header(),
                upstream_response,
                ctx.request_time,
            );
        }
        if upstream_response.status == http::StatusCode::NOT_MODIFIED
            && session.cache.phase() == pingora_cache::CachePhase::Stale
        {
            // the origin validated our stored response (Pingora revalidates only in this phase)
            ctx.not_modified = Some(Box::new(upstream_response.clone()));
        }
        // only compression on store needs to know in advance (the policy runs again, with the 304
        // merge, in response_cache_filter): skip the second evaluation when it is off
        let will_store = live.config.cache.compression.enabled
            && (session.cache.enabled() || ctx.direct_miss)
            && matches!(
                live.policy.response_decision_with(
                    session.req_header(),
                    upstream_response,
                    ctx.request_time,
                    &ctx.rules.store_overrides(),
                ),
                RespCacheable::Cacheable(_)
            );
        compression::on_upstream_response(
            &live.config.cache.compression,
            &mut ctx.compression,
            session.req_header(),
            upstream_response,
            will_store.then(|| live.policy.max_object_size()),
        );
        if let Some(partial) = &self.partial {
            let req = session.req_header();
            let key = &mut ctx.key;
            // a part is stored for as long as the whole response would be, rules included
            let overrides = ctx.rules.store_overrides();
            let request_time = ctx.request_time;
            partial.on_upstream_response(
                upstream_response,
                |complete| {
                    live.policy
                        .response_decision_with(req, complete, request_time, &overrides)
                },
                &mut ctx.partial,
                || key.get(req).clone(),
            );
            if ctx.fill_held_elsewhere().is_some() {
                // the partial-content room stores a `206` itself (a whole one in the memory
                // tier and memcached), not through the tiered store's miss handler that
                // refuses a fill fetched under another claim: it is refused here
                // (`tests/elsewhere_breaks.rs`)
                partial_content::keep_nothing(&mut ctx.partial);
            }
        }
        Ok(())
    }

    fn upstream_body_held_back(
        &self,
        session: &mut Session,
        _ctx: &Self::CTX,
        reads_no_more: bool,
    ) -> bool {
        session
            .cache
            .miss_body_reader()
            .is_some_and(|reader| owner_holds_back_origin(reader, reads_no_more))
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<std::time::Duration>> {
        self.on_upstream_body(ctx, body, end_of_stream)?;
        Ok(None)
    }

    fn response_cache_filter(
        &self,
        session: &Session,
        resp: &ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<RespCacheable> {
        let updated;
        let mut another_representation = false;
        let resp = match ctx.not_modified.take() {
            Some(not_modified) => {
                let etag_as_stored = session
                    .cache
                    .maybe_cache_meta()
                    .and_then(|meta| meta.headers().get(http::header::ETAG));
                if revalidation::names_another_representation(etag_as_stored, &not_modified) {
                    // nothing is updated; the stored response is served this once, under its
                    // own tag (`finish_forwarded_head`), and revalidated again next time
                    another_representation = true;
                    ctx.etag_as_stored = etag_as_stored.cloned();
                }
                updated = revalidation::merge(resp, &not_modified, etag_as_stored);
                &updated
            }
            None => resp,
        };
        let decision = if another_representation {
            RespCacheable::Uncacheable(pingora_cache::NoCacheReason::Custom(
                revalidation::REASON_ANOTHER_REPRESENTATION,
            ))
        } else {
            self.settings(ctx).policy.response_decision_with(
                session.req_header(),
                resp,
                ctx.request_time,
                &ctx.rules.store_overrides(),
            )
        };
        match &decision {
            RespCacheable::Cacheable(_) => ctx.seen.storable = true,
            RespCacheable::Uncacheable(reason) => {
                ctx.seen.not_stored_reason = Some(reason.as_str());
                ctx.give_up_fill_lease();
            }
        }
        self.uncacheable
            .on_decision(ctx.key.primary_bin(session.req_header()), &decision);
        let mut decision = decision;
        ctx.mark_if_held_elsewhere(&mut decision);
        Ok(decision)
    }

    fn range_header_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        _ctx: &mut Self::CTX,
    ) -> pingora_proxy::RangeType {
        if compression::needs_decoding(session.req_header(), resp).is_some() {
            // ranges of the decoded body are unknown until it is decoded: serve it whole
            return pingora_proxy::RangeType::None;
        }
        pingora_proxy::range_header_filter(session.req_header(), resp, Some(RANGES_MAX))
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let phase = session.cache.phase();
        let ttl = session
            .cache
            .maybe_cache_meta()
            .map(|meta| freshness::remaining_secs(meta.fresh_until(), SystemTime::now()));
        self.finish_forwarded_head(session, upstream_response, ctx, phase, ttl)
            .await
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<std::time::Duration>> {
        self.on_downstream_body(ctx, body, end_of_stream)?;
        Ok(None)
    }

    async fn logging(
        &self,
        session: &mut Session,
        e: Option<&pingora_error::Error>,
        ctx: &mut Self::CTX,
    ) {
        if e.is_some() {
            reset_if_cut_short_by_close(session);
        }
        if let Some(kept) = ctx.post_reuse.take() {
            // boxed: every other request's logging future stays as small as it was
            let key = ctx.key.get(session.req_header());
            Box::pin(post_reuse::on_request_end(
                kept,
                self.storage,
                key,
                e.is_some(),
            ))
            .await;
        }
        if let Some(lease) = ctx.fill_lease.take() {
            // a request that ended in an error abandoned its fill, whatever was judged storable
            let stored = e.is_none() && ctx.cache_status.as_ref().is_some_and(|s| s.stored);
            lease.on_request_end(stored);
        }
        metrics_record::on_request_end(self.metrics, session, ctx);
        if let Some(log) = &self.access_log {
            let live = self.settings(ctx);
            let client = client_ip(session, &live);
            access_record::on_request_end(
                log,
                session,
                ctx,
                &live.config.cache.status_name,
                client,
            );
        }
    }
}
