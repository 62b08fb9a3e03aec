//! RFC 9111 §4.3 (validation) and RFC 9110 §13 (conditional requests), over real sockets.
//!
//! A fresh stored response answers a client's preconditions itself: `If-None-Match` (weak
//! comparison) and `If-Modified-Since` with 304, `If-Match` (strong comparison) and
//! `If-Unmodified-Since` with 412. A stale one is revalidated upstream with the stored validators;
//! the origin's 304 refreshes the stored headers and freshness.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

/// RFC 9111 §4.3.2: without `Last-Modified`, `If-Modified-Since` is judged by the stored `Date`
/// (RFC 9110 §13.1.3): 304 when that `Date` is not later than the condition.
#[tokio::test]
async fn if_modified_since_without_last_modified_uses_the_stored_date() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let date = http_date_offset(-100);
    let path = format!("/ims-date?cc={}&date={}", q("max-age=600"), q(&date));
    let stored = get(&lacquer.url(&path), &[]).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    for since in [date.clone(), http_date_offset(0)] {
        let resp = get(&lacquer.url(&path), &[("if-modified-since", &since)]).await;
        assert_eq!(resp.status, 304, "If-Modified-Since: {since} (Date {date})");
        assert!(resp.body.is_empty());
        assert!(resp.is_hit(), "{:?}", resp.cache_status());
    }
    let earlier = http_date_offset(-1000);
    let modified = get(&lacquer.url(&path), &[("if-modified-since", &earlier)]).await;
    assert_eq!(modified.status, 200);
    assert_eq!(modified.body, stored.body);
    assert_eq!(origin.hits_for(&path), 1);
}

/// A response stored without `Date` from the origin got the time it was received as its `Date`
/// (RFC 9110 §6.6.1), which `If-Modified-Since` is then judged by.
#[tokio::test]
async fn if_modified_since_without_any_origin_date_uses_the_time_received() {
    let origin = RawOrigin::answering(|_head, stream| {
        use std::io::Write;
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 5\r\n\r\nhello",
        );
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let before = http_date_offset(-10);
    let stored = get(&lacquer.url("/ims-no-date"), &[]).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    let after = http_date_offset(10);
    let resp = get(
        &lacquer.url("/ims-no-date"),
        &[("if-modified-since", &after)],
    )
    .await;
    assert_eq!(resp.status, 304, "{:?}", resp.cache_status());
    let resp = get(
        &lacquer.url("/ims-no-date"),
        &[("if-modified-since", &before)],
    )
    .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "hello");
    assert_eq!(origin.accepted(), 1);
}

/// `If-Modified-Since` in each HTTP-date format, names in any case (RFC 9110 §5.6.7); a value
/// that is no HTTP-date is ignored (§13.1.3).
#[tokio::test]
async fn if_modified_since_reads_every_http_date_format() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/ims-formats?cc={}&lm=-10000", q("max-age=600"));
    let stored = get(&lacquer.url(&path), &[]).await;
    let [imf, rfc850, asctime] = http_date_formats(0);
    for since in [
        imf.clone(),
        rfc850.clone(),
        asctime.clone(),
        imf.to_lowercase(),
        rfc850.to_uppercase(),
        asctime.to_lowercase(),
    ] {
        let resp = get(&lacquer.url(&path), &[("if-modified-since", &since)]).await;
        assert_eq!(resp.status, 304, "If-Modified-Since: {since}");
    }
    for not_a_date in [imf.replace("GMT", "UTC"), "yesterday".to_string()] {
        let resp = get(&lacquer.url(&path), &[("if-modified-since", &not_a_date)]).await;
        assert_eq!(resp.status, 200, "If-Modified-Since: {not_a_date}");
        assert_eq!(resp.body, stored.body);
    }
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn if_none_match_is_answered_from_a_fresh_entry_with_weak_comparison() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/inm?cc={}&etag={}", q("max-age=600"), q("W/\"v1\""));
    let stored = get(&lacquer.url(&path), &[]).await;
    for inm in ["\"v1\"", "W/\"v1\"", "\"a\", W/\"v1\"", "*"] {
        let resp = get(&lacquer.url(&path), &[("if-none-match", inm)]).await;
        assert_eq!(resp.status, 304, "If-None-Match: {inm}");
        assert!(resp.body.is_empty());
        assert_eq!(resp.header("etag").as_deref(), Some("W/\"v1\""));
        assert!(resp.has_header("cache-control"));
        assert!(resp.is_hit(), "{:?}", resp.cache_status());
    }
    let other = get(&lacquer.url(&path), &[("if-none-match", "\"v2\"")]).await;
    assert_eq!(other.status, 200);
    assert_eq!(other.body, stored.body);
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn if_modified_since_is_answered_from_a_fresh_entry() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/ims?cc={}&lm=-10000", q("max-age=600"));
    let stored = get(&lacquer.url(&path), &[]).await;
    let now = http_date_offset(0);
    let long_ago = http_date_offset(-20000);
    let not_modified = get(&lacquer.url(&path), &[("if-modified-since", &now)]).await;
    assert_eq!(not_modified.status, 304);
    assert!(not_modified.body.is_empty());
    let modified = get(&lacquer.url(&path), &[("if-modified-since", &long_ago)]).await;
    assert_eq!(modified.status, 200);
    assert_eq!(modified.body, stored.body);
    // If-None-Match takes precedence: a non-matching tag means 200 whatever the date says
    let both = get(
        &lacquer.url(&path),
        &[("if-none-match", "\"nope\""), ("if-modified-since", &now)],
    )
    .await;
    assert_eq!(both.status, 200);
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn if_match_and_if_unmodified_since_fail_with_412_from_a_fresh_entry() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/pre?cc={}&etag={}&lm=-10000",
        q("max-age=600"),
        q("\"v1\"")
    );
    let stored = get(&lacquer.url(&path), &[]).await;
    for (name, value, expected) in [
        ("if-match", "\"v1\"".to_string(), 200),
        ("if-match", "\"x\", \"v1\"".to_string(), 200),
        ("if-match", "*".to_string(), 200),
        ("if-match", "\"other\"".to_string(), 412),
        // If-Match uses the strong comparison: a weak tag never matches
        ("if-match", "W/\"v1\"".to_string(), 412),
        ("if-unmodified-since", http_date_offset(0), 200),
        ("if-unmodified-since", http_date_offset(-20000), 412),
    ] {
        let resp = get(&lacquer.url(&path), &[(name, &value)]).await;
        assert_eq!(resp.status, expected, "{name}: {value}");
        if expected == 200 {
            assert_eq!(resp.body, stored.body);
        } else {
            assert!(resp.body.is_empty(), "{name}: {value}");
        }
        assert!(resp.is_hit(), "{name}: {value}: {:?}", resp.cache_status());
    }
    // a failed If-Match wins over a matching If-None-Match
    let both = get(
        &lacquer.url(&path),
        &[("if-match", "\"other\""), ("if-none-match", "\"v1\"")],
    )
    .await;
    assert_eq!(both.status, 412);
    assert_eq!(origin.hits_for(&path), 1, "all answered from the cache");
}

#[tokio::test]
async fn a_failed_if_match_on_a_miss_is_412_and_the_response_is_stored() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/if-match-miss?cc={}&etag={}",
        q("max-age=600"),
        q("\"v1\"")
    );
    let failed = get(&lacquer.url(&path), &[("if-match", "\"v0\"")]).await;
    assert_eq!(failed.status, 412);
    assert!(failed.body.is_empty());
    assert!(
        origin.last_request().unwrap().header("if-match").is_none(),
        "the cache evaluates the precondition itself"
    );
    let full = get(&lacquer.url(&path), &[("if-match", "\"v1\"")]).await;
    assert_eq!(full.status, 200);
    assert!(full.is_hit());
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn a_conditional_request_on_a_miss_stores_the_full_response() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/cond-miss?cc={}&etag={}", q("max-age=600"), q("\"v1\""));
    let first = get(&lacquer.url(&path), &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(first.status, 304);
    let seen = origin.last_request().unwrap();
    assert!(
        seen.header("if-none-match").is_none(),
        "the client's validator must not reach the origin on a miss"
    );
    let full = get(&lacquer.url(&path), &[]).await;
    assert_eq!(full.status, 200);
    assert!(full.is_hit());
    assert!(!full.body.is_empty());
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn a_stale_entry_is_revalidated_with_the_stored_validators() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/reval?cc={}&etag={}&lm=-10000&r304=1",
        q("max-age=1"),
        q("\"v1\"")
    );
    let stored = get(&lacquer.url(&path), &[]).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let revalidated = get(&lacquer.url(&path), &[]).await;
    assert_eq!(revalidated.status, 200);
    assert_eq!(
        revalidated.body, stored.body,
        "served from the validated entry"
    );
    // the 304 repeats max-age=1: the refreshed entry has that lifetime again, less its Age
    assert_ttl_is_lifetime_minus_age(&revalidated, 1);
    assert_eq!(
        revalidated.cache_status().unwrap(),
        format!(
            "lacquer; fwd=stale; fwd-status=304; stored; ttl={}",
            revalidated.cache_ttl().unwrap()
        )
    );
    let seen = origin.last_request().unwrap();
    assert_eq!(seen.header("if-none-match"), Some("\"v1\""));
    let last_modified = stored
        .header("last-modified")
        .expect("the origin sent Last-Modified");
    assert_eq!(
        seen.header("if-modified-since"),
        Some(last_modified.as_str())
    );
    assert_eq!(origin.hits_for(&path), 2);
}

#[tokio::test]
async fn a_304_updates_the_stored_headers_and_freshness() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/update?cc={}&cc304={}&etag={}&r304=1&hdr={}&hdr304={}&hdr304={}",
        q("max-age=1"),
        q("max-age=600"),
        q("\"v1\""),
        q("X-Version:old"),
        q("X-Extra:added"),
        q("Content-Length:0")
    );
    let stored = get(&lacquer.url(&path), &[]).await;
    assert_eq!(stored.header("x-version").as_deref(), Some("old"));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let revalidated = get(&lacquer.url(&path), &[]).await;
    assert_eq!(revalidated.status, 200);
    assert_eq!(revalidated.body, stored.body);
    assert_eq!(origin.hits_for(&path), 2);

    // the next request is a fresh hit under the 304's max-age=600, with the 304's fields
    let hit = get(&lacquer.url(&path), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(origin.hits_for(&path), 2);
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((590..=600).contains(&ttl), "ttl {ttl}");
    assert_eq!(hit.header("cache-control").as_deref(), Some("max-age=600"));
    assert_eq!(hit.header("x-extra").as_deref(), Some("added"));
    assert_eq!(
        hit.header("x-origin-count").as_deref(),
        Some("2"),
        "fields the 304 repeats are replaced"
    );
    // Content-Length is not taken from the 304
    assert_eq!(hit.content_length(), Some(stored.body.len() as u64));
    assert_eq!(hit.body, stored.body);
}

#[tokio::test]
async fn a_full_response_to_a_revalidation_replaces_the_entry() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // no r304: the origin answers every revalidation with a new 200
    let path = format!("/replace?cc={}&etag={}", q("max-age=1"), q("\"v1\""));
    let stored = get(&lacquer.url(&path), &[]).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let fresh = get(&lacquer.url(&path), &[]).await;
    assert_ne!(fresh.body, stored.body);
    assert_eq!(fresh.cache_fwd().as_deref(), Some("stale"));
    assert!(fresh.cache_status().unwrap().contains("stored"));
    assert_eq!(origin.hits_for(&path), 2);
}
