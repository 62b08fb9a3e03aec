//! Passes and misses forwarded over Lacquer's own HTTP/1 exchange: a request that will not be
//! cached, or a plain miss, goes to the origin and back in one sequential exchange, from
//! `request_filter`, instead of through Pingora's cache phases, its connector pool and its
//! two-task body relay.
//!
//! Those cost most of a forwarded request: about 110,000 user-space instructions per `no-store`
//! pass, of which Pingora's forwarding machinery was about 100,000, and 145,000 per stored miss
//! (`docs/benchmarks.md`), with passes at a third of nginx's per CPU-second. What a pass needs
//! is short: choose a backend, write the request head (and a small body), read the response
//! head, run Lacquer's response filters, relay the body, keep the connection; a miss adds the
//! cache lock and storing the answer whole. The protocol work stays Pingora's: the request
//! head is prepared by the vendored pingora-proxy's own steps (`direct_h1`), the exchange is
//! Pingora's HTTP/1 client session (framing, parsing, reuse checks), the answer goes out through
//! the same downstream session. What changes is the orchestration, and the pool of idle
//! connections ([`crate::upstream::idle_connections`]).
//!
//! Which requests ([`LacquerProxy::direct_pass`]): those the standard path would forward with
//! the cache off for them — everything when `[cache] enabled = false`, a method the cache does
//! not serve (POST and the other unsafe methods; not a POST kept for `reuse_post_responses`), a
//! request rule's `pass` —, and a GET of a URL last answered uncacheable (`no-store`,
//! `private`, no freshness: [`super::hit_for_miss`]) for which the fast path found nothing stored
//! anywhere; and, with `proxy.direct_misses`, any other GET the fast path found in no tier (so
//! without validators, `Range`, request directives or credentials), unless partial objects are
//! kept, when no other request holds the URL's cache lock ([`Pass::Miss`]: it takes the lock,
//! as the standard path's miss would, and a request that finds it taken waits in the standard
//! path; one that gets the lock but finds the URL stored or filling in the memory tier by then,
//! its memcached lookup having waited while another request's fill started, leaves it to the
//! standard path too). And only an HTTP/1 or HTTP/2 client's request without `Upgrade` or
//! `Expect`, whose body is empty or a `Content-Length` of at most [`BUFFERED_BODY_MAX`] (read
//! whole first, so a failed attempt can be replayed as the standard path replays its retry
//! buffer), with no embedding program's phase hooks. Everything else takes the standard path,
//! as do all requests with `proxy.direct_passes = false`.
//!
//! What the standard path does is done here by the same functions, in its order: the client's
//! fairness slot, the backend choice, each failed attempt reported to passive health and retried
//! by the same rules ([`crate::upstream::attempts`]), `upstream_request_filter`,
//! `upstream_response_filter`, the storing decision of a remembered URL (a storable answer is
//! stored through the storage's miss handler, as a miss's; with `Vary` or a `Content-Encoding`
//! it is left to the URL's next request, which takes the standard path), the HTTP/1.0-style
//! body sent chunked, `response_filter`'s fields and `Cache-Status`, the body filters, and
//! `logging` (by Pingora, after `request_filter` answered). The client is watched while the
//! origin prepares its answer (`read_body_or_idle`, as Pingora's relay does): one that closes
//! ends the request at once. A failure is returned as the standard path's would be, so `fail_to_proxy` answers it
//! (502, 504), and keeps the client's connection only when it is between messages
//! ([`super::error_answer`]: the body read whole before any attempt makes that the common case).
//!
//! A miss asks the origin as the standard path's miss does (`Accept-Encoding` for the coding
//! stored, compression on store), and streams a storable answer into the storage's miss
//! handler as it relays it. The lock is released when that fill starts (`Done`: the waiters
//! look the URL up again and stream the fill, as over Pingora's own miss), at once when the
//! answer turns out not to be storable (`GiveUp`: they fetch for themselves), or, when the
//! request fails before its fill starts, as a transient error (one of them fetches in its
//! place). A client that leaves once the fill has started does not end it, and one that stops
//! reading does not slow it down: a stored answer's body is relayed by [`super::fill_relay`],
//! which reads it at the origin's pace and queues the client's copy.
//!
//! Known differences: an idle origin connection is checked when taken rather than watched (see
//! `idle_connections`), the `Accept-Encoding` a remembered URL's request carries is the client's
//! (the standard path asks for gzip only when it may store, so a remembered URL that turns
//! storable is stored in the coding the client asked for), and a remembered URL's storable
//! answer with `Vary` or a `Content-Encoding` is stored by the URL's next request instead.

use super::fill_relay::{Fill, Relayed};
use super::{client_ip, LacquerProxy, RequestCtx};
use crate::lifecycle::live::LiveSettings;
use crate::policy::{freshness, vary};
use bytes::{Bytes, BytesMut};
use http::{header, Method, StatusCode, Version};
use pingora_cache::key::CacheHashKey;
use pingora_cache::lock::{CacheKeyLockImpl, LockStatus, Locked, WritePermit};
use pingora_cache::trace::Span;
use pingora_cache::{CacheKey, CacheMeta, CachePhase, NoCacheReason, RespCacheable};
use pingora_core::protocols::http::v1::client::HttpSession as UpstreamSession;
use pingora_core::protocols::http::ServerSession;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::direct_h1::{finish_h1_upstream_request, h1_upstream_request};
use pingora_proxy::{ProxyHttp, Session};
use std::time::SystemTime;

/// The largest request body forwarded directly: read whole before the origin is asked.
pub const BUFFERED_BODY_MAX: usize = 64 * 1024;

/// Why a request is a pass, as the standard path's `request_cache_filter` would note it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `[cache] enabled = false`.
    CacheDisabled,
    /// A method the cache does not serve (POST, PUT, DELETE...).
    Method,
    /// A request rule's `pass`.
    Rule,
    /// A GET of a URL last answered uncacheable, with nothing stored for it (a HEAD takes the
    /// standard path, which asks the origin for the whole GET answer, so that it can store it).
    RememberedUncacheable,
    /// Not a pass: a plain GET that found nothing stored in any tier, whose fill no other
    /// request has in hand (`proxy.direct_misses`). It holds the cache lock, as the standard
    /// path's miss would, and its storable answer is stored.
    Miss,
}

/// The cache lock a direct miss holds from before it asks the origin until its answer is
/// stored (or known not to be): the standard path's requests for the same URL wait on it as
/// on one of their own. Released with the status given, or, when the request fails or ends
/// early, as a transient error (a waiter then fetches in its place).
struct FillLock {
    lock: &'static CacheKeyLockImpl,
    key: CacheKey,
    permit: Option<WritePermit>,
}

impl FillLock {
    fn release(&mut self, status: LockStatus) {
        if let Some(permit) = self.permit.take() {
            self.lock.release(&self.key, permit, status);
        }
    }
}

impl Drop for FillLock {
    fn drop(&mut self) {
        self.release(LockStatus::TransientError);
    }
}

/// A failed attempt: its error, and what the retry rules need to know about it.
struct AttemptFailure {
    error: Box<Error>,
    /// It failed while connecting (passive health counts a connect failure).
    connecting: bool,
    /// Over a connection taken from the idle pool, and nothing of the response came back (the
    /// pool's race: see `crate::upstream::attempts`).
    reused: bool,
}

/// An attempt that got a final response head.
struct Answered {
    /// Boxed: the session (about 470 bytes) is moved out of the attempt, out of this, into the
    /// relay and back to the idle pool; a box moves as a pointer.
    upstream: Box<UpstreamSession>,
    head: Box<ResponseHeader>,
    /// The body's first bytes, read before the head goes to the client (see `attempt`).
    first: Option<Bytes>,
}

impl LacquerProxy {
    /// `request_filter`, after the fast path declined: whether this request is forwarded
    /// directly, and why it is a pass (see the module doc).
    pub(super) fn direct_pass(
        &self,
        live: &LiveSettings,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Option<Pass> {
        if !live.config.proxy.direct_passes || self.hooks.is_some() || ctx.upgrade.requested() {
            return None;
        }
        if !matches!(
            *session.downstream_session,
            ServerSession::H1(_) | ServerSession::H2(_)
        ) {
            return None;
        }
        // a body of unknown length (chunked, or HTTP/2 without `Content-Length`) is streamed by
        // the standard path
        let body_known = session.downstream_session.is_body_empty()
            || session
                .req_header()
                .headers
                .contains_key(header::CONTENT_LENGTH);
        if !body_known {
            return None;
        }
        let req = session.req_header();
        // in the standard path's order, so that `Cache-Status` says the same
        let pass = if !live.config.cache.enabled {
            Pass::CacheDisabled
        } else if !live.policy.request_cacheable(req) {
            if req.method == Method::POST && live.config.cache.reuse_post_responses {
                return None;
            }
            Pass::Method
        } else if ctx.head.uncacheable_body {
            return None;
        } else if ctx.rules.pass {
            Pass::Rule
        } else if ctx.nothing_stored && req.method == Method::GET && self.partial.is_none() {
            if self.uncacheable.remembered(ctx.key.primary_bin(req)) {
                Pass::RememberedUncacheable
            } else if live.config.proxy.direct_misses {
                Pass::Miss
            } else {
                return None;
            }
        } else {
            return None;
        };
        if req.headers.contains_key(header::EXPECT) || !body_is_small(req) {
            return None;
        }
        Some(pass)
    }

    /// Forwards the pass and writes its answer (see the module doc); `Ok(true)`: answered.
    pub(super) async fn forward_pass(
        &self,
        live: &LiveSettings,
        session: &mut Session,
        ctx: &mut RequestCtx,
        pass: Pass,
    ) -> Result<bool> {
        let mut fill_lock = None;
        if pass == Pass::Miss {
            let key = ctx.key.get(session.req_header());
            match self.cache_lock.lock(key, false) {
                // stored, or its fill started, since the fast path found nothing: the filling
                // request lets its lock go when its fill starts, and a memcached lookup that
                // waited (a slow or frozen server, up to its op_timeout) left that window open.
                // The standard path streams the fill or serves the object
                Locked::Write(permit)
                    if self
                        .fast_hit
                        .as_ref()
                        .is_some_and(|fast| fast.stored_or_filling(key.primary_bin())) =>
                {
                    self.cache_lock.release(key, permit, LockStatus::Done);
                    return Ok(false);
                }
                Locked::Write(permit) => {
                    fill_lock = Some(FillLock {
                        lock: self.cache_lock,
                        key: key.clone(),
                        permit: Some(permit),
                    });
                }
                // another request is fetching it: the standard path waits for its fill
                Locked::Read(_) => return Ok(false),
            }
            ctx.direct_miss = true;
            // behind another request's claim here, whose fill is over: claimed anew
            self.claim_unsettled_lease(session, ctx).await;
        } else {
            ctx.direct_pass = true;
            // a remembered URL's miss, for which the fast path claimed no lease: a storable
            // answer is not kept (`RequestCtx::remembered_unguarded`)
            ctx.remembered_unguarded = pass == Pass::RememberedUncacheable && self.tiered.is_some();
        }
        match pass {
            Pass::CacheDisabled => ctx.seen.disabled = true,
            Pass::Method => ctx.seen.method_not_cacheable = true,
            Pass::Rule | Pass::RememberedUncacheable | Pass::Miss => {}
        }
        // the body (at most `BUFFERED_BODY_MAX`) is read before the client's fairness slot is
        // taken: a client dribbling it held the slot, a cap on requests going upstream, before
        // anything went upstream (and a `429` leaves the connection between messages)
        let body = read_whole_body(session).await?;
        if let Some(cap) = &live.fairness {
            let client = client_ip(session, live);
            if !cap
                .on_upstream_request(session, client, &mut ctx.upstream)
                .await?
            {
                return Ok(true);
            }
        }
        let (peer, answered) = loop {
            let peer = live
                .upstream
                .on_peer(&mut ctx.upstream, || ctx.key.text(session.req_header()))
                .await?;
            // boxed: the attempt's state (the request's write, the response head's read) is
            // not kept through the body's relay
            let attempt = Box::pin(self.attempt(session, ctx, &peer, body.as_ref()));
            match attempt.await? {
                Ok(answered) => break (peer, answered),
                Err(failure) => {
                    let mut e = failure.error;
                    if failure.connecting {
                        live.upstream
                            .on_connect_failure(&ctx.upstream, session, &mut e);
                    } else {
                        e = e.more_context(format!("Peer: {peer}"));
                        live.upstream.on_proxy_error(
                            &mut ctx.upstream,
                            session,
                            &mut e,
                            failure.reused,
                        );
                    }
                    if !e.retry() {
                        return Err(e);
                    }
                    // as Pingora logs a failed attempt it retries (the last one is logged with
                    // the request)
                    log::warn!(
                        "Fail to proxy: {e}, tries: {}, retry: true, {}",
                        ctx.upstream.attempts(),
                        self.request_summary(session, ctx)
                    );
                }
            }
        };
        let Answered {
            mut upstream,
            mut head,
            first,
        } = answered;
        // the first bytes are in hand: no body to follow the head only when there were none
        let end = upstream.is_body_done() && first.is_none();
        self.upstream_response_filter(session, &mut head, ctx)
            .await?;
        let (phase, storable) = match pass {
            Pass::RememberedUncacheable | Pass::Miss => {
                self.on_storable_url_answer(live, session, &head, ctx, pass == Pass::Miss)
            }
            _ => (CachePhase::Disabled(NoCacheReason::NeverEnabled), None),
        };
        if storable.is_none() {
            ctx.give_up_fill_lease();
        }
        let ttl = storable
            .as_ref()
            .map(|meta| freshness::remaining_secs(meta.fresh_until(), SystemTime::now()));
        let fill = match storable {
            Some(meta) => {
                // the client gets the head as stored, as the standard path serves its miss
                // from the fill (the policy removed what must not be stored or served)
                head = stored_head(&meta, head);
                let key = ctx.key.get(session.req_header());
                let span = Span::inactive().handle();
                match self.storage.get_miss_handler(key, &meta, &span).await {
                    Ok(miss) => Some(Fill {
                        miss,
                        len: 0,
                        limit: live.policy.max_object_size(),
                    }),
                    Err(e) => {
                        log::warn!("storing the answer to a request forwarded directly: {e}");
                        None
                    }
                }
            }
            None => None,
        };
        if let Some(fill_lock) = &mut fill_lock {
            // as Pingora's miss over a storage that streams fills: the waiters look the URL up
            // again and read the fill as it is written; when nothing is stored, they fetch for
            // themselves at once
            let status = match fill {
                Some(_) => LockStatus::Done,
                None => LockStatus::GiveUp,
            };
            fill_lock.release(status);
        }
        if matches!(pass, Pass::RememberedUncacheable | Pass::Miss) {
            // the standard path ran its range filter on this miss: `Accept-Ranges` (the request
            // has no `Range`: the fast path declines those, so they never come here)
            self.range_header_filter(session, &mut head, ctx);
        }
        send_unframed_body_chunked(session, &mut head, end)?;
        self.finish_forwarded_head(session, &mut head, ctx, phase, ttl)
            .await?;
        // a client that goes away while the answer is being stored does not end the fill: the
        // requests streaming it (the lock let them go when it started) get it whole, and it is
        // stored, as Pingora's miss ignores a downstream error while it caches; the error is
        // the request's once the fill is done
        let client_gone = session.write_response_header(head, end).await.err();
        let relayed = match fill {
            // the whole body came with the head (most small answers): the connection is idle
            // again before the answer is stored and written
            Some(fill) if !end && first.is_some() && upstream.is_body_done() => {
                self.keep_idle(upstream, &peer).await;
                self.store_then_write(session, ctx, fill, first, client_gone)
                    .await
            }
            Some(fill) if !end => {
                // boxed: only a stored answer's relay carries the two halves' state. It keeps
                // the origin's connection idle as soon as the body's end is read
                Box::pin(self.relay_while_filling(
                    session,
                    ctx,
                    (upstream, &peer),
                    fill,
                    first,
                    client_gone,
                ))
                .await
            }
            fill => {
                if let Some(writing) = fill {
                    // an empty body: stored as soon as the head is out
                    writing.finish().await;
                }
                let relayed = self
                    .relay(session, ctx, &mut upstream, first, end, client_gone)
                    .await;
                if relayed.upstream_failed.is_none() && relayed.client_failed.is_none() {
                    self.keep_idle(upstream, &peer).await;
                }
                relayed
            }
        };
        if let Some(e) = relayed.upstream_failed {
            return Err(e);
        }
        if let Some(e) = relayed.client_failed {
            return Err(e);
        }
        Ok(true)
    }

    /// Keeps the origin's connection in the idle pool for the next request to `peer`, when its
    /// answer was read to the end and the connection may be reused; else it is closed.
    pub(super) async fn keep_idle(&self, upstream: Box<UpstreamSession>, peer: &HttpPeer) {
        if let Some(stream) = upstream.reuse().await {
            self.idle_upstream
                .put(peer.reuse_hash(), stream, peer.options.idle_timeout);
        }
    }

    /// Relays the rest of an answer that is not being stored (`first`, then what `upstream`
    /// sends), chunk by chunk at the client's pace: no one else waits for it.
    async fn relay(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        upstream: &mut UpstreamSession,
        mut first: Option<Bytes>,
        end: bool,
        client_gone: Option<Box<Error>>,
    ) -> Relayed {
        let mut relayed = Relayed {
            upstream_failed: None,
            client_failed: client_gone,
        };
        let mut ended = end;
        while !ended && relayed.client_failed.is_none() {
            let chunk = next_chunk(upstream, &mut first)
                .await
                .and_then(|(mut data, end)| {
                    self.on_upstream_body(ctx, &mut data, end)
                        .map(|()| (data, end))
                });
            let data = match chunk {
                Ok((data, end)) => {
                    ended = end;
                    data
                }
                Err(e) => {
                    relayed.upstream_failed = Some(e);
                    break;
                }
            };
            let written = if crate::compression::decodes_in_pieces(&ctx.compression) {
                // boxed: the pieces' loop would otherwise make every relay's future larger
                Box::pin(self.write_decoded_body(session, ctx, data, ended)).await
            } else {
                let mut data = data;
                match self.on_downstream_body(ctx, &mut data, ended) {
                    Ok(()) => session.write_response_body(data, ended).await,
                    Err(e) => Err(e),
                }
            };
            relayed.client_failed = written.err();
        }
        relayed
    }

    /// One attempt on `peer`: a connection (an idle one, or a new one), the request, the
    /// response head, interim responses passed on. The outer `Err` ends the request (the
    /// request head could not be made, or the client went away), the inner one is a failed
    /// attempt.
    async fn attempt(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        peer: &HttpPeer,
        body: Option<&Bytes>,
    ) -> Result<std::result::Result<Answered, AttemptFailure>> {
        let mut request = h1_upstream_request(session, peer)?;
        self.upstream_request_filter(session, &mut request.head, ctx)
            .await?;
        let request = finish_h1_upstream_request(request, body.is_some())?;
        // a new connection when the last attempt's pooled one was dead (`upstream::attempts`)
        let pooled = if peer.options.fresh_connection {
            None
        } else {
            self.idle_upstream.take(peer.reuse_hash())
        };
        let (stream, reused) = match pooled {
            Some(stream) => (stream, true),
            // boxed: a connect (a TLS handshake above all) is large and rare
            None => match Box::pin(self.upstream_connector.new_stream(peer)).await {
                Ok(stream) => (stream, false),
                Err(error) => {
                    return Ok(Err(AttemptFailure {
                        error: error.into_up(),
                        connecting: true,
                        reused: false,
                    }))
                }
            },
        };
        let failed = |error: Box<Error>| AttemptFailure {
            error: error.into_up(),
            connecting: false,
            reused,
        };
        // the session takes the peer's response head deadline (`upstream::timeouts::bound`):
        // a head that trickles in, or interim responses sent forever, end at
        // `balancer.timeouts.total` (a `ReadTimedout`, answered 504), which the per-read timer
        // below, reset by every byte, would never reach
        let mut upstream = Box::new(UpstreamSession::new_with_options(stream, peer));
        upstream.read_timeout = peer.options.read_timeout;
        upstream.write_timeout = peer.options.write_timeout;
        let sent = match body {
            None => upstream.write_request_header(Box::new(request)).await,
            Some(body) => match upstream
                .write_request_header_and_body(Box::new(request), body)
                .await
            {
                Ok(_) => upstream.finish_body().await.map(|_| 0),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = sent {
            return Ok(Err(failed(e)));
        }
        let mut watch_client = true;
        loop {
            // the client is watched while the origin prepares its answer, as Pingora's relay
            // watches it: a client that closes (or, without pipelining, sends more) ends the
            // request at once, freeing the origin connection and the request's slots
            let read = if watch_client {
                let downstream = &mut session.downstream_session;
                tokio::select! {
                    read = upstream.read_response() => Some(read),
                    gone = downstream.read_body_or_idle(true) => match gone {
                        Err(e) => return Err(e.into_down()),
                        Ok(_) => None,
                    },
                }
            } else {
                None
            };
            let read = match read {
                Some(read) => read,
                None => {
                    watch_client = false;
                    upstream.read_response().await
                }
            };
            if let Err(e) = read {
                return Ok(Err(failed(e)));
            }
            let status = upstream.get_status().unwrap_or(StatusCode::OK);
            if !status.is_informational() || status == StatusCode::SWITCHING_PROTOCOLS {
                break;
            }
            // an interim response (103 Early Hints, an unasked 100) goes on to the client
            let mut interim = response_head(&mut upstream)?;
            self.upstream_response_filter(session, &mut interim, ctx)
                .await?;
            self.finish_forwarded_head(session, &mut interim, ctx, CachePhase::Uninit, None)
                .await?;
            session.write_response_header(interim, false).await?;
        }
        upstream.respect_keepalive();
        let head = response_head(&mut upstream)?;
        // the body's first bytes are read before the head goes out (which Pingora's buffered
        // stream would send with them anyway): an origin that closes before sending any is a
        // failed attempt, retried by the same rules as one that sent no head, as the standard
        // path retries it when the cut reaches it before the head left
        let status = head.status;
        // a head came back: whatever fails now is the origin's, not the pool's
        let failed = |error: Box<Error>| AttemptFailure {
            error: error.into_up(),
            connecting: false,
            reused: false,
        };
        let first = if upstream.is_body_done() || status == StatusCode::SWITCHING_PROTOCOLS {
            None
        } else {
            match upstream.read_body_bytes().await {
                Ok(Some(chunk)) => Some(chunk),
                Ok(None) if upstream.is_body_done() => None,
                Ok(None) => return Ok(Err(failed(body_ended_early()))),
                Err(e) => return Ok(Err(failed(e))),
            }
        };
        Ok(Ok(Answered {
            upstream,
            head,
            first,
        }))
    }

    /// The storing decision on the answer to a direct miss or a remembered URL, as
    /// `response_cache_filter` makes it: the URL remembered uncacheable, or forgotten. A
    /// storable answer is kept to be stored as the standard path would store it. A miss asked
    /// the origin as the standard path's miss does (the coding the cache wants: see
    /// `upstream_request_filter`), and its answer's variance goes into the stored head as
    /// Pingora's `update_variance` puts it there for a URL with nothing stored (the first
    /// variant fills the URL's primary slot). A remembered URL's request was a pass's, so its
    /// answer is stored only without `Vary` or a `Content-Encoding`; with either, the next
    /// request, no longer remembered, stores what it gets. Returns the cache phase the standard
    /// path would be in now, and the head to store (an answer announcing a length over the
    /// largest object stored is refused by the policy, as on the standard path).
    fn on_storable_url_answer(
        &self,
        live: &LiveSettings,
        session: &Session,
        head: &ResponseHeader,
        ctx: &mut RequestCtx,
        miss: bool,
    ) -> (CachePhase, Option<CacheMeta>) {
        if miss && head.status == StatusCode::NOT_MODIFIED {
            // a 304 with nothing stored to validate is passed on unjudged, as the standard
            // path's miss passes it on (Pingora's reason)
            return (
                CachePhase::Disabled(NoCacheReason::Custom("304 on miss")),
                None,
            );
        }
        let req = session.req_header();
        let decision = live.policy.response_decision_with(
            req,
            head,
            ctx.request_time,
            &ctx.rules.store_overrides(),
        );
        self.uncacheable
            .on_decision(ctx.key.primary_bin(req), &decision);
        match decision {
            RespCacheable::Cacheable(mut meta)
                if miss
                    || (!head.headers.contains_key(header::VARY)
                        && !head.headers.contains_key(header::CONTENT_ENCODING)) =>
            {
                if let Some(variance) = vary::variance_key(meta.response_header(), req) {
                    meta.set_variance_key(variance);
                }
                ctx.seen.storable = true;
                let mut decision = RespCacheable::Cacheable(meta);
                ctx.mark_if_held_elsewhere(&mut decision);
                (CachePhase::Miss, Some(decision.unwrap_meta()))
            }
            RespCacheable::Cacheable(_) => {
                (CachePhase::Disabled(NoCacheReason::Custom("passed")), None)
            }
            RespCacheable::Uncacheable(reason) => {
                ctx.seen.not_stored_reason = Some(reason.as_str());
                (CachePhase::Disabled(reason), None)
            }
        }
    }
}

/// The head a stored miss is served with: the stored head, as Pingora's `cache_hit_header`
/// makes it for a miss served from its fill (HTTP/1.1, chunked when no length is known; no
/// `Age`, the origin was asked). The stored head is the relayed one less the fields the policy
/// removed (`private="..."`, `no-cache="..."`): when it removed none, the relayed head is kept
/// rather than copied.
fn stored_head(meta: &CacheMeta, relayed: Box<ResponseHeader>) -> Box<ResponseHeader> {
    let stored = meta.response_header();
    let mut head = if stored.headers.len() == relayed.headers.len() {
        relayed
    } else {
        Box::new(meta.response_header_copy())
    };
    head.set_version(Version::HTTP_11);
    let no_body = matches!(head.status.as_u16(), 204 | 304);
    if !no_body
        && !head.status.is_informational()
        && !head.headers.contains_key(header::CONTENT_LENGTH)
        && !head.headers.contains_key(header::TRANSFER_ENCODING)
    {
        let _ = head.insert_header(header::TRANSFER_ENCODING, "chunked");
    }
    head
}

/// The origin closed the connection before the body its head announced had all arrived.
fn body_ended_early() -> Box<Error> {
    Error::explain(ErrorType::ConnectionClosed, "origin's body ended early")
}

/// The next chunk of the origin's body (`first`, when the head's read brought one) and whether
/// it is the last; a body the origin's connection cut short is an error.
pub(super) async fn next_chunk(
    upstream: &mut UpstreamSession,
    first: &mut Option<Bytes>,
) -> Result<(Option<Bytes>, bool)> {
    let data = match first.take() {
        Some(chunk) => Some(chunk),
        None => upstream.read_body_bytes().await.map_err(|e| e.into_up())?,
    };
    let ended = upstream.is_body_done();
    if data.is_none() && !ended {
        return Err(body_ended_early().into_up());
    }
    Ok((data, ended))
}

/// The response head `upstream` has just read: moved out of a final head (after
/// `respect_keepalive`, which reads it), copied from an interim one.
fn response_head(upstream: &mut UpstreamSession) -> Result<Box<ResponseHeader>> {
    if let Some(head) = upstream.take_resp_header() {
        return Ok(head);
    }
    match upstream.resp_header() {
        Some(head) => Ok(Box::new(head.clone())),
        None => Error::e_explain(ErrorType::InternalError, "no response head was read"),
    }
}

/// Whether the request's body is empty or a `Content-Length` of at most [`BUFFERED_BODY_MAX`]
/// (the head checks already refused conflicting or malformed framing).
fn body_is_small(req: &pingora_http::RequestHeader) -> bool {
    if req.headers.contains_key(header::TRANSFER_ENCODING) {
        return false;
    }
    match req.headers.get(header::CONTENT_LENGTH) {
        None => true,
        Some(value) => std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .is_some_and(|length| length <= BUFFERED_BODY_MAX),
    }
}

/// The request body, read whole (`None`: the request has none).
async fn read_whole_body(session: &mut Session) -> Result<Option<Bytes>> {
    if session.downstream_session.is_body_empty() {
        return Ok(None);
    }
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(chunk) = session
        .downstream_session
        .read_request_body()
        .await
        .map_err(|e| e.into_down())?
    {
        match (&mut joined, &first) {
            (Some(joined), _) => joined.extend_from_slice(&chunk),
            (None, None) => first = Some(chunk),
            (None, Some(earlier)) => {
                let mut both = BytesMut::with_capacity(earlier.len() + chunk.len());
                both.extend_from_slice(earlier);
                both.extend_from_slice(&chunk);
                joined = Some(both);
                first = None;
            }
        }
    }
    Ok(joined
        .map(BytesMut::freeze)
        .or(first)
        .or(Some(Bytes::new())))
}

/// As Pingora's HTTP/1 response filter: a response with neither `Content-Length` nor
/// `Transfer-Encoding` whose body has not ended (an HTTP/1.0-style body, delimited by the
/// origin's close) goes to the client chunked, so the client's connection can stay open.
fn send_unframed_body_chunked(
    session: &Session,
    head: &mut ResponseHeader,
    end: bool,
) -> Result<()> {
    let no_body =
        session.req_header().method == Method::HEAD || matches!(head.status.as_u16(), 204 | 304);
    if !no_body
        && !head.status.is_informational()
        && !end
        && !head.headers.contains_key(header::TRANSFER_ENCODING)
        && !head.headers.contains_key(header::CONTENT_LENGTH)
    {
        head.set_version(Version::HTTP_11);
        head.insert_header(header::TRANSFER_ENCODING, "chunked")?;
    }
    Ok(())
}
