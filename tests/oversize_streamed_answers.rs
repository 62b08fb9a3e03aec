//! Cacheable answers of no announced length (chunked) that turn out larger than
//! `cache.max_object_size` while they stream: nothing is stored, and every client gets the whole
//! body, on the standard path as on the direct one.
//!
//! Before, such an answer on the standard path (any request the fast path hands to Pingora's
//! cache phases: with `Range`, a validator, `Cache-Control: no-cache`, or waiting behind another
//! request's fill) failed when it crossed the limit: a 500, or a body cut short. A fill that the
//! direct path abandoned for its size cut the requests streaming it the same way. Now the fill
//! turns into a relay for the readers it has (`storage::memory::fill`): it holds about
//! `RELAY_WINDOW` per reader, not the body, and the filling request's own client sets the
//! origin's pace (vendored pingora-proxy 0016).

use lacquer_test_support as support;

use bytes::Bytes;
use std::time::Duration;
use support::*;

const HOST: &str = "shop.example";
const LIMIT: usize = 64 * 1024;

/// A node in front of `origin` with `max_object_size` of [`LIMIT`], direct misses on or off.
fn node(origin: std::net::SocketAddr, direct: bool) -> LacquerProcess {
    LacquerProcess::start_simple(
        origin,
        &format!(
            "[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n\
             [server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64KiB\"\n"
        ),
    )
}

/// A cacheable answer sent chunked, `len` bytes in `piece`-byte chunks, the seed taken from
/// the path's last segment.
fn chunked_origin(len: usize, piece: usize) -> TestOrigin {
    TestOrigin::start(move |req: &RecordedRequest| {
        let seed: u8 = req.path_only().rsplit('/').next().unwrap().parse().unwrap();
        OriginResponse::chunked(generated_chunks(len, piece, seed))
            .header("Cache-Control", "max-age=60")
            .header("ETag", "\"v1\"")
    })
}

/// Requests the fast path hands to the standard path, and a plain one (the direct path).
const REQUEST_KINDS: &[(&str, &[(&str, &str)])] = &[
    ("plain", &[]),
    ("range from 0", &[("range", "bytes=0-")]),
    ("range inside", &[("range", "bytes=5-100")]),
    ("validator", &[("if-none-match", "\"other\"")]),
    ("no-cache", &[("cache-control", "no-cache")]),
];

async fn every_request_gets_the_whole_body_and_nothing_is_stored(direct: bool, h2: bool) {
    const LEN: usize = 5 * LIMIT + 123;
    let origin = chunked_origin(LEN, 16 * 1024);
    let lacquer = node(origin.addr(), direct);
    let client = if h2 { h2c_client() } else { http_client() };
    for (seed, (kind, fields)) in REQUEST_KINDS.iter().enumerate() {
        let path = format!("/big/{seed}");
        for round in 0..2 {
            // (an h2 request's authority is the URL's: a `host` field unlike it is refused)
            let mut headers = if h2 { vec![] } else { vec![("host", HOST)] };
            headers.extend_from_slice(fields);
            let resp = send(&client, "GET", &lacquer.url(&path), &headers, None)
                .await
                .unwrap_or_else(|e| panic!("{kind}, direct {direct}, h2 {h2}: {e}"));
            let what = format!("{kind}, round {round}, direct {direct}, h2 {h2}");
            assert_eq!(resp.status, 200, "{what}\n{}", lacquer.stderr_log());
            assert_generated_page(&resp.body, LEN, seed as u8, &what);
        }
        assert_eq!(
            origin.hits_for(&path),
            2,
            "{kind}, direct {direct}: too large to store, so each request went to the origin"
        );
    }
    lacquer.assert_no_panic();
}

#[tokio::test]
async fn an_answer_outgrowing_the_limit_reaches_every_kind_of_request_whole_direct() {
    every_request_gets_the_whole_body_and_nothing_is_stored(true, false).await;
}

#[tokio::test]
async fn an_answer_outgrowing_the_limit_reaches_every_kind_of_request_whole_standard() {
    every_request_gets_the_whole_body_and_nothing_is_stored(false, false).await;
}

#[tokio::test]
async fn an_answer_outgrowing_the_limit_reaches_every_kind_of_request_whole_over_h2() {
    every_request_gets_the_whole_body_and_nothing_is_stored(true, true).await;
    every_request_gets_the_whole_body_and_nothing_is_stored(false, true).await;
}

/// Four clients ask at once for a page the origin starts slowly, then sends far past the limit:
/// one fetches, the others wait for its fill and stream it; when it turns out too large they
/// still get every byte of it (before, they were cut), and the origin was asked once.
async fn clients_streaming_a_fill_that_outgrows_the_limit(direct: bool) {
    const LEN: usize = 40 * LIMIT;
    let origin = TestOrigin::start(|req: &RecordedRequest| {
        let seed: u8 = req.path_only().rsplit('/').next().unwrap().parse().unwrap();
        // the first piece is under the limit, then a pause while the others join the fill,
        // then the rest at once
        let body = Bytes::from(generated_bytes(LEN, seed));
        OriginResponse::new(200)
            .body(Body::Paced {
                chunks: vec![body.slice(..LIMIT / 4), body.slice(LIMIT / 4..)],
                interval: Duration::from_millis(1500),
            })
            .header("Cache-Control", "max-age=60")
    });
    let lacquer = node(origin.addr(), direct);
    let path = "/together/9";
    let urls = std::iter::repeat_n(lacquer.url(path), 4);
    let answers = gets_at_once(urls, &[("host", HOST)]).await;
    for (i, resp) in answers.iter().enumerate() {
        assert_eq!(resp.status, 200, "client {i}, direct {direct}");
        assert_generated_page(&resp.body, LEN, 9, &format!("client {i}, direct {direct}"));
    }
    assert_eq!(
        origin.hits_for(path),
        1,
        "direct {direct}: the others streamed the one fill"
    );
    lacquer.assert_no_panic();
}

#[tokio::test]
async fn clients_streaming_a_fill_that_outgrows_the_limit_get_it_whole_direct() {
    clients_streaming_a_fill_that_outgrows_the_limit(true).await;
}

#[tokio::test]
async fn clients_streaming_a_fill_that_outgrows_the_limit_get_it_whole_standard() {
    clients_streaming_a_fill_that_outgrows_the_limit(false).await;
}

/// A client that asks for a 48 MiB answer on the standard path (it carries a validator) and
/// then reads nothing: the relay waits for it instead of reading the whole body from the origin
/// into memory (the node's memory grows by far less than the body), and when the client reads
/// at last it gets every byte.
#[tokio::test]
async fn a_stalled_client_of_an_oversize_fill_holds_back_the_origin_not_the_whole_body() {
    const LEN: usize = 48 << 20;
    let origin = chunked_origin(LEN, 64 * 1024);
    let lacquer = node(origin.addr(), false);
    // a first answer of the same size, read at once, so what the node's buffers and allocator
    // keep after one such answer is in the baseline
    let warm = get(&lacquer.url("/stall/3"), &[("host", HOST)]).await;
    assert_generated_page(&warm.body, LEN, 3, "warm-up");
    let before = rss_bytes(lacquer.pid()) as usize;
    let mut client =
        StallingClient::get(lacquer.addr(), "/stall/4", "If-None-Match: \"other\"\r\n").await;
    assert!(origin.wait_for_hits_for("/stall/4", 1, Duration::from_secs(10)));
    // the origin writes as fast as it is read; give the node time to read far past its window
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = (rss_bytes(lacquer.pid()) as usize).saturating_sub(before);
    assert!(
        grown < LEN / 4,
        "the node took {grown} bytes more while its client read nothing (body {LEN})"
    );
    let answer = client.answer(false).await;
    assert_eq!(answer.status, 200);
    assert!(answer.complete, "the body ended as its framing says");
    assert_generated_page(&answer.body, LEN, 4, "the stalled client, once it read");
    lacquer.assert_no_panic();
}

/// A client that leaves in the middle of an oversize answer no one else streams: the origin's
/// connection is closed, not read to its end for nobody (the body here never ends).
async fn a_client_leaving_an_oversize_relay_ends_the_origin_exchange(direct: bool) {
    let origin = TestOrigin::start(|_req: &RecordedRequest| {
        let piece = Bytes::from(vec![b'x'; 64 * 1024]);
        OriginResponse::new(200)
            .body(Body::Paced {
                chunks: std::iter::repeat_n(piece, 100_000).collect(),
                interval: Duration::from_millis(2),
            })
            .header("Cache-Control", "max-age=60")
    });
    let lacquer = node(origin.addr(), direct);
    let fields = if direct {
        ""
    } else {
        "Cache-Control: no-cache\r\n"
    };
    let mut client = StallingClient::get(lacquer.addr(), "/endless/1", fields).await;
    assert!(client.until_head().await, "direct {direct}: a head");
    assert!(
        client.until_len(4 * LIMIT).await,
        "direct {direct}: past the limit"
    );
    drop(client);
    let closed = poll_until(Duration::from_secs(20), || origin.open_connections() == 0);
    assert!(
        closed,
        "direct {direct}: the origin's connection is still open after the client left"
    );
    lacquer.assert_no_panic();
}

#[tokio::test]
async fn a_client_leaving_an_oversize_relay_ends_the_origin_exchange_direct() {
    a_client_leaving_an_oversize_relay_ends_the_origin_exchange(true).await;
}

#[tokio::test]
async fn a_client_leaving_an_oversize_relay_ends_the_origin_exchange_standard() {
    a_client_leaving_an_oversize_relay_ends_the_origin_exchange(false).await;
}

/// A conditional request whose validator matches, on the standard path, for an answer that never
/// ends: the client gets its 304 at once while the fill goes on, and once the fill outgrows the
/// limit with no one to read it, the origin's exchange is ended, not read forever; the same for
/// a HEAD.
#[tokio::test]
async fn a_304_or_a_head_of_an_endless_answer_does_not_keep_the_origin_read() {
    let origin = TestOrigin::start(|_req: &RecordedRequest| {
        let piece = Bytes::from(vec![b'y'; 64 * 1024]);
        OriginResponse::new(200)
            .body(Body::Paced {
                chunks: std::iter::repeat_n(piece, 100_000).collect(),
                interval: Duration::from_millis(2),
            })
            .header("Cache-Control", "max-age=60")
            .header("ETag", "\"v1\"")
    });
    let lacquer = node(origin.addr(), false);
    let not_modified = get(
        &lacquer.url("/endless/304"),
        &[("host", HOST), ("if-none-match", "\"v1\"")],
    )
    .await;
    assert_eq!(not_modified.status, 304);
    let closed = poll_until(Duration::from_secs(20), || origin.open_connections() == 0);
    assert!(closed, "the origin is still read after the 304");
    let head_only = head(
        &lacquer.url("/endless/head"),
        &[("host", HOST), ("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(head_only.status, 200);
    assert!(head_only.body.is_empty());
    let closed = poll_until(Duration::from_secs(20), || origin.open_connections() == 0);
    assert!(closed, "the origin is still read after the HEAD");
    lacquer.assert_no_panic();
}
