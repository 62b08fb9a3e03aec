//! The bounds on what a client connection may take (`[server]`'s limits): the request-head
//! deadline (408), the head and request-line sizes (431, 414), the connection cap and the HTTP/2
//! idle timeout. Raw sockets on the client side; a [`CaptureOrigin`] shows that nothing refused
//! reached the origin. `docs/security.md` lists the rows.
//!
//! The deadlines are set short here (1 s) so the tests are quick; no assertion depends on how
//! long anything took, only on what was answered and whether the connection was closed.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use support::*;

const LIMITS: &str = "[log]\naccess = \"off\"\n[server]\nheader_read_timeout = \"1s\"\n\
                      max_header_size = \"4KiB\"\nmax_request_line = \"1KiB\"\n\
                      h2_idle_timeout = \"1s\"\n";

fn proxy_with(origin: &CaptureOrigin, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("{LIMITS}{extra}"))
}

/// Reads the answer to a connection until the proxy closes it (30 s at most).
fn answer_until_closed(conn: &mut RawConn) -> Vec<u8> {
    conn.read_timeout = Duration::from_secs(30);
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut stream = conn.stream().try_clone().expect("clone");
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads the connection's answer until the proxy closes it and checks its status.
fn assert_closed_with(conn: &mut RawConn, status: u16) {
    let answer = answer_until_closed(conn);
    assert_eq!(
        raw_status(&answer),
        Some(status),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );
}

fn assert_nothing_reached(origin: &CaptureOrigin) {
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "{}",
        origin.received_text()
    );
}

#[test]
fn a_connection_that_sends_nothing_gets_408_and_is_closed() {
    for h2c in [true, false] {
        let origin = CaptureOrigin::start();
        let lacquer = proxy_with(&origin, &format!("h2c = {h2c}\n"));
        let mut conn = RawConn::connect(lacquer.addr());
        let answer = answer_until_closed(&mut conn);
        assert_eq!(
            raw_status(&answer),
            Some(408),
            "h2c = {h2c}: {:?}",
            String::from_utf8_lossy(&answer)
        );
        assert_nothing_reached(&origin);
    }
}

#[test]
fn a_head_sent_a_byte_at_a_time_gets_408_and_is_closed() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let mut conn = RawConn::connect(lacquer.addr());
    let mut writer = conn.stream().try_clone().expect("clone");
    let drip = std::thread::spawn(move || {
        // an endless head, one byte every 100 ms, until the proxy stops reading
        let head = b"GET /drip HTTP/1.1\r\nHost: shop.example\r\nX-Drip: ";
        for byte in head.iter().chain(std::iter::repeat(&b'a')).take(600) {
            if writer.write_all(&[*byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    assert_closed_with(&mut conn, 408);
    drip.join().unwrap();
    assert_nothing_reached(&origin);
}

#[test]
fn a_kept_alive_connection_whose_next_head_stalls_gets_408() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let mut conn = RawConn::connect(lacquer.addr());
    assert_eq!(conn.get("/first", &[]).status, 200);
    conn.send(b"GET /second HTTP/1.1\r\nHost: shop.example\r\n");
    assert_closed_with(&mut conn, 408);
    assert_eq!(origin.requests().len(), 1, "{}", origin.received_text());
}

#[test]
fn an_idle_kept_alive_connection_is_not_answered_408() {
    // between requests the keep-alive timeout governs, and it closes without a response
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let mut conn = RawConn::connect(lacquer.addr());
    assert_eq!(conn.get("/first", &[]).status, 200);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !conn.is_closed(Duration::from_millis(100)),
        "still open after 3 header_read_timeouts of idleness"
    );
    assert_eq!(conn.get("/second", &[]).status, 200);
}

#[test]
fn a_head_larger_than_max_header_size_gets_431() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let big = "a".repeat(5 << 10);
    for request in [
        // in one send, and past the limit while still incomplete
        format!("GET /big HTTP/1.1\r\nHost: shop.example\r\nX-Big: {big}\r\n\r\n"),
        format!("GET /big HTTP/1.1\r\nHost: shop.example\r\nX-Big: {big}"),
    ] {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(request.as_bytes());
        assert_closed_with(&mut conn, 431);
    }
    assert_nothing_reached(&origin);
    // a head just under the limit is served
    let mut conn = RawConn::connect(lacquer.addr());
    assert_eq!(
        conn.get("/fits", &[("X-Big", &"a".repeat(3 << 10))]).status,
        200
    );
}

#[test]
fn more_header_fields_than_pingora_reads_get_431() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let mut request = String::from("GET /many HTTP/1.1\r\nHost: shop.example\r\n");
    for i in 0..300 {
        request.push_str(&format!("x{i}: y\r\n"));
    }
    request.push_str("\r\n");
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(request.as_bytes());
    assert_closed_with(&mut conn, 431);
    assert_nothing_reached(&origin);
}

#[test]
fn a_request_line_longer_than_max_request_line_gets_414() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let long = format!("/{}", "p".repeat(2 << 10));
    for request in [
        format!("GET {long} HTTP/1.1\r\nHost: shop.example\r\n\r\n"),
        // still being sent
        format!("GET {long}"),
    ] {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(request.as_bytes());
        assert_closed_with(&mut conn, 414);
    }
    assert_nothing_reached(&origin);
    let fits = format!("/{}", "p".repeat(900));
    let mut conn = RawConn::connect(lacquer.addr());
    assert_eq!(conn.get(&fits, &[]).status, 200);
}

#[test]
fn connections_over_max_connections_are_closed_unread() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "max_connections = 2\n");
    let mut first = RawConn::connect(lacquer.addr());
    let mut second = RawConn::connect(lacquer.addr());
    assert_eq!(first.get("/1", &[]).status, 200);
    assert_eq!(second.get("/2", &[]).status, 200);
    let mut third = RawConn::connect(lacquer.addr());
    let _ = third.try_send(b"GET /3 HTTP/1.1\r\nHost: shop.example\r\n\r\n");
    assert!(
        third.is_closed(Duration::from_secs(10)),
        "the third connection is closed"
    );
    assert!(
        third.read_rest().is_empty(),
        "and nothing was answered on it"
    );
    drop(first);
    // the freed slot is taken by the next connection
    assert!(
        poll_until(Duration::from_secs(10), || {
            let mut next = RawConn::connect(lacquer.addr());
            next.read_timeout = Duration::from_secs(5);
            let _ = next.try_send(b"GET /4 HTTP/1.1\r\nHost: shop.example\r\n\r\n");
            next.try_read_response(false).is_ok_and(|r| r.status == 200)
        }),
        "a connection is served once a slot is free"
    );
    assert_eq!(
        second.get("/2", &[]).status,
        200,
        "the kept connection still works"
    );
    assert!(
        origin
            .requests()
            .iter()
            .all(|r| !r.request_line().contains("/3")),
        "{}",
        origin.received_text()
    );
}

/// The client connection preface and an empty SETTINGS frame (RFC 9113 §3.4).
const H2_PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[test]
fn an_idle_h2c_connection_is_closed_after_h2_idle_timeout() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_with(&origin, "");
    let mut stream = TcpStream::connect(lacquer.addr()).expect("connect");
    stream.write_all(H2_PREFACE_AND_SETTINGS).expect("preface");
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(closed, "the idle h2 connection is closed");
    // the server spoke h2 before closing: its SETTINGS frame (type 4) came first
    assert!(received.len() >= 9 && received[3] == 4, "{received:?}");
}
