//! Assertions that compare what the proxy reports with an expectation computed independently of
//! the same response, so that a wrong report cannot agree with itself.

use super::client::Resp;

/// Asserts that `resp` (a response served from the cache) reports in `Cache-Status` a `ttl` equal
/// to the freshness `lifetime` the origin gave (its `max-age`, in seconds) minus the `Age` the
/// proxy sent with it: RFC 9111's `freshness_lifetime - current_age`. A response just validated
/// with the origin carries no `Age` (RFC 9111 §5.1): its age is 0. Both numbers are whole seconds
/// cut from one clock reading, so the truncation may take one second more off the `ttl`.
pub fn assert_ttl_is_lifetime_minus_age(resp: &Resp, lifetime: i64) {
    let status = resp.cache_status();
    let age = resp.age().unwrap_or(0) as i64;
    let ttl = resp
        .cache_ttl()
        .unwrap_or_else(|| panic!("no ttl in Cache-Status: {status:?}"));
    let expected = lifetime - age;
    assert!(
        ttl == expected || ttl == expected - 1,
        "ttl {ttl}, expected {expected} (lifetime {lifetime} - Age {age}) or one less: {status:?}"
    );
}
