//! RFC 9111 §3 (storing responses) and §5.2.2 (response directives), over real sockets.
//!
//! Which status codes are stored heuristically or only with explicit freshness, and what
//! `no-store`, `private`, `private="field"`, `no-cache`, `must-understand`, `s-maxage` and a
//! request's `Authorization` do; that a stored response keeps its `Date`; `Set-Cookie` with
//! `cache.store_set_cookie`; POST responses reused for GETs with `cache.reuse_post_responses`
//! (also by the GET that follows at once, which the POST's own purge must not cover). Other storing tests live in `tests/core_caching.rs`
//! (`uncacheable_responses_are_not_served_from_cache`, `authorization_requires_explicit_permission`,
//! `heuristic_freshness_from_last_modified`); `docs/conformance.md` maps them all.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

async fn twice(
    lacquer: &LacquerProcess,
    origin: &TestOrigin,
    path: &str,
    headers: &[(&str, &str)],
) -> (Resp, Resp, usize) {
    let first = get(&lacquer.url(path), headers).await;
    let second = get(&lacquer.url(path), headers).await;
    (first, second, origin.hits_for(path))
}

#[tokio::test]
async fn heuristically_cacheable_statuses_are_stored_with_last_modified() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // RFC 9110 §15.1: these may be stored with heuristic freshness
    for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
        let path = format!("/heur-{status}?status={status}&lm=-100000");
        let (first, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
        assert_eq!(first.status, status);
        assert_eq!(second.status, status);
        assert!(second.is_hit(), "{status}: {:?}", second.cache_status());
        assert_eq!(hits, 1, "{status}");
        assert_eq!(second.body, first.body, "{status}");
    }
    // the others are not
    for status in [302, 303, 307, 400, 403, 500, 502, 503] {
        let path = format!("/noheur-{status}?status={status}&lm=-100000");
        let (_, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
        assert_eq!(second.status, status);
        assert_eq!(hits, 2, "{status} stored heuristically");
    }
}

#[tokio::test]
async fn any_understood_status_is_stored_with_explicit_freshness() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    for status in [200, 302, 303, 307, 400, 403, 500, 503] {
        let path = format!("/explicit-{status}?status={status}&cc={}", q("max-age=600"));
        let (_, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
        assert_eq!(second.status, status);
        assert!(second.is_hit(), "{status}: {:?}", second.cache_status());
        assert_eq!(hits, 1, "{status}");
    }
    let expires = "/explicit-expires?status=302&expires=600";
    let (_, second, hits) = twice(&lacquer, &origin, expires, &[]).await;
    assert!(second.is_hit());
    assert_eq!(hits, 1);
}

#[tokio::test]
async fn a_304_is_never_stored_as_an_entry() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/only304?status=304&cc={}", q("max-age=600"));
    let (first, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
    assert_eq!(first.status, 304);
    assert_eq!(second.status, 304);
    assert_eq!(hits, 2);
    assert!(!second.is_hit());
}

#[tokio::test]
async fn no_store_and_private_are_not_stored() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    for cc in [
        "no-store",
        "max-age=600, no-store",
        "no-store, s-maxage=600",
        "private, max-age=600",
        "PRIVATE, s-maxage=600",
    ] {
        let path = format!("/ns?cc={}", q(cc));
        let (_, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
        assert_eq!(hits, 2, "{cc}");
        assert!(!second.cache_status().unwrap().contains("stored"), "{cc}");
    }
}

#[tokio::test]
async fn private_with_field_names_stores_without_those_fields() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/private-field?cc={}&hdr={}&hdr={}",
        q("private=\"X-Secret\", max-age=600"),
        q("X-Secret:for-one-user"),
        q("X-Public:for-all")
    );
    let (first, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
    assert_eq!(hits, 1, "private=\"field\" still allows storing");
    assert!(second.is_hit());
    // (the response that is stored is the one Pingora sends on the miss too, so the listed
    // field is withheld from the first client as well: stricter than RFC 9111 §5.2.2.7 needs)
    assert!(!first.has_header("x-secret"));
    assert!(!second.has_header("x-secret"), "a listed field was stored");
    assert_eq!(second.header("x-public").as_deref(), Some("for-all"));
    assert_eq!(second.body, first.body);
}

#[tokio::test]
async fn no_cache_is_stored_but_always_revalidated() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/nc?cc={}&etag={}&r304=1",
        q("no-cache, max-age=600"),
        q("\"v1\"")
    );
    let first = get(&lacquer.url(&path), &[]).await;
    assert!(first.cache_status().unwrap().contains("stored"));
    for round in 2..=3 {
        let again = get(&lacquer.url(&path), &[]).await;
        assert_eq!(again.status, 200);
        assert_eq!(again.body, first.body, "the stored body, validated");
        assert!(!again.is_hit());
        assert_eq!(origin.hits_for(&path), round);
        let seen = origin.last_request().unwrap();
        assert_eq!(seen.header("if-none-match"), Some("\"v1\""));
    }
}

/// RFC 9111 §5.2.2.4: a `no-cache` response with a validator is stored even with no freshness of
/// its own (and with `max-age` or `Expires`), and every use is one conditional request whose 304
/// serves the stored body.
#[tokio::test]
async fn no_cache_with_a_validator_is_revalidated_on_every_use() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let lm = http_date_offset(-100_000);
    let expires = q(&http_date_offset(600));
    let cases = [
        (
            "etag",
            format!("cc=no-cache&etag={}", q("\"v1\"")),
            "if-none-match",
        ),
        (
            "lm",
            format!("cc=no-cache&hdr={}", q(&format!("Last-Modified:{lm}"))),
            "if-modified-since",
        ),
        (
            "max-age",
            format!("cc={}&etag={}", q("no-cache, max-age=600"), q("\"v1\"")),
            "if-none-match",
        ),
        (
            "expires",
            format!("cc=no-cache&expires={expires}&etag={}", q("\"v1\"")),
            "if-none-match",
        ),
        (
            "upper",
            format!("cc=NO-CACHE&etag={}", q("\"v1\"")),
            "if-none-match",
        ),
    ];
    for (name, script, validator) in cases {
        let path = format!("/nc-{name}?{script}&r304=1");
        let first = get(&lacquer.url(&path), &[]).await;
        assert!(first.is_stored(), "{name}: {:?}", first.cache_status());
        for round in 2..=3 {
            let again = get(&lacquer.url(&path), &[]).await;
            assert_eq!(again.status, 200, "{name}");
            assert_eq!(again.body, first.body, "{name}: the stored body, validated");
            assert_eq!(
                again.cache_status_param("fwd-status").as_deref(),
                Some("304"),
                "{name}: {:?}",
                again.cache_status()
            );
            assert_eq!(origin.hits_for(&path), round, "{name}: one request per use");
            let seen = origin.last_request().unwrap();
            assert!(seen.header(validator).is_some(), "{name}: no {validator}");
        }
    }
    // without a validator there is nothing to revalidate with: not stored
    let bare = "/nc-bare?cc=no-cache";
    let first = get(&lacquer.url(bare), &[]).await;
    assert!(!first.is_stored(), "{:?}", first.cache_status());
}

/// RFC 9110 §6.6.1, RFC 9111 §4: a response keeps the `Date` the origin sent, on the miss that
/// stores it and on every hit (`Age` says how old it is); a response that came without one gets
/// the time it was received, once.
///
/// Needs Pingora's server sessions to leave a response's `Date` alone: pingora-core 0.9.1 replaces
/// it on every response; the vendored copy's patch 0004 (`vendor/patches/pingora-core/`) keeps it.
#[tokio::test]
async fn a_stored_response_keeps_its_date() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let date = http_date_offset(-30);
    let path = format!("/keeps-date?cc={}&date={}", q("max-age=3600"), q(&date));
    let miss = get(&lacquer.url(&path), &[]).await;
    assert!(miss.is_stored(), "{:?}", miss.cache_status());
    assert_eq!(
        miss.header("date").as_deref(),
        Some(date.as_str()),
        "the miss"
    );
    // a second boundary passes, so a Date made at the hit would differ
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for client in [http_client(), h2c_client()] {
        let hit = send(&client, "GET", &lacquer.url(&path), &[], None)
            .await
            .unwrap();
        assert!(hit.is_hit(), "{:?}", hit.cache_status());
        assert_eq!(
            hit.header("date").as_deref(),
            Some(date.as_str()),
            "{:?}",
            hit.version
        );
        assert!(hit.age().unwrap() >= 30);
    }

    let dateless = RawOrigin::answering(|_head, stream| {
        use std::io::Write;
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nCache-Control: max-age=600\r\nContent-Length: 2\r\n\r\nok",
        );
    });
    let lacquer = LacquerProcess::start_simple(dateless.addr, "[log]\naccess = \"off\"");
    let miss = get(&lacquer.url("/added-date"), &[]).await;
    let added = miss
        .header("date")
        .expect("a Date added to a response that had none");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let hit = get(&lacquer.url("/added-date"), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(hit.header("date"), Some(added));
}

/// `Set-Cookie` responses are never stored by default (the cookie would go to every client);
/// `cache.store_set_cookie = true` stores them as RFC 9111 allows, cookie included.
#[tokio::test]
async fn set_cookie_responses_are_stored_only_when_configured() {
    let origin = scripted_origin();
    let path = format!("/cookie-strict?cc={}&cookie=1", q("max-age=600"));
    let default = proxy(&origin);
    let (_, second, hits) = twice(&default, &origin, &path, &[]).await;
    assert_eq!(hits, 2, "not stored by default");
    assert_eq!(
        second.cache_status_param("detail").as_deref(),
        Some("set-cookie")
    );
    drop(default);

    origin.reset_counts();
    let strict = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache]\nstore_set_cookie = true",
    );
    let (first, second, hits) = twice(&strict, &origin, &path, &[]).await;
    assert!(first.is_stored(), "{:?}", first.cache_status());
    assert!(second.is_hit(), "{:?}", second.cache_status());
    assert_eq!(hits, 1);
    assert_eq!(second.body, first.body);
    assert_eq!(
        second.header("set-cookie").as_deref(),
        Some("session=secret"),
        "the stored cookie goes to every client"
    );
}

/// RFC 9110 §9.3.3, RFC 9111 §4: with `cache.reuse_post_responses`, a POST response whose
/// `Content-Location` is the request URL and that has explicit freshness answers later GETs (and
/// HEADs) of the URL; without the key, or without those conditions, it does not.
#[tokio::test]
async fn post_responses_naming_their_url_are_reused_for_gets_when_configured() {
    let origin = TestOrigin::start(|req| {
        let n = req.path.clone();
        match req.method.as_str() {
            "POST" => {
                let mut resp = OriginResponse::ok(format!("posted to {n}"));
                if !n.contains("no-cl") {
                    resp = resp.header("Content-Location", n.clone());
                }
                if !n.contains("no-fresh") {
                    resp = resp.header("Cache-Control", "max-age=600");
                }
                resp
            }
            // a GET miss is answered, and never stored, so a hit can only be the POST's answer
            _ => OriginResponse::ok(format!("got {n}")).header("Cache-Control", "no-store"),
        }
    });
    let config = "[log]\naccess = \"off\"\n[cache]\nreuse_post_responses = true";
    let lacquer = LacquerProcess::start_simple(origin.addr(), config);
    let client = http_client();
    let url = lacquer.url("/form?id=1");
    let posted = send(&client, "POST", &url, &[], Some(Bytes::from("x=1")))
        .await
        .unwrap();
    assert_eq!(posted.text(), "posted to /form?id=1");
    let hit = poll_for_hit(&client, &url).await;
    assert_eq!(
        hit.text(),
        "posted to /form?id=1",
        "{:?}",
        hit.cache_status()
    );
    let head = send(&client, "HEAD", &url, &[], None).await.unwrap();
    assert!(head.is_hit(), "{:?}", head.cache_status());
    assert_eq!(
        origin
            .requests()
            .iter()
            .filter(|r| r.method == "POST")
            .count(),
        1
    );

    // no Content-Location, or no freshness: the next GET goes to the origin
    for path in ["/no-cl?id=1", "/no-fresh?id=1"] {
        let url = lacquer.url(path);
        send(&client, "POST", &url, &[], Some(Bytes::from("x=1")))
            .await
            .unwrap();
        let got = send(&client, "GET", &url, &[], None).await.unwrap();
        assert_eq!(got.text(), format!("got {path}"), "{path}");
    }

    // off by default
    let default = proxy(&origin);
    let url = default.url("/form?id=2");
    send(&client, "POST", &url, &[], Some(Bytes::from("x=1")))
        .await
        .unwrap();
    let got = send(&client, "GET", &url, &[], None).await.unwrap();
    assert_eq!(got.text(), "got /form?id=2");
}

/// The GET that follows a POST on the same connection is always served the POST's answer: the
/// answer is stored (in `logging`) before the connection reads its next request, and the purge the
/// POST itself made (RFC 9111 §4.4) must not cover it. With an origin that answers within the
/// millisecond, the store used to fall inside the millisecond the purge's stamp covers and be
/// judged purged: about half of the answers were never reused.
#[test]
fn a_post_answer_is_reused_by_the_get_that_follows_it_on_the_same_connection() {
    let origin = TestOrigin::start(|req| {
        if req.method == "POST" {
            OriginResponse::ok(format!("posted to {}", req.path))
                .header("Content-Location", req.path.clone())
                .header("Cache-Control", "max-age=600")
        } else {
            OriginResponse::ok(format!("got {}", req.path)).header("Cache-Control", "no-store")
        }
    });
    let config = "[log]\naccess = \"off\"\n[cache]\nreuse_post_responses = true";
    let lacquer = LacquerProcess::start_simple(origin.addr(), config);
    let mut conn = RawConn::connect(lacquer.addr());
    let mut reused = Vec::new();
    for i in 0..20 {
        let path = format!("/form/{i}");
        conn.send(
            format!(
                "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 3\r\n\r\nx=1"
            )
            .as_bytes(),
        );
        assert_eq!(
            conn.read_response(false).text(),
            format!("posted to {path}")
        );
        let got = conn.get(&path, &[]);
        reused.push((path, got.text()));
    }
    let not_reused: Vec<_> = reused
        .iter()
        .filter(|(path, text)| *text != format!("posted to {path}"))
        .collect();
    assert!(
        not_reused.is_empty(),
        "GETs not served the POST's answer: {not_reused:?}"
    );
    assert_eq!(
        origin
            .requests()
            .iter()
            .filter(|r| r.method == "GET")
            .count(),
        0
    );
}

/// GETs `url` until it is a hit (the POST's answer is stored once its request has ended, in
/// `logging`), for at most 20 s; returns the hit.
async fn poll_for_hit(client: &reqwest::Client, url: &str) -> Resp {
    for _ in 0..200 {
        let resp = send(client, "GET", url, &[], None).await.unwrap();
        if resp.is_hit() {
            return resp;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never became a hit");
}

#[tokio::test]
async fn must_understand_overrides_no_store_for_understood_statuses() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let cc = q("must-understand, no-store, max-age=600");
    let understood = format!("/mu?cc={cc}");
    let (_, second, hits) = twice(&lacquer, &origin, &understood, &[]).await;
    assert!(second.is_hit(), "{:?}", second.cache_status());
    assert_eq!(hits, 1);
    // a status this cache does not know: not stored, whatever else the response says
    let unknown = format!(
        "/mu-299?status=299&cc={}",
        q("must-understand, max-age=600")
    );
    let (_, second, hits) = twice(&lacquer, &origin, &unknown, &[]).await;
    assert_eq!(second.status, 299);
    assert_eq!(hits, 2);
}

#[tokio::test]
async fn s_maxage_beats_max_age_for_a_shared_cache() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/smax?cc={}", q("max-age=0, s-maxage=600"));
    let (_, second, hits) = twice(&lacquer, &origin, &path, &[]).await;
    assert!(second.is_hit(), "{:?}", second.cache_status());
    assert_eq!(hits, 1);
    let ttl: i64 = second.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((590..=600).contains(&ttl), "ttl {ttl}");
    let path = format!("/smax0?cc={}", q("max-age=600, s-maxage=0"));
    let (_, _, hits) = twice(&lacquer, &origin, &path, &[]).await;
    assert_eq!(hits, 2);
}

#[tokio::test]
async fn authorization_allows_storing_only_when_the_response_says_so() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let auth = [("authorization", "Basic dTpw")];
    for (cc, stored) in [
        ("max-age=600", false),
        ("public, max-age=600", true),
        ("s-maxage=600", true),
        ("must-revalidate, max-age=600", true),
    ] {
        let path = format!("/authz?cc={}", q(cc));
        let (_, _, hits) = twice(&lacquer, &origin, &path, &auth).await;
        assert_eq!(hits, if stored { 1 } else { 2 }, "{cc}");
    }
}
