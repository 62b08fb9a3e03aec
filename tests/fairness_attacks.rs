//! Breaker tests for the per-client fairness cap (`[fairness]`) after two changes: the slot
//! goes back when the origin's whole answer is in (`on_body_end`), and the direct path reads a
//! small request body before it takes the slot.
//!
//! A hostile client and a flaky origin, over real sockets. The origin here ([`Origin`]) counts
//! a request in flight from its head's arrival until its last body byte is written (or the
//! connection is dropped), so a slot given back while the origin is still sending shows up as
//! more requests at the origin than the cap. Promises checked: a client never has more than
//! `max_in_flight` requests at the origin at once; a client below its cap is never refused
//! (nor held up by another client's queue); slots never leak (after mixed aborted, failed and
//! successful requests the client has exactly its cap again); no panic.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const WAIT: Duration = Duration::from_secs(20);

/// What the origin saw.
#[derive(Default)]
struct OriginState {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Request lines (`GET /x HTTP/1.1`) in arrival order.
    lines: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// A scripted origin, one thread per connection, one request per connection. By path:
/// * `/trickle/...?ms=T`: head at once, then a 10-byte body one byte every `T/10` ms;
///   `cacheable` anywhere in the path makes it `max-age=300`, else `no-store`.
/// * `/cut/...`: `Content-Length: 1000`, 5 bytes, close.
/// * `/reset/...`: closes without answering.
/// * `/chunked/...?ms=T`: a chunked body with a trailer, its parts `T/2` ms apart.
/// * `/nocontent/...?ms=T`: `204` after `T` ms.
/// * anything else `?ms=T`: `no-store` 200 with a short body after `T` ms.
struct Origin {
    addr: SocketAddr,
    state: Arc<OriginState>,
}

fn query_ms(line: &str) -> u64 {
    line.split_whitespace()
        .nth(1)
        .and_then(|target| target.split_once("ms="))
        .and_then(|(_, v)| v.split('&').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Origin {
    fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(OriginState::default());
        let s = state.clone();
        std::thread::spawn(move || {
            while !s.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let s = s.clone();
                        std::thread::spawn(move || serve(stream, &s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Origin { addr, state }
    }

    fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    fn lines(&self) -> Vec<String> {
        self.state.lines.lock().unwrap().clone()
    }

    fn saw(&self, path_part: &str) -> bool {
        self.lines().iter().any(|l| l.contains(path_part))
    }

    fn wait_for(&self, path_part: &str) -> bool {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if self.saw(path_part) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn wait_idle(&self) {
        let deadline = Instant::now() + WAIT;
        while self.in_flight() > 0 {
            assert!(Instant::now() < deadline, "origin never went idle");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(mut stream: TcpStream, s: &OriginState) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let line = text.lines().next().unwrap_or("").to_string();
    // the request body (a small one, already read with the head, or the rest of it)
    let want = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut have = head.len() - end;
    while have < want {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => have += n,
        }
    }
    s.lines.lock().unwrap().push(line.clone());
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    answer(&mut stream, &line);
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
}

fn answer(stream: &mut TcpStream, line: &str) {
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let ms = query_ms(line);
    let cc = if path.contains("cacheable") {
        "max-age=300"
    } else {
        "no-store"
    };
    let mut w = |bytes: &[u8]| stream.write_all(bytes).and_then(|_| stream.flush()).is_ok();
    if path.starts_with("/trickle/") {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nCache-Control: {cc}\r\nConnection: close\r\n\r\n"
        );
        if !w(head.as_bytes()) {
            return;
        }
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(ms / 10));
            if !w(b"x") {
                return;
            }
        }
    } else if path.starts_with("/cut/") {
        std::thread::sleep(Duration::from_millis(ms));
        w(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: no-store\r\n\r\nhello");
        std::thread::sleep(Duration::from_millis(50));
    } else if path.starts_with("/reset/") {
        std::thread::sleep(Duration::from_millis(ms));
    } else if path.starts_with("/chunked/") {
        let head = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: x-sum\r\nCache-Control: {cc}\r\nConnection: close\r\n\r\n5\r\nhello\r\n"
        );
        if !w(head.as_bytes()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(ms / 2));
        if !w(b"5\r\nworld\r\n") {
            return;
        }
        std::thread::sleep(Duration::from_millis(ms / 2));
        w(b"0\r\nx-sum: 10\r\n\r\n");
    } else if path.starts_with("/nocontent/") {
        std::thread::sleep(Duration::from_millis(ms));
        w(b"HTTP/1.1 204 No Content\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n");
    } else {
        std::thread::sleep(Duration::from_millis(ms));
        let body = format!("{path} answered");
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: {cc}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        w(head.as_bytes());
    }
}

fn fairness(extra: &str) -> String {
    format!("[fairness]\n{extra}")
}

/// Sends a raw request on a new connection; the connection comes back for reading.
fn open(lb: &LacquerProcess, request: &str) -> RawConn {
    let mut conn = RawConn::connect(lb.addr());
    conn.send(request.as_bytes());
    conn
}

fn get_req(path: &str, fields: &[(&str, &str)]) -> String {
    let mut r = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
    for (k, v) in fields {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r
}

fn status_of(lb: &LacquerProcess, path: &str, fields: &[(&str, &str)]) -> u16 {
    open(lb, &get_req(path, fields)).read_response(false).status
}

/// Whether the client has exactly `cap` slots: `cap` slow requests all reach the origin
/// together and one more is refused `429` meanwhile (reject mode). Returns a description of
/// what went wrong, if anything.
fn check_full_capacity(lb: &LacquerProcess, origin: &Origin, cap: usize, tag: &str) {
    origin.wait_idle();
    let held: Vec<_> = (0..cap)
        .map(|i| open(lb, &get_req(&format!("/hold/{tag}/{i}?ms=2500"), &[])))
        .collect();
    for i in 0..cap {
        assert!(
            origin.wait_for(&format!("/hold/{tag}/{i}?")),
            "request {i} of {cap} below the cap never reached the origin"
        );
    }
    let extra = status_of(lb, &format!("/hold/{tag}/extra?ms=10"), &[]);
    assert_eq!(extra, 429, "one request past the cap of {cap} was admitted");
    for (i, mut conn) in held.into_iter().enumerate() {
        let status = conn.read_response(false).status;
        assert_eq!(status, 200, "held request {i} (a client below its cap)");
    }
}

/// A HEAD of a cacheable URL that misses: the standard path asks the origin for the whole
/// answer to store it, and the body keeps coming after the client has its head. The client's
/// slot must be held until the origin is done, so the client's next request at a cap of one
/// is refused while the first body still trickles in.
#[test]
fn a_head_miss_holds_its_slot_while_the_origin_still_sends_the_body() {
    let origin = Origin::start();
    let lb = start_balancer(&[(origin.addr, 1)], &fairness("max_in_flight = 1\n"));
    let mut first = open(
        &lb,
        "HEAD /trickle/cacheable-head-a?ms=3000 HTTP/1.1\r\nHost: test\r\n\r\n",
    );
    assert_eq!(first.read_response(true).status, 200);
    // the origin is still sending the body (3 s)
    let second = status_of(&lb, "/trickle/cacheable-head-b?ms=10", &[]);
    let saw_both = origin.saw("cacheable-head-b");
    origin.wait_idle();
    assert!(
        !(second == 200 && saw_both && origin.max_in_flight() > 1),
        "cap 1, origin saw {} at once (second: {second})",
        origin.max_in_flight()
    );
    assert_eq!(second, 429, "the first HEAD's fill was still in flight");
    lb.assert_no_panic();
}

/// A client that reads the head of a slow cacheable miss and disconnects: the fill may go on
/// (it is stored for others), and while it does the client's slot is taken, so the client
/// cannot get a second request to the origin at a cap of one.
#[test]
fn a_client_leaving_a_slow_fill_cannot_start_another_request_at_the_origin() {
    let origin = Origin::start();
    let lb = start_balancer(&[(origin.addr, 1)], &fairness("max_in_flight = 1\n"));
    for (i, path) in [
        "/trickle/cacheable-left-a?ms=3000",
        "/trickle/left-b?ms=3000",
    ]
    .iter()
    .enumerate()
    {
        let first = open(&lb, &get_req(path, &[]));
        let mut byte = [0u8; 1];
        first.stream().set_read_timeout(Some(WAIT)).unwrap();
        assert_eq!(first.stream().read(&mut byte).unwrap(), 1);
        drop(first);
        std::thread::sleep(Duration::from_millis(100));
        let next = status_of(&lb, &format!("/trickle/after-left-{i}?ms=10"), &[]);
        origin.wait_idle();
        assert!(
            origin.max_in_flight() <= 1,
            "{path}: cap 1, origin saw {} at once (next: {next})",
            origin.max_in_flight()
        );
    }
    check_full_capacity(&lb, &origin, 1, "left");
    lb.assert_no_panic();
}

/// Hundreds of mixed requests from one client: origin bodies cut short, origins closing
/// without an answer (retried, then 502), 204s, HEADs, chunked bodies with trailers, clients
/// aborting mid-body and before the head, POSTs with small bodies, 429s. Afterwards the
/// client has exactly its cap: three slow requests are admitted and a fourth refused.
#[test]
fn no_slot_leaks_after_mixed_failed_aborted_and_successful_requests() {
    let origin = Origin::start();
    let lb = start_balancer(&[(origin.addr, 1)], &fairness("max_in_flight = 3\n"));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let addr = lb.addr();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                for i in 0..60 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("{w}-{i}");
                    let mut conn = RawConn::connect(addr);
                    conn.read_timeout = Duration::from_secs(15);
                    let (req, head, abort) = match i % 9 {
                        0 => (get_req(&format!("/cut/{id}"), &[]), false, false),
                        1 => (get_req(&format!("/reset/{id}"), &[]), false, false),
                        2 => (get_req(&format!("/nocontent/{id}?ms=20"), &[]), false, false),
                        3 => (
                            format!("HEAD /trickle/h-{id}?ms=50 HTTP/1.1\r\nHost: test\r\n\r\n"),
                            true,
                            false,
                        ),
                        4 => (get_req(&format!("/chunked/{id}?ms=40"), &[]), false, false),
                        5 => (get_req(&format!("/trickle/ab-{id}?ms=400"), &[]), false, true),
                        6 => (
                            format!(
                                "POST /post/{id}?ms=30 HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello"
                            ),
                            false,
                            false,
                        ),
                        7 => (get_req(&format!("/plain/{id}?ms=30"), &[]), false, true),
                        _ => (
                            get_req(&format!("/trickle/cacheable-{id}?ms=60"), &[]),
                            false,
                            false,
                        ),
                    };
                    conn.send(req.as_bytes());
                    if abort {
                        // gone after at most the head, or before anything came back
                        std::thread::sleep(Duration::from_millis(if i % 2 == 0 { 5 } else { 60 }));
                        drop(conn);
                        continue;
                    }
                    match conn.try_read_response(head) {
                        Ok(r) => statuses.push(r.status),
                        Err(_) => statuses.push(0),
                    }
                }
                statuses
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    stop.store(true, Ordering::SeqCst);
    assert!(
        all.iter().all(|s| matches!(s, 0 | 200 | 204 | 429 | 502)),
        "statuses: {all:?}"
    );
    // (not checked here: the origin's count, which a client hanging up raises past the cap,
    // see `a_client_hanging_up_does_not_free_its_slot_while_the_origin_still_works`)
    // sessions wind down; then the full cap, no more
    std::thread::sleep(Duration::from_millis(500));
    check_full_capacity(&lb, &origin, 3, "after-mix");
    lb.assert_no_panic();
}

/// A failed attempt retried on another backend holds one slot, not two, and gives it back:
/// the first backend closes every connection without an answer, the retry goes to the second.
/// At a cap of one the request is answered 200 (it did not refuse itself), a second request
/// meanwhile is refused, and afterwards the client has its one slot.
#[test]
fn a_retried_request_holds_exactly_one_slot() {
    let closing = RawOrigin::closing();
    let origin = Origin::start();
    let lb = start_balancer(
        &[(closing.addr, 1), (origin.addr, 1)],
        &fairness("max_in_flight = 1\n"),
    );
    for i in 0..4 {
        let mut first = open(&lb, &get_req(&format!("/trickle/retried-{i}?ms=1500"), &[]));
        assert!(origin.wait_for(&format!("retried-{i}")));
        let during = status_of(&lb, &format!("/during-{i}?ms=10"), &[]);
        assert_eq!(
            during, 429,
            "a second request while the retried one was in flight"
        );
        assert_eq!(first.read_response(false).status, 200);
    }
    origin.wait_idle();
    assert!(origin.max_in_flight() <= 1);
    let deadline = Instant::now() + WAIT;
    // the slot is free again (either backend may take the next request)
    loop {
        let s = status_of(&lb, "/after-retries?ms=0", &[]);
        if s != 429 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot never came back after retries"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    lb.assert_no_panic();
}

/// Queue mode: waiters are admitted in arrival order, one more than `queue_size` is refused at
/// once, and a waiter gives up after `queue_timeout` (within generous bounds).
#[test]
fn the_queue_is_ordered_bounded_and_its_wait_is_bounded() {
    let origin = Origin::start();
    let lb = start_balancer(
        &[(origin.addr, 1)],
        &fairness(
            "max_in_flight = 1\non_excess = \"queue\"\nqueue_size = 3\nqueue_timeout = \"20s\"\n",
        ),
    );
    let mut hold = open(&lb, &get_req("/trickle/q-hold?ms=1500", &[]));
    assert!(origin.wait_for("q-hold"));
    let mut waiters = Vec::new();
    for i in 0..3 {
        waiters.push(open(&lb, &get_req(&format!("/q/w{i}?ms=100"), &[])));
        std::thread::sleep(Duration::from_millis(150));
    }
    let t = Instant::now();
    let over = status_of(&lb, "/q/over?ms=0", &[]);
    assert_eq!(over, 429, "a fourth waiter with queue_size = 3");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "refused only after {:?}",
        t.elapsed()
    );
    assert_eq!(hold.read_response(false).status, 200);
    for (i, mut w) in waiters.into_iter().enumerate() {
        assert_eq!(w.read_response(false).status, 200, "waiter {i}");
    }
    let order: Vec<_> = origin
        .lines()
        .into_iter()
        .filter(|l| l.contains("/q/w"))
        .collect();
    assert_eq!(order.len(), 3);
    for (i, line) in order.iter().enumerate() {
        assert!(line.contains(&format!("/q/w{i}")), "order: {order:?}");
    }
    assert!(origin.max_in_flight() <= 1);
    lb.assert_no_panic();
}

/// Queue mode with a short `queue_timeout`: a waiter is answered 429 after about that long,
/// not when the slot comes back.
#[test]
fn a_queued_request_is_refused_after_queue_timeout() {
    let origin = Origin::start();
    let lb = start_balancer(
        &[(origin.addr, 1)],
        &fairness(
            "max_in_flight = 1\non_excess = \"queue\"\nqueue_size = 2\nqueue_timeout = \"1s\"\n",
        ),
    );
    let mut hold = open(&lb, &get_req("/trickle/qt-hold?ms=6000", &[]));
    assert!(origin.wait_for("qt-hold"));
    let t = Instant::now();
    let waited = status_of(&lb, "/qt/w?ms=0", &[]);
    let took = t.elapsed();
    assert_eq!(waited, 429);
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "queue_timeout 1s, refused after {took:?}"
    );
    assert!(!origin.saw("/qt/w"));
    assert_eq!(hold.read_response(false).status, 200);
    lb.assert_no_panic();
}

/// Queue mode: a waiter whose client has disconnected must give its place back. With
/// `queue_size = 1`, a client whose queued request's connection closed sends another request:
/// that one must be queued (and answered 200 once the slot frees), not refused because a dead
/// waiter still holds the only place; and the dead client's request should not go to the origin.
/// Found 2026-12-08 (the next request was refused, every run); fixed the same day: a queued
/// request whose body is all read watches its client (`fairness::client_gone`).
#[test]
fn a_waiter_whose_client_left_frees_its_place() {
    let origin = Origin::start();
    let lb = start_balancer(
        &[(origin.addr, 1)],
        &fairness(
            "max_in_flight = 1\non_excess = \"queue\"\nqueue_size = 1\nqueue_timeout = \"20s\"\n",
        ),
    );
    let mut hold = open(&lb, &get_req("/trickle/gone-hold?ms=2500", &[]));
    assert!(origin.wait_for("gone-hold"));
    let gone = open(&lb, &get_req("/gone/dead-waiter?ms=0", &[]));
    std::thread::sleep(Duration::from_millis(300));
    drop(gone);
    std::thread::sleep(Duration::from_millis(300));
    let mut next = open(&lb, &get_req("/gone/next?ms=0", &[]));
    assert_eq!(hold.read_response(false).status, 200);
    let next_status = next.read_response(false).status;
    origin.wait_idle();
    let dead_sent = origin.saw("dead-waiter");
    assert_eq!(
        next_status, 200,
        "refused: the disconnected waiter kept the only queue place (dead request sent \
         upstream: {dead_sent})"
    );
    assert!(
        !dead_sent,
        "the disconnected client's request went to the origin"
    );
}

/// Queue mode, two clients told apart by a key header: alice, at her cap, queues a miss of a
/// cacheable URL; bob, far below his cap, asks for the same URL. Bob must not wait for alice's
/// queue (the queued miss holds the URL's cache lock while it waits for alice's slot).
#[test]
#[ignore = "KNOWN: a miss queued for its client's fairness slot holds the cache lock; other clients of the URL wait for it"]
fn a_queued_miss_does_not_hold_up_other_clients_of_the_same_url() {
    let origin = Origin::start();
    let lb = start_balancer(
        &[(origin.addr, 1)],
        &fairness(
            "max_in_flight = 1\nkey_header = \"x-api-key\"\non_excess = \"queue\"\n\
             queue_size = 4\nqueue_timeout = \"20s\"\n",
        ),
    );
    let alice = [("x-api-key", "alice")];
    let mut hold = open(&lb, &get_req("/trickle/alice-hold?ms=6000", &alice));
    assert!(origin.wait_for("alice-hold"));
    let mut queued = open(&lb, &get_req("/cacheable/shared?ms=0", &alice));
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !origin.saw("/cacheable/shared"),
        "alice's second request passed her cap"
    );
    let t = Instant::now();
    let bob = status_of(&lb, "/cacheable/shared?ms=0", &[("x-api-key", "bob")]);
    let took = t.elapsed();
    assert_eq!(hold.read_response(false).status, 200);
    assert_eq!(queued.read_response(false).status, 200);
    assert_eq!(bob, 200);
    assert!(
        took < Duration::from_secs(2),
        "bob (no request of his in flight) waited {took:?} behind alice's fairness queue"
    );
}

/// HTTP/2: many streams of one connection are one client. Six concurrent slow requests over
/// one h2c connection at a cap of two: at most two reach the origin at once, the rest are 429;
/// after streams reset by the client the client has its two slots again (what the origin
/// counts around the resets is `a_client_hanging_up_...`'s matter, not checked here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_of_one_connection_share_the_clients_cap() {
    let origin = Origin::start();
    let lb = start_balancer(&[(origin.addr, 1)], &fairness("max_in_flight = 2\n"));
    let client = h2c_client();
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let client = client.clone();
            let url = lb.url(&format!("/trickle/h2-{i}?ms=1500"));
            tokio::spawn(async move { send(&client, "GET", &url, &[], None).await.unwrap() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.version, reqwest::Version::HTTP_2);
        statuses.push(r.status);
    }
    statuses.sort();
    assert_eq!(statuses, vec![200, 200, 429, 429, 429, 429]);
    assert!(origin.max_in_flight() <= 2);
    // streams reset mid-answer by the client
    let (sender, _conn) = h2_connect_default(lb.addr()).await;
    for i in 0..4 {
        let url = lb.url(&format!("/trickle/h2-reset-{i}?ms=1000"));
        let (answer, mut stream) = h2_request(&sender, "GET", &url, &[]).await;
        if i % 2 == 0 {
            let _ = tokio::time::timeout(Duration::from_millis(200), answer).await;
        }
        stream.send_reset(::h2::Reason::CANCEL);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lb_ref = &lb;
    let origin_ref = &origin;
    tokio::task::block_in_place(|| check_full_capacity(lb_ref, origin_ref, 2, "h2"));
    lb.assert_no_panic();
}

/// An untrusted client cannot pick its fairness identity with `X-Forwarded-For` or
/// `Forwarded`: rotating them, it still has one slot.
#[test]
fn forwarded_fields_from_an_untrusted_client_do_not_change_its_identity() {
    let origin = Origin::start();
    let lb = start_balancer(&[(origin.addr, 1)], &fairness("max_in_flight = 1\n"));
    let mut hold = open(
        &lb,
        &get_req(
            "/trickle/xff-hold?ms=2000",
            &[("x-forwarded-for", "10.0.0.1")],
        ),
    );
    assert!(origin.wait_for("xff-hold"));
    for i in 2..8 {
        let xff = format!("10.0.0.{i}");
        let fwd = format!("for=10.0.1.{i}");
        let s = status_of(
            &lb,
            &format!("/xff/{i}?ms=0"),
            &[
                ("x-forwarded-for", &xff),
                ("forwarded", &fwd),
                ("x-real-ip", &xff),
            ],
        );
        assert_eq!(
            s, 429,
            "spoofed forwarding fields gave a new identity ({xff})"
        );
    }
    assert_eq!(hold.read_response(false).status, 200);
    assert!(origin.max_in_flight() <= 1);
}

/// A reload (SIGHUP) that leaves `[fairness]` as it was keeps the slots: a request held across
/// it still counts, so the client cannot get a second one to the origin at a cap of one.
#[test]
fn a_reload_that_keeps_fairness_keeps_the_held_slots() {
    let origin = Origin::start();
    let extra = fairness("max_in_flight = 1\n");
    let lb = start_balancer(&[(origin.addr, 1)], &extra);
    let mut hold = open(&lb, &get_req("/trickle/reload-hold?ms=3000", &[]));
    assert!(origin.wait_for("reload-hold"));
    let config = std::fs::read_to_string(lb.config_path().unwrap()).unwrap();
    lb.write_config(&format!("{config}\n[proxy]\nvia_name = \"reloaded\"\n"));
    assert!(lb.signal("HUP"));
    assert!(
        wait_for_log(&lb, "configuration reloaded", WAIT),
        "{}",
        lb.stderr_log()
    );
    let during = status_of(&lb, "/reload/during?ms=0", &[]);
    assert_eq!(
        during, 429,
        "a reload with [fairness] unchanged forgot the held slot"
    );
    assert_eq!(hold.read_response(false).status, 200);
    assert!(origin.max_in_flight() <= 1);
    lb.assert_no_panic();
}

/// A client that hangs up gives its slot back at once, though the origin is still working on
/// its request (a typical application server does not notice the closed connection until it
/// writes its answer). So a client at a cap of one that sends a slow request, waits until the
/// origin has it, hangs up and does it again has five requests at the origin at once: the cap,
/// there to keep one client from taking every origin slot, is escaped by hanging up.
#[test]
#[ignore = "KNOWN: hanging up frees the fairness slot while the origin still works; a client at cap 1 gets 5 at the origin"]
fn a_client_hanging_up_does_not_free_its_slot_while_the_origin_still_works() {
    let r = Replica::start("a");
    let lb = start_balancer(&[(r.addr(), 1)], &fairness("max_in_flight = 1\n"));
    let mut statuses = Vec::new();
    for i in 0..5 {
        let conn = open(&lb, &get_req(&format!("/abandon/{i}?sleep=2500"), &[]));
        let deadline = Instant::now() + Duration::from_secs(2);
        // the origin has it (or it was refused: then the connection has its 429)
        while r.served() < i + 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if r.served() < i + 1 {
            let mut conn = conn;
            statuses.push(conn.read_response(false).status);
            continue;
        }
        statuses.push(0);
        drop(conn);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(3000));
    assert!(
        r.max_in_flight() <= 1,
        "cap 1: the origin had {} of the client's requests at once (refused: {statuses:?})",
        r.max_in_flight()
    );
    lb.assert_no_panic();
}

/// Queue mode, and the watch on a queued request's client (`fairness::client_gone`, added for
/// [`a_waiter_whose_client_left_frees_its_place`]): two requests pipelined on one connection
/// behind a held slot are both answered, each with its own body and in order. The watch reads
/// the connection while the first waits, and the start of the second must be kept for it, not
/// taken for a closed or broken client.
#[test]
fn pipelined_requests_queued_for_a_slot_are_each_answered_in_order() {
    let origin = Origin::start();
    let lb = start_balancer(
        &[(origin.addr, 1)],
        &fairness(
            "max_in_flight = 1\non_excess = \"queue\"\nqueue_size = 4\nqueue_timeout = \"10s\"\n",
        ),
    );
    let mut hold = open(&lb, &get_req("/pipelined-hold?ms=1500", &[]));
    assert!(origin.wait_for("pipelined-hold"));
    let mut conn = open(
        &lb,
        &format!(
            "{}{}",
            get_req("/pipelined-first?ms=10", &[]),
            get_req("/pipelined-second?ms=10", &[])
        ),
    );
    assert_eq!(hold.read_response(false).status, 200);
    let first = conn.read_response(false);
    let second = conn.read_response(false);
    assert_eq!(
        (first.status, first.text()),
        (200, "/pipelined-first?ms=10 answered".to_string())
    );
    assert_eq!(
        (second.status, second.text()),
        (200, "/pipelined-second?ms=10 answered".to_string())
    );
    assert!(origin.max_in_flight() <= 1);
    lb.assert_no_panic();
}

/// Queue mode over HTTP/2: streams of one connection queued behind a held slot are not taken
/// for gone (their client closed its side of each stream with the request, which is not a
/// reset): all are answered, one at a time at the origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_queued_for_a_slot_are_all_answered() {
    let origin = Origin::start();
    let lb = start_balancer(
        &[(origin.addr, 1)],
        &fairness(
            "max_in_flight = 1\non_excess = \"queue\"\nqueue_size = 8\nqueue_timeout = \"10s\"\n",
        ),
    );
    let client = h2c_client();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let client = client.clone();
            let url = lb.url(&format!("/h2-queued-{i}?ms=300"));
            tokio::spawn(async move { send(&client, "GET", &url, &[], None).await.unwrap() })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let answer = task.await.unwrap();
        assert_eq!(answer.version, reqwest::Version::HTTP_2);
        assert_eq!(answer.status, 200, "stream {i}");
        assert_eq!(answer.text(), format!("/h2-queued-{i}?ms=300 answered"));
    }
    assert_eq!(origin.max_in_flight(), 1);
    lb.assert_no_panic();
}
