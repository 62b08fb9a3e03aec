//! A retried attempt never meets the cache write of the attempt that failed.
//!
//! Pingora sets a request's cache writer (its miss handler) once, when a storable response head
//! arrives, and panics when a second head tries to set another (`write handler is already
//! set`). An attempt can fail after its head started that write and still be retried, because
//! nothing has reached the client yet: an origin that announces `Content-Length: 1000`, sends
//! 100 bytes and closes, a reset or an idle timeout mid-body. Whoever decided the retry (the
//! upstream rules in `crate::upstream::attempts`, compression's identity retry, Pingora itself),
//! [`on_retry`] runs last in `error_while_proxy` and `fail_to_connect`: when the failed attempt
//! began a write, the cache is switched off for the rest of the request, which drops the
//! half-written fill (the memory tier discards it and fails any reader; nothing reaches
//! memcached) and releases the cache lock so its waiters fetch for themselves. The retry is then
//! proxied without being stored: a body that was cut short is never stored, and the next request
//! fills the cache normally.

use pingora_cache::{CachePhase, NoCacheReason};
use pingora_error::{Error, RetryType};
use pingora_proxy::Session;

/// After a failed attempt's error has been decided: when it will be retried and the attempt had
/// begun writing to the cache, abandons that write (see the module doc).
pub fn on_retry(session: &mut Session, e: &Error) {
    if e.retry != RetryType::Decided(true) {
        return;
    }
    if !matches!(
        session.cache.phase(),
        CachePhase::Miss | CachePhase::Expired
    ) {
        return;
    }
    if session.cache.miss_handler().is_some() {
        session.cache.disable(NoCacheReason::UpstreamError);
    }
}
