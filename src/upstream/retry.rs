//! Which failed attempts are tried again on another backend.
//!
//! Only requests with idempotent methods are retried, only while nothing of the response has
//! reached the client, and at most `balancer.retries.attempts` times. Connect failures and
//! errors before any response byte (a reset, a first-byte timeout) qualify; an error after the
//! client has received a header never does, because the client would see two responses.

use http::Method;

/// The retry budget and rules for one request.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Further attempts allowed after the first.
    pub attempts: u32,
}

impl RetryPolicy {
    /// Whether attempt number `made` (1 for the first) may be followed by another.
    pub fn may_retry(&self, method: &Method, made: u32, response_started: bool) -> bool {
        is_idempotent(method) && !response_started && made <= self.attempts
    }
}

/// RFC 9110 §9.2.2 idempotent methods.
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_only_idempotent_unstarted_requests_within_budget() {
        let p = RetryPolicy { attempts: 2 };
        assert!(p.may_retry(&Method::GET, 1, false));
        assert!(p.may_retry(&Method::GET, 2, false));
        assert!(!p.may_retry(&Method::GET, 3, false));
        assert!(!p.may_retry(&Method::POST, 1, false));
        assert!(!p.may_retry(&Method::GET, 1, true));
    }
}
