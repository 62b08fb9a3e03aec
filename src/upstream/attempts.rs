//! One request's way through the upstream, phase by phase: the backend each attempt goes to, what
//! a failure reports to passive health, whether a failed attempt is tried again on another
//! backend, and the `total` deadline.
//!
//! [`RequestUpstream`] is the per-request state, kept in the proxy's request context. The proxy
//! calls one method of [`Upstream`] from each phase, in the shape of `compression`'s `on_*`
//! functions:
//!
//! | Pingora phase                   | here                            |
//! |---------------------------------|---------------------------------|
//! | `upstream_peer`                 | [`Upstream::on_peer`]           |
//! | `fail_to_connect`               | [`Upstream::on_connect_failure`]|
//! | `error_while_proxy`             | [`Upstream::on_proxy_error`]    |
//! | `upstream_response_filter`      | [`Upstream::on_response`]       |
//! | `upstream_response_body_filter` | [`Upstream::on_body`]           |
//!
//! The retry rules are [`super::retry`]'s, with the budget configured once for the pool.

use super::backend::{Backend, InFlight};
use super::passive::{self, Failure};
use super::timeouts::TotalDeadline;
use super::{fairness, Upstream};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_proxy::Session;
use std::sync::Arc;
use std::time::Instant;

/// What one request carries through its upstream attempts (kept in the proxy's context, so
/// everything here is released when the request ends, however it ends).
#[derive(Debug, Default)]
pub struct RequestUpstream {
    /// Backends already attempted, excluded from the next choice.
    pub tried: Vec<std::net::SocketAddr>,
    /// The backend of the current attempt, counted in flight.
    pub current: Option<InFlight>,
    /// The client's fairness slot, if a cap is configured.
    pub admission: Option<fairness::Admission>,
    /// When the whole upstream exchange must be over.
    pub deadline: Option<TotalDeadline>,
    /// The backend group a request rule chose (`None`: the default pool).
    pub group: Option<Arc<str>>,
    /// When the current attempt started (`None`: the request has not gone upstream).
    started: Option<Instant>,
    /// Milliseconds from the start of the last attempt to the origin's response head.
    response_ms: Option<f64>,
    /// The status the origin answered with.
    status: Option<u16>,
}

impl RequestUpstream {
    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.tried.len() as u32
    }

    /// The backend of the current attempt.
    pub fn backend(&self) -> Option<&Arc<Backend>> {
        self.current.as_ref().map(|c| c.backend())
    }

    /// Whether the request has gone (or is going) upstream.
    pub fn started(&self) -> bool {
        self.started.is_some()
    }

    /// Milliseconds the origin took to answer the last attempt with a response head.
    pub fn response_ms(&self) -> Option<f64> {
        self.response_ms
    }

    /// The status the origin answered with, if it answered.
    pub fn status(&self) -> Option<u16> {
        self.status
    }
}

impl Upstream {
    /// `upstream_peer`: starts this attempt's clock (and the request's `total` deadline on the
    /// first attempt) and picks its backend, `key` being the cache key (for `consistent`).
    pub fn on_peer(&self, request: &mut RequestUpstream, key: &[u8]) -> Result<Box<HttpPeer>> {
        request.started = Some(Instant::now());
        let total = self.config().timeouts.total;
        request
            .deadline
            .get_or_insert_with(|| TotalDeadline::start(total));
        let Some(selection) = self.select_in(request.group.as_deref(), key, &request.tried) else {
            return Error::e_explain(ErrorType::HTTPStatus(502), "no backend configured");
        };
        request.tried.push(selection.in_flight.backend().addr);
        request.current = Some(selection.in_flight);
        Ok(Box::new(selection.peer))
    }

    /// `fail_to_connect`: counts the failure against the backend, and marks the error for a
    /// retry when another backend is left to try and the retry rules allow it.
    pub fn on_connect_failure(&self, request: &RequestUpstream, session: &Session, e: &mut Error) {
        if let Some(backend) = request.backend() {
            passive::report(backend, Failure::Connect, &self.config().passive);
        }
        let method = &session.req_header().method;
        e.set_retry(
            self.has_untried(request.group.as_deref(), &request.tried)
                && self.retry().may_retry(method, request.attempts(), false),
        );
    }

    /// `error_while_proxy`: an error of the origin counts against the backend and is retried
    /// when nothing reached the client yet, the request body can be replayed and the retry rules
    /// allow it; errors from elsewhere (the client, say) are not retried.
    pub fn on_proxy_error(&self, request: &RequestUpstream, session: &Session, e: &mut Error) {
        let from_upstream = e.esource() == &ErrorSource::Upstream;
        if from_upstream {
            if let Some(backend) = request.backend() {
                passive::report(backend, Failure::Proxy, &self.config().passive);
            }
        }
        let started = session.response_written().is_some();
        let replayable = !session.as_ref().retry_buffer_truncated();
        let method = &session.req_header().method;
        e.set_retry(
            from_upstream
                && replayable
                && self.retry().may_retry(method, request.attempts(), started),
        );
    }

    /// `upstream_response_filter`: notes the status and the time to the response head; a 5xx
    /// counts against the backend.
    pub fn on_response(&self, request: &mut RequestUpstream, status: http::StatusCode) {
        request.status = Some(status.as_u16());
        if status.is_server_error() {
            if let Some(backend) = request.backend() {
                let failure = Failure::ServerError(status.as_u16());
                passive::report(backend, failure, &self.config().passive);
            }
        }
        if let Some(started) = request.started {
            request.response_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
        }
    }

    /// `upstream_response_body_filter`: ends the exchange once `balancer.timeouts.total` has
    /// passed.
    pub fn on_body(&self, request: &RequestUpstream) -> Result<()> {
        if request.deadline.is_some_and(|d| d.expired()) {
            return Error::e_explain(ErrorType::ReadTimedout, "balancer.timeouts.total exceeded");
        }
        Ok(())
    }
}
