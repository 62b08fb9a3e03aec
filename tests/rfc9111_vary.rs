//! Vary (RFC 9111 §4.1): several stored variants per URL, selected by normalized request fields,
//! over real sockets. `Vary: *` never matches (also in `tests/core_caching.rs`); invalidation
//! and purge of every variant are in `tests/invalidation.rs`.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

#[tokio::test]
async fn every_combination_of_several_fields_is_its_own_variant() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/multi?cc={}&vary={}",
        q("max-age=600"),
        q("Accept-Language, X-Client")
    );
    let combos = [("en", "a"), ("en", "b"), ("fr", "a"), ("fr", "b")];
    let mut bodies = Vec::new();
    for (lang, client) in combos {
        let resp = get(
            &lacquer.url(&path),
            &[("accept-language", lang), ("x-client", client)],
        )
        .await;
        assert!(!resp.is_hit());
        bodies.push(resp.body);
    }
    assert_eq!(origin.hits_for(&path), 4);
    for ((lang, client), body) in combos.iter().zip(&bodies) {
        // header names in Vary are case-insensitive, request names too
        let resp = get(
            &lacquer.url(&path),
            &[("Accept-Language", lang), ("X-CLIENT", client)],
        )
        .await;
        assert!(resp.is_hit(), "{lang}/{client}: {:?}", resp.cache_status());
        assert_eq!(&resp.body, body, "{lang}/{client}: wrong variant");
    }
    assert_eq!(origin.hits_for(&path), 4);
}

#[tokio::test]
async fn an_absent_field_is_a_variant_of_its_own() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/absent?cc={}&vary=X-Client", q("max-age=600"));
    let without = get(&lacquer.url(&path), &[]).await;
    let with = get(&lacquer.url(&path), &[("x-client", "a")]).await;
    assert_eq!(with.cache_fwd().as_deref(), Some("vary-miss"));
    assert_ne!(with.body, without.body);
    let without_again = get(&lacquer.url(&path), &[]).await;
    assert!(without_again.is_hit());
    assert_eq!(without_again.body, without.body);
    // an empty value is present, so it does not match the request without the field (§4.1)
    let empty = get(&lacquer.url(&path), &[("x-client", "")]).await;
    assert!(!empty.is_hit(), "{:?}", empty.cache_status());
    assert_ne!(empty.body, without.body);
    assert_eq!(origin.hits_for(&path), 3);
}

#[tokio::test]
async fn request_values_are_normalized() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/norm?cc={}&vary=Accept-Language", q("max-age=600"));
    let stored = get(&lacquer.url(&path), &[("accept-language", "en, fr")]).await;
    for spelling in ["en,fr", " en ,  fr ", "en,  fr"] {
        let resp = get(&lacquer.url(&path), &[("accept-language", spelling)]).await;
        assert!(resp.is_hit(), "{spelling:?}: {:?}", resp.cache_status());
        assert_eq!(resp.body, stored.body);
    }
    assert_eq!(origin.hits_for(&path), 1);
}

#[tokio::test]
async fn vary_on_two_field_lines_counts_both() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!(
        "/two-lines?cc={}&hdr={}&hdr={}",
        q("max-age=600"),
        q("Vary:Accept-Language"),
        q("Vary:X-Client")
    );
    get(
        &lacquer.url(&path),
        &[("accept-language", "en"), ("x-client", "a")],
    )
    .await;
    let other_client = get(
        &lacquer.url(&path),
        &[("accept-language", "en"), ("x-client", "b")],
    )
    .await;
    assert!(!other_client.is_hit(), "the second Vary line was ignored");
    let same = get(
        &lacquer.url(&path),
        &[("accept-language", "en"), ("x-client", "a")],
    )
    .await;
    assert!(same.is_hit());
    assert_eq!(origin.hits_for(&path), 2);
}

#[tokio::test]
async fn vary_star_among_other_fields_is_never_stored() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/star?cc={}&vary={}", q("max-age=600"), q("Accept, *"));
    get(&lacquer.url(&path), &[]).await;
    let again = get(&lacquer.url(&path), &[]).await;
    assert!(!again.is_hit());
    assert!(again.cache_status().unwrap().contains("detail=vary-star"));
    assert_eq!(origin.hits_for(&path), 2);
}

/// `Accept-Language` is matched as the preference it states: language ranges in any case,
/// whitespace, `q=1` implied or written, `q=0.50` as `q=0.5`, and any order among entries of
/// equal weight are one variant; a different weighting is another (rule: `docs/conformance.md`).
#[tokio::test]
async fn accept_language_variants_are_matched_as_preferences() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = format!("/al?cc={}&vary={}", q("max-age=600"), q("Accept-Language"));
    let stored = get(
        &lacquer.url(&path),
        &[("accept-language", "en-US, fr;q=0.5")],
    )
    .await;
    assert!(stored.is_stored(), "{:?}", stored.cache_status());
    for same in [
        "EN-us,fr;q=0.5",
        "fr;q=0.50, en-us;q=1.0",
        "en-US ,  FR ; q=0.500",
    ] {
        let resp = get(&lacquer.url(&path), &[("accept-language", same)]).await;
        assert!(resp.is_hit(), "{same}: {:?}", resp.cache_status());
        assert_eq!(resp.body, stored.body, "{same}");
    }
    assert_eq!(origin.hits_for(&path), 1);
    let equal_weights = format!(
        "/al-eq?cc={}&vary={}",
        q("max-age=600"),
        q("Accept-Language")
    );
    get(
        &lacquer.url(&equal_weights),
        &[("accept-language", "de, en")],
    )
    .await;
    let reordered = get(
        &lacquer.url(&equal_weights),
        &[("accept-language", "en, de")],
    )
    .await;
    assert!(reordered.is_hit(), "{:?}", reordered.cache_status());
    // another weighting is another preference, so another variant
    for other in ["en-US, fr;q=0.9", "fr, en-US", "en-US"] {
        let resp = get(&lacquer.url(&path), &[("accept-language", other)]).await;
        assert!(!resp.is_hit(), "{other}: {:?}", resp.cache_status());
    }
    assert_eq!(origin.hits_for(&path), 4);
}
