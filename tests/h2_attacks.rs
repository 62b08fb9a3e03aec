//! HTTP/2 clients that attack, or just fail, the way real ones do, against a real Lacquer
//! process over real sockets.
//!
//! Since pingora-core 0021 an HTTP/2 connection's streams are no longer a task each: every
//! stream's processing runs inside the connection's own task (`serve_downstream_sessions`), and
//! since pingora-core 0020 the head of an HTTP/2 answer is moved into its frame (the session keeps
//! the status only, and looks for the HTTP/1 connection-specific fields before removing them).
//! Both change what one stream can do to its neighbours, and what a client sees. These tests try
//! to make one stream hold up the others of its connection (flow control held shut, a stalled
//! upload, a hundred streams on a hanging origin), to make the proxy do work nobody waits for
//! (rapid resets, resets while the origin prepares its answer, dropped connections, GOAWAY), to
//! get an HTTP/1 connection-specific field through to an HTTP/2 client (which must treat it as a
//! protocol error), to cut streams at SIGTERM, and to make the access log lose the status the
//! session no longer keeps a whole head for.
//!
//! The origin is [`AttackOrigin`], a socket-level HTTP/1.1 server whose paths hold requests
//! until released (and count those the proxy gives up), trickle a body, or answer with fields
//! HTTP/2 forbids; the clients are the `h2` crate used directly (windows, resets, settings) and,
//! for a GOAWAY sent with streams in flight, which that crate never sends, [`RawH2`], a few
//! frames written by hand.
//!
//! Two problems were found and fixed. A fast-path HTTP/1.1 hit of a page the origin sent chunked
//! was framed by both `Transfer-Encoding` and `Content-Length`
//! (`an_http1_hit_of_a_chunked_answer_is_framed_one_way_only`). A client that starts a large
//! miss and never opens its window stalled the cache fill for every other client of the page,
//! without limit (on both miss paths, not introduced by 0021): first for `server.send_timeout`
//! at most, now not at all (`a_*_miss_fill_goes_on_without_a_client_that_never_reads`).

use lacquer_test_support as support;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::*;

/// The size of the large page (`/big...`).
const BIG: usize = 1024 * 1024;
/// The seed of its generated body.
const BIG_SEED: u8 = 7;
/// The size of each half of a `/slow...` page's body.
const SLOW_HALF: usize = 128 * 1024;
/// The seed of its generated body.
const SLOW_SEED: u8 = 9;
/// How long anything may take before only a hang would explain it.
const BOUND: Duration = Duration::from_secs(20);

/// What the attack origin's connections share: counters, and the requests let go.
#[derive(Default)]
struct OriginState {
    /// `/held` requests received.
    held: AtomicUsize,
    /// `/held` requests whose connection the proxy closed before they were answered.
    abandoned: AtomicUsize,
    /// Every held request is let go.
    release_all: AtomicBool,
    /// The held (and slow) requests let go, by path.
    released: Mutex<HashSet<String>>,
    /// `/upload` bodies received whole: (path, length).
    uploads: Mutex<Vec<(String, usize)>>,
    /// `/upload` requests whose connection was closed before their body was whole.
    uploads_cut: AtomicUsize,
}

impl OriginState {
    fn is_released(&self, path: &str) -> bool {
        self.release_all.load(Ordering::SeqCst) || self.released.lock().unwrap().contains(path)
    }
}

/// An HTTP/1.1 origin that answers by path (one request per connection, then `Connection:
/// close`):
/// * `/held...`: answered only once released (see [`AttackOrigin::release`]), or never if the
///   proxy closes the connection first (counted as abandoned); `max-age=600`, or `no-store` when
///   the path contains `nostore`;
/// * `/slow...`: `max-age=600`, `Content-Length` of two halves; the first half at once, the
///   second once the path is released;
/// * `/big...`: a 1 MiB generated body, `max-age=600`;
/// * `/hop...`: a chunked `max-age=600` answer carrying every HTTP/1 connection-specific field;
/// * `/missing...`: `404`, `max-age=600`;
/// * `/nostore...`: `no-store`;
/// * `/upload...`: reads the request body (`Content-Length` or chunked) and answers `got N`,
///   `no-store`;
/// * anything else: `page <path>`, `max-age=600`, `ETag: "v1"`.
struct AttackOrigin {
    raw: RawOrigin,
    state: Arc<OriginState>,
}

impl AttackOrigin {
    fn start() -> AttackOrigin {
        let state = Arc::new(OriginState::default());
        let shared = state.clone();
        let raw = RawOrigin::answering(move |head, stream| serve(&shared, head, stream));
        AttackOrigin { raw, state }
    }

    fn addr(&self) -> SocketAddr {
        self.raw.addr
    }

    fn held(&self) -> usize {
        self.state.held.load(Ordering::SeqCst)
    }

    fn abandoned(&self) -> usize {
        self.state.abandoned.load(Ordering::SeqCst)
    }

    fn release(&self, path: &str) {
        self.state.released.lock().unwrap().insert(path.to_string());
    }

    fn release_all(&self) {
        self.state.release_all.store(true, Ordering::SeqCst);
    }

    /// Request heads received for exactly `path`.
    fn heads_for(&self, path: &str) -> usize {
        self.raw
            .heads()
            .iter()
            .filter(|head| head.split_whitespace().nth(1) == Some(path))
            .count()
    }
}

/// A fixed-length answer.
fn answer(status: &str, fields: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{fields}\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The attack origin's answer to one request.
fn serve(state: &OriginState, head: &str, stream: &mut TcpStream) {
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let out = if path.starts_with("/held") {
        state.held.fetch_add(1, Ordering::SeqCst);
        if !hold(state, &path, stream) {
            state.abandoned.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let cc = if path.contains("nostore") {
            "no-store"
        } else {
            "max-age=600"
        };
        answer(
            "200 OK",
            &format!("Cache-Control: {cc}\r\n"),
            format!("page {path}").as_bytes(),
        )
    } else if path.starts_with("/slow") {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=600\r\nConnection: close\r\n\r\n",
            2 * SLOW_HALF
        );
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(&generated_range(0, SLOW_HALF, SLOW_SEED));
        let _ = stream.flush();
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !state.is_released(&path) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = stream.write_all(&generated_range(SLOW_HALF, SLOW_HALF, SLOW_SEED));
        let _ = stream.flush();
        return;
    } else if path.starts_with("/big") {
        answer(
            "200 OK",
            "Cache-Control: max-age=600\r\n",
            &generated_bytes(BIG, BIG_SEED),
        )
    } else if path.starts_with("/hop") {
        // every field HTTP/2 forbids (RFC 9113 §8.2.2), some twice, around a chunked body
        let mut out = b"HTTP/1.1 200 OK\r\n\
            Cache-Control: max-age=600\r\n\
            ETag: \"hop\"\r\n\
            Connection: close, X-Secret\r\n\
            Connection: keep-alive\r\n\
            X-Secret: nominated by Connection\r\n\
            Keep-Alive: timeout=5, max=100\r\n\
            Keep-Alive: timeout=6\r\n\
            Proxy-Connection: keep-alive\r\n\
            Upgrade: h2c, websocket\r\n\
            TE: trailers, gzip\r\n\
            X-Kept: yes\r\n\
            Transfer-Encoding: chunked\r\n\r\n"
            .to_vec();
        for piece in HOP_BODY {
            out.extend_from_slice(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes());
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    } else if path.starts_with("/missing") {
        answer(
            "404 Not Found",
            "Cache-Control: max-age=600\r\n",
            b"no such page",
        )
    } else if path.starts_with("/nostore") {
        answer(
            "200 OK",
            "Cache-Control: no-store\r\n",
            format!("private {path}").as_bytes(),
        )
    } else if path.starts_with("/upload") {
        match read_upload(head, stream) {
            Some(n) => {
                state.uploads.lock().unwrap().push((path.clone(), n));
                answer(
                    "200 OK",
                    "Cache-Control: no-store\r\n",
                    format!("got {n}").as_bytes(),
                )
            }
            None => {
                state.uploads_cut.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
    } else {
        answer(
            "200 OK",
            "Cache-Control: max-age=600\r\nETag: \"v1\"\r\n",
            format!("page {path}").as_bytes(),
        )
    };
    let _ = stream.write_all(&out);
    let _ = stream.flush();
}

/// The `/hop` page's body, in the chunks the origin sends.
const HOP_BODY: [&str; 3] = [
    "first chunk, ",
    "HTTP/1.1 200 OK\r\nX-Smuggled: 1\r\n\r\n",
    "end",
];

/// Waits until `path` is released (true) or the proxy closes the connection (false), for 30 s
/// at most.
fn hold(state: &OriginState, path: &str, stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let mut byte = [0u8; 64];
    while !state.is_released(path) && std::time::Instant::now() < until {
        if let Ok(0) = stream.read(&mut byte) {
            return false;
        }
    }
    true
}

/// Reads the body of the request whose head (with what was read past it) is `head`; its
/// length, or `None` when the connection closed (or 30 s passed) before it was whole.
fn read_upload(head: &str, stream: &mut TcpStream) -> Option<usize> {
    let (fields, rest) = head.split_once("\r\n\r\n")?;
    let fields = fields.to_ascii_lowercase();
    let length = fields
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let mut body = rest.as_bytes().to_vec();
    stream
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let mut buf = [0u8; 16 * 1024];
    loop {
        match length {
            Some(n) if body.len() >= n => return Some(n),
            None => {
                if let Some(n) = chunked_length(&body) {
                    return Some(n);
                }
            }
            _ => {}
        }
        if std::time::Instant::now() > until {
            return None;
        }
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => body.extend_from_slice(&buf[..n]),
            Err(_) => continue,
        }
    }
}

/// The length of a chunked body when `data` holds all of it.
fn chunked_length(data: &[u8]) -> Option<usize> {
    let mut at = 0;
    let mut total = 0;
    loop {
        let line_end = at + data[at..].windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[at..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        at = line_end + 2;
        if size == 0 {
            // no trailers expected: the empty line ends the body
            return (data.len() >= at + 2).then_some(total);
        }
        if data.len() < at + size + 2 {
            return None;
        }
        total += size;
        at += size + 2;
    }
}

/// Waits until `done`, for [`BOUND`] at most.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    assert!(
        poll_until_async(BOUND, done).await,
        "never happened within {BOUND:?}: {what}"
    );
}

fn no_access_log(origin: &AttackOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

/// Asserts `body` is the whole `/big` page.
fn assert_big(body: &[u8], what: &str) {
    assert_generated_page(body, BIG, BIG_SEED, what);
}

/// One stream's window held shut (its client reads nothing of a 1 MiB hit, so the proxy stops
/// once it has sent the stream's 64 KiB): the other streams of its connection, a hit, a miss,
/// a pass, and a HEAD and a GET of the very same page, are all answered meanwhile; the stalled one then
/// gets its page whole once it reads.
#[tokio::test]
async fn a_stream_whose_window_stays_shut_holds_up_no_other_stream() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let big = lacquer.url("/big/window");
    let cached = lacquer.url("/cached/window");
    let (warm, warm_driver) = h2_connect_default(lacquer.addr()).await;
    assert_big(&h2_get(&warm, &big, BOUND).await.body, "the first /big");
    assert_eq!(h2_get(&warm, &cached, BOUND).await.status, 200);
    warm_driver.abort();

    // a connection window large enough that one stalled stream cannot shut it
    let mut builder = h2::client::Builder::new();
    builder.initial_connection_window_size(16 << 20);
    let (sender, driver) = h2_connect_with(lacquer.addr(), &builder).await;
    let mut ready = sender.clone().ready().await.unwrap();
    let (stalled, _) = ready
        .send_request(h2_request_head("GET", &big, &[]), true)
        .unwrap();
    let stalled = within(BOUND, "the stalled hit's head", stalled)
        .await
        .unwrap();
    assert_eq!(stalled.status(), 200);
    let mut stalled = stalled.into_body();
    // the proxy has filled the stream's window and waits for more
    h2_wait_unreleased(&mut stalled, 65_535, BOUND, "the stalled stream").await;
    assert!(!stalled.is_end_stream());

    let hit = h2_get(&sender, &cached, BOUND).await;
    assert_eq!(
        (hit.status, hit.text()),
        (200, "page /cached/window".into())
    );
    let miss = h2_get(&sender, &lacquer.url("/miss/window"), BOUND).await;
    assert_eq!(
        (miss.status, miss.text()),
        (200, "page /miss/window".into())
    );
    let pass = h2_get(&sender, &lacquer.url("/nostore/window"), BOUND).await;
    assert_eq!(
        (pass.status, pass.text()),
        (200, "private /nostore/window".into())
    );
    let head = within(
        BOUND,
        "HEAD of the stalled page",
        h2_fetch(&sender, "HEAD", &big, &[]),
    )
    .await
    .unwrap();
    assert_eq!((head.status, head.body.len()), (200, 0));
    let other_big = h2_get(&sender, &big, BOUND).await;
    assert_big(&other_big.body, "a second stream of the stalled page");

    let body = within(
        BOUND,
        "the stalled stream, read at last",
        h2_read_body(&mut stalled, None),
    )
    .await
    .unwrap();
    assert_big(&body, "the stalled stream");
    assert_eq!(origin.heads_for("/big/window"), 1);
    driver.abort();
}

/// The connection's window held shut (the h2 default of 64 KiB for the whole connection, all
/// of it taken by a 1 MiB hit its client does not read): no stream can get a byte of body, but
/// HEADERS are not flow-controlled, so answers without a body (a HEAD, a 304) still come whole
/// and a GET still gets its head. Once the stalled stream is cancelled (its unread bytes give
/// the connection its window back), the waiting GET's body comes too, and the connection goes
/// on serving.
#[tokio::test]
async fn a_connection_window_held_shut_still_gets_heads_and_bodiless_answers() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let big = lacquer.url("/big/connection");
    let cached = lacquer.url("/cached/connection");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    assert_big(&h2_get(&sender, &big, BOUND).await.body, "the first /big");
    assert_eq!(h2_get(&sender, &cached, BOUND).await.status, 200);

    let mut ready = sender.clone().ready().await.unwrap();
    let (stalled, _) = ready
        .send_request(h2_request_head("GET", &big, &[]), true)
        .unwrap();
    let mut stalled = within(BOUND, "the stalled hit's head", stalled)
        .await
        .unwrap()
        .into_body();
    h2_wait_unreleased(&mut stalled, 65_535, BOUND, "the stalled stream").await;

    let head = within(BOUND, "a HEAD", h2_fetch(&sender, "HEAD", &cached, &[]))
        .await
        .unwrap();
    assert_eq!((head.status, head.body.len()), (200, 0));
    let validated = within(
        BOUND,
        "a conditional GET",
        h2_fetch(&sender, "GET", &cached, &[("if-none-match", "\"v1\"")]),
    )
    .await
    .unwrap();
    assert_eq!((validated.status, validated.body.len()), (304, 0));
    // a GET gets its head; its body cannot come while the window is shut
    let mut ready = sender.clone().ready().await.unwrap();
    let (waiting, _) = ready
        .send_request(h2_request_head("GET", &cached, &[]), true)
        .unwrap();
    let waiting = within(BOUND, "the head of a GET behind the shut window", waiting)
        .await
        .unwrap();
    assert_eq!(waiting.status(), 200);

    drop(stalled);
    let mut waiting = waiting.into_body();
    let body = within(
        BOUND,
        "the body, once the window opened",
        h2_read_body(&mut waiting, None),
    )
    .await
    .unwrap();
    assert_eq!(body, b"page /cached/connection");
    assert_big(&h2_get(&sender, &big, BOUND).await.body, "/big afterwards");
    assert_eq!(origin.heads_for("/big/connection"), 1);
    driver.abort();
}

/// What a client that opens no window at all (`SETTINGS_INITIAL_WINDOW_SIZE` 0) does to a
/// large miss it starts. Another client asking for the same page, on another connection, must
/// still get it, the page must be stored, and the stalled stream is cut after
/// `server.send_timeout` (2 s here).
///
/// Found by this file: the fill advanced only as fast as the client that started it read, and
/// an h2 client that never opens its window never reads; nothing timed the stalled write out,
/// so every other client of the page, whatever its protocol, got the head and the first bytes of
/// the fill and then nothing, for as long as the attacker kept its connection open (one
/// connection and one request per URL, after each purge or expiry). A write timeout toward
/// clients (`server.send_timeout`) bounded that; now the fill does not wait for the stream at
/// all, on the direct path (`src/proxy/fill_relay.rs`) and on the standard path (Pingora's
/// proxy tasks; HTTP/2: vendored pingora-core 0022): the others get the page at once
/// (`direct_miss_attacks.rs` section 10 checks that with a 10-minute timeout).
async fn a_fill_started_by_a_client_that_never_reads(direct_misses: bool) {
    let origin = AttackOrigin::start();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"off\"\n[server]\nsend_timeout = \"2s\"\n\
             [proxy]\ndirect_misses = {direct_misses}\n"
        ),
    );
    let big = lacquer.url("/big/fill");
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    let (attacker, attacker_driver) = h2_connect_with(lacquer.addr(), &builder).await;
    let mut ready = attacker.clone().ready().await.unwrap();
    let (stalled, _) = ready
        .send_request(h2_request_head("GET", &big, &[]), true)
        .unwrap();
    let stalled = within(BOUND, "the stalled miss's head", stalled)
        .await
        .unwrap();
    assert_eq!(stalled.status(), 200);
    assert_eq!(origin.heads_for("/big/fill"), 1);

    let (other, other_driver) = h2_connect_default(lacquer.addr()).await;
    let answer = h2_get(&other, &big, BOUND).await;
    assert_big(&answer.body, "another client's /big");
    let by_h1 = within(BOUND, "an HTTP/1.1 client's /big", get(&big, &[])).await;
    assert_big(&by_h1.body, "an HTTP/1.1 client's /big");
    // the stalled stream was cut (it can never have had its body), the page stored whole
    let mut stalled = stalled.into_body();
    let cut = within(
        BOUND,
        "the stalled stream's end",
        h2_read_body(&mut stalled, None),
    )
    .await;
    assert!(cut.is_err(), "the stalled stream was not cut");
    let again = within(BOUND, "a later /big", get(&big, &[])).await;
    assert!(again.is_hit(), "{:?}", again.cache_status());
    assert_big(&again.body, "a later /big");
    assert_eq!(origin.heads_for("/big/fill"), 1);
    attacker_driver.abort();
    other_driver.abort();
}

#[tokio::test]
async fn a_direct_miss_fill_goes_on_without_a_client_that_never_reads() {
    a_fill_started_by_a_client_that_never_reads(true).await;
}

#[tokio::test]
async fn a_standard_miss_fill_goes_on_without_a_client_that_never_reads() {
    a_fill_started_by_a_client_that_never_reads(false).await;
}

/// One client flooding the proxy with streams it resets at once, the CVE-2023-44487 pattern.
/// Returns how many streams it opened (fewer than asked if the proxy sent it away first).
async fn rapid_reset(addr: SocketAddr, url: String, streams: usize) -> usize {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let Ok((mut h2, connection)) = h2::client::handshake(tcp).await else {
        return 0;
    };
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut opened = 0;
    for _ in 0..streams {
        h2 = match h2.ready().await {
            Ok(h2) => h2,
            Err(_) => break,
        };
        match h2.send_request(h2_request_head("GET", &url, &[]), true) {
            Ok((response, mut stream)) => {
                stream.send_reset(h2::Reason::CANCEL);
                drop(response);
                opened += 1;
            }
            Err(_) => break,
        }
    }
    // let the last frames leave before the connection is dropped
    tokio::task::yield_now().await;
    driver.abort();
    opened
}

/// Sixteen connections at once, each opening 500 streams and resetting each as soon as it is
/// sent, half for a cached page and half for a page the proxy knows is uncacheable: the proxy
/// stays up and serves a well-behaved connection throughout; the cached page costs the origin
/// nothing; and the uncached one never costs it more requests than streams were opened (a
/// cancelled request is not retried). The counts are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rapid_reset_flood_leaves_the_proxy_serving_and_the_origin_alone() {
    const CONNECTIONS: usize = 16;
    const STREAMS: usize = 500;
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let (cached, uncached) = ("/cached/flood", "/nostore/flood");
    let (cached_url, uncached_url) = (lacquer.url(cached), lacquer.url(uncached));
    let (clean, clean_driver) = h2_connect_default(lacquer.addr()).await;
    assert_eq!(h2_get(&clean, &cached_url, BOUND).await.status, 200);
    // asked once, the uncached page is remembered as such: later requests are passes
    assert_eq!(h2_get(&clean, &uncached_url, BOUND).await.status, 200);
    assert_eq!(h2_get(&clean, &uncached_url, BOUND).await.status, 200);
    let uncached_before = origin.heads_for(uncached);

    let floods: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let url = match c % 2 {
                0 => cached_url.clone(),
                _ => uncached_url.clone(),
            };
            tokio::spawn(rapid_reset(lacquer.addr(), url, STREAMS))
        })
        .collect();
    // a well-behaved client, during the flood, on its old connection and on a new one
    let during = h2_get(&clean, &cached_url, BOUND).await;
    assert_eq!(
        (during.status, during.text()),
        (200, "page /cached/flood".into())
    );
    let (fresh, fresh_driver) = h2_connect_default(lacquer.addr()).await;
    assert_eq!(h2_get(&fresh, &uncached_url, BOUND).await.status, 200);
    let mut opened = [0, 0];
    for (c, flood) in floods.into_iter().enumerate() {
        opened[c % 2] += within(BOUND, "a flooding client", flood).await.unwrap();
    }
    assert!(opened[0] > 0 && opened[1] > 0, "no stream was opened");

    let after = h2_get(&clean, &cached_url, BOUND).await;
    assert_eq!(
        (after.status, after.text()),
        (200, "page /cached/flood".into())
    );
    let miss = h2_get(&fresh, &lacquer.url("/miss/after-flood"), BOUND).await;
    assert_eq!(miss.status, 200);
    assert_eq!(
        origin.heads_for(cached),
        1,
        "a reset request for the cached page reached the origin"
    );
    // less the well-behaved client's own pass during the flood
    let uncached_reached = origin.heads_for(uncached) - uncached_before - 1;
    eprintln!(
        "rapid reset: {} streams opened for the cached page, {} for the uncached one; \
         {uncached_reached} of those reached the origin",
        opened[0], opened[1]
    );
    assert!(
        uncached_reached <= opened[1],
        "{uncached_reached} origin requests for {} reset streams",
        opened[1]
    );
    clean_driver.abort();
    fresh_driver.abort();
}

/// A connection with as many streams as the proxy allows (`SETTINGS_MAX_CONCURRENT_STREAMS`
/// 100), every one waiting on a hanging origin: another connection is served meanwhile; the
/// 101st request waits in the client until a stream ends and is then answered; and when the
/// client drops the connection, each of the 99 origin requests still waiting is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_streams_on_a_hanging_origin_then_the_client_leaves() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let cached = lacquer.url("/cached/hundred");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    assert_eq!(h2_get(&sender, &cached, BOUND).await.status, 200);
    assert_eq!(sender.current_max_send_streams(), 100);

    let mut held = Vec::new();
    for i in 0..100 {
        let sender = sender.clone();
        let url = lacquer.url(&format!("/held/{i}"));
        held.push(tokio::spawn(async move {
            h2_fetch(&sender, "GET", &url, &[]).await
        }));
    }
    wait_until("the origin got the 100 held requests", || {
        origin.held() == 100
    })
    .await;
    let extra_sender = sender.clone();
    let extra_url = cached.clone();
    let extra = tokio::spawn(async move { h2_fetch(&extra_sender, "GET", &extra_url, &[]).await });

    let (other, other_driver) = h2_connect_default(lacquer.addr()).await;
    let answer = h2_get(&other, &cached, BOUND).await;
    assert_eq!(
        (answer.status, answer.text()),
        (200, "page /cached/hundred".into())
    );
    assert!(
        !extra.is_finished(),
        "a 101st stream was answered while 100 were open"
    );

    origin.release("/held/0");
    let first = within(BOUND, "the released stream", held.remove(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.status, first.text()), (200, "page /held/0".into()));
    let extra = within(BOUND, "the 101st stream", extra)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (extra.status, extra.text()),
        (200, "page /cached/hundred".into())
    );

    driver.abort();
    drop(sender);
    for request in &held {
        request.abort();
    }
    wait_until("the proxy gave up the 99 origin requests", || {
        origin.abandoned() == 99
    })
    .await;
    assert_eq!(origin.held(), 100);
    let answer = h2_get(&other, &lacquer.url("/miss/hundred"), BOUND).await;
    assert_eq!(answer.status, 200);
    other_driver.abort();
}

/// Starts a POST of `total` bytes to `url` and sends its first `sent` bytes; `sized` says
/// whether it announces its length.
async fn start_upload(
    sender: &h2::client::SendRequest<Bytes>,
    url: &str,
    total: usize,
    sent: usize,
    sized: bool,
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let length = total.to_string();
    let fields: &[(&str, &str)] = match sized {
        true => &[("content-length", &length)],
        false => &[],
    };
    let mut ready = sender.clone().ready().await.unwrap();
    let (response, mut body) = ready
        .send_request(h2_request_head("POST", url, fields), false)
        .unwrap();
    body.send_data(Bytes::from(vec![b'x'; sent]), sent == total)
        .unwrap();
    (response, body)
}

/// Uploads stalled in the middle of their bodies, one with a `Content-Length` (small enough
/// that the proxy reads it whole before forwarding it) and one without (forwarded chunked as it
/// comes): the other streams of the connection, a hit, a miss and a whole upload, are answered
/// meanwhile; the stalled ones are answered once their bodies end, the origin getting each
/// whole. An upload stalled and then reset is given up: the origin sees its connection close.
#[tokio::test]
async fn an_upload_stalled_mid_body_holds_up_no_other_stream() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let cached = lacquer.url("/cached/upload");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    assert_eq!(h2_get(&sender, &cached, BOUND).await.status, 200);

    let (sized, mut sized_body) =
        start_upload(&sender, &lacquer.url("/upload/sized"), 5000, 1000, true).await;
    let (streamed, mut streamed_body) =
        start_upload(&sender, &lacquer.url("/upload/streamed"), 5000, 1000, false).await;
    let (cut, mut cut_body) =
        start_upload(&sender, &lacquer.url("/upload/cut"), 5000, 1000, false).await;
    wait_until("the origin got the streamed uploads' heads", || {
        origin.heads_for("/upload/streamed") == 1 && origin.heads_for("/upload/cut") == 1
    })
    .await;

    let hit = h2_get(&sender, &cached, BOUND).await;
    assert_eq!(
        (hit.status, hit.text()),
        (200, "page /cached/upload".into())
    );
    let miss = h2_get(&sender, &lacquer.url("/miss/upload"), BOUND).await;
    assert_eq!(
        (miss.status, miss.text()),
        (200, "page /miss/upload".into())
    );
    let (whole, _) = start_upload(&sender, &lacquer.url("/upload/whole"), 300, 300, true).await;
    let whole = within(BOUND, "a whole upload", h2_read_answer(whole, None))
        .await
        .unwrap();
    assert_eq!((whole.status, whole.text()), (200, "got 300".into()));

    cut_body.send_reset(h2::Reason::CANCEL);
    drop(cut);
    wait_until("the origin saw the reset upload given up", || {
        origin.state.uploads_cut.load(Ordering::SeqCst) == 1
    })
    .await;

    sized_body
        .send_data(Bytes::from(vec![b'x'; 4000]), true)
        .unwrap();
    streamed_body
        .send_data(Bytes::from(vec![b'x'; 4000]), true)
        .unwrap();
    let sized = within(BOUND, "the sized upload", h2_read_answer(sized, None))
        .await
        .unwrap();
    assert_eq!((sized.status, sized.text()), (200, "got 5000".into()));
    let streamed = within(BOUND, "the streamed upload", h2_read_answer(streamed, None))
        .await
        .unwrap();
    assert_eq!((streamed.status, streamed.text()), (200, "got 5000".into()));
    let mut uploads = origin.state.uploads.lock().unwrap().clone();
    uploads.sort();
    assert_eq!(
        uploads,
        vec![
            ("/upload/sized".to_string(), 5000),
            ("/upload/streamed".to_string(), 5000),
            ("/upload/whole".to_string(), 300),
        ]
    );
    assert_eq!(origin.heads_for("/upload/sized"), 1);
    driver.abort();
}

/// Checks an answer of the `/hop` page: the body whole, the forbidden fields gone.
fn assert_hop_answer(status: u16, fields: &[(String, String)], body: &[u8], what: &str) {
    assert_eq!(status, 200, "{what}");
    assert_eq!(body, HOP_BODY.concat().as_bytes(), "{what}: body");
    // an HTTP/1.1 answer carries the proxy's own `Connection` (the request asked to close)
    let connection: Vec<&str> = fields
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .map(|(_, value)| value.as_str())
        .collect();
    assert!(
        connection.is_empty() || connection == ["close"],
        "{what}: the origin's Connection in {fields:?}"
    );
    for forbidden in [
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
        "x-secret",
    ] {
        assert!(
            !fields
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case(forbidden)),
            "{what}: {forbidden} in {fields:?}"
        );
    }
    assert!(
        fields
            .iter()
            .any(|(name, value)| name.eq_ignore_ascii_case("x-kept") && value == "yes"),
        "{what}: x-kept lost: {fields:?}"
    );
}

/// An h2 answer's fields as (name, value) pairs.
fn h2_fields(answer: &H2Answer) -> Vec<(String, String)> {
    answer
        .fields
        .iter()
        .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
        .collect()
}

/// `GET path` over HTTP/1.1 (with the `Host` an h2 client's `:authority` gives, so the cache key
/// is the same) read to the connection's close; the one answer there must be.
/// A GET of `url` over h2 on `sender` (`fields` added), checked as [`assert_hop_answer`] does.
async fn h2_hop_answer(
    sender: &h2::client::SendRequest<Bytes>,
    url: &str,
    fields: &[(&str, &str)],
    what: &str,
) -> H2Answer {
    let answer = within(BOUND, what, h2_fetch(sender, "GET", url, fields))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    assert_hop_answer(answer.status, &h2_fields(&answer), &answer.body, what);
    answer
}

/// A GET of `path` over HTTP/1.1 ([`h1_get`]), checked as [`assert_hop_answer`] does.
fn h1_hop_answer(lacquer: &LacquerProcess, path: &str, what: &str) -> RawResponse {
    let answer = h1_get(lacquer, path);
    assert_hop_answer(answer.status, &answer.headers, &answer.body, what);
    answer
}

fn h1_get(lacquer: &LacquerProcess, path: &str) -> RawResponse {
    let ask = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
        lacquer.port()
    );
    let data = raw_request(lacquer.addr(), ask.as_bytes());
    let answers = parse_responses(&data, false);
    assert_eq!(
        answers.len(),
        1,
        "GET {path}: {}",
        String::from_utf8_lossy(&data)
    );
    answers.into_iter().next().unwrap()
}

/// The framing fields of an HTTP/1.1 answer: there must be one (RFC 9112 §6.2: "A sender MUST
/// NOT send a Content-Length header field in any message that contains a Transfer-Encoding
/// header field").
fn framing_fields(answer: &RawResponse) -> Vec<(String, String)> {
    answer
        .headers
        .iter()
        .filter(|(name, _)| {
            name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding")
        })
        .cloned()
        .collect()
}

/// An origin answer carrying every HTTP/1 connection-specific field (`Connection`, twice and
/// nominating another field, `Keep-Alive` twice, `Proxy-Connection`, `Upgrade`, `TE`,
/// `Transfer-Encoding: chunked`), its body holding something that looks like a response head:
/// an h2 client (the h2 crate rejects any such field as malformed) gets a valid answer with the
/// body intact, on the miss (direct or standard), on the hit (fast or standard path) and for a
/// HEAD, whether an HTTP/1.1 client asked for the page first or not; the HTTP/1.1 client gets the page whole without those fields either
/// (its framing: [`an_http1_hit_of_a_chunked_answer_is_framed_one_way_only`]).
#[tokio::test]
async fn connection_specific_fields_from_the_origin_never_reach_an_h2_client() {
    for direct_misses in [true, false] {
        let origin = AttackOrigin::start();
        let lacquer = LacquerProcess::start_simple(
            origin.addr(),
            &format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct_misses}\n"),
        );
        let (sender, driver) = h2_connect_default(lacquer.addr()).await;
        let config = format!("direct_misses = {direct_misses}");

        // h2 first (miss, hit, a hit on the standard path, HEAD), then HTTP/1.1 (hit)
        let url = lacquer.url("/hop/h2-first");
        let standard_hit: &[(&str, &str)] = &[("cache-control", "max-stale=5")];
        for (what, fields) in [
            ("h2 miss", &[][..]),
            ("h2 hit", &[][..]),
            ("h2 standard-path hit", standard_hit),
        ] {
            let what = format!("{config}: {what}");
            let answer = h2_hop_answer(&sender, &url, fields, &what).await;
            let status = answer
                .fields
                .get("cache-status")
                .map(|v| v.to_str().unwrap());
            assert_eq!(
                status.is_some_and(|s| s.contains("; hit")),
                what.ends_with("hit"),
                "{what}: {status:?}"
            );
        }
        let head = within(BOUND, "h2 HEAD", h2_fetch(&sender, "HEAD", &url, &[]))
            .await
            .unwrap_or_else(|e| panic!("{config}: h2 HEAD: {e:?}"));
        assert_eq!((head.status, head.body.len()), (200, 0));
        h1_hop_answer(
            &lacquer,
            "/hop/h2-first",
            &format!("{config}: HTTP/1.1 hit"),
        );
        assert_eq!(origin.heads_for("/hop/h2-first"), 1, "{config}");

        // HTTP/1.1 first (miss, hit), then h2 (hit)
        for what in ["HTTP/1.1 miss", "HTTP/1.1 hit"] {
            h1_hop_answer(&lacquer, "/hop/h1-first", &format!("{config}: {what}"));
        }
        let url = lacquer.url("/hop/h1-first");
        let what = format!("{config}: h2 hit after HTTP/1.1");
        h2_hop_answer(&sender, &url, &[], &what).await;
        assert_eq!(origin.heads_for("/hop/h1-first"), 1, "{config}");
        driver.abort();
    }
}

/// A page the origin sent chunked, then asked for by HTTP/1.1 clients: every answer must be
/// framed one way only, `Content-Length` or `Transfer-Encoding`, never both (RFC 9112 §6.2).
///
/// Found by this file: a fast-path hit of such a page from the memory tier carried both. The
/// head was stored as the origin sent it, `Transfer-Encoding: chunked` included, and
/// `fast_hit::answer::response_head` added `Content-Length` because the stored head had none;
/// Pingora's HTTP/1 writer then sent the body chunked. RFC 9112 §6.3 tells a recipient such a
/// message "ought to be handled as an error"; one that frames it by `Content-Length` takes the
/// rest of the wire body, which the page's content decides, for the start of the next response
/// on the connection (response splitting). A stored head now drops the origin's transfer
/// framing (`storage::object::drop_transfer_framing`).
#[tokio::test]
async fn an_http1_hit_of_a_chunked_answer_is_framed_one_way_only() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let mut seen = Vec::new();
    for what in ["HTTP/1.1 miss", "HTTP/1.1 hit"] {
        let answer = h1_hop_answer(&lacquer, "/hop/framing-h1", what);
        seen.push((what, framing_fields(&answer)));
    }
    let miss = h2_fetch(&sender, "GET", &lacquer.url("/hop/framing-h2"), &[])
        .await
        .unwrap();
    assert_eq!(miss.status, 200);
    let answer = h1_hop_answer(&lacquer, "/hop/framing-h2", "HTTP/1.1 hit after h2");
    seen.push(("HTTP/1.1 hit after an h2 miss", framing_fields(&answer)));
    for (what, framing) in &seen {
        assert_eq!(
            framing.len(),
            1,
            "{what} framed by {framing:?} (all: {seen:?})"
        );
    }
    driver.abort();
}

/// Streams reset by their client while the origin works on them, on one connection.
/// Before the origin's answer: a pass (a POST) and a miss are both given up, the origin sees
/// their connections closed (`docs/architecture.md`: the client is watched while the origin
/// prepares its answer). In the middle of a cacheable miss's body: the fill goes on ("a client
/// that leaves once the fill has started does not end it"), so the page is then a hit, whole,
/// from one origin request. The connection serves on throughout.
#[tokio::test]
async fn streams_reset_while_the_origin_works_on_them() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;

    let (pass, mut pass_body) =
        start_upload(&sender, &lacquer.url("/held/nostore-post"), 1, 1, true).await;
    let mut ready = sender.clone().ready().await.unwrap();
    let (miss, mut miss_stream) = ready
        .send_request(
            h2_request_head("GET", &lacquer.url("/held/miss"), &[]),
            true,
        )
        .unwrap();
    wait_until("the origin got both held requests", || origin.held() == 2).await;
    pass_body.send_reset(h2::Reason::CANCEL);
    miss_stream.send_reset(h2::Reason::CANCEL);
    drop((pass, miss));
    wait_until("the proxy gave up both origin requests", || {
        origin.abandoned() == 2
    })
    .await;

    let slow = lacquer.url("/slow/reset");
    let mut ready = sender.clone().ready().await.unwrap();
    let (filling, mut filling_stream) = ready
        .send_request(h2_request_head("GET", &slow, &[]), true)
        .unwrap();
    let filling = within(BOUND, "the slow miss's head", filling)
        .await
        .unwrap();
    assert_eq!(filling.status(), 200);
    let mut filling = filling.into_body();
    h2_wait_unreleased(&mut filling, 1, BOUND, "the slow miss").await;
    filling_stream.send_reset(h2::Reason::CANCEL);
    drop(filling);
    let hit = h2_get(&sender, &lacquer.url("/cached/reset"), BOUND).await;
    assert_eq!(hit.status, 200);
    origin.release("/slow/reset");

    let again = h2_get(&sender, &slow, BOUND).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body.len(), 2 * SLOW_HALF);
    assert_eq!(generated_mismatch(&again.body, SLOW_SEED, 0), None);
    assert_eq!(
        origin.heads_for("/slow/reset"),
        1,
        "the fill was given up with its stream"
    );
    driver.abort();
}

/// A minimal HTTP/2 client writing its own frames, for what the h2 crate will not send (a
/// GOAWAY with streams in flight).
struct RawH2 {
    tcp: tokio::net::TcpStream,
    read: Vec<u8>,
}

/// One frame read.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 1;
const END_HEADERS: u8 = 4;

/// An HPACK integer with a 7-bit prefix (RFC 7541 §5.1), the prefix's other bit clear.
fn hpack_length(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128 + 128) as u8);
        n /= 128;
    }
    out.push(n as u8);
}

impl RawH2 {
    async fn connect(addr: SocketAddr) -> RawH2 {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut raw = RawH2 {
            tcp,
            read: Vec::new(),
        };
        raw.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        raw.frame(SETTINGS, 0, 0, &[]).await;
        raw
    }

    async fn write(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.tcp.write_all(bytes).await.unwrap();
    }

    async fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        self.write(&out).await;
    }

    /// A GET of `path`, its header block all literals without indexing.
    async fn get(&mut self, stream: u32, authority: &str, path: &str, end_stream: bool) {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", authority),
            (":path", path),
        ] {
            block.push(0);
            hpack_length(&mut block, name.len());
            block.extend_from_slice(name.as_bytes());
            hpack_length(&mut block, value.len());
            block.extend_from_slice(value.as_bytes());
        }
        let flags = END_HEADERS | if end_stream { END_STREAM } else { 0 };
        self.frame(HEADERS, flags, stream, &block).await;
    }

    async fn goaway(&mut self) {
        let mut payload = 0u32.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u32.to_be_bytes());
        self.frame(GOAWAY, 0, 0, &payload).await;
    }

    /// The next frame, SETTINGS and PINGs acknowledged on the way; `None` once the proxy closed
    /// the connection.
    async fn next(&mut self) -> Option<Frame> {
        use tokio::io::AsyncReadExt;
        loop {
            if self.read.len() >= 9 {
                let length = u32::from_be_bytes([0, self.read[0], self.read[1], self.read[2]]);
                let length = length as usize;
                if self.read.len() >= 9 + length {
                    let frame = Frame {
                        kind: self.read[3],
                        flags: self.read[4],
                        stream: u32::from_be_bytes(self.read[5..9].try_into().unwrap())
                            & 0x7fff_ffff,
                        payload: self.read[9..9 + length].to_vec(),
                    };
                    self.read.drain(..9 + length);
                    match frame.kind {
                        SETTINGS if frame.flags & 1 == 0 => self.frame(SETTINGS, 1, 0, &[]).await,
                        PING if frame.flags & 1 == 0 => {
                            self.frame(PING, 1, 0, &frame.payload).await
                        }
                        _ => {}
                    }
                    return Some(frame);
                }
            }
            let mut buf = [0u8; 16 * 1024];
            match self.tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.read.extend_from_slice(&buf[..n]),
            }
        }
    }
}

/// What the raw client saw of its streams until the proxy closed the connection.
#[derive(Debug, Default)]
struct Seen {
    /// Streams whose answer head was `:status: 200` (HPACK static index 8).
    ok_heads: HashSet<u32>,
    /// Body bytes per stream.
    bodies: std::collections::HashMap<u32, Vec<u8>>,
    /// Streams the proxy ended (END_STREAM).
    ended: HashSet<u32>,
    /// Streams the proxy reset.
    reset: HashSet<u32>,
    /// The proxy's GOAWAY frames: (last stream id, error code).
    goaways: Vec<(u32, u32)>,
}

/// Reads frames until the proxy closes the connection.
async fn read_until_closed(raw: &mut RawH2) -> Seen {
    let mut seen = Seen::default();
    while let Some(frame) = raw.next().await {
        match frame.kind {
            HEADERS if frame.payload.first() == Some(&0x88) => {
                seen.ok_heads.insert(frame.stream);
            }
            DATA => seen
                .bodies
                .entry(frame.stream)
                .or_default()
                .extend_from_slice(&frame.payload),
            RST_STREAM => {
                seen.reset.insert(frame.stream);
            }
            GOAWAY => {
                let word =
                    |at: usize| u32::from_be_bytes(frame.payload[at..at + 4].try_into().unwrap());
                seen.goaways.push((word(0) & 0x7fff_ffff, word(4)));
            }
            _ => {}
        }
        if matches!(frame.kind, HEADERS | DATA) && frame.flags & END_STREAM != 0 {
            seen.ended.insert(frame.stream);
        }
    }
    seen
}

/// A client that sends GOAWAY (it will open no more streams) while three of its streams wait on
/// the origin, one of them a GET whose request stream is still open (the client ends it after
/// the GOAWAY): all are answered whole, then the proxy closes the connection instead of keeping
/// it open.
#[tokio::test]
async fn a_client_goaway_with_streams_in_flight_lets_them_finish() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let authority = format!("127.0.0.1:{}", lacquer.port());
    let mut raw = RawH2::connect(lacquer.addr()).await;
    raw.get(1, &authority, "/held/goaway-1", true).await;
    raw.get(3, &authority, "/held/goaway-3", true).await;
    // a GET whose request stream stays open: forwarded (uncached) with the body it may have
    raw.get(5, &authority, "/held/goaway-5", false).await;
    wait_until("the origin got the three held requests", || {
        origin.held() == 3
    })
    .await;
    raw.goaway().await;
    raw.frame(DATA, END_STREAM, 5, &[]).await;
    origin.release_all();
    let seen = within(
        BOUND,
        "the proxy closing the connection",
        read_until_closed(&mut raw),
    )
    .await;
    for (stream, path) in [
        (1, "/held/goaway-1"),
        (3, "/held/goaway-3"),
        (5, "/held/goaway-5"),
    ] {
        assert!(seen.ok_heads.contains(&stream), "stream {stream}: {seen:?}");
        assert!(seen.ended.contains(&stream), "stream {stream}: {seen:?}");
        assert_eq!(
            seen.bodies
                .get(&stream)
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            Some(format!("page {path}")),
            "stream {stream}: {seen:?}"
        );
    }
    assert!(seen.reset.is_empty(), "{seen:?}");
    assert_eq!(origin.abandoned(), 0);
}

/// SIGTERM while an h2 connection has streams waiting on the origin and another h2 connection
/// sits idle: the idle one is closed at once (GOAWAY, then the close: it holds nothing up),
/// the process keeps running for the waiting streams, which are answered whole once the origin
/// lets them go, and it then exits cleanly, well before `shutdown_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_waiting_h2_streams_finish_and_closes_idle_connections() {
    let origin = AttackOrigin::start();
    let mut node = LacquerProcess::start_simple(
        origin.addr(),
        "shutdown_timeout = \"120s\"\ngrace_period = \"1s\"\n[log]\naccess = \"off\"\n",
    );
    let (idle, idle_driver) = h2_connect_default(node.addr()).await;
    assert_eq!(
        h2_get(&idle, &node.url("/cached/term"), BOUND).await.status,
        200
    );
    let (busy, busy_driver) = h2_connect_default(node.addr()).await;
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let busy = busy.clone();
            let url = node.url(&format!("/held/term-{i}"));
            tokio::spawn(async move { h2_fetch(&busy, "GET", &url, &[]).await })
        })
        .collect();
    wait_until("the origin got the three held requests", || {
        origin.held() == 3
    })
    .await;

    assert!(node.signal("TERM"));
    within(
        BOUND,
        "the idle h2 connection closed by the proxy",
        idle_driver,
    )
    .await
    .unwrap();
    assert!(
        node.is_running(),
        "the process exited with h2 streams in flight"
    );
    origin.release_all();
    for (i, answer) in waiting.into_iter().enumerate() {
        let answer = within(BOUND, "a waiting stream", answer)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("stream {i} cut at SIGTERM: {e:?}"));
        assert_eq!(
            (answer.status, answer.text()),
            (200, format!("page /held/term-{i}"))
        );
    }
    let status = node.wait_exit(BOUND);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; stderr:\n{}",
        node.stderr_log()
    );
    assert_eq!(origin.abandoned(), 0);
    drop((idle, busy));
    busy_driver.abort();
}

/// A request the access-log test makes: method, path, request fields, and the status, body
/// length and cache word it expects.
type Asked<'a> = (
    &'a str,
    &'a str,
    &'a [(&'a str, &'a str)],
    u16,
    usize,
    &'a str,
);

/// The access log of an h2 connection's answers (the session keeps only the status of an h2
/// answer since pingora-core 0020, and the log reads that): a miss, a hit, a 304, a 404 miss and
/// hit, a HEAD, a pass and a 1 MiB hit, each with its status, `HTTP/2.0` and its body bytes.
/// Each is logged with its path (`:path`), as an HTTP/1 request line carries it and as nginx
/// logs it, not with the absolute form Pingora builds the request head in
/// (`http://authority/path`), which it was logged with before.
#[tokio::test]
async fn the_access_log_records_each_h2_answer_s_status() {
    let origin = AttackOrigin::start();
    let dir = TempDir::new("h2-attacks-log");
    let log_path = dir.path().join("access.log");
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"{}\"\nformat = \"json\"",
            log_path.display()
        ),
    );
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let page = "/cached/log";
    let asked: [Asked; 8] = [
        ("GET", page, &[], 200, 16, "miss"),
        ("GET", page, &[], 200, 16, "hit"),
        ("GET", page, &[("if-none-match", "\"v1\"")], 304, 0, "hit"),
        ("GET", "/missing/log", &[], 404, 12, "miss"),
        ("GET", "/missing/log", &[], 404, 12, "hit"),
        ("HEAD", page, &[], 200, 0, "hit"),
        ("GET", "/nostore/log", &[], 200, 20, "miss"),
        ("GET", "/big/log", &[], 200, BIG, "miss"),
    ];
    for (method, path, fields, status, bytes, _) in &asked {
        let answer = within(
            BOUND,
            path,
            h2_fetch(&sender, method, &lacquer.url(path), fields),
        )
        .await
        .unwrap();
        assert_eq!(
            (answer.status, answer.body.len()),
            (*status, *bytes),
            "{method} {path}"
        );
    }
    let big = h2_get(&sender, &lacquer.url("/big/log"), BOUND).await;
    assert_big(&big.body, "the /big hit");

    let mut lines: Vec<serde_json::Value> = Vec::new();
    let complete = poll_until_async(BOUND, || {
        lines = std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        lines.len() > asked.len()
    })
    .await;
    assert!(complete, "{lines:?}");
    let logged: Vec<(String, String, u64, u64, String)> = lines
        .iter()
        .map(|l| {
            assert_eq!(l["version"], "HTTP/2.0", "{l}");
            (
                l["method"].as_str().unwrap_or("").to_string(),
                l["uri"].as_str().unwrap_or("").to_string(),
                l["status"].as_u64().unwrap_or(0),
                l["bytes"].as_u64().unwrap_or(u64::MAX),
                l["cache"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let mut expected: Vec<(String, String, u64, u64, String)> = asked
        .iter()
        .map(|(method, path, _, status, bytes, cache)| {
            (
                method.to_string(),
                path.to_string(),
                u64::from(*status),
                *bytes as u64,
                cache.to_string(),
            )
        })
        .collect();
    expected.push((
        "GET".into(),
        "/big/log".into(),
        200,
        BIG as u64,
        "hit".into(),
    ));
    let (mut logged_sorted, mut expected_sorted) = (logged.clone(), expected.clone());
    logged_sorted.sort();
    expected_sorted.sort();
    assert_eq!(
        logged_sorted, expected_sorted,
        "logged in order: {logged:?}"
    );
    driver.abort();
}

/// Four connections, each with a hundred streams (misses and passes) the origin holds, every
/// stream then reset by its client: the sessions of a connection, all in its one task, are each
/// given up, so the origin sees all 400 of its connections closed; and each connection, its
/// streams freed, serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_reset_by_the_hundred_while_the_origin_holds_them_are_all_given_up() {
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 100;
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let mut connections = Vec::new();
    let mut streams = Vec::new();
    for c in 0..CONNECTIONS {
        let (sender, driver) = h2_connect_default(lacquer.addr()).await;
        for i in 0..STREAMS {
            let url = lacquer.url(&format!("/held/flood-{c}-{i}"));
            let (response, body) = match i % 2 {
                0 => {
                    let mut ready = sender.clone().ready().await.unwrap();
                    ready
                        .send_request(h2_request_head("GET", &url, &[]), true)
                        .unwrap()
                }
                _ => start_upload(&sender, &url, 1, 1, true).await,
            };
            streams.push((response, body));
        }
        connections.push((sender, driver));
    }
    wait_until("the origin got every held request", || {
        origin.held() == CONNECTIONS * STREAMS
    })
    .await;
    for (_, body) in &mut streams {
        body.send_reset(h2::Reason::CANCEL);
    }
    drop(streams);
    wait_until("the proxy gave up every origin request", || {
        origin.abandoned() == CONNECTIONS * STREAMS
    })
    .await;
    for (c, (sender, driver)) in connections.into_iter().enumerate() {
        let url = lacquer.url(&format!("/cached/flood-{c}"));
        let answer = h2_get(&sender, &url, BOUND).await;
        assert_eq!(
            (answer.status, answer.text()),
            (200, format!("page /cached/flood-{c}"))
        );
        driver.abort();
    }
}

/// `server.h2_idle_timeout` at 1 s, and a connection with two streams in flight for longer: one
/// waiting on the origin, one whose window its client keeps shut. Neither counts as idle: both
/// are answered whole after several idle timeouts have passed; once they end, the connection
/// is idle and the proxy closes it.
#[tokio::test]
async fn the_h2_idle_timeout_spares_streams_in_flight_then_closes_the_connection() {
    let origin = AttackOrigin::start();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[server]\nh2_idle_timeout = \"1s\"\n",
    );
    let big = lacquer.url("/big/idle");
    let mut builder = h2::client::Builder::new();
    builder.initial_connection_window_size(16 << 20);
    let (sender, driver) = h2_connect_with(lacquer.addr(), &builder).await;
    assert_big(&h2_get(&sender, &big, BOUND).await.body, "the first /big");

    let mut ready = sender.clone().ready().await.unwrap();
    let (stalled, _) = ready
        .send_request(h2_request_head("GET", &big, &[]), true)
        .unwrap();
    let mut stalled = within(BOUND, "the stalled hit's head", stalled)
        .await
        .unwrap()
        .into_body();
    h2_wait_unreleased(&mut stalled, 65_535, BOUND, "the stalled stream").await;
    let held_sender = sender.clone();
    let held_url = lacquer.url("/held/idle");
    let held = tokio::spawn(async move { h2_fetch(&held_sender, "GET", &held_url, &[]).await });
    wait_until("the origin got the held request", || origin.held() == 1).await;

    // three idle timeouts, with two streams in flight
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !driver.is_finished(),
        "the connection was closed with streams in flight"
    );
    let body = within(
        BOUND,
        "the stalled stream",
        h2_read_body(&mut stalled, None),
    )
    .await
    .unwrap();
    assert_big(&body, "the stalled stream");
    origin.release_all();
    let answer = within(BOUND, "the held stream", held)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (answer.status, answer.text()),
        (200, "page /held/idle".into())
    );
    drop(stalled);
    // (the client keeps its handle: an h2 client with none left closes the connection itself)
    within(BOUND, "the idle connection closed by the proxy", driver)
        .await
        .unwrap();
    drop(sender);
}

/// A client that drops its whole connection while one stream is in the middle of a cacheable
/// miss's body and another still waits for the origin's answer. The connection's task then
/// drains its sessions with the connection gone: the one waiting is given up (the origin sees
/// its connection closed), the fill goes on to its end, so the page is then a hit, whole, from
/// one origin request.
#[tokio::test]
async fn a_connection_dropped_mid_fill_lets_the_fill_finish_and_gives_up_the_rest() {
    let origin = AttackOrigin::start();
    let lacquer = no_access_log(&origin);
    let slow = lacquer.url("/slow/dropped");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let mut ready = sender.clone().ready().await.unwrap();
    let (filling, _) = ready
        .send_request(h2_request_head("GET", &slow, &[]), true)
        .unwrap();
    let filling = within(BOUND, "the slow miss's head", filling)
        .await
        .unwrap();
    assert_eq!(filling.status(), 200);
    let mut filling = filling.into_body();
    h2_wait_unreleased(&mut filling, 1, BOUND, "the slow miss").await;
    let mut ready = sender.clone().ready().await.unwrap();
    let (waiting, _) = ready
        .send_request(
            h2_request_head("GET", &lacquer.url("/held/dropped"), &[]),
            true,
        )
        .unwrap();
    wait_until("the origin got the held request", || origin.held() == 1).await;

    driver.abort();
    drop((sender, filling, waiting));
    wait_until("the proxy gave up the held request", || {
        origin.abandoned() == 1
    })
    .await;
    origin.release("/slow/dropped");
    let (other, other_driver) = h2_connect_default(lacquer.addr()).await;
    let again = h2_get(&other, &slow, BOUND).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body.len(), 2 * SLOW_HALF);
    assert_eq!(generated_mismatch(&again.body, SLOW_SEED, 0), None);
    assert_eq!(
        origin.heads_for("/slow/dropped"),
        1,
        "the fill was given up with its connection"
    );
    other_driver.abort();
}
