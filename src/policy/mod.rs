//! Caching policy: what a shared cache may store and for how long (RFC 9111 §3, §4.2).
//!
//! The proxy asks two questions, both answered here so that every path (the Pingora cache state
//! machine and any fast path) shares one definition:
//! * [`CachePolicy::request_cacheable`]: may this request use the cache at all?
//! * [`CachePolicy::response_decision`]: may this response be stored, and with what metadata?
//!
//! [`freshness`](mod@freshness) holds the pure freshness and age arithmetic; [`vary`] the variant key.

pub mod cache_control;
pub mod delta_seconds;
pub mod freshness;
pub mod http_date;
pub mod preconditions;
pub mod request_directives;
pub mod revalidation;
pub mod targeted;
pub mod vary;

use crate::config::CacheConfig;
use freshness::{freshness, storable_status, understood_status, Freshness, FreshnessRules};
use http::Method;
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
/// The response's body came in a transfer coding besides `chunked` (`Transfer-Encoding: gzip,
/// chunked`): Pingora undoes only the chunking, so what it would store is still coded, under a
/// head that names no coding once the hop-by-hop `Transfer-Encoding` is gone.
pub const REASON_TRANSFER_CODING: &str = "transfer-coding";

/// What a request rule changes in the storing of one response (`crate::rules::Verdict`); the
/// default changes nothing.
#[derive(Debug, Clone, Default)]
pub struct StoreOverrides {
    /// Freshness forced on the response, whatever it says (`ttl`).
    pub ttl: Option<Duration>,
    /// The stale-if-error grace instead of `cache.stale_if_error_grace` (`grace`).
    pub grace: Option<Duration>,
    /// Never store a response with `Set-Cookie`, even with `cache.store_set_cookie`
    /// (`cache_anonymous_only`).
    pub refuse_set_cookie: bool,
}

/// The configured policy.
#[derive(Debug, Clone)]
pub struct CachePolicy {
    heuristic_fraction: f64,
    heuristic_max: Duration,
    default_ttl: Option<Duration>,
    max_object_size: usize,
    targeted: targeted::TargetedFields,
    /// `stale-if-error` seconds granted to responses that carry none.
    stale_if_error_grace: u32,
    /// Store responses with `Set-Cookie` (`cache.store_set_cookie`).
    store_set_cookie: bool,
}

impl CachePolicy {
    /// Builds the policy from the validated cache config.
    pub fn new(config: &CacheConfig) -> Self {
        CachePolicy {
            heuristic_fraction: config.heuristic_fraction,
            heuristic_max: config.heuristic_max,
            default_ttl: config.default_ttl,
            max_object_size: config.max_object_size,
            targeted: targeted::TargetedFields::new(&config.targeted_field),
            stale_if_error_grace: config.stale_if_error_grace.as_secs().min(u32::MAX as u64) as u32,
            store_set_cookie: config.store_set_cookie,
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

    /// Decides whether `resp` (to `req`, sent at `request_time`) may be stored, returning the
    /// metadata to store it with.
    ///
    /// Beyond RFC 9111's rules, two conservative choices that Varnish and nginx also make:
    /// responses with `Set-Cookie` are not stored (a shared cache must not hand one user's cookie
    /// to another) unless `cache.store_set_cookie` says to, and neither are bodies over
    /// `cache.max_object_size`.
    ///
    /// A `no-cache` response with a validator is stored even without freshness of its own, to be
    /// revalidated on every use. Serving it stale is never allowed (RFC 9111 §4.2.4), nor is the
    /// configured grace given to a response with `s-maxage` (which implies `proxy-revalidate`,
    /// §5.2.2.10); that response's own `stale-if-error` / `stale-while-revalidate` still count
    /// (CDN practice, `docs/conformance.md`).
    pub fn response_decision(
        &self,
        req: &RequestHeader,
        resp: &ResponseHeader,
        request_time: SystemTime,
    ) -> RespCacheable {
        self.response_decision_with(req, resp, request_time, &StoreOverrides::default())
    }

    /// [`Self::response_decision`] with what the request rules (`crate::rules`) changed for
    /// this request: a forced TTL, another stale-if-error grace, or no `Set-Cookie` stored.
    pub fn response_decision_with(
        &self,
        req: &RequestHeader,
        resp: &ResponseHeader,
        request_time: SystemTime,
        overrides: &StoreOverrides,
    ) -> RespCacheable {
        let uncacheable =
            |reason: &'static str| RespCacheable::Uncacheable(NoCacheReason::Custom(reason));
        if !storable_status(resp.status) {
            return uncacheable(REASON_STATUS);
        }
        let (cc, governing_field, targeted) = self.targeted.cache_control(resp);
        // must-understand: store only statuses we understand, and then ignore no-store
        // (RFC 9111 §5.2.2.3)
        let must_understand = cc.must_understand();
        if must_understand && !understood_status(resp.status) {
            return uncacheable(REASON_MUST_UNDERSTAND);
        }
        if !must_understand && cc.no_store() {
            return uncacheable(REASON_NO_STORE);
        }
        if cc.private() {
            return uncacheable(REASON_PRIVATE);
        }
        if req.headers.contains_key(http::header::AUTHORIZATION)
            && !cc.allow_caching_authorized_req()
        {
            return uncacheable(REASON_AUTHORIZATION);
        }
        if vary::has_star(resp) {
            return uncacheable(REASON_VARY_STAR);
        }
        let refuse_set_cookie = !self.store_set_cookie || overrides.refuse_set_cookie;
        if refuse_set_cookie && resp.headers.contains_key(http::header::SET_COOKIE) {
            return uncacheable(REASON_SET_COOKIE);
        }
        if content_length(resp).is_some_and(|len| len > self.max_object_size as u64) {
            return uncacheable(REASON_TOO_LARGE);
        }
        if coded_in_transfer(resp) {
            return uncacheable(REASON_TRANSFER_CODING);
        }
        let rules = FreshnessRules {
            cache_control_field: governing_field,
            heuristic_fraction: self.heuristic_fraction,
            heuristic_max: self.heuristic_max,
            default_ttl: self.default_ttl,
            override_ttl: overrides.ttl,
            ignore_expires: targeted,
        };
        let now = SystemTime::now();
        let no_cache = rules.override_ttl.is_none() && cc.no_cache();
        let mut fresh = match freshness(resp, &rules, request_time, now) {
            Some(fresh) => fresh,
            // storable at all (RFC 9111 §3): a heuristically cacheable status, or `public`
            None if no_cache
                && has_validator(resp)
                && (freshness::heuristically_cacheable(resp.status) || cc.public()) =>
            {
                freshness::revalidate_only(resp, request_time, now)
            }
            None => return uncacheable(REASON_NO_FRESHNESS),
        };
        let mut header = resp.clone();
        let grace = overrides.grace.map_or(self.stale_if_error_grace, |g| {
            g.as_secs().min(u32::MAX as u64) as u32
        });
        let (mut swr, mut sie) = (0, grace);
        if no_cache {
            // stored, but never served without revalidation (RFC 9111 §5.2.2.4)
            fresh.lifetime = Duration::ZERO;
        }
        if cc.has_s_maxage() {
            // implies proxy-revalidate (RFC 9111 §5.2.2.10): no grace of ours
            sie = 0;
        }
        if no_cache || cc.must_revalidate() || cc.proxy_revalidate() {
            // never served stale, whatever else is said or configured (RFC 9111 §4.2.4,
            // §5.2.2.2, §5.2.2.4)
            sie = 0;
        } else {
            swr = cc
                .stale_while_revalidate()
                .and_then(Result::ok)
                .unwrap_or(0);
            if let Some(Ok(seconds)) = cc.stale_if_error() {
                sie = seconds;
            }
        }
        cc.strip_private_headers(&mut header);
        let mut meta = build_meta(&fresh, now, swr, sie, header);
        meta.extensions_mut().insert(RequestSent(request_time));
        RespCacheable::Cacheable(meta)
    }
}

/// Whether `resp`'s body came in a transfer coding other than `chunked` alone (RFC 9112 §6.1:
/// `Transfer-Encoding` lists every coding applied, `chunked` last). See
/// [`REASON_TRANSFER_CODING`].
fn coded_in_transfer(resp: &ResponseHeader) -> bool {
    resp.headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"chunked"))
}

impl CachePolicy {
    /// The decision for a POST response offered for reuse by later GETs of its URL (RFC 9110
    /// §9.3.3, `crate::proxy::post_reuse`): as for any response, and only with explicit
    /// freshness of its own (`s-maxage`, `max-age` or `Expires`; not heuristic, default or
    /// override) that has not already run out.
    pub fn post_response_decision(
        &self,
        req: &RequestHeader,
        resp: &ResponseHeader,
        request_time: SystemTime,
    ) -> RespCacheable {
        let (governing_field, targeted) = self.targeted.governing_field(resp);
        let explicit_only = FreshnessRules {
            cache_control_field: governing_field,
            heuristic_fraction: 0.0,
            heuristic_max: Duration::ZERO,
            default_ttl: None,
            override_ttl: None,
            ignore_expires: targeted,
        };
        let now = SystemTime::now();
        let explicit = freshness(resp, &explicit_only, request_time, now).is_some_and(|f| {
            f.source != freshness::FreshnessSource::Heuristic && f.lifetime > f.initial_age
        });
        match self.response_decision(req, resp, request_time) {
            RespCacheable::Cacheable(mut meta) if explicit && meta.is_fresh(now) => {
                // the POST's answer is what its own invalidation of the URL leads to: dated when
                // it is stored (after that invalidation), not when the POST was sent, which the
                // invalidation would cover
                meta.extensions_mut().remove::<RequestSent>();
                RespCacheable::Cacheable(meta)
            }
            RespCacheable::Cacheable(_) => {
                RespCacheable::Uncacheable(NoCacheReason::Custom(REASON_NO_FRESHNESS))
            }
            uncacheable => uncacheable,
        }
    }
}

/// When the request that brought a response was sent (`request_time`), carried in its
/// `CacheMeta`'s extensions to the storage that stores it: a purge or ban issued after that
/// may have changed the resource before the origin answered, so it must cover the stored
/// response (`crate::storage::memory`'s fill dates the entry by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestSent(pub SystemTime);

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

/// Whether the response carries a validator a conditional request can use (RFC 9110 §8.8).
fn has_validator(resp: &ResponseHeader) -> bool {
    resp.headers.contains_key(http::header::ETAG)
        || resp.headers.contains_key(http::header::LAST_MODIFIED)
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
    fn no_cache_with_a_validator_is_stored_without_freshness_of_its_own() {
        for validator in [
            ("etag", "\"v1\""),
            ("last-modified", "Sat, 01 Jan 2022 00:00:00 GMT"),
        ] {
            let meta = decide(&[], &[("cache-control", "no-cache"), validator]).unwrap_meta();
            assert!(!meta.is_fresh(SystemTime::now()), "{validator:?}");
            assert_eq!(meta.stale_if_error_sec(), 0, "{validator:?}");
        }
        assert!(!decide(&[], &[("cache-control", "no-cache")]).is_cacheable());
        // RFC 9111 §3: a status that is not heuristically cacheable needs more than no-cache
        let found = |cc: &str| {
            let req = RequestHeader::build("GET", b"/x", None).unwrap();
            let mut resp = test_headers::response(&[("cache-control", cc), ("etag", "\"v1\"")]);
            resp.set_status(302).unwrap();
            policy().response_decision(&req, &resp, SystemTime::now())
        };
        assert!(!found("no-cache").is_cacheable());
        assert!(found("no-cache, public").is_cacheable());
    }

    #[test]
    fn the_grace_is_withheld_where_stale_is_forbidden() {
        let grace = |cc: &str| {
            decide(&[], &[("cache-control", cc)])
                .unwrap_meta()
                .stale_if_error_sec()
        };
        assert_eq!(grace("max-age=60"), 300);
        for forbidding in [
            "max-age=60, must-revalidate",
            "max-age=60, proxy-revalidate",
            "max-age=60, no-cache",
            "s-maxage=60",
            "no-cache, stale-if-error=600, max-age=60",
        ] {
            assert_eq!(grace(forbidding), 0, "{forbidding}");
        }
        // the response's own stale-if-error with s-maxage still counts (CDN practice)
        assert_eq!(grace("s-maxage=60, stale-if-error=30"), 30);
    }

    #[test]
    fn a_body_in_a_transfer_coding_besides_chunked_is_not_stored() {
        let fresh = ("cache-control", "max-age=60");
        for chunked in ["chunked", "Chunked", " chunked "] {
            assert!(
                decide(&[], &[fresh, ("transfer-encoding", chunked)]).is_cacheable(),
                "{chunked}"
            );
        }
        for coded in ["gzip, chunked", "gzip,chunked", "x-custom, chunked", "gzip"] {
            assert!(
                !decide(&[], &[fresh, ("transfer-encoding", coded)]).is_cacheable(),
                "{coded}"
            );
        }
        let two_fields = [
            fresh,
            ("transfer-encoding", "gzip"),
            ("transfer-encoding", "chunked"),
        ];
        assert!(!decide(&[], &two_fields).is_cacheable());
    }

    #[test]
    fn set_cookie_is_stored_only_when_configured() {
        let cookie = [("cache-control", "max-age=60"), ("set-cookie", "a=b")];
        assert!(!decide(&[], &cookie).is_cacheable());
        let strict = CachePolicy::new(
            &Config::from_toml("upstream = \"127.0.0.1:1\"\n[cache]\nstore_set_cookie = true")
                .unwrap()
                .cache,
        );
        let req = RequestHeader::build("GET", b"/x", None).unwrap();
        let resp = test_headers::response(&cookie);
        assert!(strict
            .response_decision(&req, &resp, SystemTime::now())
            .is_cacheable());
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
