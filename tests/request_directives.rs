//! Client request directives (RFC 9111 §5.2.1) against a stored response.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("[log]\naccess = \"off\"\n{extra}"))
}

#[tokio::test]
async fn no_cache_and_max_age_make_the_cache_revalidate() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = "/rd?cc=max-age%3D600&etag=%22v1%22";
    get(&lacquer.url(path), &[]).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(get(&lacquer.url(path), &[]).await.is_hit());

    let forced = get(&lacquer.url(path), &[("cache-control", "no-cache")]).await;
    assert_eq!(forced.status, 200);
    assert_eq!(
        forced.cache_fwd().as_deref(),
        Some("request"),
        "{:?}",
        forced.cache_status()
    );
    assert_eq!(origin.hits_for(path), 2);
    let pragma = get(&lacquer.url(path), &[("pragma", "no-cache")]).await;
    assert_eq!(pragma.cache_fwd().as_deref(), Some("request"));

    // the stored copy is now about 0 s old again: max-age=0 forces, max-age=3600 does not
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let young_enough = get(&lacquer.url(path), &[("cache-control", "max-age=3600")]).await;
    assert!(young_enough.is_hit());
    let too_old = get(&lacquer.url(path), &[("cache-control", "max-age=0")]).await;
    assert!(!too_old.is_hit());
    let revalidations = origin
        .requests_for(path)
        .iter()
        .filter(|r| r.header("if-none-match").is_some())
        .count();
    assert!(
        revalidations >= 2,
        "forced requests revalidate with the stored validator"
    );
}

#[tokio::test]
async fn client_no_cache_can_be_ignored_by_config() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "[cache]\nhonor_client_no_cache = false");
    let path = "/ignored?cc=max-age%3D600";
    get(&lacquer.url(path), &[]).await;
    assert!(get(&lacquer.url(path), &[("cache-control", "no-cache")])
        .await
        .is_hit());
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn max_stale_serves_a_stale_copy_unless_the_origin_forbids_it() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let path = "/stale?cc=max-age%3D1";
    get(&lacquer.url(path), &[]).await;
    let strict = "/strict?cc=max-age%3D1%2C%20must-revalidate";
    let stored = get(&lacquer.url(strict), &[]).await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let stale = get(&lacquer.url(path), &[("cache-control", "max-stale=60")]).await;
    assert!(stale.is_hit(), "{:?}", stale.cache_status());
    assert_eq!(origin.hits_for(path), 1);
    get(&lacquer.url(strict), &[("cache-control", "max-stale=60")]).await;
    assert_eq!(
        origin.hits_for(strict),
        2,
        "must-revalidate beats max-stale"
    );
}

#[tokio::test]
async fn only_if_cached_never_reaches_the_origin() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let missing = get(
        &lacquer.url("/never?cc=max-age%3D60"),
        &[("cache-control", "only-if-cached")],
    )
    .await;
    assert_eq!(missing.status, 504);
    assert_eq!(origin.hits(), 0);
    let path = "/there?cc=max-age%3D60";
    get(&lacquer.url(path), &[]).await;
    let stored = get(&lacquer.url(path), &[("cache-control", "only-if-cached")]).await;
    assert_eq!(stored.status, 200);
    assert!(stored.is_hit());
}
