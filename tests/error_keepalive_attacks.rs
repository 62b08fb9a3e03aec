//! Attacks on the client's HTTP/1 connection kept after an origin failure (`fail_to_proxy`,
//! `error_answer::keeps_connection`, pingora-proxy patch 0019): an attacker's or a flaky
//! network's request bodies, pipelines, half-closes and interim answers around a 502/503/504 or a
//! stale answer served under `stale-if-error`. The promise checked throughout: the connection is
//! kept only between two messages, so no byte of a request body or of an origin's answer is ever
//! taken for a next request or for the answer to one, answers stay in request order, a kept
//! connection is never held without bound, and it leaks no fairness or backend slot. Both of
//! Lacquer's forwarding paths are attacked: its own exchange (`direct_pass`, the cache off) and
//! Pingora's standard path.

use lacquer_test_support as support;

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use support::*;

mod error_answer_common;
use error_answer_common::{
    answer, connect, get, says_close, start, text, COMMON, HANG_GUARD, PATHS, SMUGGLED, STANDARD,
};

/// An origin whose answers name the request they answer. `/ok...`: `200`, its body the request
/// target. `/hang...`: never answered (until the proxy gives up). `/partial...`: 100 bytes of the
/// body read, then closed unanswered. `/early...`: a `103 Early Hints`, then closed.
/// `/continue...`: an unasked `100 Continue`, then closed. `/o502...`: the origin's own `502`,
/// body `hello`, framed by its length. `/c502...`: the same, delimited by the close.
/// `/cut502...`: a `502` promising 10 bytes, 5 sent, closed. Anything else (`/reset...`): closed
/// unanswered. One answer per connection.
fn origin() -> RawOrigin {
    RawOrigin::answering(|head, stream| {
        let path = path_of(head).to_string();
        if path.starts_with("/ok") {
            ok_answer(stream, &path);
        } else if path.starts_with("/hang") {
            hang(stream);
        } else if path.starts_with("/partial") {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = stream.read(&mut [0u8; 100]);
        } else if path.starts_with("/early") {
            write_quietly(
                stream,
                b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
            );
            std::thread::sleep(Duration::from_millis(50));
        } else if path.starts_with("/continue") {
            write_quietly(stream, b"HTTP/1.1 100 Continue\r\n\r\n");
            std::thread::sleep(Duration::from_millis(50));
        } else if path.starts_with("/o502") {
            write_quietly(
                stream,
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nhello",
            );
        } else if path.starts_with("/c502") {
            write_quietly(
                stream,
                b"HTTP/1.1 502 Bad Gateway\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nhello",
            );
        } else if path.starts_with("/cut502") {
            write_quietly(
                stream,
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 10\r\nCache-Control: no-store\r\n\
                  \r\nhello",
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

fn ok_answer(stream: &mut TcpStream, path: &str) {
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
         Connection: close\r\n\r\n{path}",
        path.len()
    );
    write_quietly(stream, answer.as_bytes());
}

/// Until the proxy gives up (closes its side) or 30 s pass.
fn hang(stream: &mut TcpStream) {
    let _ = stream.set_nonblocking(true);
    let until = Instant::now() + Duration::from_secs(30);
    let mut sink = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => return,
        }
    }
}

/// No request head the origin read came out of a request body.
fn assert_nothing_smuggled(origin: &RawOrigin, why: &str) {
    let lines = origin.request_lines();
    assert!(
        !lines.iter().any(|l| l.contains("/smuggled")),
        "{why}: a body's bytes reached the origin as a request: {lines:?}"
    );
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn chunked_post(path: &str, chunked_body: &[u8]) -> Vec<u8> {
    let mut bytes =
        format!("POST {path} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n")
            .into_bytes();
    bytes.extend_from_slice(chunked_body);
    bytes
}

/// `body` as one chunk, then the last chunk.
fn one_chunk(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}

/// `len` bytes of request text, the body an attacker would like parsed as requests.
fn smuggling_body(len: usize) -> Vec<u8> {
    SMUGGLED.iter().copied().cycle().take(len).collect()
}

/// After an error answer `r` with a request `next` (answered `/ok...` by its target) queued
/// behind it: a connection the answer keeps carries `next` to its own answer; one it closes is
/// closed, nothing more answered. Either way nothing follows.
fn next_is_answered_or_closed(conn: &mut RawConn, r: &RawResponse, next: &str, why: &str) {
    if says_close(r) {
        assert!(
            conn.is_closed(Duration::from_secs(5)),
            "{why}: said close, kept"
        );
        let rest = conn.read_rest();
        assert!(
            rest.is_empty(),
            "{why}: more after a closing answer: {:?}",
            text(&rest)
        );
    } else {
        let n = answer(conn, &format!("{why}: the request after the kept error"));
        assert_eq!(
            (n.status, n.text().as_str()),
            (200, next),
            "{why}: the next request's answer: {n:?}"
        );
    }
}

/// Sends `bytes` one slice at a time with `pause` between them, on a thread; stops at the first
/// write the proxy refuses.
fn dribble(stream: &TcpStream, bytes: Vec<u8>, step: usize, pause: Duration) {
    let mut stream = stream.try_clone().unwrap();
    std::thread::spawn(move || {
        for piece in bytes.chunks(step) {
            if stream.write_all(piece).is_err() {
                return;
            }
            std::thread::sleep(pause);
        }
    });
}

// --- chunked bodies ------------------------------------------------------------------------------

/// Attack: chunked bodies whose data, chunk extensions and trailer fields are request text, sent
/// to a failing origin with a request pipelined behind. Promise: the body is read by its framing
/// to its last chunk and trailers; the queued request is the only next one, and nothing of the
/// body reaches the origin as a request.
#[test]
fn chunked_bodies_with_trailers_and_extensions_are_never_taken_for_requests() {
    let trailer = [
        b"5\r\nhello\r\n0\r\nX-Next: GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"5;x=\"GET /smuggled HTTP/1.1\"\r\nhello\r\n0\r\n\r\n".to_vec(),
    ];
    let mut many_small: Vec<u8> = SMUGGLED
        .iter()
        .flat_map(|b| {
            let mut c = b"1\r\n".to_vec();
            c.push(*b);
            c.extend_from_slice(b"\r\n");
            c
        })
        .collect();
    many_small.extend_from_slice(b"0\r\n\r\n");
    let bodies = [
        one_chunk(SMUGGLED),
        many_small,
        trailer[0].clone(),
        trailer[1].clone(),
    ];
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for (i, body) in bodies.iter().enumerate() {
            let why = format!("{name}, body {i}");
            let mut conn = connect(&lacquer);
            let mut bytes = chunked_post("/reset", body);
            bytes.extend_from_slice(&get("/ok/after"));
            conn.send(&bytes);
            let r = answer(&mut conn, &why);
            assert_eq!(r.status, 502, "{why}: {r:?}");
            next_is_answered_or_closed(&mut conn, &r, "/ok/after", &why);
            assert!(
                conn.read_rest().is_empty(),
                "{why}: a third answer on the connection"
            );
        }
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: malformed chunked bodies (bare LF after chunk data, bare LF ending a chunk-size line,
/// data longer than its size, a size that is not hex, an overflowing size), each followed by a
/// request. Promise: a body that cannot be framed is never "read to its end": the error answer
/// closes the connection, and what follows the malformed body is never answered nor forwarded.
#[test]
fn malformed_chunked_bodies_close_the_connection_after_the_error() {
    let bodies: [&[u8]; 6] = [
        b"5\r\nhello\n0\r\n\r\n",
        b"5\nhello\r\n0\r\n\r\n",
        b"2\r\nhello\r\n0\r\n\r\n",
        b"zz\r\nhello\r\n0\r\n\r\n",
        b"fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\n\n",
    ];
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for (i, body) in bodies.iter().enumerate() {
            let why = format!("{name}, malformed body {i} {:?}", text(body));
            let mut conn = connect(&lacquer);
            let mut bytes = chunked_post("/reset", body);
            bytes.extend_from_slice(&get("/ok/after-malformed"));
            conn.send(&bytes);
            let all = conn.read_rest();
            let answers = parse_responses(&all, false);
            assert!(
                answers.len() <= 1,
                "{why}: the bytes after a malformed body were answered: {:?}",
                text(&all)
            );
            if let Some(r) = answers.first() {
                assert!(r.status >= 400, "{why}: {r:?}");
                assert!(says_close(r), "{why}: kept after a malformed body: {r:?}");
            }
        }
        let lines = origin.request_lines();
        assert!(
            !lines.iter().any(|l| l.contains("/ok/after-malformed")),
            "{name}: a request after a malformed body was forwarded: {lines:?}"
        );
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

// --- the drain's 64 KiB and 1 s ----------------------------------------------------------------

/// Attack: bodies at the drain's size bound (64 KiB and 64 KiB + 1, by length and chunked),
/// made of request text, sent whole with the head and a request queued behind them, to an
/// origin that closes unanswered. Promise: whichever side of the bound, a kept connection answers
/// only the queued request next, a closed one answers nothing more, no body byte is a request.
#[test]
fn bodies_at_the_drain_bound_are_kept_or_closed_never_parsed() {
    const KIB64: usize = 64 * 1024;
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for len in [KIB64, KIB64 + 1] {
            for chunked in [false, true] {
                let why = format!("{name}, {len} bytes, chunked {chunked}");
                let body = smuggling_body(len);
                let mut bytes = if chunked {
                    chunked_post("/reset", &one_chunk(&body))
                } else {
                    post("/reset", &body)
                };
                bytes.extend_from_slice(&get("/ok/after"));
                let mut conn = connect(&lacquer);
                let writer = conn.stream().try_clone().unwrap();
                // sent on a thread: a proxy that closes early must not block the test
                let sender = std::thread::spawn(move || {
                    let mut writer = writer;
                    let _ = writer.write_all(&bytes);
                });
                let r = answer(&mut conn, &why);
                assert_eq!(r.status, 502, "{why}: {r:?}");
                next_is_answered_or_closed(&mut conn, &r, "/ok/after", &why);
                let _ = sender.join();
            }
        }
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: a body that ends within the drain's second (half sent with the head, the rest 300 ms
/// after the origin failed), then a request. Promise: the drain reads the rest by its framing and
/// keeps the connection; the request after it is answered as itself, nothing of the body is.
#[test]
fn a_body_that_ends_within_the_drain_keeps_the_connection_in_step() {
    let origin = origin();
    let lacquer = start(origin.addr, STANDARD);
    let mut conn = connect(&lacquer);
    let body = smuggling_body(SMUGGLED.len() * 2);
    let bytes = post("/reset", &body);
    let half = bytes.len() - SMUGGLED.len();
    conn.send(&bytes[..half]);
    std::thread::sleep(Duration::from_millis(300));
    let mut rest = bytes[half..].to_vec();
    rest.extend_from_slice(&get("/ok/after"));
    conn.send(&rest);
    let r = answer(&mut conn, "the POST");
    assert_eq!(r.status, 502, "{r:?}");
    assert!(
        !says_close(&r),
        "a body ending within the drain closed: {r:?}"
    );
    next_is_answered_or_closed(&mut conn, &r, "/ok/after", "after the drained body");
    assert_nothing_smuggled(&origin, "drained body");
    lacquer.assert_no_panic();
}

/// Attack: slowloris inside the drain: a body (by length, then chunked) sent a byte every 100 ms
/// after the origin failed. Promise: the error answer waits a bounded time, says
/// `Connection: close` and closes; the dribbled bytes (request text) are never parsed.
#[test]
fn a_slowloris_body_inside_the_drain_is_cut_off_within_bounds() {
    for chunked in [false, true] {
        let why = format!("chunked {chunked}");
        let origin = origin();
        let lacquer = start(origin.addr, STANDARD);
        let mut conn = connect(&lacquer);
        let body = smuggling_body(300);
        let bytes = if chunked {
            chunked_post("/reset", &one_chunk(&body))
        } else {
            post("/reset", &body)
        };
        let head_end = support::raw_text::find(&bytes, b"\r\n\r\n").unwrap() + 4;
        let sent = Instant::now();
        conn.send(&bytes[..head_end + 3]);
        let mut tail = bytes[head_end + 3..].to_vec();
        tail.extend_from_slice(&get("/ok/after"));
        dribble(conn.stream(), tail, 1, Duration::from_millis(100));
        let r = answer(&mut conn, &why);
        assert_eq!(r.status, 502, "{why}: {r:?}");
        assert!(says_close(&r), "{why}: kept while the body dribbles: {r:?}");
        assert!(conn.is_closed(Duration::from_secs(10)), "{why}: not closed");
        assert!(
            sent.elapsed() < Duration::from_secs(8),
            "{why}: the drain was not bounded: {:?}",
            sent.elapsed()
        );
        assert!(conn.read_rest().is_empty(), "{why}: a second answer");
        assert_eq!(origin.request_lines(), ["POST /reset HTTP/1.1"], "{why}");
        lacquer.assert_no_panic();
    }
}

/// Attack: the origin reads part of a streamed body (standard path) then closes; the body is
/// request text, 40 KiB (under the drain's bound) and 300 KiB (over it), a request queued behind.
/// Promise: kept only when the rest was read by its framing; the next answer is the queued
/// request's, or nothing.
#[test]
fn an_origin_failing_midway_through_a_streamed_body_leaves_no_body_bytes_behind() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for len in [40 * 1024, 300 * 1024] {
            let why = format!("{name}, {len} bytes");
            let mut bytes = post("/partial", &smuggling_body(len));
            bytes.extend_from_slice(&get("/ok/after"));
            let mut conn = connect(&lacquer);
            let writer = conn.stream().try_clone().unwrap();
            let sender = std::thread::spawn(move || {
                let mut writer = writer;
                let _ = writer.write_all(&bytes);
            });
            match conn.try_read_response(false) {
                Ok(r) => {
                    assert_eq!(r.status, 502, "{why}: {r:?}");
                    next_is_answered_or_closed(&mut conn, &r, "/ok/after", &why);
                }
                // a close while the client still sends may reset the answer away: allowed for
                // the body over the bound only
                Err(e) => assert!(len > 64 * 1024, "{why}: no answer: {e}"),
            }
            let _ = sender.join();
        }
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

// --- half-close, pipelines, HEAD, Expect, HTTP/1.0 -------------------------------------------------

/// Attack: a client that half-closes right after its body, the origin failing (closed, or never
/// answering). Promise: at most the one error answer, then the connection ends within bounds
/// (not held open by the kept-connection logic).
#[test]
fn a_client_half_closing_after_its_body_is_not_held_open() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for target in ["/reset", "/hang"] {
            let why = format!("{name}, {target}");
            let mut conn = connect(&lacquer);
            conn.send(&post(target, SMUGGLED));
            conn.stream().shutdown(Shutdown::Write).unwrap();
            let began = Instant::now();
            let all = conn.read_rest();
            assert!(
                began.elapsed() < Duration::from_secs(8),
                "{why}: held {:?}",
                began.elapsed()
            );
            let answers = parse_responses(&all, false);
            assert!(answers.len() <= 1, "{why}: {:?}", text(&all));
            for r in answers {
                assert!(matches!(r.status, 502 | 504), "{why}: {r:?}");
            }
        }
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: a pipeline of POSTs with request-text bodies (by length and chunked) queued behind a
/// failing POST, and a failure in the middle of a pipeline. Promise: every request gets its own
/// answer, in order; the origin sees exactly the pipeline's requests.
#[test]
fn posts_pipelined_around_a_failing_post_get_their_own_answers_in_order() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        let mut bytes = post("/reset/1", SMUGGLED);
        bytes.extend_from_slice(&post("/ok/2", SMUGGLED));
        bytes.extend_from_slice(&chunked_post("/ok/3", &one_chunk(SMUGGLED)));
        bytes.extend_from_slice(&chunked_post("/reset/4", &one_chunk(SMUGGLED)));
        bytes.extend_from_slice(&post("/ok/5", SMUGGLED));
        bytes.extend_from_slice(&get("/ok/6"));
        conn.send(&bytes);
        for (i, want) in ["", "/ok/2", "/ok/3", "", "/ok/5", "/ok/6"]
            .iter()
            .enumerate()
        {
            let why = format!("{name}: answer {}", i + 1);
            let r = answer(&mut conn, &why);
            if want.is_empty() {
                assert_eq!(r.status, 502, "{why}: {r:?}");
                assert!(!says_close(&r), "{why}: a whole body closed: {r:?}");
            } else {
                assert_eq!((r.status, r.text().as_str()), (200, *want), "{why}");
            }
        }
        assert!(conn.read_rest().is_empty(), "{name}: an answer too many");
        let mut lines = origin.request_lines();
        lines.sort();
        assert_eq!(
            lines,
            [
                "GET /ok/6 HTTP/1.1",
                "POST /ok/2 HTTP/1.1",
                "POST /ok/3 HTTP/1.1",
                "POST /ok/5 HTTP/1.1",
                "POST /reset/1 HTTP/1.1",
                "POST /reset/4 HTTP/1.1",
            ],
            "{name}"
        );
        lacquer.assert_no_panic();
    }
}

/// Attack: a HEAD that fails (502 and 504) with a GET pipelined behind it. Promise: the error
/// answer to a HEAD has no body bytes (a body would be read as the start of the GET's answer);
/// the GET's answer follows whole.
#[test]
fn a_failing_heads_error_answer_has_no_body() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for target in ["/reset", "/hang"] {
            let why = format!("{name}, HEAD {target}");
            let mut conn = connect(&lacquer);
            let mut bytes = format!("HEAD {target} HTTP/1.1\r\nHost: test\r\n\r\n").into_bytes();
            bytes.extend_from_slice(&get("/ok/after-head"));
            conn.send(&bytes);
            let r = conn
                .try_read_response(true)
                .unwrap_or_else(|e| panic!("{why}: {e}"));
            assert!(matches!(r.status, 502 | 504), "{why}: {r:?}");
            let next = answer(&mut conn, &why);
            assert_eq!(
                (next.status, next.text().as_str()),
                (200, "/ok/after-head"),
                "{why}"
            );
        }
        lacquer.assert_no_panic();
    }
}

/// Attack: `Expect: 100-continue` whose body is withheld until after the error answer, then sent
/// (request text) with a request behind it; and the same with the body sent at once. Promise: a
/// body not sent is not waited for and closes the connection (its late bytes never parsed); a
/// body sent at once keeps it in step.
#[test]
fn expect_100_continue_with_and_without_its_body() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let head = format!(
            "POST /reset HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            SMUGGLED.len()
        );
        // withheld
        let why = format!("{name}, body withheld");
        let mut conn = connect(&lacquer);
        let began = Instant::now();
        conn.send(head.as_bytes());
        let r = answer(&mut conn, &why);
        assert_eq!(r.status, 502, "{why}: {r:?}");
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{why}: waited for a body"
        );
        assert!(says_close(&r), "{why}: kept with its body unsent: {r:?}");
        let mut late = SMUGGLED.to_vec();
        late.extend_from_slice(&get("/ok/late"));
        let _ = conn.try_send(&late);
        assert!(
            conn.read_rest().is_empty(),
            "{why}: the late bytes answered"
        );
        // sent at once
        let why = format!("{name}, body at once");
        let mut conn = connect(&lacquer);
        let mut bytes = head.clone().into_bytes();
        bytes.extend_from_slice(SMUGGLED);
        bytes.extend_from_slice(&get("/ok/after"));
        conn.send(&bytes);
        let r = answer(&mut conn, &why);
        assert_eq!(r.status, 502, "{why}: {r:?}");
        next_is_answered_or_closed(&mut conn, &r, "/ok/after", &why);
        assert_nothing_smuggled(&origin, name);
        assert!(
            !origin
                .request_lines()
                .iter()
                .any(|l| l.contains("/ok/late")),
            "{name}"
        );
        lacquer.assert_no_panic();
    }
}

/// Attack: HTTP/1.0 with `Connection: keep-alive`, a POST with a request-text body failing, then
/// a second HTTP/1.0 request. Promise: the kept connection answers the second request as itself.
#[test]
fn http_1_0_keep_alive_post_failure_stays_in_step() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        let mut bytes = format!(
            "POST /reset HTTP/1.0\r\nHost: test\r\nConnection: keep-alive\r\n\
             Content-Length: {}\r\n\r\n",
            SMUGGLED.len()
        )
        .into_bytes();
        bytes.extend_from_slice(SMUGGLED);
        bytes.extend_from_slice(
            b"GET /ok/ten HTTP/1.0\r\nHost: test\r\nConnection: keep-alive\r\n\r\n",
        );
        conn.send(&bytes);
        let r = answer(&mut conn, name);
        assert_eq!(r.status, 502, "{name}: {r:?}");
        next_is_answered_or_closed(&mut conn, &r, "/ok/ten", name);
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

// --- interim answers and the origin's own 502 ----------------------------------------------------

/// Attack: the origin sends `103 Early Hints` (or an unasked `100 Continue`) and then closes.
/// Promise: the client sees one final answer for the request (a 502), and the request queued
/// behind gets its own answer or the connection closes; no interim head is taken for the next
/// request's answer.
#[test]
fn a_failure_after_an_interim_answer_keeps_answers_in_step() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for target in ["/early", "/continue"] {
            let why = format!("{name}, {target}");
            let mut conn = connect(&lacquer);
            let mut bytes = get(target);
            bytes.extend_from_slice(&get("/ok/after-interim"));
            conn.send(&bytes);
            let r = answer(&mut conn, &why);
            assert_eq!(r.status, 502, "{why}: {r:?}");
            next_is_answered_or_closed(&mut conn, &r, "/ok/after-interim", &why);
        }
        lacquer.assert_no_panic();
    }
}

/// Attack: an origin that answers 502 itself (framed by length, delimited by its close) and one
/// that cuts its 502 short. Promise: the origin's 502 is an answer, relayed with its body and the
/// connection rules of any answer (not replaced by an empty error answer); a cut one ends the
/// connection, nothing after it is an answer.
#[test]
fn an_origins_own_502_is_relayed_as_an_answer() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        for target in ["/o502", "/c502"] {
            let why = format!("{name}, {target}");
            let mut conn = connect(&lacquer);
            let mut bytes = get(target);
            bytes.extend_from_slice(&get("/ok/after-502"));
            conn.send(&bytes);
            let r = answer(&mut conn, &why);
            assert_eq!(
                (r.status, r.text().as_str()),
                (502, "hello"),
                "{why}: {r:?}"
            );
            next_is_answered_or_closed(&mut conn, &r, "/ok/after-502", &why);
        }
        let why = format!("{name}, /cut502");
        let mut conn = connect(&lacquer);
        let mut bytes = get("/cut502");
        bytes.extend_from_slice(&get("/ok/after-cut"));
        conn.send(&bytes);
        let all = conn.read_rest();
        let answers = parse_responses(&all, false);
        assert!(
            answers.is_empty(),
            "{why}: a cut answer completed or followed: {:?}",
            text(&all)
        );
        assert!(
            text(&all).starts_with("HTTP/1.1 502"),
            "{why}: {:?}",
            text(&all)
        );
        lacquer.assert_no_panic();
    }
}

// --- stale-if-error ------------------------------------------------------------------------------

/// Attack: stale-if-error served to a GET carrying a request-text body (whole, and unfinished) and
/// to a HEAD, each with a request queued behind. Promise: a stale answer keeps the connection
/// only when the body was read to its end; a HEAD's stale answer has no body; the queued request
/// gets its own answer or the connection closes; no body byte is a request.
#[test]
fn stale_if_error_with_bodies_and_heads_stays_in_step() {
    let served: Arc<Mutex<HashSet<String>>> = Arc::default();
    let seen = served.clone();
    let origin = RawOrigin::answering(move |head, stream| {
        let path = path_of(head).to_string();
        if path.starts_with("/ok") {
            ok_answer(stream, &path);
        } else if seen.lock().unwrap().insert(path) {
            write_quietly(
                stream,
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\
                  Cache-Control: max-age=1, stale-if-error=600\r\nConnection: close\r\n\r\nstale",
            );
        }
    });
    let lacquer = start(origin.addr, STANDARD);
    for p in ["/stale/a", "/stale/b", "/stale/c"] {
        let mut conn = connect(&lacquer);
        conn.send(&get(p));
        assert_eq!(answer(&mut conn, p).text(), "stale", "{p}");
    }
    std::thread::sleep(Duration::from_millis(2100));

    // a GET with a whole body
    let mut conn = connect(&lacquer);
    let mut bytes = format!(
        "GET /stale/a HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        SMUGGLED.len()
    )
    .into_bytes();
    bytes.extend_from_slice(SMUGGLED);
    bytes.extend_from_slice(&get("/ok/after-a"));
    conn.send(&bytes);
    let r = answer(&mut conn, "GET with a body");
    assert!(
        (r.status == 200 && r.text() == "stale") || r.status == 502,
        "{r:?}"
    );
    next_is_answered_or_closed(&mut conn, &r, "/ok/after-a", "GET with a body");

    // a HEAD
    let mut conn = connect(&lacquer);
    let mut bytes = b"HEAD /stale/b HTTP/1.1\r\nHost: test\r\n\r\n".to_vec();
    bytes.extend_from_slice(&get("/ok/after-b"));
    conn.send(&bytes);
    let r = conn.try_read_response(true).expect("the HEAD's answer");
    assert_eq!(r.status, 200, "{r:?}");
    next_is_answered_or_closed(&mut conn, &r, "/ok/after-b", "HEAD");

    // a GET whose body stops halfway
    let mut conn = connect(&lacquer);
    let head = format!(
        "GET /stale/c HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        SMUGGLED.len() * 2
    );
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(SMUGGLED);
    conn.send(&bytes);
    let began = Instant::now();
    match conn.try_read_response(false) {
        Ok(r) => {
            assert!(
                (r.status == 200 && r.text() == "stale") || r.status == 502,
                "{r:?}"
            );
            assert!(says_close(&r), "kept with half a body unread: {r:?}");
            let mut rest = SMUGGLED.to_vec();
            rest.extend_from_slice(&get("/ok/after-c"));
            let _ = conn.try_send(&rest);
            assert!(conn.read_rest().is_empty(), "the unread half answered");
        }
        Err(e) => assert!(
            began.elapsed() < HANG_GUARD,
            "an unfinished body's request hung: {e}"
        ),
    }
    assert_nothing_smuggled(&origin, "stale-if-error");
    assert!(
        !origin
            .request_lines()
            .iter()
            .any(|l| l.contains("/ok/after-c")),
        "the request after an unread half was forwarded"
    );
    lacquer.assert_no_panic();
}

// --- slots, repetition, h2, reload ----------------------------------------------------------------

/// Attack: one kept connection failing over and over (502s, 504s, by GET and by POST) with a
/// per-client fairness cap of 1 and a backend `max_in_flight` of 1, then connections whose drain
/// is cut short (a body that never ends) for other clients. Promise: every failure gives its
/// fairness slot and the backend's slot back before the kept connection's next request is read:
/// that request is never refused as over the cap (429) nor queued out (503); the kept client is
/// then served, and so is a new client.
#[test]
fn repeated_kept_failures_give_fairness_and_backend_slots_back() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start_balancer(
            &[(origin.addr, 1)],
            &format!(
                "[balancer]\nmax_in_flight = 1\n{COMMON}{path}\
                 [fairness]\nmax_in_flight = 1\non_excess = \"reject\"\n\
                 key_header = \"x-client\"\n"
            ),
        );
        let mut conn = connect(&lacquer);
        for i in 0..40 {
            let target = if i % 10 == 9 {
                format!("/hang/{i}")
            } else {
                format!("/reset/{i}")
            };
            let bytes = if i % 2 == 0 {
                format!("GET {target} HTTP/1.1\r\nHost: test\r\nX-Client: kept\r\n\r\n")
                    .into_bytes()
            } else {
                let mut b = format!(
                    "POST {target} HTTP/1.1\r\nHost: test\r\nX-Client: kept\r\n\
                     Content-Length: {}\r\n\r\n",
                    SMUGGLED.len()
                )
                .into_bytes();
                b.extend_from_slice(SMUGGLED);
                b
            };
            conn.send(&bytes);
            let r = answer(&mut conn, &format!("{name}: failure {i}"));
            assert!(matches!(r.status, 502 | 504), "{name}: failure {i}: {r:?}");
            assert!(!says_close(&r), "{name}: failure {i}: {r:?}");
        }
        // other clients whose drains are cut short (a body that never ends): closed (the standard
        // path; Lacquer's exchange reads a small body whole before it asks the origin)
        let cut_drains = if name == "standard" { 3 } else { 0 };
        for i in 0..cut_drains {
            let mut c = connect(&lacquer);
            c.send(
                format!(
                    "POST /reset/slow HTTP/1.1\r\nHost: test\r\nX-Client: cut-{i}\r\n\
                     Content-Length: 100\r\n\r\nab"
                )
                .as_bytes(),
            );
            assert!(
                c.is_closed(Duration::from_secs(8)) || {
                    let r = answer(&mut c, &format!("{name}: cut drain {i}"));
                    r.status == 502 && says_close(&r)
                }
            );
        }
        conn.send(b"GET /ok/kept HTTP/1.1\r\nHost: test\r\nX-Client: kept\r\n\r\n");
        let r = answer(
            &mut conn,
            &format!("{name}: the kept connection after its failures"),
        );
        assert_eq!((r.status, r.text().as_str()), (200, "/ok/kept"), "{name}");
        let mut other = connect(&lacquer);
        other.send(b"GET /ok/other HTTP/1.1\r\nHost: test\r\nX-Client: other\r\n\r\n");
        let r = answer(&mut other, &format!("{name}: another client"));
        assert_eq!((r.status, r.text().as_str()), (200, "/ok/other"), "{name}");
        lacquer.assert_no_panic();
    }
}

/// Attack: a body dribbled after the origin failed, so that the error answer drains it for its
/// whole second, against a backend with `max_in_flight = 1` (and, apart, a per-client fairness
/// cap of 1); meanwhile another request from the same address asks for a page. Promise: a failed
/// attempt's backend slot and fairness slot are not held through the drain of the failing
/// request's body (the origin is no longer asked anything): the other request is served without
/// waiting out the drain, as it was before connections were kept. The control run without the
/// limits shows the wait is the slot's.
#[test]
fn a_drain_does_not_hold_the_slots_of_a_failed_attempt() {
    let limits = [
        ("no limit (control)", ""),
        (
            "backend max_in_flight = 1",
            "[balancer]\nmax_in_flight = 1\n",
        ),
        (
            "fairness max_in_flight = 1",
            "[fairness]\nmax_in_flight = 1\non_excess = \"queue\"\n",
        ),
    ];
    let mut waits = Vec::new();
    for (limit, toml) in limits {
        let origin = origin();
        let lacquer = start_balancer(&[(origin.addr, 1)], &format!("{toml}{COMMON}{STANDARD}"));
        let mut slow = connect(&lacquer);
        let bytes = post("/reset/slow", &smuggling_body(300));
        let head_end = support::raw_text::find(&bytes, b"\r\n\r\n").unwrap() + 4;
        slow.send(&bytes[..head_end + 3]);
        dribble(
            slow.stream(),
            bytes[head_end + 3..].to_vec(),
            1,
            Duration::from_millis(50),
        );
        // the origin has failed by now; the drain runs for about a second
        std::thread::sleep(Duration::from_millis(150));
        let began = Instant::now();
        let mut other = connect(&lacquer);
        other.send(&get("/ok/other"));
        let r = answer(&mut other, limit);
        let waited = began.elapsed();
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "/ok/other"),
            "{limit}: {r:?}"
        );
        let r = answer(&mut slow, limit);
        assert_eq!(r.status, 502, "{limit}: {r:?}");
        assert!(says_close(&r), "{limit}: {r:?}");
        waits.push((limit, waited));
        lacquer.assert_no_panic();
    }
    assert!(
        waits[0].1 < Duration::from_millis(400),
        "the control waited: {waits:?}"
    );
    assert!(
        waits.iter().all(|(_, w)| *w < Duration::from_millis(600)),
        "the other request waited out the failed request's drain: {waits:?}"
    );
}

/// Attack: hundreds of failures on one kept connection, pipelined in batches with successful
/// requests between them. Promise: every answer is its own request's, in order, and the process
/// does not grow with them.
#[test]
fn hundreds_of_failures_on_one_connection_stay_in_order_and_bounded() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        let mut rss_after_warmup = 0;
        for batch in 0..30 {
            let mut bytes = Vec::new();
            let mut want = Vec::new();
            for j in 0..10 {
                let i = batch * 10 + j;
                if j % 3 == 2 {
                    bytes.extend_from_slice(&get(&format!("/ok/{i}")));
                    want.push(format!("/ok/{i}"));
                } else if j % 3 == 1 {
                    bytes.extend_from_slice(&post(&format!("/reset/{i}"), SMUGGLED));
                    want.push(String::new());
                } else {
                    bytes.extend_from_slice(&get(&format!("/reset/{i}")));
                    want.push(String::new());
                }
            }
            conn.send(&bytes);
            for (j, w) in want.iter().enumerate() {
                let why = format!("{name}: batch {batch}, request {j}");
                let r = answer(&mut conn, &why);
                if w.is_empty() {
                    assert_eq!(r.status, 502, "{why}: {r:?}");
                } else {
                    assert_eq!((r.status, r.text().as_str()), (200, w.as_str()), "{why}");
                }
            }
            if batch == 4 {
                rss_after_warmup = rss_bytes(lacquer.pid());
            }
        }
        let grown = rss_bytes(lacquer.pid()).saturating_sub(rss_after_warmup);
        assert!(
            grown < 32 * 1024 * 1024,
            "{name}: grew {grown} bytes over 250 requests"
        );
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: an h2 client whose stream fails, then a second stream on the same connection.
/// Promise: h2 is unaffected: the failure is answered on its stream and the next stream gets its
/// own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_after_a_failure_are_answered() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let client = h2c_client();
        let r = send(&client, "GET", &lacquer.url("/reset/h2"), &[], None)
            .await
            .expect("the failing stream");
        assert_eq!(r.status, 502, "{name}");
        let r = send(
            &client,
            "POST",
            &lacquer.url("/reset/h2post"),
            &[],
            Some(bytes::Bytes::from_static(SMUGGLED)),
        )
        .await
        .expect("the failing POST stream");
        assert_eq!(r.status, 502, "{name}");
        let r = send(&client, "GET", &lacquer.url("/ok/h2"), &[], None)
            .await
            .expect("the next stream");
        assert_eq!((r.status, r.text().as_str()), (200, "/ok/h2"), "{name}");
        lacquer.assert_no_panic();
    }
}

/// Attack: a config reload (SIGHUP) between a failure and the next request on the kept
/// connection. Promise: the kept connection outlives the reload in step: its next request gets
/// its own whole answer, never a hang nor a torn answer.
#[test]
fn a_reload_between_a_failure_and_the_next_request() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        conn.send(&post("/reset", SMUGGLED));
        let r = answer(&mut conn, &format!("{name}: before the reload"));
        assert_eq!(r.status, 502, "{name}: {r:?}");
        assert!(!says_close(&r), "{name}: {r:?}");
        // a live key changed, so that the reload replaces the settings
        lacquer.write_config(&format!(
            "listen = [\"127.0.0.1:{}\"]\nthreads = 2\n{}\n{COMMON}{path}\n\
             [fairness]\nmax_in_flight = 50\n",
            lacquer.port(),
            upstreams_toml(&[(origin.addr, 1)])
        ));
        let before = lacquer
            .stderr_log()
            .matches("configuration reloaded")
            .count();
        assert!(lacquer.signal("HUP"));
        assert!(
            poll_until(Duration::from_secs(10), || {
                lacquer
                    .stderr_log()
                    .matches("configuration reloaded")
                    .count()
                    > before
            }),
            "{name}: {}",
            lacquer.stderr_log()
        );
        conn.send(&get("/ok/kept"));
        let r = answer(&mut conn, &format!("{name}: after the reload"));
        assert_eq!((r.status, r.text().as_str()), (200, "/ok/kept"), "{name}");
        conn.send(&get("/reset/again"));
        let r = answer(&mut conn, &format!("{name}: a failure after the reload"));
        assert_eq!(r.status, 502, "{name}: {r:?}");
        next_after(&mut conn, &r, name);
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

fn next_after(conn: &mut RawConn, r: &RawResponse, why: &str) {
    if !says_close(r) {
        conn.send(&get("/ok/last"));
    }
    next_is_answered_or_closed(conn, r, "/ok/last", why);
}

/// Attack: the next request arrives while the origin hangs (after the body, before the 504), the
/// first part of its head then and the rest only after the 504. Promise: the bytes read while
/// waiting are kept as the start of the next request, joined with the rest, answered as one
/// request after the 504.
#[test]
fn a_next_request_split_around_a_504_is_answered_as_itself() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        conn.send(&post("/hang", SMUGGLED));
        std::thread::sleep(Duration::from_millis(150));
        conn.send(b"GET /ok/spl");
        let r = answer(&mut conn, name);
        assert_eq!(r.status, 504, "{name}: {r:?}");
        if says_close(&r) {
            assert!(conn.is_closed(Duration::from_secs(5)), "{name}");
        } else {
            conn.send(b"it HTTP/1.1\r\nHost: test\r\n\r\n");
            let n = answer(&mut conn, &format!("{name}: the split request"));
            assert_eq!((n.status, n.text().as_str()), (200, "/ok/split"), "{name}");
        }
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: `Expect: 100-continue` to an origin that answers `100 Continue` and then closes: the
/// client sends its body (request text) and a next request once it sees the `100`. Promise: an
/// interim answer went out, so the connection is closed after the 502, or, kept, answers the next
/// request as itself; the body is never a request.
#[test]
fn a_failure_after_a_relayed_100_continue_never_smuggles_the_body() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        conn.send(
            format!(
                "POST /continue HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\n\
                 Content-Length: {}\r\n\r\n",
                SMUGGLED.len()
            )
            .as_bytes(),
        );
        // the body once something (the 100, or the final answer) came back
        let _ = conn.is_closed(Duration::from_secs(3));
        let mut rest = SMUGGLED.to_vec();
        rest.extend_from_slice(&get("/ok/after-continue"));
        let _ = conn.try_send(&rest);
        let all = conn.read_rest();
        let answers = parse_responses(&all, false);
        assert!(!answers.is_empty(), "{name}: no answer: {:?}", text(&all));
        assert_eq!(answers[0].status, 502, "{name}: {:?}", text(&all));
        if answers.len() > 1 {
            assert!(!says_close(&answers[0]), "{name}: {:?}", text(&all));
            assert_eq!(answers[1].text(), "/ok/after-continue", "{name}");
        }
        assert!(answers.len() <= 2, "{name}: {:?}", text(&all));
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: the same failures sent through both forwarding paths. Promise: the two paths give the
/// same status and the same decision to keep or close the connection.
#[test]
fn both_paths_answer_a_failure_alike() {
    let requests: Vec<(&str, Vec<u8>)> = vec![
        ("GET reset", get("/reset")),
        ("GET hang", get("/hang")),
        ("POST reset", post("/reset", SMUGGLED)),
        ("POST hang", post("/hang", SMUGGLED)),
        (
            "HEAD reset",
            b"HEAD /reset HTTP/1.1\r\nHost: test\r\n\r\n".to_vec(),
        ),
        (
            "chunked POST reset",
            chunked_post("/reset", &one_chunk(SMUGGLED)),
        ),
        ("GET early hints", get("/early")),
    ];
    let mut seen: Vec<Vec<(u16, bool)>> = Vec::new();
    for (_, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut answers = Vec::new();
        for (what, bytes) in &requests {
            let mut conn = connect(&lacquer);
            conn.send(bytes);
            let r = conn
                .try_read_response(what.starts_with("HEAD"))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            answers.push((r.status, says_close(&r)));
        }
        seen.push(answers);
        lacquer.assert_no_panic();
    }
    let named: Vec<_> = requests.iter().map(|(w, _)| *w).collect();
    assert_eq!(
        seen[0], seen[1],
        "direct vs standard (status, closes) for {named:?}"
    );
}

/// Attack: HTTP/1.0 with `Connection: keep-alive` and `Transfer-Encoding: chunked` (faulty
/// framing in HTTP/1.0, RFC 9112 §6.1), the chunk's data request text, to a failing origin, then a
/// request. Promise: such a message's connection is closed after its answer (never kept on a
/// framing an HTTP/1.0 peer may not share); nothing of it is a request.
#[test]
fn http_1_0_chunked_is_closed_after_the_error() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start(origin.addr, path);
        let mut conn = connect(&lacquer);
        let mut bytes = b"POST /reset HTTP/1.0\r\nHost: test\r\nConnection: keep-alive\r\n\
                          Transfer-Encoding: chunked\r\n\r\n"
            .to_vec();
        bytes.extend_from_slice(&one_chunk(SMUGGLED));
        bytes.extend_from_slice(
            b"GET /ok/after10 HTTP/1.0\r\nHost: test\r\nConnection: keep-alive\r\n\r\n",
        );
        conn.send(&bytes);
        let all = conn.read_rest();
        let answers = parse_responses(&all, false);
        assert!(answers.len() <= 1, "{name}: kept: {:?}", text(&all));
        assert_nothing_smuggled(&origin, name);
        lacquer.assert_no_panic();
    }
}

/// Attack: Lacquer's own 503 (the only backend at its `max_in_flight`, no queue) to POSTs whose
/// bodies (by length and chunked, request text) were never read when the verdict fell, with a
/// request queued behind each. Promise: the verdict is answered, the body read by its framing,
/// and the queued request answered as itself (or the connection closed); no body byte is a
/// request, and the slot comes back once the busy request ends.
#[test]
fn lacquers_own_503_with_an_unread_body_stays_in_step() {
    for (name, path) in PATHS {
        let origin = origin();
        let lacquer = start_balancer(
            &[(origin.addr, 1)],
            &format!("[balancer]\nmax_in_flight = 1\n[balancer.queue]\nlength = 0\n{COMMON}{path}"),
        );
        // holds the backend's only slot until the origin's first_byte timeout (500 ms)
        let mut busy = connect(&lacquer);
        busy.send(&get("/hang/busy"));
        std::thread::sleep(Duration::from_millis(150));
        for chunked in [false, true] {
            let why = format!("{name}, chunked {chunked}");
            let mut conn = connect(&lacquer);
            let mut bytes = if chunked {
                chunked_post("/ok/refused", &one_chunk(SMUGGLED))
            } else {
                post("/ok/refused", SMUGGLED)
            };
            bytes.extend_from_slice(&get("/ok/next"));
            conn.send(&bytes);
            let r = answer(&mut conn, &why);
            assert_eq!(r.status, 503, "{why}: {r:?}");
            // the busy request ends within the guard: the queued GET then reaches the origin,
            // or is refused in turn (503), as itself
            if says_close(&r) {
                next_is_answered_or_closed(&mut conn, &r, "/ok/next", &why);
            } else {
                let n = answer(&mut conn, &format!("{why}: the queued GET"));
                assert!(
                    (n.status == 200 && n.text() == "/ok/next") || n.status == 503,
                    "{why}: {n:?}"
                );
            }
        }
        assert_eq!(answer(&mut busy, name).status, 504, "{name}");
        let mut after = connect(&lacquer);
        after.send(&get("/ok/after-busy"));
        let r = answer(&mut after, name);
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "/ok/after-busy"),
            "{name}"
        );
        assert_nothing_smuggled(&origin, name);
        assert!(
            !origin
                .request_lines()
                .iter()
                .any(|l| l.contains("/ok/refused")),
            "{name}: a refused request reached the origin"
        );
        lacquer.assert_no_panic();
    }
}
