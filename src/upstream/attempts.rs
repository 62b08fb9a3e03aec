//! One request's way through the upstream, phase by phase: the backend each attempt goes to, what
//! a failure reports to passive health, whether a failed attempt is tried again on another
//! backend, the `total` deadline, and the status a request that failed upstream is answered with.
//!
//! * A failed attempt is retried only on a backend not tried yet: a backend that just hung,
//!   reset or refused is not asked the same again.
//! * The one exception is a pooled connection that turned out dead before anything of the
//!   response came back: the origin closed it while it sat idle, and its close crossed the
//!   request on the wire. That is the pool's race, not the backend's failure: the request goes
//!   again to the same backend, over a new connection (the pool's other connections to it may
//!   be dead too: an origin that restarted closed them all), is not counted against
//!   `balancer.retries` nor reported to passive health, as Varnish retries once a request whose
//!   recycled backend connection failed before the response began. Once per request
//!   ([`DEAD_POOLED_RETRIES`]): the new connection cannot be a pooled one.
//! * No attempt starts after `balancer.timeouts.total`: neither before nor after a wait for a
//!   `max_in_flight` slot, and that wait ends at the deadline ([`acquire_by`]); each attempt's
//!   timers are cut to what is left of it and its response heads must be read by then
//!   (`super::timeouts`).
//! * A timeout towards the origin is answered `504 Gateway Timeout` (RFC 9110 §15.6.5), any
//!   other failure of the origin `502 Bad Gateway` ([`failure_status`]).
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
//! | `fail_to_proxy`                 | [`failure_status`]              |
//!
//! The retry rules are [`super::retry`]'s, with the budget configured once for the pool.

use super::backend::{Backend, InFlight};
use super::passive::{self, Failure};
use super::timeouts::{self, TotalDeadline};
use super::{fairness, retry, Upstream};
use crate::config::balancing::Algorithm;
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
    /// The slot on a backend with `max_in_flight`, held until the request ends.
    pub slot: Option<super::concurrency::Slot>,
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
    /// Pooled connections found dead so far (see the module doc).
    dead_pooled: u32,
    /// The next attempt goes to the backend of the last one again: its pooled connection was
    /// dead.
    again: bool,
}

/// How many dead pooled connections one request may meet and go on, outside the retry budget
/// (see the module doc): the attempt after one connects anew, so it cannot meet another.
pub const DEAD_POOLED_RETRIES: u32 = 1;

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
    /// first attempt) and picks its backend; on a backend with `max_in_flight`, waits for a slot
    /// (503 when the queue is full or its timeout ends the wait, 504 when `total` does). Then
    /// the attempt's peer is bounded by what is left of `total`. `key` gives the cache key's
    /// text, asked for only by `consistent` hashing, so that a request no cache work needs (a
    /// POST) does not build it for the balancer alone.
    pub async fn on_peer<'k>(
        &self,
        request: &mut RequestUpstream,
        key: impl FnOnce() -> &'k [u8],
    ) -> Result<Box<HttpPeer>> {
        request.started = Some(Instant::now());
        // what an earlier attempt's origin answered is not this attempt's: a head that was cut
        // short and retried must not make this attempt's dead pooled connection look answered
        request.status = None;
        request.response_ms = None;
        let total = self.config().timeouts.total;
        let deadline = *request
            .deadline
            .get_or_insert_with(|| TotalDeadline::start(total));
        if deadline.expired() {
            return Error::e_explain(ErrorType::HTTPStatus(504), TOTAL_EXCEEDED);
        }
        // over a new connection (vendored pingora-core's `fresh_connection`)
        let again = std::mem::take(&mut request.again)
            .then(|| request.backend().map(|backend| self.selection_of(backend)))
            .flatten()
            .map(|mut selection| {
                selection.peer.options.fresh_connection = true;
                selection
            });
        let mut selection = match again {
            // already in `tried`: this attempt is not counted
            Some(selection) => selection,
            None => {
                let key = match self.config().algorithm {
                    Algorithm::Consistent => key(),
                    _ => &[],
                };
                let Some(selection) = self.select_in(request.group.as_deref(), key, &request.tried)
                else {
                    return Error::e_explain(ErrorType::HTTPStatus(502), "no backend configured");
                };
                request.tried.push(selection.in_flight.backend().addr);
                selection
            }
        };
        // a retry gives up the slot of the attempt before it first
        request.slot = None;
        if let Some(limit) = &selection.in_flight.backend().limit {
            request.slot = Some(acquire_by(limit, deadline).await?);
        }
        // after the wait for a slot, which took some of the time left: a request that came out
        // of the queue with none left does not reach the origin (before 2026-12-07 it did, its
        // timers clamped to what had been left before the wait: a POST was applied, its client
        // answered with a cut body, `tests/retry_idempotency_attacks.rs`)
        if !timeouts::bound(&mut selection.peer, deadline) {
            request.slot = None;
            return Error::e_explain(ErrorType::HTTPStatus(504), TOTAL_EXCEEDED);
        }
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
                && !request.deadline.is_some_and(|d| d.expired())
                && self.retry().may_retry(method, request.attempts(), false),
        );
    }

    /// `error_while_proxy`: an error of the origin counts against the backend and is retried
    /// when nothing reached the client yet, the request body can be replayed, the retry rules
    /// allow it, time is left and there is another backend to go to; errors from elsewhere (the
    /// client, say) are not retried. A pooled connection (`client_reused`) that was dead before
    /// any of the response came back is the exception of the module doc: the request goes
    /// again to the same backend, outside the budget and unreported.
    pub fn on_proxy_error(
        &self,
        request: &mut RequestUpstream,
        session: &Session,
        e: &mut Error,
        client_reused: bool,
    ) {
        let from_upstream = e.esource() == &ErrorSource::Upstream;
        let started = session.response_written().is_some();
        let replayable = !session.as_ref().retry_buffer_truncated();
        let method = &session.req_header().method;
        let in_time = !request.deadline.is_some_and(|d| d.expired());
        let dead_pooled_connection = from_upstream
            && client_reused
            && request.status.is_none()
            && !is_timeout(e.etype())
            && request.dead_pooled < DEAD_POOLED_RETRIES;
        if dead_pooled_connection {
            let again = replayable && in_time && !started && retry::is_idempotent(method);
            if again {
                request.dead_pooled += 1;
                request.again = true;
            }
            e.set_retry(again);
            return;
        }
        if from_upstream {
            if let Some(backend) = request.backend() {
                passive::report(backend, Failure::Proxy, &self.config().passive);
            }
        }
        e.set_retry(
            from_upstream
                && replayable
                && in_time
                && self.has_untried(request.group.as_deref(), &request.tried)
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
            let elapsed = started.elapsed();
            request.response_ms = Some(elapsed.as_secs_f64() * 1000.0);
            if let Some(backend) = request.backend() {
                backend.record_response_time(elapsed);
            }
        }
    }

    /// `upstream_response_body_filter`: ends the exchange once `balancer.timeouts.total` has
    /// passed.
    pub fn on_body(&self, request: &RequestUpstream) -> Result<()> {
        if request.deadline.is_some_and(|d| d.expired()) {
            return Error::e_explain(ErrorType::ReadTimedout, TOTAL_EXCEEDED);
        }
        Ok(())
    }

    /// For `upstream_response_body_filter` (the proxy's `on_upstream_body`, which every path's
    /// relay runs) at the end of the body (`end_of_stream`): the origin has
    /// sent its whole answer, so the request's `max_in_flight` slot on it is given back now,
    /// not when the request ends. The request's end comes after the last write to the client
    /// (and its flush, and logging): a client reading its answer to the end, then sending its
    /// next request, found the replica still full, and with `queue.length = 0` was answered
    /// 503 by a replica that was idle (`tests/retry_idempotency_attacks.rs`,
    /// `a_full_replica_does_not_turn_requests_away_while_another_is_idle`). An answer without a
    /// body ends so too: Pingora runs the filter with `end_of_stream` after a `HEAD`'s head.
    ///
    /// The client's fairness slot (`[fairness]`, a cap on its requests going upstream) goes
    /// back too, for the same reason: a client at its cap that sent its next request on a new
    /// connection as soon as it had the answer was answered `429` (`tests/fairness.rs`,
    /// `a_client_at_a_cap_of_one_sending_one_request_after_another_is_never_refused`, `GET`s
    /// and `HEAD`s: 26 of 300 before).
    pub fn on_body_end(&self, request: &mut RequestUpstream) {
        request.slot = None;
        request.admission = None;
    }
}

/// Why a request's upstream exchange was ended by its deadline.
const TOTAL_EXCEEDED: &str = "balancer.timeouts.total exceeded";

/// A slot on a backend at its `max_in_flight`, waiting in its queue at most until `deadline`
/// (and at most `balancer.queue.timeout`, the queue's own 503): the wait counts against
/// `balancer.timeouts.total` like any other part of the exchange, so a request whose time ran
/// out in the queue is answered 504 there, never sent late. The queue's waiter count is given
/// back when the wait is cut (`concurrency`'s guard, dropped with the wait).
async fn acquire_by(
    limit: &super::concurrency::ConcurrencyLimit,
    deadline: TotalDeadline,
) -> Result<super::concurrency::Slot> {
    let Some(left) = deadline.remaining() else {
        return Error::e_explain(ErrorType::HTTPStatus(504), TOTAL_EXCEEDED);
    };
    match tokio::time::timeout(left, limit.acquire()).await {
        Ok(slot) => slot,
        Err(_) => Error::e_explain(
            ErrorType::HTTPStatus(504),
            "balancer.timeouts.total exceeded while waiting for a slot on a backend at \
             max_in_flight",
        ),
    }
}

/// Whether an error is a timer running out (connecting, reading, writing, a TLS handshake).
fn is_timeout(etype: &ErrorType) -> bool {
    matches!(
        etype,
        ErrorType::ConnectTimedout
            | ErrorType::ReadTimedout
            | ErrorType::WriteTimedout
            | ErrorType::TLSHandshakeTimedout
    )
}

/// `fail_to_proxy`: the status a request that could not be proxied is answered with (0: the
/// client's connection is dead, or its answer's write failed or waited past `send_timeout`:
/// answer nothing). Pingora's mapping, except that a timeout on the way to or from the origin
/// (including `balancer.timeouts.total`) is `504 Gateway Timeout` rather than `502`: the origin
/// did not answer in time, which is not a bad answer.
pub fn failure_status(e: &Error) -> u16 {
    match (e.esource(), e.etype()) {
        (_, ErrorType::HTTPStatus(code)) => *code,
        (ErrorSource::Downstream, ErrorType::WriteError)
        | (ErrorSource::Downstream, ErrorType::WriteTimedout)
        | (ErrorSource::Downstream, ErrorType::ReadError)
        | (ErrorSource::Downstream, ErrorType::ConnectionClosed) => 0,
        (ErrorSource::Downstream, _) => 400,
        (_, etype) if is_timeout(etype) => 504,
        (ErrorSource::Upstream, _) => 502,
        (ErrorSource::Internal | ErrorSource::Unset, _) => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::concurrency::ConcurrencyLimit;
    use std::time::Duration;

    #[tokio::test]
    async fn a_queue_wait_ends_at_the_total_deadline() {
        let limit = ConcurrencyLimit::new(1, 4, Duration::from_secs(30));
        let held = acquire_by(&limit, TotalDeadline::start(Duration::from_secs(5)))
            .await
            .unwrap();
        let started = Instant::now();
        let late = acquire_by(&limit, TotalDeadline::start(Duration::from_millis(100)))
            .await
            .unwrap_err();
        assert_eq!(late.etype(), &ErrorType::HTTPStatus(504));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(limit.queued(), 0, "the cut waiter left the queue");
        let passed = acquire_by(&limit, TotalDeadline::start(Duration::ZERO))
            .await
            .unwrap_err();
        assert_eq!(passed.etype(), &ErrorType::HTTPStatus(504));
        drop(held);
        assert!(
            acquire_by(&limit, TotalDeadline::start(Duration::from_secs(5)))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn the_slot_is_given_back_at_the_end_of_the_body() {
        let list = "[[upstreams]]\naddress = \"127.0.0.1:1\"\nmax_in_flight = 1\n";
        let up = Upstream::new(&crate::config::Config::from_toml(list).unwrap());
        let mut request = RequestUpstream::default();
        let _peer = up.on_peer(&mut request, || &[]).await.unwrap();
        let backend = up.replicas().load().backends[0].clone();
        assert!(backend.is_full());
        up.on_body_end(&mut request);
        assert!(!backend.is_full(), "free for the next request");
    }

    #[test]
    fn timeouts_towards_the_origin_are_504_and_other_origin_failures_502() {
        let upstream = |etype| {
            let mut e = Error::new(etype);
            e.esource = ErrorSource::Upstream;
            e
        };
        assert_eq!(failure_status(&upstream(ErrorType::ReadTimedout)), 504);
        assert_eq!(failure_status(&upstream(ErrorType::ConnectTimedout)), 504);
        assert_eq!(failure_status(&upstream(ErrorType::ConnectRefused)), 502);
        assert_eq!(failure_status(&upstream(ErrorType::ConnectionClosed)), 502);
        // the total deadline, raised in a body filter, carries no source of its own
        assert_eq!(failure_status(&Error::new(ErrorType::ReadTimedout)), 504);
        assert_eq!(failure_status(&Error::new(ErrorType::HTTPStatus(429))), 429);
        let mut client_gone = Error::new(ErrorType::ConnectionClosed);
        client_gone.esource = ErrorSource::Downstream;
        assert_eq!(failure_status(&client_gone), 0);
        // a client that left an answer's write waiting past `send_timeout` is answered nothing
        // more: part of its answer may be out (before 2026-12-07, a 504 head went inside the
        // body of a hit, `tests/file_body_hits.rs`)
        let mut client_not_reading = Error::new(ErrorType::WriteTimedout);
        client_not_reading.esource = ErrorSource::Downstream;
        assert_eq!(failure_status(&client_not_reading), 0);
        let mut client_slow = Error::new(ErrorType::ReadTimedout);
        client_slow.esource = ErrorSource::Downstream;
        assert_eq!(
            failure_status(&client_slow),
            400,
            "not the origin's timeout"
        );
    }
}
