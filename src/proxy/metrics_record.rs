//! What a finished request adds to the request metrics: gathered in `logging` from the request
//! context and the session into one [`FinishedRequest`] for `observe::metrics`.
//!
//! It runs once per request, hits included, so it reads only what is already at hand: the
//! classification `response_filter` kept, the tier the object was found in, the body bytes the
//! session counted and one clock read.

use super::RequestCtx;
use crate::observe::metrics::{CacheOutcome, FinishedRequest, RequestMetrics};
use pingora_proxy::Session;

/// `logging`: counts the request in `metrics`, and an allowed PURGE by whether it removed
/// something.
pub fn on_request_end(metrics: &RequestMetrics, session: &Session, ctx: &RequestCtx) {
    if ctx.purge.allowed() {
        let removed = session
            .response_written()
            .is_some_and(|r| r.status == http::StatusCode::OK);
        metrics.on_purge(removed);
        return;
    }
    let status = ctx.cache_status.as_ref();
    metrics.on_request_end(&FinishedRequest {
        outcome: status.map_or(CacheOutcome::Pass, |s| s.outcome()),
        tier: status.and_then(|s| s.tier),
        body_bytes: session.body_bytes_sent() as u64,
        duration: ctx.started.elapsed(),
        coalesced: session.cache.lock_duration().is_some(),
        direct: ctx.direct_pass,
        direct_miss: ctx.direct_miss,
    });
}
