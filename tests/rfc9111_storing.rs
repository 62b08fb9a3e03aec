//! RFC 9111 §3 (storing responses) and §5.2.2 (response directives), over real sockets.
//!
//! Which status codes are stored heuristically or only with explicit freshness, and what
//! `no-store`, `private`, `private="field"`, `no-cache`, `must-understand`, `s-maxage` and a
//! request's `Authorization` do. Other storing tests live in `tests/core_caching.rs`
//! (`uncacheable_responses_are_not_served_from_cache`, `authorization_requires_explicit_permission`,
//! `heuristic_freshness_from_last_modified`); `docs/conformance.md` maps them all.

mod support;

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
