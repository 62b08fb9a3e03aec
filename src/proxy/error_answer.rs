//! The answer to a request that could not be proxied (`fail_to_proxy`), and whether the client's
//! HTTP/1 connection outlives it.
//!
//! Pingora's own error answer turns keep-alive off and closes the connection, because it cannot
//! tell whether the connection is between two messages. During an origin outage that made every
//! client reconnect (and repeat its TLS handshake) after each 502 or 504, when the site could
//! least afford it; nginx and Varnish keep a connection after a complete 502/503/504.
//!
//! The connection is kept only when [`keeps_connection`] finds it provably between messages:
//! the error is the origin's (a client-side or malformed-request error keeps Pingora's close),
//! nothing was written to the client before the error answer (not even an interim response),
//! the request's body has been read to its end by its own framing (so none of its bytes can be
//! taken for a next request: the standard path may meet the failure before reading a body sent
//! with the head, which is then read, briefly and boundedly; a body still arriving past that
//! bound means a close), the request is not an upgrade, and the session's keep-alive rules (HTTP/1.0 without
//! `Keep-Alive`, `Connection: close`, the request limit, shutdown) still allow reuse. Anything
//! else closes as before: a reconnect costs far less than a desynchronised connection.

use pingora_core::protocols::http::ServerSession;
use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_proxy::Session;
use std::time::Duration;

/// Whether the client's connection may carry a next request after the error answer `code`
/// for `e` is written. Asked before the answer is written, since the answer's `Connection`
/// field states the decision. HTTP/1 only: an HTTP/2 stream ends on its own, and a subrequest
/// has no connection. A request body not read to its end yet is read (by its framing) for at
/// most [`BODY_DRAIN_WAIT`] and [`BODY_DRAIN_MAX`] bytes; one that does not end within them
/// closes the connection.
pub async fn keeps_connection(session: &mut Session, e: &Error, code: u16) -> bool {
    if !is_origin_failure(e, code) || session.response_written().is_some() {
        return false;
    }
    if session.is_upgrade_req() {
        return false;
    }
    let downstream = &mut session.downstream_session;
    match downstream.as_http1() {
        Some(h1) if h1.will_keepalive() && !h1.was_upgraded() => {}
        _ => return false,
    }
    if downstream.is_body_done() {
        return true;
    }
    // a client waiting for `100 Continue` sends no body: not worth the wait
    if session
        .req_header()
        .headers
        .contains_key(http::header::EXPECT)
    {
        return false;
    }
    read_body_to_its_end(session).await
}

/// How long an error answer waits for the rest of a request body before giving the connection
/// up: the standard path meets an origin failure before it has read a body the client sent with
/// its head, which is there at once; a body still on its way is not waited for much longer.
pub const BODY_DRAIN_WAIT: Duration = Duration::from_secs(1);

/// How much of a request body an error answer reads to keep the connection: as much as
/// Lacquer's own exchange reads whole before it asks the origin.
pub const BODY_DRAIN_MAX: usize = super::direct_pass::BUFFERED_BODY_MAX;

/// Reads the rest of the request body through its framing (`Content-Length` or chunks, so none
/// of its bytes can be taken for a next request; what follows it stays buffered for the next
/// request), within [`BODY_DRAIN_WAIT`] and [`BODY_DRAIN_MAX`]. `true` when it ended.
async fn read_body_to_its_end(session: &mut Session) -> bool {
    let downstream = &mut session.downstream_session;
    let drain = async {
        let mut read = 0;
        loop {
            match downstream.read_request_body().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    if read > BODY_DRAIN_MAX {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    };
    let ended = tokio::time::timeout(BODY_DRAIN_WAIT, drain)
        .await
        .unwrap_or(false);
    ended && downstream.is_body_done()
}

/// An error on the origin's side, answered 502, 503 or 504: a failure to connect, a reset, a
/// timeout, an answer that could not be read, or Lacquer's own verdicts about its backends
/// (none configured, all busy, `balancer.timeouts.total` spent), raised as `HTTPStatus`.
fn is_origin_failure(e: &Error, code: u16) -> bool {
    if !matches!(code, 502..=504) {
        return false;
    }
    match (e.esource(), e.etype()) {
        (ErrorSource::Downstream, _) => false,
        (_, ErrorType::HTTPStatus(_)) => true,
        (ErrorSource::Upstream, _) => true,
        _ => false,
    }
}

/// Writes the error answer `code` (an empty body, as Pingora's) without turning the
/// connection's keep-alive off, for a session [`keeps_connection`] allowed to live on.
/// Pingora's `respond_error` always turns it off, and says `Connection: close`.
pub async fn write_keeping_connection(
    session: &mut Session,
    code: u16,
) -> pingora_error::Result<()> {
    let answer = ServerSession::generate_error(code);
    let downstream = &mut session.downstream_session;
    downstream.write_response_header(Box::new(answer)).await?;
    downstream.finish_body().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(source: ErrorSource, etype: ErrorType) -> Box<Error> {
        let mut e = Error::new(etype);
        e.esource = source;
        e
    }

    #[test]
    fn only_the_origins_failures_keep_the_connection() {
        use ErrorSource::*;
        use ErrorType::*;
        assert!(is_origin_failure(&error(Upstream, ConnectRefused), 502));
        assert!(is_origin_failure(&error(Upstream, ReadTimedout), 504));
        assert!(is_origin_failure(&error(Unset, HTTPStatus(504)), 504));
        assert!(is_origin_failure(&error(Unset, HTTPStatus(503)), 503));
        // a client's errors, a malformed request and Lacquer's own failures close as before
        assert!(!is_origin_failure(&error(Downstream, ReadError), 400));
        assert!(!is_origin_failure(&error(Downstream, HTTPStatus(502)), 502));
        assert!(!is_origin_failure(&error(Unset, HTTPStatus(400)), 400));
        assert!(!is_origin_failure(&error(Internal, InternalError), 500));
        assert!(!is_origin_failure(&error(Unset, ConnectRefused), 502));
    }
}
