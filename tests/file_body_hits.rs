//! Large hits sent from memory files: a stored body of 64 KiB or more is kept in a memory file
//! (`memfd_create`, `/memfd:lacquer-body` in `/proc/PID/fd`) when a descriptor is to be had, at
//! most a quarter of the open-file limit at once, and a fast-path hit to a plain-TCP HTTP/1.1
//! client sends it with `sendfile(2)` (`storage/memory/mapped.rs`, pingora-core's
//! `write_head_and_file`). Attacked here over real sockets, as hostile clients and a flaky network
//! would, for what `large_hits.rs` does not cover: the descriptors given back on purge, on
//! eviction and on replacement; a purge while a slow client is mid-body; a low open-file limit; a
//! client that never reads under a short `send_timeout`; bodies promoted from memcached and
//! assembled from partial content; HEAD and GET pipelined, HTTP/1.0, a request sent while a body
//! is being sent, many clients at once, clients leaving with a reset, and a slow but steady reader.
//!
//! A removed object (purged, evicted, replaced) is freed, and its file closed, only once the
//! worker thread that removed it has retired a batch of them (TinyUFO's map, `seize`, a batch of
//! 8: `vendor/patches/TinyUFO/0001`): on an idle proxy a purged object's file stays open. The
//! tests that count files after a removal make the worker retire a batch first
//! ([`retire_removed`]), on one worker thread.
//!
//! Found by these tests (2026-12-07), in the fast hit path before memory files too (a build of
//! the commit before them failed the same way): a hit whose write gave up at `send_timeout` was
//! answered again, a `504 Gateway Timeout` head written into the middle of the 200's body, with
//! no timeout of its own, so a client that read nothing kept its connection open for as long as
//! it liked (`a_client_that_never_reads_a_large_hit_is_given_up_at_send_timeout`); and one
//! timeout covered the whole answer, so a client reading slowly but steadily was cut when the
//! whole answer outlasted `send_timeout` (`a_slow_but_steady_reader_of_a_large_hit_is_not_cut_at_send_timeout`).
//! Now a failed write of a fast hit is the client's (nothing more is written to it:
//! `upstream::attempts::failure_status`), and each write that waits is bounded, not the whole
//! answer (vendored pingora-core 0033).

use lacquer_test_support as support;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::large_bodies::*;
// (named: `support::get`, reqwest's, is glob-imported too)
use support::large_bodies::get;
use support::*;

const KB100: usize = 100 * 1024;
const MB1: usize = 1024 * 1024;
const MB8: usize = 8 * 1024 * 1024;

/// The config of a proxy on `port` in front of `upstream`, with `threads` workers and `extra`
/// TOML (sections) appended.
fn config(port: u16, upstream: SocketAddr, threads: usize, extra: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{upstream}\"\nthreads = {threads}\n\
         [log]\naccess = \"off\"\n{extra}\n"
    )
}

/// A proxy with one worker thread (a blocked worker would show as other clients not served).
fn proxy(origin: &TestOrigin, extra: &str) -> LacquerProcess {
    let upstream = origin.addr();
    LacquerProcess::start_on_free_port(|port| config(port, upstream, 1, extra))
}

/// Checks that `resp` is the whole generated body of `path` (seeded by `seed`).
fn assert_body_seeded(resp: &RawResponse, len: usize, seed: u8, what: &str) {
    assert_eq!(resp.status, 200, "{what}: {:?}", resp.headers);
    assert_eq!(
        resp.header("content-length"),
        Some(len.to_string().as_str()),
        "{what}"
    );
    assert_eq!(resp.body.len(), len, "{what}");
    assert_eq!(
        generated_mismatch(&resp.body, seed, 0),
        None,
        "{what}: the body differs from this byte on"
    );
}

/// Waits until `pid`'s memory-file count satisfies `done`, for at most [`BOUND`]; returns the
/// last count (the caller asserts on it).
fn memfds_settle(pid: u32, done: impl Fn(usize) -> bool) -> usize {
    settle(|| memfds(pid), done)
}

/// The state (`/proc/net/tcp`'s hex code; `01` established) of the proxy's side of the
/// connection from the client's local port `client`; `None` once the kernel forgot it.
fn proxy_side_state(proxy_port: u16, client: u16) -> Option<String> {
    let text = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{proxy_port:04X}");
    let remote = format!("0100007F:{client:04X}");
    text.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() > 3 && cols[1] == local && cols[2] == remote).then(|| cols[3].to_string())
    })
}

/// (1) Each stored large object holds one memory file; hits open none; a small body gets none;
/// every PURGE closes its object's file, down to none; a refetch gets a file again.
#[test]
fn purged_large_objects_give_their_memory_files_back() {
    let origin = origin();
    let lacquer = proxy(&origin, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    assert_eq!(memfds(pid), 0, "no body stored yet");
    let paths: Vec<String> = (0..12)
        .map(|i| format!("/large/{}?n={i}", KB100 + i * 4099))
        .collect();
    for path in &paths {
        warm(addr, path);
    }
    assert_eq!(memfds(pid), 12, "one memory file per stored large body");

    // hits (on one connection, and a small body between) open no file of their own
    let mut conn = RawConn::connect(addr);
    for path in &paths {
        conn.send(get(path, "").as_bytes());
        let resp = conn.read_response(false);
        assert_body(&resp, path, path);
        assert!(resp.is_hit());
    }
    warm(addr, "/large/1000");
    assert_eq!(memfds(pid), 12, "hits and a 1000-byte body added a file");

    for path in &paths {
        purge(addr, path);
    }
    retire_removed(addr);
    let left = memfds_settle(pid, |n| n == 0);
    assert_eq!(
        left, 0,
        "memory files still open after every large object was purged (and retired)"
    );

    warm(addr, &paths[3]);
    assert_eq!(memfds(pid), 1, "the refetched object has a file again");
    assert_eq!(origin.hits_for(&paths[3]), 2);
    lacquer.assert_no_panic();
}

/// (1') With a 2 MiB memory tier and 60 large objects (6 MB) stored one after the other, twice,
/// the memory files open stay bounded by what the tier can hold (20 objects of 100 KiB), plus the
/// evicted objects the one worker has not retired yet (fewer than [`RETIRE_BATCH`]), not by what
/// was stored: eviction and refused admission close the files. Every answer is whole.
#[test]
fn eviction_closes_memory_files() {
    let origin = origin();
    let lacquer = proxy(
        &origin,
        "[cache]\nmemory_size = \"2MiB\"\nmax_object_size = \"1MiB\"\n",
    );
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let held = (2 * MB1) / KB100;
    let most = held + RETIRE_BATCH;
    let mut highest = 0;
    let paths: Vec<String> = (0..60).map(|i| format!("/large/{KB100}?e={i}")).collect();
    for round in 0..2 {
        for path in &paths {
            let mut conn = RawConn::connect(addr);
            for _ in 0..2 {
                conn.send(get(path, "").as_bytes());
                assert_body(&conn.read_response(false), path, path);
            }
            let now = memfds(pid);
            highest = highest.max(now);
            assert!(
                now <= most,
                "round {round}, after {path}: {now} memory files open; the tier holds at most \
                 {held} such objects, and fewer than {RETIRE_BATCH} evicted ones wait to be freed"
            );
        }
    }
    assert!(highest > 0, "no large body was ever kept in a memory file");
    // what is stored still has its files; once the evicted are retired, no more than it holds
    retire_removed(addr);
    let left = memfds_settle(pid, |n| n <= held);
    assert!(
        left <= held,
        "{left} memory files open for at most {held} objects"
    );
    lacquer.assert_no_panic();
}

/// An origin whose `/versioned` is `len` generated bytes seeded by the number of times it was
/// fetched (1, 2, ...), with `cache_control`; anything else a short cacheable text.
fn versioned_origin(len: usize, cache_control: &'static str) -> TestOrigin {
    let version = Arc::new(AtomicU8::new(0));
    TestOrigin::start(move |req: &RecordedRequest| {
        if req.path == "/versioned" {
            let v = version.fetch_add(1, Ordering::SeqCst) + 1;
            OriginResponse::generated(len, v).header("Cache-Control", cache_control)
        } else {
            OriginResponse::ok("small body").header("Cache-Control", "max-age=600")
        }
    })
}

/// (2) A slow client (small receive buffer) is mid-body of an object when it is purged: the
/// send alone keeps the purged object's file open (the object itself retired), the object is
/// refetched (another version) meanwhile, and the slow client still gets the old version whole;
/// its file is closed when that send ends, and the new object's after a purge.
#[test]
fn an_object_purged_while_a_slow_client_reads_it_is_sent_whole_and_then_closed() {
    let len = unbufferable_len();
    let origin = versioned_origin(len, "max-age=600");
    let lacquer = proxy(
        &origin,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = "/versioned";
    let mut conn = RawConn::connect(addr);
    for _ in 0..2 {
        conn.send(get(path, "").as_bytes());
        assert_body_seeded(&conn.read_response(false), len, 1, "version 1");
    }
    assert_eq!(memfds(pid), 1);

    let mut slow = Reader::new(connect_small(addr, 4096, false));
    slow.stream
        .write_all(get(path, "").as_bytes())
        .expect("send");
    let (status, length) = slow.head();
    assert_eq!((status, length), (200, len));
    let mut body = slow.body(256 * 1024, 4096, Duration::ZERO);

    // the client reads nothing meanwhile: more than the socket buffers hold is still to send
    purge(addr, path);
    retire_removed(addr);
    assert_eq!(
        memfds(pid),
        1,
        "the send in progress must hold the purged (and retired) object's file"
    );
    let fresh = fetch(addr, path);
    assert_body_seeded(&fresh, len, 2, "version 2 after the purge");
    assert!(!fresh.is_hit(), "{:?}", fresh.headers);
    assert_eq!(
        memfds(pid),
        2,
        "the new object's file and the one being sent"
    );
    // a small page meanwhile, on the one worker
    assert_eq!(fetch(addr, "/small").text(), "small body");

    body.extend(slow.body(len - body.len(), 16 * 1024, Duration::from_millis(1)));
    assert_eq!(body.len(), len, "the slow client's body was cut");
    assert_eq!(
        generated_mismatch(&body, 1, 0),
        None,
        "the slow client's body is not version 1 from this byte on"
    );
    drop(slow);

    let left = memfds_settle(pid, |n| n == 1);
    assert_eq!(left, 1, "the purged object's file outlived its last send");
    let again = fetch(addr, path);
    assert_body_seeded(&again, len, 2, "version 2 as a hit");
    assert!(again.is_hit());
    purge(addr, path);
    retire_removed(addr);
    assert_eq!(memfds_settle(pid, |n| n == 0), 0);
    lacquer.assert_no_panic();
}

/// (3) Under `prlimit --nofile=64:64` at most 16 memory files are open whatever is stored (40
/// large objects), every hit of every object is whole (from a file or by copy), the proxy still
/// accepts new connections and serves a small page, and files purged are given back to the
/// budget (new objects get files again).
#[test]
fn under_a_low_open_file_limit_at_most_a_quarter_are_memory_files_and_hits_stay_whole() {
    let origin = origin();
    let upstream = origin.addr();
    let lacquer = start_with_open_file_limit(64, |port| config(port, upstream, 1, ""));
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let budget = 64 / 4;

    let paths: Vec<String> = (0..40)
        .map(|i| format!("/large/{}?f={i}", KB100 + i * 1021))
        .collect();
    let mut highest = 0;
    for path in &paths {
        warm(addr, path);
        let now = memfds(pid);
        highest = highest.max(now);
        assert!(now <= budget, "after {path}: {now} memory files open");
    }
    assert_eq!(
        memfds(pid),
        budget,
        "the first 16 large bodies stored should have taken the whole budget"
    );
    for round in 0..2 {
        let mut conn = RawConn::connect(addr);
        for path in &paths {
            conn.send(get(path, "").as_bytes());
            let resp = conn.read_response(false);
            assert_body(&resp, path, path);
            assert!(resp.is_hit(), "round {round}, {path}: {:?}", resp.headers);
        }
        assert!(memfds(pid) <= budget);
    }

    // new connections, several at once, are still accepted and answered
    let fds = open_fds(pid);
    let mut conns: Vec<RawConn> = (0..10).map(|_| RawConn::connect(addr)).collect();
    for conn in &mut conns {
        conn.send(get("/small", "").as_bytes());
        assert_eq!(
            conn.read_response(false).text(),
            "small body",
            "{fds} descriptors open before"
        );
    }
    drop(conns);
    let mut big = RawConn::connect(addr);
    big.send(get(&paths[39], "").as_bytes());
    assert_body(&big.read_response(false), &paths[39], &paths[39]);

    for path in &paths {
        purge(addr, path);
    }
    retire_removed(addr);
    assert_eq!(memfds_settle(pid, |n| n == 0), 0);
    let later: Vec<String> = (0..4)
        .map(|i| format!("/large/{KB100}?later={i}"))
        .collect();
    for path in &later {
        warm(addr, path);
    }
    assert_eq!(
        memfds(pid),
        later.len(),
        "the purged files' places in the budget were not given back"
    );
    assert!(highest <= budget);
    lacquer.assert_no_panic();
}

/// Where in `body` (bytes that should all be a generated body's) a response head starts, and
/// its first line: what the proxy wrote into a body it had cut, if it did.
fn head_inside(body: &[u8]) -> Option<(usize, String)> {
    let at = body.windows(7).position(|w| w == b"HTTP/1.")?;
    let line = body[at..].split(|b| *b == b'\r').next().unwrap_or_default();
    Some((at, String::from_utf8_lossy(line).into_owned()))
}

/// (4) A client that asks for an 8 MiB hit and never reads, under `send_timeout = "2s"`: the
/// proxy gives the write up and closes the connection (its side of the socket leaves
/// `ESTABLISHED` while the client still reads nothing), the client finds a cut body (never
/// another answer's bytes inside it) and then the end, the one worker serves others before and
/// after, and the cut send holds no file (none open after a purge).
///
/// Before 2026-12-07 (see the module's doc) the proxy wrote a `504` head after the cut body and
/// waited, without a timeout, for the client to take it: the connection stayed established for
/// as long as the client read nothing.
#[test]
fn a_client_that_never_reads_a_large_hit_is_given_up_at_send_timeout() {
    let origin = origin();
    let lacquer = proxy(
        &origin,
        "[server]\nsend_timeout = \"2s\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = format!("/large/{}", unbufferable_len());
    warm(addr, &path);

    let stalled = connect_small(addr, 4096, false);
    let client_port = stalled.local_addr().expect("local addr").port();
    (&stalled)
        .write_all(get(&path, "").as_bytes())
        .expect("send");
    for _ in 0..2 {
        let resp = fetch(addr, &path);
        assert_body(&resp, &path, &path);
        assert!(resp.is_hit());
    }

    let start = Instant::now();
    let mut state = proxy_side_state(lacquer.port(), client_port);
    let closed = poll_until(BOUND, || {
        state = proxy_side_state(lacquer.port(), client_port);
        state.as_deref() != Some("01")
    });
    let waited = start.elapsed();
    assert_eq!(fetch(addr, "/small").text(), "small body");

    // the client reads what it was sent now
    let mut reader = Reader::new(stalled);
    let (status, length) = reader.head();
    assert_eq!(status, 200);
    let body = reader.body(length, 64 * 1024, Duration::ZERO);
    let inside = head_inside(&body);
    assert!(
        closed,
        "the proxy's side of a connection that read nothing is still established after \
         {waited:?} (send_timeout 2s); read then, the client got {} of {length} body bytes, and \
         inside them a response head: {inside:?}",
        body.len()
    );
    assert_eq!(
        inside, None,
        "the proxy wrote another answer into the cut body"
    );
    assert!(
        body.len() < length,
        "the given-up client got its whole body ({} bytes)",
        body.len()
    );
    assert_eq!(generated_mismatch(&body, seed_for(&path), 0), None);
    assert_eq!(reader.fill(1024), 0, "the connection did not end");

    let resp = fetch(addr, &path);
    assert_body(&resp, &path, &path);
    assert!(resp.is_hit());
    purge(addr, &path);
    retire_removed(addr);
    assert_eq!(
        memfds_settle(pid, |n| n == 0),
        0,
        "the cut send kept its file open"
    );
    lacquer.assert_no_panic();
}

/// (5) A large object one node wrote to memcached, read by a second node: the second node's hits
/// (the one from memcached and those from its memory after the promotion) are whole, and the
/// promoted bodies are kept in memory files there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_object_promoted_from_memcached_is_kept_in_a_memory_file() {
    let cluster = MemcachedCluster::start(1);
    let origin = origin();
    let a = cluster.node(&origin, "A", "local_ttl = \"1h\"");
    let b = cluster.node(&origin, "B", "local_ttl = \"1h\"");
    let b_pid = b.proxy.pid();
    // one memcached item, and several (a manifest and chunks)
    let paths = [
        format!("/large/{}", 300 * 1024 + 17),
        format!("/large/{}", 2 * MB1 + 4099),
    ];
    for (i, path) in paths.iter().enumerate() {
        let (a_addr, b_addr, path_owned) = (a.proxy.addr(), b.proxy.addr(), path.clone());
        let first = tokio::task::spawn_blocking(move || fetch(a_addr, &path_owned))
            .await
            .unwrap();
        assert_body(&first, path, path);
        let writes = wait_for_stat(a.admin, "writes", i as u64 + 1, BOUND).await;
        assert_eq!(writes, i as u64 + 1, "A wrote {path} to memcached");

        let path_owned = path.clone();
        let answers = tokio::task::spawn_blocking(move || {
            let mut conn = RawConn::connect(b_addr);
            (0..4)
                .map(|_| {
                    conn.send(get(&path_owned, "").as_bytes());
                    conn.read_response(false)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        for (n, resp) in answers.iter().enumerate() {
            assert_body(resp, path, path);
            assert!(resp.is_hit(), "B's answer {n}: {:?}", resp.headers);
        }
        assert_eq!(
            memfds(b_pid),
            i + 1,
            "B's promoted copies of {} objects are not all in memory files",
            i + 1
        );
        assert_eq!(origin.hits_for(path), 1);
    }
    assert_eq!(
        admin_stat(b.admin, "hits").await,
        2,
        "B read each object from memcached once, then from its memory"
    );
    // and from a file after memcached is no more asked (a fresh connection)
    let (b_addr, last) = (b.proxy.addr(), paths[1].clone());
    let resp = tokio::task::spawn_blocking(move || fetch(b_addr, &last))
        .await
        .unwrap();
    assert_body(&resp, &paths[1], &paths[1]);
    b.proxy.assert_no_panic();
}

/// (6a) HEAD and GET of a large hit pipelined on one connection: HEADs get the head alone (the
/// length announced, no body), GETs the whole body, in order.
#[test]
fn head_and_get_of_a_large_hit_pipelined_are_answered_in_order() {
    let origin = origin();
    let lacquer = proxy(&origin, "");
    let path = format!("/large/{MB8}");
    warm(lacquer.addr(), &path);
    assert_eq!(memfds(lacquer.pid()), 1, "sent from a file");
    let head = format!("HEAD {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(
        [
            head.clone(),
            get(&path, ""),
            head.clone(),
            head,
            get("/small", ""),
            get(&path, ""),
            get(&path, ""),
        ]
        .concat()
        .as_bytes(),
    );
    for (n, head_request) in [true, false, true, true].into_iter().enumerate() {
        let resp = conn.read_response(head_request);
        if head_request {
            assert_eq!(resp.status, 200);
            assert_eq!(
                resp.header("content-length"),
                Some(MB8.to_string().as_str())
            );
            assert!(resp.body.is_empty(), "answer {n}");
        } else {
            assert_body(&resp, &path, &path);
        }
    }
    assert_eq!(conn.read_response(false).text(), "small body");
    assert_body(&conn.read_response(false), &path, &path);
    assert_body(&conn.read_response(false), &path, &path);
    // nothing more: a HEAD's answer carried no stray body bytes
    assert!(!conn.is_closed(Duration::from_millis(300)));
    conn.send(get("/small", "").as_bytes());
    assert_eq!(conn.read_response(false).text(), "small body");
    assert_eq!(origin.hits_for(&path), 1);
}

/// (6b) HTTP/1.0: without keep-alive the whole body then the close; with `Connection:
/// keep-alive` two large hits on one connection.
#[test]
fn http_1_0_clients_get_large_hits_whole() {
    let origin = origin();
    let lacquer = proxy(&origin, "");
    let path = format!("/large/{}", MB8 + 3);
    warm(lacquer.addr(), &path);
    assert_eq!(memfds(lacquer.pid()), 1, "sent from a file");

    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(format!("GET {path} HTTP/1.0\r\nHost: {HOST}\r\n\r\n").as_bytes());
    let resp = conn.read_response(false);
    assert_body(&resp, &path, &path);
    assert!(
        conn.is_closed(Duration::from_secs(5)),
        "an HTTP/1.0 connection stays open"
    );

    let mut conn = RawConn::connect(lacquer.addr());
    let keep = format!("GET {path} HTTP/1.0\r\nHost: {HOST}\r\nConnection: keep-alive\r\n\r\n");
    for _ in 0..2 {
        conn.send(keep.as_bytes());
        let resp = conn.read_response(false);
        assert_body(&resp, &path, &path);
        assert!(resp.is_hit());
    }
    assert_eq!(origin.hits_for(&path), 1);
}

/// (6c) A client sends its next requests (a small page, then another large hit) while a large
/// body is still being sent to it, after reading only a part: every answer whole, in order.
#[test]
fn requests_sent_while_a_large_body_is_being_sent_are_answered_after_it() {
    let origin = origin();
    let lacquer = proxy(&origin, "");
    let big = format!("/large/{MB8}");
    let other = format!("/large/{KB100}");
    warm(lacquer.addr(), &big);
    warm(lacquer.addr(), &other);
    assert_eq!(memfds(lacquer.pid()), 2, "sent from files");
    let mut reader = Reader::new(connect_small(lacquer.addr(), 16 * 1024, false));
    reader
        .stream
        .write_all(get(&big, "").as_bytes())
        .expect("send");
    let (status, length) = reader.head();
    assert_eq!((status, length), (200, MB8));
    let mut body = reader.body(200_000, 8192, Duration::ZERO);
    // the next requests arrive mid-body, one in two pieces
    let next = [get("/small", ""), get(&other, "")].concat();
    let (first, second) = next.as_bytes().split_at(next.len() / 2 + 3);
    reader.stream.write_all(first).expect("send");
    body.extend(reader.body(body.len() + 100_000, 8192, Duration::ZERO));
    reader.stream.write_all(second).expect("send");
    body.extend(reader.body(MB8 - body.len(), 64 * 1024, Duration::ZERO));
    assert_eq!(body.len(), MB8);
    assert_eq!(generated_mismatch(&body, seed_for(&big), 0), None);

    let (status, length) = reader.head();
    assert_eq!(status, 200);
    assert_eq!(
        reader.body(length, 64 * 1024, Duration::ZERO),
        b"small body"
    );
    let (status, length) = reader.head();
    assert_eq!((status, length), (200, KB100));
    let last = reader.body(length, 64 * 1024, Duration::ZERO);
    assert_eq!(generated_mismatch(&last, seed_for(&other), 0), None);
    assert_eq!(last.len(), KB100);
}

/// (6d) 32 clients at once with small receive windows, three 4 MB hits each on keep-alive
/// connections, on one worker (their `sendfile`s interleaved and each taken in pieces, resumed
/// from its own offset) and on four: every body whole, one file for the object, and (one worker)
/// none left after a purge: no concurrent send kept a hold.
#[test]
fn many_clients_of_one_large_hit_at_once_all_get_it_whole() {
    let origin = origin();
    let upstream = origin.addr();
    for threads in [1, 4] {
        let lacquer =
            LacquerProcess::start_on_free_port(|port| config(port, upstream, threads, ""));
        let (addr, pid) = (lacquer.addr(), lacquer.pid());
        let path = format!("/large/{}?threads={threads}", 4 * MB1 + 777);
        warm(addr, &path);
        let clients: Vec<_> = (0..32)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    // a small window, so that each send is taken in pieces
                    let mut conn = Reader::new(connect_small(addr, 16 * 1024, false));
                    for i in 0..3 {
                        conn.stream
                            .write_all(get(&path, "").as_bytes())
                            .expect("send");
                        let (status, length) = conn.head();
                        assert_eq!((status, length), (200, len_of(&path)));
                        assert!(
                            head_is_hit(&conn.last_head),
                            "client {t}, request {i}: {}",
                            conn.last_head
                        );
                        let body = conn.body(length, 64 * 1024, Duration::ZERO);
                        assert_eq!(body.len(), length, "client {t}, request {i}");
                        assert_eq!(
                            generated_mismatch(&body, seed_for(&path), 0),
                            None,
                            "client {t}, request {i}"
                        );
                    }
                })
            })
            .collect();
        for client in clients {
            client.join().expect("a client failed");
        }
        assert_eq!(memfds(pid), 1, "{threads} workers");
        assert_eq!(origin.hits_for(&path), 1);
        if threads == 1 {
            purge(addr, &path);
            retire_removed(addr);
            assert_eq!(memfds_settle(pid, |n| n == 0), 0);
        }
        lacquer.assert_no_panic();
    }
}

/// (6e) Clients that leave in the middle of a large hit, some with a reset (`SO_LINGER` 0, the
/// proxy's `sendfile` then fails with `ECONNRESET` or `EPIPE`), some with their socket full and
/// unread, some after pipelining more: the one worker serves the next client whole each time,
/// and no cut send keeps a hold on the file (none open after a purge).
#[test]
fn clients_leaving_mid_body_with_resets_leave_no_file_behind() {
    let origin = origin();
    let lacquer = proxy(&origin, "[cache]\nmax_object_size = \"64MiB\"\n");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = format!("/large/{}", unbufferable_len());
    warm(addr, &path);
    for i in 0..12 {
        let reset = i % 2 == 0;
        let mut leaving = Reader::new(connect_small(addr, 8192, reset));
        leaving
            .stream
            .write_all(get(&path, "").repeat(1 + i % 3).as_bytes())
            .expect("send");
        if i % 3 != 2 {
            leaving.head();
            leaving.body(100_000 * (i + 1), 8192, Duration::ZERO);
        }
        drop(leaving);
        let resp = fetch(addr, &path);
        assert_body(&resp, &path, &path);
        assert!(resp.is_hit());
    }
    assert_eq!(memfds(pid), 1);
    purge(addr, &path);
    retire_removed(addr);
    assert_eq!(
        memfds_settle(pid, |n| n == 0),
        0,
        "a send cut by its client's leaving kept the file open"
    );
    assert_eq!(fetch(addr, "/small").text(), "small body");
    lacquer.assert_no_panic();
}

/// (6f) An object refetched (a client's `no-cache`, another version from the origin) replaces
/// the stored one: the hits after send the new version whole, and once the replaced object is
/// retired only one file is open, whatever was replaced.
#[test]
fn a_refetched_object_closes_the_file_of_the_one_it_replaces() {
    let origin = versioned_origin(MB1, "max-age=600");
    let lacquer = proxy(&origin, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = "/versioned";
    let mut conn = RawConn::connect(addr);
    for v in 1..=4u8 {
        let refetch = if v == 1 {
            ""
        } else {
            "Cache-Control: no-cache\r\n"
        };
        conn.send(get(path, refetch).as_bytes());
        let fetched = conn.read_response(false);
        assert_body_seeded(&fetched, MB1, v, "the fetch");
        assert!(!fetched.is_hit(), "{:?}", fetched.headers);
        for _ in 0..2 {
            conn.send(get(path, "").as_bytes());
            let hit = conn.read_response(false);
            assert_body_seeded(&hit, MB1, v, "a hit after it");
            assert!(hit.is_hit(), "{:?}", hit.headers);
        }
        retire_removed(addr);
        assert_eq!(
            memfds_settle(pid, |n| n == 1),
            1,
            "version {v}: the replaced versions' files are still open"
        );
    }
    assert_eq!(origin.hits_for(path), 4);
    lacquer.assert_no_panic();
}

/// (6f') A large object revalidated (a client's `no-cache`; the origin answers `304`) keeps its
/// body: the answers after are that body, whole, and one file stays open.
#[test]
fn a_revalidated_large_object_keeps_its_file_and_its_bytes() {
    let origin = TestOrigin::start(|req: &RecordedRequest| {
        if req.path != "/revalidated" {
            return OriginResponse::ok("small body").header("Cache-Control", "max-age=600");
        }
        match req.header("if-none-match") {
            Some("\"one\"") => OriginResponse::new(304),
            _ => OriginResponse::generated(MB1 + 5, 42),
        }
        .header("Cache-Control", "max-age=600")
        .header("ETag", "\"one\"")
    });
    let lacquer = proxy(&origin, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = "/revalidated";
    let mut conn = RawConn::connect(addr);
    for round in 0..3 {
        let revalidate = if round == 0 {
            ""
        } else {
            "Cache-Control: no-cache\r\n"
        };
        for extra in [revalidate, "", ""] {
            conn.send(get(path, extra).as_bytes());
            let resp = conn.read_response(false);
            assert_body_seeded(&resp, MB1 + 5, 42, &format!("round {round}"));
        }
        retire_removed(addr);
        assert_eq!(memfds_settle(pid, |n| n == 1), 1, "round {round}");
    }
    let conditional = origin
        .requests_for(path)
        .iter()
        .filter(|r| r.header("if-none-match") == Some("\"one\""))
        .count();
    assert_eq!(conditional, 2, "revalidations");
    assert_eq!(origin.hits_for(path), 3);
    lacquer.assert_no_panic();
}

/// (6g) A body assembled from two partial answers (`[cache.partial]`) is stored whole in a
/// memory file; its hits are whole, ranges of it too, and a purge closes the files.
#[test]
fn a_body_assembled_from_partial_content_is_sent_whole_from_a_file() {
    const LEN: usize = MB1 + 12_345;
    let origin = TestOrigin::start(|req: &RecordedRequest| {
        if req.path != "/assembled" {
            return OriginResponse::ok("small body").header("Cache-Control", "max-age=600");
        }
        let body = generated_bytes(LEN, 7);
        let range = req.header("range").and_then(|value| {
            let (first, last) = value.strip_prefix("bytes=")?.split_once('-')?;
            let start = first.parse::<usize>().ok()?;
            let end = last.parse::<usize>().map_or(LEN, |b| (b + 1).min(LEN));
            (start < end).then_some((start, end))
        });
        match range {
            Some((start, end)) => OriginResponse::new(206)
                .body(body[start..end].to_vec())
                .header("Content-Range", format!("bytes {start}-{}/{LEN}", end - 1)),
            None => OriginResponse::ok(body),
        }
        .header("Cache-Control", "max-age=600")
        .header("ETag", "\"v7\"")
        .header("Content-Type", "application/octet-stream")
    });
    let lacquer = proxy(&origin, "[cache.partial]\nenabled = true\n");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = "/assembled";
    let mut conn = RawConn::connect(addr);
    conn.send(get(path, "Range: bytes=0-399999\r\n").as_bytes());
    let part = conn.read_response(false);
    assert_eq!(part.status, 206, "{:?}", part.headers);
    assert_eq!(part.body, generated_range(0, 400_000, 7));
    conn.send(get(path, "Range: bytes=300000-\r\n").as_bytes());
    let beyond = conn.read_response(false);
    assert_eq!(beyond.status, 206, "{:?}", beyond.headers);
    assert_eq!(beyond.body, generated_range(300_000, LEN - 300_000, 7));
    assert_eq!(origin.hits_for(path), 2);

    for _ in 0..3 {
        conn.send(get(path, "").as_bytes());
        let whole = conn.read_response(false);
        assert_body_seeded(&whole, LEN, 7, "the assembled body");
        assert!(whole.is_hit(), "{:?}", whole.headers);
    }
    retire_removed(addr);
    assert_eq!(
        memfds_settle(pid, |n| n == 1),
        1,
        "the assembled body is not (only) kept in one memory file"
    );
    conn.send(get(path, "Range: bytes=1000000-1000099\r\n").as_bytes());
    let range = conn.read_response(false);
    assert_eq!(range.status, 206);
    assert_eq!(range.body, generated_range(1_000_000, 100, 7));
    assert_eq!(origin.hits_for(path), 2);

    purge(addr, path);
    retire_removed(addr);
    assert_eq!(memfds_settle(pid, |n| n == 0), 0);
    lacquer.assert_no_panic();
}

/// (6h) A client that reads a large hit slowly but without pause, for longer than
/// `server.send_timeout` in all (2 s; the reading takes several): none of the proxy's writes
/// waits that long for it, so it must get the whole body. `send_timeout` bounds how long "one
/// write of an answer to a client may wait for the client" (`config/server.rs`), not a whole
/// answer.
///
/// Before 2026-12-07 (see the module's doc) the fast hit path gave the whole answer
/// `send_timeout`, then wrote a `504` head into the body it cut.
#[test]
fn a_slow_but_steady_reader_of_a_large_hit_is_not_cut_at_send_timeout() {
    let origin = origin();
    let lacquer = proxy(
        &origin,
        "[server]\nsend_timeout = \"2s\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let path = format!("/large/{}", 16 * MB1);
    warm(lacquer.addr(), &path);
    let mut reader = Reader::new(connect_small(lacquer.addr(), 32 * 1024, false));
    reader
        .stream
        .write_all(get(&path, "").as_bytes())
        .expect("send");
    let (status, length) = reader.head();
    assert_eq!(status, 200);
    let start = Instant::now();
    // at most 64 KiB each 40 ms (under 1.6 MB/s): the body takes 10 s or more, each wait 40 ms
    let body = reader.body(length, 64 * 1024, Duration::from_millis(40));
    let inside = head_inside(&body);
    assert_eq!(
        body.len(),
        length,
        "a steadily reading client was cut after {:?} ({} of {} bytes; a response head inside \
         them: {inside:?})",
        start.elapsed(),
        body.len(),
        length
    );
    assert_eq!(inside, None);
    assert_eq!(generated_mismatch(&body, seed_for(&path), 0), None);
}

/// (6i) Bodies around the sizes that matter to a memory file (the 64 KiB from which a body is
/// mapped, page sizes, odd lengths): every hit whole, with a file exactly from 64 KiB.
#[test]
fn bodies_around_the_mapping_threshold_and_page_sizes_are_sent_whole() {
    let origin = origin();
    let lacquer = proxy(&origin, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let sizes = [
        65_535,
        65_536,
        65_537,
        69_631,
        69_632,
        131_071,
        MB1 - 1,
        MB1 + 1,
        3 * MB1 + 4093,
    ];
    let mut conn = RawConn::connect(addr);
    for len in sizes {
        let path = format!("/large/{len}");
        warm(addr, &path);
        for _ in 0..2 {
            conn.send(get(&path, "").as_bytes());
            let resp = conn.read_response(false);
            assert_body(&resp, &path, &path);
            assert!(resp.is_hit());
        }
    }
    let expected = sizes.iter().filter(|len| **len >= 64 * 1024).count();
    assert_eq!(memfds(pid), expected, "one file per body of 64 KiB or more");
    lacquer.assert_no_panic();
}

/// (6j) A client that sends its request and half-closes its side (`shutdown(SHUT_WR)`) gets the
/// whole large hit before the connection ends.
#[test]
fn a_client_that_half_closes_after_its_request_gets_the_whole_body() {
    let origin = origin();
    let lacquer = proxy(&origin, "");
    let path = format!("/large/{MB8}");
    warm(lacquer.addr(), &path);
    assert_eq!(memfds(lacquer.pid()), 1, "sent from a file");
    for _ in 0..3 {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(get(&path, "").as_bytes());
        conn.stream()
            .shutdown(std::net::Shutdown::Write)
            .expect("half-close");
        let resp = conn.read_response(false);
        assert_body(&resp, &path, &path);
        assert!(resp.is_hit());
    }
    assert_eq!(fetch(lacquer.addr(), "/small").text(), "small body");
}

/// (6k) With a client write buffer of 1 KiB or 1 MiB and a read buffer, small answers (written
/// through the buffer) and large hits (written past it, the head with `MSG_MORE` and the body
/// with `sendfile`) pipelined on one connection arrive in order and whole, an `Expect:
/// 100-continue` among them.
#[test]
fn small_and_large_answers_pipelined_keep_their_order_whatever_the_buffers() {
    let origin = origin();
    let upstream = origin.addr();
    for buffers in [
        "write_buffer = \"1KiB\"\nread_buffer = \"64KiB\"",
        "write_buffer = \"1MiB\"",
    ] {
        let lacquer = LacquerProcess::start_on_free_port(|port| {
            config(port, upstream, 1, &format!("[server]\n{buffers}\n"))
        });
        let big = format!("/large/{}", MB8 + 9);
        let other = format!("/large/{}", 70_000);
        warm(lacquer.addr(), &big);
        warm(lacquer.addr(), &other);
        assert_eq!(memfds(lacquer.pid()), 2, "sent from files");
        let mut conn = RawConn::connect(lacquer.addr());
        let order = [
            ("/small", ""),
            (big.as_str(), ""),
            ("/small", ""),
            ("/small", ""),
            (other.as_str(), "Expect: 100-continue\r\n"),
            (big.as_str(), ""),
            ("/small", ""),
        ];
        let pipeline: String = order.iter().map(|(path, extra)| get(path, extra)).collect();
        conn.send(pipeline.as_bytes());
        for (n, (path, _)) in order.iter().enumerate() {
            let resp = conn.read_response(false);
            if *path == "/small" {
                assert_eq!(resp.text(), "small body", "{buffers}: answer {n}");
            } else {
                assert_body(&resp, path, path);
            }
        }
        lacquer.assert_no_panic();
    }
}

/// (6l) One stored large gzip body, asked for by clients that take gzip (the stored bytes, from
/// its file) and clients that do not (a decoded copy, written by copy), pipelined alternately on
/// one connection, and over h2c (by copy): every answer is exactly its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_gzip_body_goes_whole_to_gzip_clients_identity_clients_and_h2c() {
    let plain = generated_bytes(600_000, 9);
    let coded = Arc::new(gzip(&plain));
    assert!(
        coded.len() >= 64 * 1024,
        "{} coded bytes: no file",
        coded.len()
    );
    let origin = {
        let coded = coded.clone();
        TestOrigin::start(move |req: &RecordedRequest| {
            if req.path != "/coded" {
                return OriginResponse::ok("small body").header("Cache-Control", "max-age=600");
            }
            OriginResponse::ok(coded.as_ref().clone())
                .header("Content-Encoding", "gzip")
                .header("Vary", "Accept-Encoding")
                .header("Cache-Control", "max-age=600")
        })
    };
    let upstream = origin.addr();
    let lacquer = LacquerProcess::start_on_free_port(|port| {
        config(port, upstream, 1, "[server]\nh2c = true\n")
    });
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = "/coded";
    let (h1_plain, h1_coded) = (plain.clone(), coded.clone());
    tokio::task::spawn_blocking(move || {
        let gzip_ok = "Accept-Encoding: gzip\r\n";
        let mut conn = RawConn::connect(addr);
        conn.send(get(path, gzip_ok).as_bytes());
        assert_eq!(conn.read_response(false).body, *h1_coded, "the fill");
        let order = [gzip_ok, "", gzip_ok, gzip_ok, "", "", gzip_ok];
        let pipeline: String = order.iter().map(|extra| get(path, extra)).collect();
        conn.send(pipeline.as_bytes());
        for (n, extra) in order.iter().enumerate() {
            let resp = conn.read_response(false);
            assert_eq!(resp.status, 200, "answer {n}");
            if extra.is_empty() {
                assert_eq!(resp.header("content-encoding"), None, "answer {n}");
                assert!(
                    resp.body == h1_plain,
                    "answer {n}: the decoded body differs"
                );
            } else {
                assert_eq!(resp.header("content-encoding"), Some("gzip"), "answer {n}");
                assert!(resp.is_hit(), "answer {n}: {:?}", resp.headers);
                assert!(
                    resp.body == *h1_coded,
                    "answer {n}: the stored gzip bytes differ"
                );
            }
        }
    })
    .await
    .unwrap();
    assert!(memfds(pid) >= 1, "the stored gzip body has no memory file");

    // over h2c the site is the URL's authority: its own object, filled once, then hits
    let client = h2c_client();
    for (n, accept) in ["gzip", "gzip", "identity", "gzip", "identity"]
        .into_iter()
        .enumerate()
    {
        let resp = send(
            &client,
            "GET",
            &lacquer.url(path),
            &[("accept-encoding", accept)],
            None,
        )
        .await
        .expect("an h2c answer");
        assert_eq!(resp.status, 200, "h2c answer {n}");
        assert_eq!(resp.version, reqwest::Version::HTTP_2);
        if accept == "gzip" {
            assert!(
                resp.body[..] == coded[..],
                "h2c answer {n}: the gzip bytes differ"
            );
        } else {
            assert!(
                resp.body[..] == plain[..],
                "h2c answer {n}: the decoded body differs"
            );
        }
        if n > 0 {
            assert!(resp.is_hit(), "h2c answer {n}: {:?}", resp.cache_status());
        }
    }
    assert_eq!(origin.hits_for(path), 2, "one fill per site");
    lacquer.assert_no_panic();
}

/// A large hit leaves from its memory file whichever way its head is written: the kept wire
/// form, and a head built per hit because a rule edits it (`set_response_headers`, which sends
/// the hit through `send_vectored`). Over 20 hits of 1 MiB each, the proxy reads at least the
/// bodies' bytes by `sendfile` (`rchar`); a body written from memory would add nothing there but
/// the requests' few bytes. The edited hits (1 MiB and a byte) carry the rule's field and are whole. Before
/// 2026-12-07 (later stop) the rule's hits were written with `writev`: the second half failed.
#[test]
fn large_hits_are_sent_from_their_file_whether_or_not_a_rule_edits_their_head() {
    let origin = origin();
    let lacquer = proxy(
        &origin,
        "[[rules]]\npath_regex = \"^/large/1048577$\"\nset_response_headers = { \"X-Edited\" = \"1\" }\n",
    );
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    for (path, edited) in [
        (format!("/large/{MB1}"), false),
        (format!("/large/{}", MB1 + 1), true),
    ] {
        warm(addr, &path);
        let mut conn = RawConn::connect(addr);
        let before = bytes_read(pid);
        for _ in 0..20 {
            conn.send(get(&path, "").as_bytes());
            let resp = conn.read_response(false);
            assert_body(&resp, &path, &path);
            assert!(resp.is_hit(), "{path}: {:?}", resp.headers);
            assert_eq!(
                resp.header("x-edited").is_some(),
                edited,
                "{path}: {:?}",
                resp.headers
            );
        }
        let read = bytes_read(pid) - before;
        assert!(
            read >= 20 * MB1 as u64,
            "{path}: 20 hits of 1 MiB read {read} bytes by read-like calls: not sent from the file"
        );
    }
    lacquer.assert_no_panic();
}
