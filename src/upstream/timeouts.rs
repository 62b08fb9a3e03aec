//! Per-upstream timeouts: connect, first byte, idle between bytes, total.
//!
//! Connect maps onto Pingora's connection timeouts. Pingora 0.9.1 keeps a single per-read timer
//! on an upstream HTTP/1 session, used both while waiting for the response head and between
//! body reads, so it is set to the longer of `first_byte` and `idle`: neither wait can exceed
//! its own limit by more than the difference.
//!
//! `total` bounds one request's whole way through the upstream ([`TotalDeadline`], started by
//! its first attempt): each attempt's connect, read and write timers are cut to what is left of
//! it ([`clamp`]), so neither a connect nor a wait for the response head, in any attempt, can
//! outlast it; no attempt starts once it has passed; and it is checked as body bytes arrive, so
//! a response that trickles forever is cut once it passes the limit. (A body that stops flowing
//! altogether is cut by the read timer, which was clamped when its attempt began.)

use crate::config::balancing::TimeoutConfig;
use crate::config::ProxyConfig;
use pingora_core::upstreams::peer::HttpPeer;
use std::time::{Duration, Instant};

/// Sets the peer's Pingora options from the configured timeouts.
pub fn apply(peer: &mut HttpPeer, timeouts: &TimeoutConfig, proxy: &ProxyConfig) {
    let options = &mut peer.options;
    options.connection_timeout = Some(timeouts.connect);
    options.total_connection_timeout = Some(timeouts.connect);
    options.read_timeout = Some(timeouts.first_byte.max(timeouts.idle));
    options.write_timeout = Some(proxy.write_timeout);
    // how long an idle pooled connection is kept, not a per-request limit
    options.idle_timeout = Some(proxy.idle_timeout);
}

/// Cuts every timer of an attempt's peer to `remaining`, what is left of the request's `total`.
pub fn clamp(peer: &mut HttpPeer, remaining: Duration) {
    let options = &mut peer.options;
    for timer in [
        &mut options.connection_timeout,
        &mut options.total_connection_timeout,
        &mut options.read_timeout,
        &mut options.write_timeout,
    ] {
        *timer = Some(timer.map_or(remaining, |t| t.min(remaining)));
    }
}

/// The moment a request's upstream exchange must be over.
#[derive(Debug, Clone, Copy)]
pub struct TotalDeadline(Instant);

impl TotalDeadline {
    /// Starts the clock now.
    pub fn start(total: Duration) -> Self {
        TotalDeadline(Instant::now() + total)
    }

    /// Whether the deadline has passed.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.0
    }

    /// What is left before the deadline; `None` once it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        Some(self.0.saturating_duration_since(Instant::now())).filter(|left| !left.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamping_cuts_long_timers_and_keeps_short_ones() {
        let mut peer = HttpPeer::new("127.0.0.1:80", false, String::new());
        peer.options.connection_timeout = Some(Duration::from_secs(2));
        peer.options.read_timeout = Some(Duration::from_millis(100));
        clamp(&mut peer, Duration::from_millis(500));
        assert_eq!(
            peer.options.connection_timeout,
            Some(Duration::from_millis(500))
        );
        assert_eq!(peer.options.read_timeout, Some(Duration::from_millis(100)));
        assert_eq!(
            peer.options.write_timeout,
            Some(Duration::from_millis(500)),
            "an unset timer is no longer unbounded"
        );
    }

    #[test]
    fn a_passed_deadline_leaves_nothing() {
        let deadline = TotalDeadline::start(Duration::ZERO);
        assert!(deadline.expired());
        assert_eq!(deadline.remaining(), None);
        let later = TotalDeadline::start(Duration::from_secs(60));
        assert!(later
            .remaining()
            .is_some_and(|r| r > Duration::from_secs(59)));
    }
}
