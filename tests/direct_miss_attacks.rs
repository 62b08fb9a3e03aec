//! Attacks on direct misses (`proxy.direct_misses`): what an attacker and a flaky network can do
//! to a plain GET that found nothing stored and went over Lacquer's own exchange, holding the
//! URL's cache lock and streaming its answer into storage. Each case runs over real sockets and,
//! where it says so, against a node with `direct_misses = false` as well: the standard path's
//! answers and what its origin saw are the reference.
//!
//! Timings are never what a case checks, except bounds generous enough that only a hang (a
//! leaked lock waited out for `lock_timeout`) exceeds them.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::*;

const HOST: &str = "shop.example";

/// A node in front of `origin`, with direct misses on or off; returns it and its admin port.
fn node(origin: SocketAddr, direct: bool, extra: &str) -> (LacquerProcess, u16) {
    LacquerProcess::start_simple_with_admin(
        origin,
        &format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n{extra}"),
    )
}

/// `GET path` with `Host: shop.example`.
async fn get_page(lacquer: &LacquerProcess, path: &str) -> Resp {
    get(&lacquer.url(path), &[("host", HOST)]).await
}

/// The body of `chunks` chunks of `size` bytes each, chunk `i` all `b'a' + i % 26`.
fn paced_chunks(chunks: usize, size: usize) -> Vec<Bytes> {
    (0..chunks)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; size]))
        .collect()
}

/// The whole body [`paced_chunks`] makes.
fn paced_body(chunks: usize, size: usize) -> Vec<u8> {
    paced_chunks(chunks, size).concat()
}

/// An origin answering every request with a storable body of `chunks` chunks of `size` bytes
/// (tagged `paced`): the first one a chunk every `interval_ms`, the later ones at once.
fn paced_origin(chunks: usize, size: usize, interval_ms: u64) -> TestOrigin {
    let served = AtomicUsize::new(0);
    TestOrigin::start(move |_| {
        let first = served.fetch_add(1, Ordering::SeqCst) == 0;
        let interval = Duration::from_millis(if first { interval_ms } else { 0 });
        OriginResponse::ok(Body::Paced {
            chunks: paced_chunks(chunks, size),
            interval,
        })
        .header("Cache-Control", "max-age=60")
        .header("Surrogate-Key", "paced")
    })
}

/// Position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A raw client that sent `GET path` and has read the response head and at least one byte of
/// the body; returns the stream (with more of the answer still coming).
fn reading_client(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = find(&got, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_string();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            if got.len() > end + 4 {
                return stream;
            }
        }
    }
}

/// Closes `stream` with answer bytes still unread (the kernel then resets the connection).
fn reset(stream: TcpStream) {
    drop(stream);
}

/// Waits until `origin` has read `n` request heads for `path` (at most 10 s).
async fn origin_has(origin: &TestOrigin, path: &str, n: usize) {
    for _ in 0..200 {
        if origin.heads_for(path) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the origin never got request {n} for {path}");
}

/// Waits (10 s at most) until `GET url` with `fields` is a hit: the fill under way is stored.
async fn until_stored(url: &str, fields: &[(&str, &str)]) {
    for _ in 0..100 {
        if get(url, fields).await.is_hit() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the page was not stored");
}

// --- 1. a client leaving in the middle of a fill --------------------------------------------

/// A client streams a miss; a second client arrives meanwhile and streams the fill in flight;
/// the first one leaves in the middle of the body. Returns what the second one got, whether the
/// next request was a hit, and how many requests the origin saw.
async fn leaver_and_follower(direct: bool) -> (Result<Resp, String>, bool, usize) {
    let (chunks, size) = (14, 1000);
    let origin = paced_origin(chunks, size, 100);
    let (lacquer, _admin) = node(origin.addr(), direct, "");
    let path = "/streamed";
    let leaver = reading_client(lacquer.addr(), path);
    // the head is out: the fill has started, and the follower reads it as it is written
    let follower = {
        let url = lacquer.url(path);
        tokio::spawn(async move { try_get(&url, &[("host", HOST)]).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    reset(leaver);
    let got = follower.await.unwrap().map_err(|e| format!("{e:?}"));
    if let Ok(resp) = &got {
        assert_eq!(resp.status, 200);
    }
    let got = got.and_then(|resp| {
        if resp.body.as_ref() == paced_body(chunks, size).as_slice() {
            Ok(resp)
        } else {
            Err(format!("a body of {} bytes, not the page", resp.body.len()))
        }
    });
    // the fill either completed or was abandoned by now (the origin's last chunk is out)
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = get_page(&lacquer, path).await;
    assert_eq!(next.body.as_ref(), paced_body(chunks, size).as_slice());
    (got, next.is_hit(), origin.hits())
}

/// The reference: Pingora's miss keeps filling when its client leaves ("Downstream Error
/// ignored during caching"), so the follower gets the page whole and the page is stored.
#[tokio::test]
async fn standard_path_a_client_leaving_mid_body_does_not_cut_the_others_reading_its_fill() {
    let (got, hit, hits) = leaver_and_follower(false).await;
    assert!(got.is_ok(), "the follower's answer: {got:?}");
    assert!(hit, "the page was stored");
    assert_eq!(hits, 1);
}

#[tokio::test]
async fn a_client_leaving_a_direct_miss_mid_body_does_not_cut_the_others_reading_its_fill() {
    let (got, hit, hits) = leaver_and_follower(true).await;
    assert!(got.is_ok(), "the follower's answer: {got:?}");
    assert!(hit, "the page was stored");
    assert_eq!(hits, 1);
}

// --- 2. purges and bans during a fill ---------------------------------------------------------

/// Invalidates the page while a miss's fill of it streams; the invalidation must win: the miss's
/// client gets its page whole, and the next request goes to the origin.
async fn invalidated_mid_fill(direct: bool, how: &str) {
    let (chunks, size) = (7, 1000);
    let origin = paced_origin(chunks, size, 150);
    let dir = TempDir::new("attacks");
    let token = dir.write("admin.token", format!("{ADMIN_TOKEN}\n"));
    let (lacquer, admin) = LacquerProcess::start_with_admin(|port, admin| {
        format!(
            "{}{}",
            simple_config(
                port,
                origin.addr(),
                &format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n"),
            ),
            admin_toml(admin, &token, "attacked"),
        )
    });
    let path = "/invalidated?x=1";
    let first = {
        let url = lacquer.url(path);
        tokio::spawn(async move { try_get(&url, &[("host", HOST)]).await })
    };
    origin_has(&origin, path, 1).await;
    // two chunks in: the fill is streaming
    tokio::time::sleep(Duration::from_millis(300)).await;
    // a second request joins the fill: its head has come (from the fill, the origin saw one)
    let joined = http_client()
        .get(lacquer.url(path))
        .header("host", HOST)
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), 200);
    assert_eq!(origin.hits_for(path), 1, "{how}: the second request joined");
    let answer = match how {
        "purge" => request("PURGE", &lacquer.url(path), &[("host", HOST)], None).await,
        "soft purge" => {
            let headers = [("host", HOST), ("soft-purge", "1")];
            request("PURGE", &lacquer.url(path), &headers, None).await
        }
        "tag ban" => admin_post(admin, "/ban", Some(ADMIN_TOKEN), r#"{"tag": "paced"}"#).await,
        "url purge" => {
            let body = format!(r#"{{"url": "http://{HOST}{path}"}}"#);
            admin_post(admin, "/purge", Some(ADMIN_TOKEN), &body).await
        }
        "prefix ban" => {
            let body = format!(r#"{{"host": "{HOST}", "prefix": "/inval"}}"#);
            admin_post(admin, "/ban", Some(ADMIN_TOKEN), &body).await
        }
        _ => unreachable!(),
    };
    // 404: nothing was stored yet (the fill is still in flight)
    assert!(
        matches!(answer.status, 200 | 202 | 404),
        "{how}: {} {}",
        answer.status,
        answer.text()
    );
    assert_eq!(
        origin.hits_for(path),
        1,
        "{how}: still the first fetch's body"
    );
    // whole: the direct path relays it from the origin; the standard path serves its miss from
    // the fill, which a hard purge lets go of but still relays to the readers it has
    let first = first
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{how}: the miss's own answer: {e:?}"));
    assert_eq!(first.status, 200);
    assert_eq!(first.body.as_ref(), paced_body(chunks, size).as_slice());
    // and so does the request that joined it before the invalidation
    let joined = joined
        .bytes()
        .await
        .unwrap_or_else(|e| panic!("{how}: the joined request's body: {e:?}"));
    assert_eq!(
        joined.as_ref(),
        paced_body(chunks, size).as_slice(),
        "{how}"
    );
    let next = get_page(&lacquer, path).await;
    assert_eq!(next.status, 200);
    if how == "soft purge" {
        // marked stale: never served as a fresh hit
        assert!(
            !next.is_hit() || next.cache_status().unwrap_or_default().contains("stale"),
            "{how} undone: {:?}",
            next.cache_status()
        );
    } else {
        assert!(!next.is_hit(), "{how} undone: {:?}", next.cache_status());
        assert_eq!(
            origin.hits_for(path),
            2,
            "{how}: the next GET went to the origin"
        );
    }
}

#[tokio::test]
async fn a_purge_during_a_direct_miss_fill_is_never_undone() {
    tokio::join!(
        invalidated_mid_fill(true, "purge"),
        invalidated_mid_fill(true, "url purge"),
        invalidated_mid_fill(true, "tag ban"),
        invalidated_mid_fill(true, "prefix ban"),
        invalidated_mid_fill(true, "soft purge"),
    );
}

#[tokio::test]
async fn a_purge_during_a_standard_miss_fill_is_never_undone() {
    tokio::join!(
        invalidated_mid_fill(false, "purge"),
        invalidated_mid_fill(false, "tag ban"),
    );
}

// --- 3. locks never outlive their request ------------------------------------------------------

/// An origin whose first answer for each path misbehaves as the path says, and whose later
/// answers are the page, storable, at once: `good <path>`.
fn misbehaving_origin() -> TestOrigin {
    let seen = std::sync::Mutex::new(std::collections::HashMap::<String, usize>::new());
    TestOrigin::start(move |req| {
        let n = {
            let mut seen = seen.lock().unwrap();
            let count = seen.entry(req.path.clone()).or_insert(0);
            *count += 1;
            *count
        };
        let good =
            OriginResponse::ok(format!("good {}", req.path)).header("Cache-Control", "max-age=60");
        if n > 1 {
            return good;
        }
        let mode = req.path_only().trim_start_matches('/').to_string();
        let slow = Duration::from_millis(700);
        match mode.as_str() {
            // the client leaves while the origin prepares the answer
            "leave-before-head" => good.delay(slow),
            // ... after an interim response went out
            "leave-after-103" => good.interim(103, &[("link", "</a.css>")]).delay(slow),
            // ... in the middle of the body
            "leave-mid-body" => good.body(Body::Paced {
                chunks: paced_chunks(8, 2000),
                interval: Duration::from_millis(100),
            }),
            "cut-mid-body" => good.body(Body::Truncated {
                declared_len: 50_000,
                data: Bytes::from(vec![b'x'; 20_000]),
            }),
            "close-before-head" => OriginResponse::close_without_answer(),
            "bad-gateway" => OriginResponse::ok("upstream down").status(502),
            "gateway-timeout" => OriginResponse::ok("upstream slow").status(504),
            "server-error-stored" => OriginResponse::ok("broken")
                .status(500)
                .header("Cache-Control", "max-age=60"),
            // longer than the node's read timeout
            "hang" => good.delay(Duration::from_millis(2500)),
            _ => good,
        }
    })
}

/// What a misbehaving request's client does.
#[derive(Clone, Copy, Debug)]
enum Client {
    /// Reads the answer whole (whatever it is).
    Reads,
    /// Sends the request and closes after `ms`.
    LeavesAfter(u64),
}

/// Sends `GET path` as `client` says; returns the status line the client read, if any.
fn misbehaving_request(addr: SocketAddr, path: &str, client: Client) -> Option<String> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    // closed after the answer, so reading to the end reads the answer
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    match client {
        Client::Reads => {
            let mut got = Vec::new();
            let _ = stream.read_to_end(&mut got);
            let text = String::from_utf8_lossy(&got);
            text.lines().next().map(str::to_string)
        }
        Client::LeavesAfter(ms) => {
            std::thread::sleep(Duration::from_millis(ms));
            drop(stream);
            None
        }
    }
}

/// Every way a direct miss can fail or be left, each with a request waiting on its lock and
/// one after it: with `lock_timeout` at a minute, a lock that outlived its request would hold
/// them for that long. Each must get the page, and later requests find it stored.
#[tokio::test]
async fn no_failure_of_a_direct_miss_leaks_its_lock() {
    let origin = misbehaving_origin();
    let (lacquer, admin) = node(
        origin.addr(),
        true,
        "read_timeout = \"1s\"\n[cache]\nlock_timeout = \"60s\"\n",
    );
    let cases = [
        ("/leave-before-head", Client::LeavesAfter(400)),
        ("/leave-after-103", Client::LeavesAfter(400)),
        ("/leave-mid-body", Client::LeavesAfter(400)),
        ("/cut-mid-body", Client::Reads),
        ("/close-before-head", Client::Reads),
        ("/bad-gateway", Client::Reads),
        ("/gateway-timeout", Client::Reads),
        ("/server-error-stored", Client::Reads),
        ("/hang", Client::Reads),
    ];
    let started = Instant::now();
    let addr = lacquer.addr();
    let firsts: Vec<_> = cases
        .iter()
        .map(|&(path, client)| {
            tokio::task::spawn_blocking(move || (path, misbehaving_request(addr, path, client)))
        })
        .collect();
    for (path, _) in cases {
        origin_has(&origin, path, 1).await;
    }
    // a request for each page, waiting on the first one's lock (or, where the first already
    // failed, fetching for itself)
    let waiters: Vec<_> = cases
        .iter()
        .map(|&(path, _)| {
            let url = lacquer.url(path);
            tokio::spawn(async move { (path, try_get(&url, &[("host", HOST)]).await) })
        })
        .collect();
    let mut statuses = Vec::new();
    for first in firsts {
        let (path, status) = first.await.unwrap();
        statuses.push(format!("{path}: {status:?}"));
    }
    for waiter in waiters {
        let (path, resp) = waiter.await.unwrap();
        if path == "/leave-mid-body" {
            // it streams the fill its first client left, which goes on without that client:
            // whole, never cut
            let resp = resp.unwrap_or_else(|e| panic!("{path}: {e:?} ({statuses:?})"));
            assert_eq!(resp.status, 200, "{path}");
            assert_eq!(resp.body.to_vec(), paced_body(8, 2000), "{path}");
            continue;
        }
        let resp = resp.unwrap_or_else(|e| panic!("{path}: {e:?} ({statuses:?})"));
        // a 500 the origin marked storable may have been stored and served: the origin's
        // answer either way, never the node's own error
        if path == "/server-error-stored" && resp.status == 500 {
            assert_eq!(resp.text(), "broken");
            continue;
        }
        assert_eq!(resp.status, 200, "{path} ({statuses:?})");
        assert_eq!(resp.text(), format!("good {path}"));
    }
    for (path, _) in cases {
        // the first may still fetch (the waiter on an abandoned fill stored nothing)
        let _ = get_page(&lacquer, path).await;
        let resp = get_page(&lacquer, path).await;
        assert!(matches!(resp.status, 200 | 500), "{path}: {}", resp.status);
        assert!(resp.is_hit(), "{path}: {:?}", resp.cache_status());
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a request waited out a lock: {:?} ({statuses:?})",
        started.elapsed()
    );
    // the client-side and origin-side failures were direct misses, not the standard path's
    assert!(scrape(admin).await.value("lacquer_direct_misses_total") >= cases.len() as f64);
}

/// Twenty-four direct misses whose clients leave at scattered moments (before the head, while
/// the origin's first bytes are awaited, in the middle of the body, after it): every URL is
/// then answered whole at once, and stored.
#[tokio::test]
async fn a_storm_of_leaving_clients_leaks_no_lock() {
    let seen = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let origin = TestOrigin::start(move |req| {
        let first = seen.lock().unwrap().insert(req.path.clone());
        let interval = Duration::from_millis(if first { 80 } else { 0 });
        let resp = OriginResponse::ok(Body::Paced {
            chunks: paced_chunks(6, 1500),
            interval,
        })
        .header("Cache-Control", "max-age=60");
        if first {
            resp.delay(Duration::from_millis(150))
        } else {
            resp
        }
    });
    let (lacquer, _admin) = node(origin.addr(), true, "[cache]\nlock_timeout = \"60s\"\n");
    let addr = lacquer.addr();
    let started = Instant::now();
    let leavers: Vec<_> = (0..24u64)
        .map(|i| {
            let leave_after = (i * 37) % 700;
            tokio::task::spawn_blocking(move || {
                let path = format!("/storm/{i}");
                misbehaving_request(addr, &path, Client::LeavesAfter(leave_after))
            })
        })
        .collect();
    for leaver in leavers {
        leaver.await.unwrap();
    }
    // every origin answer is over (a fill goes on without the client that left it:
    // `a_client_leaving_a_direct_miss_mid_body_does_not_cut_the_others_reading_its_fill`)
    tokio::time::sleep(Duration::from_millis(900)).await;
    let checks: Vec<_> = (0..24)
        .map(|i| {
            let url = lacquer.url(&format!("/storm/{i}"));
            tokio::spawn(async move {
                let resp = get(&url, &[("host", HOST)]).await;
                let again = get(&url, &[("host", HOST)]).await;
                (i, resp, again)
            })
        })
        .collect();
    for check in checks {
        let (i, resp, again) = check.await.unwrap();
        assert_eq!(resp.status, 200, "/storm/{i}");
        assert_eq!(
            resp.body.as_ref(),
            paced_body(6, 1500).as_slice(),
            "/storm/{i}"
        );
        assert!(again.is_hit(), "/storm/{i}: {:?}", again.cache_status());
        assert_eq!(again.body, resp.body);
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a request waited out a lock: {:?}",
        started.elapsed()
    );
}

// --- 4. concurrent requests of every kind during a slow direct miss ----------------------------

/// A slow miss of one URL, and twenty requests for it meanwhile: GETs, HEADs, ranges and
/// conditional GETs. Returns what each kind got (status, and whether its body is right for it)
/// and how many requests the origin saw.
async fn mixed_during_a_slow_miss(direct: bool) -> (Vec<(String, u16, bool)>, usize) {
    let (chunks, size) = (12, 1000);
    let seen = AtomicUsize::new(0);
    let origin = TestOrigin::start(move |_| {
        let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
        // the first answer's head comes late (the others wait on the lock), its body slowly
        // (the others then stream the fill)
        let ms = if first { 80 } else { 0 };
        OriginResponse::ok(Body::Paced {
            chunks: paced_chunks(chunks, size),
            interval: Duration::from_millis(ms),
        })
        .header("Cache-Control", "max-age=60")
        .header("ETag", "\"v1\"")
        .delay(Duration::from_millis(ms * 4))
    });
    let (lacquer, _admin) = node(origin.addr(), direct, "");
    let page = paced_body(chunks, size);
    let url = lacquer.url("/mixed");
    let first = {
        let url = url.clone();
        tokio::spawn(async move { get(&url, &[("host", HOST)]).await })
    };
    origin_has(&origin, "/mixed", 1).await;
    let kinds = ["GET", "HEAD", "RANGE", "INM", "GET-IMS"];
    let others: Vec<_> = (0..20)
        .map(|i| {
            let kind = kinds[i % kinds.len()];
            let url = url.clone();
            tokio::spawn(async move {
                let resp = match kind {
                    "HEAD" => head(&url, &[("host", HOST)]).await,
                    "RANGE" => get(&url, &[("host", HOST), ("range", "bytes=1500-2499")]).await,
                    "INM" => get(&url, &[("host", HOST), ("if-none-match", "\"v1\"")]).await,
                    "GET-IMS" => {
                        // a date before any Last-Modified: no validator matches, the whole page
                        let since = "Thu, 01 Jan 1970 00:00:00 GMT";
                        get(&url, &[("host", HOST), ("if-modified-since", since)]).await
                    }
                    _ => get(&url, &[("host", HOST)]).await,
                };
                (kind, resp)
            })
        })
        .collect();
    let mut answers = Vec::new();
    let first = first.await.unwrap();
    answers.push((
        "first".to_string(),
        first.status,
        first.body.as_ref() == page.as_slice(),
    ));
    for other in others {
        let (kind, resp) = other.await.unwrap();
        let right = match (kind, resp.status) {
            ("HEAD", 200) | ("INM", 304) => resp.body.is_empty(),
            ("RANGE", 206) => resp.body.as_ref() == &page[1500..2500],
            (_, 200) => resp.body.as_ref() == page.as_slice(),
            _ => false,
        };
        answers.push((kind.to_string(), resp.status, right));
    }
    answers.sort();
    (answers, origin.hits())
}

#[tokio::test]
async fn heads_ranges_and_conditionals_during_a_slow_direct_miss_share_its_one_fetch() {
    let (direct, standard) = tokio::join!(
        mixed_during_a_slow_miss(true),
        mixed_during_a_slow_miss(false)
    );
    for (kind, status, right) in &direct.0 {
        assert!(right, "{kind}: {status}, wrong for it ({:?})", direct.0);
    }
    assert_eq!(direct.1, 1, "one origin request ({:?})", direct.0);
    assert_eq!(direct, standard);
}

// --- 5. the standard path's storing rules ------------------------------------------------------

/// What a client sees of an answer: status, fields (minus `Date`, `Age` and the origin's
/// clock-relative `Last-Modified` and `Expires`, with the TTL in
/// `Cache-Status` left out: a second may pass between the two nodes' answers), body.
fn seen(resp: &Resp) -> (u16, Vec<(String, String)>, Vec<u8>) {
    // relative to the origin's clock: a second may turn between the two nodes' answers
    let (status, mut fields, body) = resp.seen_except(&["date", "age", "last-modified", "expires"]);
    for (name, value) in &mut fields {
        if name == "cache-status" {
            *value = value
                .split("; ")
                .filter(|param| !param.starts_with("ttl="))
                .collect::<Vec<_>>()
                .join("; ");
        }
    }
    (status, fields, body)
}

/// Two GETs of each path, on a node with direct misses and one without, each in front of its
/// own scripted origin: the answers, and what each origin was asked, must be the same.
async fn same_on_both_paths(extra: &str, cases: &[(&str, &[(&str, &str)])]) {
    let origins = [scripted_origin(), scripted_origin()];
    let (direct, _) = node(origins[0].addr(), true, extra);
    let (standard, _) = node(origins[1].addr(), false, extra);
    let mut differences = Vec::new();
    for &(path, headers) in cases {
        let mut seen_by = Vec::new();
        for (lacquer, origin) in [(&direct, &origins[0]), (&standard, &origins[1])] {
            let mut with_host = vec![("host", HOST)];
            with_host.extend_from_slice(headers);
            let first = get(&lacquer.url(path), &with_host).await;
            let second = get(&lacquer.url(path), &with_host).await;
            let asked: Vec<Vec<(String, String)>> = origin
                .requests_for(path)
                .iter()
                .map(|req| req.sorted_fields_except(&["host", "x-forwarded-host"]))
                .collect();
            seen_by.push((seen(&first), seen(&second), asked));
        }
        if seen_by[0] != seen_by[1] {
            differences.push(format!(
                "{path} {headers:?}:\n  direct:   {:?}\n  standard: {:?}",
                seen_by[0], seen_by[1]
            ));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

#[tokio::test]
async fn direct_misses_store_exactly_what_the_standard_path_stores() {
    let cc = |v: &str| q(v);
    let cases: Vec<(String, Vec<(&str, &str)>)> = vec![
        (format!("/plain?cc={}", cc("max-age=60")), vec![]),
        (format!("/cookie?cc={}&cookie=1", cc("max-age=60")), vec![]),
        (format!("/private?cc={}", cc("private, max-age=60")), vec![]),
        (
            format!("/nostore?cc={}", cc("no-store, max-age=60")),
            vec![],
        ),
        (
            format!("/nocache?cc={}", cc("no-cache, max-age=60")),
            vec![],
        ),
        (
            format!(
                "/nocache-field?cc={}&hdr=X-Secret:s1",
                cc("max-age=60, no-cache=\"x-secret\"")
            ),
            vec![],
        ),
        (
            format!(
                "/private-field?cc={}&cookie=1",
                cc("max-age=60, private=\"set-cookie\"")
            ),
            vec![],
        ),
        (
            format!("/auth?cc={}", cc("max-age=60")),
            vec![("authorization", "Basic dTpw")],
        ),
        (
            format!("/auth-public?cc={}", cc("public, max-age=60")),
            vec![("authorization", "Basic dTpw")],
        ),
        (format!("/smaxage?cc={}", cc("s-maxage=60")), vec![]),
        ("/expires?expires=60".to_string(), vec![]),
        ("/nofresh".to_string(), vec![]),
        ("/lm?lm=-36000".to_string(), vec![]),
        ("/lm404?lm=-36000&status=404".to_string(), vec![]),
        ("/lm410?lm=-36000&status=410".to_string(), vec![]),
        (
            "/lm301?lm=-36000&status=301&hdr=Location:/x".to_string(),
            vec![],
        ),
        ("/lm201?lm=-36000&status=201".to_string(), vec![]),
        (
            "/lm302?lm=-36000&status=302&hdr=Location:/x".to_string(),
            vec![],
        ),
        ("/lm500?lm=-36000&status=500".to_string(), vec![]),
        (format!("/cc500?cc={}&status=500", cc("max-age=60")), vec![]),
        (format!("/cc201?cc={}&status=201", cc("max-age=60")), vec![]),
        (
            format!(
                "/cc206?cc={}&status=206&hdr=Content-Range:bytes 0-3/100",
                cc("max-age=60")
            ),
            vec![],
        ),
        (format!("/cc204?cc={}&status=204", cc("max-age=60")), vec![]),
        (format!("/vary-star?cc={}&vary=*", cc("max-age=60")), vec![]),
        (
            format!(
                "/targeted?hdr=Lacquer-Cache-Control:max-age=60&cc={}",
                cc("no-store")
            ),
            vec![],
        ),
        (
            format!(
                "/cdn?hdr=CDN-Cache-Control:no-store&cc={}",
                cc("max-age=60")
            ),
            vec![],
        ),
        (
            format!(
                "/mustrevalidate?cc={}&etag=%22e1%22",
                cc("max-age=0, must-revalidate")
            ),
            vec![],
        ),
        (format!("/stale?cc={}&age=100", cc("max-age=60")), vec![]),
        (
            format!("/tagged?cc={}&hdr=Surrogate-Key:a b", cc("max-age=60")),
            vec![],
        ),
        (
            format!("/typed?cc={}&ct=text/html", cc("max-age=60")),
            vec![],
        ),
        (format!("/len?cc={}&len=10240", cc("max-age=60")), vec![]),
        (
            format!("/overlen?cc={}&len=10241", cc("max-age=60")),
            vec![],
        ),
        (
            format!("/cookie-req?cc={}", cc("max-age=60")),
            vec![("cookie", "a=b")],
        ),
    ];
    let cases: Vec<(&str, &[(&str, &str)])> = cases
        .iter()
        .map(|(path, headers)| (path.as_str(), headers.as_slice()))
        .collect();
    same_on_both_paths("[cache]\nmax_object_size = \"10KiB\"\n", &cases).await;
}

/// An origin's `304` to a plain GET (nothing to validate): passed on and not stored by both
/// paths, but `Cache-Status` (and the access log) give the standard path's reason, `304 on
/// miss`, as `status` on a direct miss.
#[tokio::test]
async fn a_304_to_a_plain_get_gives_the_standard_paths_reason() {
    let path = format!("/cc304?cc={}&status=304", q("max-age=60"));
    same_on_both_paths("", &[(path.as_str(), &[])]).await;
}

// --- 6. variants -------------------------------------------------------------------------------

/// The page in `lang`.
fn page_in(lang: &str) -> Vec<u8> {
    format!("<p>page in {lang}</p>\n").repeat(200).into_bytes()
}

/// Twenty-four clients at once, four languages, each with and without gzip, while the first
/// fetches are slow; then the same again. The origin varies on `Accept-Language` (and, when it
/// codes its answers itself, on `Accept-Encoding`); with `compress`, it sends identity and
/// the node codes on store. Every client must get its own language, in a coding it takes.
/// Returns the origin's request count after each round and the hits of the second.
async fn variants_at_once(direct: bool, compress: bool) -> (usize, usize, usize) {
    let seen = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let origin = TestOrigin::start(move |req| {
        let lang = req.header("accept-language").unwrap_or("none").to_string();
        let first = seen.lock().unwrap().insert(lang.clone());
        let gzip_ok = req
            .header("accept-encoding")
            .is_some_and(|ae| ae.contains("gzip"));
        let resp = if compress || !gzip_ok {
            OriginResponse::ok(page_in(&lang))
        } else {
            OriginResponse::ok(gzip(&page_in(&lang))).header("Content-Encoding", "gzip")
        };
        let vary = if compress {
            "Accept-Language"
        } else {
            "Accept-Language, Accept-Encoding"
        };
        resp.header("Cache-Control", "max-age=60")
            .header("Content-Type", "text/html")
            .header("Vary", vary)
            .delay(Duration::from_millis(if first { 300 } else { 0 }))
    });
    let extra = if compress {
        "[cache.compression]\nenabled = true\nmin_size = \"256\"\n"
    } else {
        ""
    };
    let (lacquer, _admin) = node(origin.addr(), direct, extra);
    let url = lacquer.url("/greeting");
    let mut rounds = Vec::new();
    for _ in 0..2 {
        let clients: Vec<_> = (0..24)
            .map(|i| {
                let lang = ["en", "fr", "de", "es"][i % 4];
                let coding = ["gzip", "identity"][(i / 4) % 2];
                let url = url.clone();
                tokio::spawn(async move {
                    let headers = [
                        ("host", HOST),
                        ("accept-language", lang),
                        ("accept-encoding", coding),
                    ];
                    (lang, coding, get(&url, &headers).await)
                })
            })
            .collect();
        let mut hits = 0;
        for client in clients {
            let (lang, coding, resp) = client.await.unwrap();
            assert_eq!(resp.status, 200);
            let body = match resp.header("content-encoding").as_deref() {
                Some("gzip") if coding == "gzip" => gunzip(&resp.body),
                None => resp.body.to_vec(),
                other => panic!("{lang}/{coding}: coded {other:?}"),
            };
            assert!(
                body == page_in(lang),
                "{lang}/{coding} got {:.40}",
                String::from_utf8_lossy(&body)
            );
            hits += usize::from(resp.is_hit());
        }
        rounds.push((origin.hits(), hits));
    }
    (rounds[0].0, rounds[1].0, rounds[1].1)
}

#[tokio::test]
async fn concurrent_variants_of_a_direct_miss_never_cross() {
    let (direct, standard) = tokio::join!(
        variants_at_once(true, false),
        variants_at_once(false, false)
    );
    assert_eq!(direct, standard);
}

#[tokio::test]
async fn concurrent_variants_of_a_direct_miss_coded_on_store_never_cross() {
    let (direct, standard) =
        tokio::join!(variants_at_once(true, true), variants_at_once(false, true));
    assert_eq!(direct, standard);
}

// --- 7. two nodes sharing memcached ------------------------------------------------------------

/// An origin whose first answer for each path takes 400 ms and every later one none; the body
/// names the path and the origin's request count.
fn slow_at_first_origin() -> TestOrigin {
    let seen = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let count = AtomicUsize::new(0);
    TestOrigin::start(move |req| {
        let n = count.fetch_add(1, Ordering::SeqCst) + 1;
        let first = seen.lock().unwrap().insert(req.path.clone());
        OriginResponse::ok(format!("{} #{n}", req.path).repeat(50))
            .header("Cache-Control", "max-age=300")
            .delay(Duration::from_millis(if first { 400 } else { 0 }))
    })
}

/// The first `/{prefix}/{i}` whose entry ketama places on server `wanted`, and its key.
fn path_on(cluster: &MemcachedCluster, prefix: &str, wanted: usize) -> (String, String) {
    (0..1000)
        .map(|i| {
            let path = format!("/{prefix}/{i}");
            let key = MemcachedCluster::key_of(HOST, &path);
            (path, key)
        })
        .find(|(_, key)| cluster.server_for(key) == wanted)
        .unwrap()
}

/// `GET path` on `lacquer`, failing the test if it takes longer than only a hang would.
async fn get_bounded(lacquer: &LacquerProcess, path: &str) -> Resp {
    let what = format!("GET {path} answered (only a hang takes this long)");
    support::within(Duration::from_secs(8), &what, get_page(lacquer, path)).await
}

#[tokio::test]
async fn a_direct_miss_on_one_node_is_a_hit_on_the_other_through_memcached() {
    let cluster = MemcachedCluster::start(2);
    let origin = slow_at_first_origin();
    let a = cluster.node(&origin, "a", "");
    let b = cluster.node(&origin, "b", "");
    // stored by a, in memcached once written (just after the answer), read by b
    let (path, key) = path_on(&cluster, "stored", 0);
    let first = get_bounded(&a.proxy, &path).await;
    assert!(first.is_stored(), "{:?}", first.cache_status());
    assert!(
        poll_until(Duration::from_secs(5), || cluster.servers[0].holds(&key)),
        "the direct miss's answer never reached memcached"
    );
    let from_b = get_bounded(&b.proxy, &path).await;
    assert!(from_b.is_hit(), "{:?}", from_b.cache_status());
    assert_eq!(from_b.body, first.body);
    // b asks while a's direct miss is at the origin: b waits for a's fill (the fill lease a
    // claimed) and reads it from memcached
    let (path, _) = path_on(&cluster, "leased", 1);
    let from_a = {
        let url = a.proxy.url(&path);
        tokio::spawn(async move { get(&url, &[("host", HOST)]).await })
    };
    origin_has(&origin, &path, 1).await;
    let from_b = get_bounded(&b.proxy, &path).await;
    let from_a = from_a.await.unwrap();
    assert_eq!(from_a.status, 200);
    assert_eq!(from_b.body, from_a.body);
    assert_eq!(origin.hits_for(&path), 1, "one origin fetch for both nodes");
    assert_eq!(
        scrape(a.admin).await.value("lacquer_direct_misses_total"),
        2.0
    );
}

#[tokio::test]
async fn a_frozen_memcached_server_never_fails_a_direct_miss() {
    let cluster = MemcachedCluster::start(2);
    let origin = slow_at_first_origin();
    let a = cluster.node(&origin, "a", "");
    let b = cluster.node(&origin, "b", "");
    // frozen while the direct miss is at the origin: its memcached write finds it frozen
    let (during, _) = path_on(&cluster, "during", 0);
    let mut from_a = {
        let url = a.proxy.url(&during);
        tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(8), get(&url, &[("host", HOST)])).await
        })
    };
    // a request that fails before the origin sees it says how (a CI run once saw only "the
    // origin never got request 1", the client's panic held in its task)
    tokio::select! {
        _ = origin_has(&origin, &during, 1) => {}
        ended = &mut from_a => panic!(
            "the direct miss ended before the origin saw it: {:?}",
            ended.map(|r| r.map(|resp| (resp.status, resp.cache_status())))
        ),
    }
    cluster.servers[0].freeze();
    // and another node asks meanwhile, its lookups and lease on the frozen server
    let from_b = get_bounded(&b.proxy, &during).await;
    let from_a = from_a.await.unwrap().expect("the direct miss hung");
    // frozen before the request: its lookups time out, it is a direct miss all the same
    let (before, _) = path_on(&cluster, "before", 0);
    let late = get_bounded(&a.proxy, &before).await;
    let again = get_bounded(&a.proxy, &before).await;
    cluster.servers[0].thaw();
    for (what, resp) in [("a", &from_a), ("b", &from_b), ("late", &late)] {
        assert_eq!(resp.status, 200, "{what}: {}", resp.text());
    }
    assert!(from_a.text().starts_with(&format!("{during} #")));
    assert!(late.text().starts_with(&format!("{before} #")));
    // stored here: the frozen server only costs the shared copy
    assert!(again.is_hit(), "{:?}", again.cache_status());
    assert_eq!(again.body, late.body);
}

// --- 8. HTTP/2 clients -------------------------------------------------------------------------

/// HTTP/2 streams, processed in their connection's task (pingora-core 0021), on a node one of
/// whose memcached servers is frozen: ten misses at once on one connection, half of them keyed
/// on the frozen server (their lookups and leases time out), all answered 200 from the origin,
/// and each then a hit. A frozen server costs a stream its shared copy, never its answer or its
/// neighbours'.
#[tokio::test]
async fn h2_streams_on_a_node_with_a_frozen_memcached_server_are_all_answered() {
    let cluster = MemcachedCluster::start(2);
    let origin = slow_at_first_origin();
    let a = cluster.node(&origin, "a", "");
    // h2c: the authority is the node's address, and the key is built from it
    let authority = format!("127.0.0.1:{}", a.proxy.port());
    let on = |wanted: usize| -> Vec<String> {
        (0..1000)
            .map(|i| format!("/h2-frozen/{i}"))
            .filter(|path| {
                cluster.server_for(&MemcachedCluster::key_of(&authority, path)) == wanted
            })
            .take(5)
            .collect()
    };
    let paths: Vec<String> = on(0).into_iter().chain(on(1)).collect();
    assert_eq!(paths.len(), 10);
    cluster.servers[0].freeze();
    let client = h2c_client();
    let answers = futures_util::future::join_all(paths.iter().map(|path| {
        let (client, url) = (client.clone(), a.proxy.url(path));
        async move {
            tokio::time::timeout(
                Duration::from_secs(10),
                send(&client, "GET", &url, &[], None),
            )
            .await
            .unwrap_or_else(|_| panic!("GET {url} hung"))
            .unwrap_or_else(|e| panic!("GET {url}: {e:?}"))
        }
    }))
    .await;
    for (path, answer) in paths.iter().zip(&answers) {
        assert_eq!(answer.version, http::Version::HTTP_2);
        assert_eq!(answer.status, 200, "{path}: {}", answer.text());
        assert!(answer.text().starts_with(&format!("{path} #")), "{path}");
    }
    for path in &paths {
        let again = send(&client, "GET", &a.proxy.url(path), &[], None)
            .await
            .unwrap();
        assert!(again.is_hit(), "{path}: {:?}", again.cache_status());
    }
    cluster.servers[0].thaw();
    for path in &paths {
        assert_eq!(origin.heads_for(path), 1, "{path}");
    }
}

/// Streams of one h2c connection (the authority is the node's address: a `Host` beside it
/// is refused): misses of five URLs, each asked twice at once, all slow at
/// first; one more stream cancelled in the middle of its body. Every answer whole, one origin
/// request per URL, the cancelled URL answered afterwards; as on the standard path.
async fn h2c_misses(direct: bool) -> Vec<(u16, Vec<(String, String)>, Vec<u8>)> {
    let seen = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let origin = TestOrigin::start(move |req| {
        let first = seen.lock().unwrap().insert(req.path.clone());
        let ms = if first { 60 } else { 0 };
        OriginResponse::ok(Body::Paced {
            chunks: paced_chunks(8, 3000),
            interval: Duration::from_millis(ms),
        })
        .header("Cache-Control", "max-age=60")
        .header("X-Path", req.path.clone())
        .delay(Duration::from_millis(ms * 2))
    });
    let (lacquer, _admin) = node(origin.addr(), direct, "");
    let client = h2c_client();
    // the cancelled one: its head and first bytes, then the stream is reset
    let cancelled = {
        let url = lacquer.url("/h2/cancelled");
        let client = client.clone();
        tokio::spawn(async move {
            let mut resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.version(), reqwest::Version::HTTP_2);
            let status = resp.status();
            let chunk = resp.chunk().await;
            assert!(
                matches!(&chunk, Ok(Some(c)) if !c.is_empty()),
                "{status} {chunk:?}"
            );
            drop(resp);
        })
    };
    let streams: Vec<_> = (0..10)
        .map(|i| {
            let url = lacquer.url(&format!("/h2/{}", i % 5));
            let client = client.clone();
            tokio::spawn(async move { send(&client, "GET", &url, &[], None).await.unwrap() })
        })
        .collect();
    cancelled.await.unwrap();
    let mut answers = Vec::new();
    for (i, stream) in streams.into_iter().enumerate() {
        let resp = stream.await.unwrap();
        assert_eq!(resp.version, reqwest::Version::HTTP_2);
        assert_eq!(resp.status, 200);
        assert_eq!(
            resp.header("x-path").as_deref(),
            Some(format!("/h2/{}", i % 5).as_str())
        );
        assert_eq!(resp.body.as_ref(), paced_body(8, 3000).as_slice());
        answers.push(seen_h2(&resp));
    }
    for i in 0..5 {
        assert_eq!(origin.hits_for(&format!("/h2/{i}")), 1, "/h2/{i}");
    }
    let after = tokio::time::timeout(
        Duration::from_secs(8),
        send(&client, "GET", &lacquer.url("/h2/cancelled"), &[], None),
    )
    .await
    .expect("the cancelled stream's URL hung")
    .unwrap();
    assert_eq!(after.status, 200);
    assert_eq!(after.body.as_ref(), paced_body(8, 3000).as_slice());
    answers.sort();
    answers
}

/// [`seen`], without `Cache-Status` (a stream may have been the fetching one or a waiter).
fn seen_h2(resp: &Resp) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let (status, mut fields, body) = seen(resp);
    fields.retain(|(name, _)| name != "cache-status");
    (status, fields, body)
}

#[tokio::test]
async fn h2c_streams_doing_direct_misses_are_answered_as_on_the_standard_path() {
    let (direct, standard) = tokio::join!(h2c_misses(true), h2c_misses(false));
    assert_eq!(direct, standard);
}

// --- 9. a reload while direct misses are in flight ---------------------------------------------

/// Direct misses streaming while the config is reloaded (SIGHUP) twice, direct misses turned
/// off and on again: each answered whole, the waiters on their locks too, and every URL then
/// stored and served.
#[tokio::test]
async fn a_reload_while_direct_misses_stream_cuts_nothing() {
    let seen = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    let origin = TestOrigin::start(move |req| {
        let first = seen.lock().unwrap().insert(req.path.clone());
        let ms = if first { 100 } else { 0 };
        OriginResponse::ok(Body::Paced {
            chunks: paced_chunks(8, 2000),
            interval: Duration::from_millis(ms),
        })
        .header("Cache-Control", "max-age=60")
        .delay(Duration::from_millis(ms * 2))
    });
    let config =
        |direct: bool| format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n");
    let (lacquer, admin) = LacquerProcess::start_with_admin(|port, admin| {
        format!(
            "{}[admin]\nlisten = \"127.0.0.1:{admin}\"\n",
            simple_config(port, origin.addr(), &config(true))
        )
    });
    let requests: Vec<_> = (0..12)
        .map(|i| {
            // two requests per URL: one fetches, the other waits on its lock
            let url = lacquer.url(&format!("/reloaded/{}", i % 6));
            tokio::spawn(async move { get(&url, &[("host", HOST)]).await })
        })
        .collect();
    for i in 0..6 {
        origin_has(&origin, &format!("/reloaded/{i}"), 1).await;
    }
    let rewrite = |direct: bool| {
        let text = std::fs::read_to_string(lacquer.config_path().unwrap()).unwrap();
        let from = format!("direct_misses = {}", !direct);
        lacquer.write_config(&text.replace(&from, &format!("direct_misses = {direct}")));
        assert!(lacquer.signal("HUP"));
    };
    rewrite(false);
    tokio::time::sleep(Duration::from_millis(250)).await;
    rewrite(true);
    for request in requests {
        let resp = request.await.unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.as_ref(), paced_body(8, 2000).as_slice());
    }
    for i in 0..6 {
        let path = format!("/reloaded/{i}");
        assert_eq!(origin.hits_for(&path), 1, "{path}");
        let resp = get_bounded(&lacquer, &path).await;
        assert!(resp.is_hit(), "{path}: {:?}", resp.cache_status());
    }
    // and the reloaded node still does direct misses
    let before = scrape(admin).await.value("lacquer_direct_misses_total");
    assert_eq!(get_bounded(&lacquer, "/reloaded/new").await.status, 200);
    let after = value_when(admin, "lacquer_direct_misses_total", before + 1.0).await;
    assert_eq!(after, before + 1.0);
    assert!(
        wait_for_log(&lacquer, "configuration reloaded", Duration::from_secs(5)),
        "{}",
        lacquer.stderr_log()
    );
}

/// Chunked answers (no length announced) just under, at and just over `max_object_size`, and
/// sized ones the same: relayed whole, and stored exactly when within the limit, as the
/// standard path stores them. (The standard path used to fail a chunked answer found over the
/// limit while relayed, the client cut or answered 500; `tests/oversize_streamed_answers.rs`
/// has the cases.)
#[tokio::test]
async fn answers_around_the_size_limit_are_stored_as_on_the_standard_path() {
    const LIMIT: usize = 10 * 1024;
    let handler = |req: &RecordedRequest| {
        let len: usize = req.path.rsplit('/').next().unwrap().parse().unwrap();
        let body = vec![b'z'; len];
        let resp = if req.path.starts_with("/chunked/") {
            OriginResponse::chunked([body[..len / 2].to_vec(), body[len / 2..].to_vec()])
        } else {
            OriginResponse::ok(body)
        };
        resp.header("Cache-Control", "max-age=60")
    };
    let origins = [TestOrigin::start(handler), TestOrigin::start(handler)];
    let extra = "[cache]\nmax_object_size = \"10KiB\"\n";
    let (direct, _) = node(origins[0].addr(), true, extra);
    let (standard, _) = node(origins[1].addr(), false, extra);
    for framing in ["chunked", "sized"] {
        for len in [LIMIT - 1, LIMIT, LIMIT + 1] {
            let path = format!("/{framing}/{len}");
            for (lacquer, origin, direct) in [
                (&direct, &origins[0], true),
                (&standard, &origins[1], false),
            ] {
                for _ in 0..2 {
                    let resp = get_page(lacquer, &path).await;
                    assert_eq!(resp.status, 200, "{path}, direct {direct}");
                    assert_eq!(
                        resp.body.len(),
                        len,
                        "{path}, direct {direct}: relayed whole"
                    );
                }
                let stored = origin.hits_for(&path) == 1;
                assert_eq!(stored, len <= LIMIT, "{path}, direct {direct}: stored");
            }
        }
    }
}

// --- 10. a client that stops reading ----------------------------------------------------------

/// A client that sends `GET path` and then reads nothing, with a 4 KiB receive buffer: the
/// node's writes to it stall as soon as the socket buffers between them are full.
async fn stalled_get(addr: SocketAddr, path: &str) -> tokio::net::TcpStream {
    StallingClient::stalled(addr, HOST, path)
        .await
        .into_stream()
}

/// A client asks for a large uncached page and then reads nothing (a slow-read attack, or a
/// phone that went into a tunnel); a second client asks for the same page meanwhile. The fill
/// must go on at the origin's pace, not the first client's: the second client gets the whole page
/// while the first has still read nothing, and the first gets it whole when it reads at last.
/// Before, the fill advanced only as fast as the first client took the body (up to
/// `server.send_timeout`, here 10 minutes), and every client streaming the fill waited with it:
/// on the direct path (now `fill_relay`) and on the standard path (Pingora's miss, now with its
/// proxy task API on).
async fn stalled_reader_and_follower(direct: bool) {
    // far more than the socket buffers between the node and a client that reads nothing
    const LEN: usize = 24 << 20;
    let origin = TestOrigin::start(|_| {
        OriginResponse::ok(Body::Generated { len: LEN, seed: 7 })
            .header("Cache-Control", "max-age=60")
    });
    let (lacquer, admin) = node(
        origin.addr(),
        direct,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let path = "/large";
    let mut stalled = stalled_get(lacquer.addr(), path).await;
    origin_has(&origin, path, 1).await;

    let follower = tokio::time::timeout(Duration::from_secs(60), get_page(&lacquer, path))
        .await
        .expect("the second client's page waited for the first client to read");
    assert_eq!(follower.status, 200);
    assert!(
        follower.body.as_ref() == generated_bytes(LEN, 7).as_slice(),
        "a body of {} bytes, not the page",
        follower.body.len()
    );
    assert_eq!(origin.hits(), 1, "the second client streamed the one fill");
    // what the first client has not taken is held for it, and shown: on the direct path the
    // bytes themselves, on the standard path a whole object's worth reserved (max_object_size)
    let held = scrape(admin).await.value("lacquer_read_ahead_bytes");
    if direct {
        assert!(
            held >= (LEN / 2) as f64,
            "{held} bytes held for the stalled client"
        );
    } else {
        assert_eq!(held, (64 << 20) as f64);
    }

    // the first client, reading at last, gets the whole page too
    let answer = tokio::time::timeout(Duration::from_secs(60), async {
        let mut answer = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = tokio::io::AsyncReadExt::read(&mut stalled, &mut buf)
                .await
                .unwrap();
            assert!(n > 0, "closed after {} bytes", answer.len());
            answer.extend_from_slice(&buf[..n]);
            if find(&answer, b"\r\n\r\n").is_some_and(|head| answer.len() >= head + 4 + LEN) {
                return answer;
            }
        }
    })
    .await
    .expect("the first client's answer stopped");
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    let body_at = find(&answer, b"\r\n\r\n").unwrap() + 4;
    assert!(answer[body_at..] == generated_bytes(LEN, 7));
    assert!(get_page(&lacquer, path).await.is_hit());
    assert_eq!(scrape(admin).await.value("lacquer_read_ahead_bytes"), 0.0);
}

#[tokio::test]
async fn a_client_that_stops_reading_a_direct_miss_does_not_hold_back_its_fill() {
    stalled_reader_and_follower(true).await;
}

#[tokio::test]
async fn a_client_that_stops_reading_a_standard_miss_does_not_hold_back_its_fill() {
    stalled_reader_and_follower(false).await;
}

/// The same over HTTP/2: a stream whose client grants no more window than the first 64 KiB (it
/// never releases what it received) holds back neither the fill nor a second client streaming
/// it, on the direct path (`fill_relay`) and on the standard path (Pingora's proxy tasks, which
/// vendored pingora-core 0022 gives HTTP/2 sessions).
async fn h2_stream_granting_no_window_and_follower(direct: bool) {
    const LEN: usize = 8 << 20;
    let origin = TestOrigin::start(|_| {
        OriginResponse::ok(Body::Generated { len: LEN, seed: 9 })
            .header("Cache-Control", "max-age=60")
    });
    let (lacquer, _admin) = node(
        origin.addr(),
        direct,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let path = "/large-h2";
    // h2c: the authority is the node's address
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let (response, _stream) = h2_request(&sender, "GET", &lacquer.url(path), &[]).await;
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the stalled stream's head")
        .unwrap();
    assert_eq!(response.status(), 200);
    origin_has(&origin, path, 1).await;

    let url = lacquer.url(path);
    let follower = tokio::time::timeout(Duration::from_secs(60), get(&url, &[]))
        .await
        .expect("the second client's page waited for the stalled stream");
    assert_eq!(follower.status, 200);
    assert!(
        follower.body.as_ref() == generated_bytes(LEN, 9).as_slice(),
        "a body of {} bytes, not the page",
        follower.body.len()
    );
    assert_eq!(origin.hits(), 1, "the second client streamed the one fill");
    // the stalled stream, reading at last, gets every byte once, in order (its writes were
    // interrupted and resumed while the fill went on)
    let mut body = response.into_body();
    let mut got = Vec::with_capacity(LEN);
    let read_all = async {
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read_all)
        .await
        .expect("the stalled stream's body stopped");
    assert!(
        got == generated_bytes(LEN, 9),
        "the stalled stream got {} bytes, not the page",
        got.len()
    );
    driver.abort();
}

#[tokio::test]
async fn an_h2_stream_that_grants_no_window_does_not_hold_back_a_direct_miss_fill() {
    h2_stream_granting_no_window_and_follower(true).await;
}

#[tokio::test]
async fn an_h2_stream_that_grants_no_window_does_not_hold_back_a_standard_miss_fill() {
    h2_stream_granting_no_window_and_follower(false).await;
}

/// The same stalled client, on an answer that turns out too large to store (chunked, no length:
/// its fill starts and is abandoned at `cache.max_object_size`). Nothing keeps the body then,
/// so the node must go back to the client's pace rather than read the rest of the origin's
/// 256 MB into memory for a client that takes none of it.
#[tokio::test]
async fn a_stalled_client_of_an_answer_too_large_to_store_holds_a_bounded_read_ahead() {
    const MIB: u64 = 1 << 20;
    let piece = Bytes::from(vec![b'x'; 64 << 10]);
    let origin = TestOrigin::start(move |_| {
        OriginResponse::chunked(std::iter::repeat_n(piece.clone(), 4096))
            .header("Cache-Control", "max-age=60")
    });
    let (lacquer, _admin) = node(
        origin.addr(),
        true,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"8MiB\"\n",
    );
    let before = rss_bytes(lacquer.pid());
    let mut stalled = stalled_get(lacquer.addr(), "/huge").await;
    origin_has(&origin, "/huge", 1).await;
    // reading the whole body into memory takes well under a second on loopback; watch longer
    let mut peak = 0;
    for _ in 0..30 {
        peak = peak.max(rss_bytes(lacquer.pid()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 64 * MIB,
        "RSS grew by {} MiB for a client that read nothing",
        grown / MIB
    );
    // and the client still gets the answer, from its start, when it reads
    let mut head = vec![0u8; 4096];
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut stalled, &mut head),
    )
    .await
    .expect("the answer stopped")
    .unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
}

/// Many stalled clients, each starting a different large miss: what the node holds for them all
/// together is bounded (`fill_relay::ReadAheadBudget`, half of `cache.memory_size`), not one
/// object per stalled client. Six clients that read nothing, six 40 MB pages, a 64 MiB cache:
/// without the budget the node held a copy of every page for its client.
#[tokio::test]
async fn many_stalled_clients_on_many_large_misses_hold_a_bounded_read_ahead() {
    const MIB: u64 = 1 << 20;
    const LEN: usize = 40 << 20;
    let origin = TestOrigin::start(|req: &RecordedRequest| {
        let seed = req.path.len() as u8;
        OriginResponse::ok(Body::Generated { len: LEN, seed }).header("Cache-Control", "max-age=60")
    });
    let (lacquer, _admin) = node(
        origin.addr(),
        true,
        "[server]\nsend_timeout = \"10m\"\n\
         [cache]\nmemory_size = \"64MiB\"\nmax_object_size = \"48MiB\"\n",
    );
    let before = rss_bytes(lacquer.pid());
    let mut stalled = Vec::new();
    for i in 0..6 {
        let path = format!("/many/{}", "x".repeat(i + 1));
        let conn = stalled_get(lacquer.addr(), &path).await;
        origin_has(&origin, &path, 1).await;
        stalled.push(conn);
    }
    // reading 240 MB from loopback takes a second or two; watch longer
    let mut peak = 0;
    for _ in 0..40 {
        peak = peak.max(rss_bytes(lacquer.pid()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 200 * MIB,
        "RSS grew by {} MiB for six clients that read nothing",
        grown / MIB
    );
    drop(stalled);
}

/// `server.send_timeout` is read per request, so a reload changes it for the requests that come
/// after (docs/lifecycle.md). A node started with ten minutes, reloaded to one second: a client
/// that then starts a large miss and reads nothing is cut (what the node held for it is let
/// go), and, reading at last, gets less than the page and the end of the connection.
#[tokio::test]
async fn a_reloaded_send_timeout_applies_to_the_next_requests() {
    const LEN: usize = 24 << 20;
    let origin = TestOrigin::start(|_| {
        OriginResponse::ok(Body::Generated { len: LEN, seed: 3 })
            .header("Cache-Control", "max-age=60")
    });
    let (lacquer, admin) = node(
        origin.addr(),
        true,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let text = std::fs::read_to_string(lacquer.config_path().unwrap()).unwrap();
    lacquer.write_config(&text.replace("send_timeout = \"10m\"", "send_timeout = \"1s\""));
    assert!(lacquer.signal("HUP"));
    assert!(
        wait_for_log(&lacquer, "configuration reloaded", Duration::from_secs(10)),
        "{}",
        lacquer.stderr_log()
    );

    let mut stalled = stalled_get(lacquer.addr(), "/timed").await;
    // held for the client while it reads nothing, then let go when its write times out
    let mut seen_held = false;
    let mut cut = false;
    for _ in 0..300 {
        let held = scrape(admin).await.value("lacquer_read_ahead_bytes");
        seen_held |= held > 0.0;
        if seen_held && held == 0.0 {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_held && cut, "held {seen_held}, cut {cut}");
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read_to_end(&mut stalled, &mut answer),
    )
    .await
    .expect("the connection was not closed")
    .ok();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    assert!(answer.len() < LEN, "the whole page came");
    // the fill went on without the client: the page is stored
    assert!(get_page(&lacquer, "/timed").await.is_hit());
}

/// The origin of [`given_up_client_sees_the_end_while_the_fill_goes_on`]: a storable answer of
/// 8 MiB at once, then [`TRICKLE_PIECES`] pieces of 64 KiB 160 ms apart (8 s in all), with a
/// `Content-Length`; `done` is set once the last piece is written.
fn trickling_origin(done: Arc<AtomicBool>) -> RawOrigin {
    RawOrigin::answering(move |_head, stream| {
        let piece = vec![b't'; 64 << 10];
        let len = (8 << 20) + TRICKLE_PIECES * piece.len();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nCache-Control: max-age=60\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        );
        let sent = stream.write_all(head.as_bytes()).is_ok()
            && stream.write_all(&vec![b't'; 8 << 20]).is_ok()
            && (0..TRICKLE_PIECES).all(|_| {
                std::thread::sleep(Duration::from_millis(160));
                stream.write_all(&piece).is_ok()
            });
        if sent {
            done.store(true, Ordering::SeqCst);
        }
        // the connection is kept until the node has read it all
        let _ = stream.read(&mut [0u8; 1]);
    })
}

const TRICKLE_PIECES: usize = 50;

/// A client that reads nothing is given up when a write to it has waited `server.send_timeout`
/// (here 1 s), while the fill it started goes on. It must see its answer end then (HTTP/1: the
/// connection closed after what was already sent; HTTP/2: the stream reset), not stall until the
/// fill ends. Checked by order, not by time: when the client, reading at last 2.5 s in, comes to
/// the end of its answer, the origin is still sending (it sends for 8 s). Before, the client
/// was closed only when its request ended with the fill (an HTTP/2 stream on the standard path
/// excepted: pingora-core 0022's write deadline already reset it). And the fill, going on without
/// it, still stores the page.
async fn given_up_client_sees_the_end_while_the_fill_goes_on(direct: bool, h2: bool) {
    let done = Arc::new(AtomicBool::new(false));
    let origin = trickling_origin(done.clone());
    let (lacquer, _admin) = node(
        origin.addr,
        direct,
        "[server]\nsend_timeout = \"1s\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let path = "/given-up";
    let ended_early = if h2 {
        let (sender, driver) = h2_connect_default(lacquer.addr()).await;
        let (response, _stream) = h2_request(&sender, "GET", &lacquer.url(path), &[]).await;
        let response = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("the head")
            .unwrap();
        assert_eq!(response.status(), 200);
        // no window released for 2.5 s: the node's write waits, then fails at send_timeout
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let mut body = response.into_body();
        let mut got = 0;
        let ended = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match body.data().await {
                    Some(Ok(chunk)) => {
                        got += chunk.len();
                        let _ = body.flow_control().release_capacity(chunk.len());
                    }
                    Some(Err(_)) | None => return,
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the stream neither ended nor was reset");
        assert!(got < (8 << 20), "{got} bytes: the whole answer came");
        let ended_early = !done.load(Ordering::SeqCst);
        driver.abort();
        ended_early
    } else {
        let mut stalled = stalled_get(lacquer.addr(), path).await;
        assert!(poll_until_async(Duration::from_secs(10), || !origin.heads().is_empty()).await);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::io::AsyncReadExt::read_to_end(&mut stalled, &mut answer),
        )
        .await;
        assert!(read.is_ok(), "the connection was never closed");
        let ended_early = !done.load(Ordering::SeqCst);
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        assert!(answer.len() < (8 << 20), "the whole answer came");
        ended_early
    };
    assert!(
        ended_early,
        "the given-up client's answer ended only once the origin had sent everything"
    );
    // the fill went on without the client, and stored the page
    assert!(poll_until_async(Duration::from_secs(30), || done.load(Ordering::SeqCst)).await);
    let (url, fields): (String, &[(&str, &str)]) = if h2 {
        (lacquer.url(path), &[])
    } else {
        (lacquer.url(path), &[("host", HOST)])
    };
    until_stored(&url, fields).await;
}

#[tokio::test]
async fn a_given_up_h1_client_of_a_direct_miss_sees_its_answer_end_while_the_fill_goes_on() {
    given_up_client_sees_the_end_while_the_fill_goes_on(true, false).await;
}

#[tokio::test]
async fn a_given_up_h1_client_of_a_standard_miss_sees_its_answer_end_while_the_fill_goes_on() {
    given_up_client_sees_the_end_while_the_fill_goes_on(false, false).await;
}

#[tokio::test]
async fn a_given_up_h2_stream_of_a_direct_miss_sees_its_answer_end_while_the_fill_goes_on() {
    given_up_client_sees_the_end_while_the_fill_goes_on(true, true).await;
}

#[tokio::test]
async fn a_given_up_h2_stream_of_a_standard_miss_sees_its_answer_end_while_the_fill_goes_on() {
    given_up_client_sees_the_end_while_the_fill_goes_on(false, true).await;
}

/// The origin's connection is given back to the idle pool as soon as a direct miss has read its
/// answer to the end, not when the client that asked has taken it all. Before, a client that
/// reads slowly (or not at all, for up to `server.send_timeout`) kept the connection out of the
/// pool after the fill was done, and so did a client that left mid-body (the fill went on
/// without it, then the connection was closed): the origin's next request opened another one.
async fn fill_done_connection_kept(client_leaves: bool) {
    // far more than the socket buffers between the node and a client that reads nothing
    const LEN: usize = 24 << 20;
    let origin = TestOrigin::start(|req: &RecordedRequest| {
        if req.path == "/large" {
            OriginResponse::ok(Body::Generated { len: LEN, seed: 7 })
                .header("Cache-Control", "max-age=60")
        } else {
            OriginResponse::ok("small").header("Cache-Control", "no-store")
        }
    });
    let (lacquer, _admin) = node(
        origin.addr(),
        true,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let mut client = stalled_get(lacquer.addr(), "/large").await;
    origin_has(&origin, "/large", 1).await;
    let client = if client_leaves {
        let mut some = vec![0u8; 4096];
        let n = tokio::io::AsyncReadExt::read(&mut client, &mut some)
            .await
            .unwrap();
        assert!(some[..n].starts_with(b"HTTP/1.1 200"));
        None
    } else {
        Some(client)
    };
    // the fill completes while the client has read (nearly) nothing
    until_stored(&lacquer.url("/large"), &[("host", HOST)]).await;
    assert_eq!(origin.hits_for("/large"), 1);
    assert_eq!(origin.connections(), 1);

    // the origin's next request goes over the connection the fill used
    let other = get_page(&lacquer, "/other").await;
    assert_eq!(other.status, 200);
    assert_eq!(other.body.as_ref(), b"small");
    assert_eq!(
        origin.connections(),
        1,
        "a new origin connection: the completed fill's stayed with its client"
    );
    drop(client);
}

#[tokio::test]
async fn a_direct_miss_gives_its_origin_connection_back_when_its_fill_is_done() {
    fill_done_connection_kept(false).await;
}

#[tokio::test]
async fn a_direct_miss_whose_client_left_keeps_its_origin_connection_for_the_next_request() {
    fill_done_connection_kept(true).await;
}

/// The connection given back early must be clean: an origin that sends a second, unasked-for
/// answer right after the body of a direct miss (a response-splitting attempt against the idle
/// pool) has its connection closed, not kept, and the next request never gets that answer.
#[tokio::test]
async fn an_answer_smuggled_after_a_direct_miss_body_never_reaches_the_next_request() {
    const LEN: usize = 4 << 20;
    let origin = RawOrigin::answering(|head, stream| {
        if head.starts_with("GET /large ") {
            let mut answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {LEN}\r\nCache-Control: max-age=60\r\n\r\n"
            )
            .into_bytes();
            answer.extend_from_slice(&generated_bytes(LEN, 7));
            answer.extend_from_slice(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: max-age=60\r\n\r\nEVIL!",
            );
            let _ = stream.write_all(&answer);
        } else {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nCache-Control: no-store\r\nConnection: close\r\n\r\ngood",
            );
        }
        let _ = stream.flush();
        // open long enough to be taken from the pool, were it kept
        std::thread::sleep(Duration::from_secs(3));
    });
    let (lacquer, _admin) = node(
        origin.addr,
        true,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let stalled = stalled_get(lacquer.addr(), "/large").await;
    until_stored(&lacquer.url("/large"), &[("host", HOST)]).await;
    for _ in 0..3 {
        let other = get_page(&lacquer, "/other").await;
        assert_eq!(other.status, 200);
        assert_eq!(
            other.body.as_ref(),
            b"good",
            "the smuggled answer was served"
        );
    }
    let page = get_page(&lacquer, "/large").await;
    assert!(page.is_hit());
    assert!(page.body.as_ref() == generated_bytes(LEN, 7).as_slice());
    // each `/other` on a connection of its own (its answers close theirs): the one `/large` came
    // over was not taken for any of them
    assert_eq!(origin.accepted(), 4);
    drop(stalled);
}
