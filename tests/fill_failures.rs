//! Failures around a cache fill that goes at the origin's pace while its first client reads
//! nothing (`proxy::fill_relay` on the direct path, Pingora's proxy tasks on the standard path):
//!
//! 1. the memcached tier freezes (SIGSTOP) during such a fill, or before it starts, and a
//!    second client's lookup in the frozen tier straddles the moment the fill starts;
//! 2. the origin hangs mid-body (half the body, then silence on an open connection);
//! 3. SIGTERM while such a fill is held by a stalled client;
//! 4. a SIGQUIT hand-over (`--upgrade`) while such a fill is held by a stalled client.
//!
//! Each case runs on both paths (`proxy.direct_misses` on and off) and checks what every client
//! gets over real sockets: the exact page, or an error or a cut body, never a cut body reported
//! complete and never the wrong bytes; that nothing cut is stored; and that nothing hangs. A
//! client that reads nothing keeps a write waiting for `server.send_timeout`, here ten minutes:
//! only a fill held by it (or a drain waiting for it) would exceed the bounds below, which are
//! tens of seconds. Timings are measured and printed (`--nocapture`), never asserted finer than
//! those bounds.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use support::*;

/// Longer than any case takes when nothing hangs, far shorter than `server.send_timeout`.
const BOUND: Duration = Duration::from_secs(40);

/// The host every request names (the memcached key of a page depends on it).
const HOST: &str = "fills.example";

const MIB: usize = 1 << 20;

/// A large page: far more than the socket buffers between the node and a client that reads
/// nothing.
const BIG_LEN: usize = 24 << 20;

/// A small page, answered at once.
const SMALL_LEN: usize = 64 << 10;

/// `[cache]` with room for the large pages.
const ROOMY: &str = "[cache]\nmax_object_size = \"64MiB\"\n";

/// What a node's config holds besides `listen`, `upstream` and `threads`.
#[derive(Default)]
struct Setup<'a> {
    /// Top-level keys (`shutdown_timeout`).
    top: &'a str,
    /// More `[proxy]` keys.
    proxy: &'a str,
    /// More `[server]` keys.
    server: &'a str,
    /// Further sections.
    extra: &'a str,
}

/// A node in front of `origin` with direct misses on or off, writes to a client that reads
/// nothing waiting ten minutes, no access log, and `setup`.
fn node(origin: SocketAddr, direct: bool, setup: Setup) -> LacquerProcess {
    let Setup {
        top,
        proxy,
        server,
        extra,
    } = setup;
    LacquerProcess::start_simple(
        origin,
        &format!(
            "{top}[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n{proxy}\
             [server]\nsend_timeout = \"10m\"\n{server}{extra}"
        ),
    )
}

/// The seed of the generated page at `path`: its last byte.
fn seed_of(path: &str) -> u8 {
    *path.as_bytes().last().unwrap()
}

/// An answer read by an HTTP/1 client is the whole page, or a cut one that says so: a `200` whose
/// body, reported complete, is the page; or, cut (the connection ended before the framing's end),
/// the page's first bytes. Returns whether it was whole.
fn assert_whole_or_cut(answer: &StallingAnswer, len: usize, seed: u8, what: &str) -> bool {
    if answer.status == 0 {
        // the connection ended before any head: an error, not a wrong page
        assert!(answer.body.is_empty());
        return false;
    }
    assert_eq!(answer.status, 200, "{what}: {}", answer.head);
    if answer.complete {
        assert_generated_page(
            &answer.body,
            len,
            seed,
            &format!("{what}, reported complete"),
        );
        return true;
    }
    assert!(
        answer.body.len() < len,
        "{what}: {} bytes of a {len}-byte page reported cut",
        answer.body.len()
    );
    assert_eq!(
        generated_mismatch(&answer.body, seed, 0),
        None,
        "{what}: the cut body is not the page's beginning"
    );
    false
}

/// `GET path` with `Host: HOST` on a fresh reqwest client (transport errors returned).
async fn try_get_page(node: &LacquerProcess, path: &str) -> Result<Resp, reqwest::Error> {
    try_get(&node.url(path), &[("host", HOST)]).await
}

/// `GET path` that must be answered `200` with the generated page of `len` bytes, within
/// [`BOUND`]; returns the response.
async fn get_whole(node: &LacquerProcess, path: &str, len: usize, what: &str) -> Resp {
    get_page_of(node, path, len, seed_of(path), what).await
}

/// [`get_whole`] of a page generated with `seed`.
async fn get_page_of(node: &LacquerProcess, path: &str, len: usize, seed: u8, what: &str) -> Resp {
    let resp = within(BOUND, what, try_get_page(node, path))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    assert_eq!(resp.status, 200, "{what}: {}", resp.text());
    assert_generated_page(&resp.body, len, seed, what);
    resp
}

// --- origins -----------------------------------------------------------------------------------

/// An origin whose paths starting with `/big` or `/slow-head` are a storable generated page of
/// [`BIG_LEN`] bytes (seed: the path's last byte), sent in 1 MiB pieces `interval` apart, with its
/// `Content-Length` when `sized` and chunked otherwise (the `/slow-head` ones [`HEAD_DELAY`]
/// after the request), and whose other paths are a storable page of [`SMALL_LEN`] bytes, at
/// once.
fn site_origin(interval: Duration, sized: bool) -> TestOrigin {
    TestOrigin::start(move |req| {
        let path = req.path_only();
        let seed = seed_of(path);
        let answer = if path.starts_with("/big") || path.starts_with("/slow-head") {
            let chunks = generated_bytes(BIG_LEN, seed)
                .chunks(MIB)
                .map(Bytes::copy_from_slice)
                .collect();
            let answer = OriginResponse::ok(Body::Paced { chunks, interval });
            let answer = if sized {
                answer.header("Content-Length", BIG_LEN.to_string())
            } else {
                answer
            };
            if path.starts_with("/slow-head") {
                answer.delay(HEAD_DELAY)
            } else {
                answer
            }
        } else {
            OriginResponse::ok(Body::Generated {
                len: SMALL_LEN,
                seed,
            })
        };
        answer
            .header("Cache-Control", "max-age=60")
            .header("Content-Type", "application/octet-stream")
    })
}

const HANG_LEN: usize = 16 << 20;
const HANG_CUT: usize = 8 << 20;
/// How long the hanging origin keeps its first connection open, sending nothing, unless the node
/// closes it first or the test releases it: far longer than [`BOUND`].
const HANG_FOR: Duration = Duration::from_secs(300);

/// What a [`hanging_origin`] has seen.
#[derive(Default)]
struct HangLog {
    /// When the first answer's half body had been sent.
    half_sent: Option<Instant>,
    /// When the node closed that connection (it gave up on the body).
    closed_by_node: Option<Instant>,
}

/// An origin whose first answer announces a storable page of [`HANG_LEN`] bytes (seed 3), with
/// a `Content-Length` when `sized` and chunked otherwise, sends its first [`HANG_CUT`] bytes, and
/// then sends nothing more on the open connection, until the node closes it, `release` is set, or
/// [`HANG_FOR`] has passed. Every later answer is the whole page. Returns the origin, its log and
/// the release flag.
fn hanging_origin(sized: bool) -> (RawOrigin, Arc<Mutex<HangLog>>, Arc<AtomicBool>) {
    let answered = AtomicUsize::new(0);
    let page = Arc::new(generated_bytes(HANG_LEN, 3));
    let log = Arc::new(Mutex::new(HangLog::default()));
    let release = Arc::new(AtomicBool::new(false));
    let (seen, released) = (log.clone(), release.clone());
    let origin = RawOrigin::answering(move |_head, stream| {
        let first = answered.fetch_add(1, Ordering::SeqCst) == 0;
        let framing = if sized {
            format!("Content-Length: {HANG_LEN}")
        } else {
            "Transfer-Encoding: chunked".to_string()
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\n{framing}\r\nCache-Control: max-age=60\r\n\
             Content-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
        );
        let _ = stream.write_all(head.as_bytes());
        let body = if first { &page[..HANG_CUT] } else { &page[..] };
        if sized {
            let _ = stream.write_all(body);
        } else {
            for piece in body.chunks(64 << 10) {
                let _ = write!(stream, "{:x}\r\n", piece.len());
                let _ = stream.write_all(piece);
                let _ = stream.write_all(b"\r\n");
            }
            if !first {
                let _ = stream.write_all(b"0\r\n\r\n");
            }
        }
        let _ = stream.flush();
        if !first {
            return;
        }
        seen.lock().unwrap().half_sent = Some(Instant::now());
        // silence on an open connection, watching for the node to close it
        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
        let until = Instant::now() + HANG_FOR;
        let mut scratch = [0u8; 1024];
        while !released.load(Ordering::SeqCst) && Instant::now() < until {
            match stream.read(&mut scratch) {
                Ok(0) => {
                    seen.lock().unwrap().closed_by_node = Some(Instant::now());
                    return;
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => {
                    seen.lock().unwrap().closed_by_node = Some(Instant::now());
                    return;
                }
            }
        }
    });
    (origin, log, release)
}

/// Waits until the hanging origin has sent its half body; returns when it had.
async fn half_sent(log: &Mutex<HangLog>) -> Instant {
    assert!(
        poll_until_async(BOUND, || log.lock().unwrap().half_sent.is_some()).await,
        "the origin never got the first request"
    );
    log.lock().unwrap().half_sent.unwrap()
}

/// Waits (at most [`BOUND`]) until the node has exited; returns how long after `since`, or
/// fails naming `what`.
async fn exits(node: &mut LacquerProcess, since: Instant, what: &str) -> Duration {
    let exited = poll_until_async(BOUND, || node.exit_status().is_some()).await;
    assert!(
        exited,
        "{what}: the process still runs {BOUND:?} later; stderr:\n{}",
        node.stderr_log()
    );
    let took = since.elapsed();
    let status = node.exit_status().unwrap();
    assert!(
        status.success(),
        "{what}: {status:?}; stderr:\n{}",
        node.stderr_log()
    );
    took
}

// --- 1. a frozen memcached tier ----------------------------------------------------------------

/// When memcached freezes.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Freeze {
    /// Before the first client's miss: its own lookups and fill lease find it frozen.
    BeforeTheMiss,
    /// Once the first client's fill has started: the second client's lookups, and the fill's
    /// write to memcached when it completes, find it frozen.
    DuringTheFill,
}

/// `[cache]` with room for the large pages, over `memcached` (ejected servers tried again after
/// 1 s, a 100 ms connect timeout, as the shared-tier tests have it), with `op_timeout`, then
/// `more` keys of `[cache.memcached]`.
fn tier_toml(memcached: &MemcachedProcess, op_timeout: &str, more: &str) -> String {
    format!(
        "{ROOMY}[cache.memcached]\nservers = [\"{}\"]\nretry_after = \"1s\"\n\
         op_timeout = \"{op_timeout}\"\nconnect_timeout = \"100ms\"\n{more}",
        memcached.addr_string()
    )
}

/// A node over `memcached` ([`tier_toml`]), with an admin listener; returns it with its admin
/// port.
fn node_over(
    origin: SocketAddr,
    direct: bool,
    memcached: &MemcachedProcess,
    op_timeout: &str,
    more: &str,
) -> (LacquerProcess, u16) {
    LacquerProcess::start_simple_with_admin(
        origin,
        &format!(
            "[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n\
             [server]\nsend_timeout = \"10m\"\n{}",
            tier_toml(memcached, op_timeout, more)
        ),
    )
}

/// Checks that the node stores in `memcached`: a small page asked once reaches it.
async fn tier_in_use(node: &LacquerProcess, memcached: &MemcachedProcess) {
    get_whole(node, "/small0", SMALL_LEN, "a first small page").await;
    let key = MemcachedCluster::key_of(HOST, "/small0");
    assert!(
        poll_until_async(BOUND, || memcached.holds(&key)).await,
        "the first small page never reached memcached"
    );
}

/// Waits until the node has a fill in flight in its memory tier.
async fn fill_started(admin: u16) {
    let started = async {
        while scrape(admin).await.value("lacquer_memory_fills_in_flight") < 1.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    within(BOUND, "the first client's fill", started).await;
}

/// A node over one memcached server. A client asks for a large miss (its body paced over about
/// 2.4 s) and reads nothing; memcached is SIGSTOPped, before the miss or once its fill has
/// started; a second client asks for the page once the fill has started, and must get it
/// whole, streamed from the one fill, within [`BOUND`] (not after the first client's
/// `send_timeout`). Meanwhile a small miss, a small stored page and the large page again are
/// answered whole. Nobody gets a 5xx because of memcached. The first client, reading at last,
/// gets the page whole. Once memcached is resumed (SIGCONT), the node serves, and stores in
/// memcached again.
async fn frozen_memcached_during_a_stalled_fill(direct: bool, freeze: Freeze) {
    let origin = site_origin(Duration::from_millis(100), true);
    let mut memcached = MemcachedProcess::start();
    let (lacquer, admin) = node_over(origin.addr(), direct, &memcached, "200ms", "");
    let addr = lacquer.addr();
    tier_in_use(&lacquer, &memcached).await;

    if freeze == Freeze::BeforeTheMiss {
        memcached.freeze();
    }
    let path = "/big1";
    let mut stalled = StallingClient::stalled(addr, HOST, path).await;
    fill_started(admin).await;
    if freeze == Freeze::DuringTheFill {
        memcached.freeze();
    }
    let frozen_at = Instant::now();

    // a second client of the page: whole, from the one fill, without waiting for the first
    let follower = get_whole(
        &lacquer,
        path,
        BIG_LEN,
        "the second client's page (memcached frozen, the first client reading nothing)",
    )
    .await;
    let follower_took = frozen_at.elapsed();
    assert_eq!(
        origin.hits_for(path),
        1,
        "the second client streamed the one fill"
    );
    // other clients meanwhile: a miss, the page stored before the freeze, the large page again
    get_whole(&lacquer, "/small2", SMALL_LEN, "a miss while frozen").await;
    get_whole(&lacquer, "/small0", SMALL_LEN, "a stored page while frozen").await;
    get_whole(
        &lacquer,
        path,
        BIG_LEN,
        "the large page again, while frozen",
    )
    .await;
    assert_eq!(origin.hits_for(path), 1, "the large page was stored");

    // the first client, reading at last: the whole page
    let answer = within(BOUND, "the first client's answer", stalled.answer(false)).await;
    assert!(
        answer.complete,
        "the first client's answer was cut after {} bytes ({})",
        answer.body.len(),
        answer.head
    );
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert_generated_page(
        &answer.body,
        BIG_LEN,
        seed_of(path),
        "the first client's page",
    );

    memcached.thaw();
    assert!(memcached.is_running());
    // the node keeps serving, and stores in memcached again (once its retry_after has passed
    // and its connections recovered): new pages, each asked once, until one is found there
    let mut stored_again = false;
    let deadline = Instant::now() + BOUND;
    let mut i = 0;
    while !stored_again && Instant::now() < deadline {
        i += 1;
        let after = format!("/after{i}");
        get_whole(&lacquer, &after, SMALL_LEN, "a page after the thaw").await;
        let key = MemcachedCluster::key_of(HOST, &after);
        stored_again = poll_until_async(Duration::from_secs(1), || memcached.holds(&key)).await;
    }
    assert!(
        stored_again,
        "after the thaw, no page reached memcached again"
    );
    let again = get_whole(&lacquer, path, BIG_LEN, "the large page after the thaw").await;
    lacquer.assert_no_panic();
    eprintln!(
        "frozen memcached ({freeze:?}, direct_misses = {direct}): the second client's whole page \
         {follower_took:?} after the freeze ({:?}); the large page after the thaw: {:?}; {i} \
         page(s) after the thaw until one reached memcached; {} memcached timeouts",
        follower.cache_status(),
        again.cache_status(),
        scrape(admin).await.value(&format!(
            "lacquer_memcached_server_timeouts_total{{server=\"{}\"}}",
            memcached.addr_string()
        ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_memcached_frozen_during_a_stalled_fill() {
    frozen_memcached_during_a_stalled_fill(true, Freeze::DuringTheFill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_memcached_frozen_during_a_stalled_fill() {
    frozen_memcached_during_a_stalled_fill(false, Freeze::DuringTheFill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_memcached_frozen_before_a_stalled_fill() {
    frozen_memcached_during_a_stalled_fill(true, Freeze::BeforeTheMiss).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_memcached_frozen_before_a_stalled_fill() {
    frozen_memcached_during_a_stalled_fill(false, Freeze::BeforeTheMiss).await;
}

/// The origin's head for `/slow-head` pages comes this long after their request.
const HEAD_DELAY: Duration = Duration::from_millis(300);

/// With memcached frozen (a 1 s operation timeout here), a client asks for a large page, whose
/// origin answers 300 ms after the request (a page rendered), and reads nothing. A second client
/// asks just after the origin got the first request: the fill has not started, the first
/// request holds the URL's cache lock. The second client must stream the first one's fill (as
/// the cache lock makes it do, and as the fast path's `Filling` check means to), not fetch the
/// page a second time.
///
/// Found by this test (direct path): the second client's fast path looked in memory first
/// (nothing yet, no fill in flight), then in memcached, which cost it the whole `op_timeout`,
/// and the fill lease is skipped for a failing server, so the request became a `Pass::Miss`.
/// Meanwhile the first request's fill had started and its cache lock was let go, so the second
/// request got the lock: a second origin fetch and a second fill of the same URL. A direct miss
/// now looks in the memory tier again once it holds the lock (`direct_pass::forward_pass`,
/// `FastHit::stored_or_filling`) and leaves a URL stored or filling meanwhile to the standard
/// path, which streams the fill, as the reference does.
async fn follower_slowed_by_a_frozen_memcached(direct: bool) {
    let origin = site_origin(Duration::from_millis(100), true);
    let memcached = MemcachedProcess::start();
    let (lacquer, admin) = node_over(
        origin.addr(),
        direct,
        &memcached,
        "1s",
        "failure_limit = 100\n",
    );
    let addr = lacquer.addr();
    tier_in_use(&lacquer, &memcached).await;
    memcached.freeze();

    let path = "/slow-head1";
    let mut stalled = StallingClient::stalled(addr, HOST, path).await;
    assert!(
        poll_until_async(BOUND, || origin.heads_for(path) >= 1).await,
        "the origin never got the first client's miss"
    );
    let follower = get_whole(&lacquer, path, BIG_LEN, "the second client's page").await;
    let fetches = origin.hits_for(path);
    let answer = within(BOUND, "the first client's answer", stalled.answer(false)).await;
    memcached.thaw();
    assert!(answer.complete && answer.status == 200, "{}", answer.head);
    assert_generated_page(
        &answer.body,
        BIG_LEN,
        seed_of(path),
        "the first client's page",
    );
    let stored = get_whole(&lacquer, path, BIG_LEN, "the stored page").await;
    assert!(stored.is_hit(), "{:?}", stored.cache_status());
    eprintln!(
        "a second client slowed by a frozen memcached (direct_misses = {direct}): {fetches} \
         origin fetch(es); the second client's Cache-Status {:?}; {} direct misses in all",
        follower.cache_status(),
        scrape(admin).await.value("lacquer_direct_misses_total")
    );
    assert_eq!(
        fetches,
        1,
        "the second client fetched the page again instead of streaming the first one's fill \
         (its Cache-Status {:?})",
        follower.cache_status()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_a_second_client_slowed_by_a_frozen_memcached_streams_the_fill() {
    follower_slowed_by_a_frozen_memcached(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_a_second_client_slowed_by_a_frozen_memcached_streams_the_fill() {
    follower_slowed_by_a_frozen_memcached(false).await;
}

// --- 2. the origin hangs mid-body --------------------------------------------------------------

/// A client asks for a large miss and reads nothing; the origin sends half the body and then
/// nothing, keeping the connection open (for minutes); `proxy.read_timeout` is 2 s. A second
/// client, asking while the origin is silent, streams the fill: it must get an error or a cut
/// body, never one reported complete, and its answer must end (the node gives up on the origin
/// at its read timeout, not when the first client's write gives up ten minutes later, nor
/// never). The first client, reading at last, gets a cut answer. Nothing cut is stored: once
/// the origin answers whole again, the next request fetches the whole page, and the one after
/// is a hit. And the node closes the origin's connection once it has given up on it, while the
/// first client still reads nothing.
///
/// Found by this test (direct path, the last check): the origin's connection stayed open,
/// unread, until the first client's request ended (when it read, or at `server.send_timeout`),
/// not at the read timeout as on the standard path: `fill_relay`'s reader gave up on the origin
/// and abandoned the fill at once, but the origin session is lent to the relay until both its
/// halves end, and the writer waited for the client that reads nothing. The reader now shuts
/// the origin's socket down when it gives up. (A fill that completes keeps its origin
/// connection out of the pool until the slow client has its answer too, on both paths: a
/// request meanwhile opens another connection.)
async fn origin_hangs_while_the_first_client_stalls(direct: bool, sized: bool) {
    let (origin, log, release) = hanging_origin(sized);
    let lacquer = node(
        origin.addr,
        direct,
        Setup {
            proxy: "read_timeout = \"2s\"\n",
            extra: ROOMY,
            ..Setup::default()
        },
    );
    let addr = lacquer.addr();
    let path = "/hanging";
    let mut stalled = StallingClient::stalled(addr, HOST, path).await;
    let half = half_sent(&log).await;

    let mut follower = StallingClient::eager(addr, HOST, path).await;
    let answer = within(
        BOUND,
        "the second client's answer (the node never gave up on the silent origin)",
        follower.answer(false),
    )
    .await;
    let follower_ended = half.elapsed();
    let whole = if answer.status >= 500 {
        // an error answer (the fill had failed and its own fetch failed too): not a wrong page
        false
    } else {
        assert_whole_or_cut(&answer, HANG_LEN, 3, "the second client's answer")
    };
    assert!(
        !whole || origin.heads().len() >= 2,
        "the second client got the whole page though the origin sent half of it once"
    );
    // the node closes the connection it gave up on (ten times the read timeout allowed)
    let closed_in_time = poll_until_async(Duration::from_secs(20), || {
        log.lock().unwrap().closed_by_node.is_some()
    })
    .await;

    // the first client, reading at last: cut (nothing more will come)
    let first = within(BOUND, "the first client's answer", stalled.answer(false)).await;
    first.assert_cut_start(3, HANG_CUT, "the first client's answer");
    let first_done = Instant::now();
    assert!(
        poll_until_async(BOUND, || log.lock().unwrap().closed_by_node.is_some()).await,
        "the node never closed the silent origin's connection"
    );
    let closed = log.lock().unwrap().closed_by_node.unwrap();

    // the origin recovers: nothing cut was stored, the next request fetches the whole page
    release.store(true, Ordering::SeqCst);
    let fetches = origin.heads().len();
    let next = get_page_of(&lacquer, path, HANG_LEN, 3, "the next request").await;
    assert_eq!(
        origin.heads().len(),
        fetches + usize::from(!whole),
        "the next request was answered from a stored cut page, or fetched when it was stored"
    );
    let after = get_page_of(&lacquer, path, HANG_LEN, 3, "the request after").await;
    assert!(
        after.is_hit(),
        "the whole page is stored once fetched whole: {:?}",
        after.cache_status()
    );
    let closed_when = if closed < first_done {
        format!("{:?} after the origin went silent", closed - half)
    } else {
        "only when the first client's request ended".to_string()
    };
    eprintln!(
        "origin hanging mid-body (direct_misses = {direct}, sized = {sized}): the second \
         client's answer (status {}, {} bytes, complete {}) ended {follower_ended:?} after the \
         origin went silent; the node closed the origin's connection {closed_when}; the next \
         request: {:?}",
        answer.status,
        answer.body.len(),
        answer.complete,
        next.cache_status()
    );
    assert!(
        closed_in_time,
        "the node kept the silent origin's connection open past its read timeout, for as long \
         as the first client read nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_origin_hanging_mid_body_while_the_first_client_stalls() {
    origin_hangs_while_the_first_client_stalls(true, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_origin_hanging_mid_body_while_the_first_client_stalls() {
    origin_hangs_while_the_first_client_stalls(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_chunked_origin_hanging_mid_body_while_the_first_client_stalls() {
    origin_hangs_while_the_first_client_stalls(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_chunked_origin_hanging_mid_body_while_the_first_client_stalls() {
    origin_hangs_while_the_first_client_stalls(false, false).await;
}

// --- 3. SIGTERM while a stalled client holds a fill ---------------------------------------------

/// The drain's limit in these cases.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);
const SHUTDOWN: &str = "shutdown_timeout = \"3s\"\n";

/// How long past `shutdown_timeout` a drain may take before it counts as a hang.
const EXIT_MARGIN: Duration = Duration::from_secs(20);

/// How quickly the origin sends the page in the SIGTERM cases.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Pace {
    /// 24 MiB with its `Content-Length` over about 2.4 s: within `shutdown_timeout`.
    Quick,
    /// 24 MiB chunked over about 6 s: past `shutdown_timeout`.
    Slow,
}

/// A client asks for a large miss and reads nothing; a second client streams the fill and has
/// its head; SIGTERM. The process must exit within `shutdown_timeout` (3 s) and a margin, though
/// a client that reads nothing holds a request for ten minutes (`send_timeout`). The second
/// client gets the page whole or a cut body, never a wrong one, nor a cut one reported complete
/// (a chunked body cut by the exit must not end with a last chunk); the first one too, when it
/// reads.
async fn sigterm_while_a_stalled_client_holds_a_fill(direct: bool, pace: Pace) {
    let origin = match pace {
        Pace::Quick => site_origin(Duration::from_millis(100), true),
        Pace::Slow => site_origin(Duration::from_millis(250), false),
    };
    let mut lacquer = node(
        origin.addr(),
        direct,
        Setup {
            top: SHUTDOWN,
            extra: ROOMY,
            ..Setup::default()
        },
    );
    let addr = lacquer.addr();
    let path = "/big3";
    let mut stalled = StallingClient::stalled(addr, HOST, path).await;
    assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
    let (has_head, head_seen) = tokio::sync::oneshot::channel();
    let follower = tokio::spawn(async move {
        let mut client = StallingClient::eager(addr, HOST, path).await;
        let _ = has_head.send(client.until_head().await);
        client.answer(false).await
    });
    assert!(
        within(BOUND, "the second client's head", head_seen)
            .await
            .unwrap(),
        "the second client's connection ended before its head"
    );
    let signalled = Instant::now();
    assert!(lacquer.signal("TERM"));
    let took = exits(&mut lacquer, signalled, "SIGTERM with a stalled client").await;
    assert!(
        took < SHUTDOWN_TIMEOUT + EXIT_MARGIN,
        "the drain took {took:?} (shutdown_timeout {SHUTDOWN_TIMEOUT:?})"
    );
    let answer = within(BOUND, "the second client's answer", follower)
        .await
        .unwrap();
    let whole = assert_whole_or_cut(&answer, BIG_LEN, seed_of(path), "the second client");
    let first = within(BOUND, "the first client's answer", stalled.answer(false)).await;
    let first_whole = assert_whole_or_cut(&first, BIG_LEN, seed_of(path), "the first client");
    let log = lacquer.stderr_log();
    eprintln!(
        "SIGTERM with a stalled client and a second one streaming ({pace:?}, direct_misses = \
         {direct}): exited {took:?} after the signal (shutdown_timeout {SHUTDOWN_TIMEOUT:?}); \
         the second client's page {} ({} bytes), the first client's {} ({} bytes); the drain {}",
        if whole { "whole" } else { "cut" },
        answer.body.len(),
        if first_whole { "whole" } else { "cut" },
        first.body.len(),
        drain_end(&log)
    );
}

/// How the drain ended, as the node's log says.
fn drain_end(log: &str) -> &'static str {
    if log.contains("shutdown_timeout") {
        "reached shutdown_timeout"
    } else if log.contains("drained after") {
        "drained every request"
    } else {
        "logged neither end"
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_sigterm_while_a_stalled_client_holds_a_fill() {
    sigterm_while_a_stalled_client_holds_a_fill(true, Pace::Quick).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_sigterm_while_a_stalled_client_holds_a_fill() {
    sigterm_while_a_stalled_client_holds_a_fill(false, Pace::Quick).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_sigterm_while_a_stalled_client_holds_a_slow_chunked_fill() {
    sigterm_while_a_stalled_client_holds_a_fill(true, Pace::Slow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_sigterm_while_a_stalled_client_holds_a_slow_chunked_fill() {
    sigterm_while_a_stalled_client_holds_a_fill(false, Pace::Slow).await;
}

/// A fill whose only client reads nothing, from an origin that went silent mid-body (the
/// default `proxy.read_timeout`, 60 s): SIGTERM. The drain must not wait for the origin's read
/// timeout, nor for the client's `send_timeout`: the process exits within `shutdown_timeout`
/// (3 s) and a margin (20 s, under the 60 s read timeout). The client, reading what reached it,
/// finds a cut answer.
async fn sigterm_while_the_only_client_of_a_silent_fill_stalls(direct: bool) {
    let (origin, log, _release) = hanging_origin(true);
    let mut lacquer = node(
        origin.addr,
        direct,
        Setup {
            top: SHUTDOWN,
            extra: ROOMY,
            ..Setup::default()
        },
    );
    let path = "/silent";
    let mut stalled = StallingClient::stalled(lacquer.addr(), HOST, path).await;
    half_sent(&log).await;
    let signalled = Instant::now();
    assert!(lacquer.signal("TERM"));
    let took = exits(&mut lacquer, signalled, "SIGTERM with a silent fill").await;
    assert!(
        took < SHUTDOWN_TIMEOUT + EXIT_MARGIN,
        "the drain took {took:?} (shutdown_timeout {SHUTDOWN_TIMEOUT:?}, read_timeout 60 s)"
    );
    let answer = within(BOUND, "the client's answer", stalled.answer(false)).await;
    // no bound on its length: how much the client had been sent before the drain ended
    answer.assert_cut_start(3, usize::MAX, "the client's answer");
    let stderr = lacquer.stderr_log();
    eprintln!(
        "SIGTERM with a silent fill whose only client stalls (direct_misses = {direct}): exited \
         {took:?} after the signal (shutdown_timeout {SHUTDOWN_TIMEOUT:?}, read_timeout 60 s); \
         the drain {}; the client got {} bytes, cut",
        drain_end(&stderr),
        answer.body.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_sigterm_while_the_only_client_of_a_silent_fill_stalls() {
    sigterm_while_the_only_client_of_a_silent_fill_stalls(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_sigterm_while_the_only_client_of_a_silent_fill_stalls() {
    sigterm_while_the_only_client_of_a_silent_fill_stalls(false).await;
}

// --- 4. a hand-over while a stalled client holds a fill -----------------------------------------

/// A client asks for a large miss (its body paced over about 4.8 s) and reads nothing; the
/// node hands its listeners over to a new process (`--upgrade`, SIGQUIT). A client asking
/// meanwhile gets the page whole, from whichever process accepts it; the old process exits
/// within its five seconds of accepting beside the new one, `shutdown_timeout` (3 s) and a
/// margin; the new process then serves the page whole, and stores it. The first client gets it
/// whole or cut when it reads, never wrong.
async fn hand_over_while_a_stalled_client_holds_a_fill(direct: bool) {
    let origin = site_origin(Duration::from_millis(200), true);
    let dir = TempDir::new("fill-failures-upgrade");
    let sock = dir.path().join("upgrade.sock");
    let server = format!("upgrade_sock = \"{}\"\n", sock.display());
    let mut old = node(
        origin.addr(),
        direct,
        Setup {
            top: SHUTDOWN,
            server: &server,
            extra: ROOMY,
            ..Setup::default()
        },
    );
    let addr = old.addr();
    let path = "/big4";
    let mut stalled = StallingClient::stalled(addr, HOST, path).await;
    assert!(poll_until_async(BOUND, || origin.heads_for(path) >= 1).await);
    let started = Instant::now();
    let successor = tokio::task::block_in_place(|| old.hand_over(&sock));
    let handed_over = started.elapsed();
    let during = get_whole(&old, path, BIG_LEN, "the page during the hand-over").await;
    let took = exits(&mut old, started, "the old process after the hand-over").await;
    assert!(
        took < Duration::from_secs(5) + SHUTDOWN_TIMEOUT + EXIT_MARGIN,
        "the old process took {took:?} to exit after the hand-over"
    );
    let from_new = get_whole(&successor, path, BIG_LEN, "the new process's page").await;
    let stored = get_whole(&successor, path, BIG_LEN, "the new process's page again").await;
    assert!(
        stored.is_hit(),
        "the new process stored the page: {:?}",
        stored.cache_status()
    );
    let first = within(BOUND, "the first client's answer", stalled.answer(false)).await;
    let first_whole = assert_whole_or_cut(&first, BIG_LEN, seed_of(path), "the first client");
    eprintln!(
        "hand-over with a stalled fill (direct_misses = {direct}): handed over in \
         {handed_over:?}; the old process exited {took:?} after the hand-over began; the page \
         during it: {:?}, from the new process: {:?}; the first client's page {} ({} bytes); \
         {} origin fetches",
        during.cache_status(),
        from_new.cache_status(),
        if first_whole { "whole" } else { "cut" },
        first.body.len(),
        origin.hits_for(path)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_miss_hand_over_while_a_stalled_client_holds_a_fill() {
    hand_over_while_a_stalled_client_holds_a_fill(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_miss_hand_over_while_a_stalled_client_holds_a_fill() {
    hand_over_while_a_stalled_client_holds_a_fill(false).await;
}
