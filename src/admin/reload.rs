//! `POST /reload`: the same reload as SIGHUP ([`crate::lifecycle::reload`]), for operators and
//! tools that reach the admin listener rather than the process, with the answer in the reply.
//!
//! ```text
//! 200 {"reloaded": true, "needs_restart": []}                    applied
//! 200 {"reloaded": true, "needs_restart": ["listen"]}            applied, but these keys kept
//!                                                                 their running value
//! 422 {"reloaded": false, "error": "invalid config: ..."}        refused, nothing changed
//! ```
//!
//! It is authenticated like the invalidation API ([`super::auth`]): allowed address and bearer
//! token.

use crate::lifecycle::reload::Reloader;

/// Reloads and renders the outcome as status and JSON body.
pub fn on_request(reloader: &Reloader) -> (u16, String) {
    let (status, body) = match reloader.reload() {
        Ok(done) => (
            200,
            serde_json::json!({ "reloaded": true, "needs_restart": done.needs_restart }),
        ),
        Err(e) => (
            422,
            serde_json::json!({ "reloaded": false, "error": e.to_string() }),
        ),
    };
    let mut body = body.to_string();
    body.push('\n');
    (status, body)
}
