//! Attacks on the PROXY protocol listener, active and passive health checking and client
//! identification, as a hostile peer, a hostile or flapping app replica and a flaky network
//! would make them: headers dribbled, split, oversized, malformed, doubled or sent where none is
//! expected; health endpoints that hang, crawl, lie, flood or flap; replicas that pass their
//! checks and fail real requests; every replica down; and forwarding fields spoofed to steer the
//! per-client fairness key.
//!
//! Every test runs the real binary on real sockets, against origins in this process.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;

const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// PROXY protocol helpers
// ---------------------------------------------------------------------------------------------

/// An origin that answers every request with the `X-Forwarded-For` it was sent, uncacheable.
fn xff_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        OriginResponse::ok(format!(
            "xff={}",
            req.header("x-forwarded-for").unwrap_or("-")
        ))
        .header("cache-control", "no-store")
    })
}

/// Lacquer whose only listener expects a PROXY header, in front of `origin`, with `extra` TOML.
fn pp_lacquer(origin: SocketAddr, extra: &str) -> LacquerProcess {
    LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port} proxy_protocol\"]\nupstream = \"{origin}\"\nthreads = 2\n{extra}\n"
        )
    })
}

/// A v1 TCP4 header naming `client:40000` as the source.
fn v1(client: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {client} 127.0.0.1 40000 {port}\r\n").into_bytes()
}

const V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// A v2 header: `ver_cmd` (0x20 LOCAL, 0x21 PROXY), `fam` (0x11 TCP4, 0x21 TCP6, 0x31 UNIX,
/// 0x00 UNSPEC) and the bytes after the 16-byte fixed part, whose length is declared as `len`.
fn v2_raw(ver_cmd: u8, fam: u8, len: u16, rest: &[u8]) -> Vec<u8> {
    let mut h = V2_SIG.to_vec();
    h.extend_from_slice(&[ver_cmd, fam]);
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(rest);
    h
}

/// A v2 PROXY TCP4 header from `client:4711` to 127.0.0.1:`port`, with `tlvs` after the
/// addresses.
fn v2_tcp4(client: [u8; 4], port: u16, tlvs: &[u8]) -> Vec<u8> {
    let mut rest = client.to_vec();
    rest.extend_from_slice(&[127, 0, 0, 1]);
    rest.extend_from_slice(&4711u16.to_be_bytes());
    rest.extend_from_slice(&port.to_be_bytes());
    rest.extend_from_slice(tlvs);
    v2_raw(0x21, 0x11, rest.len() as u16, &rest)
}

fn get_req(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").into_bytes()
}

/// Sends `bytes` on a new connection and reads one answer (`None`: closed without one).
fn answer_to(addr: SocketAddr, bytes: &[u8]) -> Option<RawResponse> {
    let mut conn = RawConn::connect(addr);
    conn.read_timeout = Duration::from_secs(12);
    let _ = conn.try_send(bytes);
    conn.try_read_response(false).ok()
}

/// Whether any access log line starts with `client` (the log's first field is the client).
fn logged_as(lacquer: &LacquerProcess, client: &str) -> bool {
    let prefix = format!("{client} ");
    lacquer.stdout_log().lines().any(|l| l.starts_with(&prefix))
}

// ---------------------------------------------------------------------------------------------
// PROXY protocol attacks
// ---------------------------------------------------------------------------------------------

/// Attack: a v1 header dribbled one byte per write, and a v2 header cut into three writes across
/// its fixed part and its addresses, each followed by a request. Promise: the header is read
/// across reads, the client it names is the one `X-Forwarded-For` and the log carry, and the
/// request after it is served (not eaten or misparsed).
#[test]
fn headers_split_across_reads_still_name_the_client() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let port = lacquer.port();

    let mut conn = RawConn::connect(lacquer.addr());
    for b in v1("198.51.100.21", port) {
        conn.send(&[b]);
        std::thread::sleep(Duration::from_millis(15));
    }
    conn.send(&get_req("/dribbled-v1"));
    let resp = conn.read_response(false);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "xff=198.51.100.21");

    let header = v2_tcp4([198, 51, 100, 22], port, &[]);
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(&header[..7]);
    std::thread::sleep(Duration::from_millis(100));
    conn.send(&header[7..19]);
    std::thread::sleep(Duration::from_millis(100));
    let mut tail = header[19..].to_vec();
    tail.extend_from_slice(b"GET /split-v2 HT");
    conn.send(&tail);
    std::thread::sleep(Duration::from_millis(100));
    conn.send(b"TP/1.1\r\nHost: test\r\n\r\n");
    let resp = conn.read_response(false);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "xff=198.51.100.22");
    // and the same connection goes on serving, still as that client
    let resp = conn.get("/split-v2-again", &[]);
    assert_eq!(resp.text(), "xff=198.51.100.22");

    assert!(
        poll_until(WAIT, || logged_as(&lacquer, "198.51.100.21")
            && logged_as(&lacquer, "198.51.100.22")),
        "{}",
        lacquer.stdout_log()
    );
    lacquer.assert_no_panic();
}

/// Attack: slowloris on the preface: connections that send nothing, that send `PROXY ` and then
/// a byte every 300 ms, or a v2 fixed part declaring 500 bytes and then dribble them. Promise:
/// the wait for the header is bounded (10 s, plus a margin), each is closed unanswered, nothing
/// reaches the origin, and a well-behaved connection is still served meanwhile.
#[test]
fn a_dribbled_or_absent_preface_is_cut_off_in_bounded_time() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let addr = lacquer.addr();
    let port = lacquer.port();
    let started = Instant::now();
    let dribble = |prefix: Vec<u8>, filler: u8| {
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.set_nodelay(true);
            let _ = s.write_all(&prefix);
            let t0 = Instant::now();
            let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
            let mut buf = [0u8; 1024];
            let mut got = Vec::new();
            while t0.elapsed() < Duration::from_secs(18) {
                match s.read(&mut buf) {
                    Ok(0) => return (Some(t0.elapsed()), got),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut =>
                    {
                        if filler != 0 && s.write_all(&[filler]).is_err() {
                            return (Some(t0.elapsed()), got);
                        }
                    }
                    Err(_) => return (Some(t0.elapsed()), got),
                }
            }
            (None, got)
        })
    };
    let silent = dribble(Vec::new(), 0);
    let v1_drip = dribble(b"PROXY ".to_vec(), b'1');
    let v2_drip = dribble(v2_raw(0x21, 0x11, 500, &[]), 0xAB);

    // meanwhile an honest connection is served at once
    std::thread::sleep(Duration::from_millis(500));
    let mut honest = v1("198.51.100.30", port);
    honest.extend_from_slice(&get_req("/honest"));
    let resp = answer_to(addr, &honest).expect("an honest connection is served");
    assert_eq!(resp.text(), "xff=198.51.100.30");

    for (name, handle) in [("silent", silent), ("v1", v1_drip), ("v2", v2_drip)] {
        let (closed_after, got) = handle.join().unwrap();
        let closed_after =
            closed_after.unwrap_or_else(|| panic!("{name}: preface wait never ended (18 s)"));
        assert!(
            closed_after <= Duration::from_secs(13),
            "{name}: closed only after {closed_after:?}"
        );
        assert!(
            got.is_empty(),
            "{name}: answered {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    assert!(started.elapsed() < Duration::from_secs(19));
    assert_eq!(
        origin.hits(),
        1,
        "only the honest request reaches the origin"
    );
    lacquer.assert_no_panic();
}

/// Attack: oversized and malformed headers that each name an address: a v1 line past 107 bytes,
/// one with no CRLF, a bare LF, lower case, a port out of range, an IPv6 address in a TCP4 line,
/// a v2 of version 1, of command 0xF, of an unknown family, with an address block shorter than
/// its family needs, and a v2 header that declares more bytes than it sends before closing its
/// side. Promise: a connection without a valid header is closed, never served, and never logged
/// or forwarded under the address it names.
#[test]
fn an_invalid_header_never_lets_the_client_choose_its_address() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let port = lacquer.port();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "v1 over 107 bytes",
            format!(
                "PROXY TCP4 198.51.100.40 127.0.0.1 40000 {port} {}\r\n",
                "x".repeat(120)
            )
            .into_bytes(),
        ),
        (
            "v1 without CRLF",
            format!(
                "PROXY TCP4 198.51.100.40 127.0.0.1 40000 {port}{}",
                " ".repeat(100)
            )
            .into_bytes(),
        ),
        (
            "v1 with a bare LF",
            format!("PROXY TCP4 198.51.100.40 127.0.0.1 40000 {port}\n").into_bytes(),
        ),
        (
            "v1 in lower case",
            format!("proxy tcp4 198.51.100.40 127.0.0.1 40000 {port}\r\n").into_bytes(),
        ),
        (
            "v1 port out of range",
            format!("PROXY TCP4 198.51.100.40 127.0.0.1 99999 {port}\r\n").into_bytes(),
        ),
        (
            "v1 TCP4 with an IPv6 source",
            format!("PROXY TCP4 2001:db8::40 127.0.0.1 40000 {port}\r\n").into_bytes(),
        ),
        (
            "v1 with extra fields",
            format!("PROXY TCP4 198.51.100.40 127.0.0.1 40000 {port} 1\r\n").into_bytes(),
        ),
    ];
    let addrs = {
        let mut a = vec![198, 51, 100, 40, 127, 0, 0, 1];
        a.extend_from_slice(&4711u16.to_be_bytes());
        a.extend_from_slice(&port.to_be_bytes());
        a
    };
    cases.push(("v2 version 1", v2_raw(0x11, 0x11, 12, &addrs)));
    cases.push(("v2 command 0xF", v2_raw(0x2F, 0x11, 12, &addrs)));
    cases.push(("v2 family 0x5", v2_raw(0x21, 0x51, 12, &addrs)));
    cases.push(("v2 address block short", v2_raw(0x21, 0x11, 6, &addrs[..6])));
    for (name, mut bytes) in cases {
        bytes.extend_from_slice(&get_req(&format!("/invalid/{}", name.replace(' ', "-"))));
        let answer = answer_to(lacquer.addr(), &bytes);
        assert!(
            answer.is_none(),
            "{name}: answered {:?}",
            answer.map(|r| (r.status, r.text()))
        );
    }
    // declared longer than sent, then the sending side closed
    let mut conn = RawConn::connect(lacquer.addr());
    let mut short = v2_tcp4([198, 51, 100, 40], port, &[]);
    short[15] = 200; // declares 200 bytes after the fixed part, sends 12
    short.extend_from_slice(&get_req("/invalid/short"));
    conn.send(&short);
    let _ = conn.stream().shutdown(std::net::Shutdown::Write);
    assert!(conn.try_read_response(false).is_err());

    std::thread::sleep(Duration::from_millis(300));
    let invalid: Vec<_> = origin
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/invalid"))
        .map(|r| {
            (
                r.path.clone(),
                r.header("x-forwarded-for").map(str::to_string),
            )
        })
        .collect();
    assert!(invalid.is_empty(), "served: {invalid:?}");
    assert!(
        !logged_as(&lacquer, "198.51.100.40") && !logged_as(&lacquer, "2001:db8::40"),
        "{}",
        lacquer.stdout_log()
    );
    lacquer.assert_no_panic();
}

/// Attack: v2 headers at the size limit: 64 KiB of well-formed TLVs after the addresses, and
/// TLVs whose own lengths overrun the header. Promise: a large header is read whole (nothing of
/// it taken for the request) and names its client; a header whose TLVs are malformed either
/// closes the connection or still names only the address its fixed block gives, never anything
/// read out of the TLV bytes, and never the socket's peer.
#[test]
fn v2_headers_with_huge_or_malformed_tlvs() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let port = lacquer.port();

    // well-formed: custom TLVs (type 0xE0) of 1000 bytes up to the 65535-byte limit
    let mut tlvs = Vec::new();
    while tlvs.len() + 1003 <= 65535 - 12 {
        tlvs.push(0xE0);
        tlvs.extend_from_slice(&1000u16.to_be_bytes());
        // bytes that would read as a request, should they leak past the header
        let filler = b"GET /leak HTTP/1.1\r\nHost: test\r\n\r\n";
        tlvs.extend(filler.iter().cycle().take(1000));
    }
    let mut bytes = v2_tcp4([198, 51, 100, 50], port, &tlvs);
    bytes.extend_from_slice(&get_req("/huge-tlvs"));
    let resp = answer_to(lacquer.addr(), &bytes).expect("a huge valid header is served");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "xff=198.51.100.50");

    // a TLV whose length runs past the header's end
    let mut bad = vec![0xE0];
    bad.extend_from_slice(&60000u16.to_be_bytes());
    bad.extend_from_slice(b"198.51.100.66");
    let mut bytes = v2_tcp4([198, 51, 100, 51], port, &bad);
    bytes.extend_from_slice(&get_req("/bad-tlv"));
    if let Some(resp) = answer_to(lacquer.addr(), &bytes) {
        assert_eq!(resp.status, 200);
        assert_eq!(resp.text(), "xff=198.51.100.51");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        origin.hits_for("/leak"),
        0,
        "TLV bytes were read as a request"
    );
    for r in origin.requests() {
        let xff = r.header("x-forwarded-for").unwrap_or("-");
        assert!(
            xff == "198.51.100.50" || xff == "198.51.100.51",
            "{} forwarded as {xff}",
            r.path
        );
    }
    lacquer.assert_no_panic();
}

/// Attack: headers that name no client or one that must be ignored: v2 `LOCAL` carrying an
/// IPv4 address block, v2 `PROXY` with family UNSPEC, v2 `PROXY` over UNIX sockets (216 bytes
/// of paths), v1 `UNKNOWN` followed by addresses, and a valid v2 TCP6 one. Promise: `LOCAL`,
/// UNSPEC, UNIX and `UNKNOWN` keep the socket's own peer (127.0.0.1) whatever bytes follow;
/// TCP6 names its IPv6 client.
#[test]
fn local_unspec_unix_and_unknown_keep_the_socket_peer() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let port = lacquer.port();
    let mut ipv4_block = vec![198, 51, 100, 60, 127, 0, 0, 1];
    ipv4_block.extend_from_slice(&4711u16.to_be_bytes());
    ipv4_block.extend_from_slice(&port.to_be_bytes());
    let mut unix = vec![0u8; 216];
    unix[..13].copy_from_slice(b"/198.51.100.6");
    let mut tcp6 = "2001:db8::61"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets()
        .to_vec();
    tcp6.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    tcp6.extend_from_slice(&4711u16.to_be_bytes());
    tcp6.extend_from_slice(&port.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("v2 LOCAL", v2_raw(0x20, 0x11, 12, &ipv4_block), "127.0.0.1"),
        (
            "v2 UNSPEC",
            v2_raw(0x21, 0x00, 12, &ipv4_block),
            "127.0.0.1",
        ),
        ("v2 UNIX", v2_raw(0x21, 0x31, 216, &unix), "127.0.0.1"),
        (
            "v1 UNKNOWN",
            format!("PROXY UNKNOWN 198.51.100.62 127.0.0.1 40000 {port}\r\n").into_bytes(),
            "127.0.0.1",
        ),
        ("v2 TCP6", v2_raw(0x21, 0x21, 36, &tcp6), "2001:db8::61"),
    ];
    for (name, mut bytes, expected) in cases {
        bytes.extend_from_slice(&get_req(&format!("/kept/{}", name.replace(' ', "-"))));
        let resp = answer_to(lacquer.addr(), &bytes)
            .unwrap_or_else(|| panic!("{name}: closed unanswered"));
        assert_eq!(resp.status, 200, "{name}");
        assert_eq!(resp.text(), format!("xff={expected}"), "{name}");
    }
    assert!(
        !logged_as(&lacquer, "198.51.100.60") && !logged_as(&lacquer, "198.51.100.62"),
        "{}",
        lacquer.stdout_log()
    );
    lacquer.assert_no_panic();
}

/// Attack: one packet holding a v1 header and three pipelined requests; then a connection whose
/// header is followed by a second PROXY header naming another client. Promise: every pipelined
/// request is answered, in order, as the named client; a second header is HTTP (a bad request,
/// 400 or closed), never a change of address, and nothing behind it reaches the origin.
#[test]
fn pipelined_requests_after_a_header_and_a_second_header() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let port = lacquer.port();

    let mut packet = v1("198.51.100.70", port);
    for i in 0..3 {
        packet.extend_from_slice(&get_req(&format!("/pipelined/{i}")));
    }
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(&packet);
    for i in 0..3 {
        let resp = conn.read_response(false);
        assert_eq!(resp.status, 200, "request {i}");
        assert_eq!(resp.text(), "xff=198.51.100.70", "request {i}");
    }
    let paths: Vec<_> = origin.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/pipelined/0", "/pipelined/1", "/pipelined/2"]);

    let mut doubled = v1("198.51.100.71", port);
    doubled.extend_from_slice(&v1("198.51.100.72", port));
    doubled.extend_from_slice(&get_req("/second-header"));
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(&doubled);
    if let Ok(resp) = conn.try_read_response(false) {
        assert_eq!(resp.status, 400, "a second PROXY header was served");
        assert!(conn.is_closed(Duration::from_secs(5)));
    }
    // and a v2 header after a v1 one
    let mut doubled = v1("198.51.100.73", port);
    doubled.extend_from_slice(&v2_tcp4([198, 51, 100, 74], port, &[]));
    doubled.extend_from_slice(&get_req("/second-header-v2"));
    if let Some(resp) = answer_to(lacquer.addr(), &doubled) {
        assert_eq!(resp.status, 400, "a v2 header after a v1 one was served");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(origin.hits_for("/second-header"), 0);
    assert_eq!(origin.hits_for("/second-header-v2"), 0);
    assert!(!logged_as(&lacquer, "198.51.100.72") && !logged_as(&lacquer, "198.51.100.74"));
    lacquer.assert_no_panic();
}

/// Attack: PROXY headers (v1 and v2) sent to a listener not configured for them, with a request
/// behind. Promise: the v1 line is a malformed request (`400`), the v2 binary one is refused (400
/// or closed), nothing reaches the origin, and the address they name is never the client's.
#[test]
fn a_header_on_a_plain_listener_is_a_bad_request_not_an_address() {
    let origin = xff_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "");
    let port = lacquer.port();
    let mut bytes = v1("198.51.100.80", port);
    bytes.extend_from_slice(&get_req("/plain-v1"));
    let resp = answer_to(lacquer.addr(), &bytes).expect("an answer to a v1 line");
    assert_eq!(resp.status, 400);

    let mut bytes = v2_tcp4([198, 51, 100, 81], port, &[]);
    bytes.extend_from_slice(&get_req("/plain-v2"));
    if let Some(resp) = answer_to(lacquer.addr(), &bytes) {
        assert_eq!(resp.status, 400, "{}", resp.text());
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(origin.hits(), 0, "{:?}", origin.requests());
    assert!(!logged_as(&lacquer, "198.51.100.80") && !logged_as(&lacquer, "198.51.100.81"));
    // the listener still serves
    assert_eq!(
        RawConn::connect(lacquer.addr()).get("/after", &[]).status,
        200
    );
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Client identification (fairness keys)
// ---------------------------------------------------------------------------------------------

/// Sends `first` (a slow request on a new connection), waits until `replica` holds it, then
/// sends `second` on another connection; returns both statuses (0: no answer).
fn pair(addr: SocketAddr, replica: &Replica, first: Vec<u8>, second: Vec<u8>) -> (u16, u16) {
    let before = replica.served();
    let one = std::thread::spawn(move || answer_to(addr, &first).map_or(0, |r| r.status));
    let held = poll_until(WAIT, || replica.served() > before);
    assert!(held, "the first request never reached the replica");
    let two = answer_to(addr, &second).map_or(0, |r| r.status);
    (one.join().unwrap(), two)
}

fn slow_get(path: &str, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut req = format!("GET {path}?sleep=1200 HTTP/1.1\r\nHost: test\r\n");
    for (k, v) in fields {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.into_bytes()
}

/// Request fields, as name and value.
type Fields<'a> = Vec<(&'a str, &'a str)>;

const CAP_ONE: &str = "[fairness]\nmax_in_flight = 1\nretry_after = \"1s\"\n";

/// Attack: a client that is no trusted proxy sends `X-Forwarded-For`, `Forwarded`, long chains
/// and garbage, different on each request, to get a fairness key per request. Promise: from an
/// untrusted peer they change nothing: both requests count against the peer's address (the
/// second is refused `429`), and the origin is told the peer's address only.
#[test]
fn spoofed_forwarding_fields_from_an_untrusted_peer_do_not_change_the_key() {
    let r = Replica::start("a");
    let lb = start_balancer(
        &[(r.addr(), 1)],
        &format!("[proxy]\ntrusted_proxies = [\"10.0.0.0/8\"]\n{CAP_ONE}"),
    );
    let chain: String = (0..300)
        .map(|i| format!("198.51.{}.{}", i / 250, i % 250))
        .collect::<Vec<_>>()
        .join(", ");
    let spoofs: Vec<(Fields, Fields)> = vec![
        (
            vec![("X-Forwarded-For", "198.51.100.1")],
            vec![("X-Forwarded-For", "198.51.100.2")],
        ),
        (
            vec![("Forwarded", "for=198.51.100.3")],
            vec![("Forwarded", "for=\"[2001:db8::3]:80\"")],
        ),
        (
            vec![("X-Forwarded-For", chain.as_str())],
            vec![("X-Forwarded-For", "garbage, nope")],
        ),
        (vec![("X-Real-IP", "198.51.100.4")], vec![]),
    ];
    for (i, (a, b)) in spoofs.iter().enumerate() {
        let (s1, s2) = pair(
            lb.addr(),
            &r,
            slow_get(&format!("/u/{i}/a"), a),
            slow_get(&format!("/u/{i}/b"), b),
        );
        assert_eq!(
            (s1, s2),
            (200, 429),
            "case {i}: the spoof made another client"
        );
    }
    for req in r.origin.requests() {
        assert_eq!(
            req.header_all("x-forwarded-for"),
            ["127.0.0.1"],
            "{} told the origin a spoofed client",
            req.path
        );
    }
    lb.assert_no_panic();
}

/// Attack: through a trusted proxy, clients vary their reported address: distinct addresses,
/// the same address spelled as `X-Forwarded-For` and as `Forwarded` (IPv6 with a port), a
/// 1,500-entry chain, a chain ending in trusted hops, garbage, and no field at all. Promise: the
/// key is the rightmost untrusted entry: the same client in any spelling shares one cap (429),
/// different clients do not; an unreadable entry is an unknown client, never the proxy's own
/// key.
#[test]
fn forwarding_fields_from_a_trusted_peer_set_the_key() {
    let r = Replica::start("a");
    let lb = start_balancer(
        &[(r.addr(), 1)],
        &format!("[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\n{CAP_ONE}"),
    );
    let long: String = (0..1500)
        .map(|i| format!("203.0.{}.{}", i / 250, i % 250))
        .chain(std::iter::once("198.51.100.77".to_string()))
        .collect::<Vec<_>>()
        .join(",");
    let cases: Vec<(&str, Fields, Fields, (u16, u16))> = vec![
        (
            "same address",
            vec![("X-Forwarded-For", "198.51.100.1")],
            vec![("X-Forwarded-For", "198.51.100.1")],
            (200, 429),
        ),
        (
            "two addresses",
            vec![("X-Forwarded-For", "198.51.100.2")],
            vec![("X-Forwarded-For", "198.51.100.3")],
            (200, 200),
        ),
        (
            "Forwarded IPv6 with port vs X-Forwarded-For",
            vec![("Forwarded", "for=\"[2001:db8::5]:4711\"")],
            vec![("X-Forwarded-For", "2001:db8::5")],
            (200, 429),
        ),
        (
            "long chain vs its rightmost entry",
            vec![("X-Forwarded-For", long.as_str())],
            vec![("X-Forwarded-For", "198.51.100.77")],
            (200, 429),
        ),
        (
            "trusted hops on the right",
            vec![("X-Forwarded-For", "198.51.100.9, 127.0.0.2, 127.0.0.3")],
            vec![("X-Forwarded-For", "198.51.100.9")],
            (200, 429),
        ),
        (
            "spoofed left part does not matter",
            vec![("X-Forwarded-For", "203.0.113.1, 198.51.100.10")],
            vec![("X-Forwarded-For", "203.0.113.2, 198.51.100.10")],
            (200, 429),
        ),
        (
            "garbage is not the proxy",
            vec![("X-Forwarded-For", "not-an-address")],
            vec![],
            (200, 200),
        ),
        (
            "garbage after a real client is not that client",
            vec![("X-Forwarded-For", "198.51.100.11, junk")],
            vec![("X-Forwarded-For", "198.51.100.11")],
            (200, 200),
        ),
    ];
    for (name, a, b, expected) in cases {
        let slug = name.replace(' ', "-");
        let got = pair(
            lb.addr(),
            &r,
            slow_get(&format!("/t/{slug}/a"), &a),
            slow_get(&format!("/t/{slug}/b"), &b),
        );
        assert_eq!(got, expected, "{name}");
    }
    lb.assert_no_panic();
}

/// Attack: on a `proxy_protocol` listener whose load balancer range is trusted, the header names
/// a client outside that range and the request carries `X-Forwarded-For` of its choosing.
/// Promise: the named client is the connection's peer for `trusted_proxies` too: its fields are
/// not believed (the origin is told the named client, the fairness key is the named client, so
/// two requests with different spoofs share one cap), while a header naming a trusted hop does
/// let its `X-Forwarded-For` through.
#[test]
fn the_proxy_header_client_is_the_peer_for_trust_and_fairness() {
    let r = Replica::start("a");
    let lb = LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port} proxy_protocol\"]\nthreads = 2\n{}\n\
             [proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\n{CAP_ONE}",
            upstreams_toml(&[(r.addr(), 1)])
        )
    });
    let port = lb.port();
    let with = |client: &str, req: Vec<u8>| {
        let mut b = v1(client, port);
        b.extend_from_slice(&req);
        b
    };
    // untrusted named client, different spoofs: one key
    let got = pair(
        lb.addr(),
        &r,
        with(
            "198.51.100.90",
            slow_get("/pp/a", &[("X-Forwarded-For", "203.0.113.1")]),
        ),
        with(
            "198.51.100.90",
            slow_get("/pp/b", &[("X-Forwarded-For", "203.0.113.2")]),
        ),
    );
    assert_eq!(
        got,
        (200, 429),
        "a spoof behind a PROXY header changed the key"
    );
    let told = r.origin.requests_for("/pp/a?sleep=1200");
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].header_all("x-forwarded-for"), ["198.51.100.90"]);
    // two named clients: two keys, though both connections come from 127.0.0.1
    let got = pair(
        lb.addr(),
        &r,
        with("198.51.100.91", slow_get("/pp/c", &[])),
        with("198.51.100.92", slow_get("/pp/d", &[])),
    );
    assert_eq!(
        got,
        (200, 200),
        "the socket peer, not the named client, was the key"
    );
    // a header naming a trusted hop: its X-Forwarded-For is believed
    let got = pair(
        lb.addr(),
        &r,
        with(
            "127.0.0.5",
            slow_get("/pp/e", &[("X-Forwarded-For", "198.51.100.93")]),
        ),
        with(
            "127.0.0.6",
            slow_get("/pp/f", &[("X-Forwarded-For", "198.51.100.93")]),
        ),
    );
    assert_eq!(got, (200, 429));
    assert!(poll_until(WAIT, || logged_as(&lb, "198.51.100.90")));
    assert!(!logged_as(&lb, "203.0.113.1") && !logged_as(&lb, "203.0.113.2"));
    lb.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Hostile replicas
// ---------------------------------------------------------------------------------------------

/// What a [`Hostile`] replica does with a request.
#[derive(Clone)]
enum Act {
    /// Writes these bytes, then closes.
    Answer(Vec<u8>),
    /// Waits this long, then writes the bytes and closes.
    Slow(Duration, Vec<u8>),
    /// Never answers (until the peer closes or the replica is dropped).
    Hang,
    /// Closes at once.
    Close,
    /// A 200 head promising 100 MB, then as much body as the peer takes.
    Flood,
}

type Script = dyn Fn(&str, usize) -> Act + Send + Sync;

/// A replica that answers from a script, per request head and per count of `/health` probes
/// so far, on a thread per connection; it counts its open connections (closed when the peer
/// closes), their peak, and the real (non-`/health`) requests it got.
struct Hostile {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    peak_open: Arc<AtomicUsize>,
    probes: Arc<AtomicUsize>,
    real: Arc<AtomicUsize>,
    flooded: Arc<Mutex<Vec<usize>>>,
    stop: Arc<AtomicBool>,
}

impl Hostile {
    fn start(script: impl Fn(&str, usize) -> Act + Send + Sync + 'static) -> Hostile {
        let script: Arc<Script> = Arc::new(script);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let h = Hostile {
            addr,
            open: Arc::default(),
            peak_open: Arc::default(),
            probes: Arc::default(),
            real: Arc::default(),
            flooded: Arc::default(),
            stop: Arc::default(),
        };
        let (open, peak, probes, real, flooded, stop) = (
            h.open.clone(),
            h.peak_open.clone(),
            h.probes.clone(),
            h.real.clone(),
            h.flooded.clone(),
            h.stop.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let (script, open, probes, real, flooded, stop) = (
                    script.clone(),
                    open.clone(),
                    probes.clone(),
                    real.clone(),
                    flooded.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let head = read_head(&mut s);
                    let nth = if head.starts_with("GET /health") {
                        probes.fetch_add(1, Ordering::SeqCst)
                    } else {
                        real.fetch_add(1, Ordering::SeqCst);
                        usize::MAX
                    };
                    match script(&head, nth) {
                        Act::Answer(bytes) => {
                            let _ = s.write_all(&bytes);
                        }
                        Act::Slow(d, bytes) => {
                            std::thread::sleep(d);
                            let _ = s.write_all(&bytes);
                        }
                        Act::Hang => wait_for_close(&mut s, &stop),
                        Act::Close => {}
                        Act::Flood => {
                            let mut sent = 0;
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n");
                            let chunk = vec![b'x'; 64 * 1024];
                            let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
                            while sent < 100_000_000 && s.write_all(&chunk).is_ok() {
                                sent += chunk.len();
                            }
                            flooded.lock().unwrap().push(sent);
                        }
                    }
                    drop(s);
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        h
    }

    fn probes(&self) -> usize {
        self.probes.load(Ordering::SeqCst)
    }

    fn real(&self) -> usize {
        self.real.load(Ordering::SeqCst)
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn read_head(s: &mut TcpStream) -> String {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Blocks until the peer closes `s` (or `stop`, or a minute).
fn wait_for_close(s: &mut TcpStream, stop: &AtomicBool) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let until = Instant::now() + Duration::from_secs(60);
    let mut buf = [0u8; 1024];
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return,
        }
    }
}

fn ok_answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn health_toml(interval_ms: u64, timeout_ms: u64, rise: u32, fall: u32) -> String {
    format!(
        "[balancer]\nalgorithm = \"round_robin\"\n\
         [balancer.health_check]\npath = \"/health\"\ninterval = \"{interval_ms}ms\"\n\
         timeout = \"{timeout_ms}ms\"\nrise = {rise}\nfall = {fall}\n"
    )
}

/// Attack: a replica whose health endpoint accepts the probe and never answers (its real
/// requests are fine). Promise: it is taken out of rotation (`fall` timeouts), and the checker
/// does not pile up connections on it: each probe's connection is closed at its timeout, so at
/// most a couple are open at once however long it hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_health_endpoint_is_taken_out_without_piling_up_probes() {
    let good = Replica::start("good");
    let hanging = Hostile::start(|head, _| {
        if head.starts_with("GET /health") {
            Act::Hang
        } else {
            Act::Answer(ok_answer("hanging-replica"))
        }
    });
    let lb = start_balancer(
        &[(good.addr(), 1), (hanging.addr, 1)],
        &health_toml(200, 150, 2, 2),
    );
    let down = format!("backend {} is down", hanging.addr);
    assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    // let it hang for 15 more probes
    let probes = hanging.probes();
    assert!(poll_until_async(WAIT, || hanging.probes() >= probes + 15).await);
    let peak = hanging.peak_open.load(Ordering::SeqCst);
    assert!(peak <= 3, "{peak} probe connections open at once");
    let real = hanging.real();
    for i in 0..20 {
        let resp = get(&lb.url(&format!("/h/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
    }
    assert_eq!(
        hanging.real(),
        real,
        "a replica down on its checks got traffic"
    );
    lb.assert_no_panic();
}

/// Attack: health answers that are garbage, closed before any byte, slower than the timeout, or
/// a 200 head followed by a 100 MB body. Promise: the first three take their replica out; the
/// flood is a 200 and keeps its replica in rotation, and the checker reads its status line, not
/// its body (a bounded amount is taken per probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_cut_slow_and_flooding_health_answers() {
    let good = Replica::start("good");
    let on_health = |act: Act| {
        move |head: &str, _: usize| {
            if head.starts_with("GET /health") {
                act.clone()
            } else {
                Act::Answer(ok_answer("hostile"))
            }
        }
    };
    let garbage = Hostile::start(on_health(Act::Answer(b"garbage\r\n\r\n".to_vec())));
    let closer = Hostile::start(on_health(Act::Close));
    let slow = Hostile::start(on_health(Act::Slow(
        Duration::from_millis(700),
        ok_answer("late"),
    )));
    let flood = Hostile::start(on_health(Act::Flood));
    let lb = start_balancer(
        &[
            (good.addr(), 1),
            (garbage.addr, 1),
            (closer.addr, 1),
            (slow.addr, 1),
            (flood.addr, 1),
        ],
        &health_toml(400, 300, 2, 2),
    );
    for bad in [&garbage, &closer, &slow] {
        let down = format!("backend {} is down", bad.addr);
        assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    }
    assert!(poll_until_async(WAIT, || flood.probes() >= 5).await);
    let flood_down = format!("backend {} is down", flood.addr);
    assert!(
        !lb.stderr_log().contains(&flood_down),
        "a 200 with a large body was taken for a failure: {}",
        lb.stderr_log()
    );
    // let the flood writers notice the closed probes
    std::thread::sleep(Duration::from_secs(1));
    let flooded = flood.flooded.lock().unwrap().clone();
    assert!(
        flooded.iter().all(|&n| n < 32 << 20),
        "a probe read a flood's body: {flooded:?}"
    );
    let before: Vec<usize> = [&garbage, &closer, &slow]
        .iter()
        .map(|h| h.real())
        .collect();
    let flood_before = flood.real();
    for i in 0..20 {
        assert_eq!(get(&lb.url(&format!("/g/{i}")), &[]).await.status, 200);
    }
    let after: Vec<usize> = [&garbage, &closer, &slow]
        .iter()
        .map(|h| h.real())
        .collect();
    assert_eq!(before, after, "a replica down on its checks got traffic");
    assert!(
        flood.real() > flood_before,
        "the flooding (healthy) replica got none"
    );
    lb.assert_no_panic();
}

/// Attack: a replica that flaps: first failing every third probe, then failing two of every
/// three (never `fall` = 3 in a row), then failing every probe, then passing every other one
/// (never `rise` = 2 in a row). Promise: only consecutive results count: flapping inside the
/// thresholds neither takes it out nor, once out, brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_replica_crosses_no_threshold_it_does_not_meet() {
    let good = Replica::start("good");
    let phase = Arc::new(AtomicUsize::new(0));
    let script_phase = phase.clone();
    let flapper = Hostile::start(move |head, nth| {
        if !head.starts_with("GET /health") {
            return Act::Answer(ok_answer("flapper"));
        }
        let pass = match script_phase.load(Ordering::SeqCst) {
            0 => nth % 3 != 0,
            1 => nth % 3 == 2,
            2 => false,
            _ => nth % 2 == 0,
        };
        if pass {
            Act::Answer(ok_answer("ok"))
        } else {
            Act::Answer(b"HTTP/1.1 503 Down\r\nContent-Length: 0\r\n\r\n".to_vec())
        }
    });
    let lb = start_balancer(
        &[(good.addr(), 1), (flapper.addr, 1)],
        &health_toml(300, 250, 2, 3),
    );
    let down = format!("backend {} is down", flapper.addr);
    let up = format!("backend {} is up", flapper.addr);
    for p in 0..2 {
        phase.store(p, Ordering::SeqCst);
        let n = flapper.probes();
        assert!(poll_until_async(WAIT, || flapper.probes() >= n + 12).await);
        assert!(
            !lb.stderr_log().contains(&down),
            "phase {p}: flapping inside `fall` took it out: {}",
            lb.stderr_log()
        );
    }
    phase.store(2, Ordering::SeqCst);
    assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    phase.store(3, Ordering::SeqCst);
    let n = flapper.probes();
    assert!(poll_until_async(WAIT, || flapper.probes() >= n + 12).await);
    assert!(
        !lb.stderr_log().contains(&up),
        "passing every other probe brought it back: {}",
        lb.stderr_log()
    );
    let real = flapper.real();
    for i in 0..10 {
        assert_eq!(get(&lb.url(&format!("/f/{i}")), &[]).await.status, 200);
    }
    assert_eq!(
        flapper.real(),
        real,
        "a replica out of rotation got traffic"
    );
    lb.assert_no_panic();
}

/// Attack: a replica that passes every health check but resets every real request. Promise:
/// passive health ejects it after `failures`, the GETs that met it are retried elsewhere (every
/// client gets 200), and its passing checks do not bring it back before the cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_on_checks_but_failing_real_requests_is_ejected_and_stays_out() {
    let good = Replica::start("good");
    let liar = Hostile::start(|head, _| {
        if head.starts_with("GET /health") {
            Act::Answer(ok_answer("fine"))
        } else {
            Act::Close
        }
    });
    let lb = start_balancer(
        &[(good.addr(), 1), (liar.addr, 1)],
        &format!(
            "{}[balancer.passive]\nfailures = 3\nwindow = \"60s\"\ncooldown = \"60s\"\n",
            health_toml(200, 150, 2, 2)
        ),
    );
    for i in 0..20 {
        let resp = get(&lb.url(&format!("/p/{i}")), &[]).await;
        assert_eq!(resp.status, 200, "GET {i} was not retried");
    }
    let ejected = format!("backend {} ejected", liar.addr);
    assert!(wait_for_log(&lb, &ejected, WAIT), "{}", lb.stderr_log());
    let real = liar.real();
    assert!(real >= 3, "the liar met only {real} requests");
    let probes = liar.probes();
    assert!(poll_until_async(WAIT, || liar.probes() >= probes + 8).await);
    for i in 0..20 {
        let resp = get(&lb.url(&format!("/q/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
    }
    assert_eq!(liar.real(), real, "passing checks cut the ejection short");
    lb.assert_no_panic();
}

/// Attack: every replica down, two ways: all refusing connections, and all accepting and never
/// answering (health checks included), with ten clients at once. Promise: clients still get an
/// answer, in bounded time: a 502 at once when nothing accepts, a 504 within
/// `balancer.timeouts.total` (3 s here) plus a margin when everything hangs, and the hanging
/// replicas are not left with the clients' connections afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_down_answers_in_bounded_time() {
    let refusing = [RefusingPort::bind(), RefusingPort::bind()];
    let lb = start_balancer(
        &[(refusing[0].addr(), 1), (refusing[1].addr(), 1)],
        &health_toml(200, 150, 2, 2),
    );
    for r in &refusing {
        let down = format!("backend {} is down", r.addr());
        assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    }
    let t0 = Instant::now();
    let statuses = gets_at_once((0..10).map(|i| lb.url(&format!("/refused/{i}"))), &[]).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(statuses.iter().all(|r| r.status == 502), "{statuses:?}");

    let hangs = [
        Hostile::start(|_, _| Act::Hang),
        Hostile::start(|_, _| Act::Hang),
    ];
    let lb = start_balancer(
        &[(hangs[0].addr, 1), (hangs[1].addr, 1)],
        &format!(
            "{}[balancer.timeouts]\nfirst_byte = \"1s\"\nidle = \"1s\"\ntotal = \"3s\"\n",
            health_toml(200, 150, 2, 2)
        ),
    );
    for h in &hangs {
        let down = format!("backend {} is down", h.addr);
        assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    }
    let t0 = Instant::now();
    let statuses = gets_at_once((0..10).map(|i| lb.url(&format!("/hung/{i}"))), &[]).await;
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(statuses.iter().all(|r| r.status == 504), "{statuses:?}");
    // what is left open on the replicas is the checker's, not the clients'
    let drained = poll_until_async(Duration::from_secs(5), || {
        hangs.iter().all(|h| h.open.load(Ordering::SeqCst) <= 2)
    })
    .await;
    assert!(
        drained,
        "connections left on the hanging replicas: {:?}",
        hangs
            .iter()
            .map(|h| h.open.load(Ordering::SeqCst))
            .collect::<Vec<_>>()
    );
    lb.assert_no_panic();
}

/// Attack: a replica killed (listener and connections gone) and started again on the same
/// address. Promise: it is taken out (`fall`), gets nothing while out, and is re-admitted
/// (`rise`) and given traffic once it answers again; no client request fails meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_dies_and_comes_back_is_readmitted() {
    let a = Replica::start("a");
    let b = Replica::start("b");
    let b_addr = b.addr();
    let lb = start_balancer(&[(a.addr(), 1), (b_addr, 1)], &health_toml(200, 150, 2, 2));
    for i in 0..6 {
        assert_eq!(get(&lb.url(&format!("/before/{i}")), &[]).await.status, 200);
    }
    assert!(b.served() > 0);
    drop(b);
    let down = format!("backend {b_addr} is down");
    assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    for i in 0..10 {
        assert_eq!(get(&lb.url(&format!("/while/{i}")), &[]).await.status, 200);
    }
    let b2 = Replica::start_on("b2", b_addr);
    let up = format!("backend {b_addr} is up");
    assert!(wait_for_log(&lb, &up, WAIT), "{}", lb.stderr_log());
    for i in 0..10 {
        assert_eq!(get(&lb.url(&format!("/after/{i}")), &[]).await.status, 200);
    }
    assert!(b2.served() >= 3, "re-admitted replica got {}", b2.served());
    lb.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Found faults and further attacks
// ---------------------------------------------------------------------------------------------

/// Attack: a v1 header and then HTTP/2 with prior knowledge (h2c) on the same connection, two
/// streams at once. Promise: the h2c preface after the header is recognised, and every stream
/// of the connection is the named client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_after_a_header_is_the_named_client() {
    use tokio::io::AsyncWriteExt;
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "");
    let mut tcp = tokio::net::TcpStream::connect(lacquer.addr())
        .await
        .unwrap();
    tcp.write_all(&v1("198.51.100.110", lacquer.port()))
        .await
        .unwrap();
    let (sender, connection) = within(WAIT, "h2c handshake after a PROXY header", async {
        h2::client::handshake(tcp).await.expect("h2c handshake")
    })
    .await;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let (one, _s1) = h2_request(&sender, "GET", &lacquer.url("/h2c/1"), &[]).await;
    let (two, _s2) = h2_request(&sender, "GET", &lacquer.url("/h2c/2"), &[]).await;
    for (name, response) in [("1", one), ("2", two)] {
        let answer = within(WAIT, "an h2c answer", h2_read_answer(response, None))
            .await
            .expect("an h2c answer");
        assert_eq!(answer.status, 200, "stream {name}");
        assert_eq!(answer.text(), "xff=198.51.100.110", "stream {name}");
    }
    lacquer.assert_no_panic();
}

/// Attack: every replica passively ejected (both answered 502 with `count_5xx`), then one of
/// them recovers while both are still in their cooldown. Promise (README: "if no backend
/// qualifies, untried ones are used anyway rather than failing every request"): requests keep
/// reaching the replicas (none is refused by the balancer itself), so the recovered one serves
/// its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_ejected_still_reaches_the_one_that_recovered() {
    let broken = [
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(true)),
    ];
    let origin = |flag: Arc<AtomicBool>, name: &'static str| {
        TestOrigin::start(move |_| {
            let status = if flag.load(Ordering::SeqCst) {
                502
            } else {
                200
            };
            OriginResponse::ok(name)
                .status(status)
                .header("cache-control", "no-store")
        })
    };
    let a = origin(broken[0].clone(), "a");
    let b = origin(broken[1].clone(), "b");
    let lb = start_balancer(
        &[(a.addr(), 1), (b.addr(), 1)],
        "[balancer]\nalgorithm = \"round_robin\"\n\
         [balancer.passive]\nfailures = 2\nwindow = \"60s\"\ncooldown = \"60s\"\ncount_5xx = true\n",
    );
    for i in 0..6 {
        let resp = get(&lb.url(&format!("/e/{i}")), &[]).await;
        assert_eq!(resp.status, 502);
    }
    for o in [&a, &b] {
        let ejected = format!("backend {} ejected", o.addr());
        assert!(wait_for_log(&lb, &ejected, WAIT), "{}", lb.stderr_log());
    }
    broken[0].store(false, Ordering::SeqCst);
    let hits = a.hits() + b.hits();
    let mut ok = 0;
    for i in 0..10 {
        let resp = get(&lb.url(&format!("/r/{i}")), &[]).await;
        if resp.status == 200 {
            assert_eq!(resp.text(), "a");
            ok += 1;
        }
    }
    assert_eq!(
        a.hits() + b.hits(),
        hits + 10,
        "requests were refused without reaching any replica"
    );
    assert!(ok >= 3, "the recovered replica served {ok} of 10");
    lb.assert_no_panic();
}

/// Attack: the whole fleet fails its health checks at once (a health endpoint broken by one
/// deploy: every replica answers `/health` with 404) while serving real requests fine.
/// Promise (README: "if no backend qualifies, untried ones are used anyway rather than failing
/// every request"): every replica is marked down, yet every request is still served, by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_wide_health_failure_does_not_take_the_site_down() {
    let r = [Replica::start("a"), Replica::start("b")];
    for replica in &r {
        replica.set_health(404);
    }
    let lb = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1)],
        &health_toml(200, 150, 2, 2),
    );
    for replica in &r {
        let down = format!("backend {} is down", replica.addr());
        assert!(wait_for_log(&lb, &down, WAIT), "{}", lb.stderr_log());
    }
    let t0 = Instant::now();
    for i in 0..10 {
        let resp = get(&lb.url(&format!("/fleet/{i}")), &[]).await;
        assert_eq!(resp.status, 200, "request {i} with every replica down");
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(
        r[0].served() > 0 && r[1].served() > 0,
        "one replica took it all"
    );
    lb.assert_no_panic();
}

// A plain listener and a `proxy_protocol` one on the same port with a wildcard between them
// (`0.0.0.0:P proxy_protocol` beside `[::1]:P`) let a direct client of the plain listener name
// any address in a PROXY header (found by this file, 2026-12-08): such a listener set is now
// refused at start-up, `tests/config_errors.rs` (`share port`).

/// Attack: slowloris on a `proxy_protocol` listener with `server.header_read_timeout = "2s"`:
/// a connection that sends nothing, and one that dribbles its PROXY header for about 5 s and
/// then its request head. Promise (README, `[server]`: "a request head not complete this long
/// after the connection opened: 408, closed"; docs/security.md: a connection that sends nothing
/// is closed `header_read_timeout` after it was accepted): the PROXY header is bounded by
/// `header_read_timeout` too, so both are closed well within twice it (the header's bound, then
/// the request head's), not after a fixed 10 s for the header (as before 2026-12-08) or that
/// wait plus 2 s.
#[test]
fn the_head_deadline_counts_from_the_connection_opening_on_a_proxy_protocol_listener() {
    let origin = xff_origin();
    let lacquer = pp_lacquer(origin.addr(), "[server]\nheader_read_timeout = \"2s\"\n");
    let addr = lacquer.addr();
    let port = lacquer.port();
    let lifetime = |script: Vec<(Vec<u8>, Duration)>| {
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = s.set_nodelay(true);
            let _ = s.set_nonblocking(true);
            // an answer (the 408) or a close ends the wait alike
            fn closed(s: &mut TcpStream) -> bool {
                let mut buf = [0u8; 256];
                !matches!(s.read(&mut buf), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
            for (bytes, pause) in script {
                for b in bytes {
                    if s.write_all(&[b]).is_err() || closed(&mut s) {
                        return t0.elapsed();
                    }
                    std::thread::sleep(pause);
                }
            }
            while t0.elapsed() < Duration::from_secs(18) {
                if closed(&mut s) {
                    return t0.elapsed();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            t0.elapsed()
        })
    };
    let silent = lifetime(Vec::new());
    let header = v1("198.51.100.130", port);
    let pause = Duration::from_millis(5000 / header.len() as u64);
    let dribbled = lifetime(vec![
        (header, pause),
        (
            b"GET /slow HTTP/1.1\r\nHost: test\r\nX-Pad: ".to_vec(),
            Duration::from_millis(200),
        ),
        (vec![b'a'; 200], Duration::from_millis(200)),
    ]);
    let silent = silent.join().unwrap();
    let dribbled = dribbled.join().unwrap();
    assert!(
        silent <= Duration::from_millis(4500) && dribbled <= Duration::from_millis(4500),
        "closed after: silent {silent:?}, dribbled {dribbled:?} (header_read_timeout 2 s)"
    );
    assert_eq!(origin.hits(), 0);
}

/// Attack: a client at its fairness cap (1) sends a request that waits on a slow origin (6 s)
/// and leaves, on both forwarding paths (a GET miss, a POST pass), then asks again at once.
/// Promise: the slot is given back on every exit path (src/upstream/fairness.rs): a request
/// whose client left is given up, so the next request of that client is admitted, not refused
/// `429` until the origin answers the abandoned one.
#[test]
fn a_client_that_leaves_gives_back_its_fairness_slot() {
    let r = Replica::start("a");
    let lb = start_balancer(&[(r.addr(), 1)], CAP_ONE);
    for (name, req) in [
        (
            "GET miss",
            "GET /gone?sleep=6000 HTTP/1.1\r\nHost: test\r\n\r\n",
        ),
        (
            "POST",
            "POST /gone-post?sleep=6000 HTTP/1.1\r\nHost: test\r\nContent-Length: 1\r\n\r\nx",
        ),
    ] {
        let before = r.served();
        let mut conn = RawConn::connect(lb.addr());
        conn.send(req.as_bytes());
        assert!(
            poll_until(WAIT, || r.served() > before),
            "{name} never went upstream"
        );
        drop(conn);
        // well inside the origin's 6 s: a slot kept until the origin answers fails this
        let admitted = poll_until(Duration::from_millis(4500), || {
            RawConn::connect(lb.addr()).get("/next", &[]).status == 200
        });
        assert!(admitted, "{name}: the slot of a client that left was kept");
    }
    lb.assert_no_panic();
}

/// Attack: in `queue` mode (cap 1, queue of 1, `queue_timeout` 2 s), a client holds its slot
/// with a slow request, queues an HTTP/2 stream behind it and drops the connection. Promise
/// (README `[fairness]`: `queue_size` is "waiting requests per client before rejecting"): the
/// abandoned stream stops counting as waiting once it is given up (at the latest at its
/// `queue_timeout`), so 3.5 s later `lacquer_fairness_queued` is 0 and the client's next request
/// over the cap is queued (waits), not refused at once as if the queue were full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_queued_h2_stream_does_not_keep_its_queue_place() {
    let r = Replica::start("a");
    let (lb, admin) = LacquerProcess::start_with_admin(|port, admin| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n{}\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [fairness]\nmax_in_flight = 1\non_excess = \"queue\"\nqueue_size = 1\nqueue_timeout = \"2s\"\n",
            upstreams_toml(&[(r.addr(), 1)])
        )
    });
    let holder = tokio::spawn(get_status(lb.url("/hold?sleep=9000")));
    assert!(poll_until_async(WAIT, || r.served() >= 1).await);
    let (sender, driver) = h2_connect_default(lb.addr()).await;
    let (answer, _stream) = h2_request(&sender, "GET", &lb.url("/queued-h2"), &[]).await;
    let queued = value_when(admin, "lacquer_fairness_queued", 1.0).await;
    assert_eq!(queued, 1.0, "the h2 stream was never queued");
    driver.abort();
    drop(sender);
    drop(answer);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let still = scrape(admin).await.value("lacquer_fairness_queued");
    let t0 = Instant::now();
    let next = get(&lb.url("/next"), &[]).await.status;
    let waited = t0.elapsed();
    assert!(
        still == 0.0 && waited >= Duration::from_millis(1500),
        "3.5 s after its client left, {still} request(s) still counted as queued; the next \
         request got {next} after {waited:?} (a full queue answers at once)"
    );
    assert_eq!(r.origin.requests_for("/queued-h2").len(), 0);
    holder.abort();
    lb.assert_no_panic();
}

async fn get_status(url: String) -> u16 {
    get(&url, &[]).await.status
}
