//! A client's HTTP/1 connection after an origin failure: a complete 502 or 504 (or a stale copy
//! served under `stale-if-error`) leaves it open for the next request, as nginx and Varnish do,
//! but only when it is provably between two messages. A request body not read to its end, an
//! answer cut after its head went out, an upgrade, HTTP/1.0 without keep-alive and
//! `Connection: close` still close it, and a body's bytes are never parsed as a next request.
//! Both of Lacquer's forwarding paths are checked: its own exchange (`direct_pass`, here with the
//! cache off) and Pingora's standard path.

use lacquer_test_support as support;

use std::io::ErrorKind;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use support::*;

mod error_answer_common;
use error_answer_common::{
    answer, connect, get, says_close, start, text, PATHS, SMUGGLED, STANDARD,
};

/// `/ok...`: a whole `200` (`ok`), never stored. `/hang...`: read, never answered (until the
/// origin is dropped or 30 s pass). `/cut...`: a head promising 1000 bytes, 5 sent, closed.
/// Anything else (`/reset...`): the connection closed without an answer. Every connection is
/// closed after its one answer.
fn failing_origin() -> RawOrigin {
    RawOrigin::answering(|head, stream| {
        let path = path_of(head);
        if path.starts_with("/ok") {
            write_quietly(
                stream,
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nok",
            );
        } else if path.starts_with("/hang") {
            // until the proxy gives up (closes its side) or 30 s pass
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until {
                match stream.peek(&mut [0u8; 1]) {
                    Ok(0) => return,
                    Err(e) if !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        return
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        } else if path.starts_with("/cut") {
            write_quietly(
                stream,
                b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: no-store\r\n\r\nhello",
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// An error answer that keeps its connection does not say it closes it.
fn assert_kept(r: &RawResponse, why: &str) {
    assert!(!says_close(r), "{why}: {r:?}");
}

// --- an origin that refuses connections: 502, then the next request on the connection --------

#[test]
fn a_502_for_a_refused_connection_keeps_the_client_connection() {
    for (name, path) in PATHS {
        let refusing = RefusingPort::bind();
        let addr = refusing.addr();
        let lacquer = start(addr, path);
        let mut conn = connect(&lacquer);
        for i in 0..2 {
            conn.send(&get(&format!("/down/{i}")));
            let r = answer(&mut conn, &format!("{name}: request {i}"));
            assert_eq!(r.status, 502, "{name}: {r:?}");
            assert_kept(&r, name);
        }
        // the origin comes back: the same connection gets its answer
        drop(refusing);
        let origin = TestOrigin::start_on(addr, |_| {
            OriginResponse::ok("back").header("Cache-Control", "no-store")
        });
        conn.send(&get("/up"));
        let r = answer(&mut conn, &format!("{name}: after the outage"));
        assert_eq!((r.status, r.text().as_str()), (200, "back"), "{name}");
        assert_eq!(origin.hits_for("/up"), 1, "{name}");
        lacquer.assert_no_panic();
    }
}

// --- an origin that accepts but never answers: 504, then the next request ----------------------

#[test]
fn a_504_for_an_origin_that_never_answers_keeps_the_client_connection() {
    for (name, path) in PATHS {
        let origin = failing_origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        conn.send(&get("/hang"));
        let r = answer(&mut conn, name);
        assert_eq!(r.status, 504, "{name}: {r:?}");
        assert_kept(&r, name);
        conn.send(&get("/ok"));
        let r = answer(&mut conn, &format!("{name}: the request after the 504"));
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{name}");
        lacquer.assert_no_panic();
    }
}

#[test]
fn a_502_for_a_reset_keeps_the_client_connection() {
    for (name, path) in PATHS {
        let origin = failing_origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        conn.send(&get("/reset"));
        let r = answer(&mut conn, name);
        assert_eq!(r.status, 502, "{name}: {r:?}");
        conn.send(&get("/ok"));
        let r = answer(&mut conn, &format!("{name}: the request after the 502"));
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{name}");
        lacquer.assert_no_panic();
    }
}

// --- a pipelined pair whose first request fails ------------------------------------------------

#[test]
fn a_pipelined_pair_whose_first_request_fails_gets_both_answers_in_order() {
    for (name, path) in PATHS {
        let origin = failing_origin();
        let lacquer = start(origin.addr, path);
        for first in ["/reset", "/hang"] {
            let mut conn = connect(&lacquer);
            let mut both = get(first);
            both.extend_from_slice(&get("/ok/second"));
            conn.send(&both);
            let r = answer(&mut conn, &format!("{name} {first}: first"));
            assert!(matches!(r.status, 502 | 504), "{name} {first}: {r:?}");
            let r = answer(&mut conn, &format!("{name} {first}: second"));
            assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{name} {first}");
        }
        lacquer.assert_no_panic();
    }
}

// --- a request body that looks like a request ---------------------------------------------------

#[test]
fn a_failed_posts_body_is_never_taken_for_a_request() {
    for (name, path) in PATHS {
        let origin = failing_origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        let mut bytes = format!(
            "POST /reset HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
            SMUGGLED.len()
        )
        .into_bytes();
        bytes.extend_from_slice(SMUGGLED);
        conn.send(&bytes);
        let r = answer(&mut conn, &format!("{name}: the POST"));
        assert_eq!(r.status, 502, "{name}: {r:?}");
        conn.send(&get("/ok/after"));
        let r = answer(&mut conn, &format!("{name}: the GET after the POST"));
        assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{name}");
        // exactly two answers: nothing answered the body as a request of its own
        let rest = conn.read_rest();
        assert!(rest.is_empty(), "{name}: a third answer: {:?}", text(&rest));
        assert_eq!(
            origin.request_lines(),
            ["POST /reset HTTP/1.1", "GET /ok/after HTTP/1.1"],
            "{name}"
        );
        lacquer.assert_no_panic();
    }
}

/// The origin fails while the body is still arriving (the client sent half of it and waits):
/// the error answer reads the body by its framing for at most a second
/// (`error_answer::BODY_DRAIN_WAIT`), then gives the connection up: a 502 saying
/// `Connection: close`, the connection closed, the rest of the body and a request after it never
/// parsed.
#[test]
fn a_body_still_arriving_when_the_origin_fails_closes_the_connection() {
    // Pingora's standard path, the only one that contacts the origin before the body is whole
    // (Lacquer's exchange reads a body whole first, `a_failed_posts_body_is_never_taken...`)
    let origin = failing_origin();
    let lacquer = start(origin.addr, STANDARD);
    let mut conn = connect(&lacquer);
    let len = SMUGGLED.len() * 2;
    let mut bytes =
        format!("POST /reset HTTP/1.1\r\nHost: test\r\nContent-Length: {len}\r\n\r\n").into_bytes();
    bytes.extend_from_slice(SMUGGLED);
    let sent = Instant::now();
    conn.send(&bytes);
    let r = answer(&mut conn, "the POST");
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(conn.is_closed(Duration::from_secs(10)), "kept after a 502");
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "the close waited for the body: {:?}",
        sent.elapsed()
    );
    // the rest of the body, then a request: too late, nothing of it is read
    let mut rest = SMUGGLED.to_vec();
    rest.extend_from_slice(&get("/ok/after"));
    let _ = conn.try_send(&rest);
    assert!(conn.read_rest().is_empty());
    assert_eq!(origin.request_lines(), ["POST /reset HTTP/1.1"]);
    lacquer.assert_no_panic();
}

// --- what still closes ---------------------------------------------------------------------------

#[test]
fn an_answer_cut_after_its_head_went_out_closes_the_connection() {
    for (name, path) in PATHS {
        let origin = failing_origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        conn.send(&get("/cut"));
        // the head (and the 5 bytes) went out: the answer can only be cut, never completed
        assert!(conn.try_read_response(false).is_err(), "{name}");
        assert!(conn.is_closed(Duration::from_secs(5)), "{name}");
        lacquer.assert_no_panic();
    }
}

#[test]
fn http_1_0_and_connection_close_are_closed_after_the_error() {
    for (name, path) in PATHS {
        let origin = failing_origin();
        let lacquer = start(origin.addr, path);
        let closing = [
            ("HTTP/1.0", "GET /reset HTTP/1.0\r\nHost: test\r\n\r\n"),
            (
                "Connection: close",
                "GET /reset HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n",
            ),
            (
                "an upgrade",
                "GET /reset HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\n\
                 Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            ),
        ];
        for (why, request) in closing {
            let mut conn = connect(&lacquer);
            conn.send(request.as_bytes());
            let r = answer(&mut conn, &format!("{name}, {why}"));
            assert_eq!(r.status, 502, "{name}, {why}: {r:?}");
            assert!(
                conn.is_closed(Duration::from_secs(5)),
                "{name}, {why}: kept"
            );
        }
        // HTTP/1.0 that asks for keep-alive keeps it, as after any answer
        let mut conn = connect(&lacquer);
        conn.send(b"GET /reset HTTP/1.0\r\nHost: test\r\nConnection: keep-alive\r\n\r\n");
        let r = answer(&mut conn, &format!("{name}, HTTP/1.0 keep-alive"));
        assert_eq!(r.status, 502, "{name}: {r:?}");
        conn.send(b"GET /ok HTTP/1.0\r\nHost: test\r\nConnection: keep-alive\r\n\r\n");
        let r = answer(&mut conn, &format!("{name}, HTTP/1.0 keep-alive: second"));
        assert_eq!(r.status, 200, "{name}: {r:?}");
        lacquer.assert_no_panic();
    }
}

// --- stale-if-error ------------------------------------------------------------------------------

#[test]
fn a_stale_answer_after_an_origin_failure_keeps_the_connection_for_a_pipelined_request() {
    // `/stale` is answered once (stale after a second, usable on error for ten minutes), then
    // every connection asking for it is closed unanswered; `/ok` is always answered
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let origin = RawOrigin::answering(move |head, stream| {
        let path = path_of(head);
        if path.starts_with("/ok") {
            write_quietly(
                stream,
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nok",
            );
        } else if count.fetch_add(1, Ordering::SeqCst) == 0 {
            write_quietly(
                stream,
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\
                  Cache-Control: max-age=1, stale-if-error=600\r\nConnection: close\r\n\r\nstale",
            );
        }
    });
    let lacquer = start(origin.addr, STANDARD);
    let mut conn = connect(&lacquer);
    conn.send(&get("/stale"));
    assert_eq!(answer(&mut conn, "storing").text(), "stale");
    std::thread::sleep(Duration::from_millis(2100));
    let mut both = get("/stale");
    both.extend_from_slice(&get("/ok/behind"));
    conn.send(&both);
    let r = answer(&mut conn, "the stale answer");
    assert_eq!((r.status, r.text().as_str()), (200, "stale"), "{r:?}");
    assert_kept(&r, "the stale answer");
    let r = answer(&mut conn, "the request pipelined behind the stale answer");
    assert_eq!((r.status, r.text().as_str()), (200, "ok"), "{r:?}");
    assert!(
        asked.load(Ordering::SeqCst) >= 2,
        "the origin was asked again"
    );
    lacquer.assert_no_panic();
}
