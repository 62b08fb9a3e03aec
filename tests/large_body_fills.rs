//! Large fills of the memory tier from the outside, as an attacker or a flaky origin would drive
//! them: a body whose origin-declared `Content-Length` is 64 KiB or more is copied into a memory
//! mapping of exactly that length (`src/storage/memory/mapped.rs`), a chunk past the declared
//! length gets a buffer of its own, and a body shorter than declared is copied into an exact
//! buffer at `finish`. Over real sockets, on both miss paths (`proxy.direct_misses` on and off):
//!
//! 1. an origin that declares 300 KiB and closes early (at 0 bytes, 64 KiB, 100 KiB, one byte
//!    short): the client never gets the cut body as a complete answer, nothing cut is stored, and
//!    the next request fetches the whole body, which is then a byte-identical hit; a `HEAD` miss
//!    (a declared length and no body) stores no empty body either;
//! 2. an origin that sends more than it declared on a keep-alive connection (in the same write as
//!    the body, or after a pause): the stored body is exactly the declared bytes;
//! 3. concurrent clients of a 1 MiB fill streamed slowly in pieces that match no page: every one
//!    gets the exact bytes, the origin is asked once, and the hits match; the same with the
//!    configuration reloaded (SIGHUP) while two such fills stream;
//! 4. a client that leaves mid-way through a large fill: the fill is served whole afterwards, or
//!    not stored; never a truncated hit;
//! 5. ranges of a stored large object (its first bytes, ranges across what were the pieces'
//!    boundaries, a suffix, an open end), and a ranged first request;
//! 6. hundreds of distinct large objects through an 8 MiB tier, most of them evicted, with the
//!    lengths around 64 KiB among them: every answer is exact, none a 5xx.
//!
//! Bodies are generated (`support::generated`), each object with a seed of its own, so a body
//! served for another object, or shifted, is told from the right one.

use lacquer_test_support as support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::*;

const KIB: usize = 1024;

/// Longer than any exchange here takes when nothing hangs.
const BOUND: Duration = Duration::from_secs(20);

/// A node in front of `origin` on the direct miss path or the standard one, with `[cache]` keys
/// `cache` (none: the defaults).
fn node(origin: SocketAddr, direct: bool, cache: &str) -> LacquerProcess {
    LacquerProcess::start_simple(
        origin,
        &format!("[log]\naccess = \"off\"\n[proxy]\ndirect_misses = {direct}\n[cache]\n{cache}\n"),
    )
}

fn path_label(direct: bool) -> &'static str {
    if direct {
        "direct misses"
    } else {
        "standard misses"
    }
}

/// `GET path` (plus `fields`, each ending in CRLF) on a new connection, read whole within
/// [`BOUND`], or why it could not be.
fn try_fetch(node: &LacquerProcess, path: &str, fields: &str) -> Result<RawResponse, String> {
    let mut conn = RawConn::connect(node.addr());
    conn.read_timeout = BOUND;
    conn.send(format!("GET {path} HTTP/1.1\r\nHost: large.example\r\n{fields}\r\n").as_bytes());
    conn.try_read_response(false)
}

fn fetch(node: &LacquerProcess, path: &str, fields: &str) -> RawResponse {
    try_fetch(node, path, fields).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `resp` is a `200` carrying exactly the generated body of `len` bytes and seed `seed`.
fn assert_whole(resp: &RawResponse, len: usize, seed: u8, what: &str) {
    assert_eq!(resp.status, 200, "{what}: {:?}", resp.headers);
    assert_eq!(
        resp.header("content-length").map(str::to_string),
        resp.header("transfer-encoding")
            .is_none()
            .then(|| len.to_string()),
        "{what}: framing {:?}",
        resp.headers
    );
    assert_generated_page(&resp.body, len, seed, what);
}

/// The request target of a request head.
fn target_of(head: &str) -> String {
    head.split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_string()
}

/// The method of a request head.
fn method_of(head: &str) -> String {
    head.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Writes `body` in `piece`-byte writes, flushing each (so the node reads them apart).
fn write_in_pieces(stream: &mut TcpStream, body: &[u8], piece: usize) -> std::io::Result<()> {
    for part in body.chunks(piece) {
        stream.write_all(part)?;
        stream.flush()?;
    }
    Ok(())
}

// 1. Declared more than sent.

const DECLARED: usize = 300 * KIB;

/// A raw origin declaring [`DECLARED`] bytes at every target: the first request for a target
/// `/cut/<n>` gets the head and `n` bytes, then the connection closes; every other request gets
/// the whole body. The seed is `n`'s low byte. `HEAD` gets the head alone (as it should).
fn cutting_origin() -> (RawOrigin, Arc<Mutex<HashMap<String, usize>>>) {
    let asked = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let counts = asked.clone();
    let origin = RawOrigin::answering(move |head, stream| {
        let target = target_of(head);
        let nth = {
            let mut asked = counts.lock().unwrap();
            let n = asked.entry(target.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let cut: usize = target
            .strip_prefix("/cut/")
            .and_then(|n| n.parse().ok())
            .unwrap_or(DECLARED);
        let body = generated_bytes(DECLARED, cut as u8);
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {DECLARED}\r\nCache-Control: max-age=600\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        if method_of(head) == "HEAD" {
            return;
        }
        let send = if nth == 1 { cut } else { DECLARED };
        let _ = write_in_pieces(stream, &body[..send], 16 * KIB);
    });
    (origin, asked)
}

#[test]
fn a_body_cut_short_of_its_declared_length_is_never_stored_or_served_whole() {
    for direct in [true, false] {
        let label = path_label(direct);
        let (origin, asked) = cutting_origin();
        let node = node(origin.addr, direct, "");
        for cut in [100 * KIB, 0, 64 * KIB, DECLARED - 1] {
            let target = format!("/cut/{cut}");
            let seed = cut as u8;
            let what = format!("{label}, cut at {cut}");
            match try_fetch(&node, &target, "") {
                // the cut body reached the client as a cut one: the connection ended before the
                // declared length
                Err(e) => assert!(!e.starts_with("no data"), "{what}: the answer hung: {e}"),
                // a 5xx before any byte, or (had the node retried) the whole body
                Ok(resp) if resp.status >= 500 => {}
                Ok(resp) => assert_whole(&resp, DECLARED, seed, &format!("{what}, first")),
            }
            let first_asked = asked.lock().unwrap()[&target];
            // once cut, the origin is asked again; had the node retried, it got the whole body
            let expected_asked = if first_asked == 1 { 2 } else { first_asked };

            // nothing cut was stored: the next request goes to the origin, which now behaves
            let second = fetch(&node, &target, "");
            assert_whole(&second, DECLARED, seed, &format!("{what}, second"));
            assert!(
                first_asked > 1 || !second.is_hit(),
                "{what}: the second request was a hit of a body cut at {cut}: {:?}",
                second.headers
            );
            assert_eq!(
                asked.lock().unwrap()[&target],
                expected_asked,
                "{what}: the second request went to the origin"
            );

            // the whole body is stored now: a hit, byte-identical
            let third = fetch(&node, &target, "");
            assert_whole(&third, DECLARED, seed, &format!("{what}, third"));
            assert!(third.is_hit(), "{what}: third {:?}", third.headers);
            assert_eq!(third.body, second.body, "{what}: the hit differs");
            assert_eq!(
                asked.lock().unwrap()[&target],
                expected_asked,
                "{what}: the hit went to the origin"
            );
        }
        node.assert_no_panic();
    }
}

/// A `HEAD` miss on a large object carries a declared length and no body: whatever it stores,
/// a `GET` after it gets the whole body, never an empty or short one under that length.
#[test]
fn a_head_miss_does_not_store_an_empty_large_body() {
    for direct in [true, false] {
        let label = path_label(direct);
        let (origin, _asked) = cutting_origin();
        let node = node(origin.addr, direct, "");
        let target = "/whole";
        let seed = DECLARED as u8;
        let mut conn = RawConn::connect(node.addr());
        conn.read_timeout = BOUND;
        conn.send(format!("HEAD {target} HTTP/1.1\r\nHost: large.example\r\n\r\n").as_bytes());
        let head = conn.read_response(true);
        assert_eq!(head.status, 200, "{label}");
        assert_eq!(
            head.header("content-length"),
            Some(DECLARED.to_string().as_str())
        );
        for i in 0..2 {
            let resp = fetch(&node, target, "");
            assert_whole(
                &resp,
                DECLARED,
                seed,
                &format!("{label}, GET {i} after HEAD"),
            );
        }
        node.assert_no_panic();
    }
}

// 2. Sent more than declared.

const OVER: usize = 100_000;

/// What an origin sends past the declared length: looks like another answer, so that a node
/// reading it as the next response would show it.
const EXTRA: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nCache-Control: max-age=600\r\n\r\nPOISON";

/// An origin on keep-alive connections: `/over/same` sends [`OVER`] declared bytes and
/// [`EXTRA`] in the same write, `/over/later` sends them in pieces, the extra bytes after a
/// pause; `/over/small/<n>` declares and sends `n` bytes exactly (a later request that may
/// reuse the connection).
fn overrunning_origin() -> TestOrigin {
    TestOrigin::start(|req: &RecordedRequest| {
        let path = req.path.clone();
        if let Some(n) = path.strip_prefix("/over/small/") {
            let n: usize = n.parse().unwrap();
            return OriginResponse::generated(n, 3).header("Cache-Control", "max-age=600");
        }
        let body = Bytes::from(generated_bytes(OVER, 11));
        let resp = match path.as_str() {
            "/over/same" => {
                let mut all = body.to_vec();
                all.extend_from_slice(EXTRA);
                OriginResponse::ok(all)
            }
            "/over/later" => OriginResponse::ok(support::origin::Body::Paced {
                chunks: vec![
                    body.slice(..40_000),
                    body.slice(40_000..),
                    Bytes::from_static(EXTRA),
                ],
                interval: Duration::from_millis(30),
            }),
            other => panic!("unexpected target {other}"),
        };
        resp.header("Content-Length", OVER.to_string())
            .header("Cache-Control", "max-age=600")
    })
}

#[test]
fn bytes_past_the_declared_length_are_not_stored() {
    for direct in [true, false] {
        let label = path_label(direct);
        let origin = overrunning_origin();
        let node = node(origin.addr(), direct, "");
        for (i, target) in ["/over/same", "/over/later"].into_iter().enumerate() {
            let what = format!("{label}, {target}");
            let first = fetch(&node, target, "");
            assert_whole(&first, OVER, 11, &format!("{what}, miss"));
            if target == "/over/same" {
                // extra bytes read with the body's last ones: that connection is not reused, and
                // the next request to the origin gets its own answer, not the extra bytes read as
                // one. (Extra bytes that arrive later, after the connection was taken for the
                // next request, are that request's answer as far as HTTP/1.1 can tell: not
                // checked.)
                let small = format!("/over/small/{}", 70_000 + i);
                let resp = fetch(&node, &small, "");
                assert_whole(&resp, 70_000 + i, 3, &format!("{what}, the next miss"));
            }
            for n in 0..2 {
                let hit = fetch(&node, target, "");
                assert_whole(&hit, OVER, 11, &format!("{what}, hit {n}"));
                assert!(hit.is_hit(), "{what}: {:?}", hit.headers);
                assert_eq!(
                    hit.body, first.body,
                    "{what}: hit {n} differs from the miss"
                );
            }
            assert_eq!(origin.hits_for(target), 1, "{what}");
        }
        node.assert_no_panic();
    }
}

// 3. Concurrent clients of a slow fill.

const SLOW_LEN: usize = 1 << 20;

/// An origin sending `/slow/<seed>` as [`SLOW_LEN`] declared bytes in 10,000-byte pieces (no
/// page or power of two), `pause` apart.
fn slow_origin(pause: Duration) -> TestOrigin {
    TestOrigin::start(move |req: &RecordedRequest| {
        let seed: u8 = req
            .path
            .strip_prefix("/slow/")
            .and_then(|s| s.parse().ok())
            .expect("a /slow/<seed> target");
        let body = Bytes::from(generated_bytes(SLOW_LEN, seed));
        let chunks = (0..SLOW_LEN)
            .step_by(10_000)
            .map(|at| body.slice(at..(at + 10_000).min(SLOW_LEN)))
            .collect();
        OriginResponse::ok(support::origin::Body::Paced {
            chunks,
            interval: pause,
        })
        .header("Content-Length", SLOW_LEN.to_string())
        .header("Cache-Control", "max-age=600")
    })
}

#[test]
fn concurrent_clients_of_a_slow_large_fill_all_get_the_exact_bytes() {
    const CLIENTS: usize = 8;
    for direct in [true, false] {
        let label = path_label(direct);
        let origin = slow_origin(Duration::from_millis(3));
        let node = Arc::new(node(origin.addr(), direct, ""));
        let target = "/slow/42";
        let clients: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let node = node.clone();
                let client = std::thread::spawn(move || fetch(&node, target, ""));
                if i == 0 {
                    // the others arrive while the first one's fill is being written
                    assert!(origin.wait_for_hits_for(target, 1, BOUND), "{label}");
                }
                client
            })
            .collect();
        for (i, client) in clients.into_iter().enumerate() {
            let resp = client.join().expect("client thread");
            assert_whole(&resp, SLOW_LEN, 42, &format!("{label}, client {i}"));
        }
        assert_eq!(origin.hits_for(target), 1, "{label}: one fill for all");
        for n in 0..2 {
            let hit = fetch(&node, target, "");
            assert_whole(&hit, SLOW_LEN, 42, &format!("{label}, hit {n}"));
            assert!(hit.is_hit(), "{label}: {:?}", hit.headers);
        }
        assert_eq!(origin.hits_for(target), 1, "{label}");
        node.assert_no_panic();
    }
}

/// The configuration reloaded (SIGHUP) while clients of two slow 1 MiB fills are being served:
/// each client gets the exact bytes, the origin is asked once per object, and both are hits
/// after the reload (it keeps the memory tier, the mapped bodies in it too).
#[test]
fn a_reload_in_the_middle_of_slow_large_fills_cuts_nothing() {
    for direct in [true, false] {
        let label = path_label(direct);
        let origin = slow_origin(Duration::from_millis(3));
        let node = Arc::new(node(origin.addr(), direct, ""));
        let targets = ["/slow/70", "/slow/71"];
        let clients: Vec<_> = targets
            .iter()
            .flat_map(|&target| (0..3).map(move |_| target))
            .map(|target| {
                let node = node.clone();
                (target, std::thread::spawn(move || fetch(&node, target, "")))
            })
            .collect();
        for target in targets {
            assert!(origin.wait_for_hits_for(target, 1, BOUND), "{label}");
        }
        assert!(node.signal("HUP"), "{label}");
        for (target, client) in clients {
            let resp = client.join().expect("client thread");
            let seed: u8 = target["/slow/".len()..].parse().unwrap();
            assert_whole(&resp, SLOW_LEN, seed, &format!("{label}, {target}"));
        }
        assert!(
            wait_for_log(&node, "configuration reloaded", BOUND),
            "{label}: {}",
            node.stderr_log()
        );
        for target in targets {
            let seed: u8 = target["/slow/".len()..].parse().unwrap();
            let hit = fetch(&node, target, "");
            assert_whole(&hit, SLOW_LEN, seed, &format!("{label}, {target} after"));
            assert!(hit.is_hit(), "{label}: {:?}", hit.headers);
            assert_eq!(origin.hits_for(target), 1, "{label}: {target}");
        }
        node.assert_no_panic();
    }
}

// 4. A client that leaves mid-fill.

#[test]
fn a_client_leaving_mid_fill_leaves_a_whole_object_or_none() {
    for direct in [true, false] {
        let label = path_label(direct);
        let origin = slow_origin(Duration::from_millis(5));
        let node = node(origin.addr(), direct, "");
        for (round, keep) in [0usize, 1, 200 * KIB].into_iter().enumerate() {
            let target = format!("/slow/{}", 100 + round);
            let seed = 100 + round as u8;
            let what = format!("{label}, leaving after {keep} body bytes");
            let mut leaving = TcpStream::connect(node.addr()).unwrap();
            leaving.set_read_timeout(Some(BOUND)).unwrap();
            leaving
                .write_all(
                    format!("GET {target} HTTP/1.1\r\nHost: large.example\r\n\r\n").as_bytes(),
                )
                .unwrap();
            // the head and `keep` bytes of the body, then away (a reset: unread bytes remain)
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 16 * KIB];
            let wanted = |seen: &[u8]| {
                seen.windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .is_some_and(|at| seen.len() >= at + 4 + keep)
            };
            while !wanted(&seen) {
                let n = leaving.read(&mut buf).expect("the head and first bytes");
                assert!(n > 0, "{what}: closed early");
                seen.extend_from_slice(&buf[..n]);
            }
            assert!(seen.starts_with(b"HTTP/1.1 200"), "{what}");
            let _ = leaving.shutdown(Shutdown::Both);
            drop(leaving);

            // whatever the node did with the fill, a later request gets the whole body: a hit
            // of the completed fill, a stream of it, or a fresh fetch; never a cut body
            let next = fetch(&node, &target, "");
            assert_whole(&next, SLOW_LEN, seed, &format!("{what}, next"));
            let asked = origin.hits_for(&target);
            assert!((1..=2).contains(&asked), "{what}: asked {asked} times");
            let hit = fetch(&node, &target, "");
            assert_whole(&hit, SLOW_LEN, seed, &format!("{what}, hit"));
            assert!(hit.is_hit(), "{what}: {:?}", hit.headers);
            assert_eq!(origin.hits_for(&target), asked, "{what}");
            println!("{what}: the origin was asked {asked} time(s)");
        }
        node.assert_no_panic();
    }
}

// 5. Ranges of a stored large object.

/// `resp` is a `206` with bytes `from..=to` of the generated body of `len` bytes and `seed`.
fn assert_range(resp: &RawResponse, from: usize, to: usize, len: usize, seed: u8, what: &str) {
    assert_eq!(resp.status, 206, "{what}: {:?}", resp.headers);
    assert_eq!(
        resp.header("content-range"),
        Some(format!("bytes {from}-{to}/{len}").as_str()),
        "{what}"
    );
    assert_eq!(resp.body.len(), to - from + 1, "{what}: length");
    assert_eq!(
        generated_mismatch(&resp.body, seed, from),
        None,
        "{what}: the bytes differ"
    );
}

#[test]
fn ranges_of_a_stored_large_object_are_exact() {
    for direct in [true, false] {
        let label = path_label(direct);
        let origin = slow_origin(Duration::from_millis(1));
        let node = node(origin.addr(), direct, "");
        let len = SLOW_LEN;

        // a ranged first request (a miss the node fills whole, or passes on)
        let target = "/slow/7";
        let first = fetch(&node, target, "Range: bytes=9990-10009\r\n");
        match first.status {
            206 => assert_range(
                &first,
                9990,
                10_009,
                len,
                7,
                &format!("{label}, ranged miss"),
            ),
            _ => assert_whole(&first, len, 7, &format!("{label}, ranged miss")),
        }
        // stored whole (the fill went on to the end), or stored by this request
        let whole = fetch(&node, target, "");
        assert_whole(&whole, len, 7, &format!("{label}, whole"));
        assert!(
            poll_until(BOUND, || fetch(&node, target, "").is_hit()),
            "{label}: never a hit"
        );

        let ranges: [(&str, usize, usize); 9] = [
            ("bytes=0-99", 0, 99),
            ("bytes=0-0", 0, 0),
            // across the origin's 10,000-byte pieces
            ("bytes=9990-10009", 9990, 10_009),
            ("bytes=19999-20000", 19_999, 20_000),
            // across a page and the 64 KiB mark
            ("bytes=65530-65545", 65_530, 65_545),
            ("bytes=4095-4096", 4095, 4096),
            // a large middle range across many pieces
            ("bytes=300001-812345", 300_001, 812_345),
            // a suffix, an open end
            ("bytes=-1000", len - 1000, len - 1),
            ("bytes=1048000-", 1_048_000, len - 1),
        ];
        let mut conn = RawConn::connect(node.addr());
        conn.read_timeout = BOUND;
        for (range, from, to) in ranges {
            let what = format!("{label}, {range}");
            conn.send(
                format!("GET {target} HTTP/1.1\r\nHost: large.example\r\nRange: {range}\r\n\r\n")
                    .as_bytes(),
            );
            let resp = conn.read_response(false);
            assert_range(&resp, from, to, len, 7, &what);
            assert!(resp.is_hit(), "{what}: {:?}", resp.headers);
        }
        // past the end
        conn.send(
            format!("GET {target} HTTP/1.1\r\nHost: large.example\r\nRange: bytes={len}-\r\n\r\n")
                .as_bytes(),
        );
        let beyond = conn.read_response(false);
        assert_eq!(beyond.status, 416, "{label}: {:?}", beyond.headers);
        assert_eq!(origin.hits_for(target), 1, "{label}");
        node.assert_no_panic();
    }
}

// 6. Many large objects through a small tier.

/// The length of object `i`: 64 KiB - 1, 64 KiB and 64 KiB + 1 first, then spread over
/// 64-200 KiB.
fn length_of(i: usize) -> usize {
    match i {
        0 => 64 * KIB - 1,
        1 => 64 * KIB,
        2 => 64 * KIB + 1,
        _ => 64 * KIB + (i * 7919) % (136 * KIB),
    }
}

fn seed_for(i: usize) -> u8 {
    (i % 251) as u8
}

/// An origin serving `/many/<i>` as object `i` in pieces (the last one short).
fn many_origin() -> TestOrigin {
    TestOrigin::start(|req: &RecordedRequest| {
        let i: usize = req
            .path
            .strip_prefix("/many/")
            .and_then(|s| s.parse().ok())
            .expect("a /many/<i> target");
        let len = length_of(i);
        let body = Bytes::from(generated_bytes(len, seed_for(i)));
        let piece = 24_000 + i % 1000;
        let chunks = (0..len)
            .step_by(piece)
            .map(|at| body.slice(at..(at + piece).min(len)))
            .collect();
        OriginResponse::ok(support::origin::Body::Chunked(chunks))
            .header("Content-Length", len.to_string())
            .header("Cache-Control", "max-age=600")
    })
}

#[test]
fn many_large_objects_through_a_small_tier_are_always_exact() {
    const OBJECTS: usize = 300;
    const CLIENTS: usize = 4;
    for direct in [true, false] {
        let label = path_label(direct);
        let origin = many_origin();
        let node = Arc::new(node(
            origin.addr(),
            direct,
            "memory_size = \"8MiB\"\nmax_object_size = \"1MiB\"",
        ));
        let next = Arc::new(AtomicUsize::new(0));
        // each client takes the next object, and every 7th time one fetched before (a hit or
        // a refetch of an evicted one)
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (node, next) = (node.clone(), next.clone());
                std::thread::spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= OBJECTS {
                        break;
                    }
                    let mut targets = vec![i];
                    if i % 7 == c {
                        targets.push(i / 2);
                    }
                    for i in targets {
                        let resp = fetch(&node, &format!("/many/{i}"), "");
                        assert_whole(&resp, length_of(i), seed_for(i), &format!("object {i}"));
                    }
                })
            })
            .collect();
        for client in clients {
            client
                .join()
                .unwrap_or_else(|_| panic!("{label}: a client failed"));
        }
        // a sample fetched again: evicted ones refetched, kept ones hits; exact either way
        let mut hits = 0;
        for i in (0..OBJECTS).step_by(9).chain([0, 1, 2, OBJECTS - 1]) {
            let resp = fetch(&node, &format!("/many/{i}"), "");
            assert_whole(
                &resp,
                length_of(i),
                seed_for(i),
                &format!("{label}, object {i} again"),
            );
            hits += usize::from(resp.is_hit());
        }
        // the last objects fetched are kept, and hit, with their bytes intact
        let last = fetch(&node, &format!("/many/{}", OBJECTS - 1), "");
        assert!(last.is_hit(), "{label}: {:?}", last.headers);
        assert!(
            origin.hits() > OBJECTS,
            "{label}: an 8 MiB tier evicts some of {OBJECTS} large objects"
        );
        println!(
            "{label}: {} origin requests, {hits} hits in the sample",
            origin.hits()
        );
        node.assert_no_panic();
    }
}
