//! Serving stale responses (RFC 9111 §4.2.4, RFC 5861), over real sockets.
//!
//! `stale-while-revalidate` serves a stale entry while one background request refreshes it;
//! `stale-if-error` and the configured `cache.stale_if_error_grace` (5 minutes by default) serve a
//! stale entry when the origin answers 5xx, refuses connections, closes them or times out, and
//! `Cache-Status` says so (`fwd=stale` and the failure); `must-revalidate` and
//! `proxy-revalidate` forbid all of it, `no-cache` and `s-maxage` forbid the grace. Client
//! request directives (`max-stale`, ...) are in `tests/request_directives.rs`.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("[log]\naccess = \"off\"\n{extra}"))
}

/// Waits until an entry stored with `max-age=1` is stale.
async fn let_it_go_stale() {
    tokio::time::sleep(Duration::from_millis(2100)).await;
}

#[tokio::test]
async fn stale_while_revalidate_serves_stale_and_refreshes_once_in_the_background() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    // the refresh is a conditional request answered 304 with an hour of freshness, so after it
    // no further request can reach the origin however slowly the test runs
    let path = format!(
        "/swr?cc={}&cc304={}&etag={}&r304=1",
        q("max-age=1, stale-while-revalidate=600"),
        q("max-age=3600"),
        q("\"v1\"")
    );
    let stored = get(&lacquer.url(&path), &[]).await;
    let_it_go_stale().await;
    let url = lacquer.url(&path);
    let mut concurrent = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let url = url.clone();
        concurrent.spawn(async move { get(&url, &[]).await });
    }
    let answers: Vec<Resp> = concurrent.join_all().await;
    for answer in &answers {
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, stored.body, "served the stale entry");
    }
    assert!(
        origin
            .wait_for_hits_for_async(&path, 2, Duration::from_secs(20))
            .await,
        "no background refresh"
    );
    let refreshed = origin.requests_for(&path);
    assert_eq!(refreshed[1].header("if-none-match"), Some("\"v1\""));
    // once refreshed the entry is a plain fresh hit; the origin having answered does not mean
    // the refresh is stored yet, so give it (bounded) time: until then answers are still stale
    let refreshed_ttl = |r: &Resp| {
        r.cache_status_param("ttl")
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let mut hit = get(&lacquer.url(&path), &[]).await;
    for _ in 0..100 {
        if hit.is_hit() && refreshed_ttl(&hit) > 3000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        hit = get(&lacquer.url(&path), &[]).await;
    }
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!(ttl > 3000, "ttl {ttl}");
    assert_eq!(origin.hits_for(&path), 2, "exactly one coalesced refresh");
}

/// The same for an HTTP/2 client: its stale hit is refreshed in the background too. (Pingora's
/// revalidation is a subrequest that parses the client's request head as HTTP/1 text, which was
/// written `HTTP/2` and refused: the refresh never happened; pingora-core patch 0031.)
#[tokio::test]
async fn stale_while_revalidate_refreshes_for_an_http2_client_too() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = format!(
        "/swr-h2?cc={}&cc304={}&etag={}&r304=1",
        q("max-age=1, stale-while-revalidate=600"),
        q("max-age=3600"),
        q("\"v1\"")
    );
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = h2_get(&sender, &url, Duration::from_secs(10)).await;
    assert_eq!(stored.status, 200);
    let_it_go_stale().await;
    let stale = h2_get(&sender, &url, Duration::from_secs(10)).await;
    assert_eq!(stale.body, stored.body, "served the stale entry");
    assert!(
        origin
            .wait_for_hits_for_async(&path, 2, Duration::from_secs(20))
            .await,
        "no background refresh"
    );
    assert_eq!(
        origin.requests_for(&path)[1].header("if-none-match"),
        Some("\"v1\"")
    );
    // once the refresh is stored, a fresh hit with its hour of freshness
    let ttl = |answer: &H2Answer| {
        answer
            .cache_status_param("ttl")
            .and_then(|t| t.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let mut hit = h2_get(&sender, &url, Duration::from_secs(10)).await;
    for _ in 0..100 {
        if ttl(&hit) > 3000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        hit = h2_get(&sender, &url, Duration::from_secs(10)).await;
    }
    assert!(ttl(&hit) > 3000, "{}", hit.cache_status());
    assert_eq!(origin.hits_for(&path), 2, "exactly one refresh");
    driver.abort();
}

#[tokio::test]
async fn stale_if_error_serves_stale_when_the_origin_fails() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let mut stored = Vec::new();
    for status in [500, 502, 503, 504] {
        let path = format!(
            "/sie-{status}?cc={}&fail_after=1&fail_status={status}",
            q("max-age=1, stale-if-error=600")
        );
        let first = get(&lacquer.url(&path), &[]).await;
        assert_eq!(first.status, 200);
        stored.push((path, first));
    }
    let_it_go_stale().await;
    for (path, first) in stored {
        let stale = get(&lacquer.url(&path), &[]).await;
        assert_eq!(stale.status, 200, "{path}: {:?}", stale.cache_status());
        assert_eq!(stale.body, first.body, "{path}");
        assert!(stale.age().is_some());
        assert_eq!(origin.hits_for(&path), 2, "the origin was asked first");
    }
}

#[tokio::test]
async fn stale_if_error_window_ends() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    // lifetime 1 s, stale-if-error 1 s: after 3 s the error passes through
    let path = format!(
        "/sie-end?cc={}&fail_after=1",
        q("max-age=1, stale-if-error=1")
    );
    let first = get(&lacquer.url(&path), &[]).await;
    assert_eq!(first.status, 200);
    assert!(first.is_stored(), "{:?}", first.cache_status());
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let failed = get(&lacquer.url(&path), &[]).await;
    assert_eq!(failed.status, 503, "{:?}", failed.cache_status());
    assert_eq!(origin.hits_for(&path), 2);
}

#[tokio::test]
async fn stale_if_error_covers_a_refused_connection() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = format!("/sie-down?cc={}", q("max-age=1, stale-if-error=600"));
    let stored = get(&lacquer.url(&path), &[]).await;
    drop(origin);
    let_it_go_stale().await;
    let stale = get(&lacquer.url(&path), &[]).await;
    assert_eq!(stale.status, 200, "{:?}", stale.cache_status());
    assert_eq!(stale.body, stored.body);
}

#[tokio::test]
async fn stale_if_error_covers_an_origin_timeout() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "[proxy]\nread_timeout = \"1s\"");
    // every request after the first takes 30 s: far beyond the 1 s read timeout
    let path = format!(
        "/sie-slow?cc={}&sleep_after=1:30000",
        q("max-age=1, stale-if-error=600")
    );
    let stored = get(&lacquer.url(&path), &[]).await;
    let_it_go_stale().await;
    let stale = get(&lacquer.url(&path), &[]).await;
    assert_eq!(stale.status, 200, "{:?}", stale.cache_status());
    assert_eq!(stale.body, stored.body);
}

#[tokio::test]
async fn configured_grace_serves_stale_on_error_without_a_directive() {
    let origin = scripted_origin();
    let graceful = proxy(&origin, "[cache]\nstale_if_error_grace = \"10m\"");
    let path = format!("/grace?cc={}&fail_after=1", q("max-age=1"));
    let stored = get(&graceful.url(&path), &[]).await;
    let_it_go_stale().await;
    let stale = get(&graceful.url(&path), &[]).await;
    assert_eq!(stale.status, 200, "{:?}", stale.cache_status());
    assert_eq!(stale.body, stored.body);

    // a grace of 0s turns it off: the error passes through
    let origin = scripted_origin();
    let strict = proxy(&origin, "[cache]\nstale_if_error_grace = \"0s\"");
    let stored = get(&strict.url(&path), &[]).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    let_it_go_stale().await;
    assert_eq!(get(&strict.url(&path), &[]).await.status, 503);
}

/// RFC 9111 §4.2.4: with no configuration and no directive, a stale response is served when the
/// origin fails in any of the ways an origin fails, and `Cache-Status` names the failure.
#[tokio::test]
async fn by_default_stale_is_served_when_the_origin_fails() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "[proxy]\nread_timeout = \"1s\"");
    let failures = [
        ("500", "fail_after=1&fail_status=500", "origin-500"),
        ("502", "fail_after=1&fail_status=502", "origin-502"),
        ("503", "fail_after=1&fail_status=503", "origin-503"),
        ("504", "fail_after=1&fail_status=504", "origin-504"),
        ("closed", "close_after=1", "origin-closed"),
        ("timeout", "sleep_after=1:30000", "origin-timeout"),
    ];
    let mut stored = Vec::new();
    for (name, script, detail) in failures {
        let path = format!("/default-grace-{name}?cc={}&{script}", q("max-age=1"));
        let first = get(&lacquer.url(&path), &[]).await;
        assert!(first.is_stored(), "{name}: {:?}", first.cache_status());
        stored.push((path, first, detail));
    }
    let_it_go_stale().await;
    for (path, first, detail) in stored {
        let stale = get(&lacquer.url(&path), &[]).await;
        assert_eq!(stale.status, 200, "{path}: {:?}", stale.cache_status());
        assert_eq!(stale.body, first.body, "{path}");
        assert_eq!(stale.cache_fwd().as_deref(), Some("stale"), "{path}");
        assert_eq!(stale.cache_status_param("detail").as_deref(), Some(detail));
        assert!(stale.cache_ttl().is_some_and(|ttl| ttl < 0), "{path}");
        assert!(!stale.is_hit(), "{path}: it went forward");
        assert!(
            origin.hits_for(&path) >= 2,
            "{path}: the origin was asked first"
        );
    }
}

#[tokio::test]
async fn by_default_stale_is_served_when_the_origin_is_down() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = format!("/default-grace-down?cc={}", q("max-age=1"));
    let stored = get(&lacquer.url(&path), &[]).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    drop(origin);
    let_it_go_stale().await;
    let stale = get(&lacquer.url(&path), &[]).await;
    assert_eq!(stale.status, 200, "{:?}", stale.cache_status());
    assert_eq!(stale.body, stored.body);
    assert_eq!(
        stale.cache_status_param("detail").as_deref(),
        Some("origin-unreachable"),
        "{:?}",
        stale.cache_status()
    );
}

/// What forbids serving stale (RFC 9111 §4.2.4: `no-cache`, `must-revalidate`, an applicable
/// `s-maxage`, `proxy-revalidate`) forbids the grace, the default one and a configured one: the
/// origin closes the connection and the client gets the 502.
#[tokio::test]
async fn directives_that_forbid_stale_forbid_the_grace() {
    let origin = scripted_origin();
    let etag = q("\"v1\"");
    for (name, config) in [
        ("default", ""),
        ("configured", "[cache]\nstale_if_error_grace = \"10m\""),
    ] {
        let lacquer = proxy(&origin, config);
        let mut stored = Vec::new();
        for cc in [
            "max-age=1, must-revalidate",
            "max-age=1, proxy-revalidate",
            "s-maxage=1",
            "max-age=1, no-cache",
        ] {
            let path = format!("/forbid-{name}?cc={}&etag={etag}&close_after=1", q(cc));
            let first = get(&lacquer.url(&path), &[]).await;
            assert!(first.is_stored(), "{name} {cc}: {:?}", first.cache_status());
            stored.push((path, cc));
        }
        let_it_go_stale().await;
        for (path, cc) in stored {
            let resp = get(&lacquer.url(&path), &[]).await;
            assert_eq!(
                resp.status,
                502,
                "{name} {cc}: served stale {:?}",
                resp.cache_status()
            );
            assert!(origin.hits_for(&path) >= 2, "{name} {cc}");
        }
    }
}

#[tokio::test]
async fn must_revalidate_and_proxy_revalidate_forbid_stale() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "[cache]\nstale_if_error_grace = \"10m\"");
    for cc in [
        "max-age=1, must-revalidate, stale-if-error=600",
        "max-age=1, proxy-revalidate, stale-if-error=600",
        "max-age=1, must-revalidate, stale-while-revalidate=600",
    ] {
        let path = format!("/mr?cc={}&fail_after=1", q(cc));
        let stored = get(&lacquer.url(&path), &[]).await;
        assert!(stored.is_stored(), "{cc}: {:?}", stored.cache_status());
        let_it_go_stale().await;
        let resp = get(&lacquer.url(&path), &[]).await;
        assert_eq!(resp.status, 503, "{cc}: served stale");
        assert_eq!(origin.hits_for(&path), 2, "{cc}");
    }
}

#[test]
fn grace_config_rejects_bad_values() {
    for (value, reason) in [
        ("soon", "not a duration"),
        ("1.5s", "whole number of seconds"),
        ("-1s", "not a duration"),
        ("100000d", "at most"),
    ] {
        let out = check_config(&format!(
            "upstream = \"127.0.0.1:1\"\n[cache]\nstale_if_error_grace = \"{value}\""
        ));
        let err = stderr_text(&out);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(
            err.contains("cache.stale_if_error_grace") && err.contains(reason),
            "{value}:\n{err}"
        );
    }
    let ok = check_config("upstream = \"127.0.0.1:1\"\n[cache]\nstale_if_error_grace = \"1h\"");
    assert_eq!(ok.status.code(), Some(0));
}
