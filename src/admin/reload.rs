//! `POST /reload`: the same reload as SIGHUP ([`crate::lifecycle::reload`]), for operators and
//! tools that reach the admin listener rather than the process, with the answer in the reply.
//!
//! ```text
//! 200 {"reloaded": true, "needs_restart": []}                    applied
//! 200 {"reloaded": true, "needs_restart": ["listen"]}            applied, but these keys kept
//!                                                                 their running value
//! 422 {"reloaded": false, "error": "invalid config: ..."}        refused, nothing changed
//! 409 {"reloaded": false, "error": "a reload is running ..."}    not started: one reload runs
//!                                                                 and another waits to read
//!                                                                 the file after this request
//! ```
//!
//! The reload runs on a thread of its own ([`Reloader::start`]) and the request waits for it
//! there, not on the admin listener's runtime: a file that blocks its reader (a FIFO, a hung
//! mount) holds only that request, and purges and bans are still answered.
//!
//! It is authenticated like the invalidation API ([`super::auth`]): allowed address and bearer
//! token.

use crate::lifecycle::reload::{Busy, Reloader};
use std::sync::Arc;

/// Reloads and renders the outcome as status and JSON body.
pub async fn on_request(reloader: &Arc<Reloader>) -> (u16, String) {
    let (tell, outcome) = tokio::sync::oneshot::channel();
    let started = reloader.start(move |outcome| {
        let _ = tell.send(outcome);
    });
    let (status, body) = match started {
        Err(busy) => (
            if busy == Busy::Waiting { 409 } else { 503 },
            serde_json::json!({ "reloaded": false, "error": busy.to_string() }),
        ),
        Ok(()) => match outcome.await {
            Ok(Ok(done)) => (
                200,
                serde_json::json!({ "reloaded": true, "needs_restart": done.needs_restart }),
            ),
            Ok(Err(e)) => (
                422,
                serde_json::json!({ "reloaded": false, "error": e.to_string() }),
            ),
            // the reload thread ended without an outcome (it panicked)
            Err(_) => (
                500,
                serde_json::json!({ "reloaded": false, "error": "the reload failed" }),
            ),
        },
    };
    let mut body = body.to_string();
    body.push('\n');
    (status, body)
}
