//! `Cache-Status` (RFC 9211) and targeted cache-control fields (RFC 9213), over real sockets.
//!
//! Each `fwd` reason is provoked by the situation it names and asserted on the exact field value;
//! targeted fields (`Lacquer-Cache-Control`, then `CDN-Cache-Control`) govern this cache before
//! `Cache-Control`; ours is not forwarded unless configured, `CDN-Cache-Control` is (more in
//! `tests/rfc9213_targeted_fields.rs`). More in `tests/core_caching.rs`
//! (`miss_then_hit_with_age`, `targeted_cache_control_fields_take_precedence`).

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("[log]\naccess = \"off\"\n{extra}"))
}

#[tokio::test]
async fn every_forward_reason_is_reported() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = format!(
        "/cs?cc={}&vary=X-Client&etag={}",
        q("max-age=1"),
        q("\"v1\"")
    );

    let miss = get(&lacquer.url(&path), &[("x-client", "a")]).await;
    assert_eq!(
        miss.cache_status().unwrap(),
        "lacquer; fwd=uri-miss; fwd-status=200; stored"
    );
    let vary_miss = get(&lacquer.url(&path), &[("x-client", "b")]).await;
    assert_eq!(
        vary_miss.cache_status().unwrap(),
        "lacquer; fwd=vary-miss; fwd-status=200; stored"
    );
    let hit = get(&lacquer.url(&path), &[("x-client", "a")]).await;
    // the ttl is the origin's max-age=1 less the hit's Age, not whatever the field says
    assert_ttl_is_lifetime_minus_age(&hit, 1);
    let ttl = hit.cache_ttl().unwrap();
    assert_eq!(
        hit.cache_status().unwrap(),
        format!("lacquer; hit; ttl={ttl}")
    );

    tokio::time::sleep(Duration::from_millis(2100)).await;
    let stale = get(&lacquer.url(&path), &[("x-client", "a")]).await;
    assert_eq!(
        stale.cache_status().unwrap(),
        "lacquer; fwd=stale; fwd-status=200; stored"
    );
    let request = get(
        &lacquer.url(&path),
        &[("x-client", "a"), ("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(
        request.cache_fwd().as_deref(),
        Some("request"),
        "{:?}",
        request.cache_status()
    );

    let method = post(&lacquer.url("/cs-post"), &[], "x").await;
    assert_eq!(
        method.cache_status().unwrap(),
        "lacquer; fwd=method; fwd-status=200"
    );
    let not_stored = get(&lacquer.url("/cs-none"), &[]).await;
    assert_eq!(
        not_stored.cache_status().unwrap(),
        "lacquer; fwd=uri-miss; fwd-status=200; detail=no-freshness"
    );
}

/// A stale response served because the origin failed is `fwd=stale` with the origin's status and
/// the failure in `detail` (RFC 9211 §2.2, §2.3, §2.8), not `fwd=bypass`; `ttl` is negative.
#[tokio::test]
async fn stale_served_on_an_origin_failure_is_labelled_stale_with_the_reason() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let failed_status = format!(
        "/cs-sie?cc={}&fail_after=1",
        q("max-age=1, stale-if-error=600")
    );
    let closed = format!("/cs-grace?cc={}&close_after=1", q("max-age=1"));
    for path in [&failed_status, &closed] {
        let first = get(&lacquer.url(path), &[]).await;
        assert!(first.is_stored(), "{:?}", first.cache_status());
    }
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let stale = get(&lacquer.url(&failed_status), &[]).await;
    assert_eq!(stale.status, 200);
    let ttl = stale.cache_ttl().expect("a ttl");
    assert!(ttl < 0, "ttl {ttl}");
    assert_eq!(
        stale.cache_status().unwrap(),
        format!("lacquer; fwd=stale; fwd-status=503; ttl={ttl}; detail=origin-503")
    );
    let stale = get(&lacquer.url(&closed), &[]).await;
    assert_eq!(stale.status, 200);
    let ttl = stale.cache_ttl().expect("a ttl");
    assert_eq!(
        stale.cache_status().unwrap(),
        format!("lacquer; fwd=stale; ttl={ttl}; detail=origin-closed")
    );
}

#[tokio::test]
async fn a_disabled_cache_reports_bypass() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "[cache]\nenabled = false");
    let path = format!("/off?cc={}", q("max-age=600"));
    get(&lacquer.url(&path), &[]).await;
    let resp = get(&lacquer.url(&path), &[]).await;
    assert_eq!(
        resp.cache_status().unwrap(),
        "lacquer; fwd=bypass; fwd-status=200"
    );
    assert_eq!(origin.hits_for(&path), 2);
}

#[tokio::test]
async fn our_targeted_field_beats_cdn_cache_control_beats_cache_control() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    // Lacquer-Cache-Control: max-age=600 beats CDN-Cache-Control: no-store
    let ours = format!(
        "/tf1?cc=no-store&hdr={}&hdr={}",
        q("Lacquer-Cache-Control:max-age=600"),
        q("CDN-Cache-Control:no-store")
    );
    get(&lacquer.url(&ours), &[]).await;
    let hit = get(&lacquer.url(&ours), &[]).await;
    assert!(hit.is_hit(), "{:?}", hit.cache_status());
    assert!(!hit.has_header("lacquer-cache-control"));
    // CDN-Cache-Control targets every CDN on the path: passed on (issue 17)
    assert_eq!(hit.header("cdn-cache-control").as_deref(), Some("no-store"));
    assert_eq!(hit.header("cache-control").as_deref(), Some("no-store"));

    // CDN-Cache-Control: s-maxage / max-age give the lifetime, not Cache-Control's
    let cdn = format!(
        "/tf2?cc={}&hdr={}",
        q("max-age=5"),
        q("CDN-Cache-Control:max-age=600")
    );
    get(&lacquer.url(&cdn), &[]).await;
    let hit = get(&lacquer.url(&cdn), &[]).await;
    let ttl: i64 = hit.cache_status_param("ttl").unwrap().parse().unwrap();
    assert!((590..=600).contains(&ttl), "ttl {ttl}");

    // an invalid max-age in the targeted field means stale there too
    let invalid = format!(
        "/tf3?cc={}&hdr={}",
        q("max-age=600"),
        q("CDN-Cache-Control:max-age=\"600\"")
    );
    get(&lacquer.url(&invalid), &[]).await;
    get(&lacquer.url(&invalid), &[]).await;
    assert_eq!(origin.hits_for(&invalid), 2);
}

#[tokio::test]
async fn targeted_fields_are_forwarded_when_configured() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "[cache]\nforward_targeted_fields = true");
    let path = format!("/tf-fwd?hdr={}", q("CDN-Cache-Control:max-age=600"));
    get(&lacquer.url(&path), &[]).await;
    let hit = get(&lacquer.url(&path), &[]).await;
    assert!(hit.is_hit());
    assert_eq!(
        hit.header("cdn-cache-control").as_deref(),
        Some("max-age=600")
    );
}
