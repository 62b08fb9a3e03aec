//! Freshness lifetime and age (RFC 9111 §4.2), as pure functions of the response.
//!
//! Pingora's `resp_cacheable` has neither heuristic freshness nor upstream `Age`; these functions
//! supply both and are what the rest of the policy builds on.

use super::delta_seconds::{first_directives, DeltaSeconds};
use http::StatusCode;
use pingora_http::ResponseHeader;
use std::time::{Duration, SystemTime};

/// Statuses a cache may store with heuristic freshness (RFC 9110 §15.1, "heuristically cacheable").
pub fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// Statuses whose caching semantics this cache implements: the final codes defined by RFC 9110.
/// A response with `must-understand` (RFC 9111 §5.2.2.3) is stored only with one of these.
pub fn understood_status(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200..=206 | 300..=305 | 307 | 308 | 400..=417 | 421 | 422 | 426 | 500..=505
    )
}

/// Statuses this cache understands well enough to store at all, given explicit freshness.
///
/// 206 is excluded because Lacquer always fetches whole responses and serves ranges itself;
/// 304 is never an entry; informational statuses are not final.
pub fn storable_status(status: StatusCode) -> bool {
    let code = status.as_u16();
    (200..600).contains(&code) && code != 206 && code != 304
}

/// How fresh a response is allowed to be and how old it already was when it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freshness {
    /// Freshness lifetime (RFC 9111 §4.2.1).
    pub lifetime: Duration,
    /// Age when received (RFC 9111 §4.2.3 `corrected_initial_age`).
    pub initial_age: Duration,
    /// Where the lifetime came from, for `Cache-Status` and logs.
    pub source: FreshnessSource,
}

/// The rule that produced a freshness lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshnessSource {
    SMaxAge,
    MaxAge,
    Expires,
    Heuristic,
    Override,
    Default,
    /// None of the above: a `no-cache` response with a validator, stored only to be revalidated
    /// on every use (see [`revalidate_only`]).
    NoCache,
}

/// Inputs that are configuration rather than response.
#[derive(Debug, Clone, Copy)]
pub struct FreshnessRules<'a> {
    /// The field whose `s-maxage` / `max-age` govern: `Cache-Control` or the targeted field
    /// (RFC 9213) that replaced it.
    pub cache_control_field: &'a http::HeaderName,
    /// Fraction of `Date - Last-Modified` granted heuristically.
    pub heuristic_fraction: f64,
    /// Cap on heuristic freshness.
    pub heuristic_max: Duration,
    /// Lifetime for responses with no freshness information (None: do not store them).
    pub default_ttl: Option<Duration>,
    /// Lifetime forced by a path-prefix override (None: no override applies).
    pub override_ttl: Option<Duration>,
    /// `Expires` is ignored: a targeted field (RFC 9213) replaced `Cache-Control` and `Expires`.
    pub ignore_expires: bool,
}

fn header_date(resp: &ResponseHeader, name: http::header::HeaderName) -> Option<SystemTime> {
    let mut values = resp.headers.get_all(name).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    super::http_date::parse_value(first)
}

/// Parses `Age` (RFC 9111 §5.1): a non-negative integer; invalid values are ignored, huge ones clamp.
///
/// `Age` is a singleton field, but "a cache encountering a message with a list-based Age field
/// value SHOULD use the first member of the field value, discarding subsequent ones" (§5.1): of
/// `Age: 7200, 0` (or of two `Age` lines) the 7200 counts.
pub fn parse_age(resp: &ResponseHeader) -> Option<Duration> {
    let line = resp.headers.get(http::header::AGE)?.to_str().ok()?;
    let value = line.split(',').next().unwrap_or_default().trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let seconds = value
        .parse::<u64>()
        .unwrap_or(u32::MAX as u64)
        .min(u32::MAX as u64);
    Some(Duration::from_secs(seconds))
}

/// RFC 9111 §4.2.3: the response's age when it was received at `response_time`.
pub fn initial_age(
    resp: &ResponseHeader,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Duration {
    let apparent_age = header_date(resp, http::header::DATE)
        .and_then(|date| response_time.duration_since(date).ok())
        .unwrap_or_default();
    let response_delay = response_time
        .duration_since(request_time)
        .unwrap_or_default();
    let corrected_age_value = parse_age(resp).unwrap_or_default() + response_delay;
    apparent_age.max(corrected_age_value)
}

/// The response's freshness, or `None` when nothing grants any (and so it is not stored).
///
/// Order: override, `s-maxage`, `max-age`, `Expires` (relative to `Date`), heuristic from
/// `Last-Modified` for heuristically cacheable statuses, then the configured default. An invalid
/// `s-maxage` or `max-age` (see [`super::delta_seconds`]) means stale: lifetime zero.
pub fn freshness(
    resp: &ResponseHeader,
    rules: &FreshnessRules,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Option<Freshness> {
    let initial_age = initial_age(resp, request_time, response_time);
    let make = |lifetime: Duration, source| {
        Some(Freshness {
            lifetime,
            initial_age,
            source,
        })
    };
    if let Some(ttl) = rules.override_ttl {
        return make(ttl, FreshnessSource::Override);
    }
    let [s_maxage, max_age] =
        first_directives(resp, rules.cache_control_field, ["s-maxage", "max-age"]);
    for (found, source) in [
        (s_maxage, FreshnessSource::SMaxAge),
        (max_age, FreshnessSource::MaxAge),
    ] {
        match found {
            Some(DeltaSeconds::Seconds(s)) => return make(Duration::from_secs(s), source),
            Some(DeltaSeconds::Invalid) => return make(Duration::ZERO, source),
            None => {}
        }
    }
    if !rules.ignore_expires && resp.headers.contains_key(http::header::EXPIRES) {
        // an invalid or duplicated Expires means "already expired" (RFC 9111 §5.3)
        let lifetime = header_date(resp, http::header::EXPIRES)
            .and_then(|expires| {
                let date = header_date(resp, http::header::DATE).unwrap_or(response_time);
                expires.duration_since(date).ok()
            })
            .unwrap_or_default();
        return make(lifetime, FreshnessSource::Expires);
    }
    if heuristically_cacheable(resp.status) {
        if let Some(last_modified) = header_date(resp, http::header::LAST_MODIFIED) {
            let date = header_date(resp, http::header::DATE).unwrap_or(response_time);
            if let Ok(since) = date.duration_since(last_modified) {
                let lifetime = since
                    .mul_f64(rules.heuristic_fraction)
                    .min(rules.heuristic_max);
                return make(lifetime, FreshnessSource::Heuristic);
            }
        }
    }
    rules
        .default_ttl
        .and_then(|ttl| make(ttl, FreshnessSource::Default))
}

/// A lifetime of zero, for a response that is stored only to be revalidated on every use: one
/// with `no-cache` and a validator but no freshness of its own (RFC 9111 §5.2.2.4: "the
/// response MUST NOT be used to satisfy any other request without forwarding it for validation",
/// which a stored validator makes a conditional request answered by a 304).
pub fn revalidate_only(
    resp: &ResponseHeader,
    request_time: SystemTime,
    response_time: SystemTime,
) -> Freshness {
    Freshness {
        lifetime: Duration::ZERO,
        initial_age: initial_age(resp, request_time, response_time),
        source: FreshnessSource::NoCache,
    }
}

/// The remaining freshness of a stored response at `now`, in whole seconds rounded down: `0` up
/// to the moment it stops being fresh, negative once it is stale (`-1` for anything up to one
/// second past). The one measure for the `ttl` of `Cache-Status` (RFC 9211 §2.5) and for the
/// client's `min-fresh` and `max-stale` (RFC 9111 §5.2.1): a response stale by half a second has
/// exceeded its lifetime, so it must not read as fresh (a `ttl` of 0, a `max-stale=0` met).
pub fn remaining_secs(fresh_until: SystemTime, now: SystemTime) -> i64 {
    match fresh_until.duration_since(now) {
        Ok(left) => left.as_secs() as i64,
        Err(past) => {
            let past = past.duration();
            -(past.as_secs() as i64) - i64::from(past.subsec_nanos() > 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::test_headers::response as resp;

    const RULES: FreshnessRules = FreshnessRules {
        cache_control_field: &http::header::CACHE_CONTROL,
        heuristic_fraction: 0.1,
        heuristic_max: Duration::from_secs(86400),
        default_ttl: None,
        override_ttl: None,
        ignore_expires: false,
    };

    fn fresh(headers: &[(&str, &str)]) -> Option<Freshness> {
        let r = resp(headers);
        let now = SystemTime::now();
        freshness(&r, &RULES, now, now)
    }

    #[test]
    fn s_maxage_beats_max_age_beats_expires() {
        let f = fresh(&[("cache-control", "max-age=10, s-maxage=20")]).unwrap();
        assert_eq!(
            (f.lifetime.as_secs(), f.source),
            (20, FreshnessSource::SMaxAge)
        );
        let f = fresh(&[
            ("cache-control", "max-age=10"),
            ("expires", "Thu, 01 Jan 2099 00:00:00 GMT"),
        ])
        .unwrap();
        assert_eq!(f.lifetime.as_secs(), 10);
    }

    #[test]
    fn invalid_expires_means_expired() {
        let f = fresh(&[("expires", "0")]).unwrap();
        assert_eq!(f.lifetime, Duration::ZERO);
    }

    #[test]
    fn heuristic_uses_a_fraction_of_last_modified_age() {
        let now = SystemTime::now();
        let lm = httpdate::fmt_http_date(now - Duration::from_secs(1000));
        let date = httpdate::fmt_http_date(now);
        let f = fresh(&[("last-modified", &lm), ("date", &date)]).unwrap();
        assert_eq!(f.source, FreshnessSource::Heuristic);
        assert!((99..=101).contains(&f.lifetime.as_secs()), "{f:?}");
    }

    #[test]
    fn no_information_means_not_stored() {
        assert!(fresh(&[]).is_none());
    }

    #[test]
    fn remaining_freshness_rounds_down() {
        let now = SystemTime::now();
        let at = |offset_ms: i64| {
            let offset = Duration::from_millis(offset_ms.unsigned_abs());
            let fresh_until = if offset_ms >= 0 {
                now + offset
            } else {
                now - offset
            };
            remaining_secs(fresh_until, now)
        };
        assert_eq!(at(59_700), 59);
        assert_eq!(at(500), 0);
        assert_eq!(at(0), 0);
        assert_eq!(at(-1), -1, "stale by a millisecond is stale");
        assert_eq!(at(-500), -1);
        assert_eq!(at(-1_000), -1);
        assert_eq!(at(-1_001), -2);
    }

    #[test]
    fn age_parsing() {
        assert_eq!(
            parse_age(&resp(&[("age", "30")])),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_age(&resp(&[("age", "-3")])), None);
        assert_eq!(
            parse_age(&resp(&[("age", "7200, 0")])),
            Some(Duration::from_secs(7200))
        );
        assert_eq!(
            parse_age(&resp(&[("age", "7200"), ("age", "0")])),
            Some(Duration::from_secs(7200))
        );
        assert_eq!(parse_age(&resp(&[("age", "x, 7200")])), None);
        assert_eq!(parse_age(&resp(&[("age", "abc")])), None);
        assert_eq!(
            parse_age(&resp(&[("age", "99999999999999999999")])),
            Some(Duration::from_secs(u32::MAX as u64))
        );
        let f = fresh(&[("cache-control", "max-age=100"), ("age", "30")]).unwrap();
        assert_eq!(f.initial_age.as_secs(), 30);
    }
}
