//! The proxy: Lacquer's request path as Pingora's phase-named callbacks.
//!
//! A request moves through these phases (see `docs/architecture.md` for the picture):
//!
//! 1. `request_cache_filter`: decide whether the cache is used at all (method, client directives,
//!    config) and enable it with our storage and the cache lock.
//! 2. `cache_key_callback`: the key is host + path + query; `cache_vary_filter` adds the variant.
//! 3. Lookup (Pingora's state machine): a fresh hit is served from storage; concurrent misses wait
//!    on the cache lock so one origin fetch fills the cache for all of them.
//! 4. `upstream_peer` / `upstream_request_filter`: forward to the origin with `Via` and forwarding
//!    headers; `upstream_response_filter` drops hop-by-hop fields before anything is stored.
//! 5. `response_cache_filter`: the [`CachePolicy`] decides whether and how long to store.
//! 6. `response_filter`: every response gets `Cache-Status` and `Via`; `logging` writes the access
//!    log line.

pub mod cache_status;
pub mod fast_hit;
pub mod headers;
pub mod invalidation;
pub mod purge;

use crate::compression::decoded_copies::DecodedCopies;
use crate::compression::{self, CompressionCtx};
use crate::config::Config;
use crate::observe::access_log::{AccessLog, AccessRecord};
use crate::policy::request_directives::RequestDirectives;
use crate::policy::{preconditions, revalidation, vary, CachePolicy};
use crate::storage::memory::MemoryTier;
use crate::storage::tiered::{PrimaryKnownMissing, TieredStorage};
use crate::upstream::fairness::{self, Fairness};
use crate::upstream::passive::{self, Failure};
use crate::upstream::retry::RetryPolicy;
use crate::upstream::{timeouts::TotalDeadline, RequestUpstream, Upstream};
use async_trait::async_trait;
use cache_status::{CacheStatus, Observations};
use pingora_cache::cache_control::CacheControl;
use pingora_cache::key::HashBinary;
use pingora_cache::lock::{CacheKeyLockImpl, CacheLock};
use pingora_cache::storage::HitHandler;
use pingora_cache::storage::Storage;
use pingora_cache::{CacheKey, CacheMeta, CacheOptionOverrides, ForcedFreshness, RespCacheable};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{ProxyHttp, Session};
use purge::PurgeRequest;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

/// Per-request state carried between phases.
pub struct RequestCtx {
    started: Instant,
    request_time: SystemTime,
    upstream_started: Option<Instant>,
    upstream_ms: Option<f64>,
    upstream_status: Option<u16>,
    seen: Observations,
    directives: RequestDirectives,
    /// Whether this request is a PURGE, and whether its client may purge (see [`purge`]).
    purge: PurgeRequest,
    cache_status: Option<CacheStatus>,
    /// The fast path looked the URL up in memcached and found nothing there.
    shared_primary_missing: bool,
    /// This request holds the cluster's fill lease for its URL (released if nothing is stored).
    holds_fill_lease: bool,
    /// The client's `If-Match` / `If-Unmodified-Since` failed against the stored response.
    precondition_failed: bool,
    /// The origin's 304 to our revalidation, whose fields update the stored head.
    not_modified: Option<Box<ResponseHeader>>,
    compression: CompressionCtx,
    /// Backends tried, the one in flight, the fairness slot (see [`crate::upstream`]).
    upstream: RequestUpstream,
}

/// Lacquer's implementation of Pingora's [`ProxyHttp`].
pub struct LacquerProxy {
    config: Arc<Config>,
    policy: CachePolicy,
    /// Where Pingora's cache state machine stores and looks up: the memory tier alone, or the
    /// tiered store when a memcached cluster is configured.
    storage: &'static (dyn Storage + Sync),
    /// This node's memory tier, which the hot-hit fast path reads directly.
    memory: &'static MemoryTier,
    /// The tiered store, which the fast path reads on a memory miss, and its view for requests
    /// whose URL the fast path already found missing in memcached.
    shared: Option<(&'static TieredStorage, &'static PrimaryKnownMissing)>,
    cache_lock: &'static CacheKeyLockImpl,
    upstream: Upstream,
    fairness: Option<Fairness>,
    access_log: Option<AccessLog>,
    /// Our `Via` entries, rendered once.
    via: headers::ViaValues,
    /// Decoded copies of small gzip bodies for clients that do not take gzip.
    decoded_copies: Option<DecodedCopies>,
}

impl LacquerProxy {
    /// Builds the proxy around already created storage (shared with the admin endpoint): the
    /// memory tier, and the tiered store in front of memcached when one is configured.
    pub fn new(
        config: Arc<Config>,
        memory: &'static MemoryTier,
        tiered: Option<&'static TieredStorage>,
        access_log: Option<AccessLog>,
    ) -> Self {
        let lock: &'static CacheLock = Box::leak(CacheLock::new_boxed(config.cache.lock_timeout));
        let storage: &'static (dyn Storage + Sync) = match tiered {
            Some(tiered) => tiered,
            None => memory,
        };
        let shared = tiered.map(|tier| {
            let view: &'static PrimaryKnownMissing =
                Box::leak(Box::new(PrimaryKnownMissing::new(tier)));
            (tier, view)
        });
        let via = headers::ViaValues::new(&config.proxy.via_name)
            .expect("proxy.via_name is checked to be an HTTP token when the config is loaded");
        let decoded_copies = DecodedCopies::new(config.cache.compression.decoded_copies);
        LacquerProxy {
            shared,
            policy: CachePolicy::new(&config.cache),
            upstream: Upstream::new(&config),
            fairness: config.fairness.clone().map(Fairness::new),
            config,
            storage,
            memory,
            cache_lock: lock,
            access_log,
            via,
            decoded_copies,
        }
    }

    /// Adds what every downstream response carries, on both the fast and the standard path:
    /// `Cache-Status` and our `Via`, minus the fields targeted at us (RFC 9213) unless configured
    /// to forward them; keeps the classification for the access log.
    fn finish_response_head(
        &self,
        head: &mut ResponseHeader,
        request_version: http::Version,
        status: CacheStatus,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if !self.config.cache.forward_targeted_fields {
            self.policy.targeted_fields().strip(head);
        }
        head.insert_header(
            "cache-status",
            status.header_value(&self.config.cache.status_name),
        )?;
        if self.config.proxy.via {
            head.append_header(http::header::VIA, self.via.for_version(request_version))?;
        }
        ctx.cache_status = Some(status);
        Ok(())
    }

    /// The origin pool (shared with the health checker).
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    fn lock_overrides(&self) -> CacheOptionOverrides {
        let mut overrides = CacheOptionOverrides::default();
        overrides.wait_timeout = Some(self.config.cache.lock_timeout);
        overrides
    }
}

fn client_ip(session: &Session) -> Option<IpAddr> {
    session
        .client_addr()
        .and_then(|addr| addr.as_inet())
        .map(|inet| inet.ip())
}

/// The host part of the cache key as sent: the `Host` header (or the URI authority for HTTP/2).
/// Hosts are case-insensitive; [`cache_key_from`] lowercases it.
fn raw_request_host(req: &RequestHeader) -> &str {
    req.headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri.authority().map(|a| a.as_str()))
        .unwrap_or("")
}

/// The host part of the cache key, lowercased.
fn request_host(req: &RequestHeader) -> String {
    raw_request_host(req).to_ascii_lowercase()
}

/// Builds the primary cache key for a request: host + path + query.
pub fn cache_key_for(req: &RequestHeader) -> CacheKey {
    let path = req
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    cache_key_from(raw_request_host(req), path)
}

/// The primary cache key for a host (lowercased here: hosts are case-insensitive) and a path with
/// its query (case-sensitive). Built in one allocation: it runs on every request.
pub fn cache_key_from(host: &str, path_and_query: &str) -> CacheKey {
    let mut primary = String::with_capacity(host.len() + path_and_query.len());
    primary.push_str(host);
    primary.make_ascii_lowercase();
    primary.push_str(path_and_query);
    CacheKey::new(primary, "")
}

fn version_str(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        http::Version::HTTP_09 => "HTTP/0.9",
        _ => "HTTP/1.1",
    }
}

#[async_trait]
impl ProxyHttp for LacquerProxy {
    type CTX = RequestCtx;

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        ctx.purge = purge::on_request(
            &session.req_header().method,
            || client_ip(session),
            &self.config.cache.purge_from,
        );
        if ctx.purge == PurgeRequest::Refused {
            return purge::refuse(session).await;
        }
        if !self.config.cache.enabled || !fast_hit::eligible(&self.policy, session.req_header()) {
            return Ok(false);
        }
        let now = SystemTime::now();
        let hit = match fast_hit::lookup(self.memory, session.req_header(), now) {
            fast_hit::Lookup::Fresh(hit) => hit,
            fast_hit::Lookup::Decline => return Ok(false),
            fast_hit::Lookup::Absent => {
                let Some((tier, _)) = self.shared else {
                    return Ok(false);
                };
                match fast_hit::shared_lookup(tier, session.req_header(), now).await {
                    fast_hit::Lookup::Fresh(hit) => hit,
                    fast_hit::Lookup::Decline => return Ok(false),
                    fast_hit::Lookup::Absent => {
                        match fast_hit::after_shared_miss(self.memory, tier, session.req_header())
                            .await
                        {
                            fast_hit::AfterSharedMiss::Filled(hit) => hit,
                            fast_hit::AfterSharedMiss::FillHere {
                                holds_lease,
                                known_missing,
                            } => {
                                ctx.holds_fill_lease = holds_lease;
                                ctx.shared_primary_missing = known_missing;
                                return Ok(false);
                            }
                        }
                    }
                }
            }
        };
        let (mut head, ttl) = fast_hit::response_head(&hit, now);
        // checked on the fresh copy of the head, not the stored one (a cold cache line when the
        // working set is large): a gzip copy for a client that does not take gzip is decoded
        // whole here when it is small, else streamed through the decoder on the standard path
        let mut decoded = None;
        if compression::needs_gunzip(session.req_header(), &head) {
            decoded = fast_hit::decode_for_identity_client(
                &hit,
                session.req_header(),
                &mut head,
                self.decoded_copies.as_ref(),
            );
            if decoded.is_none() {
                return Ok(false);
            }
        }
        let status = CacheStatus {
            hit: true,
            ttl: Some(ttl),
            ..Default::default()
        };
        self.finish_response_head(&mut head, session.req_header().version, status, ctx)?;
        if let Some(plain) = decoded {
            session.write_response_header(head, false).await?;
            session.write_response_body(Some(plain), true).await?;
            return Ok(true);
        }
        let head_only = session.req_header().method == http::Method::HEAD || hit.body_len() == 0;
        session.write_response_header(head, head_only).await?;
        if !head_only {
            let chunks = hit.chunks();
            for (i, chunk) in chunks.iter().enumerate() {
                session
                    .write_response_body(Some(chunk.clone()), i + 1 == chunks.len())
                    .await?;
            }
        }
        Ok(true)
    }

    fn new_ctx(&self) -> Self::CTX {
        RequestCtx {
            started: Instant::now(),
            request_time: SystemTime::now(),
            upstream_started: None,
            upstream_ms: None,
            upstream_status: None,
            seen: Observations::default(),
            directives: RequestDirectives::default(),
            purge: PurgeRequest::None,
            cache_status: None,
            shared_primary_missing: false,
            holds_fill_lease: false,
            precondition_failed: false,
            not_modified: None,
            compression: CompressionCtx::default(),
            upstream: RequestUpstream::default(),
        }
    }

    fn request_cache_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<()> {
        if !self.config.cache.enabled {
            ctx.seen.disabled = true;
            return Ok(());
        }
        let req = session.req_header();
        if !ctx.purge.allowed() && !self.policy.request_cacheable(req) {
            ctx.seen.method_not_cacheable = true;
            return Ok(());
        }
        if CacheControl::from_req_headers(req).is_some_and(|cc| cc.no_store()) {
            ctx.seen.bypassed = true;
            return Ok(());
        }
        ctx.directives = RequestDirectives::parse(req);
        let storage: &'static (dyn Storage + Sync) = match self.shared {
            Some((_, known_missing)) if ctx.shared_primary_missing => known_missing,
            _ => self.storage,
        };
        session.cache.enable(
            storage,
            None,
            None,
            Some(self.cache_lock),
            Some(self.lock_overrides()),
        );
        session
            .cache
            .set_max_file_size_bytes(self.policy.max_object_size());
        Ok(())
    }

    fn cache_key_callback(&self, session: &Session, _ctx: &mut Self::CTX) -> Result<CacheKey> {
        Ok(cache_key_for(session.req_header()))
    }

    async fn cache_hit_filter(
        &self,
        _session: &mut Session,
        meta: &CacheMeta,
        _hit_handler: &mut HitHandler,
        _is_fresh: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<ForcedFreshness>> {
        if !ctx.directives.any() {
            return Ok(None);
        }
        let remaining = match meta.fresh_until().duration_since(SystemTime::now()) {
            Ok(left) => left.as_secs() as i64,
            Err(past) => -(past.duration().as_secs() as i64) - 1,
        };
        let verdict = ctx.directives.judge(
            meta.response_header(),
            meta.age(),
            remaining,
            self.config.cache.honor_client_no_cache,
        );
        if verdict == Some(ForcedFreshness::ForceExpired) {
            ctx.seen.client_forced = true;
        }
        Ok(verdict)
    }

    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<bool> {
        if ctx.directives.only_if_cached {
            // RFC 9111 §5.2.1.7: nothing usable is stored, and the client forbids the origin
            session.respond_error(504).await?;
            return Ok(false);
        }
        if let Some(cap) = &self.fairness {
            let key = fairness::client_key(session, cap.key_header(), client_ip(session));
            match cap.admit(key).await {
                Ok(admission) => ctx.upstream.admission = Some(admission),
                Err(_) => {
                    fairness::respond_too_many(session, cap.retry_after_secs()).await?;
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn cache_vary_filter(
        &self,
        meta: &CacheMeta,
        ctx: &mut Self::CTX,
        req: &RequestHeader,
    ) -> Option<HashBinary> {
        let variance = vary::variance_key(meta.response_header(), req);
        if variance.is_some() && ctx.upstream_started.is_none() {
            // a lookup (not the storing of a fetched response): if it ends in a miss, it missed
            // among stored variants
            ctx.seen.vary_miss = true;
        }
        variance
    }

    fn cache_not_modified_filter(
        &self,
        session: &Session,
        resp: &ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<bool> {
        // Pingora can only turn the stored response into a 304; a failed precondition becomes a
        // header-only 304 here and is rewritten to 412 in `response_filter`
        Ok(match preconditions::evaluate(session.req_header(), resp) {
            preconditions::Outcome::Proceed => false,
            preconditions::Outcome::NotModified => true,
            preconditions::Outcome::Failed => {
                ctx.precondition_failed = true;
                true
            }
        })
    }

    fn response_cache_filter(
        &self,
        session: &Session,
        resp: &ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<RespCacheable> {
        let updated;
        let resp = match ctx.not_modified.take() {
            Some(not_modified) => {
                updated = revalidation::merge(resp, &not_modified);
                &updated
            }
            None => resp,
        };
        let decision = if compression::storable(resp) {
            self.policy
                .response_decision(session.req_header(), resp, ctx.request_time)
        } else {
            RespCacheable::Uncacheable(pingora_cache::NoCacheReason::Custom("content-coding"))
        };
        match &decision {
            RespCacheable::Cacheable(_) => ctx.seen.storable = true,
            RespCacheable::Uncacheable(reason) => {
                ctx.seen.not_stored_reason = Some(reason.as_str());
            }
        }
        Ok(decision)
    }

    fn should_serve_stale(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
        error: Option<&pingora_error::Error>,
    ) -> bool {
        match error {
            // stale-while-revalidate: Pingora has already checked the stored window
            None => true,
            // stale-if-error: only for failures of the origin itself
            Some(e) => e.esource() == &pingora_error::ErrorSource::Upstream,
        }
    }

    fn is_purge(&self, _session: &Session, ctx: &Self::CTX) -> bool {
        ctx.purge.allowed()
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        ctx.upstream_started = Some(Instant::now());
        let total = self.upstream.config().timeouts.total;
        ctx.upstream
            .deadline
            .get_or_insert_with(|| TotalDeadline::start(total));
        let req = session.req_header();
        let path = req
            .uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/");
        let key = format!("{}{path}", request_host(req));
        let Some(selection) = self.upstream.select(key.as_bytes(), &ctx.upstream.tried) else {
            return pingora_error::Error::e_explain(
                pingora_error::ErrorType::HTTPStatus(502),
                "no backend configured",
            );
        };
        ctx.upstream.tried.push(selection.in_flight.backend().addr);
        ctx.upstream.current = Some(selection.in_flight);
        Ok(Box::new(selection.peer))
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Self::CTX,
        mut e: Box<pingora_error::Error>,
    ) -> Box<pingora_error::Error> {
        if let Some(backend) = ctx.upstream.backend() {
            passive::report(backend, Failure::Connect, &self.upstream.config().passive);
        }
        let policy = RetryPolicy {
            attempts: self.upstream.config().retries,
        };
        let method = &session.req_header().method;
        e.set_retry(
            self.upstream.has_untried(&ctx.upstream.tried)
                && policy.may_retry(method, ctx.upstream.attempts(), false),
        );
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<pingora_error::Error>,
        ctx: &mut Self::CTX,
        _client_reused: bool,
    ) -> Box<pingora_error::Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        if compression::retry_requested(&ctx.compression) {
            return e;
        }
        let from_upstream = e.esource() == &pingora_error::ErrorSource::Upstream;
        if from_upstream {
            if let Some(backend) = ctx.upstream.backend() {
                passive::report(backend, Failure::Proxy, &self.upstream.config().passive);
            }
        }
        let policy = RetryPolicy {
            attempts: self.upstream.config().retries,
        };
        let started = session.response_written().is_some();
        let replayable = !session.as_ref().retry_buffer_truncated();
        let method = &session.req_header().method;
        e.set_retry(
            from_upstream
                && replayable
                && policy.may_retry(method, ctx.upstream.attempts(), started),
        );
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let cache_enabled = session.cache.enabled();
        if let Some(ae) = compression::upstream_accept_encoding(&mut ctx.compression, cache_enabled)
        {
            upstream_request.insert_header(http::header::ACCEPT_ENCODING, ae)?;
        }
        let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
        headers::add_forwarded(
            upstream_request,
            self.config.proxy.forwarded,
            client_ip(session),
            tls,
        );
        if self.config.proxy.via {
            let version = session.req_header().version;
            upstream_request.append_header(http::header::VIA, self.via.for_version(version))?;
        }
        if !upstream_request.headers.contains_key(http::header::HOST) {
            let host = upstream_request
                .uri
                .authority()
                .map(|a| a.to_string())
                .unwrap_or_else(|| self.upstream.host().to_string());
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
        ctx.upstream_status = Some(upstream_response.status.as_u16());
        if upstream_response.status.is_server_error() {
            if let Some(backend) = ctx.upstream.backend() {
                let failure = Failure::ServerError(upstream_response.status.as_u16());
                passive::report(backend, failure, &self.upstream.config().passive);
            }
        }
        if invalidation::invalidates(&session.req_header().method, upstream_response.status) {
            let host = request_host(session.req_header());
            let keys = invalidation::targets(&host, session.req_header(), upstream_response);
            invalidation::purge(self.storage, &keys).await;
        }
        if let Some(started) = ctx.upstream_started {
            ctx.upstream_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
        }
        headers::strip_hop_by_hop(upstream_response);
        if upstream_response.status == http::StatusCode::NOT_MODIFIED
            && session.cache.phase() == pingora_cache::CachePhase::Stale
        {
            // the origin validated our stored response (Pingora revalidates only in this phase)
            ctx.not_modified = Some(Box::new(upstream_response.clone()));
        }
        // only gzip on store needs to know in advance (the policy runs again, with the 304
        // merge, in response_cache_filter): skip the second evaluation when it is off
        let will_store = self.config.cache.compression.enabled
            && session.cache.enabled()
            && matches!(
                self.policy.response_decision(
                    session.req_header(),
                    upstream_response,
                    ctx.request_time
                ),
                RespCacheable::Cacheable(_)
            );
        compression::on_upstream_response(
            &self.config.cache.compression,
            &mut ctx.compression,
            session.req_header(),
            upstream_response,
            will_store,
        )
    }

    fn upstream_response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<std::time::Duration>> {
        if ctx.upstream.deadline.is_some_and(|d| d.expired()) {
            return pingora_error::Error::e_explain(
                pingora_error::ErrorType::ReadTimedout,
                "balancer.timeouts.total exceeded",
            );
        }
        compression::on_upstream_body(&mut ctx.compression, body, end_of_stream)?;
        Ok(None)
    }

    fn range_header_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        _ctx: &mut Self::CTX,
    ) -> pingora_proxy::RangeType {
        if compression::needs_gunzip(session.req_header(), resp) {
            // ranges of the decoded body are unknown until it is decoded: serve it whole
            return pingora_proxy::RangeType::None;
        }
        pingora_proxy::range_header_filter(session.req_header(), resp, Some(200))
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<bytes::Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<std::time::Duration>> {
        compression::on_downstream_body(&mut ctx.compression, body, end_of_stream)?;
        Ok(None)
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        let phase = session.cache.phase();
        let ttl = session.cache.maybe_cache_meta().map(|meta| {
            let now = SystemTime::now();
            match meta.fresh_until().duration_since(now) {
                Ok(left) => left.as_secs() as i64,
                Err(past) => -(past.duration().as_secs() as i64),
            }
        });
        if ctx.precondition_failed && upstream_response.status == http::StatusCode::NOT_MODIFIED {
            preconditions::to_precondition_failed(upstream_response);
        }
        let status = CacheStatus::classify(phase, &ctx.seen, ctx.upstream_status, ttl);
        compression::on_downstream_head(
            &mut ctx.compression,
            session.req_header(),
            upstream_response,
        );
        self.finish_response_head(upstream_response, session.req_header().version, status, ctx)
    }

    async fn logging(
        &self,
        session: &mut Session,
        _e: Option<&pingora_error::Error>,
        ctx: &mut Self::CTX,
    ) {
        if ctx.holds_fill_lease {
            if let Some((tier, _)) = self.shared {
                let stored = ctx.cache_status.as_ref().is_some_and(|s| s.stored);
                tier.finish_fill(&cache_key_for(session.req_header()), stored);
            }
        }
        let Some(log) = &self.access_log else { return };
        let req = session.req_header();
        let header = |name: http::header::HeaderName| {
            req.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        let cache_status = ctx.cache_status.clone().unwrap_or_default();
        let rendered = cache_status.header_value(&self.config.cache.status_name);
        log.log(&AccessRecord {
            client: client_ip(session)
                .map(|ip| ip.to_string())
                .unwrap_or_else(|| "-".into()),
            method: req.method.as_str(),
            uri: req.uri.to_string(),
            version: version_str(req.version),
            status,
            bytes: session.body_bytes_sent(),
            referer: header(http::header::REFERER),
            user_agent: header(http::header::USER_AGENT),
            cache: cache_status.log_word(),
            cache_status: &rendered,
            upstream_ms: ctx.upstream_ms,
            total_ms: ctx.started.elapsed().as_secs_f64() * 1000.0,
        });
    }
}
