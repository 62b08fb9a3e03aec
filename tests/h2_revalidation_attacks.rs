//! Attacks on pingora-core patch 0031 ("h2 subrequests"): an HTTP/2 client's stale hit under
//! `stale-while-revalidate` is refreshed by a background subrequest whose head is the client's
//! request written as HTTP/1.1 text (its `:authority` as `Host` when it sent none).
//!
//! Each test drives a real h2c (or h2 over TLS) client against the real `lacquer` binary and a
//! real scripted origin, and checks what the refresh asked the origin (method, target, `Host`,
//! `If-None-Match`, the variant's fields), what it stored (the right key, scheme and variant),
//! and what later clients get: with `Vary`, odd targets, both `host` and `:authority`, a 200 or
//! a 5xx or no answer at all to the refresh, a slow refresh under many streams, a purge or POST
//! while the refresh is in flight, a HEAD or Range request as the stale hit, TLS, and an
//! HTTP/1.1 client for comparison. Waits are bounded polls, never timing assertions.
//!
//! Written by a session whose only job was to break the patch; the patch held. What it found
//! instead, for HTTP/1.1 clients and plain misses as much as for HTTP/2: a purge made while a
//! fill's request waited at the origin (its answer not begun) was undone, the answer stored
//! after it and served (`..._purge_..._is_not_undone...`). A fill's entry was dated when its
//! answer arrived; it is now dated when its request was sent (`policy::RequestSent`), so a
//! purge issued in between covers it.

use lacquer_test_support as support;

use ::h2::client::SendRequest;
use bytes::Bytes;
use support::*;

const WITHIN: Duration = Duration::from_secs(10);

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"\n")
}

/// Waits until an entry stored with `max-age=1` is stale.
async fn let_it_go_stale() {
    tokio::time::sleep(Duration::from_millis(2100)).await;
}

/// A path whose answer lives 1 s, may be served stale for 10 min while refreshed, has ETag
/// `"v1"`, and whose conditional refresh is answered 304 with an hour of freshness; `extra`
/// (`&...`) adds to the script.
fn swr_304(base: &str, extra: &str) -> String {
    format!(
        "{base}?cc={}&cc304={}&etag={}&r304=1{extra}",
        q("max-age=1, stale-while-revalidate=600"),
        q("max-age=3600"),
        q("\"v1\"")
    )
}

/// The `ttl=` of an h2 answer's `Cache-Status` (0 when there is none).
fn ttl(answer: &H2Answer) -> i64 {
    answer
        .cache_status_param("ttl")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

async fn fetch(
    sender: &SendRequest<Bytes>,
    method: &str,
    url: &str,
    fields: &[(&str, &str)],
) -> H2Answer {
    match tokio::time::timeout(WITHIN, h2_fetch(sender, method, url, fields)).await {
        Ok(answer) => answer.unwrap_or_else(|e| panic!("{method} {url}: {e:?}")),
        Err(_) => panic!("{method} {url}: no answer within {WITHIN:?}"),
    }
}

/// GETs `url` with `fields` (at most 100 times, 100 ms apart) until `done` says the answer is
/// the one waited for; returns the last answer.
async fn poll_get(
    sender: &SendRequest<Bytes>,
    url: &str,
    fields: &[(&str, &str)],
    done: impl Fn(&H2Answer) -> bool,
) -> H2Answer {
    let mut answer = fetch(sender, "GET", url, fields).await;
    for _ in 0..100 {
        if done(&answer) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        answer = fetch(sender, "GET", url, fields).await;
    }
    answer
}

/// Polls until the entry is the 304 refresh's: an hour of freshness.
async fn wait_fresh(sender: &SendRequest<Bytes>, url: &str, fields: &[(&str, &str)]) -> H2Answer {
    let fresh = poll_get(sender, url, fields, |a| ttl(a) > 3000).await;
    assert!(
        ttl(&fresh) > 3000,
        "{url}: never refreshed: {}",
        fresh.cache_status()
    );
    fresh
}

/// The common case, checked closely: the refresh is an HTTP/1.1 GET for the same target, with
/// the same `Host` the client's own miss was forwarded with, conditional on the stored ETag.
#[tokio::test]
async fn h2_refresh_is_a_conditional_http11_get_with_the_miss_s_host() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/basic", "");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stored.status, 200);
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stale.status, 200);
    assert_eq!(stale.body, stored.body, "served the stale entry");
    assert!(ttl(&stale) <= 0, "stale: {}", stale.cache_status());
    assert!(
        origin.wait_for_hits_for_async(&path, 2, WITHIN).await,
        "no refresh"
    );
    let fresh = wait_fresh(&sender, &url, &[]).await;
    assert_eq!(fresh.body, stored.body, "a 304 keeps the stored body");
    let requests = origin.requests_for(&path);
    assert_eq!(requests.len(), 2, "exactly one refresh");
    let (miss, refresh) = (&requests[0], &requests[1]);
    assert_eq!(refresh.method, "GET");
    assert_eq!(refresh.path, path, "the same target");
    assert_eq!(refresh.version, 1, "HTTP/1.1 to the origin");
    assert_eq!(refresh.header("if-none-match"), Some("\"v1\""));
    assert!(refresh.header("host").is_some(), "a Host field");
    assert_eq!(refresh.header("host"), miss.header("host"), "the same Host");
    assert_eq!(
        refresh.header_all("host").len(),
        1,
        "one Host: {:?}",
        refresh.headers
    );
    driver.abort();
}

/// A refresh answered 200 with a new body (the origin ignores the validator): the next h2
/// request gets the new body, whole.
#[tokio::test]
async fn h2_refresh_answered_200_stores_the_new_body() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/h2a/new-body?cc={}&etag={}",
        q("max-age=1, stale-while-revalidate=600"),
        q("\"v1\"")
    );
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stored.text(), format!("{path} #1"));
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stale.text(), format!("{path} #1"));
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    let want = format!("{path} #2");
    let next = poll_get(&sender, &url, &[], |a| a.text() != format!("{path} #1")).await;
    assert_eq!(next.status, 200);
    assert_eq!(next.text(), want, "{}", next.cache_status());
    assert_eq!(
        next.fields
            .get("content-length")
            .map(|v| v.to_str().unwrap().to_string()),
        Some(want.len().to_string())
    );
    driver.abort();
}

/// `Vary: X-Variant` with two variants stored over h2: the stale hit of variant `a` is refreshed
/// with `a`'s field and only `a` is made fresh; `b` stays stale and is refreshed with `b`'s.
#[tokio::test]
async fn h2_refresh_of_a_vary_variant_uses_and_stores_that_variant() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/vary", "&vary=X-Variant");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let a = [("x-variant", "a")];
    let b = [("x-variant", "b")];
    let stored_a = fetch(&sender, "GET", &url, &a).await;
    let stored_b = fetch(&sender, "GET", &url, &b).await;
    assert_eq!(stored_a.text(), format!("{path} #1"));
    assert_eq!(stored_b.text(), format!("{path} #2"));
    let_it_go_stale().await;
    let stale_a = fetch(&sender, "GET", &url, &a).await;
    assert_eq!(stale_a.body, stored_a.body);
    assert!(origin.wait_for_hits_for_async(&path, 3, WITHIN).await);
    let fresh_a = wait_fresh(&sender, &url, &a).await;
    assert_eq!(fresh_a.body, stored_a.body, "variant a's body");
    let refresh_a = &origin.requests_for(&path)[2];
    assert_eq!(refresh_a.header("x-variant"), Some("a"));
    assert_eq!(refresh_a.header("if-none-match"), Some("\"v1\""));
    // b was not refreshed by a's refresh
    let stale_b = fetch(&sender, "GET", &url, &b).await;
    assert_eq!(stale_b.body, stored_b.body, "variant b's body");
    assert!(
        ttl(&stale_b) <= 0,
        "b is still stale: {}",
        stale_b.cache_status()
    );
    assert!(origin.wait_for_hits_for_async(&path, 4, WITHIN).await);
    let fresh_b = wait_fresh(&sender, &url, &b).await;
    assert_eq!(fresh_b.body, stored_b.body);
    assert_eq!(origin.requests_for(&path)[3].header("x-variant"), Some("b"));
    assert_eq!(origin.hits_for(&path), 4);
    driver.abort();
}

/// `Vary: Cookie` with the cookie sent as two h2 `cookie` fields (as RFC 9113 §8.2.3 allows):
/// the refresh (two `Cookie` lines in its HTTP/1.1 text) must be keyed as the same variant, so
/// the variant the client asks for becomes fresh.
#[tokio::test]
async fn h2_refresh_of_a_cookie_variant_sent_as_two_cookie_fields() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/vary-cookie", "&vary=Cookie");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let cookies = [("cookie", "a=1"), ("cookie", "b=2")];
    let stored = fetch(&sender, "GET", &url, &cookies).await;
    assert_eq!(stored.status, 200);
    let again = fetch(&sender, "GET", &url, &cookies).await;
    assert_eq!(again.body, stored.body, "a hit: {}", again.cache_status());
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &cookies).await;
    assert_eq!(stale.body, stored.body);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    let fresh = wait_fresh(&sender, &url, &cookies).await;
    assert_eq!(fresh.body, stored.body);
    let refresh = &origin.requests_for(&path)[1];
    let sent: Vec<&str> = refresh.header_all("cookie");
    assert!(
        sent.join("; ").contains("a=1") && sent.join("; ").contains("b=2"),
        "{:?}",
        refresh.headers
    );
    assert_eq!(origin.hits_for(&path), 2);
    driver.abort();
}

/// Targets that take the most rewriting: percent-encoded path bytes, sub-delimiters and odd but
/// legal characters in the path and query, and a long path. The refresh asks for exactly the
/// same target and stores the same key.
#[tokio::test]
async fn h2_refresh_keeps_odd_and_long_targets_exactly() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let long = "x".repeat(3000);
    let bases = [
        "/h2a/odd%20path/%E2%82%AC/a;b=c/~u_-.!$'()*+,:@".to_string(),
        format!("/h2a/long/{long}"),
        "/h2a/q/".to_string(),
    ];
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let mut paths = Vec::new();
    for (i, base) in bases.iter().enumerate() {
        let extra = match i {
            2 => "&k=%2F%3F%26&e=&u=a:b@c!$'()*,;~&dup=1&dup=2",
            _ => "",
        };
        let path = swr_304(base, extra);
        let stored = fetch(&sender, "GET", &lacquer.url(&path), &[]).await;
        assert_eq!(stored.status, 200, "{path}");
        paths.push((path, stored));
    }
    let_it_go_stale().await;
    for (path, stored) in &paths {
        let stale = fetch(&sender, "GET", &lacquer.url(path), &[]).await;
        assert_eq!(stale.body, stored.body, "{path}");
    }
    for (path, stored) in &paths {
        assert!(
            origin.wait_for_hits_for_async(path, 2, WITHIN).await,
            "no refresh of {path}: {:?}",
            origin
                .requests()
                .iter()
                .map(|r| &r.path)
                .collect::<Vec<_>>()
        );
        let fresh = wait_fresh(&sender, &lacquer.url(path), &[]).await;
        assert_eq!(fresh.body, stored.body, "{path}");
        let requests = origin.requests_for(path);
        assert_eq!(requests[1].path, *path);
        assert_eq!(requests[1].header("if-none-match"), Some("\"v1\""));
        assert_eq!(origin.hits_for(path), 2, "{path}");
    }
    driver.abort();
}

/// An h2 request carrying a `host` field beside `:authority` (naming the same host, in other
/// case): the refresh has one `Host`, the entry the client hits is the one refreshed.
#[tokio::test]
async fn h2_refresh_of_a_request_with_host_and_authority() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/host-and-authority", "");
    let url = format!("http://localhost:{}{path}", lacquer.port());
    let host = format!("localhost:{}", lacquer.port());
    let fields = [("host", host.as_str())];
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &fields).await;
    assert_eq!(stored.status, 200, "{} {:?}", stored.text(), stored.fields);
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &fields).await;
    assert_eq!(stale.body, stored.body);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    wait_fresh(&sender, &url, &fields).await;
    let requests = origin.requests_for(&path);
    assert_eq!(requests[1].header_all("host").len(), 1, "{:?}", requests[1]);
    assert_eq!(requests[1].header("host"), requests[0].header("host"));
    assert_eq!(origin.hits_for(&path), 2);
    driver.abort();
}

/// Fifty streams on one connection, all at once, on one stale entry: all are served the stale
/// body and exactly one refresh reaches the origin.
#[tokio::test]
async fn h2_many_concurrent_streams_on_a_stale_entry_make_one_refresh() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/many", "&sleep_after=1:500");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_wide(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    let_it_go_stale().await;
    let mut all = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (sender, url) = (sender.clone(), url.clone());
        all.spawn(async move { fetch(&sender, "GET", &url, &[]).await });
    }
    for answer in all.join_all().await {
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body, stored.body, "{}", answer.cache_status());
    }
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    wait_fresh(&sender, &url, &[]).await;
    assert_eq!(origin.hits_for(&path), 2, "exactly one refresh");
    driver.abort();
}

/// A slow refresh (the origin waits 3 s): h2 requests made meanwhile are all answered with the
/// stale body (each well within the bound, while the refresh still waits), and no second
/// refresh is made.
#[tokio::test]
async fn h2_slow_refresh_serves_stale_meanwhile_and_refreshes_once() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/slow", "&sleep_after=1:3000");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    let_it_go_stale().await;
    let first = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(first.body, stored.body);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    for _ in 0..5 {
        let during = tokio::time::timeout(
            Duration::from_millis(2500),
            h2_fetch(&sender, "GET", &url, &[]),
        )
        .await
        .expect("a stale hit waited for the refresh")
        .unwrap();
        assert_eq!(during.body, stored.body);
    }
    wait_fresh(&sender, &url, &[]).await;
    assert_eq!(origin.hits_for(&path), 2);
    driver.abort();
}

/// The stale entry of `path`, whose refresh fails (`path`'s script says how), goes on being
/// served, not the failure, and later requests are answered (no cache lock left taken).
async fn stale_served_after_a_failed_refresh(path: &str) {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let url = lacquer.url(path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stale.body, stored.body);
    assert!(origin.wait_for_hits_for_async(path, 2, WITHIN).await);
    for _ in 0..10 {
        let next = fetch(&sender, "GET", &url, &[]).await;
        assert_eq!(next.status, 200, "{}", next.cache_status());
        assert_eq!(next.body, stored.body, "{}", next.cache_status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    driver.abort();
}

/// The refresh answered 503 (`stale-if-error` too).
#[tokio::test]
async fn h2_refresh_answered_5xx_keeps_serving_the_stale_entry() {
    stale_served_after_a_failed_refresh(&format!(
        "/h2a/5xx?cc={}&fail_after=1",
        q("max-age=1, stale-while-revalidate=600, stale-if-error=600")
    ))
    .await;
}

/// The origin closes the refresh's connection without an answer.
#[tokio::test]
async fn h2_refresh_without_an_answer_keeps_serving_the_stale_entry() {
    stale_served_after_a_failed_refresh(&format!(
        "/h2a/closed?cc={}&close_after=1",
        q("max-age=1, stale-while-revalidate=600")
    ))
    .await;
}

/// What the client sees after an invalidation (`how`: "PURGE" or "POST") made while the refresh
/// waits at the origin: the first GET after the refresh ended.
async fn invalidated_during_refresh(h2_client: bool, how: &str) -> (String, String, String) {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/h2a/inval-{}-{how}?cc={}&sleep_after=1:2000",
        if h2_client { "h2" } else { "h1" },
        q("max-age=1, stale-while-revalidate=600")
    );
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let get_text = |sender: SendRequest<Bytes>, url: String| async move {
        if h2_client {
            fetch(&sender, "GET", &url, &[]).await.text()
        } else {
            get(&url, &[]).await.text()
        }
    };
    assert_eq!(
        get_text(sender.clone(), url.clone()).await,
        format!("{path} #1")
    );
    let_it_go_stale().await;
    assert_eq!(
        get_text(sender.clone(), url.clone()).await,
        format!("{path} #1")
    );
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    // the refresh is at the origin, which answers it in 2 s: invalidate now
    let invalidation = match how {
        "PURGE" => request("PURGE", &url, &[], None).await,
        _ => post(&url, &[], "x").await,
    };
    assert!(
        invalidation.status < 300,
        "{how}: {} {}",
        invalidation.status,
        invalidation.text()
    );
    let hits_after_invalidation = origin.hits_for(&path);
    // wait until the refresh was answered, and a little for it to be stored
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let after = get_text(sender.clone(), url.clone()).await;
    driver.abort();
    let hits = origin.hits_for(&path);
    let asked: Vec<String> = origin
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path_only()))
        .collect();
    (
        after,
        format!("{path} #2"),
        format!(
            "origin hits {hits_after_invalidation} at the {how}, {hits} at the end: {asked:?}; \
             invalidation answered {:?}",
            invalidation.cache_status()
        ),
    )
}

/// A PURGE while an h2 client's refresh is in flight: the refresh's answer (fetched before the
/// purge) is not what the next client is served from the cache.
#[tokio::test]
async fn h2_purge_during_the_refresh_is_not_undone_by_it() {
    let (after, refreshed, why) = invalidated_during_refresh(true, "PURGE").await;
    assert_ne!(after, refreshed, "the purged page came back: {why}");
}

/// The same for an HTTP/1.1 client, to tell whether a failure is HTTP/2's.
#[tokio::test]
async fn h1_purge_during_the_refresh_is_not_undone_by_it() {
    let (after, refreshed, why) = invalidated_during_refresh(false, "PURGE").await;
    assert_ne!(after, refreshed, "the purged page came back: {why}");
}

/// A POST to the URL (an unsafe method, RFC 9111 §4.4) sent while an h2 client's refresh is in
/// flight (the origin holds the POST 2 s too, so its invalidation lands after the refresh is
/// stored): the refreshed entry is invalidated.
#[tokio::test]
async fn h2_post_during_the_refresh_is_not_undone_by_it() {
    let (after, refreshed, why) = invalidated_during_refresh(true, "POST").await;
    assert_ne!(after, refreshed, "the invalidated page came back: {why}");
}

/// The same for an HTTP/1.1 client.
#[tokio::test]
async fn h1_post_during_the_refresh_is_not_undone_by_it() {
    let (after, refreshed, why) = invalidated_during_refresh(false, "POST").await;
    assert_ne!(after, refreshed, "the invalidated page came back: {why}");
}

/// HEAD over h2 as the stale hit: answered without a body; the refresh is a GET (a HEAD refresh
/// answered 200 would store an empty body), and a later GET gets the whole new body.
#[tokio::test]
async fn h2_head_on_a_stale_entry_refreshes_with_a_get() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/h2a/head?cc={}",
        q("max-age=1, stale-while-revalidate=600")
    );
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stored.text(), format!("{path} #1"));
    let_it_go_stale().await;
    let head = fetch(&sender, "HEAD", &url, &[]).await;
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    let refreshed = origin.wait_for_hits_for_async(&path, 2, WITHIN).await;
    assert!(refreshed, "a HEAD's stale hit was not refreshed");
    let requests = origin.requests_for(&path);
    assert_eq!(requests[1].method, "GET", "the refresh is a GET");
    {
        let next = poll_get(&sender, &url, &[], |a| a.text() != format!("{path} #1")).await;
        assert_eq!(
            next.text(),
            format!("{path} #2"),
            "{} after a {} refresh",
            next.cache_status(),
            requests[1].method
        );
    }
    driver.abort();
}

/// The same HEAD attack from an HTTP/1.1 client, to compare.
#[tokio::test]
async fn h1_head_on_a_stale_entry_refreshes_with_a_get() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/h2a/head-h1?cc={}",
        q("max-age=1, stale-while-revalidate=600")
    );
    let url = lacquer.url(&path);
    assert_eq!(get(&url, &[]).await.text(), format!("{path} #1"));
    let_it_go_stale().await;
    let stale = head(&url, &[]).await;
    assert_eq!(stale.status, 200);
    let refreshed = origin.wait_for_hits_for_async(&path, 2, WITHIN).await;
    assert!(refreshed, "a HEAD's stale hit was not refreshed");
    {
        let mut next = get(&url, &[]).await;
        for _ in 0..100 {
            if next.text() != format!("{path} #1") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            next = get(&url, &[]).await;
        }
        assert_eq!(
            next.text(),
            format!("{path} #2"),
            "{:?}",
            next.cache_status()
        );
    }
}

/// A Range request over h2 as the stale hit: 206 with the stale entry's bytes; the refresh asks
/// for the whole representation (no Range), conditionally, and the entry becomes fresh whole.
#[tokio::test]
async fn h2_range_on_a_stale_entry_refreshes_the_whole_entry() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/range", "&len=5000");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    assert_eq!(stored.body.len(), 5000);
    let_it_go_stale().await;
    let part = fetch(&sender, "GET", &url, &[("range", "bytes=10-19")]).await;
    assert_eq!(part.status, 206, "{}", part.cache_status());
    assert_eq!(part.body, stored.body[10..20]);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    let refresh = &origin.requests_for(&path)[1];
    assert!(!refresh.has_header("range"), "{:?}", refresh.headers);
    assert_eq!(refresh.header("if-none-match"), Some("\"v1\""));
    let fresh = wait_fresh(&sender, &url, &[]).await;
    assert_eq!(fresh.body, stored.body);
    assert_eq!(origin.hits_for(&path), 2);
    driver.abort();
}

/// h2 over TLS: the refresh refreshes the `https` entry (the one the TLS client hits), not the
/// `http` one of the same URL, which stays stale until an h2c client's own stale hit.
#[tokio::test]
async fn h2_over_tls_refreshes_the_https_entry() {
    let origin = scripted_origin();
    let dir = TempDir::new("lacquer-h2-swr-tls");
    let ca = TestCa::new(dir.path(), "h2-swr");
    let server = ca.server_cert("lacquer");
    let tls_port = free_port();
    let extra = format!(
        "[log]\naccess = \"off\"\n{}",
        server.tls_toml(&format!("127.0.0.1:{tls_port}"))
    );
    let lacquer = LacquerProcess::start_simple(origin.addr(), &extra);
    let path = swr_304("/h2a/tls", "");
    let tls_addr: std::net::SocketAddr = format!("127.0.0.1:{tls_port}").parse().unwrap();
    let https_url = format!("https://localhost:{tls_port}{path}");
    let http_url = format!("http://localhost:{}{path}", lacquer.port());
    let (tls, tls_driver) = h2_connect_tls(tls_addr, &ca.cert).await;
    let (h2c, h2c_driver) = h2_connect_default(lacquer.addr()).await;
    let stored_https = fetch(&tls, "GET", &https_url, &[]).await;
    let stored_http = fetch(&h2c, "GET", &http_url, &[]).await;
    assert_eq!(stored_https.text(), format!("{path} #1"));
    assert_eq!(stored_http.text(), format!("{path} #2"), "keyed apart");
    let_it_go_stale().await;
    let stale = fetch(&tls, "GET", &https_url, &[]).await;
    assert_eq!(stale.body, stored_https.body);
    assert!(origin.wait_for_hits_for_async(&path, 3, WITHIN).await);
    let fresh = wait_fresh(&tls, &https_url, &[]).await;
    assert_eq!(fresh.body, stored_https.body, "the https entry's body");
    let still_stale = fetch(&h2c, "GET", &http_url, &[]).await;
    assert_eq!(still_stale.body, stored_http.body);
    assert!(
        ttl(&still_stale) <= 0,
        "the http entry was refreshed instead: {}",
        still_stale.cache_status()
    );
    assert!(origin.wait_for_hits_for_async(&path, 4, WITHIN).await);
    let fresh_http = wait_fresh(&h2c, &http_url, &[]).await;
    assert_eq!(fresh_http.body, stored_http.body);
    assert_eq!(origin.hits_for(&path), 4);
    tls_driver.abort();
    h2c_driver.abort();
}

/// HTTP/1.1 clients, as before the patch: the refresh is made, conditional, with the miss's
/// Host, and stored.
#[tokio::test]
async fn h1_refresh_still_works() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/h1", "&vary=X-Variant");
    let url = lacquer.url(&path);
    let stored = get(&url, &[("x-variant", "a")]).await;
    let_it_go_stale().await;
    let stale = get(&url, &[("x-variant", "a")]).await;
    assert_eq!(stale.body, stored.body);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    let mut hit = get(&url, &[("x-variant", "a")]).await;
    for _ in 0..100 {
        if hit.cache_ttl().unwrap_or(0) > 3000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        hit = get(&url, &[("x-variant", "a")]).await;
    }
    assert!(
        hit.cache_ttl().unwrap_or(0) > 3000,
        "{:?}",
        hit.cache_status()
    );
    let requests = origin.requests_for(&path);
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].header("if-none-match"), Some("\"v1\""));
    assert_eq!(requests[1].header("x-variant"), Some("a"));
    assert_eq!(requests[1].header("host"), requests[0].header("host"));
}

/// For comparison with the refresh cases: a plain miss (no stale entry, HTTP/1.1) whose request
/// is at the origin (its answer not yet begun) when the URL is purged.
#[tokio::test]
async fn h1_purge_while_a_plain_miss_waits_for_the_origin_is_not_undone() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/h2a/miss-purge?cc={}&sleep=2000", q("max-age=600"));
    let url = lacquer.url(&path);
    let miss = tokio::spawn({
        let url = url.clone();
        async move { get(&url, &[]).await }
    });
    assert!(origin.wait_for_hits_for_async(&path, 1, WITHIN).await);
    let purge = request("PURGE", &url, &[], None).await;
    assert!(matches!(purge.status, 200 | 202 | 404), "{}", purge.status);
    assert_eq!(miss.await.unwrap().text(), format!("{path} #1"));
    let next = get(&url, &[]).await;
    assert_ne!(
        next.text(),
        format!("{path} #1"),
        "the purged page came back: {:?}",
        next.cache_status()
    );
}

/// The stale hit is itself conditional, with a validator of the client's (`"client"`, not the
/// stored one): the client's validator must not replace the stored one in the refresh (the
/// origin would answer 304 for the client's copy, not the cache's).
#[tokio::test]
async fn h2_conditional_stale_hit_refreshes_with_the_stored_validator() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/client-inm", "");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &[("if-none-match", "\"client\"")]).await;
    assert_eq!(stale.status, 200, "no match: the whole stale entry");
    assert_eq!(stale.body, stored.body);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    wait_fresh(&sender, &url, &[]).await;
    let refresh = &origin.requests_for(&path)[1];
    assert_eq!(
        refresh.header_all("if-none-match"),
        vec!["\"v1\""],
        "{:?}",
        refresh.headers
    );
    driver.abort();
}

/// `Vary: Accept-Encoding` (a gzip variant and an identity one) over h2: the gzip variant's
/// stale hit is refreshed asking for gzip, and the variant stays gzip-coded and decodable.
#[tokio::test]
async fn h2_refresh_of_the_gzip_variant_asks_for_gzip() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/gzip", "&gzip=1&repeat=50");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let gz = [("accept-encoding", "gzip")];
    let plain = [("accept-encoding", "identity")];
    let stored_gz = fetch(&sender, "GET", &url, &gz).await;
    let stored_plain = fetch(&sender, "GET", &url, &plain).await;
    assert_eq!(
        stored_gz
            .fields
            .get("content-encoding")
            .map(|v| v.to_str().unwrap()),
        Some("gzip")
    );
    // (the identity answer may come from the gzip copy, decoded: count what was fetched)
    let fetched = origin.hits_for(&path);
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &url, &gz).await;
    assert_eq!(stale.body, stored_gz.body);
    let refreshed = origin
        .wait_for_hits_for_async(&path, fetched + 1, WITHIN)
        .await;
    assert!(refreshed, "no refresh");
    let fresh = wait_fresh(&sender, &url, &gz).await;
    assert_eq!(fresh.body, stored_gz.body, "still the gzip coding");
    assert_eq!(gunzip(&fresh.body), stored_plain.body);
    let plain_after = fetch(&sender, "GET", &url, &plain).await;
    assert_eq!(plain_after.body, stored_plain.body, "identity still plain");
    let refresh = &origin.requests_for(&path)[fetched];
    assert_eq!(refresh.header("if-none-match"), Some("\"v1\""));
    assert!(
        refresh
            .header("accept-encoding")
            .is_some_and(|v| v.contains("gzip")),
        "{:?}",
        refresh.headers
    );
    driver.abort();
}

/// The client goes away (its connection dropped) right after its stale hit's head: the refresh,
/// a request of Lacquer's own, still happens and is stored.
#[tokio::test]
async fn h2_refresh_survives_the_client_connection_dropping() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/gone", "&sleep_after=1:500&len=200000");
    let url = lacquer.url(&path);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &url, &[]).await;
    driver.abort();
    let_it_go_stale().await;
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let (response, _stream) = h2_request(&sender, "GET", &url, &[]).await;
    let head = tokio::time::timeout(WITHIN, response)
        .await
        .expect("a head")
        .unwrap();
    assert_eq!(head.status(), 200);
    drop(head);
    driver.abort();
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let fresh = wait_fresh(&sender, &url, &[]).await;
    assert_eq!(fresh.body, stored.body);
    assert_eq!(origin.hits_for(&path), 2);
    driver.abort();
}

/// An h2 request with no `:authority`, its host in a `host` field only (RFC 9113 §8.3.1 allows
/// it): the refresh keeps that one `Host` and refreshes the entry the client hits.
#[tokio::test]
async fn h2_refresh_of_a_request_with_a_host_field_and_no_authority() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = swr_304("/h2a/host-only", "");
    let host = format!("localhost:{}", lacquer.port());
    let fields = [("host", host.as_str())];
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let stored = fetch(&sender, "GET", &path, &fields).await;
    assert_eq!(stored.status, 200, "{}", stored.text());
    let_it_go_stale().await;
    let stale = fetch(&sender, "GET", &path, &fields).await;
    assert_eq!(stale.body, stored.body);
    assert!(origin.wait_for_hits_for_async(&path, 2, WITHIN).await);
    let fresh = wait_fresh(&sender, &path, &fields).await;
    assert_eq!(fresh.body, stored.body);
    let requests = origin.requests_for(&path);
    assert_eq!(requests[1].header_all("host"), vec![host.as_str()]);
    assert_eq!(requests[0].header("host"), Some(host.as_str()));
    assert_eq!(origin.hits_for(&path), 2);
    driver.abort();
}
