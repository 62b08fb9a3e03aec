//! Caching policy: what a shared cache may store and for how long (RFC 9111 §3, §4.2).
//!
//! The proxy asks two questions, both answered here so that every path (the Pingora cache state
//! machine and any fast path) shares one definition:
//! * [`CachePolicy::request_cacheable`]: may this request use the cache at all?
//! * [`CachePolicy::response_decision`]: may this response be stored, and with what metadata?
//!
//! [`freshness`] holds the pure freshness and age arithmetic; [`vary`] the variant key.

pub mod delta_seconds;
pub mod freshness;
pub mod preconditions;
pub mod request_directives;
pub mod revalidation;
pub mod targeted;
pub mod vary;

use crate::config::CacheConfig;
use freshness::{freshness, storable_status, understood_status, Freshness, FreshnessRules};
use http::Method;
use pingora_cache::cache_control::InterpretCacheControl;
use pingora_cache::{CacheMeta, NoCacheReason, RespCacheable};
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::{Duration, SystemTime};

/// The response said `no-store`.
pub const REASON_NO_STORE: &str = "no-store";
/// The response said `private` (a shared cache never stores it).
pub const REASON_PRIVATE: &str = "private";
/// Why a response was not stored, as reported in `Cache-Status` `detail` and logs.
pub const REASON_NO_FRESHNESS: &str = "no-freshness";
/// The response carried `Set-Cookie` (see [`CachePolicy::response_decision`]).
pub const REASON_SET_COOKIE: &str = "set-cookie";
/// The response had `Vary: *`, which no request can match.
pub const REASON_VARY_STAR: &str = "vary-star";
/// The response is larger than `cache.max_object_size`.
pub const REASON_TOO_LARGE: &str = "too-large";
/// The request carried `Authorization` and the response did not allow sharing.
pub const REASON_AUTHORIZATION: &str = "authorization";
/// The status code is not one this cache stores.
pub const REASON_STATUS: &str = "status";
/// The response said `must-understand` and this cache does not know its status code.
pub const REASON_MUST_UNDERSTAND: &str = "must-understand";

/// The configured policy.
#[derive(Debug, Clone)]
pub struct CachePolicy {
    heuristic_fraction: f64,
    heuristic_max: Duration,
    default_ttl: Option<Duration>,
    ttl_overrides: Vec<(String, Duration)>,
    max_object_size: usize,
    targeted: targeted::TargetedFields,
    /// `stale-if-error` seconds granted to responses that carry none.
    stale_if_error_grace: u32,
}

impl CachePolicy {
    /// Builds the policy from the validated cache config.
    pub fn new(config: &CacheConfig) -> Self {
        CachePolicy {
            heuristic_fraction: config.heuristic_fraction,
            heuristic_max: config.heuristic_max,
            default_ttl: config.default_ttl,
            ttl_overrides: config
                .ttl_overrides
                .iter()
                .map(|o| (o.prefix.clone(), o.ttl))
                .collect(),
            max_object_size: config.max_object_size,
            targeted: targeted::TargetedFields::new(&config.targeted_field),
            stale_if_error_grace: config.stale_if_error_grace.as_secs().min(u32::MAX as u64) as u32,
        }
    }

    /// The targeted cache-control fields this cache obeys (RFC 9213), most specific first.
    pub fn targeted_fields(&self) -> &targeted::TargetedFields {
        &self.targeted
    }

    /// The largest body this cache stores.
    pub fn max_object_size(&self) -> usize {
        self.max_object_size
    }

    /// Only GET and HEAD are looked up and stored; HEAD is answered from a stored GET.
    pub fn request_cacheable(&self, req: &RequestHeader) -> bool {
        req.method == Method::GET || req.method == Method::HEAD
    }

    fn override_ttl(&self, path: &str) -> Option<Duration> {
        self.ttl_overrides
            .iter()
            .filter(|(prefix, _)| path.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, ttl)| *ttl)
    }

    /// Decides whether `resp` (to `req`, sent at `request_time`) may be stored, returning the
    /// metadata to store it with.
    ///
    /// Beyond RFC 9111's rules, two conservative choices that Varnish and nginx also make:
    /// responses with `Set-Cookie` are not stored (a shared cache must not hand one user's cookie
    /// to another), and neither are bodies over `cache.max_object_size`.
    pub fn response_decision(
        &self,
        req: &RequestHeader,
        resp: &ResponseHeader,
        request_time: SystemTime,
    ) -> RespCacheable {
        let uncacheable =
            |reason: &'static str| RespCacheable::Uncacheable(NoCacheReason::Custom(reason));
        if !storable_status(resp.status) {
            return uncacheable(REASON_STATUS);
        }
        let (cc, targeted) = self.targeted.cache_control(resp);
        // must-understand: store only statuses we understand, and then ignore no-store
        // (RFC 9111 §5.2.2.3)
        let must_understand = cc.as_ref().is_some_and(|cc| cc.has_key("must-understand"));
        if must_understand && !understood_status(resp.status) {
            return uncacheable(REASON_MUST_UNDERSTAND);
        }
        if !must_understand && cc.as_ref().is_some_and(|cc| cc.no_store()) {
            return uncacheable(REASON_NO_STORE);
        }
        if cc.as_ref().is_some_and(|cc| cc.private()) {
            return uncacheable(REASON_PRIVATE);
        }
        if req.headers.contains_key(http::header::AUTHORIZATION)
            && !cc
                .as_ref()
                .is_some_and(|cc| cc.allow_caching_authorized_req())
        {
            return uncacheable(REASON_AUTHORIZATION);
        }
        if vary::has_star(resp) {
            return uncacheable(REASON_VARY_STAR);
        }
        if resp.headers.contains_key(http::header::SET_COOKIE) {
            return uncacheable(REASON_SET_COOKIE);
        }
        if content_length(resp).is_some_and(|len| len > self.max_object_size as u64) {
            return uncacheable(REASON_TOO_LARGE);
        }
        let rules = FreshnessRules {
            cache_control_field: self.targeted.governing_field(resp),
            heuristic_fraction: self.heuristic_fraction,
            heuristic_max: self.heuristic_max,
            default_ttl: self.default_ttl,
            override_ttl: self.override_ttl(req.uri.path()),
            ignore_expires: targeted,
        };
        let now = SystemTime::now();
        let Some(mut fresh) = freshness(resp, &rules, request_time, now) else {
            return uncacheable(REASON_NO_FRESHNESS);
        };
        let mut header = resp.clone();
        let (mut swr, mut sie) = (0, self.stale_if_error_grace);
        if let Some(cc) = &cc {
            if cc.no_cache() && rules.override_ttl.is_none() {
                // stored, but never served without revalidation (RFC 9111 §5.2.2.4)
                fresh.lifetime = Duration::ZERO;
            }
            if cc.must_revalidate() || cc.proxy_revalidate() {
                // never served stale, whatever else is said or configured (RFC 9111 §5.2.2.2)
                sie = 0;
            } else {
                swr = cc.stale_while_revalidate().ok().flatten().unwrap_or(0);
                if let Ok(Some(seconds)) = cc.stale_if_error() {
                    sie = seconds;
                }
            }
            cc.strip_private_headers(&mut header);
        }
        RespCacheable::Cacheable(build_meta(&fresh, now, swr, sie, header))
    }
}

/// Metadata for a response received at `now` with the given freshness.
///
/// `created` is moved back by the response's initial age, so the `Age` Pingora derives from it
/// (now - created) includes the age the response already had upstream.
fn build_meta(
    fresh: &Freshness,
    now: SystemTime,
    swr: u32,
    sie: u32,
    header: ResponseHeader,
) -> CacheMeta {
    let created = now.checked_sub(fresh.initial_age).unwrap_or(now);
    let fresh_until = if fresh.lifetime.is_zero() || fresh.initial_age >= fresh.lifetime {
        // already stale: make sure it is treated as such
        created.min(now.checked_sub(Duration::from_secs(1)).unwrap_or(now))
    } else {
        created + fresh.lifetime
    };
    CacheMeta::new(fresh_until, created, swr, sie, header)
}

fn content_length(resp: &ResponseHeader) -> Option<u64> {
    resp.headers
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Header builders shared by the policy modules' unit tests.
#[cfg(test)]
pub(crate) mod test_headers {
    use pingora_http::{RequestHeader, ResponseHeader};

    /// A 200 response with the given fields, in order.
    pub fn response(headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    /// A `GET /` request with the given fields, in order.
    pub fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("GET", b"/", None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn policy() -> CachePolicy {
        CachePolicy::new(
            &Config::from_toml("upstream = \"127.0.0.1:1\"")
                .unwrap()
                .cache,
        )
    }

    fn decide(req_headers: &[(&str, &str)], headers: &[(&str, &str)]) -> RespCacheable {
        let mut req = RequestHeader::build("GET", b"/x", None).unwrap();
        for (k, v) in req_headers {
            req.insert_header(k.to_string(), *v).unwrap();
        }
        let mut resp = ResponseHeader::build(200, None).unwrap();
        for (k, v) in headers {
            resp.append_header(k.to_string(), *v).unwrap();
        }
        policy().response_decision(&req, &resp, SystemTime::now())
    }

    #[test]
    fn storing_rules() {
        assert!(decide(&[], &[("cache-control", "max-age=60")]).is_cacheable());
        assert!(!decide(&[], &[("cache-control", "max-age=60, no-store")]).is_cacheable());
        assert!(!decide(&[], &[("cache-control", "private, max-age=60")]).is_cacheable());
        assert!(!decide(&[], &[]).is_cacheable());
        let auth = [("authorization", "Basic x")];
        assert!(!decide(&auth, &[("cache-control", "max-age=60")]).is_cacheable());
        assert!(decide(&auth, &[("cache-control", "max-age=60, public")]).is_cacheable());
        assert!(decide(&auth, &[("cache-control", "s-maxage=60")]).is_cacheable());
        assert!(!decide(&[], &[("cache-control", "max-age=60"), ("vary", "*")]).is_cacheable());
    }

    #[test]
    fn no_cache_is_stored_stale() {
        let meta = decide(&[], &[("cache-control", "max-age=60, no-cache")]).unwrap_meta();
        assert!(!meta.is_fresh(SystemTime::now()));
    }

    #[test]
    fn upstream_age_counts() {
        let meta = decide(&[], &[("cache-control", "max-age=60"), ("age", "20")]).unwrap_meta();
        assert!((20..=21).contains(&meta.age().as_secs()));
        assert_eq!(meta.fresh_sec(), 60);
        let left = meta
            .fresh_until()
            .duration_since(SystemTime::now())
            .unwrap();
        assert!((39..=40).contains(&left.as_secs()), "{left:?}");
    }
}
