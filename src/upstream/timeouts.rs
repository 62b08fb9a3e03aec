//! Per-upstream timeouts: connect, first byte, idle between bytes, total.
//!
//! Connect maps onto Pingora's connection timeouts. Pingora 0.9.1 keeps a single per-read timer
//! on an upstream HTTP/1 session, used both while waiting for the response head and between
//! body reads, so it is set to the longer of `first_byte` and `idle`: neither wait can exceed
//! its own limit by more than the difference. `total` is checked as body bytes arrive
//! ([`TotalDeadline`]), so a response that trickles forever is cut once it passes the limit.

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
}
