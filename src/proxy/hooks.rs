//! Phase hooks for programs that embed Lacquer: their own code in the request path, the way
//! Pingora users extend a proxy, without copying `LacquerProxy`.
//!
//! A [`PhaseHooks`] value is handed to [`crate::server::run_with_hooks`] (or
//! [`super::LacquerProxy::with_hooks`] for a program that builds its own Pingora server). Lacquer
//! calls it from its own phases, at the points where a custom rule can act:
//!
//! * [`PhaseHooks::request_filter`] after the `[[rules]]` and before the fast path: the request
//!   can still be changed (headers that select a `Vary` variant, the query), the rules'
//!   [`Verdict`] read and changed (`pass`, the backend group), or the request answered here;
//! * [`PhaseHooks::response_filter`] on every response head to the client, fast-path hits
//!   included, after the rules' response header edits.
//!
//! With no hooks (the `lacquer` binary) each call point is one test of an `Option`.
//! `examples/device_rule.rs` is a complete program; `tests/embedding.rs` builds and runs it.

use crate::rules::Verdict;
use async_trait::async_trait;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;

/// Code of the embedding program, called from Lacquer's phases. Every method has a default that
/// does nothing, so a hook implements only the phases it needs.
#[async_trait]
pub trait PhaseHooks: Send + Sync + 'static {
    /// `request_filter`, after the request rules, before the cache is looked up. `Ok(true)`
    /// means the hook has answered the request itself (Pingora's convention).
    async fn request_filter(&self, _session: &mut Session, _rules: &mut Verdict) -> Result<bool> {
        Ok(false)
    }

    /// The head of every response sent to the client (hits, misses, passes), with the request.
    fn response_filter(&self, _req: &RequestHeader, _resp: &mut ResponseHeader) -> Result<()> {
        Ok(())
    }
}
