//! Passes forwarded directly (`proxy.direct_passes`, on by default): a POST, a GET of a URL last
//! answered `no-store`, everything with the cache off go over Lacquer's own HTTP/1 exchange and
//! pool of idle origin connections. What the client and the origin see must be what the
//! standard path (`direct_passes = false`) gives, and the pool must never hand a request a
//! connection that is closed or holds bytes the origin sent unasked.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use support::*;

/// A node with an admin listener (for `/metrics`) in front of `origin`.
fn node(origin: SocketAddr, direct: bool, extra: &str) -> (LacquerProcess, u16) {
    let admin = free_port();
    let lacquer = LacquerProcess::start_simple(
        origin,
        &format!(
            "[admin]\nlisten = \"127.0.0.1:{admin}\"\n[log]\naccess = \"off\"\n\
             [proxy]\ndirect_passes = {direct}\n{extra}"
        ),
    );
    (lacquer, admin)
}

/// `lacquer_direct_passes_total`, once it reads `expected` or 5 s have passed (a request is
/// counted when it is logged, just after its answer went out).
async fn direct_passes(admin: u16, expected: f64) -> f64 {
    value_when(admin, "lacquer_direct_passes_total", expected).await
}

/// What a client sees of an answer, minus what differs between any two answers (`Date`, the
/// origin's request count).
fn seen(resp: &Resp) -> (u16, Vec<(String, String)>, Vec<u8>) {
    resp.seen_except(&["date", "x-origin-count"])
}

#[tokio::test]
async fn passes_go_direct_and_answer_exactly_as_the_standard_path_does() {
    // one origin each, so that the bodies' request counts agree
    let origins = [scripted_origin(), scripted_origin()];
    let (direct, direct_admin) = node(origins[0].addr(), true, "");
    let (standard, standard_admin) = node(origins[1].addr(), false, "");
    let nostore = format!("/nostore?cc={}&hdr=X-Kept:1", q("no-store"));
    let private = format!("/private?cc={}", q("private, max-age=60"));
    let mut answers = Vec::new();
    for lacquer in [&direct, &standard] {
        let mut seen_here = Vec::new();
        for path in [&nostore, &nostore, &private, &private] {
            seen_here.push(seen(&get(&lacquer.url(path), &[]).await));
        }
        let form = post(
            &lacquer.url("/form?unsafe_status=201"),
            &[("content-type", "application/x-www-form-urlencoded")],
            "a=1&b=2",
        )
        .await;
        assert_eq!(form.status, 201);
        seen_here.push(seen(&form));
        let head = head(&lacquer.url(&nostore), &[]).await;
        seen_here.push(seen(&head));
        answers.push(seen_here);
    }
    assert_eq!(answers[0], answers[1], "direct (left) and standard (right)");
    // the second asks of each remembered URL and the POST went direct (a HEAD takes the
    // standard path, which asks the origin for the whole answer)
    assert_eq!(direct_passes(direct_admin, 3.0).await, 3.0);
    assert_eq!(direct_passes(standard_admin, 0.0).await, 0.0);
    for origin in &origins {
        let form = origin.requests_for("/form?unsafe_status=201");
        assert_eq!(form.len(), 1);
        assert_eq!(&form[0].body[..], b"a=1&b=2");
    }
}

#[tokio::test]
async fn with_the_cache_off_every_request_goes_direct() {
    let origin = scripted_origin();
    let (lacquer, admin) = node(origin.addr(), true, "[cache]\nenabled = false\n");
    for n in 0..5 {
        let resp = get(&lacquer.url(&format!("/page?n={n}")), &[]).await;
        assert_eq!(resp.status, 200);
        assert!(
            resp.text().starts_with(&format!("/page?n={n} #")),
            "{}",
            resp.text()
        );
        assert_eq!(
            resp.cache_fwd().as_deref(),
            Some("bypass"),
            "{:?}",
            resp.cache_status()
        );
    }
    assert_eq!(direct_passes(admin, 5.0).await, 5.0);
}

#[tokio::test]
async fn request_bodies_arrive_whole_at_the_limit_and_beyond_it() {
    let origin = scripted_origin();
    let (lacquer, admin) = node(origin.addr(), true, "");
    // 64 KiB is read whole and forwarded directly; one byte more takes the standard path
    for (i, len) in [0usize, 1, 65_536, 65_537].into_iter().enumerate() {
        let body: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
        let path = format!("/upload/{i}");
        let resp = post(&lacquer.url(&path), &[], body.clone()).await;
        assert_eq!(resp.status, 200, "{len} bytes");
        let got = origin.requests_for(&path);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body.len(), len);
        assert!(got[0].body == body, "{len} bytes arrived changed");
    }
    assert_eq!(direct_passes(admin, 3.0).await, 3.0);
}

/// An origin that answers every request on a connection with `answer(n)` (n counting
/// requests over every connection) and keeps the connection open for the next.
struct KeepAliveOrigin {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl KeepAliveOrigin {
    fn start(answer: impl Fn(usize) -> Vec<u8> + Send + Sync + 'static) -> KeepAliveOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        let answer = Arc::new(answer);
        let requests = Arc::new(AtomicUsize::new(0));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                count.fetch_add(1, Ordering::SeqCst);
                let (answer, requests) = (answer.clone(), requests.clone());
                std::thread::spawn(move || serve(stream, &*answer, &requests));
            }
        });
        KeepAliveOrigin { addr, connections }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Answers each request head (and its `Content-Length` body) read from `stream` until the
/// client closes.
fn serve(
    mut stream: TcpStream,
    answer: &(dyn Fn(usize) -> Vec<u8> + Send + Sync),
    n: &AtomicUsize,
) {
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(got) => pending.extend_from_slice(&buf[..got]),
            }
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).to_ascii_lowercase();
        let body_len: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while pending.len() < head_end + body_len {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(got) => pending.extend_from_slice(&buf[..got]),
            }
        }
        pending.drain(..head_end + body_len);
        let nth = n.fetch_add(1, Ordering::SeqCst) + 1;
        if stream.write_all(&answer(nth)).is_err() {
            return;
        }
    }
}

fn answer_with(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn direct_passes_share_one_kept_alive_origin_connection() {
    let origin = KeepAliveOrigin::start(|n| answer_with(&format!("answer {n}")));
    let (lacquer, admin) = node(origin.addr, true, "");
    let client = http_client();
    for n in 1..=20 {
        let resp = client
            .post(lacquer.url("/form"))
            .body("x=1")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), format!("answer {n}"));
    }
    assert_eq!(direct_passes(admin, 20.0).await, 20.0);
    assert_eq!(
        origin.connections(),
        1,
        "every pass went over one connection"
    );
}

#[tokio::test]
async fn bytes_an_origin_sends_after_its_answer_never_answer_another_request() {
    // the first answer carries a whole second response after its body; an origin must not,
    // and what it smuggled must not become the answer to the next request
    let origin = KeepAliveOrigin::start(|n| match n {
        1 => {
            let mut both = answer_with("first");
            both.extend_from_slice(&answer_with("SMUGGLED"));
            both
        }
        n => answer_with(&format!("answer {n}")),
    });
    let (lacquer, _admin) = node(origin.addr, true, "");
    let first = post(&lacquer.url("/form"), &[], "a").await;
    assert_eq!(first.text(), "first");
    for _ in 0..5 {
        // each on a new client connection, so the proxy's own pool is what could mix them up
        let next = post(&lacquer.url("/form"), &[], "b").await;
        assert_eq!(next.status, 200);
        assert!(next.text().starts_with("answer "), "got {:?}", next.text());
    }
}

#[tokio::test]
async fn unasked_bytes_arriving_on_an_idle_connection_discard_it() {
    // the origin answers, then, a moment later, writes more on the idle connection
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(got) => head.extend_from_slice(&buf[..got]),
                    }
                }
                let _ = stream.write_all(&answer_with(&format!("connection {n}")));
                std::thread::sleep(Duration::from_millis(100));
                let _ = stream.write_all(&answer_with("UNASKED"));
                std::thread::sleep(Duration::from_secs(5));
            });
        }
    });
    let (lacquer, _admin) = node(addr, true, "");
    assert_eq!(
        post(&lacquer.url("/f"), &[], "a").await.text(),
        "connection 1"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = post(&lacquer.url("/f"), &[], "b").await;
    assert_eq!(second.text(), "connection 2");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_idle_connection_the_origin_closed_is_not_used() {
    // the origin closes each connection a moment after answering on it (its keep-alive
    // timeout is shorter than the proxy's)
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let n = count.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(got) => head.extend_from_slice(&buf[..got]),
                    }
                }
                let _ = stream.write_all(&answer_with(&format!("connection {n}")));
                std::thread::sleep(Duration::from_millis(50));
            });
        }
    });
    let (lacquer, admin) = node(addr, true, "");
    for n in 1..=4 {
        // a POST is never retried: it must not be sent over a connection already closed
        let resp = post(&lacquer.url("/f"), &[], "a").await;
        assert_eq!(resp.status, 200, "request {n}: {}", resp.text());
        assert_eq!(resp.text(), format!("connection {n}"));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(direct_passes(admin, 4.0).await, 4.0);
}

#[tokio::test]
async fn a_direct_pass_to_a_dead_or_silent_origin_is_answered_502_or_504() {
    let dead = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (lacquer, _admin) = node(dead, true, "");
    let resp = post(&lacquer.url("/f"), &[], "a").await;
    assert_eq!(resp.status, 502);
    let silent = RawOrigin::hanging();
    let (lacquer, _admin) = node(
        silent.addr,
        true,
        "[balancer.timeouts]\nfirst_byte = \"300ms\"\nidle = \"300ms\"\n",
    );
    let resp = post(&lacquer.url("/f"), &[], "a").await;
    assert_eq!(resp.status, 504);
}

/// An origin that reads one request head, then answers nothing and waits for the proxy to close
/// the connection; `(address, head read, connection closed by the proxy)`.
fn silent_until_closed() -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads, closes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (h, c) = (heads.clone(), closes.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let (h, c) = (h.clone(), c.clone());
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(got) => seen.extend_from_slice(&buf[..got]),
                    }
                }
                h.fetch_add(1, Ordering::SeqCst);
                stream
                    .set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                c.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, heads, closes)
}

#[test]
fn a_client_that_leaves_before_the_answer_frees_the_origin_connection() {
    for direct in [true, false] {
        let (origin, heads, closes) = silent_until_closed();
        let (lacquer, _admin) = node(origin, direct, "");
        for (n, request) in [
            &b"POST /slow HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\na"[..],
            b"DELETE /slow HTTP/1.1\r\nHost: t\r\n\r\n",
        ]
        .into_iter()
        .enumerate()
        {
            let mut client = RawConn::connect(lacquer.addr());
            client.send(request);
            assert!(
                poll_until(Duration::from_secs(10), || heads.load(Ordering::SeqCst) > n),
                "the request reached the origin (direct: {direct})"
            );
            drop(client);
            // the proxy notices at once (well before the origin's 60 s read timeout) and closes
            // its connection to the origin
            assert!(
                poll_until(Duration::from_secs(10), || closes.load(Ordering::SeqCst)
                    > n),
                "the origin connection was closed after the client left (direct: {direct})"
            );
        }
    }
}

/// An origin that answers each connection's first request with `answer` and then closes it
/// (each answer says so with `Connection: close`, or has no length: an origin that closes a
/// kept-alive connection unannounced races the next request sent on it, which for a POST is a
/// 502 on either path, as with nginx).
fn answering_then_closing(answer: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(got) => seen.extend_from_slice(&buf[..got]),
                    }
                }
                let _ = stream.write_all(answer);
            });
        }
    });
    addr
}

#[test]
fn every_response_framing_reaches_the_client_whole_on_a_connection_that_stays_usable() {
    let cases: [(&[u8], u16, &str); 4] = [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
            200,
            "hello world",
        ),
        // HTTP/1.0 style: no length, the body ends when the origin closes
        (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close", 200, "until the close"),
        (b"HTTP/1.1 204 No Content\r\nX-Done: 1\r\nConnection: close\r\n\r\n", 204, ""),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", 200, ""),
    ];
    for (answer, status, body) in cases {
        let origin = answering_then_closing(answer);
        let lacquer = LacquerProcess::start_simple(origin, "[log]\naccess = \"off\"");
        let mut client = RawConn::connect(lacquer.addr());
        for _ in 0..2 {
            // a POST goes direct; the second one shows the client's connection survived
            client.send(b"POST /f HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\na");
            let resp = client.read_response(false);
            assert_eq!(resp.status, status, "{}", String::from_utf8_lossy(answer));
            assert_eq!(resp.text(), body, "{}", String::from_utf8_lossy(answer));
        }
    }
}

#[tokio::test]
async fn a_head_never_stores_an_empty_body_for_a_url_that_turned_storable() {
    let cacheable = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = cacheable.clone();
    let origin = TestOrigin::start(move |req| {
        let cc = if flag.load(Ordering::SeqCst) {
            "max-age=60"
        } else {
            "no-store"
        };
        let body = if req.method == "HEAD" { "" } else { "the page" };
        OriginResponse::ok(body).header("cache-control", cc)
    });
    let (lacquer, _admin) = node(origin.addr(), true, "");
    let url = lacquer.url("/turns-storable");
    for _ in 0..2 {
        assert_eq!(get(&url, &[]).await.text(), "the page");
    }
    cacheable.store(true, Ordering::SeqCst);
    // the first request after the change is a HEAD: whatever it stores, a GET must get the page
    assert_eq!(head(&url, &[]).await.status, 200);
    for _ in 0..2 {
        let resp = get(&url, &[]).await;
        assert_eq!(resp.status, 200);
        assert_eq!(resp.text(), "the page", "{:?}", resp.cache_status());
    }
}

#[tokio::test]
async fn an_http2_clients_passes_go_direct_and_answer_as_the_standard_path_does() {
    let origins = [scripted_origin(), scripted_origin()];
    let (direct, direct_admin) = node(origins[0].addr(), true, "");
    let (standard, standard_admin) = node(origins[1].addr(), false, "");
    let nostore = format!("/h2/nostore?cc={}", q("no-store"));
    let mut answers = Vec::new();
    for lacquer in [&direct, &standard] {
        let client = h2c_client();
        let mut seen_here = Vec::new();
        for (method, path, body) in [
            ("GET", nostore.as_str(), None),
            ("GET", nostore.as_str(), None),
            (
                "POST",
                "/h2/form",
                Some(bytes::Bytes::from_static(b"x=1&y=2")),
            ),
        ] {
            let resp = send(&client, method, &lacquer.url(path), &[], body)
                .await
                .unwrap();
            assert_eq!(resp.version, reqwest::Version::HTTP_2);
            seen_here.push(seen(&resp));
        }
        answers.push(seen_here);
    }
    assert_eq!(answers[0], answers[1], "direct (left) and standard (right)");
    // the remembered URL's second GET and the POST
    assert_eq!(direct_passes(direct_admin, 2.0).await, 2.0);
    assert_eq!(direct_passes(standard_admin, 0.0).await, 0.0);
    for origin in &origins {
        let form = origin.requests_for("/h2/form");
        assert_eq!(form.len(), 1);
        assert_eq!(&form[0].body[..], b"x=1&y=2");
        // the request's :authority reached the HTTP/1 origin as Host
        assert_eq!(
            form[0].header("host"),
            Some(format!(
                "127.0.0.1:{}",
                if std::ptr::eq(origin, &origins[0]) {
                    direct.port()
                } else {
                    standard.port()
                }
            ))
            .as_deref()
        );
    }
}
