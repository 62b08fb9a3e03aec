//! Invalidation: unsafe methods (RFC 9111 §4.4) and PURGE remove every variant of a URL.

use lacquer_test_support as support;

use support::*;

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

async fn warm_variants(lacquer: &LacquerProcess, path: &str) {
    for lang in ["en", "fr"] {
        get(&lacquer.url(path), &[("accept-language", lang)]).await;
        let hit = get(&lacquer.url(path), &[("accept-language", lang)]).await;
        assert!(hit.is_hit(), "{lang} variant should be stored");
    }
}

#[tokio::test]
async fn successful_unsafe_request_invalidates_every_variant_of_the_uri() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/doc?cc=max-age%3D600&vary=Accept-Language";
    warm_variants(&lacquer, path).await;
    assert_eq!(origin.hits_for(path), 2);

    let posted = post(&lacquer.url(path), &[], "edit").await;
    assert_eq!(posted.status, 200);
    for lang in ["en", "fr"] {
        let after = get(&lacquer.url(path), &[("accept-language", lang)]).await;
        assert!(!after.is_hit(), "{lang} variant survived the POST");
    }
    assert_eq!(origin.hits_for(path), 2 + 1 + 2);
}

#[tokio::test]
async fn failed_unsafe_request_does_not_invalidate() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    // GET answers 200 and is stored; a POST to the very same URI gets 500
    let stays = "/stays?cc=max-age%3D600&unsafe_status=500";
    get(&lacquer.url(stays), &[]).await;
    assert!(get(&lacquer.url(stays), &[]).await.is_hit());
    let failed = post(&lacquer.url(stays), &[], "x").await;
    assert_eq!(failed.status, 500);
    assert!(
        get(&lacquer.url(stays), &[]).await.is_hit(),
        "an error response must not invalidate"
    );
    // the same URI with a successful POST is invalidated (control)
    let goes = "/goes?cc=max-age%3D600";
    get(&lacquer.url(goes), &[]).await;
    assert!(get(&lacquer.url(goes), &[]).await.is_hit());
    assert_eq!(post(&lacquer.url(goes), &[], "x").await.status, 200);
    assert!(!get(&lacquer.url(goes), &[]).await.is_hit());
}

#[tokio::test]
async fn location_and_content_location_on_the_same_host_are_invalidated() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let target = "/article?cc=max-age%3D600";
    let described = "/described?cc=max-age%3D600";
    let other_host = "/elsewhere?cc=max-age%3D600";
    for path in [target, described, other_host] {
        let stored = get(&lacquer.url(path), &[]).await;
        assert!(stored.is_stored(), "{path}: {:?}", stored.cache_status());
    }

    // Location as a path on this host
    let location = format!("/form?status=303&hdr=Location:{}", q(target));
    let resp = post(&lacquer.url(&location), &[], "x").await;
    assert_eq!(resp.status, 303);
    assert!(
        !get(&lacquer.url(target), &[]).await.is_hit(),
        "Location target survived"
    );

    // Content-Location as an absolute URI naming this host
    let same_host = format!(
        "/form2?hdr=Content-Location:{}",
        q(&format!("http://{}{described}", lacquer.addr()))
    );
    assert_eq!(post(&lacquer.url(&same_host), &[], "x").await.status, 200);
    assert!(
        !get(&lacquer.url(described), &[]).await.is_hit(),
        "Content-Location target survived"
    );

    // the same on another host
    let foreign = format!(
        "/form3?hdr=Content-Location:{}",
        q(&format!("http://other.example{other_host}"))
    );
    assert_eq!(post(&lacquer.url(&foreign), &[], "x").await.status, 200);
    assert!(
        get(&lacquer.url(other_host), &[]).await.is_hit(),
        "another host's URI must not be touched"
    );
}

#[tokio::test]
async fn purge_removes_every_variant() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/pv?cc=max-age%3D600&vary=Accept-Language";
    warm_variants(&lacquer, path).await;
    let purged = request("PURGE", &lacquer.url(path), &[], None).await;
    assert_eq!(purged.status, 200);
    for lang in ["en", "fr"] {
        assert!(
            !get(&lacquer.url(path), &[("accept-language", lang)])
                .await
                .is_hit(),
            "{lang}"
        );
    }
}

/// `shop.example.` (a fully qualified name) is the host `shop.example`: one page, one key. Were
/// they two, a purge of `shop.example` would leave the copy stored through the dotted name, and a
/// client asking for that name would still be served what was purged.
#[tokio::test]
async fn a_final_dot_in_the_host_neither_splits_a_page_nor_escapes_its_purge() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let path = "/fqdn?cc=max-age%3D600";
    let url = lacquer.url(path);
    let dotted = get(&url, &[("host", "shop.example.")]).await;
    assert_eq!(dotted.status, 200);
    for host in ["shop.example", "SHOP.example.", "shop.example.:"] {
        assert!(get(&url, &[("host", host)]).await.is_hit(), "{host}");
    }
    assert_eq!(origin.hits_for(path), 1);

    let purged = request("PURGE", &url, &[("host", "shop.example")], None).await;
    assert_eq!(purged.status, 200);
    let after = get(&url, &[("host", "shop.example.")]).await;
    assert!(!after.is_hit(), "the dotted name escaped the purge");
    assert_eq!(origin.hits_for(path), 2);
}

#[tokio::test]
async fn purge_is_refused_from_addresses_not_in_purge_from() {
    let origin = scripted_origin();
    // this test's client connects from 127.0.0.1, outside the configured range
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache]\npurge_from = [\"10.0.0.0/8\", \"fd00::/8\"]",
    );
    let path = "/acl?cc=max-age%3D600";
    get(&lacquer.url(path), &[]).await;
    assert!(get(&lacquer.url(path), &[]).await.is_hit());
    let refused = request("PURGE", &lacquer.url(path), &[], None).await;
    assert_eq!(refused.status, 405);
    assert!(
        get(&lacquer.url(path), &[]).await.is_hit(),
        "a refused purge must leave the object"
    );
    assert_eq!(origin.hits_for(path), 1);

    // the default list is loopback only, which this client is
    let default = proxy(&origin);
    let path = "/acl-default?cc=max-age%3D600";
    get(&default.url(path), &[]).await;
    assert_eq!(
        request("PURGE", &default.url(path), &[], None).await.status,
        200
    );
    assert!(!get(&default.url(path), &[]).await.is_hit());
}

/// A client that asks for a page again as soon as its POST or PURGE of it is answered gets a
/// refill that is stored. Purges are stamped in whole milliseconds, rounded up, and cover what
/// was fetched before their stamp: a refill sent in the same millisecond as the purge counted as
/// fetched before it, was refused (stored nowhere), and the next request fetched once more. The
/// answer to an invalidation of something stored is now held until the clock has passed its
/// stamp (`invalidation::past_the_stamp`). Forty rounds of each, as a round loses that race only
/// some of the time.
#[tokio::test]
async fn a_refill_asked_for_as_soon_as_its_invalidation_is_answered_is_stored() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin);
    let mut refused = Vec::new();
    for round in 0..40 {
        for how in ["POST", "PURGE"] {
            let path = format!("/refill-{how}-{round}?cc=max-age%3D600");
            let url = lacquer.url(&path);
            get(&url, &[]).await;
            assert!(get(&url, &[]).await.is_hit(), "{path}: not stored");
            let invalidated = match how {
                "POST" => post(&url, &[], "edit").await,
                _ => request("PURGE", &url, &[], None).await,
            };
            assert_eq!(invalidated.status, 200, "{path}");
            let refill = get(&url, &[]).await;
            assert!(!refill.is_hit(), "{path}: survived the {how}");
            let again = get(&url, &[]).await;
            if !again.is_hit() {
                refused.push(format!("{path}: {:?}", again.cache_status()));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "refills sent right after their invalidation's answer were not stored: {refused:#?}"
    );
}
