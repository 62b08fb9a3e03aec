//! Interim responses (RFC 9110 §15.2) over real sockets: `102 Processing` and `103 Early Hints`
//! from the origin reach an HTTP/1.1 client before the final response, on a miss that stores it
//! as on a pass; the final response is stored as usual, and nothing of the interim responses is
//! in it. On h2, Pingora drops interim responses (see `src/proxy/interim.rs`): the final
//! response still arrives whole and is stored.

use lacquer_test_support as support;

use support::*;

const HINT: &str = "</style.css>; rel=preload; as=style";

/// An origin that answers every request with `102 Processing`, then `103 Early Hints` (a `Link`),
/// then `200` with the `Cache-Control` in the query's `cc` and a body naming the request count,
/// all written at once (so the proxy reads them in one batch, the case a cache miss used to
/// lose the hints in).
fn hinting_origin() -> TestOrigin {
    let count = std::sync::atomic::AtomicUsize::new(0);
    TestOrigin::start(move |req| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let cc = query_param(req, "cc").unwrap_or_else(|| "max-age=60".into());
        OriginResponse::ok(format!("page #{n}"))
            .interim(102, &[])
            .interim(103, &[("Link", HINT), ("X-Hint-Only", "1")])
            .header("Cache-Control", cc)
            .header("Content-Type", "text/html")
    })
}

fn proxy(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

/// Every response the proxy sent for one `GET path` on a fresh connection, interim ones first.
fn responses(lacquer: &LacquerProcess, path: &str) -> Vec<RawResponse> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    let data = raw_request(lacquer.addr(), request.as_bytes());
    parse_responses_with_interim(&data, false)
}

/// Asserts the hints came first, as the origin sent them, with our `Via` and no `Cache-Status`.
fn assert_interim_first(all: &[RawResponse]) {
    let statuses: Vec<u16> = all.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [102, 103, 200],
        "interim responses, then the final one"
    );
    let hints = &all[1];
    assert_eq!(hints.header("link"), Some(HINT));
    assert_eq!(hints.header("x-hint-only"), Some("1"));
    assert!(hints.header("via").is_some_and(|v| v.contains("lacquer")));
    assert_eq!(
        hints.header("cache-status"),
        None,
        "Cache-Status is the final's"
    );
    assert!(hints.body.is_empty());
}

/// Asserts a final response carries none of the interim responses' fields.
fn assert_no_hint_fields(resp: &RawResponse) {
    assert_eq!(resp.header("link"), None, "{:?}", resp.headers);
    assert_eq!(resp.header("x-hint-only"), None, "{:?}", resp.headers);
}

#[tokio::test]
async fn early_hints_reach_the_client_before_a_final_response_that_is_stored_without_them() {
    let origin = hinting_origin();
    let lacquer = proxy(&origin);
    let path = "/page";
    let miss = responses(&lacquer, path);
    assert_interim_first(&miss);
    let stored = &miss[2];
    assert_eq!(stored.text(), "page #1");
    assert!(
        stored
            .header("cache-status")
            .is_some_and(|s| s.contains("stored")),
        "{:?}",
        stored.header("cache-status")
    );
    assert_no_hint_fields(stored);

    // the hit is the stored final response: no interim responses, none of their fields
    let hit = responses(&lacquer, path);
    assert_eq!(
        hit.len(),
        1,
        "{:?}",
        hit.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert_eq!(hit[0].status, 200);
    assert!(hit[0]
        .header("cache-status")
        .is_some_and(|s| s.contains("hit")));
    assert_eq!(hit[0].text(), "page #1");
    assert_no_hint_fields(&hit[0]);
    // and the standard path's hit (a conditional request declines the fast path) agrees
    let mut conn = RawConn::connect(lacquer.addr());
    let revalidated = conn.get(path, &[("if-none-match", "\"other\"")]);
    assert_eq!(revalidated.status, 200);
    assert_eq!(revalidated.text(), "page #1");
    assert_no_hint_fields(&revalidated);
    assert_eq!(origin.hits(), 1);
}

#[tokio::test]
async fn interim_responses_pass_when_the_response_is_not_stored() {
    let origin = hinting_origin();
    let lacquer = proxy(&origin);
    for n in 1..=2 {
        let all = responses(&lacquer, &format!("/private?cc={}", q("no-store")));
        assert_interim_first(&all);
        assert_eq!(all[2].text(), format!("page #{n}"));
        assert_no_hint_fields(&all[2]);
    }
    assert_eq!(origin.hits(), 2);
}

#[tokio::test]
async fn h2_clients_get_the_final_response_and_it_is_stored() {
    let origin = hinting_origin();
    let lacquer = proxy(&origin);
    let client = h2c_client();
    let url = lacquer.url("/h2");
    let miss = send(&client, "GET", &url, &[], None).await.unwrap();
    assert_eq!(miss.version, http::Version::HTTP_2);
    assert_eq!(miss.status, 200);
    assert_eq!(miss.text(), "page #1");
    assert!(miss.is_stored(), "{:?}", miss.cache_status());
    assert!(!miss.has_header("link"));
    let hit = send(&client, "GET", &url, &[], None).await.unwrap();
    assert!(hit.is_hit());
    assert_eq!(hit.text(), "page #1");
    assert!(!hit.has_header("link"));
    assert_eq!(origin.hits(), 1);
}
