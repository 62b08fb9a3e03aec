//! Attacks on protocol upgrades and tunnels through Lacquer (`src/proxy/upgrade.rs`, the upgrade
//! handling in `src/proxy/mod.rs`, Pingora's HTTP/1 tunnel): a hostile client and a hostile origin
//! around `Upgrade`, `h2c`, `CONNECT` and `Expect: 100-continue`, over real sockets. Written
//! 2026-12-07 on `main`; what `tests/upgrade_tunnels.rs`, `tests/pass_forwarding.rs` (the unasked
//! 101) and `tests/request_smuggling.rs` cover is not repeated.
//!
//! Found (failing here):
//!
//! Both faults are fixed in the commit that added this file: an upgrade takes a fairness slot
//! like any request and gives it back at its `101`
//! ([`an_open_tunnel_gives_its_fairness_slot_back`]); the idle timeout's docs said it bounded
//! each direction, which would cut server-push WebSockets, and now say what it does (ends a
//! tunnel silent both ways), which the test holds. As found:
//!
//! * Fairness bypass: any request carrying an `Upgrade` field skips `[fairness] max_in_flight`
//!   (`ProxyHttp::proxy_upstream_filter` in `src/proxy/mod.rs`: `Some(_) if
//!   ctx.upgrade.requested() => Ok(true)`), even one Lacquer forwards as an ordinary request
//!   (no `Connection: upgrade`, so `upgrade::on_upstream_request` strips the `Upgrade`) and even
//!   one the origin refuses. One client with `max_in_flight = 1` had 4 slow requests at the
//!   origin at once, all 200, by adding `Upgrade: websocket`
//!   ([`an_upgrade_field_does_not_exempt_a_request_from_fairness`]).
//! * The tunnel idle timeout does not bound each direction as documented (`upgrade.rs` module
//!   doc, `docs/architecture.md`): a tunnel in which one side talks and the other is silent stays
//!   open (10 s past a 1 s `tunnel_idle_timeout`, both ways round); only a tunnel silent both
//!   ways is closed. Pingora's tunnel loop re-arms the read timers whenever either side sends
//!   ([`a_tunnel_with_one_silent_side_is_closed_as_documented`]). Either the code or the docs
//!   are wrong; closing on one silent side would also end server-push-only WebSockets.
//!
//! Held (guards): a refused upgrade (426, 200, 400) leaves the bytes pipelined behind it an HTTP
//! request, forwarded by the proxy, not tunnelled raw; an upgrade with both `Content-Length` and
//! chunked is framed by chunks alone and the connection closed after it; the body of an accepted
//! upgrade (by length or chunked) reaches the origin once, then the tunnel's bytes; a 101 to an
//! upgrade Lacquer did not forward (`h2c` only, `Upgrade` without `Connection: upgrade`,
//! HTTP/1.0, `Connection: upgrade` alone) is a 502 and nothing after it reaches the client; a
//! tunnel's upstream connection is never pooled; a stored answer is never served to an upgrade
//! request and a refused upgrade's cacheable answer is never stored; `CONNECT` is a 405 and
//! neither it nor an absolute-form target opens a connection anywhere but the origin; a body sent
//! after a 417 to `Expect: 100-continue` is never read as a request; a silent tunnel closes at
//! the idle timeout; a stalled reader on either side of a tunnel costs about 5 MB of peak RSS
//! (8-10 MB pushed); a closed tunnel gives back its `max_in_flight` slot, and a tunnel the origin
//! ends closes the client and frees its `server.max_connections` place; SIGTERM with a busy
//! tunnel exits within `shutdown_timeout`.

use lacquer_test_support as support;
use support::*;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The fields of a WebSocket handshake a client sends.
const WS: &str = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// A 101 an origin sends to accept a WebSocket handshake.
const SWITCH: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                        Connection: Upgrade\r\n\
                        Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

/// What a hostile origin writes after a 101: something that reads as a whole HTTP answer.
const SMUGGLED: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nCache-Control: max-age=60\r\n\r\nsmuggled";

/// One connection a [`TunnelOrigin`] served: the request head and every byte after it.
#[derive(Clone, Debug, Default)]
struct Served {
    head: String,
    after: Vec<u8>,
}

/// What a [`TunnelOrigin`] does with one connection after it read the head.
#[derive(Clone, Copy)]
enum Mode {
    /// Writes the answer, then reads (and keeps) whatever comes until EOF (30 s cap).
    Read,
    /// Writes the answer, then echoes every byte back until EOF (60 s cap).
    Echo,
    /// Writes the answer, then writes 64 KiB blocks for as long as the socket takes them.
    Flood,
    /// Writes the answer, then never reads again (30 s cap).
    Stall,
}

/// An origin that answers every request head with fixed bytes (a 101 most often) and then reads,
/// echoes or floods, keeping each connection's head, the bytes it read after the head, and what
/// it managed to write.
struct TunnelOrigin {
    addr: SocketAddr,
    served: Arc<Mutex<Vec<Served>>>,
    accepted: Arc<AtomicUsize>,
    written: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl TunnelOrigin {
    fn start(answer: &'static [u8], mode: Mode) -> TunnelOrigin {
        TunnelOrigin::start_with(move |_head| answer.to_vec(), mode)
    }

    fn start_with(answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static, mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let written = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let answer = Arc::new(answer);
        let (log, count, wrote, halt) = (
            served.clone(),
            accepted.clone(),
            written.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let (log, wrote, halt, answer) =
                    (log.clone(), wrote.clone(), halt.clone(), answer.clone());
                std::thread::spawn(move || {
                    serve_tunnel(stream, mode, &*answer, &log, &wrote, &halt)
                });
            }
        });
        TunnelOrigin {
            addr,
            served,
            accepted,
            written,
            stop,
        }
    }

    fn served(&self) -> Vec<Served> {
        self.served.lock().unwrap().clone()
    }
}

impl Drop for TunnelOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve_tunnel(
    mut stream: TcpStream,
    mode: Mode,
    answer: &(dyn Fn(&str) -> Vec<u8> + Send + Sync),
    log: &Mutex<Vec<Served>>,
    written: &AtomicUsize,
    halt: &AtomicBool,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(3)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(at) = raw_text::find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let index = {
        let mut log = log.lock().unwrap();
        log.push(Served {
            head: head.clone(),
            after: buf[head_end..].to_vec(),
        });
        log.len() - 1
    };
    let _ = stream.write_all(&answer(&head));
    let keep = |bytes: &[u8]| log.lock().unwrap()[index].after.extend_from_slice(bytes);
    match mode {
        Mode::Read => {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until && !halt.load(Ordering::SeqCst) {
                match stream.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => keep(&chunk[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            }
        }
        Mode::Echo => {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let until = Instant::now() + Duration::from_secs(60);
            while Instant::now() < until && !halt.load(Ordering::SeqCst) {
                match stream.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => {
                        keep(&chunk[..n]);
                        if stream.write_all(&chunk[..n]).is_err() {
                            return;
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            }
        }
        Mode::Stall => {
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until && !halt.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Mode::Flood => {
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let block = vec![b'f'; 64 * 1024];
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until && !halt.load(Ordering::SeqCst) {
                match stream.write(&block) {
                    Ok(0) => return,
                    Ok(n) => {
                        written.fetch_add(n, Ordering::SeqCst);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            }
        }
    }
}

/// A port that must never be connected to: counts the connections it accepts.
struct Victim {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Victim {
    fn start() -> Victim {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        let _ = stream.set_nonblocking(false);
                        let mut s = stream;
                        let _ = s.write_all(b"SSH-2.0-victim\r\n");
                        held.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Victim {
            addr,
            accepted,
            stop,
        }
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A raw request head: `line`, `Host: test`, then `fields` (each ending in CRLF).
fn head(line: &str, fields: &str) -> String {
    format!("{line}\r\nHost: test\r\n{fields}\r\n")
}

/// An uncacheable `200` an origin answers with `body`; `extra`: more fields, each ending in CRLF.
fn plain_answer(body: &str, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Opens a WebSocket tunnel through `lacquer` to `path`, returning the connection once the 101
/// was read.
fn open_tunnel(lacquer: SocketAddr, path: &str) -> RawConn {
    let mut conn = RawConn::connect(lacquer);
    conn.send(head(&format!("GET {path} HTTP/1.1"), WS).as_bytes());
    let answer = conn.read_response(false);
    assert_eq!(answer.status, 101, "{answer:?}");
    conn
}

/// Whether the connection ends (EOF or reset) within `bound`, reading and dropping what comes.
fn closes_within(stream: &mut TcpStream, bound: Duration) -> bool {
    let until = Instant::now() + bound;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut chunk = [0u8; 16 * 1024];
    while Instant::now() < until {
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

// ---------------------------------------------------------------------------------------------
// smuggling through a refused or accepted upgrade

/// A client sends a WebSocket handshake and, in the same write, a second request; the origin
/// refuses the upgrade (426, 200 or 400, keeping its connection open). The bytes after the
/// handshake's head are the client's next request: answered as such, forwarded by the proxy
/// (its fields added), never written raw into the refused request's connection as tunnel bytes.
#[test]
fn a_refused_upgrade_leaves_the_pipelined_request_an_http_request() {
    let origin = KeepAliveOrigin::start(|seen, stream| {
        if seen.path.starts_with("/ws") {
            let status = &seen.path[4..];
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 {status} Refused\r\nContent-Length: 7\r\n\
                     Cache-Control: no-store\r\n\r\nrefused"
                )
                .as_bytes(),
            );
            // kept open: bytes written raw into it after the refusal would be read here
            Then::KeepAlive
        } else {
            let body = format!("answer to {}", seen.path);
            let _ = stream.write_all(&plain_answer(&body, ""));
            Then::KeepAlive
        }
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    for status in [426, 200, 400] {
        let mut conn = RawConn::connect(lacquer.addr());
        let mut bytes = head(&format!("GET /ws/{status} HTTP/1.1"), WS);
        bytes.push_str(&head(&format!("GET /next/{status} HTTP/1.1"), ""));
        conn.send(bytes.as_bytes());
        let first = conn.read_response(false);
        assert_eq!(first.status, status, "{first:?}");
        assert_eq!(first.text(), "refused");
        // the second request answered as one, or the connection closed: never anything else
        match conn.try_read_response(false) {
            Ok(second) => {
                assert_eq!(second.status, 200, "{second:?}");
                assert_eq!(second.text(), format!("answer to /next/{status}"));
                let seen = origin.seen_for(&format!("/next/{status}"));
                assert_eq!(seen.len(), 1, "{seen:?}");
                // forwarded by the proxy as a request (its fields added), not tunnelled raw
                assert!(
                    raw_text::has_field(&seen[0].head, "x-forwarded-for"),
                    "tunnelled raw: {seen:?}"
                );
            }
            Err(why) => {
                assert!(conn.is_closed(Duration::from_secs(2)), "{why}");
                assert!(origin.seen_for(&format!("/next/{status}")).is_empty());
            }
        }
    }
    lacquer.assert_no_panic();
}

/// An upgrade request whose framing fields conflict (`Content-Length` and chunked) and which
/// the origin refuses: framed by chunks alone on the way in and out, and the request pipelined
/// behind it is the next request, never part of the body or a tunnel.
#[test]
fn an_upgrade_with_both_framings_is_framed_by_chunks_alone() {
    let origin = KeepAliveOrigin::start(|seen, stream| {
        let body = format!("{} {} {}", seen.method, seen.path, seen.body.len());
        let _ = stream.write_all(&plain_answer(&body, ""));
        Then::KeepAlive
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let mut conn = RawConn::connect(lacquer.addr());
    let mut bytes = head(
        "POST /up HTTP/1.1",
        &format!("{WS}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"),
    );
    bytes.push_str("a\r\n0123456789\r\n0\r\n\r\n");
    bytes.push_str(&head("GET /after HTTP/1.1", ""));
    conn.send(bytes.as_bytes());
    let first = conn.read_response(false);
    assert_eq!(first.text(), "POST /up 10", "{first:?}");
    // the next request answered as one, or the connection closed (RFC 9112 §6.1 asks a server
    // to close after a request with both fields)
    match conn.try_read_response(false) {
        Ok(second) => assert_eq!(second.text(), "GET /after 0", "{second:?}"),
        Err(why) => {
            assert!(conn.is_closed(Duration::from_secs(2)), "{why}");
            assert!(origin.seen_for("/after").is_empty());
        }
    }
    let up = &origin.seen_for("/up")[0];
    let fields = up.head.to_ascii_lowercase();
    assert!(
        !(fields.contains("content-length") && fields.contains("transfer-encoding")),
        "both framings forwarded: {}",
        up.head
    );
    assert_eq!(up.body, b"0123456789");
}

/// The origin accepts an upgrade whose request carried a body of a known length: the body
/// reaches the origin once, followed by the tunnel's bytes; nothing doubled, dropped or
/// reframed. A chunked body's upgrade is not forwarded (since 2026-12-08: a 101 back before the
/// body's end cut its framing, `tunnel_flaky_attacks::a_body_cut_by_an_early_101_...`): the
/// origin gets an ordinary request, and its 101 is refused with a 502.
#[test]
fn the_body_of_an_accepted_upgrade_reaches_the_origin_once() {
    let origin = TunnelOrigin::start(SWITCH, Mode::Read);
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let cases: [(&str, &[u8]); 2] = [
        ("Content-Length: 5\r\n", b"hello"),
        ("Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    ];
    for (i, (framing, body)) in cases.iter().enumerate() {
        let mut conn = RawConn::connect(lacquer.addr());
        let mut bytes =
            head(&format!("POST /ws/{i} HTTP/1.1"), &format!("{WS}{framing}")).into_bytes();
        bytes.extend_from_slice(body);
        conn.send(&bytes);
        let answer = conn.read_response(false);
        if framing.starts_with("Transfer-Encoding") {
            assert_eq!(answer.status, 502, "{answer:?}");
            let forwarded = poll_until(Duration::from_secs(5), || {
                origin
                    .served()
                    .iter()
                    .any(|s| s.head.contains(&format!("/ws/{i} ")))
            });
            assert!(forwarded, "the origin never got the request");
            let served = origin
                .served()
                .into_iter()
                .find(|s| s.head.contains(&format!("/ws/{i} ")))
                .unwrap();
            assert!(
                !served.head.to_ascii_lowercase().contains("upgrade:"),
                "forwarded as an upgrade: {}",
                served.head
            );
            continue;
        }
        assert_eq!(answer.status, 101, "{answer:?}");
        conn.send(b"TUNNEL");
        let whole = poll_until(Duration::from_secs(5), || {
            origin
                .served()
                .iter()
                .any(|s| s.head.contains(&format!("/ws/{i} ")) && s.after.ends_with(b"TUNNEL"))
        });
        drop(conn);
        let served = origin
            .served()
            .into_iter()
            .find(|s| s.head.contains(&format!("/ws/{i} ")))
            .expect("the origin got the upgrade");
        assert!(whole, "the tunnel bytes never arrived: {served:?}");
        let forwarded_framing = served.head.to_ascii_lowercase();
        let expected: Vec<u8> = if forwarded_framing.contains("transfer-encoding: chunked") {
            [&b"5\r\nhello\r\n0\r\n\r\n"[..], b"TUNNEL"].concat()
        } else {
            [&b"hello"[..], b"TUNNEL"].concat()
        };
        assert_eq!(
            String::from_utf8_lossy(&served.after),
            String::from_utf8_lossy(&expected),
            "head sent: {}",
            served.head
        );
    }
    lacquer.assert_no_panic();
}

/// Requests that ask for no tunnel the proxy will carry (`h2c` only, which Lacquer strips;
/// `Upgrade` without `Connection: upgrade`, which it does not forward; HTTP/1.0 with an upgrade)
/// answered `101` by a hostile origin, which then writes a whole HTTP answer: the origin never
/// saw an upgrade, so the client must not be switched (a 502, its connection closed), and the
/// bytes after the 101 never reach it as an answer.
#[test]
fn a_101_to_an_upgrade_that_was_not_forwarded_never_switches_the_client() {
    let origin = TunnelOrigin::start_with(|_| [SWITCH, SMUGGLED].concat(), Mode::Read);
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let cases = [
        (
            "h2c only",
            "GET /h2c HTTP/1.1",
            "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
             HTTP2-Settings: AAMAAABkAAQAAP__\r\n",
        ),
        (
            "no Connection: upgrade",
            "GET /unnominated HTTP/1.1",
            "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
        ),
        ("HTTP/1.0", "GET /old HTTP/1.0", WS),
        (
            "Connection: upgrade without Upgrade",
            "GET /no-upgrade-field HTTP/1.1",
            "Connection: upgrade\r\n",
        ),
    ];
    let mut faults = Vec::new();
    for (name, line, fields) in cases {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(head(line, fields).as_bytes());
        let answer = conn.try_read_response(false);
        let _ = conn.try_send(head("GET /probe HTTP/1.1", "").as_bytes());
        let rest = String::from_utf8_lossy(&conn.read_rest()).into_owned();
        let status = answer.as_ref().map(|a| a.status).ok();
        let target = format!(" {} ", line.split(' ').nth(1).unwrap());
        let forwarded = origin
            .served()
            .into_iter()
            .find(|s| s.head.lines().next().unwrap_or("").contains(&target))
            .map(|s| s.head)
            .unwrap_or_default();
        if status == Some(101) || rest.contains("smuggled") {
            faults.push(format!(
                "{name}: status {status:?}, after: {rest:?}, origin saw: {forwarded:?}"
            ));
        }
    }
    assert!(faults.is_empty(), "{faults:#?}");
    lacquer.assert_no_panic();
}

/// When a tunnel ends, its upstream connection is closed: never pooled and handed to the next
/// request (whose head would land inside the origin's WebSocket, and whose answer would be
/// whatever the tunnel's peer writes).
#[test]
fn the_upstream_connection_of_a_tunnel_is_never_reused() {
    let origin = KeepAliveOrigin::start(|seen, stream| {
        if seen
            .head
            .to_ascii_lowercase()
            .contains("upgrade: websocket")
        {
            let _ = stream.write_all(SWITCH);
        } else {
            let body = format!("{} #{}", seen.path, seen.nth);
            // plain answers close their connection, so only a tunnel's can be pooled
            let close = if seen.path.starts_with("/after") {
                "Connection: close\r\n"
            } else {
                ""
            };
            let _ = stream.write_all(&plain_answer(&body, close));
            if seen.path.starts_with("/after") {
                return Then::Close;
            }
        }
        // the origin treats the switched connection as HTTP still: anything the proxy writes
        // into it later is read, logged and answered as a request
        Then::KeepAlive
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    for round in 0..3 {
        let mut tunnel = open_tunnel(lacquer.addr(), &format!("/ws/{round}"));
        // tunnel bytes that the origin reads as a request on its switched connection
        tunnel.send(head(&format!("GET /inside/{round} HTTP/1.1"), "").as_bytes());
        let inside = tunnel.read_response(false);
        assert_eq!(inside.text(), format!("/inside/{round} #2"));
        drop(tunnel);
        std::thread::sleep(Duration::from_millis(300));
        let mut plain = RawConn::connect(lacquer.addr());
        let after = plain.get(&format!("/after/{round}"), &[]);
        assert_eq!(after.status, 200, "{after:?}");
        assert_eq!(
            after.text(),
            format!("/after/{round} #1"),
            "the request after a tunnel went on the tunnel's upstream connection"
        );
    }
}

/// 640 tunnels, each opened by a bodyless GET and used at once: every one carries the client's
/// bytes to the origin and its answer back. Found 2026-12-08 (one run in about fifteen of the
/// test above, in CI): the end of the GET's own (empty) body, handed to the upstream side before
/// the 101 came back, was read there after the 101 and taken for the end of the tunnel, which
/// was closed before a byte went through (vendored pingora-proxy patch 0020).
#[test]
fn every_tunnel_carries_its_first_bytes_whenever_its_101_comes_back() {
    let origin = KeepAliveOrigin::start(|seen, stream| {
        if seen
            .head
            .to_ascii_lowercase()
            .contains("upgrade: websocket")
        {
            let _ = stream.write_all(SWITCH);
        } else {
            let body = format!("{} #{}", seen.path, seen.nth);
            let _ = stream.write_all(&plain_answer(&body, ""));
        }
        Then::KeepAlive
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    // sixteen clients at once, so that the proxy's two workers have other work between a
    // tunnel's steps
    let addr = lacquer.addr();
    let clients: Vec<_> = (0..16)
        .map(|client| {
            std::thread::spawn(move || {
                let mut cut = Vec::new();
                for n in (0..40).map(|i| client * 40 + i) {
                    let mut tunnel = open_tunnel(addr, &format!("/ws/{n}"));
                    tunnel.send(head(&format!("GET /inside/{n} HTTP/1.1"), "").as_bytes());
                    match tunnel.try_read_response(false) {
                        Ok(inside) if inside.text() == format!("/inside/{n} #2") => {}
                        other => cut.push(format!("tunnel {n}: {other:?}")),
                    }
                }
                cut
            })
        })
        .collect();
    let cut: Vec<String> = clients
        .into_iter()
        .flat_map(|client| client.join().unwrap())
        .collect();
    assert!(cut.is_empty(), "{} of 640 tunnels: {cut:#?}", cut.len());
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// caching

/// A stored answer is never served to an upgrade request for its URL (which reaches the origin
/// and is switched), and an answer to an upgrade request the origin refused is never stored for
/// the plain requests after it.
#[test]
fn upgrade_requests_are_never_hits_and_never_fill_the_cache() {
    let origin = KeepAliveOrigin::start(|seen, stream| {
        let upgrade = seen
            .head
            .to_ascii_lowercase()
            .contains("upgrade: websocket");
        if upgrade && seen.path == "/page" {
            let _ = stream.write_all(SWITCH);
            return Then::Close;
        }
        let body = if upgrade { "for the upgrade" } else { "plain" };
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=600\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        Then::KeepAlive
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    // stored, then a hit
    for _ in 0..2 {
        assert_eq!(
            RawConn::connect(lacquer.addr()).get("/page", &[]).text(),
            "plain"
        );
    }
    assert_eq!(origin.seen_for("/page").len(), 1);
    let upgrade = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let switched = RawConn::connect(lacquer.addr()).get("/page", &upgrade);
    assert_eq!(switched.status, 101, "an upgrade answered from the cache");
    assert_eq!(origin.seen_for("/page").len(), 2);

    // the refused upgrade's cacheable answer is not what plain requests get next
    let refused = RawConn::connect(lacquer.addr()).get("/other", &upgrade);
    assert_eq!(refused.text(), "for the upgrade");
    let plain = RawConn::connect(lacquer.addr()).get("/other", &[]);
    assert_eq!(plain.text(), "plain", "the upgrade's answer was stored");
    // and the stored page is intact after the tunnel
    assert_eq!(
        RawConn::connect(lacquer.addr()).get("/page", &[]).text(),
        "plain"
    );
}

// ---------------------------------------------------------------------------------------------
// CONNECT and absolute-form: no open proxy

/// `CONNECT` (to a local port, to a remote name) and absolute-form targets naming another host,
/// with and without an upgrade: none opens a connection anywhere but the configured origin, no
/// CONNECT reaches the origin, and the bytes a client sends behind a CONNECT are never tunnelled.
#[test]
fn connect_and_absolute_form_targets_open_no_tunnel_elsewhere() {
    let victim = Victim::start();
    let origin = KeepAliveOrigin::start(|seen, stream| {
        let body = format!("{} {}", seen.method, seen.path);
        let _ = stream.write_all(&plain_answer(&body, ""));
        Then::KeepAlive
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let v = victim.addr;
    let connects = [
        format!("CONNECT {v} HTTP/1.1\r\nHost: {v}\r\n\r\nSSH-2.0-client\r\n"),
        "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n".to_string(),
        format!(
            "CONNECT {v} HTTP/1.1\r\nHost: {v}\r\n{WS}\r\nGET /behind-connect HTTP/1.1\r\n\
             Host: test\r\n\r\n"
        ),
    ];
    for request in &connects {
        let bytes = raw_request(lacquer.addr(), request.as_bytes());
        let status = raw_status(&bytes);
        assert!(
            status.is_some_and(|s| (400..500).contains(&s)),
            "{request:?} -> {:?}",
            String::from_utf8_lossy(&bytes)
        );
        assert!(!String::from_utf8_lossy(&bytes).contains("SSH-2.0-victim"));
    }
    let absolute = [
        format!("GET http://{v}/abs HTTP/1.1\r\nHost: {v}\r\n\r\n"),
        format!("GET http://{v}/abs-ws HTTP/1.1\r\nHost: {v}\r\n{WS}\r\n"),
        format!("GET https://{v}/abs-tls HTTP/1.1\r\nHost: {v}\r\n\r\n"),
    ];
    for request in &absolute {
        let bytes = raw_request(lacquer.addr(), request.as_bytes());
        assert!(
            !String::from_utf8_lossy(&bytes).contains("SSH-2.0-victim"),
            "{request:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        victim.accepted.load(Ordering::SeqCst),
        0,
        "a tunnel to the victim"
    );
    let seen = origin.seen();
    assert!(
        seen.iter().all(|s| s.method != "CONNECT"
            && s.path != "/behind-connect"
            && !s.head.contains("SSH-2.0-client")),
        "{seen:#?}"
    );
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Expect: 100-continue

/// A POST with `Expect: 100-continue` whose body is itself an HTTP request; the origin answers
/// 417 before reading the body; the client sends the body anyway (after the 417, or at once)
/// and then a real next request. The body is never read as a request (the origin never sees
/// `/smuggled`), and the client's next answer, if any, is the answer to its next request.
#[test]
fn a_body_sent_after_a_417_is_never_read_as_a_request() {
    let origin = RawOrigin::answering(|head, stream| {
        let (_, target) = raw_text::request_line(head);
        let body = format!("answer to {target}");
        let status = if target.starts_with("/expect") {
            "417 Expectation Failed"
        } else {
            "200 OK"
        };
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\
                 Cache-Control: no-store\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    });
    let lacquer = LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"");
    let inner = head("GET /smuggled HTTP/1.1", "");
    for (i, at_once) in [(0, false), (1, true), (2, false)] {
        let upgrade = if i == 2 { WS } else { "" };
        let first = head(
            &format!("POST /expect/{i} HTTP/1.1"),
            &format!(
                "{upgrade}Expect: 100-continue\r\nContent-Length: {}\r\n",
                inner.len()
            ),
        );
        let next = head(&format!("GET /next/{i} HTTP/1.1"), "");
        let mut conn = RawConn::connect(lacquer.addr());
        if at_once {
            conn.send(format!("{first}{inner}{next}").as_bytes());
        } else {
            conn.send(first.as_bytes());
        }
        let answer = conn.read_response(false);
        assert_eq!(answer.status, 417, "{answer:?}");
        if !at_once {
            let _ = conn.try_send(format!("{inner}{next}").as_bytes());
        }
        if let Ok(second) = conn.try_read_response(false) {
            assert_eq!(second.text(), format!("answer to /next/{i}"), "{second:?}");
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let heads = origin.heads();
    assert!(
        heads.iter().all(|h| !h.starts_with("GET /smuggled")),
        "a body was read as a request: {heads:#?}"
    );
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// tunnels and limits

/// `proxy.tunnel_idle_timeout` ends a tunnel in which neither side sends anything (the origin
/// here never closes on its own).
#[test]
fn a_silent_tunnel_is_closed_at_the_tunnel_idle_timeout() {
    let silent = TunnelOrigin::start(SWITCH, Mode::Read);
    let lacquer = LacquerProcess::start_simple(
        silent.addr,
        "[proxy]\ntunnel_idle_timeout = \"1s\"\n[log]\naccess = \"off\"",
    );
    let conn = open_tunnel(lacquer.addr(), "/ws/silent");
    let mut stream = conn.stream().try_clone().unwrap();
    assert!(
        closes_within(&mut stream, Duration::from_secs(12)),
        "a silent tunnel still open 12 s past a 1 s idle timeout"
    );
}

/// A tunnel in which one side keeps talking (a byte every 200 ms) while the other stays silent,
/// each way round, is not ended by `tunnel_idle_timeout`: a WebSocket where only the server
/// pushes, or only the client sends, must stay up. Written (2026-12-07) against the docs of the
/// time, which said the timeout bounded each direction; the docs were wrong, the behaviour is
/// kept (`src/proxy/upgrade.rs`), and this test holds it: the idle timeout ends only a tunnel
/// silent both ways ([`a_silent_tunnel_is_closed_at_the_tunnel_idle_timeout`]).
#[test]
fn a_tunnel_with_one_talking_side_outlives_the_idle_timeout() {
    let silent = TunnelOrigin::start(SWITCH, Mode::Read);
    let chatter_origin = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            if let Some(Ok(mut stream)) = listener.incoming().next() {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(SWITCH);
                for _ in 0..100 {
                    if stream.write_all(b".").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
        addr
    };
    let config = "[proxy]\ntunnel_idle_timeout = \"1s\"\n[log]\naccess = \"off\"";
    let quiet_proxy = LacquerProcess::start_simple(silent.addr, config);
    let chatter_proxy = LacquerProcess::start_simple(chatter_origin, config);
    let client_talking = {
        let addr = quiet_proxy.addr();
        std::thread::spawn(move || {
            let conn = open_tunnel(addr, "/ws/talking-client");
            let mut writer = conn.stream().try_clone().unwrap();
            let mut reader = conn.stream().try_clone().unwrap();
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if writer.write_all(b".").is_err()
                    || closes_within(&mut reader, Duration::from_millis(200))
                {
                    return true;
                }
            }
            false
        })
    };
    let origin_talking = {
        let addr = chatter_proxy.addr();
        std::thread::spawn(move || {
            let conn = open_tunnel(addr, "/ws/talking-origin");
            let mut stream = conn.stream().try_clone().unwrap();
            closes_within(&mut stream, Duration::from_secs(5))
        })
    };
    let results = [
        ("only the client talks", client_talking.join().unwrap()),
        ("only the origin talks", origin_talking.join().unwrap()),
    ];
    let closed: Vec<_> = results.iter().filter(|(_, closed)| *closed).collect();
    assert!(
        closed.is_empty(),
        "tunnels with one side talking ended within 5 s under a 1 s idle timeout: {closed:?}"
    );
}

/// A tunnel client that never reads while the origin floods, and a client that floods while the
/// origin never reads: the proxy buffers a bounded amount (its peak resident memory grows by
/// far less than what was pushed at it).
#[test]
fn a_tunnel_whose_reader_stalls_holds_bounded_memory() {
    let flood = TunnelOrigin::start(SWITCH, Mode::Flood);
    let lacquer = LacquerProcess::start_simple(flood.addr, "[log]\naccess = \"off\"");
    let pid = lacquer.pid();
    let before = status_kb(pid, "VmHWM:");

    // origin floods, client never reads
    let stalled = open_tunnel(lacquer.addr(), "/ws/flood");
    std::thread::sleep(Duration::from_secs(4));
    let pushed = flood.written.load(Ordering::SeqCst);

    // client floods, origin never reads
    let sink = TunnelOrigin::start(SWITCH, Mode::Stall);
    let sink_proxy = LacquerProcess::start_simple(sink.addr, "[log]\naccess = \"off\"");
    let sink_pid = sink_proxy.pid();
    let sink_before = status_kb(sink_pid, "VmHWM:");
    let mut flooder = open_tunnel(sink_proxy.addr(), "/ws/sink");
    let _ = flooder
        .stream()
        .set_write_timeout(Some(Duration::from_secs(1)));
    let block = vec![b'c'; 64 * 1024];
    let until = Instant::now() + Duration::from_secs(3);
    let mut sent = 0usize;
    let mut writer = flooder.stream().try_clone().unwrap();
    while Instant::now() < until {
        match writer.write(&block) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    let after = status_kb(pid, "VmHWM:");
    let sink_after = status_kb(sink_pid, "VmHWM:");
    drop(stalled);
    let _ = flooder.try_send(b"");
    let grew = after.saturating_sub(before);
    let sink_grew = sink_after.saturating_sub(sink_before);
    assert!(
        grew < 48 * 1024,
        "peak RSS grew {grew} kB while the origin pushed {pushed} bytes at a client that never reads"
    );
    assert!(
        pushed < 64 * 1024 * 1024,
        "the proxy took {pushed} bytes from the origin for a client that never reads"
    );
    assert!(
        sink_grew < 48 * 1024,
        "peak RSS grew {sink_grew} kB while a client pushed {sent} bytes at an origin that never reads"
    );
    assert!(
        sent < 64 * 1024 * 1024,
        "the proxy took {sent} bytes from a client for an origin that never reads"
    );
    lacquer.assert_no_panic();
}

/// A tunnel holds its backend's `max_in_flight` slot while open (a design choice); when it ends
/// the slot comes back: plain requests are answered after each tunnel closes.
#[test]
fn a_closed_tunnel_gives_its_max_in_flight_slot_back() {
    let origin = TunnelOrigin::start_with(
        |head| {
            if head.to_ascii_lowercase().contains("upgrade: websocket") {
                SWITCH.to_vec()
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nplain"
                    .to_vec()
            }
        },
        Mode::Echo,
    );
    let lacquer = start_balancer(
        &[(origin.addr, 1)],
        "[balancer]\nmax_in_flight = 1\n[balancer.queue]\nlength = 1\ntimeout = \"2s\"\n\
         [log]\naccess = \"off\"\n",
    );
    for round in 0..3 {
        let mut tunnel = open_tunnel(lacquer.addr(), &format!("/ws/{round}"));
        tunnel.send(b"ping");
        let mut echoed = [0u8; 4];
        let mut stream = tunnel.stream().try_clone().unwrap();
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        stream.read_exact(&mut echoed).unwrap();
        assert_eq!(&echoed, b"ping");
        drop(stream);
        drop(tunnel);
        let mut ok = false;
        for _ in 0..20 {
            let answer = RawConn::connect(lacquer.addr()).get(&format!("/plain/{round}"), &[]);
            if answer.status == 200 {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(ok, "round {round}: the tunnel's slot never came back");
    }
    // three tunnels and three plain requests, each on its own upstream connection
    assert!(origin.accepted.load(Ordering::SeqCst) >= 6);
}

/// `[fairness] max_in_flight` caps one client's requests going upstream at once. An `Upgrade`
/// field that Lacquer does not even forward (no `Connection: upgrade`) must not exempt an
/// ordinary request from the cap.
#[test]
fn an_upgrade_field_does_not_exempt_a_request_from_fairness() {
    let replica = Replica::start("a");
    let lb = start_balancer(
        &[(replica.addr(), 1)],
        "[fairness]\nmax_in_flight = 1\n[log]\naccess = \"off\"\n",
    );
    let addr = lb.addr();
    let clients: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let mut conn = RawConn::connect(addr);
                conn.get(
                    &format!("/slow/{i}?sleep=1500"),
                    &[("Upgrade", "websocket")],
                )
                .status
            })
        })
        .collect();
    let statuses: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert!(
        replica.max_in_flight() <= 1,
        "one client had {} requests at the origin at once under max_in_flight = 1 \
         (statuses {statuses:?})",
        replica.max_in_flight()
    );
}

/// An upgrade takes its client's fairness slot like any request (above), and gives it back at
/// its `101`: under `max_in_flight = 1` (excess rejected), a client with one tunnel open opens a
/// second. A tunnel holding its slot for as long as it stays open would turn the second away
/// (`429`).
#[test]
fn an_open_tunnel_gives_its_fairness_slot_back() {
    let origin = TunnelOrigin::start(SWITCH, Mode::Read);
    let lacquer = LacquerProcess::start_simple(
        origin.addr,
        "[fairness]\nmax_in_flight = 1\non_excess = \"reject\"\n[log]\naccess = \"off\"",
    );
    let first = open_tunnel(lacquer.addr(), "/ws/first");
    // `open_tunnel` asserts the 101
    let second = open_tunnel(lacquer.addr(), "/ws/second");
    drop((first, second));
}

/// SIGTERM with a busy tunnel open: the process still exits, within its `shutdown_timeout`.
#[test]
fn a_busy_tunnel_does_not_hold_up_shutdown() {
    let origin = TunnelOrigin::start(SWITCH, Mode::Echo);
    let mut lacquer = LacquerProcess::start_simple(
        origin.addr,
        "grace_period = \"0s\"\nshutdown_timeout = \"2s\"\n[log]\naccess = \"off\"",
    );
    let tunnel = open_tunnel(lacquer.addr(), "/ws/busy");
    let mut writer = tunnel.stream().try_clone().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let halt = stop.clone();
    let chatter = std::thread::spawn(move || {
        while !halt.load(Ordering::SeqCst) {
            if writer.write_all(b".").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(lacquer.signal("TERM"));
    let exited = lacquer.wait_exit(Duration::from_secs(15));
    stop.store(true, Ordering::SeqCst);
    let _ = chatter.join();
    assert!(
        exited.is_some(),
        "still running 15 s after SIGTERM with a busy tunnel"
    );
}

/// An origin that ends the tunnel (closes right after its 101) ends it for the client too, and
/// the tunnel's client connection then counts no more against `server.max_connections`: after
/// more tunnels than the cap, each ended by the origin while the client kept its side open, a
/// plain request is still answered.
#[test]
fn tunnels_the_origin_ends_free_their_client_connections() {
    let origin = RawOrigin::answering(|head, stream| {
        if head.to_ascii_lowercase().contains("upgrade: websocket") {
            let _ = stream.write_all(SWITCH);
            std::thread::sleep(Duration::from_millis(100));
        } else {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nplain",
            );
        }
    });
    let lacquer = LacquerProcess::start_simple(
        origin.addr,
        "[server]\nmax_connections = 2\n[log]\naccess = \"off\"",
    );
    let mut held = Vec::new();
    for round in 0..4 {
        let conn = open_tunnel(lacquer.addr(), &format!("/ws/{round}"));
        let mut stream = conn.stream().try_clone().unwrap();
        assert!(
            closes_within(&mut stream, Duration::from_secs(5)),
            "round {round}: the origin closed the tunnel, the client's side stayed open"
        );
        // the client keeps its socket (it never closes its side)
        held.push(conn);
    }
    let answer = RawConn::connect(lacquer.addr()).get("/plain", &[]);
    assert_eq!(answer.text(), "plain");
    drop(held);
}
