//! Attacks on the two changes that let a cache fill go at the origin's pace rather than at the
//! pace of the client that asked first:
//!
//! - `proxy::fill_relay`: a direct miss's storable body relayed in two halves (a reader that
//!   reads the origin and writes the fill, a writer that writes queued chunks to the client),
//!   with a bounded read-ahead once the fill is abandoned;
//! - Pingora's cancel-safe proxy task API, on for every request of the standard path, and the
//!   vendored pingora-core 0022 that gives HTTP/2 server sessions that API.
//!
//! Each case stalls, slows, resets or drops a client (over HTTP/1 and HTTP/2, on real sockets),
//! often while the origin misbehaves, and checks what every other client gets: the exact bytes,
//! every byte once, or an error, never a cut body reported complete; that nothing cut is stored;
//! and that a connection stays usable after answers with no body. Where a case runs on both
//! paths (`direct_misses` on and off), the standard path is the reference.
//!
//! Timings are never what a case checks, except bounds generous enough that only a hang (a fill
//! held up by a client that reads nothing, for `server.send_timeout`, here ten minutes) exceeds
//! them.

use lacquer_test_support as support;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::*;

/// Longer than any case takes when nothing hangs, far shorter than `server.send_timeout`.
const BOUND: Duration = Duration::from_secs(40);

/// The unreleased bytes ([`h2_wait_unreleased`]) that show the node has sent a stream its whole
/// stream window (64 KiB, nothing released): its writes now wait for the client.
const WINDOW_FILLED: usize = 60 << 10;

/// A node in front of `origin` with direct misses on or off, writes to a client that reads
/// nothing waiting ten minutes, and room for objects of up to 64 MiB; `extra` is appended (its
/// own sections). Returns the node and its admin port.
fn node(origin: SocketAddr, direct: bool, extra: &str) -> LacquerProcess {
    node_with_admin(origin, direct, extra).0
}

/// [`node`], with its admin port.
fn node_with_admin(origin: SocketAddr, direct: bool, extra: &str) -> (LacquerProcess, u16) {
    LacquerProcess::start_simple_with_admin(
        origin,
        &format!(
            "[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n\
             [server]\nsend_timeout = \"10m\"\n{extra}"
        ),
    )
}

/// `[cache]` with room for objects of up to 64 MiB.
const ROOMY: &str = "[cache]\nmax_object_size = \"64MiB\"\n";

/// Waits until `heads()` counts at least `n` (at most [`BOUND`]).
async fn wait_heads(what: &str, n: usize, heads: impl Fn() -> usize) {
    assert!(
        poll_until_async(BOUND, || heads() >= n).await,
        "{what}: the origin never got request {n}"
    );
}

/// Whether the last `Cache-Status` entry of a head says `hit`.
fn head_says_hit(head: &str) -> bool {
    head.lines()
        .rfind(|line| line.to_ascii_lowercase().starts_with("cache-status:"))
        .is_some_and(|line| line.split(';').skip(1).any(|p| p.trim() == "hit"))
}

// --- origins -----------------------------------------------------------------------------------

/// An origin answering every path with a storable generated page of `len` bytes (seed from the
/// path's last byte: [`seed_of`]) and `ETag: "<path>"`, each body paced in pieces of `piece`
/// bytes `interval` apart, with a `Content-Length` when `sized`, chunked otherwise. A request
/// whose `If-None-Match` names the page's tag is answered 304.
fn pages_origin(len: usize, piece: usize, interval: Duration, sized: bool) -> TestOrigin {
    TestOrigin::start(move |req| {
        let path = req.path_only();
        let tag = format!("\"{path}\"");
        if req.header("if-none-match") == Some(tag.as_str()) {
            return OriginResponse::new(304)
                .header("Cache-Control", "max-age=60")
                .header("ETag", tag);
        }
        let chunks = generated_bytes(len, seed_of(path))
            .chunks(piece)
            .map(Bytes::copy_from_slice)
            .collect();
        let answer = OriginResponse::ok(Body::Paced { chunks, interval })
            .header("Cache-Control", "max-age=60")
            .header("Content-Type", "application/octet-stream")
            .header("ETag", tag);
        if sized {
            answer.header("Content-Length", len.to_string())
        } else {
            answer
        }
    })
}

/// The seed [`pages_origin`] uses for `path`.
fn seed_of(path: &str) -> u8 {
    *path.as_bytes().last().unwrap()
}

/// An origin whose first answer announces `len` bytes (`Content-Length`, storable), sends `cut`
/// of them, waits `linger` and closes the connection; every later answer is the whole page
/// (seed 3). Counts the request heads it read.
fn dying_origin(len: usize, cut: usize, linger: Duration) -> RawOrigin {
    let answered = AtomicUsize::new(0);
    let page = Arc::new(generated_bytes(len, 3));
    RawOrigin::answering(move |_head, stream| {
        let first = answered.fetch_add(1, Ordering::SeqCst) == 0;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nCache-Control: max-age=60\r\n\
             Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
        );
        let _ = stream.write_all(head.as_bytes());
        if first {
            let _ = stream.write_all(&page[..cut]);
            let _ = stream.flush();
            std::thread::sleep(linger);
            // closed with the body cut short
        } else {
            let _ = stream.write_all(&page);
            let _ = stream.flush();
        }
    })
}

// --- 1. the origin dies mid-body while the first client reads nothing --------------------------

const DYING_LEN: usize = 24 << 20;
const DYING_CUT: usize = 12 << 20;

/// How the first client asks, and stalls.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Staller {
    H1,
    H2,
}

/// A first client asks for a large miss and reads nothing; the origin sends half the body it
/// announced and dies; a second client, arriving while the body was coming, streams the fill.
/// The second client must get an error (or, if it came after the failure, the whole page from
/// a fetch of its own), never a cut body reported complete, and without waiting for the first
/// client (a fill whose origin failed must fail its readers at once, not when the first client's
/// write gives up, `server.send_timeout` later). The first client's answer, read at last, is
/// cut. Nothing cut is stored: the next request fetches again and gets the whole page. (Failed
/// on the direct path before `fill_relay` abandoned the fill as soon as its reader failed: the
/// second client waited for the first one.)
async fn origin_dies_while_the_first_client_stalls(direct: bool, staller: Staller) {
    let origin = dying_origin(DYING_LEN, DYING_CUT, Duration::from_millis(1500));
    let lacquer = node(origin.addr, direct, ROOMY);
    let addr = lacquer.addr();
    let path = "/dying";
    let url = lacquer.url(path);
    let mut h1_staller = None;
    let mut h2_staller = None;
    match staller {
        Staller::H1 => h1_staller = Some(StallingClient::get(addr, path, "").await),
        Staller::H2 => {
            let (sender, driver) = h2_connect_wide(addr).await;
            let (response, _stream) = h2_request(&sender, "GET", &url, &[]).await;
            let response = within(BOUND, "the stalled stream's head", response)
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            h2_staller = Some((sender, driver, response, _stream));
        }
    }
    wait_heads("the first client's miss", 1, || origin.heads().len()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // the follower: an error, or the whole page; never a cut page reported complete, and never a
    // wait for the stalled client
    let follower = within(
        BOUND,
        "the second client's answer (it waited for the client that reads nothing)",
        try_get(&url, &[]),
    )
    .await;
    match &follower {
        Ok(resp) => {
            assert_eq!(resp.status, 200);
            assert_generated_page(
                &resp.body,
                DYING_LEN,
                3,
                "the second client's page, reported complete",
            );
        }
        Err(e) => assert!(
            !e.is_timeout(),
            "the second client waited its client's timeout: {e:?}"
        ),
    }

    // the first client, reading at last: a cut answer (the node closes after what it had)
    match staller {
        Staller::H1 => {
            let mut client = h1_staller.take().unwrap();
            let answer = within(BOUND, "the first client's answer", client.answer(false)).await;
            answer.assert_cut_start(3, DYING_CUT, "the first client's answer");
        }
        Staller::H2 => {
            let (_sender, driver, response, _stream) = h2_staller.take().unwrap();
            let mut body = response.into_body();
            let got = within(
                BOUND,
                "the stalled stream's body",
                h2_read_body(&mut body, None),
            )
            .await;
            match got {
                Ok(bytes) => panic!(
                    "the stalled stream's cut body ({} bytes) ended",
                    bytes.len()
                ),
                Err(e) => assert!(e.is_reset() || e.is_io() || e.is_go_away(), "{e:?}"),
            }
            driver.abort();
        }
    }

    // nothing cut was stored: the next request gets the whole page, fetched again
    let next = within(BOUND, "the next request", get(&url, &[])).await;
    assert_eq!(next.status, 200);
    assert_generated_page(&next.body, DYING_LEN, 3, "the next request's page");
    assert_eq!(origin.heads().len(), 2, "one fetch after the failed one");
    let after = within(BOUND, "the request after", get(&url, &[])).await;
    assert!(
        after.is_hit(),
        "the whole page is stored once fetched whole"
    );
    assert_generated_page(&after.body, DYING_LEN, 3, "the stored page");
}

#[tokio::test]
async fn direct_miss_origin_dying_while_an_h1_client_stalls_fails_the_fill_at_once() {
    origin_dies_while_the_first_client_stalls(true, Staller::H1).await;
}

#[tokio::test]
async fn direct_miss_origin_dying_while_an_h2_stream_stalls_fails_the_fill_at_once() {
    origin_dies_while_the_first_client_stalls(true, Staller::H2).await;
}

#[tokio::test]
async fn standard_miss_origin_dying_while_an_h1_client_stalls_fails_the_fill_at_once() {
    origin_dies_while_the_first_client_stalls(false, Staller::H1).await;
}

#[tokio::test]
async fn standard_miss_origin_dying_while_an_h2_stream_stalls_fails_the_fill_at_once() {
    origin_dies_while_the_first_client_stalls(false, Staller::H2).await;
}

// --- 2. the stalled client leaves while the fill goes on -----------------------------------------

/// How the client that reads nothing leaves.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Leaving {
    /// An HTTP/1 connection closed with answer bytes unread (the kernel resets it).
    H1Reset,
    /// An HTTP/2 stream reset (RST_STREAM CANCEL); its connection stays, and is used again.
    H2StreamReset,
    /// An HTTP/2 connection dropped with the stream open (no GOAWAY).
    H2ConnectionDrop,
}

const LEAVING_LEN: usize = 16 << 20;

/// A client asks for a large miss whose body the origin paces over about 1.5 s, reads nothing,
/// and leaves mid-body; a second client streams the fill meanwhile. The fill must go on without
/// the first client: the second client gets the whole page, the page is stored (the next
/// request is a hit, the origin asked once), and the cache lock is not leaked. After a stream
/// reset, its connection answers a next request whole.
async fn stalled_client_leaves_mid_fill(direct: bool, leaving: Leaving) {
    let origin = pages_origin(LEAVING_LEN, 1 << 20, Duration::from_millis(100), true);
    let lacquer = node(origin.addr(), direct, ROOMY);
    let addr = lacquer.addr();
    let path = "/leaving1";
    let url = lacquer.url(path);
    let seed = seed_of(path);
    let mut h1 = None;
    let mut h2 = None;
    match leaving {
        Leaving::H1Reset => h1 = Some(StallingClient::get(addr, path, "").await),
        Leaving::H2StreamReset | Leaving::H2ConnectionDrop => {
            let (sender, driver) = h2_connect_wide(addr).await;
            let (response, stream) = h2_request(&sender, "GET", &url, &[]).await;
            let response = within(BOUND, "the stalled stream's head", response)
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let mut body = response.into_body();
            h2_wait_unreleased(&mut body, WINDOW_FILLED, BOUND, "the stalled stream").await;
            h2 = Some((sender, driver, body, stream));
        }
    }
    assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
    tokio::time::sleep(Duration::from_millis(400)).await;

    let follower = {
        let url = url.clone();
        tokio::spawn(async move { try_get(&url, &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut kept_connection = None;
    match leaving {
        Leaving::H1Reset => drop(h1.take()),
        Leaving::H2StreamReset => {
            let (sender, driver, body, mut stream) = h2.take().unwrap();
            stream.send_reset(h2::Reason::CANCEL);
            drop(body);
            kept_connection = Some((sender, driver));
        }
        Leaving::H2ConnectionDrop => {
            let (sender, driver, body, stream) = h2.take().unwrap();
            driver.abort();
            drop((sender, body, stream));
        }
    }

    let follower = within(BOUND, "the second client's page", follower)
        .await
        .unwrap()
        .expect("the second client's page was cut");
    assert_eq!(follower.status, 200);
    assert_generated_page(
        &follower.body,
        LEAVING_LEN,
        seed,
        "the second client's page",
    );
    let next = within(BOUND, "the next request", get(&url, &[])).await;
    assert!(
        next.is_hit(),
        "the page was stored: {:?}",
        next.cache_status()
    );
    assert_generated_page(&next.body, LEAVING_LEN, seed, "the stored page");
    assert_eq!(origin.hits_for(path), 1, "one fetch, streamed by both");

    if let Some((sender, driver)) = kept_connection {
        // the connection whose stream was reset answers a next stream whole (a miss, then a hit)
        for (other, what) in [("/leaving2", "a miss"), (path, "a hit")] {
            let (response, _stream) = h2_request(&sender, "GET", &lacquer.url(other), &[]).await;
            let H2Answer { status, body, .. } = within(BOUND, what, h2_read_answer(response, None))
                .await
                .unwrap();
            assert_eq!(status, 200, "{what}");
            assert_generated_page(&body, LEAVING_LEN, seed_of(other), what);
        }
        driver.abort();
    }
}

#[tokio::test]
async fn direct_miss_an_h1_client_reset_while_stalled_leaves_its_fill_whole() {
    stalled_client_leaves_mid_fill(true, Leaving::H1Reset).await;
}

#[tokio::test]
async fn standard_miss_an_h1_client_reset_while_stalled_leaves_its_fill_whole() {
    stalled_client_leaves_mid_fill(false, Leaving::H1Reset).await;
}

#[tokio::test]
async fn direct_miss_an_h2_stream_reset_while_stalled_leaves_its_fill_whole() {
    stalled_client_leaves_mid_fill(true, Leaving::H2StreamReset).await;
}

#[tokio::test]
async fn standard_miss_an_h2_stream_reset_while_stalled_leaves_its_fill_whole() {
    stalled_client_leaves_mid_fill(false, Leaving::H2StreamReset).await;
}

#[tokio::test]
async fn direct_miss_an_h2_connection_dropped_while_stalled_leaves_its_fill_whole() {
    stalled_client_leaves_mid_fill(true, Leaving::H2ConnectionDrop).await;
}

#[tokio::test]
async fn standard_miss_an_h2_connection_dropped_while_stalled_leaves_its_fill_whole() {
    stalled_client_leaves_mid_fill(false, Leaving::H2ConnectionDrop).await;
}

// --- 3. codings: decoded for the client, coded on store ---------------------------------------

const CODED_LEN: usize = 8 << 20;

/// A text page of `len` bytes, compressible (numbered lines).
fn text_page(len: usize) -> Vec<u8> {
    let mut page = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while page.len() < len {
        page.extend_from_slice(format!("line {i:09} of a page that compresses well\n").as_bytes());
        i += 1;
    }
    page.truncate(len);
    page
}

/// Which coding case.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Coding {
    /// The origin sends gzip (random bytes, so as large coded as not); stored as sent.
    OriginGzip,
    /// The origin sends identity text; the node codes it in gzip on store.
    CodedOnStore,
}

/// A client that takes no coding asks for a large miss whose stored copy is gzip, and reads
/// nothing (its copy is decoded on the way out, by the writer while the fill goes on); a second
/// identity client and a gzip client ask meanwhile. Each must get exact bytes: the identity
/// clients the page, the gzip client gzip of it; the stalled one too once it reads.
async fn stalled_identity_client_of_a_coded_fill(direct: bool, coding: Coding) {
    let page = Arc::new(match coding {
        Coding::OriginGzip => generated_bytes(CODED_LEN, 5),
        Coding::CodedOnStore => text_page(CODED_LEN),
    });
    let coded = Arc::new(gzip(&page));
    let served = (page.clone(), coded.clone());
    let origin = TestOrigin::start(move |_req| {
        let (page, coded) = &served;
        let (body, gzip_sent) = match coding {
            Coding::OriginGzip => (coded.as_slice(), true),
            Coding::CodedOnStore => (page.as_slice(), false),
        };
        let chunks = body.chunks(512 << 10).map(Bytes::copy_from_slice).collect();
        let answer = OriginResponse::ok(Body::Paced {
            chunks,
            interval: Duration::from_millis(40),
        })
        .header("Cache-Control", "max-age=60")
        .header("Content-Length", body.len().to_string());
        if gzip_sent {
            answer
                .header("Content-Type", "application/octet-stream")
                .header("Content-Encoding", "gzip")
        } else {
            answer.header("Content-Type", "text/plain")
        }
    });
    let extra = match coding {
        Coding::OriginGzip => ROOMY.to_string(),
        Coding::CodedOnStore => format!("{ROOMY}[cache.compression]\nenabled = true\n"),
    };
    let lacquer = node(origin.addr(), direct, &extra);
    let addr = lacquer.addr();
    let path = "/coded";
    let url = lacquer.url(path);
    let mut stalled = StallingClient::get(addr, path, "").await;
    assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let identity = within(BOUND, "the identity client's page", get(&url, &[])).await;
    assert_eq!(identity.status, 200);
    assert!(identity.header("content-encoding").is_none());
    assert!(
        identity.body.as_ref() == page.as_slice(),
        "the identity client got {} bytes, not the page",
        identity.body.len()
    );
    let coded_resp = within(
        BOUND,
        "the gzip client's page",
        get(&url, &[("accept-encoding", "gzip")]),
    )
    .await;
    assert_eq!(coded_resp.status, 200);
    assert_eq!(
        coded_resp.header("content-encoding").as_deref(),
        Some("gzip")
    );
    assert!(
        gunzip(&coded_resp.body) == page.as_slice(),
        "the gzip client's body is not gzip of the page"
    );
    assert_eq!(origin.hits_for(path), 1, "one fetch for all three");

    let answer = within(BOUND, "the stalled client's answer", stalled.answer(false)).await;
    assert!(answer.complete, "the stalled client's answer was cut");
    assert_eq!(answer.status, 200);
    assert!(answer.field("content-encoding").is_none());
    assert!(
        answer.body == page.as_slice(),
        "the stalled client got {} bytes, not the page",
        answer.body.len()
    );
}

#[tokio::test]
async fn direct_miss_origin_gzip_decoded_for_a_stalled_identity_client() {
    stalled_identity_client_of_a_coded_fill(true, Coding::OriginGzip).await;
}

#[tokio::test]
async fn standard_miss_origin_gzip_decoded_for_a_stalled_identity_client() {
    stalled_identity_client_of_a_coded_fill(false, Coding::OriginGzip).await;
}

#[tokio::test]
async fn direct_miss_coded_on_store_decoded_for_a_stalled_identity_client() {
    stalled_identity_client_of_a_coded_fill(true, Coding::CodedOnStore).await;
}

#[tokio::test]
async fn standard_miss_coded_on_store_decoded_for_a_stalled_identity_client() {
    stalled_identity_client_of_a_coded_fill(false, Coding::CodedOnStore).await;
}

// --- 4. ranges and conditionals read slowly, on the standard path -------------------------------

const SLOW_LEN: usize = 6 << 20;

/// A slow, steady read: 16 KiB each 5 ms.
const SLOW_PACE: (usize, Duration) = (16 << 10, Duration::from_millis(5));

/// What a request of [`ranged_and_conditional_misses`] asks and expects.
struct Ask {
    path: &'static str,
    fields: &'static [(&'static str, &'static str)],
    /// The bytes wanted (offset, length) of the page, and the status for them.
    status: u16,
    span: (usize, usize),
}

/// Misses that take the standard path even with direct misses on (a `Range`, an
/// `If-None-Match` naming another tag), each read slowly over HTTP/1 or HTTP/2 while a plain
/// client streams the same fill at once: every client gets its exact bytes, every byte once, and
/// the origin is asked once per page.
async fn ranged_and_conditional_misses(h2: bool) {
    let origin = pages_origin(SLOW_LEN, 256 << 10, Duration::from_millis(20), true);
    let lacquer = node(origin.addr(), true, ROOMY);
    let addr = lacquer.addr();
    let asks = [
        Ask {
            path: "/ranged1",
            fields: &[("range", "bytes=100000-4294966")],
            status: 206,
            span: (100_000, 4_294_967 - 100_000),
        },
        Ask {
            path: "/ranged2",
            fields: &[("range", "bytes=-1048577")],
            status: 206,
            span: (SLOW_LEN - 1_048_577, 1_048_577),
        },
        Ask {
            path: "/conditional3",
            fields: &[("if-none-match", "\"another\"")],
            status: 200,
            span: (0, SLOW_LEN),
        },
    ];
    let mut slow = Vec::new();
    for ask in &asks {
        let url = lacquer.url(ask.path);
        let fields: Vec<(String, String)> = ask
            .fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let (path, status, span) = (ask.path, ask.status, ask.span);
        slow.push(tokio::spawn(async move {
            let (got_status, body) = if h2 {
                let (sender, driver) = h2_connect_wide(addr).await;
                let fields: Vec<(&str, &str)> = fields
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let (response, _stream) = h2_request(&sender, "GET", &url, &fields).await;
                let H2Answer {
                    status: got_status,
                    body,
                    ..
                } = h2_read_answer(response, Some(SLOW_PACE)).await.unwrap();
                driver.abort();
                (got_status, body)
            } else {
                let lines: String = fields
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\r\n"))
                    .collect();
                let mut client = StallingClient::get(addr, path, &lines).await;
                client.pace = Some(SLOW_PACE);
                let answer = client.answer(false).await;
                assert!(answer.complete, "{path}: the slow client's answer was cut");
                (answer.status, answer.body)
            };
            assert_eq!(got_status, status, "{path}");
            assert_eq!(body.len(), span.1, "{path}: length");
            assert_eq!(
                generated_mismatch(&body, seed_of(path), span.0),
                None,
                "{path}: the bytes differ"
            );
        }));
    }
    for ask in &asks {
        assert!(poll_until_async(BOUND, || origin.heads_for(ask.path) >= 1).await);
        let plain = within(BOUND, "a plain client", get(&lacquer.url(ask.path), &[])).await;
        assert_generated_page(&plain.body, SLOW_LEN, seed_of(ask.path), ask.path);
    }
    for reader in slow {
        within(BOUND, "a slow client", reader).await.unwrap();
    }
    for ask in &asks {
        assert_eq!(origin.hits_for(ask.path), 1, "{}: one fetch", ask.path);
    }
}

#[tokio::test]
async fn h1_ranged_and_conditional_misses_read_slowly_get_exact_bytes() {
    ranged_and_conditional_misses(false).await;
}

#[tokio::test]
async fn h2_ranged_and_conditional_misses_read_slowly_get_exact_bytes() {
    ranged_and_conditional_misses(true).await;
}

// --- 5. many HTTP/2 streams on one connection, some stalled ------------------------------------

const MIXED_LEN: usize = 2 << 20;

/// One HTTP/2 connection carries, at once, streams that never read (a miss, a standard-path hit,
/// a ranged miss) and streams that read at once (the same miss, new misses, fast and standard
/// hits, a range, a HEAD): every reading stream gets its exact answer while the stalled ones
/// hold their windows shut; the stalled ones then get theirs whole, every byte once. Objects of
/// up to 64 MiB are allowed (`cache.max_object_size`), with the default 256 MiB memory tier.
async fn mixed_streams_on_one_connection(direct: bool) {
    let origin = pages_origin(MIXED_LEN, 256 << 10, Duration::from_millis(20), true);
    // room in the standard path's read-ahead budget (a quarter of the memory tier) for each
    // stalled standard-path miss to reserve a whole 64 MiB object; with less, the misses past
    // the budget go at their client's pace, as documented
    let lacquer = node(
        origin.addr(),
        direct,
        "[cache]\nmemory_size = \"1GiB\"\nmax_object_size = \"64MiB\"\n",
    );
    let url = |path: &str| lacquer.url(path);
    for warm in ["/hit1", "/hit2"] {
        get(&url(warm), &[]).await;
        assert!(get(&url(warm), &[]).await.is_hit(), "{warm} stored");
    }
    let (sender, driver) = h2_connect_wide(lacquer.addr()).await;
    const OTHER: &[(&str, &str)] = &[("if-none-match", "\"another\"")];
    // (path, fields, method, expected status, span)
    type Stream = (
        &'static str,
        &'static [(&'static str, &'static str)],
        &'static str,
        u16,
        (usize, usize),
    );
    let stalled: [Stream; 3] = [
        ("/miss1", &[], "GET", 200, (0, MIXED_LEN)),
        ("/hit1", OTHER, "GET", 200, (0, MIXED_LEN)),
        (
            "/miss2",
            &[("range", "bytes=1000-1999999")],
            "GET",
            206,
            (1000, 1_999_000),
        ),
    ];
    let reading: [Stream; 8] = [
        ("/miss1", &[], "GET", 200, (0, MIXED_LEN)),
        ("/miss2", &[], "GET", 200, (0, MIXED_LEN)),
        ("/miss3", &[], "GET", 200, (0, MIXED_LEN)),
        ("/miss4", OTHER, "GET", 200, (0, MIXED_LEN)),
        ("/hit1", &[], "GET", 200, (0, MIXED_LEN)),
        ("/hit2", OTHER, "GET", 200, (0, MIXED_LEN)),
        ("/hit2", &[("range", "bytes=5-104")], "GET", 206, (5, 100)),
        ("/miss5", &[], "HEAD", 200, (0, 0)),
    ];
    let mut held = Vec::new();
    for (path, fields, method, status, span) in stalled {
        let (response, stream) = h2_request(&sender, method, &url(path), fields).await;
        let response = within(BOUND, "a stalled stream's head", response)
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "stalled {path}");
        let mut body = response.into_body();
        h2_wait_unreleased(&mut body, WINDOW_FILLED, BOUND, path).await;
        held.push((path, span, body, stream));
    }
    let mut readers = Vec::new();
    for (path, fields, method, status, span) in reading {
        let (response, _stream) = h2_request(&sender, method, &url(path), fields).await;
        let what = format!("{method} {path} {fields:?}");
        readers.push((
            what,
            tokio::spawn(async move {
                let H2Answer {
                    status: got, body, ..
                } = h2_read_answer(response, None).await.unwrap();
                assert_eq!(got, status, "{method} {path} {fields:?}");
                assert_eq!(body.len(), span.1, "{method} {path} {fields:?}: length");
                assert_eq!(
                    generated_mismatch(&body, seed_of(path), span.0),
                    None,
                    "{method} {path} {fields:?}: the bytes differ"
                );
            }),
        ));
    }
    for (what, reader) in readers {
        within(
            BOUND,
            &format!("a reading stream next to stalled ones: {what}"),
            reader,
        )
        .await
        .unwrap();
    }
    for (path, span, mut body, _stream) in held {
        let got = within(
            BOUND,
            "a stalled stream, reading at last",
            h2_read_body(&mut body, None),
        )
        .await
        .unwrap();
        assert_eq!(got.len(), span.1, "stalled {path}: length");
        assert_eq!(
            generated_mismatch(&got, seed_of(path), span.0),
            None,
            "stalled {path}: the bytes differ"
        );
    }
    for path in ["/miss1", "/miss2", "/miss3", "/miss4"] {
        assert_eq!(origin.hits_for(path), 1, "{path}: one fetch");
    }
    driver.abort();
}

#[tokio::test]
async fn h2_streams_stalled_and_reading_on_one_connection_standard_path() {
    mixed_streams_on_one_connection(false).await;
}

#[tokio::test]
async fn h2_streams_stalled_and_reading_on_one_connection_direct_misses() {
    mixed_streams_on_one_connection(true).await;
}

// --- 6. a slow but steady reader of a large miss ------------------------------------------------

const STEADY_LEN: usize = 2 << 20;

/// A client reads a large miss slowly but steadily (16 KiB each 10 ms) over HTTP/1 or HTTP/2
/// while the origin sends it faster, in pieces: each piece that arrives interrupts the slow
/// client's write on the standard path (proxy tasks), and queues behind it on the direct path.
/// It must get every byte once, in order; a client of the same page and one of another page
/// meanwhile get theirs whole.
async fn slow_steady_reader(direct: bool, h2: bool) {
    let origin = pages_origin(STEADY_LEN, 128 << 10, Duration::from_millis(15), true);
    let lacquer = node(origin.addr(), direct, ROOMY);
    let addr = lacquer.addr();
    let path = "/steady1";
    let url = lacquer.url(path);
    let pace = (16 << 10, Duration::from_millis(10));
    let slow = {
        let url = url.clone();
        tokio::spawn(async move {
            if h2 {
                let (sender, driver) = h2_connect_wide(addr).await;
                let (response, _stream) = h2_request(&sender, "GET", &url, &[]).await;
                let H2Answer { status, body, .. } =
                    h2_read_answer(response, Some(pace)).await.unwrap();
                driver.abort();
                (status, body)
            } else {
                let mut client = StallingClient::get(addr, path, "").await;
                client.pace = Some(pace);
                let answer = client.answer(false).await;
                assert!(answer.complete, "the slow client's answer was cut");
                (answer.status, answer.body)
            }
        })
    };
    assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
    let same = within(BOUND, "a client of the same page", get(&url, &[])).await;
    assert_generated_page(&same.body, STEADY_LEN, seed_of(path), "the same page");
    let other = within(
        BOUND,
        "a client of another page",
        get(&lacquer.url("/steady2"), &[]),
    )
    .await;
    assert_generated_page(&other.body, STEADY_LEN, seed_of("/steady2"), "another page");
    let (status, body) = within(BOUND, "the slow client", slow).await.unwrap();
    assert_eq!(status, 200);
    assert_generated_page(&body, STEADY_LEN, seed_of(path), "the slow client's page");
    assert_eq!(origin.hits_for(path), 1);
}

#[tokio::test]
async fn direct_miss_a_slow_steady_h1_reader_gets_every_byte_once() {
    slow_steady_reader(true, false).await;
}

#[tokio::test]
async fn standard_miss_a_slow_steady_h1_reader_gets_every_byte_once() {
    slow_steady_reader(false, false).await;
}

#[tokio::test]
async fn direct_miss_a_slow_steady_h2_reader_gets_every_byte_once() {
    slow_steady_reader(true, true).await;
}

#[tokio::test]
async fn standard_miss_a_slow_steady_h2_reader_gets_every_byte_once() {
    slow_steady_reader(false, true).await;
}

// --- 7. answers with no body, on the standard path: the connection stays usable -----------------

const BODILESS_LEN: usize = 1 << 20;

/// A short-lived page (`max-age=1`) with a tag, for revalidations answered 304 by the origin.
fn revalidated_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        let path = req.path_only();
        let tag = format!("\"{path}\"");
        let fresh_for = if path.starts_with("/stale") { 1 } else { 60 };
        let cache_control = format!("max-age={fresh_for}");
        if req.header("if-none-match") == Some(tag.as_str()) {
            return OriginResponse::new(304)
                .header("Cache-Control", cache_control)
                .header("ETag", tag);
        }
        OriginResponse::ok(Body::Generated {
            len: BODILESS_LEN,
            seed: seed_of(path),
        })
        .header("Cache-Control", cache_control)
        .header("Content-Type", "application/octet-stream")
        .header("ETag", tag)
    })
}

/// One step of [`bodiless_answers_keep_the_connection`]: method, path, fields, and the status
/// and body length expected.
type Step = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    u16,
    usize,
);

/// On one connection, HTTP/1 keep-alive or HTTP/2, requests that take the standard path and
/// whose answer has no body (a HEAD miss, a 304 to a miss whose tag matches, a 304 from a
/// revalidation, a 304 hit), each followed by a request with a body: every answer is exact and
/// the connection carries the next one (no body bytes after a bodiless head, no stream left
/// open).
async fn bodiless_answers_keep_the_connection(direct: bool, h2: bool) {
    let origin = revalidated_origin();
    let lacquer = node(origin.addr(), direct, "");
    let addr = lacquer.addr();
    let steps_before: [Step; 6] = [
        ("HEAD", "/head1", &[], 200, 0),
        ("GET", "/head1", &[], 200, BODILESS_LEN),
        ("GET", "/tag2", &[("if-none-match", "\"/tag2\"")], 304, 0),
        ("GET", "/tag2", &[], 200, BODILESS_LEN),
        ("GET", "/tag2", &[("if-none-match", "\"/tag2\"")], 304, 0),
        ("GET", "/stale3", &[], 200, BODILESS_LEN),
    ];
    // after `/stale3` goes stale: revalidated (the origin says 304) and served from the cache
    let steps_after: [Step; 4] = [
        (
            "GET",
            "/stale3",
            &[("if-none-match", "\"/stale3\"")],
            304,
            0,
        ),
        ("HEAD", "/stale3", &[], 200, 0),
        (
            "GET",
            "/stale3",
            &[("if-none-match", "\"other\"")],
            200,
            BODILESS_LEN,
        ),
        ("GET", "/head1", &[], 200, BODILESS_LEN),
    ];
    let check = |step: &Step, status: u16, body: &[u8]| {
        let (method, path, fields, want_status, want_len) = *step;
        assert_eq!(status, want_status, "{method} {path} {fields:?}");
        assert_eq!(body.len(), want_len, "{method} {path} {fields:?}: length");
        assert_eq!(
            generated_mismatch(body, seed_of(path), 0),
            None,
            "{method} {path} {fields:?}: the bytes differ"
        );
    };
    if h2 {
        let (sender, driver) = h2_connect_wide(addr).await;
        let run = |steps: Vec<Step>| {
            let sender = sender.clone();
            let lacquer_url = lacquer.url("");
            async move {
                for step in steps {
                    let (method, path, fields, _, _) = step;
                    let url = format!("{}{}", lacquer_url.trim_end_matches('/'), path);
                    let (response, _stream) = h2_request(&sender, method, &url, fields).await;
                    let H2Answer { status, body, .. } =
                        within(BOUND, "an h2 answer", h2_read_answer(response, None))
                            .await
                            .unwrap();
                    check(&step, status, &body);
                }
            }
        };
        run(steps_before.to_vec()).await;
        tokio::time::sleep(Duration::from_millis(2100)).await;
        run(steps_after.to_vec()).await;
        driver.abort();
    } else {
        let mut client = StallingClient::connect(addr).await;
        for (i, steps) in [steps_before.to_vec(), steps_after.to_vec()]
            .into_iter()
            .enumerate()
        {
            if i == 1 {
                tokio::time::sleep(Duration::from_millis(2100)).await;
            }
            for step in steps {
                let (method, path, fields, _, _) = step;
                let lines: String = fields
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\r\n"))
                    .collect();
                client
                    .send(&format!(
                        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{lines}\r\n"
                    ))
                    .await;
                let answer = within(BOUND, "an h1 answer", client.answer(method == "HEAD")).await;
                assert!(answer.complete, "{method} {path}: cut: {}", answer.head);
                check(&step, answer.status, &answer.body);
            }
        }
        // nothing stray followed the last answer
        client
            .send(&format!("GET /head1 HTTP/1.1\r\nHost: {addr}\r\n\r\n"))
            .await;
        let last = within(BOUND, "the last h1 answer", client.answer(false)).await;
        assert_eq!(last.status, 200);
        assert!(head_says_hit(&last.head), "{}", last.head);
        assert_generated_page(
            &last.body,
            BODILESS_LEN,
            seed_of("/head1"),
            "the last answer",
        );
    }
    assert!(
        origin.requests_for("/stale3").len() >= 2,
        "the stale page was revalidated"
    );
}

#[tokio::test]
async fn h1_bodiless_standard_path_answers_keep_the_connection_usable() {
    bodiless_answers_keep_the_connection(false, false).await;
}

#[tokio::test]
async fn h2_bodiless_standard_path_answers_keep_the_connection_usable() {
    bodiless_answers_keep_the_connection(false, true).await;
}

#[tokio::test]
async fn h1_bodiless_answers_with_direct_misses_keep_the_connection_usable() {
    bodiless_answers_keep_the_connection(true, false).await;
}

// --- 8. pipelined requests behind a miss whose client reads nothing -----------------------------

const PIPELINED_LEN: usize = 12 << 20;

/// A client pipelines a large miss and two more requests (a small miss, then the large page
/// again) and reads nothing for a while; a second client streams the large fill meanwhile and
/// gets it whole. The first client, reading at last, gets its three answers in order, each
/// exact.
async fn pipelined_behind_a_stalled_miss(direct: bool) {
    let origin = TestOrigin::start(|req| {
        let path = req.path_only();
        let len = if path.starts_with("/big") {
            PIPELINED_LEN
        } else {
            1000
        };
        OriginResponse::ok(Body::Generated {
            len,
            seed: seed_of(path),
        })
        .header("Cache-Control", "max-age=60")
    });
    let lacquer = node(origin.addr(), direct, ROOMY);
    let addr = lacquer.addr();
    let mut client = StallingClient::connect(addr).await;
    client
        .send(&format!(
            "GET /big1 HTTP/1.1\r\nHost: {addr}\r\n\r\n\
             GET /small2 HTTP/1.1\r\nHost: {addr}\r\n\r\n\
             GET /big1 HTTP/1.1\r\nHost: {addr}\r\n\r\n"
        ))
        .await;
    assert!(poll_until_async(BOUND, || origin.heads_for("/big1") >= 1).await);
    let follower = within(
        BOUND,
        "the second client's page",
        get(&lacquer.url("/big1"), &[]),
    )
    .await;
    assert_generated_page(
        &follower.body,
        PIPELINED_LEN,
        seed_of("/big1"),
        "the second client",
    );

    for (path, len) in [
        ("/big1", PIPELINED_LEN),
        ("/small2", 1000),
        ("/big1", PIPELINED_LEN),
    ] {
        let answer = within(BOUND, "a pipelined answer", client.answer(false)).await;
        assert!(
            answer.complete,
            "{path}: cut after {} bytes",
            answer.body.len()
        );
        assert_eq!(answer.status, 200, "{path}: {}", answer.head);
        assert_generated_page(&answer.body, len, seed_of(path), path);
    }
    assert_eq!(origin.hits_for("/big1"), 1);
}

#[tokio::test]
async fn direct_miss_pipelined_requests_behind_a_stalled_miss_are_answered_in_order() {
    pipelined_behind_a_stalled_miss(true).await;
}

#[tokio::test]
async fn standard_miss_pipelined_requests_behind_a_stalled_miss_are_answered_in_order() {
    pipelined_behind_a_stalled_miss(false).await;
}

// --- 9. what clients that read nothing hold in memory -------------------------------------------

const HELD_LEN: usize = 16 << 20;
const HELD_CLIENTS: usize = 12;
const MIB: u64 = 1 << 20;

/// `HELD_CLIENTS` clients each ask for a different large page (a cache-busting query string is
/// all an attacker needs), with `fields`, and read nothing; the fills go on at the origin's
/// pace. Returns how much the node's RSS grew meanwhile; each client then gets its page whole.
async fn stalled_clients_of_distinct_pages(direct: bool, fields: &str) -> u64 {
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(Body::Generated {
            len: HELD_LEN,
            seed: seed_of(&req.path),
        })
        .header("Cache-Control", "max-age=60")
    });
    let lacquer = node(
        origin.addr(),
        direct,
        "[cache]\nmemory_size = \"32MiB\"\nmax_object_size = \"16MiB\"\n",
    );
    let addr = lacquer.addr();
    // the node's baseline, after one exchange
    let _ = get(&lacquer.url("/warm?0"), &[]).await;
    let before = rss_bytes(lacquer.pid());
    let mut clients = Vec::new();
    for i in 1..=HELD_CLIENTS {
        let path = format!("/held?{i}");
        clients.push((path.clone(), StallingClient::get(addr, &path, fields).await));
    }
    assert!(poll_until_async(BOUND, || origin.hits() > HELD_CLIENTS).await);
    // until the node's memory stops growing (the fills that go on are done), 20 s at most
    let mut peak = rss_bytes(lacquer.pid());
    let mut steady_since = std::time::Instant::now();
    let started = std::time::Instant::now();
    while steady_since.elapsed() < Duration::from_secs(2) && started.elapsed() < BOUND / 2 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss_bytes(lacquer.pid());
        if now > peak + MIB {
            steady_since = std::time::Instant::now();
        }
        peak = peak.max(now);
    }
    for (path, mut client) in clients {
        let answer = within(BOUND, "a stalled client's page", client.answer(false)).await;
        assert!(answer.complete, "{path}: cut");
        assert!(
            matches!(answer.status, 200 | 206),
            "{path}: {}",
            answer.head
        );
        assert_generated_page(&answer.body, HELD_LEN, seed_of(&path), &path);
    }
    peak.saturating_sub(before)
}

/// Runs [`stalled_clients_of_distinct_pages`] and checks what the node held against
/// [`HELD_BOUND`].
async fn held_is_bounded(direct: bool, fields: &str) {
    let grown = stalled_clients_of_distinct_pages(direct, fields).await;
    assert!(
        grown < HELD_BOUND,
        "RSS grew by {} MiB (bound {} MiB)",
        grown / MIB,
        HELD_BOUND / MIB
    );
}

/// What the node may hold for [`stalled_clients_of_distinct_pages`]: the memory tier (32 MiB),
/// the read-ahead budgets (half of it), 4 MiB per client (a fill that goes at its client's pace
/// holds what the client's socket buffers took) and 24 MiB for everything else; not a whole
/// page per client (192 MiB).
const HELD_BOUND: u64 = 32 * MIB + 16 * MIB + HELD_CLIENTS as u64 * 4 * MIB + 24 * MIB;

/// The reference: direct misses hold what their clients have not taken within the read-ahead
/// budget (`fill_relay::ReadAheadBudget`).
#[tokio::test]
async fn direct_miss_stalled_clients_of_distinct_pages_hold_bounded_memory() {
    held_is_bounded(true, "").await;
}

/// The same on the standard path (`direct_misses = false`): with proxy tasks the fill goes on
/// at the origin's pace while the client's pending task waits, and the client's reader of the
/// fill keeps every chunk the fill wrote (the in-flight fill's body, shared with the stored
/// object and kept whole after the memory tier evicts it), so that too must stay within the
/// budget. (Failed before the standard path drew on the budget: 196 MiB.)
#[tokio::test]
async fn standard_miss_stalled_clients_of_distinct_pages_hold_bounded_memory() {
    held_is_bounded(false, "").await;
}

/// And with direct misses on (the default): a `Range` header is enough to take the standard
/// path, which must not be a way around the budget. (Failed before the standard path drew on
/// the budget: 199 MiB.)
#[tokio::test]
async fn ranged_stalled_clients_of_distinct_pages_hold_bounded_memory() {
    held_is_bounded(true, "Range: bytes=0-\r\n").await;
}

// --- 10. the read-ahead budget, spent and given back ---------------------------------------------

/// Clients that read nothing spend the direct path's read-ahead budget (a quarter of a 64 MiB memory
/// tier) on four large misses; a fifth stalled miss then goes at its client's pace, as
/// documented. Then the four leave and their bytes go back to the budget: the fifth fill must go
/// at the origin's pace again, so that a second client of its page gets it whole, not wait
/// (until `server.send_timeout`, here ten minutes) for a client that reads nothing. (Failed
/// before paused relays were woken by the budget's `given_back`.)
#[tokio::test]
async fn a_fill_paused_by_a_spent_budget_resumes_when_the_budget_is_given_back() {
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(Body::Generated {
            len: HELD_LEN,
            seed: seed_of(&req.path),
        })
        .header("Cache-Control", "max-age=60")
    });
    let (lacquer, admin) = node_with_admin(
        origin.addr(),
        true,
        "[cache]\nmemory_size = \"64MiB\"\nmax_object_size = \"16MiB\"\n",
    );
    let addr = lacquer.addr();
    let held = || async { scrape(admin).await.value("lacquer_read_ahead_bytes") };
    let mut spenders = Vec::new();
    for i in 1..=4 {
        spenders.push(StallingClient::get(addr, &format!("/spend{i}"), "").await);
    }
    // a quarter of the 64 MiB memory tier (the standard path's reservations have the other)
    let budget = 16.0 * MIB as f64;
    let spent = async {
        while held().await <= budget {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    within(BOUND, "the budget spent", spent).await;

    let paused_path = "/paused5";
    let _paused = StallingClient::get(addr, paused_path, "").await;
    assert!(poll_until_async(BOUND, || origin.heads_for(paused_path) >= 1).await);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // the four leave: their bytes go back
    drop(spenders);
    let given_back = async {
        // the paused relay, woken, may now hold its own page for its client, within the budget
        while held().await > budget {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    within(BOUND, "the budget given back", given_back).await;

    let url = lacquer.url(paused_path);
    let follower = within(
        BOUND,
        "a second client of the paused page (its fill still waits for a client that reads nothing)",
        try_get(&url, &[]),
    )
    .await;
    let follower = follower.unwrap_or_else(|e| panic!("the second client's page: {e:?}"));
    assert_eq!(follower.status, 200);
    assert_generated_page(
        &follower.body,
        HELD_LEN,
        seed_of(paused_path),
        "the second client's page",
    );
}

// --- 11. standard-path requests that hold the budget while reading nothing -----------------------

const COND_LEN: usize = 8 << 20;

/// Clients that read nothing send conditional requests that do not match (`If-None-Match` with
/// another tag: the standard path, answered 200 from the cache) for a stored 8 MiB page: cheap
/// hits, each held open by its client (a slow phone does the same). Then a client that reads
/// nothing starts a miss on another page (a `Range` miss: the standard path; or a plain GET: a
/// direct miss), and a second client asks for that page. The fill must go on at the origin's
/// pace, as the proxy tasks and `fill_relay` make it go, whatever hits are being written
/// elsewhere: a hit reads nothing ahead of its client (it is the stored object), so it has no
/// reason to take the read-ahead budget a fill needs.
async fn stalled_conditional_hits_then_a_stalled_miss(victim_fields: &str) {
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(Body::Generated {
            len: COND_LEN,
            seed: seed_of(req.path_only()),
        })
        .header("Cache-Control", "max-age=60")
        .header("ETag", "\"v1\"")
    });
    // the defaults: a 256 MiB memory tier (64 MiB read-ahead budgets), objects of up to 16 MiB
    let lacquer = node(origin.addr(), true, "");
    let addr = lacquer.addr();
    let stored = "/stored1";
    let first = get(&lacquer.url(stored), &[]).await;
    assert_generated_page(&first.body, COND_LEN, seed_of(stored), stored);
    assert!(get(&lacquer.url(stored), &[]).await.is_hit());
    let mut hits = Vec::new();
    for _ in 0..10 {
        hits.push(StallingClient::get(addr, stored, "If-None-Match: \"other\"\r\n").await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let path = "/fresh2";
    let _victim = StallingClient::get(addr, path, victim_fields).await;
    assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let follower = within(
        BOUND,
        "a second client of the page (its fill waits for a client that reads nothing)",
        try_get(&lacquer.url(path), &[]),
    )
    .await
    .unwrap_or_else(|e| panic!("the second client's page: {e:?}"));
    assert_eq!(follower.status, 200);
    assert_generated_page(
        &follower.body,
        COND_LEN,
        seed_of(path),
        "the second client's page",
    );
    // and the conditional hits were whole, once read
    for mut hit in hits {
        let answer = within(BOUND, "a conditional hit", hit.answer(false)).await;
        assert!(answer.complete && answer.status == 200, "{}", answer.head);
        assert_generated_page(&answer.body, COND_LEN, seed_of(stored), "a conditional hit");
    }
}

#[tokio::test]
async fn stalled_conditional_hits_do_not_make_a_standard_miss_fill_wait_for_its_client() {
    stalled_conditional_hits_then_a_stalled_miss("Range: bytes=0-\r\n").await;
}

#[tokio::test]
async fn stalled_conditional_hits_do_not_make_a_direct_miss_fill_wait_for_its_client() {
    stalled_conditional_hits_then_a_stalled_miss("").await;
}

// --- 12. server.send_timeout for a client that reads nothing while the origin sends -------------

/// A client reads nothing for 2.5 s (an HTTP/2 stream granting no window beyond its first 64
/// KiB, or an HTTP/1 client with a small receive buffer) while the origin sends a storable answer
/// (8 MiB at once, then a 64 KiB piece each 150 ms, 3.75 s in all); `server.send_timeout` is 1 s. A
/// write that waited that long fails: the node gives the client up, and when it reads at last it
/// gets no more than a cut body (the fill goes on without it). On the standard path every piece from the origin
/// interrupts the proxy task's write; the wait must not start over each time, or `send_timeout`
/// never applies while an origin keeps sending. HTTP/1 proxy tasks keep their deadline across
/// interruptions (Pingora's body task keeps its timer); HTTP/2 ones must too.
async fn a_client_reading_nothing_is_given_up_at_send_timeout(direct: bool, h2: bool) {
    // a first piece larger than the socket buffers between the node and the client, so that
    // the write waits at once; then 64 KiB pieces
    let mut pieces = vec![Bytes::from(vec![b'w'; 8 << 20])];
    pieces.extend(std::iter::repeat_n(Bytes::from(vec![b'w'; 64 << 10]), 25));
    let origin = TestOrigin::start(move |_req| {
        OriginResponse::ok(Body::Paced {
            chunks: pieces.clone(),
            interval: Duration::from_millis(150),
        })
        .header("Cache-Control", "max-age=60")
    });
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n\
             [server]\nsend_timeout = \"1s\"\n{ROOMY}"
        ),
    );
    let path = "/trickle";
    let got = if h2 {
        let (sender, driver) = h2_connect_wide(lacquer.addr()).await;
        let (response, _stream) = h2_request(&sender, "GET", &lacquer.url(path), &[]).await;
        let response = within(BOUND, "the head", response).await.unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        h2_wait_unreleased(&mut body, WINDOW_FILLED, BOUND, "the stalled stream").await;
        // more than twice send_timeout with the window shut, the origin sending all along
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let got = within(BOUND, "the stream's end", h2_read_body(&mut body, None)).await;
        driver.abort();
        got.ok().map(|body| body.len())
    } else {
        let mut client = StallingClient::get(lacquer.addr(), path, "").await;
        assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let answer = within(BOUND, "the answer's end", client.answer(false)).await;
        answer.complete.then_some(answer.body.len())
    };
    if let Some(len) = got {
        panic!("a write that waited 2.5 s (send_timeout 1 s) did not fail: {len} bytes, whole");
    }
}

#[tokio::test]
async fn direct_miss_an_h2_stream_granting_no_window_is_given_up_at_send_timeout() {
    a_client_reading_nothing_is_given_up_at_send_timeout(true, true).await;
}

#[tokio::test]
async fn standard_miss_an_h2_stream_granting_no_window_is_given_up_at_send_timeout() {
    a_client_reading_nothing_is_given_up_at_send_timeout(false, true).await;
}

#[tokio::test]
async fn direct_miss_an_h1_client_reading_nothing_is_given_up_at_send_timeout() {
    a_client_reading_nothing_is_given_up_at_send_timeout(true, false).await;
}

#[tokio::test]
async fn standard_miss_an_h1_client_reading_nothing_is_given_up_at_send_timeout() {
    a_client_reading_nothing_is_given_up_at_send_timeout(false, false).await;
}
