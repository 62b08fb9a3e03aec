//! Lacquer behind load balancers (issue 12 item 3): forwarding fields believed from
//! `proxy.trusted_proxies` only, the PROXY protocol (v1, v2, before TLS) on `proxy_protocol`
//! listeners, the resolved client address for `purge_from` and the log, and the scheme in the
//! cache key.

use lacquer_test_support as support;
use support::*;

use std::process::Command;

/// An origin whose cacheable answer says which scheme and host it was told about.
fn telling_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        let body = format!(
            "proto={} host={}",
            req.header("x-forwarded-proto").unwrap_or("-"),
            req.header("x-forwarded-host").unwrap_or("-")
        );
        OriginResponse::ok(body).header("cache-control", "max-age=60")
    })
}

/// Every request field a client might use to steer an origin that the key does not contain.
const SPOOFED: [(&str, &str); 6] = [
    ("X-Forwarded-For", "203.0.113.9"),
    ("X-Forwarded-Proto", "https"),
    ("X-Forwarded-Host", "evil.test"),
    ("X-Forwarded-Port", "8443"),
    ("Forwarded", "for=203.0.113.9;proto=https"),
    ("X-Original-URL", "/admin"),
];

#[test]
fn an_untrusted_client_cannot_set_forwarding_fields() {
    let origin = telling_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[proxy]\nforwarded = \"both\"");
    let resp = RawConn::connect(lacquer.addr()).get("/page", &SPOOFED);
    assert_eq!(resp.text(), "proto=http host=test");
    let seen = origin.last_request().unwrap();
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(seen.header("forwarded"), Some("for=127.0.0.1;proto=http"));
    assert_eq!(seen.header("x-forwarded-host"), Some("test"));
    assert!(!seen.has_header("x-forwarded-port"));
    assert!(!seen.has_header("x-original-url"));

    // the spoofed https did not make an https entry: a plain request hits the same one
    let plain = RawConn::connect(lacquer.addr()).get("/page", &[]);
    assert_eq!(plain.text(), "proto=http host=test");
    assert_eq!(origin.hits_for("/page"), 1);

    // the log names the peer, not the address the client claimed
    let logged = poll_until(Duration::from_secs(10), || {
        lacquer.stdout_log().lines().count() >= 2
    });
    assert!(logged);
    assert!(
        lacquer
            .stdout_log()
            .lines()
            .all(|l| l.starts_with("127.0.0.1 ")),
        "{}",
        lacquer.stdout_log()
    );
}

#[test]
fn a_trusted_proxy_reports_client_scheme_and_host() {
    let origin = telling_origin();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[proxy]\ntrusted_proxies = [\"127.0.0.0/8\"]\n[cache]\npurge_from = [\"203.0.113.0/24\"]",
    );
    let from_lb = [
        ("X-Forwarded-For", "198.51.100.1, 203.0.113.9"),
        ("X-Forwarded-Proto", "https"),
        ("X-Forwarded-Host", "www.example"),
    ];
    let resp = RawConn::connect(lacquer.addr()).get("/page", &from_lb);
    assert_eq!(resp.text(), "proto=https host=www.example");
    let seen = origin.last_request().unwrap();
    assert_eq!(
        seen.header("x-forwarded-for"),
        Some("198.51.100.1, 203.0.113.9, 127.0.0.1")
    );
    assert_eq!(seen.header("x-forwarded-proto"), Some("https"));

    // the scheme is in the key: the http page of the same URL is its own entry
    let http = [("X-Forwarded-Proto", "http"), ("X-Forwarded-Host", "test")];
    let resp = RawConn::connect(lacquer.addr()).get("/page", &http);
    assert_eq!(resp.text(), "proto=http host=test");
    assert_eq!(origin.hits_for("/page"), 2);
    let again = RawConn::connect(lacquer.addr()).get("/page", &from_lb);
    assert_eq!(again.text(), "proto=https host=www.example");
    assert_eq!(origin.hits_for("/page"), 2, "each scheme's entry is a hit");

    // purge_from judges the client the trusted proxy names, not the proxy
    let purge = |client: &str| {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(
            format!("PURGE /page HTTP/1.1\r\nHost: test\r\nX-Forwarded-For: {client}\r\n\r\n")
                .as_bytes(),
        );
        conn.read_response(false).status
    };
    assert_eq!(purge("198.51.100.1"), 405);
    assert_eq!(purge("203.0.113.9"), 200);
    // one PURGE removes the page of both schemes
    RawConn::connect(lacquer.addr()).get("/page", &from_lb);
    RawConn::connect(lacquer.addr()).get("/page", &http);
    assert_eq!(origin.hits_for("/page"), 4);

    let logged = poll_until(Duration::from_secs(10), || {
        lacquer
            .stdout_log()
            .lines()
            .any(|l| l.starts_with("203.0.113.9 "))
    });
    assert!(logged, "the log names the client: {}", lacquer.stdout_log());
}

#[test]
fn without_trust_purge_from_sees_the_peer() {
    let origin = telling_origin();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[cache]\npurge_from = [\"203.0.113.0/24\"]",
    );
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(b"PURGE /page HTTP/1.1\r\nHost: test\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n");
    assert_eq!(conn.read_response(false).status, 405);
}

/// Starts lacquer with one plain listener that expects a PROXY header, and the origin.
fn behind_proxy_protocol(origin: &TestOrigin) -> LacquerProcess {
    LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port} proxy_protocol\"]\nupstream = \"{}\"\nthreads = 2\n",
            origin.addr()
        )
    })
}

/// Sends `header` then a GET on a new connection; the response, if any came.
fn get_after(lacquer: &LacquerProcess, header: &[u8], path: &str) -> Option<RawResponse> {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(header);
    conn.send(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
    conn.try_read_response(false).ok()
}

#[test]
fn proxy_protocol_v1_and_v2_name_the_client() {
    let origin = telling_origin();
    let lacquer = behind_proxy_protocol(&origin);
    let port = lacquer.port();

    let v1 = format!("PROXY TCP4 198.51.100.7 127.0.0.1 40000 {port}\r\n");
    let resp = get_after(&lacquer, v1.as_bytes(), "/v1").expect("an answer");
    assert_eq!(resp.status, 200);
    assert_eq!(
        origin.last_request().unwrap().header("x-forwarded-for"),
        Some("198.51.100.7")
    );

    // v2, TCP over IPv6 from 2001:db8::42 port 4711
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    v2.extend_from_slice(&[0x21, 0x21, 0, 36]);
    let client: std::net::Ipv6Addr = "2001:db8::42".parse().unwrap();
    v2.extend_from_slice(&client.octets());
    v2.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
    v2.extend_from_slice(&4711u16.to_be_bytes());
    v2.extend_from_slice(&port.to_be_bytes());
    let resp = get_after(&lacquer, &v2, "/v2").expect("an answer");
    assert_eq!(resp.status, 200);
    assert_eq!(
        origin.last_request().unwrap().header("x-forwarded-for"),
        Some("2001:db8::42")
    );

    // a connection without the header is closed unanswered
    assert!(get_after(&lacquer, b"", "/none").is_none());
    assert_eq!(origin.hits_for("/none"), 0);

    let logged = poll_until(Duration::from_secs(10), || {
        let log = lacquer.stdout_log();
        log.lines().any(|l| l.starts_with("198.51.100.7 "))
            && log.lines().any(|l| l.starts_with("2001:db8::42 "))
    });
    assert!(logged, "{}", lacquer.stdout_log());
}

#[test]
fn proxy_protocol_comes_before_tls_and_the_scheme_is_https() {
    let origin = telling_origin();
    let dir = TempDir::new("lacquer-pp-tls");
    let tls = self_signed_cert(dir.path());
    let tls_port = free_port();
    let _lacquer = LacquerProcess::start_simple(
        origin.addr(),
        &format!(
            "[log]\naccess = \"off\"\n{}",
            tls.tls_toml(&format!("127.0.0.1:{tls_port} proxy_protocol"))
        ),
    );
    // a real TLS client (Python's ssl) on a socket that first carries a v1 header
    let script = format!(
        "import socket, ssl\n\
         s = socket.create_connection(('127.0.0.1', {tls_port}))\n\
         s.sendall(b'PROXY TCP4 198.51.100.8 127.0.0.1 40000 {tls_port}\\r\\n')\n\
         ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n\
         ctx.set_alpn_protocols(['http/1.1'])\n\
         t = ctx.wrap_socket(s)\n\
         t.sendall(b'GET /tls HTTP/1.1\\r\\nHost: test\\r\\nConnection: close\\r\\n\\r\\n')\n\
         out = b''\n\
         while True:\n\
         \x20   d = t.recv(65536)\n\
         \x20   if not d: break\n\
         \x20   out += d\n\
         print(out.decode())\n"
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("python3 is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "{text}{}",
        stderr_text(&out)
    );
    assert!(text.ends_with("proto=https host=test\n"), "{text}");
    assert_eq!(
        origin.last_request().unwrap().header("x-forwarded-for"),
        Some("198.51.100.8")
    );
}
