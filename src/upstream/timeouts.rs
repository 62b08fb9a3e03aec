//! Per-upstream timeouts: connect, first byte, idle between bytes, total.
//!
//! Connect maps onto Pingora's connection timeouts. Pingora 0.9.1 keeps a single per-read timer
//! on an upstream HTTP/1 session, used both while waiting for the response head and between
//! body reads, so it is set to the longer of `first_byte` and `idle`: neither wait can exceed
//! its own limit by more than the difference.
//!
//! `total` bounds one request's whole way through the upstream ([`TotalDeadline`], started by
//! its first attempt): each attempt's connect, read and write timers are cut to what is left of
//! it ([`clamp`]), so neither a connect nor a single read, in any attempt, can outlast it; the
//! response head, interim (1xx) heads included, must have been read by it ([`bound`]); no
//! attempt starts once it has passed, nor after a wait for a `max_in_flight` slot outlasted it
//! (the wait itself is cut there, `super::attempts`); and it is checked as body bytes arrive, so
//! a response that trickles forever is cut once it passes the limit. (A body that stops flowing
//! altogether is cut by the read timer, which was clamped when its attempt began.)
//!
//! The read timer is reset on every read, so clamping it alone did not bound a head that
//! trickles in (a byte of a field value every 100 ms) or an origin sending `102 Processing`
//! forever: each read came well within it. The head's deadline is a point in time the HTTP/1
//! client session checks before and during each read of a head (vendored pingora-core 0039,
//! `PeerOptions::response_head_deadline`), on both forwarding paths, since both make their
//! upstream session from the attempt's peer.

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

/// Bounds an attempt's peer by the request's deadline: every timer cut to what is left of it
/// ([`clamp`]), and every response head of the attempt (interim ones included) to be read by
/// then. `false`, the peer untouched, once the deadline has passed.
pub fn bound(peer: &mut HttpPeer, deadline: TotalDeadline) -> bool {
    let Some(remaining) = deadline.remaining() else {
        return false;
    };
    clamp(peer, remaining);
    peer.options.response_head_deadline = Some(deadline.0);
    true
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
    fn bounding_sets_the_head_deadline_and_refuses_a_passed_one() {
        let mut peer = HttpPeer::new("127.0.0.1:80", false, String::new());
        peer.options.read_timeout = Some(Duration::from_secs(30));
        let deadline = TotalDeadline::start(Duration::from_secs(2));
        assert!(bound(&mut peer, deadline));
        assert_eq!(peer.options.response_head_deadline, Some(deadline.0));
        assert!(peer.options.read_timeout <= Some(Duration::from_secs(2)));
        let mut late = HttpPeer::new("127.0.0.1:80", false, String::new());
        assert!(!bound(&mut late, TotalDeadline::start(Duration::ZERO)));
        assert_eq!(late.options.response_head_deadline, None);
    }

    /// The session a connector (or the direct path) makes for a bounded peer stops reading a
    /// head that trickles in at the deadline, though each byte comes well within the read
    /// timer; a head already complete is still read.
    #[tokio::test]
    async fn a_trickled_head_is_cut_at_the_deadline() {
        use pingora_core::protocols::http::v1::client::HttpSession;
        use pingora_core::protocols::l4::stream::Stream as L4Stream;
        use tokio::io::AsyncWriteExt;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let origin = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let _ = conn.write_all(b"HTTP/1.1 102 Processing\r\n\r\n").await;
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nX-Slow: ").await;
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if conn.write_all(b"a").await.is_err() {
                    return;
                }
            }
        });
        let mut peer = HttpPeer::new(addr, false, String::new());
        peer.options.read_timeout = Some(Duration::from_secs(5));
        assert!(bound(
            &mut peer,
            TotalDeadline::start(Duration::from_millis(300))
        ));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut session = HttpSession::new_with_options(Box::new(L4Stream::from(tcp)), &peer);
        let started = Instant::now();
        session
            .read_response()
            .await
            .expect("the complete interim head");
        assert_eq!(session.get_status().map(|s| s.as_u16()), Some(102));
        let cut = session.read_response().await.unwrap_err();
        assert_eq!(cut.etype(), &pingora_error::ErrorType::ReadTimedout);
        // cut by the deadline, not by the 5 s read timer (which each byte resets)
        let took = started.elapsed();
        assert!(took < Duration::from_secs(4), "cut after {took:?}");
        origin.abort();
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
