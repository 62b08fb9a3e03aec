//! Attacks on HTTP/1.1 upgrade tunnels through Lacquer (`src/proxy/upgrade.rs`, Pingora's duplex
//! loops `proxy_handle_upstream` / `proxy_handle_downstream` in
//! `vendor/pingora-proxy/src/proxy_h1.rs`, the upgraded body readers and writers of
//! `vendor/pingora-core/src/protocols/http/v1/`) as a flaky network, a hostile client and a hostile
//! origin would run them, over real sockets: bytes pipelined behind the upgrade request, bytes in
//! the 101's own write, half-closes either way, several MB both ways at once with slow readers,
//! hundreds of tunnels at once, resets and vanishing peers, a 101 with body framing, refusals with
//! trailing bytes, keep-alive then upgrade, SIGHUP and SIGTERM with tunnels open, and an h2
//! `CONNECT`. Written 2026-12-08 (breaker session); what `tests/upgrade_attacks.rs` and
//! `tests/upgrade_tunnels.rs` cover is not repeated.
//!
//! Promises held: a tunnel carries its bytes exactly and in order both ways (whatever packet
//! they came in, whenever they come relative to the 101); nothing of a tunnel is reused for
//! another request; a tunnel's failure never affects other connections; every error is clean
//! (no panic).
//!
//! Found (see each test's doc comment; the half-closes are left open, `KNOWN`):
//!
//! * Half-close from either side ends the whole tunnel: bytes the other side still sends are
//!   dropped (the README and `docs/architecture.md` do say "until a side closes", so this is a
//!   documented limit, but it breaks protocols that half-close, and it loses the answer to a
//!   request a client sent just before shutting its write side)
//!   ([`a_client_half_close_still_gets_the_origins_answer`],
//!   [`an_origin_half_close_still_gets_the_clients_bytes`]).
//! * A 101 that comes back before the end of a chunked upgrade request's body broke the body's
//!   framing at the origin: the proxy switched both sides to raw bytes mid-chunk and never ended
//!   its own chunked body. Fixed the same day: such a request is not forwarded as an upgrade
//!   ([`a_body_cut_by_an_early_101_reaches_the_origin_whole`]).
//! * A 101 to a protocol the forwarded request never offered (`h2c`, which Lacquer strips;
//!   anything else; no `Upgrade` at all) switched the client anyway. Fixed the same day: refused
//!   with a 502 ([`a_101_to_a_protocol_never_offered_never_switches_the_client`]).

use lacquer_test_support as support;
use support::*;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// The fields of a WebSocket handshake a client sends.
const WS: &str = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                  Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

/// A 101 an origin sends to accept a WebSocket handshake.
const SWITCH: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                        Connection: Upgrade\r\n\
                        Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";

/// What an origin received on each connection: the request target (or head) and the bytes.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

const ACCESS_OFF: &str = "[log]\naccess = \"off\"";

/// A raw request head: `line`, `Host: test`, then `fields` (each ending in CRLF).
fn head(line: &str, fields: &str) -> String {
    format!("{line}\r\nHost: test\r\n{fields}\r\n")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads until `buf` holds a whole head; returns it and leaves the bytes after it in `buf`.
fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..at + 4]).into_owned();
            buf.drain(..at + 4);
            return Some(head);
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An origin on its own thread: every accepted connection goes to `handler` on a thread of its
/// own. Returns the address and the count of accepted connections.
fn spawn_origin(
    handler: impl Fn(usize, TcpStream) + Send + Sync + 'static,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let handler = Arc::new(handler);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let n = count.fetch_add(1, Ordering::SeqCst);
            let handler = handler.clone();
            std::thread::spawn(move || handler(n, stream));
        }
    });
    (addr, accepted)
}

/// Writes `already`, then echoes every byte until EOF or an error (60 s cap per read).
fn echo(stream: &mut TcpStream, already: &[u8]) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    if !already.is_empty() && stream.write_all(already).is_err() {
        return;
    }
    let mut chunk = [0u8; 32 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&chunk[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// An origin that answers an upgrade with [`SWITCH`] (plus `extra` in the same write), then
/// echoes (the bytes that came with the head first).
fn echo_origin(extra: &'static [u8]) -> SocketAddr {
    spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).is_none() {
            return;
        }
        if stream.write_all(&[SWITCH, extra].concat()).is_err() {
            return;
        }
        echo(&mut stream, &buf);
    })
    .0
}

/// Opens a tunnel: the upgrade head and `extra` in one write; returns the stream and the bytes
/// that came after the 101's head, or why it failed.
fn try_tunnel(addr: SocketAddr, path: &str, extra: &[u8]) -> Result<(TcpStream, Vec<u8>), String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut bytes = head(&format!("GET {path} HTTP/1.1"), WS).into_bytes();
    bytes.extend_from_slice(extra);
    stream.write_all(&bytes).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let answer = read_head(&mut stream, &mut buf).ok_or("no answer head")?;
    if !answer.starts_with("HTTP/1.1 101") {
        return Err(format!("not switched: {answer:?}"));
    }
    Ok((stream, buf))
}

fn tunnel(addr: SocketAddr, path: &str, extra: &[u8]) -> (TcpStream, Vec<u8>) {
    try_tunnel(addr, path, extra).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Reads until `have` holds `n` bytes (or EOF, error, timeout); returns the first `n`, leaving
/// the rest in `have`.
fn read_n(stream: &mut TcpStream, have: &mut Vec<u8>, n: usize) -> Result<Vec<u8>, String> {
    let mut chunk = [0u8; 32 * 1024];
    while have.len() < n {
        match stream.read(&mut chunk) {
            Ok(0) => return Err(format!("EOF after {} of {n} bytes", have.len())),
            Ok(k) => have.extend_from_slice(&chunk[..k]),
            Err(e) => return Err(format!("{e} after {} of {n} bytes", have.len())),
        }
    }
    Ok(have.drain(..n).collect())
}

/// Everything until EOF (or reset) within `bound`: the bytes and whether the end came.
fn read_to_end_within(stream: &mut TcpStream, bound: Duration) -> (Vec<u8>, bool) {
    let until = Instant::now() + bound;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut out = Vec::new();
    let mut chunk = [0u8; 32 * 1024];
    while Instant::now() < until {
        match stream.read(&mut chunk) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

/// Makes the socket's close a reset (RST): `SO_LINGER` on, 0 s.
fn reset_on_close(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a `linger` of the size given
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// A plain GET on a fresh connection: status and body, or why not.
fn plain_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut conn = RawConn::connect(addr);
    conn.read_timeout = Duration::from_secs(10);
    conn.send(head(&format!("GET {path} HTTP/1.1"), "").as_bytes());
    let answer = conn.try_read_response(false)?;
    Ok((answer.status, answer.text()))
}

/// Runs `per_tunnel(n)` for `clients * each` tunnels from `clients` threads; returns the
/// failures.
fn from_threads(
    clients: usize,
    each: usize,
    per_tunnel: impl Fn(usize) -> Result<(), String> + Send + Sync + 'static,
) -> Vec<String> {
    let per_tunnel = Arc::new(per_tunnel);
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let per_tunnel = per_tunnel.clone();
            std::thread::spawn(move || {
                (0..each)
                    .map(|i| client * each + i)
                    .filter_map(|n| per_tunnel(n).err().map(|e| format!("tunnel {n}: {e}")))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// bytes around the 101

/// 480 tunnels from 12 clients, each with tunnel bytes in the same write as its upgrade head
/// (before any 101), then more bytes after the 101: the origin receives the first ones right
/// after the head, echoes them, and the client reads both back exactly, in order.
#[test]
fn tunnel_bytes_pipelined_with_the_upgrade_head_arrive_first_and_exactly() {
    let origin = echo_origin(b"");
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let failures = from_threads(12, 40, move |n| {
        let first = format!("early-{n}-").into_bytes();
        let (mut stream, mut have) = try_tunnel(addr, &format!("/ws/{n}"), &first)?;
        let second = format!("late-{n}.").into_bytes();
        stream.write_all(&second).map_err(|e| e.to_string())?;
        let want = [first, second].concat();
        let got = read_n(&mut stream, &mut have, want.len())?;
        if got != want {
            return Err(format!(
                "echoed {:?}, sent {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want)
            ));
        }
        Ok(())
    });
    assert!(
        failures.is_empty(),
        "{} of 480: {failures:#?}",
        failures.len()
    );
    lacquer.assert_no_panic();
}

/// The client sends tunnel bytes in a separate packet while the origin holds its 101 back
/// (200 ms): they are carried after the 101, exactly, not dropped nor read as a request.
#[test]
fn tunnel_bytes_sent_while_the_101_is_held_back_are_carried() {
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).is_none() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
        if stream.write_all(SWITCH).is_err() {
            return;
        }
        echo(&mut stream, &buf);
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let failures = from_threads(8, 6, move |n| {
        let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        stream
            .write_all(head(&format!("GET /ws/{n} HTTP/1.1"), WS).as_bytes())
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(50));
        let early = format!("GET /not-a-request/{n} HTTP/1.1\r\nHost: test\r\n\r\n").into_bytes();
        stream.write_all(&early).map_err(|e| e.to_string())?;
        let mut have = Vec::new();
        let answer = read_head(&mut stream, &mut have).ok_or("no answer")?;
        if !answer.starts_with("HTTP/1.1 101") {
            return Err(format!("not switched: {answer:?}"));
        }
        let got = read_n(&mut stream, &mut have, early.len())?;
        if got != early {
            return Err(format!("echoed {:?}", String::from_utf8_lossy(&got)));
        }
        Ok(())
    });
    assert!(
        failures.is_empty(),
        "{} of 48: {failures:#?}",
        failures.len()
    );
    lacquer.assert_no_panic();
}

/// 480 tunnels whose origin writes its first tunnel bytes in the same write as the 101, before
/// the client sent anything: the client reads them without sending, exactly.
#[test]
fn origin_bytes_in_the_101_write_reach_the_client_unasked() {
    let origin = echo_origin(b"welcome-from-the-origin;");
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let failures = from_threads(12, 40, move |n| {
        let (mut stream, mut have) = try_tunnel(addr, &format!("/ws/{n}"), b"")?;
        let want = b"welcome-from-the-origin;";
        let got = read_n(&mut stream, &mut have, want.len())?;
        if got != want {
            return Err(format!("got {:?}", String::from_utf8_lossy(&got)));
        }
        // and the tunnel still carries the client's bytes
        let ping = format!("ping-{n}").into_bytes();
        stream.write_all(&ping).map_err(|e| e.to_string())?;
        let got = read_n(&mut stream, &mut have, ping.len())?;
        if got != ping {
            return Err(format!("echo {:?}", String::from_utf8_lossy(&got)));
        }
        Ok(())
    });
    assert!(
        failures.is_empty(),
        "{} of 480: {failures:#?}",
        failures.len()
    );
    lacquer.assert_no_panic();
}

/// An origin that writes its 101, 256 KiB of tunnel bytes and closes, all at once: the client
/// gets every byte, then the end (the origin's close must not overtake its own bytes). 120
/// tunnels from 6 clients.
#[test]
fn an_origin_that_sends_and_closes_at_once_delivers_every_byte() {
    let payload = Arc::new(generated_bytes(256 * 1024, 3));
    let sent = payload.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).is_none() {
            return;
        }
        let _ = stream.write_all(&[SWITCH, &sent[..]].concat());
        let _ = stream.shutdown(Shutdown::Write);
        // then reads until the proxy closes, so that the close is a FIN, not a reset
        let _ = read_to_end_within(&mut stream, Duration::from_secs(10));
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let failures = from_threads(6, 20, move |n| {
        let (mut stream, have) = try_tunnel(addr, &format!("/ws/{n}"), b"")?;
        let (rest, ended) = read_to_end_within(&mut stream, Duration::from_secs(20));
        let got = [have, rest].concat();
        if !ended {
            return Err("still open 20 s after the origin closed".into());
        }
        if got[..] != payload[..] {
            return Err(format!(
                "{} bytes, first wrong at {:?}",
                got.len(),
                generated_mismatch(&got, 3, 0)
            ));
        }
        Ok(())
    });
    assert!(
        failures.is_empty(),
        "{} of 120: {failures:#?}",
        failures.len()
    );
    lacquer.assert_no_panic();
}

/// A client that writes 256 KiB into its tunnel and closes its socket at once: the origin gets
/// every byte, then the end. 120 tunnels from 6 clients.
#[test]
fn a_client_that_sends_and_closes_at_once_delivers_every_byte() {
    let received: Received = Arc::default();
    let log = received.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let _ = stream.write_all(SWITCH);
        let (rest, _) = read_to_end_within(&mut stream, Duration::from_secs(20));
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        log.lock().unwrap().push((path, [buf, rest].concat()));
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let payload = generated_bytes(256 * 1024, 5);
    let failures = from_threads(6, 20, move |n| {
        let (mut stream, _) = try_tunnel(addr, &format!("/ws/{n}"), b"")?;
        stream.write_all(&payload).map_err(|e| e.to_string())?;
        drop(stream);
        Ok(())
    });
    assert!(failures.is_empty(), "{failures:#?}");
    let all_in = poll_until(Duration::from_secs(30), || {
        received.lock().unwrap().len() >= 120
    });
    let received = received.lock().unwrap().clone();
    assert!(all_in, "only {} of 120 origin sides ended", received.len());
    let short: Vec<_> = received
        .iter()
        .filter(|(_, got)| got.len() != 256 * 1024 || !verify_generated(got, 5, 0))
        .map(|(path, got)| {
            format!(
                "{path}: {} bytes, first wrong at {:?}",
                got.len(),
                generated_mismatch(got, 5, 0)
            )
        })
        .collect();
    assert!(short.is_empty(), "{} of 120: {short:#?}", short.len());
    lacquer.assert_no_panic();
}

/// A client that sends its upgrade head, tunnel bytes and its FIN, all before the origin's 101
/// (held back 150 ms): the origin still gets every byte after the head. 48 tunnels from 8
/// clients.
#[test]
fn pipelined_bytes_and_a_fin_before_the_101_all_reach_the_origin() {
    let received: Received = Arc::default();
    let log = received.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        std::thread::sleep(Duration::from_millis(150));
        let _ = stream.write_all(SWITCH);
        let (rest, _) = read_to_end_within(&mut stream, Duration::from_secs(10));
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        log.lock().unwrap().push((path, [buf, rest].concat()));
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let failures = from_threads(8, 6, move |n| {
        let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        let mut bytes = head(&format!("GET /ws/{n} HTTP/1.1"), WS).into_bytes();
        bytes.extend_from_slice(&generated_bytes(8 * 1024 + n, (n % 200) as u8));
        stream.write_all(&bytes).map_err(|e| e.to_string())?;
        stream
            .shutdown(Shutdown::Write)
            .map_err(|e| e.to_string())?;
        let _ = read_to_end_within(&mut stream, Duration::from_secs(10));
        Ok(())
    });
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(poll_until(Duration::from_secs(15), || received
        .lock()
        .unwrap()
        .len()
        >= 48));
    let short: Vec<String> = received
        .lock()
        .unwrap()
        .iter()
        .filter_map(|(path, got)| {
            let n: usize = path.trim_start_matches("/ws/").parse().unwrap();
            let want = generated_bytes(8 * 1024 + n, (n % 200) as u8);
            (*got != want).then(|| format!("{path}: {} of {} bytes", got.len(), want.len()))
        })
        .collect();
    assert!(short.is_empty(), "{} of 48: {short:#?}", short.len());
    lacquer.assert_no_panic();
}

/// Interim answers before the 101 (`103 Early Hints`, and `100 Continue` to an upgrade that
/// asked for it), in the same write as the 101 and its first tunnel bytes, and a 101 head
/// dribbled in 7-byte pieces: the client gets the 101 (after any interim answer) and then
/// exactly the origin's tunnel bytes, and its own bytes are echoed.
#[test]
fn interim_answers_and_a_dribbled_101_still_open_an_exact_tunnel() {
    const HINTS: &[u8] = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
    const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let first: Vec<u8> = if head.contains("/ws/hints") {
            [HINTS, SWITCH, b"origin-first"].concat()
        } else if head.contains("/ws/continue") {
            [CONTINUE, SWITCH, b"origin-first"].concat()
        } else {
            for piece in SWITCH.chunks(7) {
                if stream.write_all(piece).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            b"origin-first".to_vec()
        };
        if stream.write_all(&first).is_err() {
            return;
        }
        echo(&mut stream, &buf);
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let mut faults = Vec::new();
    for round in 0..20 {
        for case in ["hints", "continue", "dribbled"] {
            let expect = if case == "continue" {
                "Expect: 100-continue\r\n"
            } else {
                ""
            };
            let mut stream = TcpStream::connect(lacquer.addr()).unwrap();
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            stream
                .write_all(
                    head(
                        &format!("GET /ws/{case}/{round} HTTP/1.1"),
                        &format!("{WS}{expect}"),
                    )
                    .as_bytes(),
                )
                .unwrap();
            let mut have = Vec::new();
            let answer = loop {
                match read_head(&mut stream, &mut have) {
                    Some(h) if h.starts_with("HTTP/1.1 1") && !h.starts_with("HTTP/1.1 101") => {}
                    other => break other,
                }
            };
            if !answer.as_deref().unwrap_or("").starts_with("HTTP/1.1 101") {
                faults.push(format!("{case} {round}: {answer:?}"));
                continue;
            }
            match read_n(&mut stream, &mut have, 12) {
                Ok(got) if got == b"origin-first" => {}
                other => {
                    faults.push(format!("{case} {round}: first bytes {other:?}"));
                    continue;
                }
            }
            let ping = format!("ping {case} {round}").into_bytes();
            stream.write_all(&ping).unwrap();
            match read_n(&mut stream, &mut have, ping.len()) {
                Ok(got) if got == ping => {}
                other => faults.push(format!("{case} {round}: echo {other:?}")),
            }
        }
    }
    assert!(faults.is_empty(), "{} of 60: {faults:#?}", faults.len());
    lacquer.assert_no_panic();
}

/// Decodes a chunked body at the start of `data`: the body and the bytes after its end, or
/// why not.
fn dechunk(data: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let line_end = find(&data[at..], b"\r\n").ok_or("no chunk size line")? + at;
        let line = String::from_utf8_lossy(&data[at..line_end]).into_owned();
        let size =
            usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).map_err(|_| {
                let shown: String = line.chars().take(16).collect();
                format!("bad chunk size line at byte {at} ({shown:?}...)")
            })?;
        at = line_end + 2;
        if size == 0 {
            if data.get(at..at + 2) != Some(b"\r\n") {
                return Err("no CRLF after the last chunk".into());
            }
            return Ok((body, data[at + 2..].to_vec()));
        }
        if data.len() < at + size + 2 {
            return Err(format!("chunk of {size} cut at {}", data.len()));
        }
        body.extend_from_slice(&data[at..at + size]);
        if &data[at + size..at + size + 2] != b"\r\n" {
            return Err(format!("no CRLF after a chunk at {}", at + size));
        }
        at += size + 2;
    }
}

/// An upgrade request with a body, answered 101 by the origin as soon as it read the head
/// (before the body's end reached the proxy). A body of a known length reaches the origin whole,
/// then the tunnel's bytes. A chunked one is not forwarded as an upgrade at all (its `Upgrade`
/// is dropped, and the origin's 101 refused). Found 2026-12-08: with a chunked body cut in the
/// middle of a chunk by the 101, the proxy forwarded the part it had decoded as a chunk of its
/// own, then switched both sides to raw bytes at once: the rest of the client's chunk framing
/// went on raw, mid-chunk, so the origin read chunk data where it expected a chunk size line
/// (`bad chunk size line`), and the forwarded body never ended (every run, 3 of 3 rounds). Cause:
/// `HttpSession::prepare_response_header` in `vendor/pingora-core/src/protocols/http/v1/server.rs`
/// (`body_reader.convert_to_close_delimited()` at the 101) with `maybe_upgrade_body_writer` in
/// `v1/client.rs`; avoided in `upgrade::on_upstream_request` rather than patched there.
#[test]
fn a_body_cut_by_an_early_101_reaches_the_origin_whole() {
    let received: Received = Arc::default();
    let log = received.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let _ = stream.write_all(SWITCH);
        let until = Instant::now() + Duration::from_secs(5);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
        let mut chunk = [0u8; 16 * 1024];
        while Instant::now() < until && !buf.ends_with(b"TUNNEL") {
            match stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        log.lock().unwrap().push((head, buf));
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let body = generated_bytes(4096, 11);
    let mut faults = Vec::new();
    for round in 0..3 {
        for framing in ["chunked", "length"] {
            let path = format!("/ws/{framing}/{round}");
            let (fields, first, rest): (String, Vec<u8>, Vec<u8>) = if framing == "chunked" {
                (
                    format!("{WS}Transfer-Encoding: chunked\r\n"),
                    [&b"1000\r\n"[..], &body[..2048]].concat(),
                    [&body[2048..], &b"\r\n0\r\n\r\n"[..]].concat(),
                )
            } else {
                (
                    format!("{WS}Content-Length: 4096\r\n"),
                    body[..2048].to_vec(),
                    body[2048..].to_vec(),
                )
            };
            let mut stream = TcpStream::connect(lacquer.addr()).unwrap();
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let mut bytes = head(&format!("POST {path} HTTP/1.1"), &fields).into_bytes();
            bytes.extend_from_slice(&first);
            stream.write_all(&bytes).unwrap();
            let mut have = Vec::new();
            let answer = read_head(&mut stream, &mut have);
            let switched = answer.as_deref().unwrap_or("").starts_with("HTTP/1.1 101");
            if framing == "chunked" {
                // not forwarded as an upgrade, so the origin's 101 is refused (a 502)
                let seen = poll_until(Duration::from_secs(6), || {
                    received
                        .lock()
                        .unwrap()
                        .iter()
                        .any(|(h, _)| h.contains(&format!("{path} ")))
                });
                let forwarded_upgrade = received.lock().unwrap().iter().any(|(h, _)| {
                    h.contains(&format!("{path} ")) && h.to_ascii_lowercase().contains("upgrade:")
                });
                if switched || !seen || forwarded_upgrade {
                    faults.push(format!(
                        "{path}: answer {answer:?}, origin saw it: {seen}, as an upgrade: \
                         {forwarded_upgrade}"
                    ));
                }
                continue;
            }
            if !switched {
                faults.push(format!("{path}: {answer:?}"));
                continue;
            }
            let _ = stream.write_all(&rest);
            std::thread::sleep(Duration::from_millis(50));
            let _ = stream.write_all(b"TUNNEL");
            let seen = poll_until(Duration::from_secs(6), || {
                received
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|(h, _)| h.contains(&format!("{path} ")))
            });
            drop(stream);
            if !seen {
                faults.push(format!("{path}: the origin never finished"));
                continue;
            }
            let (fwd_head, got) = received
                .lock()
                .unwrap()
                .iter()
                .find(|(h, _)| h.contains(&format!("{path} ")))
                .cloned()
                .unwrap();
            let decoded = if fwd_head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked")
            {
                dechunk(&got)
            } else if got.len() >= 4096 {
                Ok((got[..4096].to_vec(), got[4096..].to_vec()))
            } else {
                Err(format!("{} bytes", got.len()))
            };
            match decoded {
                Ok((b, after)) if b == body && after == b"TUNNEL" => {}
                Ok((b, after)) => faults.push(format!(
                    "{path}: body {} bytes (whole: {}), then {:?}",
                    b.len(),
                    b == body,
                    String::from_utf8_lossy(&after[..after.len().min(80)])
                )),
                Err(e) => faults.push(format!(
                    "{path}: {e}; the origin got {} bytes, starting {:?}, ending {:?}",
                    got.len(),
                    String::from_utf8_lossy(&got[..got.len().min(6)]),
                    String::from_utf8_lossy(&got[got.len().saturating_sub(13)..])
                )),
            }
        }
    }
    assert!(faults.is_empty(), "{faults:#?}");
    lacquer.assert_no_panic();
}

/// 320 tunnels from 16 clients, each ended as badly as can be at once: the client pipelines
/// bytes (and, one in two, a short `Content-Length` body) behind its head and keeps writing;
/// the origin writes its 101 and a byte and closes (one in two with a reset) without reading.
/// Whatever each tunnel's fate, the proxy never panics and then answers plain requests.
#[test]
fn tunnels_torn_down_from_both_ends_at_once_leave_the_proxy_sound() {
    let origin = spawn_origin(|conn, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        if !head.to_ascii_lowercase().contains("upgrade: websocket") {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nplain",
            );
            return;
        }
        let _ = stream.write_all(&[SWITCH, b"x"].concat());
        if conn % 2 == 0 {
            reset_on_close(&stream);
        }
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let _ = from_threads(16, 20, move |n| {
        let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let fields = if n % 2 == 0 {
            format!("{WS}Content-Length: 10\r\n")
        } else {
            WS.to_string()
        };
        let method = if n % 2 == 0 { "POST" } else { "GET" };
        let mut bytes = head(&format!("{method} /ws/{n} HTTP/1.1"), &fields).into_bytes();
        bytes.extend_from_slice(b"0123456789tunnel bytes");
        let _ = stream.write_all(&bytes);
        for _ in 0..20 {
            if stream.write_all(&[b'z'; 1024]).is_err() {
                break;
            }
        }
        let _ = read_to_end_within(&mut stream, Duration::from_secs(5));
        Ok(())
    });
    for i in 0..5 {
        assert_eq!(
            plain_get(addr, &format!("/plain/{i}")),
            Ok((200, "plain".to_string()))
        );
    }
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// half-closes

/// KNOWN: a client that half-closes (sends its question, then `shutdown(Write)`, as `nc -N`
/// does, or any protocol whose request ends at EOF) never gets the origin's answer: the proxy
/// takes the client's FIN for the end of the whole tunnel and closes both connections, so the
/// origin, which answers once it has read the question to its end, writes into a closed socket
/// and the client reads EOF with nothing. Every run, every tunnel (10 of 10). RFC 9110 §7.8
/// lets a tunnel end "when both sides close"; the README / `docs/architecture.md` say "until a
/// side closes", which is this behaviour, so it is a documented limit, kept here as the fault it
/// is for half-closing protocols. Cause: `proxy_handle_downstream` (`proxy_h1.rs`, "If the
/// request is websocket, `None` body means the request is closed. Set the response to be done")
/// and `proxy_handle_upstream` ("An upgraded request is terminated when either side is done").
#[test]
#[ignore = "KNOWN: a client's half-close ends the tunnel; the origin's answer after it is lost"]
fn a_client_half_close_still_gets_the_origins_answer() {
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).is_none() {
            return;
        }
        let _ = stream.write_all(SWITCH);
        let (rest, ended) = read_to_end_within(&mut stream, Duration::from_secs(10));
        if !ended {
            return;
        }
        let question = [buf, rest].concat();
        let _ = stream.write_all(format!("answer to {} bytes: ", question.len()).as_bytes());
        let _ = stream.write_all(&question);
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let mut lost = Vec::new();
    for n in 0..10 {
        let (mut stream, have) = tunnel(lacquer.addr(), &format!("/ws/{n}"), b"");
        let question = format!("question {n}");
        stream.write_all(question.as_bytes()).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let (rest, _) = read_to_end_within(&mut stream, Duration::from_secs(10));
        let got = String::from_utf8_lossy(&[have, rest].concat()).into_owned();
        let want = format!("answer to {} bytes: {question}", question.len());
        if got != want {
            lost.push(format!("tunnel {n}: got {got:?}"));
        }
    }
    assert!(lost.is_empty(), "{} of 10: {lost:#?}", lost.len());
    lacquer.assert_no_panic();
}

/// KNOWN: an origin that half-closes (sends its last bytes, then `shutdown(Write)`, and keeps
/// reading) no longer gets what the client sends afterwards: the proxy ends the tunnel at the
/// origin's FIN. Every run. Same cause as [`a_client_half_close_still_gets_the_origins_answer`],
/// the other way round (the upstream's end of the upgraded body finishes the downstream body
/// reader, `HttpSession::finish_body` in `pingora-core/.../v1/server.rs`: "For upgraded sessions,
/// this call will also close the reading of the client body").
#[test]
#[ignore = "KNOWN: an origin's half-close ends the tunnel; the client's bytes after it are lost"]
fn an_origin_half_close_still_gets_the_clients_bytes() {
    let received: Arc<Mutex<Vec<u8>>> = Arc::default();
    let log = received.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        if read_head(&mut stream, &mut buf).is_none() {
            return;
        }
        let _ = stream.write_all(&[SWITCH, b"bye"].concat());
        let _ = stream.shutdown(Shutdown::Write);
        let (rest, _) = read_to_end_within(&mut stream, Duration::from_secs(10));
        log.lock().unwrap().extend_from_slice(&[buf, rest].concat());
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let (mut stream, have) = tunnel(lacquer.addr(), "/ws/half", b"");
    // the origin's bytes and its end come first
    let (rest, ended) = read_to_end_within(&mut stream, Duration::from_secs(5));
    assert_eq!([have, rest].concat(), b"bye");
    assert!(ended, "the origin's half-close never reached the client");
    // the client's side is still open: what it writes now must reach the origin
    let sent = stream.write_all(b"last words").is_ok();
    drop(stream);
    poll_until(Duration::from_secs(5), || {
        received.lock().unwrap().ends_with(b"last words")
    });
    assert!(
        received.lock().unwrap().ends_with(b"last words"),
        "written: {sent}, the origin got {:?}",
        String::from_utf8_lossy(&received.lock().unwrap())
    );
}

// ---------------------------------------------------------------------------------------------
// volume and concurrency

/// Four tunnels at once, each carrying 4 MiB each way at the same time, both readers slow
/// (a pause every 64 KiB): no deadlock, and every byte arrives exactly, in order.
#[test]
fn megabytes_both_ways_at_once_with_slow_readers_arrive_exactly() {
    const LEN: usize = 4 * 1024 * 1024;
    let at_origin: Received = Arc::default();
    let log = at_origin.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let _ = stream.write_all(SWITCH);
        let mut writer = stream.try_clone().unwrap();
        let pusher = std::thread::spawn(move || {
            for piece in generated_chunks(LEN, 16 * 1024, 7) {
                if writer.write_all(&piece).is_err() {
                    return;
                }
            }
        });
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        let mut chunk = [0u8; 16 * 1024];
        let mut since_pause = 0;
        while buf.len() < LEN {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    since_pause += n;
                    if since_pause >= 64 * 1024 {
                        since_pause = 0;
                        std::thread::sleep(Duration::from_millis(3));
                    }
                }
            }
        }
        let _ = pusher.join();
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        log.lock().unwrap().push((path, buf));
        // stays open until the client closes
        let _ = read_to_end_within(&mut stream, Duration::from_secs(30));
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let seen = at_origin.clone();
    let failures = from_threads(4, 1, move |n| {
        let path = format!("/ws/bulk-{n}");
        let (mut stream, mut have) = try_tunnel(addr, &path, b"")?;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        let mut writer = stream.try_clone().unwrap();
        let pusher = std::thread::spawn(move || {
            for piece in generated_chunks(LEN, 16 * 1024, 9) {
                writer.write_all(&piece).map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        });
        let mut chunk = [0u8; 16 * 1024];
        let mut since_pause = 0;
        while have.len() < LEN {
            match stream.read(&mut chunk) {
                Ok(0) => break,
                Err(e) => return Err(format!("{e} after {} bytes", have.len())),
                Ok(k) => {
                    have.extend_from_slice(&chunk[..k]);
                    since_pause += k;
                    if since_pause >= 64 * 1024 {
                        since_pause = 0;
                        std::thread::sleep(Duration::from_millis(3));
                    }
                }
            }
        }
        pusher.join().unwrap()?;
        if have.len() != LEN || !verify_generated(&have, 7, 0) {
            return Err(format!(
                "client got {} bytes, first wrong at {:?}",
                have.len(),
                generated_mismatch(&have, 7, 0)
            ));
        }
        // the tunnel stays open until the origin has read everything
        let done = poll_until(Duration::from_secs(60), || {
            seen.lock().unwrap().iter().any(|(p, _)| *p == path)
        });
        if !done {
            return Err("the origin never finished reading".into());
        }
        Ok(())
    });
    assert!(failures.is_empty(), "{failures:#?}");
    let at_origin = at_origin.lock().unwrap();
    assert_eq!(at_origin.len(), 4);
    for (path, got) in at_origin.iter() {
        assert!(
            got.len() == LEN && verify_generated(got, 9, 0),
            "{path}: the origin got {} bytes, first wrong at {:?}",
            got.len(),
            generated_mismatch(got, 9, 0)
        );
    }
    lacquer.assert_no_panic();
}

/// 240 tunnels open at once, all started together, each sending 12 messages of its own bytes
/// and sizes (1 B to 40 KiB) and reading each echo back before the next: every echo is exactly
/// its message (no byte of one tunnel in another's).
#[test]
fn hundreds_of_tunnels_at_once_never_mix_their_bytes() {
    const TUNNELS: usize = 240;
    let origin = echo_origin(b"");
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let gate = Arc::new(Barrier::new(TUNNELS));
    let threads: Vec<_> = (0..TUNNELS)
        .map(|n| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let opened = try_tunnel(addr, &format!("/ws/many-{n}"), b"");
                gate.wait();
                let (mut stream, mut have) = opened?;
                let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                for m in 0..12usize {
                    let len = 1 + (n * 7919 + m * 104_729) % (40 * 1024);
                    let message = generated_bytes(len, (n % 250) as u8);
                    stream.write_all(&message).map_err(|e| e.to_string())?;
                    let got = read_n(&mut stream, &mut have, len)?;
                    if got != message {
                        return Err(format!(
                            "message {m} ({len} B): first wrong at {:?}",
                            got.iter().zip(&message).position(|(a, b)| a != b)
                        ));
                    }
                }
                if !have.is_empty() {
                    return Err(format!("{} bytes more than sent", have.len()));
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    let failures: Vec<String> = threads
        .into_iter()
        .enumerate()
        .filter_map(|(n, t)| t.join().unwrap().err().map(|e| format!("tunnel {n}: {e}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {TUNNELS}: {failures:#?}",
        failures.len()
    );
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// failures mid-tunnel

/// An origin that resets its connection (RST, `SO_LINGER` 0) mid-tunnel: that tunnel's client
/// sees its connection end (within 5 s), while a second tunnel and plain requests through the
/// same proxy go on untouched; no panic.
#[test]
fn an_origin_reset_mid_tunnel_ends_only_that_tunnel() {
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        if !head.to_ascii_lowercase().contains("upgrade: websocket") {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\
                  Connection: close\r\n\r\nplain",
            );
            return;
        }
        let _ = stream.write_all(SWITCH);
        if head.contains("/ws/reset") {
            let mut chunk = [0u8; 64];
            let _ = stream.read(&mut chunk);
            let _ = stream.write_all(b"half a mess");
            reset_on_close(&stream);
            drop(stream);
            return;
        }
        echo(&mut stream, &buf);
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let (mut other, mut other_have) = tunnel(lacquer.addr(), "/ws/other", b"");
    for round in 0..5 {
        let (mut doomed, _) = tunnel(lacquer.addr(), &format!("/ws/reset/{round}"), b"");
        doomed.write_all(b"trigger").unwrap();
        let (_, ended) = read_to_end_within(&mut doomed, Duration::from_secs(5));
        assert!(
            ended,
            "round {round}: the reset tunnel's client is still open"
        );
        let message = format!("still here {round}").into_bytes();
        other.write_all(&message).unwrap();
        assert_eq!(
            read_n(&mut other, &mut other_have, message.len()).unwrap(),
            message
        );
        assert_eq!(
            plain_get(lacquer.addr(), &format!("/plain/{round}")),
            Ok((200, "plain".to_string()))
        );
    }
    lacquer.assert_no_panic();
}

/// A client that vanishes mid-tunnel (RST): the proxy closes the tunnel's upstream connection
/// (the origin sees its end within 5 s) and never writes anything more into it: a plain request
/// after it never lands on the tunnel's connection.
#[test]
fn a_vanished_client_closes_its_upstream_and_it_is_never_reused() {
    let after_end: Arc<Mutex<Vec<String>>> = Arc::default();
    let ended: Arc<AtomicUsize> = Arc::default();
    let (log, count) = (after_end.clone(), ended.clone());
    let origin = spawn_origin(move |conn, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        if !head.to_ascii_lowercase().contains("upgrade: websocket") {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\r\nplain",
            );
            // a kept-alive connection: a second request on it is noted
            if read_head(&mut stream, &mut buf).is_some() {
                log.lock()
                    .unwrap()
                    .push(format!("plain connection {conn} reused"));
            }
            return;
        }
        let _ = stream.write_all(SWITCH);
        let (got, end) = read_to_end_within(&mut stream, Duration::from_secs(20));
        if end {
            count.fetch_add(1, Ordering::SeqCst);
        }
        let text = String::from_utf8_lossy(&got);
        if text.contains("GET /plain") {
            log.lock()
                .unwrap()
                .push(format!("a request inside tunnel {conn}: {text:?}"));
        }
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    for round in 0..10 {
        let (mut stream, _) = tunnel(lacquer.addr(), &format!("/ws/vanish/{round}"), b"");
        stream.write_all(b"some tunnel bytes").unwrap();
        reset_on_close(&stream);
        drop(stream);
        assert!(
            poll_until(Duration::from_secs(5), || ended.load(Ordering::SeqCst)
                > round),
            "round {round}: the origin's side of a vanished client's tunnel is still open"
        );
        for i in 0..2 {
            assert_eq!(
                plain_get(lacquer.addr(), &format!("/plain/{round}/{i}")),
                Ok((200, "plain".to_string()))
            );
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let log = after_end.lock().unwrap().clone();
    assert!(
        log.iter().all(|l| !l.starts_with("a request inside")),
        "{log:#?}"
    );
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// hostile 101s and refusals

/// A 101 carrying body framing (`Content-Length: 5`, `Transfer-Encoding: chunked`, both), which
/// a 1xx may not have (RFC 9110 §8.6, RFC 9112 §6.1): either the client is not switched (an
/// error status, or the connection closed) or the tunnel carries the origin's raw bytes exactly,
/// both ways: never cut at the announced length, never de-chunked, never a hang.
#[test]
fn a_101_with_body_framing_carries_raw_bytes_or_is_refused() {
    const RAW: &[u8] = b"0123456789-raw-tunnel-bytes-not-chunks\r\n";
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let framing = if head.contains("/ws/length") {
            "Content-Length: 5\r\n"
        } else if head.contains("/ws/chunked") {
            "Transfer-Encoding: chunked\r\n"
        } else {
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"
        };
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             {framing}\r\n"
        );
        if stream
            .write_all(&[answer.as_bytes(), RAW].concat())
            .is_err()
        {
            return;
        }
        echo(&mut stream, &buf);
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let mut faults = Vec::new();
    for case in ["length", "chunked", "both"] {
        let mut stream = TcpStream::connect(lacquer.addr()).unwrap();
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        stream
            .write_all(head(&format!("GET /ws/{case} HTTP/1.1"), WS).as_bytes())
            .unwrap();
        let mut have = Vec::new();
        let Some(answer) = read_head(&mut stream, &mut have) else {
            continue; // closed: refused
        };
        if !answer.starts_with("HTTP/1.1 101") {
            let (rest, _) = read_to_end_within(&mut stream, Duration::from_secs(3));
            let rest = [have, rest].concat();
            if find(&rest, b"raw-tunnel").is_some() {
                faults.push(format!("{case}: refused, but the origin's bytes followed"));
            }
            continue;
        }
        match read_n(&mut stream, &mut have, RAW.len()) {
            Ok(got) if got == RAW => {}
            Ok(got) => faults.push(format!("{case}: got {:?}", String::from_utf8_lossy(&got))),
            Err(e) => faults.push(format!(
                "{case}: {e}, had {:?}",
                String::from_utf8_lossy(&have)
            )),
        }
        let ping = b"client bytes after a framed 101";
        if stream.write_all(ping).is_ok() {
            match read_n(&mut stream, &mut have, ping.len()) {
                Ok(got) if got == ping => {}
                other => faults.push(format!("{case}: echo {other:?}")),
            }
        }
    }
    assert!(faults.is_empty(), "{faults:#?}");
    lacquer.assert_no_panic();
}

/// A 101 that switches to a protocol the forwarded request never offered is refused (a 502,
/// as an unasked 101 is): `Upgrade: h2c` (which Lacquer strips from every request, `h2c` being
/// "HTTP/2 itself, not a protocol to tunnel", `src/proxy/upgrade.rs`), whether or not the
/// client had offered it beside `websocket`; an unoffered `foo`; and a 101 with no `Upgrade`
/// field at all (RFC 9110 §15.2.2: a 101 MUST carry one). RFC 9110 §7.8: "A server MUST NOT
/// switch to a protocol that was not indicated by the client in the corresponding request's
/// Upgrade header field". Found 2026-12-08: every case was passed to the client and tunnelled
/// (`upstream_response_filter` checked only that an upgrade was requested; Pingora's
/// `is_upgrade_resp` takes any HTTP/1.1 101 as a switch); now `upgrade::switch_was_offered`.
#[test]
fn a_101_to_a_protocol_never_offered_never_switches_the_client() {
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let upgrade = if head.contains("/ws/h2c") {
            "Upgrade: h2c\r\n"
        } else if head.contains("/ws/foo") {
            "Upgrade: foo\r\n"
        } else {
            ""
        };
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\n{upgrade}Connection: Upgrade\r\n\r\n\
             origin-speaks-another-protocol"
        );
        let _ = stream.write_all(answer.as_bytes());
        echo(&mut stream, &buf);
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let cases = [
        ("/ws/h2c/a", "Connection: Upgrade\r\nUpgrade: websocket\r\n"),
        (
            "/ws/h2c/b",
            "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: websocket, h2c\r\n\
             HTTP2-Settings: AAMAAABkAAQAAP__\r\n",
        ),
        ("/ws/foo", "Connection: Upgrade\r\nUpgrade: websocket\r\n"),
        ("/ws/none", "Connection: Upgrade\r\nUpgrade: websocket\r\n"),
    ];
    let mut switched = Vec::new();
    for (path, fields) in cases {
        let mut stream = TcpStream::connect(lacquer.addr()).unwrap();
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        stream
            .write_all(head(&format!("GET {path} HTTP/1.1"), fields).as_bytes())
            .unwrap();
        let mut have = Vec::new();
        let answer = read_head(&mut stream, &mut have).unwrap_or_default();
        if answer.starts_with("HTTP/1.1 101") {
            let upgrade = answer
                .lines()
                .find(|l| l.to_ascii_lowercase().starts_with("upgrade:"))
                .unwrap_or("(no Upgrade field)")
                .to_string();
            let (rest, _) = read_to_end_within(&mut stream, Duration::from_millis(500));
            switched.push(format!(
                "{path}: switched, {upgrade}, then {:?}",
                String::from_utf8_lossy(&[have, rest].concat())
            ));
        }
    }
    assert!(switched.is_empty(), "{switched:#?}");
    lacquer.assert_no_panic();
}

/// An origin refuses an upgrade (426, or 200) with a framed answer and writes more bytes
/// behind it on the same connection, in the same write: the client gets the refusal, never the
/// extra bytes (as an answer or as tunnel bytes), and its next request on the same connection is
/// answered by the origin (on another connection than the refusal's, whose leftover bytes make
/// it unusable).
#[test]
fn bytes_behind_a_refusal_never_reach_the_client() {
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        if let Some(status) = path.strip_prefix("/ws/") {
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 {status} Nope\r\nContent-Length: 7\r\nCache-Control: no-store\r\n\
                     \r\nrefusedHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"
                )
                .as_bytes(),
            );
            let _ = read_to_end_within(&mut stream, Duration::from_secs(10));
            return;
        }
        let body = format!("answer to {path}");
        let _ = stream.write_all(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    for status in [426, 200, 426, 200] {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(head(&format!("GET /ws/{status} HTTP/1.1"), WS).as_bytes());
        let first = conn.read_response(false);
        assert_eq!(first.status, status, "{first:?}");
        assert_eq!(first.text(), "refused");
        let next = format!("/next/{status}");
        if conn
            .try_send(head(&format!("GET {next} HTTP/1.1"), "").as_bytes())
            .is_err()
        {
            continue;
        }
        match conn.try_read_response(false) {
            Ok(second) => assert_eq!(second.text(), format!("answer to {next}"), "{second:?}"),
            Err(why) => assert!(conn.is_closed(Duration::from_secs(2)), "{why}"),
        }
        let rest = String::from_utf8_lossy(&conn.read_rest()).into_owned();
        assert!(!rest.contains("smuggled"), "{rest:?}");
    }
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// keep-alive then upgrade

/// One client connection carries two plain requests, then an upgrade (on an upstream connection
/// the pool may hand back), then tunnel bytes; 96 such connections from 8 clients. Every plain
/// answer is its own, every tunnel echoes exactly, and no plain request ever lands inside a
/// tunnel's upstream connection (the origin answers a request read after its 101 with `LEAK`).
#[test]
fn keep_alive_then_upgrade_switches_cleanly_and_is_never_pooled() {
    let origin = spawn_origin(|_, mut stream| {
        let mut buf = Vec::new();
        loop {
            let Some(head) = read_head(&mut stream, &mut buf) else {
                return;
            };
            let path = head.split(' ').nth(1).unwrap_or("").to_string();
            if head.to_ascii_lowercase().contains("upgrade: websocket") {
                let _ = stream.write_all(SWITCH);
                // the tunnel: echo, but a request head inside it is a leak
                let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                let mut chunk = [0u8; 16 * 1024];
                let mut pending = std::mem::take(&mut buf);
                loop {
                    if !pending.is_empty() {
                        let out = if find(&pending, b"GET /plain").is_some() {
                            b"LEAK".to_vec()
                        } else {
                            pending.clone()
                        };
                        if stream.write_all(&out).is_err() {
                            return;
                        }
                        pending.clear();
                    }
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&chunk[..n]),
                    }
                }
            }
            let body = format!("answer to {path}");
            if stream
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
                         \r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .is_err()
            {
                return;
            }
        }
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let addr = lacquer.addr();
    let failures = from_threads(8, 12, move |n| {
        let mut conn = RawConn::connect(addr);
        for i in 0..2 {
            let path = format!("/plain/{n}/{i}");
            conn.send(head(&format!("GET {path} HTTP/1.1"), "").as_bytes());
            let answer = conn.try_read_response(false)?;
            if answer.text() != format!("answer to {path}") {
                return Err(format!("{path}: {answer:?}"));
            }
        }
        conn.send(head(&format!("GET /ws/{n} HTTP/1.1"), WS).as_bytes());
        let switched = conn.try_read_response(false)?;
        if switched.status != 101 {
            return Err(format!("not switched: {switched:?}"));
        }
        let mut stream = conn.stream().try_clone().unwrap();
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let message = format!("tunnel bytes {n}").into_bytes();
        stream.write_all(&message).map_err(|e| e.to_string())?;
        let mut have = Vec::new();
        let got = read_n(&mut stream, &mut have, message.len())?;
        if got != message {
            return Err(format!("echo {:?}", String::from_utf8_lossy(&got)));
        }
        drop(stream);
        drop(conn);
        // plain requests right after, on fresh connections
        for i in 2..4 {
            let path = format!("/plain/{n}/{i}");
            match plain_get(addr, &path) {
                Ok((200, text)) if text == format!("answer to {path}") => {}
                other => return Err(format!("{path} after the tunnel: {other:?}")),
            }
        }
        Ok(())
    });
    assert!(
        failures.is_empty(),
        "{} of 96: {failures:#?}",
        failures.len()
    );
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// reload and drain

/// SIGHUP while tunnels are open (`docs/lifecycle.md`: "connections stay open"): an open tunnel
/// keeps echoing after the reload, and new tunnels open and echo.
#[test]
fn a_reload_keeps_open_tunnels_working() {
    let origin = echo_origin(b"");
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let mut open: Vec<_> = (0..4)
        .map(|n| tunnel(lacquer.addr(), &format!("/ws/before-{n}"), b""))
        .collect();
    for round in 0..3 {
        assert!(lacquer.signal("HUP"));
        std::thread::sleep(Duration::from_millis(700));
        for (n, (stream, have)) in open.iter_mut().enumerate() {
            let message = format!("after reload {round} on {n}").into_bytes();
            stream.write_all(&message).unwrap();
            assert_eq!(
                read_n(stream, have, message.len()).unwrap(),
                message,
                "tunnel {n}, reload {round}"
            );
        }
        let (mut fresh, mut have) = tunnel(lacquer.addr(), &format!("/ws/after-{round}"), b"");
        fresh.write_all(b"fresh").unwrap();
        assert_eq!(read_n(&mut fresh, &mut have, 5).unwrap(), b"fresh");
    }
    lacquer.assert_no_panic();
}

/// SIGTERM with an echoing tunnel open (`docs/lifecycle.md`: "requests in flight continue ...
/// until `shutdown_timeout`"): right after the signal the tunnel still carries bytes both ways,
/// and the process exits within a generous bound of its 3 s `shutdown_timeout`.
#[test]
fn a_drain_lets_an_open_tunnel_carry_on_until_the_shutdown_timeout() {
    let origin = echo_origin(b"");
    let mut lacquer =
        LacquerProcess::start_simple(origin, "shutdown_timeout = \"3s\"\n[log]\naccess = \"off\"");
    let (mut stream, mut have) = tunnel(lacquer.addr(), "/ws/draining", b"");
    stream.write_all(b"before").unwrap();
    assert_eq!(read_n(&mut stream, &mut have, 6).unwrap(), b"before");
    let signalled = Instant::now();
    assert!(lacquer.signal("TERM"));
    std::thread::sleep(Duration::from_millis(300));
    let during = stream
        .write_all(b"during the drain")
        .map_err(|e| e.to_string())
        .and_then(|_| read_n(&mut stream, &mut have, 16));
    let exited = lacquer.wait_exit(Duration::from_secs(20));
    assert!(exited.is_some(), "still running 20 s after SIGTERM");
    assert_eq!(
        during,
        Ok(b"during the drain".to_vec()),
        "a tunnel cut at SIGTERM, {:?} before the exit",
        signalled.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// HTTP/2

/// An h2c client sends `CONNECT` (to the origin's own authority, and elsewhere): never a
/// tunnel (a 4xx/5xx or a refused stream), the origin never sees a `CONNECT`, and the h2
/// connection still answers a GET after it; no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_connect_is_refused_cleanly() {
    let connects: Arc<AtomicUsize> = Arc::default();
    let count = connects.clone();
    let origin = spawn_origin(move |_, mut stream| {
        let mut buf = Vec::new();
        let Some(head) = read_head(&mut stream, &mut buf) else {
            return;
        };
        if head.starts_with("CONNECT") {
            count.fetch_add(1, Ordering::SeqCst);
        }
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nCache-Control: no-store\r\n\
              Connection: close\r\n\r\nplain",
        );
    })
    .0;
    let lacquer = LacquerProcess::start_simple(origin, ACCESS_OFF);
    let (sender, _driver) = h2_connect_default(lacquer.addr()).await;
    for authority in [origin.to_string(), "evil.example:443".to_string()] {
        let request = http::Request::builder()
            .method("CONNECT")
            .uri(authority.as_str())
            .body(())
            .unwrap();
        let sent = sender
            .clone()
            .ready()
            .await
            .and_then(|mut s| s.send_request(request, false));
        if let Ok((answer, _stream)) = sent {
            if let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(10), answer).await {
                assert!(
                    !answer.status().is_success(),
                    "CONNECT {authority} answered {}",
                    answer.status()
                );
            }
        }
    }
    let answer = h2_get(&sender, "http://test/plain", Duration::from_secs(10)).await;
    assert_eq!(answer.text(), "plain");
    assert_eq!(
        connects.load(Ordering::SeqCst),
        0,
        "a CONNECT reached the origin"
    );
    lacquer.assert_no_panic();
}
