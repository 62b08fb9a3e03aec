//! The RFC 9211 `Cache-Status` header: how this cache handled the request.
//!
//! One value per response, e.g. `lacquer; hit; ttl=58`, `lacquer; fwd=uri-miss; stored`,
//! `lacquer; fwd=stale; fwd-status=304`, `lacquer; fwd=method`. A stale response served because
//! the origin failed says so with the failure: `lacquer; fwd=stale; fwd-status=503; ttl=-4;
//! detail=origin-503` (RFC 9211 §2.2, §2.8). With `cache.announce = "tier"` a hit names the tier
//! it was read from: `lacquer; hit; ttl=58; detail=memcached`. The same classification feeds the
//! access log's cache and tier fields and the request metrics.

use crate::observe::metrics::CacheOutcome;
use crate::storage::tier::Tier;
use pingora_cache::{CachePhase, NoCacheReason};
use pingora_error::{Error, ErrorType};

/// Why a request went forward to the origin (RFC 9211 §2.2 `fwd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// The cache was configured or asked not to be used for this request.
    Bypass,
    /// The method is not cacheable.
    Method,
    /// No stored response for the URI.
    UriMiss,
    /// Stored responses exist but none matches the request's `Vary`-selected fields.
    VaryMiss,
    /// A stored response was stale and went to the origin.
    Stale,
    /// The request's own directives required going to the origin.
    Request,
    /// A stored partial response was completed with a fetch of its missing part.
    Partial,
}

impl Forward {
    fn as_str(self) -> &'static str {
        match self {
            Forward::Bypass => "bypass",
            Forward::Method => "method",
            Forward::UriMiss => "uri-miss",
            Forward::VaryMiss => "vary-miss",
            Forward::Stale => "stale",
            Forward::Request => "request",
            Forward::Partial => "partial",
        }
    }
}

/// How the origin failed when a stale response was served in its place (RFC 9111 §4.2.4), for
/// the `detail` of `Cache-Status` and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OriginFailure {
    /// The origin answered with this 5xx status.
    Status(u16),
    /// No connection could be made (refused, no route, connect or TLS failure).
    Unreachable,
    /// The origin accepted but did not answer in time.
    Timeout,
    /// The origin closed the connection without a complete answer.
    Closed,
    /// Any other failure of the origin's answer (malformed, reset).
    Error,
}

impl OriginFailure {
    /// Classifies the error with which Pingora offers the stale response.
    pub fn of(error: &Error) -> OriginFailure {
        match error.etype() {
            ErrorType::HTTPStatus(code) => OriginFailure::Status(*code),
            ErrorType::ConnectTimedout
            | ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::ConnectProxyFailure
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError => OriginFailure::Unreachable,
            ErrorType::ReadTimedout | ErrorType::WriteTimedout => OriginFailure::Timeout,
            ErrorType::ConnectionClosed => OriginFailure::Closed,
            _ => OriginFailure::Error,
        }
    }

    /// The `detail` token (RFC 9211 §2.8).
    pub fn detail(self) -> &'static str {
        match self {
            OriginFailure::Status(500) => "origin-500",
            OriginFailure::Status(502) => "origin-502",
            OriginFailure::Status(503) => "origin-503",
            OriginFailure::Status(504) => "origin-504",
            OriginFailure::Status(_) => "origin-5xx",
            OriginFailure::Unreachable => "origin-unreachable",
            OriginFailure::Timeout => "origin-timeout",
            OriginFailure::Closed => "origin-closed",
            OriginFailure::Error => "origin-error",
        }
    }

    /// The status the origin answered with, if it answered.
    fn status(self) -> Option<u16> {
        match self {
            OriginFailure::Status(code) => Some(code),
            _ => None,
        }
    }
}

/// The `detail` of a request that asked to switch protocols (a WebSocket): never cached.
const UPGRADE_DETAIL: &str = "upgrade";

/// A classified response, renderable as `Cache-Status` and as a short log word.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStatus {
    /// Served from cache without contacting the origin.
    pub hit: bool,
    /// Why the origin was contacted, if it was.
    pub fwd: Option<Forward>,
    /// Status the origin answered with, when forwarded.
    pub fwd_status: Option<u16>,
    /// The response was stored.
    pub stored: bool,
    /// Remaining freshness in seconds (negative when stale), on hits.
    pub ttl: Option<i64>,
    /// Extra detail such as why a response was not stored.
    pub detail: Option<&'static str>,
    /// A stale response was served because the origin failed.
    pub stale_on_error: bool,
    /// The tier a stored response was read from (hits, and stale responses served).
    pub tier: Option<Tier>,
}

/// What the proxy noted about the request while handling it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observations {
    /// Cache was never enabled because the method is not cacheable.
    pub method_not_cacheable: bool,
    /// Cache was skipped on the client's request (`no-store`).
    pub bypassed: bool,
    /// Cache is switched off by configuration (`cache.enabled = false`).
    pub disabled: bool,
    /// A lookup found other variants but not this one.
    pub vary_miss: bool,
    /// The origin's response was judged storable.
    pub storable: bool,
    /// Why it was not storable, when judged.
    pub not_stored_reason: Option<&'static str>,
    /// The client's own directives sent a stored response to the origin.
    pub client_forced: bool,
    /// The origin failed and Pingora was allowed to serve the stale stored response instead.
    pub origin_failure: Option<OriginFailure>,
    /// The client asked to switch protocols: the request went to the origin uncached.
    pub upgrade: bool,
}

impl CacheStatus {
    /// Classifies a finished request from the cache phase and the proxy's observations.
    pub fn classify(
        phase: CachePhase,
        seen: &Observations,
        upstream_status: Option<u16>,
        ttl: Option<i64>,
    ) -> CacheStatus {
        let miss_kind = if seen.vary_miss {
            Forward::VaryMiss
        } else {
            Forward::UriMiss
        };
        let mut status = CacheStatus {
            fwd_status: upstream_status,
            ..Default::default()
        };
        match phase {
            CachePhase::Hit | CachePhase::StaleUpdating => {
                status.hit = true;
                status.ttl = ttl;
                status.fwd_status = None;
            }
            CachePhase::Miss => {
                status.fwd = Some(miss_kind);
                status.stored = seen.storable;
                // a fill refused when it finishes (fetched under another claim's lease)
                status.detail = seen.not_stored_reason.filter(|_| !seen.storable);
            }
            CachePhase::Expired => {
                status.fwd = Some(Forward::Stale);
                status.stored = seen.storable;
            }
            CachePhase::Revalidated | CachePhase::RevalidatedNoCache(_) => {
                status.fwd = Some(Forward::Stale);
                status.stored = matches!(phase, CachePhase::Revalidated);
                status.ttl = ttl;
            }
            CachePhase::Disabled(reason) => {
                status.fwd = Some(match reason {
                    NoCacheReason::NeverEnabled if seen.upgrade => Forward::Bypass,
                    NoCacheReason::NeverEnabled if seen.method_not_cacheable => Forward::Method,
                    NoCacheReason::NeverEnabled if seen.disabled => Forward::Bypass,
                    NoCacheReason::NeverEnabled if seen.bypassed => Forward::Request,
                    NoCacheReason::NeverEnabled => Forward::Bypass,
                    // decided after a lookup: the response turned out not storable
                    _ => miss_kind,
                });
                status.detail = seen.not_stored_reason.or(match reason {
                    NoCacheReason::NeverEnabled if seen.upgrade => Some(UPGRADE_DETAIL),
                    NoCacheReason::NeverEnabled => None,
                    other => Some(other.as_str()),
                });
            }
            // still Stale after the origin was asked: its failure made us serve the stored copy
            CachePhase::Stale if seen.origin_failure.is_some() => {
                let failure = seen.origin_failure.unwrap_or(OriginFailure::Error);
                status.fwd = Some(Forward::Stale);
                status.fwd_status = failure.status().or(upstream_status);
                status.ttl = ttl;
                status.detail = Some(failure.detail());
                status.stale_on_error = true;
            }
            CachePhase::Bypass | CachePhase::Uninit | CachePhase::CacheKey | CachePhase::Stale => {
                status.fwd = Some(Forward::Bypass);
            }
        }
        if seen.client_forced && status.fwd == Some(Forward::Stale) {
            status.fwd = Some(Forward::Request);
        }
        if status.fwd.is_none() && !status.hit {
            status.fwd = Some(Forward::Bypass);
        }
        status
    }

    /// Renders the RFC 9211 field value with our cache's name; `with_tier`: a hit names the tier
    /// it was read from (`detail=memory`, `detail=memcached`).
    ///
    /// Room for the name and 64 bytes more: a `no-store` pass's value (about 55 bytes with the
    /// name) outgrew the 48 bytes this had, and was reallocated on every pass (about 250
    /// instructions, `docs/benchmarks.md`, 2026-12-07); the allocation costs the same either way.
    pub fn header_value(&self, name: &str, with_tier: bool) -> String {
        let mut out = String::with_capacity(name.len() + 64);
        self.write_header_value(name, with_tier, &mut out);
        out
    }

    /// [`Self::header_value`], appended to `out`.
    pub fn write_header_value(&self, name: &str, with_tier: bool, out: &mut String) {
        out.push_str(name);
        if self.hit {
            out.push_str("; hit");
        }
        if let Some(fwd) = self.fwd {
            out.push_str("; fwd=");
            out.push_str(fwd.as_str());
        }
        if let Some(code) = self.fwd_status {
            if self.fwd.is_some() {
                out.push_str("; fwd-status=");
                push_integer(out, i64::from(code));
            }
        }
        if self.stored {
            out.push_str("; stored");
        }
        if let Some(ttl) = self.ttl {
            out.push_str("; ttl=");
            push_integer(out, ttl);
        }
        let tier = self.tier.filter(|_| with_tier && self.hit);
        if let Some(detail) = self.detail.or(tier.map(Tier::label)) {
            out.push_str("; detail=");
            out.push_str(detail);
        }
    }

    /// Notes the tier the stored response was read from, when the response's body is that
    /// stored one (a hit, a revalidated or stale response served), not the origin's.
    pub fn served_from(mut self, tier: Option<Tier>) -> Self {
        let from_storage = matches!(
            self.outcome(),
            CacheOutcome::Hit | CacheOutcome::Revalidated
        ) || self.stale_on_error;
        self.tier = tier.filter(|_| from_storage);
        self
    }

    /// How the request was handled, in one word: hit, miss, stale, revalidated, pass.
    pub fn outcome(&self) -> CacheOutcome {
        match (self.hit, self.fwd) {
            (true, _) => CacheOutcome::Hit,
            (false, Some(Forward::Stale)) if self.stale_on_error => CacheOutcome::Stale,
            (false, Some(Forward::UriMiss | Forward::VaryMiss | Forward::Partial)) => {
                CacheOutcome::Miss
            }
            (false, Some(Forward::Stale)) if self.ttl.is_some() => CacheOutcome::Revalidated,
            (false, Some(Forward::Stale)) => CacheOutcome::Stale,
            _ => CacheOutcome::Pass,
        }
    }

    /// One word for the access log: hit, miss, stale, revalidated, pass, tunnel (an upgraded
    /// connection, counted as a pass by the metrics).
    pub fn log_word(&self) -> &'static str {
        if !self.hit && self.fwd == Some(Forward::Bypass) && self.detail == Some(UPGRADE_DETAIL) {
            return "tunnel";
        }
        self.outcome().label()
    }
}

/// Appends a decimal integer without the formatting machinery (this runs on every response).
fn push_integer(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
    }
    let mut digits = [0u8; 20];
    let mut rest = n.unsigned_abs();
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for &digit in &digits[start..] {
        out.push(digit as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_render_as_decimal() {
        for n in [0i64, 7, 10, 58, -1, -120, 31_536_000, i64::MAX, i64::MIN] {
            let mut out = String::new();
            push_integer(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    #[test]
    fn renders_rfc9211_values() {
        let hit = CacheStatus::classify(CachePhase::Hit, &Observations::default(), None, Some(58));
        assert_eq!(hit.header_value("lacquer", true), "lacquer; hit; ttl=58");
        let from_memcached = CacheStatus {
            tier: Some(Tier::Memcached),
            ..hit.clone()
        };
        assert_eq!(
            from_memcached.header_value("lacquer", true),
            "lacquer; hit; ttl=58; detail=memcached"
        );
        assert_eq!(
            from_memcached.header_value("lacquer", false),
            "lacquer; hit; ttl=58"
        );
        let seen = Observations {
            storable: true,
            ..Default::default()
        };
        let miss = CacheStatus::classify(CachePhase::Miss, &seen, Some(200), None);
        assert_eq!(
            miss.header_value("lacquer", true),
            "lacquer; fwd=uri-miss; fwd-status=200; stored"
        );
        let post = Observations {
            method_not_cacheable: true,
            ..Default::default()
        };
        let pass = CacheStatus::classify(
            CachePhase::Disabled(NoCacheReason::NeverEnabled),
            &post,
            Some(201),
            None,
        );
        assert_eq!(
            pass.header_value("lacquer", true),
            "lacquer; fwd=method; fwd-status=201"
        );
    }

    #[test]
    fn stale_served_on_an_origin_failure_says_why() {
        let failed = |failure| Observations {
            origin_failure: Some(failure),
            ..Default::default()
        };
        let status = CacheStatus::classify(
            CachePhase::Stale,
            &failed(OriginFailure::Status(503)),
            None,
            Some(-4),
        );
        assert_eq!(
            status.header_value("lacquer", true),
            "lacquer; fwd=stale; fwd-status=503; ttl=-4; detail=origin-503"
        );
        assert_eq!(status.log_word(), "stale");
        let closed = CacheStatus::classify(
            CachePhase::Stale,
            &failed(OriginFailure::of(&Error::new(ErrorType::ConnectionClosed))),
            None,
            Some(-1),
        );
        assert_eq!(
            closed.header_value("lacquer", true),
            "lacquer; fwd=stale; ttl=-1; detail=origin-closed"
        );
    }
}
