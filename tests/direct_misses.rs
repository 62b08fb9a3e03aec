//! Misses forwarded directly (`proxy.direct_misses`, on by default): a plain GET that found
//! nothing in any tier goes over Lacquer's own exchange, holds the URL's cache lock as the
//! standard path's miss does, and stores its answer as it relays it. What the client and the
//! origin see must be what the standard path (`direct_misses = false`) gives; concurrent
//! requests must still make one origin request; a lock must never outlive the request that
//! took it (a client that leaves, an origin that fails); nothing over the size limit, and
//! nothing truncated, is ever stored.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use support::*;

/// A node in front of `origin`, with direct misses on or off; returns it and its admin port.
fn node(origin: std::net::SocketAddr, direct: bool, extra: &str) -> (LacquerProcess, u16) {
    LacquerProcess::start_simple_with_admin(
        origin,
        &format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n{extra}"),
    )
}

#[tokio::test]
async fn a_direct_miss_is_stored_and_answered_as_the_standard_paths_miss() {
    let origins = [scripted_origin(), scripted_origin()];
    let (direct, direct_admin) = node(origins[0].addr(), true, "");
    let (standard, standard_admin) = node(origins[1].addr(), false, "");
    let page = format!("/page?cc={}&hdr=X-Kept:1", q("max-age=60"));
    let chunked = format!("/chunked?cc={}&len=20000", q("max-age=60"));
    let mut answers = Vec::new();
    for (lacquer, origin) in [(&direct, &origins[0]), (&standard, &origins[1])] {
        let mut here = Vec::new();
        for path in [&page, &chunked] {
            let first = get(&lacquer.url(path), &[]).await;
            assert_eq!(first.status, 200);
            assert!(first.is_stored(), "{:?}", first.cache_status());
            let again = get(&lacquer.url(path), &[]).await;
            assert!(again.is_hit(), "{:?}", again.cache_status());
            assert_eq!(again.body, first.body, "the stored body is the relayed one");
            here.push(first.seen_except(&["date"]));
        }
        assert_eq!(origin.hits(), 2, "one origin request per URL");
        answers.push(here);
    }
    assert_eq!(answers[0], answers[1]);
    // what the origin was asked: the same request (the coding the cache wants, the forwarding
    // fields), whichever path asked
    let asked = |origin: &TestOrigin| {
        // the node's own address differs
        origin.requests_for(&page)[0].sorted_fields_except(&["host", "x-forwarded-host"])
    };
    assert_eq!(asked(&origins[0]), asked(&origins[1]));
    let series = "lacquer_direct_misses_total";
    assert_eq!(value_when(direct_admin, series, 2.0).await, 2.0);
    assert_eq!(value_when(standard_admin, series, 0.0).await, 0.0);
}

#[tokio::test]
async fn concurrent_misses_of_one_url_make_one_origin_request() {
    let origin = scripted_origin();
    let (lacquer, admin) = node(origin.addr(), true, "");
    let path = format!("/slow?cc={}&sleep=400&len=30000", q("max-age=60"));
    let url = lacquer.url(&path);
    let requests: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url, &[]).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for request in requests {
        let resp = request.await.unwrap();
        assert_eq!(resp.status, 200);
        bodies.push(resp.body);
    }
    assert!(bodies.iter().all(|b| b.len() == 30000 && *b == bodies[0]));
    assert_eq!(
        origin.hits_for(&path),
        1,
        "the others waited for the first one's fill"
    );
    // the first went direct; the others found its lock taken and waited in the standard path
    assert_eq!(
        value_when(admin, "lacquer_direct_misses_total", 1.0).await,
        1.0
    );
}

#[tokio::test]
async fn variants_stored_by_a_direct_miss_are_kept_apart() {
    let origin = TestOrigin::start(|req| {
        let lang = req.header("accept-language").unwrap_or("none").to_string();
        OriginResponse::ok(format!("page in {lang}"))
            .header("Cache-Control", "max-age=60")
            .header("Vary", "Accept-Language")
    });
    let (lacquer, _admin) = node(origin.addr(), true, "");
    let url = lacquer.url("/greeting");
    for _ in 0..2 {
        for lang in ["en", "fr", "de"] {
            let resp = get(&url, &[("accept-language", lang)]).await;
            assert_eq!(resp.text(), format!("page in {lang}"));
        }
    }
    assert_eq!(origin.hits(), 3, "one origin request per variant");
    let resp = get(&url, &[("accept-language", "en")]).await;
    assert!(resp.is_hit(), "{:?}", resp.cache_status());
}

#[tokio::test]
async fn an_answer_over_the_size_limit_is_relayed_whole_and_never_stored() {
    let origin = TestOrigin::start(|req| {
        let body = "y".repeat(40_000);
        // one announced by its length, one chunked (known too large only once relayed)
        let resp = if req.path == "/sized" {
            OriginResponse::ok(body)
        } else {
            OriginResponse::chunked([body[..20_000].to_string(), body[20_000..].to_string()])
        };
        resp.header("Cache-Control", "max-age=60")
    });
    let (lacquer, _admin) = node(
        origin.addr(),
        true,
        "[cache]\nmax_object_size = \"10KiB\"\n",
    );
    for path in ["/sized", "/streamed"] {
        for round in 1..=2 {
            let resp = get(&lacquer.url(path), &[]).await;
            assert_eq!(resp.status, 200);
            assert_eq!(resp.body.len(), 40_000, "{path}: relayed whole");
            assert!(!resp.is_hit(), "{path}: never stored");
            assert_eq!(origin.hits_for(path), round, "{path}: asked every time");
        }
    }
}

/// A client that leaves while the origin prepares a direct miss's answer: the lock goes with
/// it, and a request waiting on that lock fetches the page itself and stores it.
#[tokio::test]
async fn a_client_leaving_a_direct_miss_frees_the_lock_for_the_next() {
    let origin = scripted_origin();
    let (lacquer, _admin) = node(origin.addr(), true, "");
    let path = format!("/left?cc={}&sleep=600", q("max-age=60"));
    let mut leaver = TcpStream::connect(lacquer.addr()).unwrap();
    write!(leaver, "GET {path} HTTP/1.1\r\nHost: shop.example\r\n\r\n").unwrap();
    // the origin has the request (and sleeps on it) before the next client comes
    for _ in 0..100 {
        if origin.heads_for(&path) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(origin.heads_for(&path), 1);
    let waiter = {
        let url = lacquer.url(&path);
        tokio::spawn(async move { get(&url, &[("host", "shop.example")]).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(leaver);
    let resp = waiter.await.unwrap();
    assert_eq!(resp.status, 200);
    assert!(resp.text().starts_with("/left?"), "{}", resp.text());
    let again = get(&lacquer.url(&path), &[("host", "shop.example")]).await;
    assert!(again.is_hit(), "{:?}", again.cache_status());
    assert_eq!(again.body, resp.body);
}

/// An origin that closes in the middle of a direct miss's body: the client sees a truncated
/// answer on a closed connection, nothing is stored, and the next request gets the page whole.
#[tokio::test]
async fn an_origin_failing_mid_body_stores_nothing_and_frees_the_lock() {
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    let origin = TestOrigin::start(move |_| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let body = if n == 0 {
            Body::Truncated {
                declared_len: 50_000,
                data: "x".repeat(10_000).into(),
            }
        } else {
            Body::from("x".repeat(50_000))
        };
        OriginResponse::ok(body).header("Cache-Control", "max-age=60")
    });
    let (lacquer, _admin) = node(origin.addr(), true, "");
    let mut client = TcpStream::connect(lacquer.addr()).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(client, "GET /cut HTTP/1.1\r\nHost: shop.example\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let _ = client.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:.200}");
    assert!(got.len() < 50_000, "the truncated answer never looks whole");
    let resp = get(&lacquer.url("/cut"), &[("host", "shop.example")]).await;
    assert_eq!(resp.body.len(), 50_000);
    assert!(!resp.is_hit(), "the truncated fill was not stored");
    let again = get(&lacquer.url("/cut"), &[("host", "shop.example")]).await;
    assert!(again.is_hit(), "{:?}", again.cache_status());
    assert_eq!(again.body.len(), 50_000);
    assert_eq!(origin.hits(), 2);
}
