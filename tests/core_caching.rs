//! Core caching behaviour over real sockets: a real origin, the real `lacquer` binary, a real client.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

#[tokio::test]
async fn miss_then_hit_with_age() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/page?cc=max-age%3D60";

    let first = get(&lacquer.url(path), &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.cache_status().unwrap(),
        "lacquer; fwd=uri-miss; fwd-status=200; stored"
    );

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = get(&lacquer.url(path), &[]).await;
    assert_eq!(second.status, 200);
    assert_eq!(second.body, first.body, "hit must serve the stored body");
    assert!(second.is_hit(), "{:?}", second.cache_status());
    assert!(second.age().unwrap() >= 1, "Age on a hit after 1.1 s");
    let ttl: i64 = second.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((55..=59).contains(&ttl), "ttl {ttl}");
    assert_eq!(origin.hits_for(path), 1);
    assert!(second.header("via").unwrap().contains("lacquer"));
}

#[tokio::test]
async fn expiry_then_refetch() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/short?cc=max-age%3D1";
    let first = get(&lacquer.url(path), &[]).await;
    assert!(get(&lacquer.url(path), &[]).await.is_hit());
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let refetched = get(&lacquer.url(path), &[]).await;
    assert_eq!(
        origin.hits_for(path),
        2,
        "expired object must be fetched again"
    );
    assert_ne!(refetched.body, first.body);
    assert_eq!(refetched.cache_fwd().as_deref(), Some("stale"));
    assert!(
        get(&lacquer.url(path), &[]).await.is_hit(),
        "refetched copy is stored again"
    );
}

#[tokio::test]
async fn upstream_age_is_added() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/aged?cc=max-age%3D100&age=30";
    get(&lacquer.url(path), &[]).await;
    let hit = get(&lacquer.url(path), &[]).await;
    assert!(hit.is_hit());
    let age = hit.age().unwrap();
    assert!((30..=32).contains(&age), "age {age}");
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((67..=70).contains(&ttl), "ttl {ttl}");
}

#[tokio::test]
async fn uncacheable_responses_are_not_served_from_cache() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    for (path, detail) in [
        ("/ns?cc=max-age%3D60%2C%20no-store", "detail=no-store"),
        ("/pv?cc=private%2C%20max-age%3D60", "detail=private"),
        ("/none", "no-freshness"),
        ("/cookie?cc=max-age%3D60&cookie=1", "set-cookie"),
        ("/varystar?cc=max-age%3D60&vary=*", "vary-star"),
    ] {
        let a = get(&lacquer.url(path), &[]).await;
        let b = get(&lacquer.url(path), &[]).await;
        assert_ne!(a.body, b.body, "{path} was served from cache");
        assert_eq!(origin.hits_for(path), 2, "{path}");
        assert!(!b.is_hit());
        let status = b.cache_status().unwrap();
        assert!(
            status.contains("fwd=uri-miss") && status.contains(detail),
            "{path}: {status}"
        );
        assert!(!status.contains("stored"), "{path}: {status}");
    }
}

#[tokio::test]
async fn authorization_requires_explicit_permission() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let auth = [("authorization", "Basic dTpw")];
    let plain = "/auth?cc=max-age%3D60";
    get(&lacquer.url(plain), &auth).await;
    get(&lacquer.url(plain), &auth).await;
    assert_eq!(
        origin.hits_for(plain),
        2,
        "Authorization + max-age must not be stored"
    );

    let public = "/auth?cc=public%2C%20max-age%3D60";
    get(&lacquer.url(public), &auth).await;
    let hit = get(&lacquer.url(public), &auth).await;
    assert!(hit.is_hit());
    assert_eq!(origin.hits_for(public), 1);
}

#[tokio::test]
async fn heuristic_freshness_from_last_modified() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // modified 10,000 s ago: 10 % gives ~1,000 s of freshness
    let path = "/lm?lm=-10000";
    get(&lacquer.url(path), &[]).await;
    let hit = get(&lacquer.url(path), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((990..=1000).contains(&ttl), "ttl {ttl}");
    assert_eq!(origin.hits_for(path), 1);

    // heuristics only for heuristically cacheable statuses: a 302 is not stored
    let redirect = "/lm302?lm=-10000&status=302";
    get(&lacquer.url(redirect), &[]).await;
    get(&lacquer.url(redirect), &[]).await;
    assert_eq!(origin.hits_for(redirect), 2);
}

#[tokio::test]
async fn head_is_answered_from_a_stored_get() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/h?cc=max-age%3D60";
    let full = get(&lacquer.url(path), &[]).await;
    let head = head(&lacquer.url(path), &[]).await;
    assert!(head.is_hit());
    assert!(head.body.is_empty());
    assert_eq!(head.content_length(), Some(full.body.len() as u64));
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn vary_keeps_each_variant() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/v?cc=max-age%3D60&vary=Accept-Language";
    let en = get(&lacquer.url(path), &[("accept-language", "en")]).await;
    let fr = get(&lacquer.url(path), &[("accept-language", "fr")]).await;
    assert_ne!(en.body, fr.body);
    assert_eq!(fr.cache_fwd().as_deref(), Some("vary-miss"));
    let en2 = get(&lacquer.url(path), &[("accept-language", " en ")]).await;
    let fr2 = get(&lacquer.url(path), &[("accept-language", "fr")]).await;
    assert!(en2.is_hit() && fr2.is_hit());
    assert_eq!(en2.body, en.body);
    assert_eq!(fr2.body, fr.body);
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn unsafe_methods_pass_through() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let resp = post(&lacquer.url("/form?cc=max-age%3D60"), &[], "a=1").await;
    assert_eq!(
        resp.cache_status().unwrap(),
        "lacquer; fwd=method; fwd-status=200"
    );
    let recorded = origin.last_request().unwrap();
    assert_eq!(recorded.method, "POST");
    assert_eq!(&recorded.body[..], b"a=1");
}

#[tokio::test]
async fn forwarding_and_hop_by_hop_headers() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // the origin nominates X-Internal in Connection, and sends it: a field for the proxy alone
    let path = "/hdr?cc=max-age%3D60&hdr=Connection:x-internal&hdr=X-Internal:1";
    let direct = get(&origin.url(path), &[]).await;
    assert_eq!(direct.header("x-internal").as_deref(), Some("1"));
    let resp = get(
        &lacquer.url(path),
        &[
            ("connection", "keep-alive, x-client-secret"),
            ("x-client-secret", "1"),
        ],
    )
    .await;
    let seen = origin.last_request().unwrap();
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert!(seen.header("via").unwrap().contains("1.1 lacquer"));
    assert!(
        seen.header("x-client-secret").is_none(),
        "Connection-nominated request field forwarded"
    );
    assert!(!resp.has_header("x-internal"));
    let hit = get(&lacquer.url(path), &[]).await;
    assert!(hit.is_hit());
    assert!(
        !hit.has_header("x-internal"),
        "a Connection-nominated field was stored"
    );
    assert!(
        !hit.has_header("connection")
            || hit
                .header("connection")
                .unwrap()
                .eq_ignore_ascii_case("keep-alive")
    );
}

#[tokio::test]
async fn purge_removes_one_object() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/p?cc=max-age%3D60";
    get(&lacquer.url(path), &[]).await;
    assert!(get(&lacquer.url(path), &[]).await.is_hit());
    let purged = request("PURGE", &lacquer.url(path), &[], None).await;
    assert_eq!(purged.status, 200);
    let after = get(&lacquer.url(path), &[]).await;
    assert!(!after.is_hit());
    assert_eq!(origin.hits_for(path), 2);
    let again = request("PURGE", &lacquer.url("/never-stored"), &[], None).await;
    assert_eq!(again.status, 404);
}

#[tokio::test]
async fn fast_and_standard_hit_paths_agree() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/agree?cc=max-age%3D60&etag=%22v1%22&ct=text/plain";
    get(&lacquer.url(path), &[]).await;
    // plain GET: the fast path; with a non-matching validator: Pingora's cache state machine
    let fast = get(&lacquer.url(path), &[]).await;
    let standard = get(&lacquer.url(path), &[("if-none-match", "\"other\"")]).await;
    assert!(fast.is_hit() && standard.is_hit());
    assert_eq!(fast.status, 200);
    assert_eq!(standard.status, 200);
    assert_eq!(fast.body, standard.body);
    for name in [
        "etag",
        "cache-control",
        "content-length",
        "content-type",
        "x-origin-count",
        "via",
    ] {
        assert!(fast.has_header(name), "{name} missing on the fast path");
        assert_eq!(fast.header(name), standard.header(name), "{name}");
    }
    assert!(fast.age().is_some() && standard.age().is_some());
    // the standard path still answers what the fast path declines
    let not_modified = get(&lacquer.url(path), &[("if-none-match", "\"v1\"")]).await;
    assert_eq!(not_modified.status, 304);
    let range = get(&lacquer.url(path), &[("range", "bytes=0-3")]).await;
    assert_eq!(range.status, 206);
    assert_eq!(&range.body[..], &fast.body[..4]);
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn configured_default_ttl_and_prefix_overrides() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache]\ndefault_ttl = \"30s\"\n[[cache.ttl_overrides]]\nprefix = \"/static/\"\nttl = \"1h\"",
    );
    // no freshness information: stored for default_ttl
    let plain = "/plain";
    get(&lacquer.url(plain), &[]).await;
    let hit = get(&lacquer.url(plain), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((25..=30).contains(&ttl), "ttl {ttl}");

    // the prefix override replaces the origin's max-age
    let asset = "/static/app.js?cc=max-age%3D5";
    get(&lacquer.url(asset), &[]).await;
    let hit = get(&lacquer.url(asset), &[]).await;
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((3590..=3600).contains(&ttl), "ttl {ttl}");

    // overrides never make no-store storable
    let secret = "/static/secret?cc=no-store";
    get(&lacquer.url(secret), &[]).await;
    get(&lacquer.url(secret), &[]).await;
    assert_eq!(origin.hits_for(secret), 2);
}

#[tokio::test]
async fn targeted_cache_control_fields_take_precedence() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // ours beats Cache-Control, and is not passed on to the client
    let ours = "/t1?cc=no-store&hdr=Lacquer-Cache-Control:max-age%3D60";
    get(&lacquer.url(ours), &[]).await;
    let hit = get(&lacquer.url(ours), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(
        hit.header("cache-control").as_deref(),
        Some("no-store"),
        "browsers keep their policy"
    );
    assert!(!hit.has_header("lacquer-cache-control"));

    // CDN-Cache-Control: no-store beats Cache-Control: max-age
    let cdn = "/t2?cc=max-age%3D60&hdr=CDN-Cache-Control:no-store";
    get(&lacquer.url(cdn), &[]).await;
    let again = get(&lacquer.url(cdn), &[]).await;
    assert!(!again.is_hit());
    // CDN-Cache-Control targets every CDN on the path: passed on (issue 17 item 4)
    assert_eq!(
        again.header("cdn-cache-control").as_deref(),
        Some("no-store")
    );
    assert_eq!(origin.hits_for(cdn), 2);

    // a targeted field replaces Expires as well: no max-age there means no freshness
    let expires = "/t3?expires=3600&hdr=Lacquer-Cache-Control:public";
    get(&lacquer.url(expires), &[]).await;
    get(&lacquer.url(expires), &[]).await;
    assert_eq!(origin.hits_for(expires), 2);
}

/// A URL answered `no-store` a few times is fetched from the origin each time, and its first
/// storable answer is stored and served as a hit: nothing about the earlier answers keeps the
/// page out of the cache.
#[tokio::test]
async fn a_url_once_uncacheable_is_stored_when_it_becomes_cacheable() {
    let cacheable = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = cacheable.clone();
    let origin = TestOrigin::start(move |_| {
        let cc = if flag.load(std::sync::atomic::Ordering::SeqCst) {
            "max-age=60"
        } else {
            "no-store"
        };
        OriginResponse::ok("state").header("cache-control", cc)
    });
    let lacquer = proxy(&origin);
    let url = lacquer.url("/api/state");
    for _ in 0..3 {
        let passed = get(&url, &[]).await;
        assert_eq!(passed.status, 200);
        assert!(!passed.is_hit());
    }
    assert_eq!(
        origin.hits(),
        3,
        "every no-store answer comes from the origin"
    );
    cacheable.store(true, std::sync::atomic::Ordering::SeqCst);
    let stored = get(&url, &[]).await;
    assert!(!stored.is_hit());
    assert_eq!(origin.hits(), 4);
    let hit = get(&url, &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert_eq!(&hit.body[..], b"state");
    assert_eq!(origin.hits(), 4, "the storable answer was stored");
}
