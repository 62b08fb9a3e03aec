//! Request directives (RFC 9111 §5.2.1): what a client may ask of a stored response.
//!
//! * `no-cache` (or `Pragma: no-cache` without `Cache-Control`): revalidate before serving;
//!   honoured unless `cache.honor_client_no_cache = false` (Varnish and nginx ignore it by default).
//! * `max-age=N`: not older than N seconds; `min-fresh=N`: fresh for at least N more seconds.
//! * `max-stale[=N]`: a stale response (at most N seconds stale) is acceptable, unless the response
//!   said `must-revalidate`, `proxy-revalidate` or `no-cache`.
//! * `only-if-cached`: never go to the origin; 504 when nothing usable is stored.

use pingora_cache::cache_control::{CacheControl, DirectiveKey};
use pingora_cache::ForcedFreshness;
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::Duration;

/// The client's request directives, parsed once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestDirectives {
    pub no_cache: bool,
    pub max_age: Option<u64>,
    pub min_fresh: Option<u64>,
    /// `Some(None)`: any staleness is acceptable; `Some(Some(n))`: up to n seconds.
    pub max_stale: Option<Option<u64>>,
    pub only_if_cached: bool,
}

fn seconds(cc: &CacheControl, name: &str) -> Option<Option<u64>> {
    let value = cc.directives.get(&DirectiveKey::from_lowercase(name))?;
    Some(
        value
            .as_ref()
            .and_then(|v| v.parse_as_delta_seconds().ok())
            .map(u64::from),
    )
}

impl RequestDirectives {
    /// Parses `Cache-Control` (and `Pragma: no-cache` when there is no `Cache-Control`).
    pub fn parse(req: &RequestHeader) -> Self {
        let Some(cc) = CacheControl::from_req_headers(req) else {
            let pragma_no_cache = req
                .headers
                .get_all(http::header::PRAGMA)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| {
                    v.split(',')
                        .any(|d| d.trim().eq_ignore_ascii_case("no-cache"))
                });
            return RequestDirectives {
                no_cache: pragma_no_cache,
                ..Default::default()
            };
        };
        RequestDirectives {
            no_cache: cc.has_key("no-cache"),
            // an invalid max-age value reads as 0 (RFC 9111 §1.2.2: treat it as the most
            // restrictive choice)
            max_age: seconds(&cc, "max-age").map(|v| v.unwrap_or(0)),
            min_fresh: seconds(&cc, "min-fresh").map(|v| v.unwrap_or(0)),
            max_stale: seconds(&cc, "max-stale"),
            only_if_cached: cc.only_if_cached(),
        }
    }

    /// Whether the request carries any directive that bears on a stored response.
    pub fn any(&self) -> bool {
        *self != RequestDirectives::default()
    }

    /// How a stored response of `age`, with `remaining` freshness (negative when stale), must be
    /// treated for this request; `None` leaves the standard rules.
    pub fn judge(
        &self,
        stored: &ResponseHeader,
        age: Duration,
        remaining: i64,
        honor_no_cache: bool,
    ) -> Option<ForcedFreshness> {
        if self.no_cache && honor_no_cache {
            return Some(ForcedFreshness::ForceExpired);
        }
        if self.max_age.is_some_and(|max| age.as_secs() > max) {
            return Some(ForcedFreshness::ForceExpired);
        }
        if self.min_fresh.is_some_and(|min| remaining < min as i64) {
            return Some(ForcedFreshness::ForceExpired);
        }
        if remaining < 0 {
            if let Some(limit) = self.max_stale {
                let forbids = CacheControl::from_resp_headers(stored).is_some_and(|cc| {
                    cc.must_revalidate() || cc.proxy_revalidate() || cc.no_cache()
                });
                let within = limit.is_none_or(|n| (-remaining) as u64 <= n);
                if within && !forbids {
                    return Some(ForcedFreshness::ForceFresh);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_headers::{request, response};

    fn judge(
        req: &[(&str, &str)],
        stored: &[(&str, &str)],
        age: u64,
        remaining: i64,
    ) -> Option<ForcedFreshness> {
        RequestDirectives::parse(&request(req)).judge(
            &response(stored),
            Duration::from_secs(age),
            remaining,
            true,
        )
    }

    #[test]
    fn directives_force_revalidation_or_allow_stale() {
        assert_eq!(
            judge(&[("cache-control", "no-cache")], &[], 1, 50),
            Some(ForcedFreshness::ForceExpired)
        );
        assert_eq!(
            judge(&[("pragma", "no-cache")], &[], 1, 50),
            Some(ForcedFreshness::ForceExpired)
        );
        assert_eq!(
            judge(&[("cache-control", "max-age=10")], &[], 11, 50),
            Some(ForcedFreshness::ForceExpired)
        );
        assert_eq!(judge(&[("cache-control", "max-age=10")], &[], 9, 50), None);
        assert_eq!(
            judge(&[("cache-control", "min-fresh=60")], &[], 1, 50),
            Some(ForcedFreshness::ForceExpired)
        );
        assert_eq!(
            judge(&[("cache-control", "max-stale=30")], &[], 100, -20),
            Some(ForcedFreshness::ForceFresh)
        );
        assert_eq!(
            judge(&[("cache-control", "max-stale=30")], &[], 100, -40),
            None
        );
        assert_eq!(
            judge(&[("cache-control", "max-stale")], &[], 100, -4000),
            Some(ForcedFreshness::ForceFresh)
        );
        assert_eq!(
            judge(
                &[("cache-control", "max-stale")],
                &[("cache-control", "max-age=1, must-revalidate")],
                100,
                -40
            ),
            None
        );
        assert!(
            RequestDirectives::parse(&request(&[("cache-control", "only-if-cached")]))
                .only_if_cached
        );
        assert!(!RequestDirectives::parse(&request(&[])).any());
    }
}
