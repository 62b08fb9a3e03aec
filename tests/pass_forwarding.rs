//! Every way a pass is forwarded, run against two nodes over real sockets: one with
//! `proxy.direct_passes = true` (passes go over `src/proxy/direct_pass.rs`), one with `false`
//! (passes go through Pingora's proxy phases). Each case sends the same bytes to both, from a raw
//! client, to origins of its own on real sockets, and asserts that the client saw the same
//! answers (status, fields, body, whether the connection stayed usable), that the origin received
//! the same requests (method, target, fields, body, how its connection ended), and that what both
//! did is right. `lacquer_direct_passes_total` shows which path each node took: it rises only on
//! the direct node, by exactly the requests that qualify for a direct pass, so each case is known
//! to have exercised both paths (or, where a request never qualifies, neither).

use lacquer_test_support as support;

use std::fmt::Debug;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::*;

// ---------------------------------------------------------------------------------------------
// the two nodes

/// One node of a pair (`proxy.direct_passes` on or off) and its admin port.
struct Node {
    lacquer: LacquerProcess,
    admin: u16,
}

/// Starts the direct node (index 0) in front of `origins[0]` and the standard one (index 1) in
/// front of `origins[1]`, alike but for `proxy.direct_passes`; `proxy` is more `[proxy]` keys,
/// `tables` more tables.
fn pair(origins: [SocketAddr; 2], proxy: &str, tables: &str) -> [Node; 2] {
    let start = |direct: bool, origin: SocketAddr| {
        let (lacquer, admin) = LacquerProcess::start_simple_with_admin(
            origin,
            &format!(
                "[log]\naccess = \"off\"\n[proxy]\ndirect_passes = {direct}\n{proxy}\n{tables}\n"
            ),
        );
        Node { lacquer, admin }
    };
    // started side by side: a start is most of a case's time
    std::thread::scope(|scope| {
        let direct = scope.spawn(|| start(true, origins[0]));
        let standard = start(false, origins[1]);
        [direct.join().expect("the direct node started"), standard]
    })
}

/// Runs `case` on the direct node and on the standard one, side by side (each has origins of
/// its own), and asserts both saw the same; returns what they saw.
fn same<T: PartialEq + Debug + Send>(
    nodes: &[Node; 2],
    case: impl Fn(&Node, usize) -> T + Sync,
) -> T {
    let (direct, standard) = std::thread::scope(|scope| {
        let direct = scope.spawn(|| case(&nodes[0], 0));
        let standard = case(&nodes[1], 1);
        (direct.join().expect("the direct node's run"), standard)
    });
    assert_eq!(
        direct, standard,
        "the direct pass (left) and the standard path (right) differ"
    );
    direct
}

/// `lacquer_direct_passes_total` of a node, read from its admin listener's `/metrics`.
fn direct_passes(node: &Node) -> f64 {
    let answer = raw_request(
        local_addr(node.admin),
        b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n",
    );
    let resp = parse_response(&answer, false).expect("an answer from /metrics");
    assert_eq!(resp.status, 200, "{}", resp.text());
    Scrape { text: resp.text() }.value("lacquer_direct_passes_total")
}

/// Asserts that the direct node counted exactly `expected` direct passes and the standard node
/// none. A request is counted when it is logged, just after its answer left, so the direct node
/// is polled (bounded) until it reaches the number; the standard node is read after that.
fn assert_direct_passes(nodes: &[Node; 2], expected: usize) {
    let expected = expected as f64;
    let mut counted = direct_passes(&nodes[0]);
    poll_until(Duration::from_secs(10), || {
        counted = direct_passes(&nodes[0]);
        counted >= expected
    });
    assert_eq!(
        counted, expected,
        "direct passes counted by the direct node"
    );
    // a late count would show up as more than `expected`
    assert_eq!(direct_passes(&nodes[0]), expected);
    assert_eq!(
        direct_passes(&nodes[1]),
        0.0,
        "the standard node never forwards directly"
    );
}

// ---------------------------------------------------------------------------------------------
// what the client sees

/// One answer as the client read it: status, fields in order (less `Date`, which the origin sets
/// from its clock), body.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    /// The minor version of the status line (`1`: HTTP/1.1).
    version: u8,
    status: u16,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn of(resp: RawResponse) -> Answer {
        Answer {
            version: resp.version,
            status: resp.status,
            fields: resp
                .headers
                .into_iter()
                .filter(|(name, _)| !name.eq_ignore_ascii_case("date"))
                .collect(),
            body: resp.body,
        }
    }

    fn field(&self, name: &str) -> Option<&str> {
        support::fields::field(&self.fields, name)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// What a client saw on one connection: each answer (or why none could be read whole), and
/// whether the connection then still carried a request.
#[derive(Debug, Clone, PartialEq)]
struct ClientView {
    answers: Vec<Result<Answer, String>>,
    usable: bool,
}

impl ClientView {
    /// The `i`-th answer, which must have been read whole.
    fn answer(&self, i: usize) -> &Answer {
        match &self.answers[i] {
            Ok(answer) => answer,
            Err(e) => panic!("answer {i} was not read whole: {e}"),
        }
    }
}

/// A request the proxy answers itself, without the origin (a PURGE from loopback, which
/// `cache.purge_from` allows): whether the connection still carries one after a case's answers.
const PROBE: &[u8] = b"PURGE /connection-probe HTTP/1.1\r\nHost: probe.example\r\n\r\n";

/// Whether `conn` still carries a request and its answer.
fn usable(conn: &mut RawConn) -> bool {
    conn.try_send(PROBE).is_ok() && conn.try_read_response(false).is_ok()
}

/// Sends each request on one connection and reads its answer before the next (`true`: a HEAD);
/// stops at the first answer that cannot be read whole.
fn one_by_one(node: &Node, requests: &[(&[u8], bool)]) -> ClientView {
    let mut conn = RawConn::connect(node.lacquer.addr());
    let mut answers = Vec::new();
    for (request, head) in requests {
        if let Err(e) = conn.try_send(request) {
            answers.push(Err(format!("sending: {e}")));
            break;
        }
        match conn.try_read_response(*head) {
            Ok(resp) => answers.push(Ok(Answer::of(resp))),
            Err(e) => {
                answers.push(Err(e));
                break;
            }
        }
    }
    let usable = answers.iter().all(Result::is_ok) && usable(&mut conn);
    ClientView { answers, usable }
}

/// Sends all `requests` in one write (pipelined) and reads `n` answers.
fn pipelined(node: &Node, requests: &[u8], n: usize) -> ClientView {
    let mut conn = RawConn::connect(node.lacquer.addr());
    conn.send(requests);
    let mut answers = Vec::new();
    for _ in 0..n {
        match conn.try_read_response(false) {
            Ok(resp) => answers.push(Ok(Answer::of(resp))),
            Err(e) => {
                answers.push(Err(e));
                break;
            }
        }
    }
    let usable = answers.iter().all(Result::is_ok) && usable(&mut conn);
    ClientView { answers, usable }
}

/// A request with a `Content-Length` body, `Host: shop.example`, and `fields` (`"Name: value"`).
fn sized(method: &str, target: &str, fields: &[&str], body: &[u8]) -> Vec<u8> {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: shop.example\r\n");
    for field in fields {
        req.push_str(field);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A request without a body (no framing fields), `Host: shop.example`, and `fields`.
fn bodiless(method: &str, target: &str, fields: &[&str]) -> Vec<u8> {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: shop.example\r\n");
    for field in fields {
        req.push_str(field);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    req.into_bytes()
}

// ---------------------------------------------------------------------------------------------
// what the origin sees

/// One request as a [`TestOrigin`] received it. `Accept-Encoding` is left out of a GET's:
/// a known difference (`direct_pass.rs`'s module doc): the standard path asks for its own coding
/// (gzip) whenever it may store, which it may for a GET of a URL remembered uncacheable, while a
/// direct pass forwards the client's; the cases below send none, and
/// `a_remembered_urls_get_carries_the_clients_accept_encoding` pins the difference itself.
#[derive(Debug, Clone, PartialEq)]
struct Received {
    method: String,
    target: String,
    version: u8,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn field(&self, name: &str) -> Option<&str> {
        support::fields::field(&self.fields, name)
    }

    fn has(&self, name: &str) -> bool {
        support::fields::has_field(&self.fields, name)
    }
}

/// Every request `origin` received, in order.
fn received(origin: &TestOrigin) -> Vec<Received> {
    origin
        .requests()
        .into_iter()
        .map(|req| Received {
            fields: req
                .headers
                .iter()
                .filter(|(name, _)| {
                    !(req.method == "GET" && name.eq_ignore_ascii_case("accept-encoding"))
                })
                .cloned()
                .collect(),
            method: req.method,
            target: req.path,
            version: req.version,
            body: req.body.to_vec(),
        })
        .collect()
}

/// What every forwarded request must carry: the client's host, the proxy's `Via`, the client's
/// address in `X-Forwarded-For`, and no field about the client's connection.
fn assert_forwarded(req: &Received) {
    assert_eq!(req.field("host"), Some("shop.example"), "{req:?}");
    assert_eq!(req.field("via"), Some("1.1 lacquer"), "{req:?}");
    assert_eq!(req.field("x-forwarded-for"), Some("127.0.0.1"), "{req:?}");
    for hop in ["keep-alive", "proxy-connection", "te", "upgrade", "trailer"] {
        assert!(!req.has(hop), "{hop} reached the origin: {req:?}");
    }
}

/// An origin answering every request `200` with `Cache-Control: no-store` and the body
/// `"{method} {target} {body length}"` (the length also in `X-Body-Length`).
fn echo_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        OriginResponse::ok(format!("{} {} {}", req.method, req.path, req.body.len()))
            .header("Cache-Control", "no-store")
            .header("Content-Type", "text/plain")
            .header("X-Body-Length", req.body.len().to_string())
    })
}

/// What an origin at the socket level does with a connection once it has written its answer.
enum Then {
    /// Read the next request on it.
    KeepOpen,
    /// Close it.
    Close,
    /// Write nothing more and wait (at most 30 s) for the proxy to close it.
    HoldUntilClosed,
}

/// An origin at the socket level: reads each request whole (head and `Content-Length` body),
/// keeps its bytes, and lets `answer(n, head, stream)` (n counting requests to the target, from
/// 1) write whatever it likes; counts the connections the proxy closed while held.
struct SocketOrigin {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    closed_by_proxy: Arc<AtomicUsize>,
}

type Answering = dyn Fn(usize, &str, &mut TcpStream) -> Then + Send + Sync;

impl SocketOrigin {
    fn start(answer: impl Fn(usize, &str, &mut TcpStream) -> Then + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind socket origin");
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let closed_by_proxy = Arc::new(AtomicUsize::new(0));
        let answer: Arc<Answering> = Arc::new(answer);
        let per_target = Arc::new(Mutex::new(std::collections::HashMap::<String, usize>::new()));
        let (kept, closed) = (requests.clone(), closed_by_proxy.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (answer, kept, closed, per_target) = (
                    answer.clone(),
                    kept.clone(),
                    closed.clone(),
                    per_target.clone(),
                );
                std::thread::spawn(move || {
                    serve_socket(stream, &*answer, &kept, &closed, &per_target)
                });
            }
        });
        SocketOrigin {
            addr,
            requests,
            closed_by_proxy,
        }
    }

    /// Every request received (head and body), as text, in order; a GET's `Accept-Encoding`
    /// left out (the known difference, see [`Received`]).
    fn requests(&self) -> Vec<String> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .map(|bytes| {
                let text = String::from_utf8_lossy(bytes);
                if !text.starts_with("GET ") {
                    return text.into_owned();
                }
                text.split_inclusive("\r\n")
                    .filter(|line| !line.to_ascii_lowercase().starts_with("accept-encoding:"))
                    .collect()
            })
            .collect()
    }

    fn request_count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }

    fn closed_by_proxy(&self) -> usize {
        self.closed_by_proxy.load(Ordering::SeqCst)
    }
}

fn serve_socket(
    mut stream: TcpStream,
    answer: &Answering,
    kept: &Mutex<Vec<Vec<u8>>>,
    closed: &AtomicUsize,
    per_target: &Mutex<std::collections::HashMap<String, usize>>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut pending = Vec::new();
    let mut buf = [0u8; 16 * 1024];
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
        let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
        let body_len: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        while pending.len() < head_end + body_len {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(got) => pending.extend_from_slice(&buf[..got]),
            }
        }
        let request: Vec<u8> = pending.drain(..head_end + body_len).collect();
        kept.lock().unwrap().push(request);
        let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
        let nth = {
            let mut seen = per_target.lock().unwrap();
            let count = seen.entry(target).or_insert(0);
            *count += 1;
            *count
        };
        match answer(nth, &head, &mut stream) {
            Then::KeepOpen => continue,
            Then::Close => {
                let _ = stream.flush();
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            Then::HoldUntilClosed => {
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            return
                        }
                        Err(_) => break,
                    }
                }
                closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
    }
}

/// One request as a [`CaptureOrigin`] framed it: its request line, framing fields and body bytes
/// (chunk framing included) exactly as received.
#[derive(Debug, Clone, PartialEq)]
struct Captured {
    line: String,
    transfer_encoding: Vec<String>,
    content_length: Vec<String>,
    body: Vec<u8>,
}

/// Every request `origin` framed, in order.
fn captured(origin: &CaptureOrigin) -> Vec<Captured> {
    origin
        .requests()
        .iter()
        .map(|req| Captured {
            line: req.request_line(),
            transfer_encoding: req.field_values("transfer-encoding"),
            content_length: req.field_values("content-length"),
            body: req.body.clone(),
        })
        .collect()
}

/// The target of a request head (`"POST /a HTTP/1.1..."` → `"/a"`).
fn target_of(head: &str) -> &str {
    head.split_whitespace().nth(1).unwrap_or("")
}

// ---------------------------------------------------------------------------------------------
// request bodies and methods

#[test]
fn unsafe_methods_with_sized_and_empty_bodies_reach_the_origin_whole() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let binary: Vec<u8> = (0..=255u8)
        .chain(b"\r\n\r\nGET /x HTTP/1.1\r\n\r\n".iter().copied())
        .collect();
    let requests: Vec<(Vec<u8>, &[u8], &str)> = vec![
        (
            sized(
                "POST",
                "/form?x=1",
                &["Content-Type: application/x-www-form-urlencoded"],
                b"a=1&b=2",
            ),
            b"a=1&b=2",
            "POST",
        ),
        (
            sized("PUT", "/doc/1", &[], br#"{"put":true}"#),
            br#"{"put":true}"#,
            "PUT",
        ),
        (sized("PATCH", "/doc/1", &[], &binary), &binary, "PATCH"),
        (bodiless("DELETE", "/doc/1", &[]), b"", "DELETE"),
        (sized("DELETE", "/doc/2", &[], b"gone"), b"gone", "DELETE"),
        (sized("POST", "/empty", &[], b""), b"", "POST"),
        (bodiless("POST", "/nobody", &[]), b"", "POST"),
        (sized("OPTIONS", "/doc/1", &[], b"opt"), b"opt", "OPTIONS"),
    ];
    let (client, origin) = same(&nodes, |node, i| {
        let sent: Vec<(&[u8], bool)> = requests.iter().map(|(r, _, _)| (&r[..], false)).collect();
        (one_by_one(node, &sent), received(&origins[i]))
    });
    assert!(client.usable);
    assert_eq!(origin.len(), requests.len(), "{origin:#?}");
    for (n, ((_, body, method), got)) in requests.iter().zip(&origin).enumerate() {
        let answer = client.answer(n);
        assert_eq!(answer.status, 200);
        assert_eq!(
            answer.text(),
            format!("{method} {} {}", got.target, body.len())
        );
        assert_eq!(
            answer.field("x-body-length"),
            Some(&*body.len().to_string())
        );
        assert_eq!(got.method, *method);
        assert_eq!(&got.body[..], *body, "{method} {}", got.target);
        assert_forwarded(got);
        if !body.is_empty() {
            assert_eq!(got.field("content-length"), Some(&*body.len().to_string()));
        }
    }
    assert_direct_passes(&nodes, requests.len());
}

#[test]
fn a_chunked_request_body_with_trailers_is_streamed_whole_and_ends_where_it_ends() {
    let origins = [
        CaptureOrigin::start_answering("no-store"),
        CaptureOrigin::start_answering("no-store"),
    ];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let chunked: &[u8] = b"POST /chunked HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\
        Trailer: X-Checksum\r\n\r\n5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Checksum: abc\r\n\r\n";
    let after = sized("POST", "/after", &[], b"next");
    let (client, origin) = same(&nodes, |node, i| {
        let client = one_by_one(node, &[(chunked, false), (&after, false)]);
        let origin = captured(&origins[i]);
        (client, origin)
    });
    assert!(client.usable);
    assert_eq!(client.answer(0).status, 200);
    assert_eq!(client.answer(1).status, 200);
    // the chunked body reached the origin chunked (a body of unknown length is streamed), whole,
    // and the request after it is a request of its own
    assert_eq!(origin.len(), 2, "{origin:?}");
    assert_eq!(origin[0].line, "POST /chunked HTTP/1.1");
    assert_eq!(origin[0].transfer_encoding, ["chunked"]);
    assert!(origin[0].content_length.is_empty());
    // chunked anew: the chunk extension and the trailer section are not passed on (RFC 9112
    // 7.1.2: a recipient may discard trailer fields)
    let body = String::from_utf8_lossy(&origin[0].body).into_owned();
    assert_eq!(body, "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n");
    assert_eq!(dechunk(&origin[0].body), b"hello, world", "{body:?}");
    assert_eq!(origin[1].line, "POST /after HTTP/1.1");
    assert_eq!(origin[1].body, b"next");
    // the POST with a length went direct; the chunked one never does
    assert_direct_passes(&nodes, 1);
}

/// The data of a chunked body (extensions and trailers dropped).
fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk line");
        let line = String::from_utf8_lossy(&data[..eol]).into_owned();
        let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16).unwrap();
        data = &data[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

#[test]
fn expect_100_continue_gets_the_body_to_the_origin() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let head = b"POST /expect HTTP/1.1\r\nHost: shop.example\r\nExpect: 100-continue\r\n\
                 Content-Length: 5\r\n\r\n";
    let (interim, client, origin) = same(&nodes, |node, i| {
        let mut conn = RawConn::connect(node.lacquer.addr());
        conn.send(head);
        // a client waits for the 100 before it sends the body
        let mut got = Vec::new();
        let mut stream = conn.stream().try_clone().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let interim = String::from_utf8_lossy(&got).into_owned();
        conn.send(b"hello");
        let answer = conn.try_read_response(false).map(Answer::of);
        let usable = answer.is_ok() && usable(&mut conn);
        (
            interim,
            ClientView {
                answers: vec![answer],
                usable,
            },
            received(&origins[i]),
        )
    });
    // the origin's 100 is passed on, so the client sends its body
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim:?}");
    assert_eq!(client.answer(0).text(), "POST /expect 5");
    // the connection ends with the answer to a request with `Expect`, said so, on both paths
    // (pinned)
    assert_eq!(client.answer(0).field("connection"), Some("close"));
    assert!(!client.usable);
    assert_eq!(origin.len(), 1);
    assert_eq!(origin[0].body, b"hello");
    assert_forwarded(&origin[0]);
    // a request with `Expect` takes the standard path on both nodes; a POST without goes direct
    let control = sized("POST", "/control", &[], b"c");
    for node in &nodes {
        assert_eq!(one_by_one(node, &[(&control, false)]).answer(0).status, 200);
    }
    assert_direct_passes(&nodes, 1);
}

#[test]
fn request_bodies_up_to_a_megabyte_arrive_whole() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    // read whole and forwarded directly up to 64 KiB; streamed by the standard path beyond
    let lengths = [65_536usize, 65_537, 1 << 20];
    let bodies: Vec<Vec<u8>> = lengths.iter().map(|&len| generated_bytes(len, 7)).collect();
    let requests: Vec<Vec<u8>> = bodies
        .iter()
        .enumerate()
        .map(|(n, body)| sized("PUT", &format!("/upload/{n}"), &[], body))
        .collect();
    let (client, origin) = same(&nodes, |node, i| {
        let sent: Vec<(&[u8], bool)> = requests.iter().map(|r| (&r[..], false)).collect();
        (one_by_one(node, &sent), received(&origins[i]))
    });
    assert!(client.usable);
    for (n, body) in bodies.iter().enumerate() {
        assert_eq!(client.answer(n).status, 200);
        assert_eq!(origin[n].target, format!("/upload/{n}"));
        assert!(
            origin[n].body == *body,
            "{} bytes arrived changed",
            body.len()
        );
    }
    assert_direct_passes(&nodes, 1);
}

// ---------------------------------------------------------------------------------------------
// answers

#[test]
fn large_answers_reach_the_client_whole() {
    const LEN: usize = 3 << 20;
    let origin = || {
        TestOrigin::start(|req| {
            let mut resp = OriginResponse::generated(LEN, 3).header("Cache-Control", "no-store");
            if req.path == "/big-chunked" {
                resp = resp.header("Transfer-Encoding", "chunked");
            }
            resp
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let get = bodiless("GET", "/big-chunked", &[]);
    let post = sized("POST", "/big", &[], b"x");
    let (client, origin) = same(&nodes, |node, i| {
        // the second GET of the URL answered no-store goes direct, as does the POST
        let client = one_by_one(node, &[(&get, false), (&get, false), (&post, false)]);
        (client, received(&origins[i]))
    });
    assert!(client.usable);
    for answer in &client.answers {
        let answer = answer.as_ref().expect("a whole answer");
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body.len(), LEN);
        assert!(verify_generated(&answer.body, 3, 0));
    }
    assert_eq!(client.answer(0).field("transfer-encoding"), Some("chunked"));
    assert_eq!(
        client.answer(2).field("content-length"),
        Some(&*LEN.to_string())
    );
    assert_eq!(origin.len(), 3);
    assert_direct_passes(&nodes, 2);
}

#[test]
fn every_answer_framing_is_relayed_on_a_connection_that_stays_usable() {
    let origin = || {
        TestOrigin::start(|req| {
            let resp = match req.path.as_str() {
                "/chunked" => OriginResponse::chunked(["hello", " chunked", " world"]),
                "/close" => OriginResponse::ok(Body::CloseDelimited("until the close".into())),
                "/no-content" => OriginResponse::new(204).header("X-Done", "1"),
                "/not-modified" => OriginResponse::new(304).header("ETag", "\"v1\""),
                "/empty" => OriginResponse::ok(""),
                _ => OriginResponse::new(404),
            };
            resp.header("Cache-Control", "no-store")
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let requests: Vec<Vec<u8>> = [
        "/chunked",
        "/close",
        "/no-content",
        "/not-modified",
        "/empty",
    ]
    .iter()
    .map(|target| sized("POST", target, &[], b"a"))
    .collect();
    let client = same(&nodes, |node, _| {
        let sent: Vec<(&[u8], bool)> = requests.iter().map(|r| (&r[..], false)).collect();
        one_by_one(node, &sent)
    });
    assert!(client.usable, "{client:?}");
    let expected: [(u16, &str); 5] = [
        (200, "hello chunked world"),
        (200, "until the close"),
        (204, ""),
        (304, ""),
        (200, ""),
    ];
    for (n, (status, body)) in expected.into_iter().enumerate() {
        assert_eq!(client.answer(n).status, status, "{n}");
        assert_eq!(client.answer(n).text(), body, "{n}");
    }
    // a body that ends with the origin's close goes on chunked, so the client's connection stays
    assert_eq!(client.answer(1).field("transfer-encoding"), Some("chunked"));
    for n in [2, 3] {
        let answer = client.answer(n);
        assert!(answer.field("transfer-encoding").is_none(), "{answer:?}");
    }
    assert_direct_passes(&nodes, requests.len());
}

#[test]
fn head_answers_carry_no_body_whatever_their_length_says() {
    let origin = || {
        TestOrigin::start(|req| {
            let resp = match req.path.as_str() {
                "/chunked" => OriginResponse::chunked(["not", " sent"]),
                _ => OriginResponse::ok(vec![b'x'; 1234]),
            };
            resp.header("Cache-Control", "no-store")
        })
    };
    let origins = [origin(), origin()];
    // with the cache off a HEAD is a pass too (a HEAD of a URL remembered uncacheable takes the
    // standard path, which asks the origin for the whole GET answer)
    let nodes = pair(
        [origins[0].addr(), origins[1].addr()],
        "",
        "[cache]\nenabled = false\n",
    );
    let head_sized = bodiless("HEAD", "/sized", &[]);
    let head_chunked = bodiless("HEAD", "/chunked", &[]);
    let get = bodiless("GET", "/sized", &[]);
    let (client, origin) = same(&nodes, |node, i| {
        let client = one_by_one(
            node,
            &[(&head_sized, true), (&head_chunked, true), (&get, false)],
        );
        (client, received(&origins[i]))
    });
    assert!(client.usable);
    assert_eq!(client.answer(0).field("content-length"), Some("1234"));
    assert!(client.answer(0).body.is_empty());
    assert!(client.answer(1).body.is_empty());
    // the GET after them on the same connection is read from where the HEADs ended
    assert_eq!(client.answer(2).body, vec![b'x'; 1234]);
    assert_eq!(
        origin.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(),
        ["HEAD", "HEAD", "GET"]
    );
    assert_direct_passes(&nodes, 3);
}

/// An answer cut short by the origin's close: a `Content-Length` answer, a chunked one, and the
/// remembered uncacheable URL's second GET.
#[test]
fn an_answer_the_origin_cuts_short_never_looks_complete() {
    let origin = || {
        SocketOrigin::start(|nth, head, stream| {
            let answer: &[u8] = match (target_of(head), nth) {
                ("/remembered", 1) => {
                    b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 4\r\n\r\nfull"
                }
                ("/chunked", _) => {
                    b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nTransfer-Encoding: chunked\r\n\r\n\
                      5\r\nhello\r\n10\r\nonly part"
                }
                _ => b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 1000\r\n\r\nhello",
            };
            let _ = stream.write_all(answer);
            if nth == 1 && target_of(head) == "/remembered" {
                Then::KeepOpen
            } else {
                Then::Close
            }
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr, origins[1].addr], "", "");
    let post = sized("POST", "/sized", &[], b"a");
    let chunked = sized("POST", "/chunked", &[], b"a");
    let get = bodiless("GET", "/remembered", &[]);
    let (first, cut) = same(&nodes, |node, _| {
        let first = one_by_one(node, &[(&get, false)]);
        let cut: Vec<ClientView> = [&post, &chunked, &get]
            .into_iter()
            .map(|request| one_by_one(node, &[(request, false)]))
            .collect();
        (first, cut)
    });
    assert_eq!(first.answer(0).text(), "full");
    for view in &cut {
        // the head went out before the body was cut: the client must see the connection close
        // inside the body, never an answer that looks whole
        match &view.answers[0] {
            Err(e) => assert!(e.contains("closed"), "{e}"),
            Ok(answer) => panic!("an answer cut short looked complete: {answer:?}"),
        }
        assert!(!view.usable);
    }
    assert_direct_passes(&nodes, 3);
}

#[test]
fn an_origin_that_refuses_connections_is_answered_502() {
    // bound, never listening: refused for as long as the test holds it, and no one else's
    let refusing = RefusingPort::bind();
    let nodes = pair([refusing.addr(), refusing.addr()], "", "");
    let post = sized("POST", "/form", &[], b"a=1");
    let get = bodiless("GET", "/page", &[]);
    let (post_view, get_view) = same(&nodes, |node, _| {
        (
            one_by_one(node, &[(&post, false)]),
            one_by_one(node, &[(&get, false)]),
        )
    });
    for view in [&post_view, &get_view] {
        assert_eq!(view.answer(0).status, 502, "{view:?}");
        // the error answer is whole and the connection, between messages (the POST's body
        // read to its end), carries the next request (until 2026-12-08 it was closed, as
        // Pingora closed after every error answer; tests/error_answer_keepalive.rs)
        let answer = view.answer(0);
        assert_eq!(answer.field("connection"), Some("keep-alive"), "{answer:?}");
        assert!(view.usable, "{view:?}");
    }
    assert_direct_passes(&nodes, 1);
}

#[test]
fn an_origin_that_never_answers_is_a_504_and_its_connection_is_closed() {
    let origin = || {
        SocketOrigin::start(|nth, head, stream| {
            if target_of(head) == "/remembered" && nth == 1 {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 2\r\n\r\nok",
                );
                return Then::KeepOpen;
            }
            Then::HoldUntilClosed
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair(
        [origins[0].addr, origins[1].addr],
        // the one answer the origin gives is written at once: a second is ample for it
        "read_timeout = \"1s\"\n",
        "",
    );
    let post = sized("POST", "/slow", &[], b"a");
    let get = bodiless("GET", "/remembered", &[]);
    let (views, closed, requests) = same(&nodes, |node, i| {
        let views = vec![
            one_by_one(node, &[(&post, false)]),
            one_by_one(node, &[(&get, false)]),
            one_by_one(node, &[(&get, false)]),
        ];
        // the proxy gave up on both silent exchanges: it closed both origin connections
        let closed = poll_until(Duration::from_secs(10), || {
            origins[i].closed_by_proxy() >= 2
        });
        (
            views,
            (closed, origins[i].closed_by_proxy()),
            origins[i].requests(),
        )
    });
    assert_eq!(closed, (true, 2));
    // each request was sent once: a POST is never retried, and a timeout is not retried
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(requests[0].starts_with("POST /slow HTTP/1.1\r\n"));
    assert!(requests[0].ends_with("\r\n\r\na"));
    assert!(requests[2].starts_with("GET /remembered HTTP/1.1\r\n"));
    assert_eq!(views[0].answer(0).status, 504);
    assert_eq!(views[1].answer(0).text(), "ok");
    assert_eq!(views[2].answer(0).status, 504);
    assert_direct_passes(&nodes, 2);
}

// ---------------------------------------------------------------------------------------------
// fields

#[test]
fn hop_by_hop_fields_never_cross_the_proxy_either_way() {
    let origin = || {
        TestOrigin::start(|_| {
            OriginResponse::ok("body")
                .header("Cache-Control", "no-store")
                .header("Connection", "X-Origin-Hop")
                .header("X-Origin-Hop", "secret")
                .header("Keep-Alive", "timeout=5, max=100")
                .header("Proxy-Connection", "keep-alive")
                .header("X-Origin-Kept", "1")
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let hops = [
        "Connection: keep-alive, X-Client-Hop, x-other-hop",
        "X-Client-Hop: a",
        "X-Other-Hop: b",
        "Keep-Alive: timeout=30",
        "TE: trailers",
        "Proxy-Connection: keep-alive",
        "X-Client-Kept: 1",
    ];
    let post = sized("POST", "/hop", &hops, b"x");
    let get = bodiless("GET", "/hop-get", &hops);
    let (client, origin) = same(&nodes, |node, i| {
        let client = one_by_one(node, &[(&post, false), (&get, false), (&get, false)]);
        (client, received(&origins[i]))
    });
    assert!(client.usable);
    assert_eq!(origin.len(), 3);
    for (n, got) in origin.iter().enumerate() {
        let answer = client.answer(n);
        assert_eq!(answer.text(), "body");
        assert_eq!(answer.field("x-origin-kept"), Some("1"));
        for hop in ["x-origin-hop", "keep-alive", "proxy-connection"] {
            assert!(
                answer.field(hop).is_none(),
                "{hop} reached the client: {answer:?}"
            );
        }
        assert!(
            answer
                .field("connection")
                .is_none_or(|c| !c.to_ascii_lowercase().contains("x-origin-hop")),
            "{answer:?}"
        );
        assert_forwarded(got);
        assert_eq!(got.field("x-client-kept"), Some("1"));
        for hop in ["x-client-hop", "x-other-hop"] {
            assert!(!got.has(hop), "{hop} reached the origin: {got:?}");
        }
        assert!(
            got.field("connection")
                .is_none_or(|c| !c.to_ascii_lowercase().contains("hop")),
            "{got:?}"
        );
    }
    assert_direct_passes(&nodes, 2);
}

#[test]
fn forwarding_fields_from_an_untrusted_client_are_replaced_or_extended_alike() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let claims = [
        "X-Forwarded-For: 203.0.113.9",
        "Forwarded: for=198.51.100.7;proto=https",
        "Via: 1.0 edge",
        "X-Forwarded-Proto: https",
    ];
    let post = sized("POST", "/xff", &claims, b"x");
    let get = bodiless("GET", "/xff-get", &claims);
    let origin = same(&nodes, |node, i| {
        let client = one_by_one(node, &[(&post, false), (&get, false), (&get, false)]);
        assert!(client.usable);
        received(&origins[i])
    });
    for got in &origin {
        // the client is not a trusted proxy: its claims about the client are not believed
        assert_eq!(got.field("x-forwarded-for"), Some("127.0.0.1"), "{got:?}");
        // the client's Via is kept, and the proxy's comes after it
        let via: Vec<&str> = support::fields::field_values(&got.fields, "via");
        assert_eq!(via, ["1.0 edge", "1.1 lacquer"], "{got:?}");
        assert_eq!(got.field("x-forwarded-proto"), Some("http"), "{got:?}");
        assert!(!got.has("forwarded"), "{got:?}");
    }
    assert_direct_passes(&nodes, 2);
}

/// The one known difference in what the origin receives: the `Accept-Encoding` of a GET of a URL
/// remembered uncacheable (see `direct_pass.rs`'s module doc). Pinned, so that a change to
/// either path shows up here.
#[test]
fn a_remembered_urls_get_carries_the_clients_accept_encoding() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let get = bodiless("GET", "/coded", &["Accept-Encoding: br"]);
    let mut asked = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        one_by_one(node, &[(&get, false), (&get, false)]);
        let second = origins[i]
            .requests()
            .pop()
            .expect("the second GET reached the origin");
        asked.push(second.header("accept-encoding").map(str::to_string));
    }
    assert_eq!(asked[0].as_deref(), Some("br"), "direct: the client's");
    assert_eq!(
        asked[1].as_deref(),
        Some("gzip"),
        "standard: the cache's own"
    );
    assert_direct_passes(&nodes, 1);
}

// ---------------------------------------------------------------------------------------------
// framing attacks

#[test]
fn requests_framed_two_ways_are_refused_or_framed_one_way_and_never_smuggle() {
    let origins = [
        CaptureOrigin::start_answering("no-store"),
        CaptureOrigin::start_answering("no-store"),
    ];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let refused: [&[u8]; 4] = [
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!\
          GET /smuggled HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5, 6\r\n\r\nhello!",
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: +5\r\n\r\nhello",
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    ];
    // RFC 9112 6.1: both fields may be refused, or the body framed by the chunks alone and the
    // connection closed after the answer; Lacquer does the latter (tests/request_smuggling.rs)
    let both: &[u8] = b"POST /b HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 6\r\n\
        Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: shop.example\r\n\r\n";
    let control = sized("POST", "/control", &[], b"c");
    let (views, origin) = same(&nodes, |node, i| {
        let mut views: Vec<ClientView> = refused
            .iter()
            .map(|request| one_by_one(node, &[(request, false)]))
            .collect();
        views.push(one_by_one(node, &[(both, false)]));
        views.push(one_by_one(node, &[(&control, false)]));
        let origin = captured(&origins[i]);
        (views, origin)
    });
    for view in &views[..4] {
        assert_eq!(view.answer(0).status, 400, "{view:?}");
        assert!(!view.usable);
    }
    assert_eq!(views[4].answer(0).status, 200);
    assert!(
        !views[4].usable,
        "closed after a request with both framings"
    );
    assert_eq!(views[5].answer(0).status, 200);
    // only the chunk-framed POST and the control reached the origin; nothing was smuggled
    assert_eq!(origin.len(), 2, "{origin:?}");
    assert_eq!(origin[0].line, "POST /b HTTP/1.1");
    assert!(origin[0].content_length.is_empty(), "{origin:?}");
    assert_eq!(origin[0].transfer_encoding, ["chunked"]);
    assert_eq!(origin[0].body, b"0\r\n\r\n");
    assert_eq!(origin[1].line, "POST /control HTTP/1.1");
    assert_direct_passes(&nodes, 1);
}

#[test]
fn answers_an_origin_frames_two_ways_reach_the_client_framed_one_way() {
    let origin = || {
        SocketOrigin::start(|_, head, stream| {
            let answer: &[u8] = match target_of(head) {
                "/cl-and-te" => {
                    b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 3\r\n\
                    Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                }
                "/two-lengths" => {
                    b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 5\r\n\
                    Content-Length: 7\r\n\r\nhello!!"
                }
                _ => {
                    b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nTransfer-Encoding: chunked\r\n\
                    Trailer: X-Trailer\r\n\r\n5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"
                }
            };
            let _ = stream.write_all(answer);
            Then::Close
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr, origins[1].addr], "", "");
    let views = same(&nodes, |node, _| {
        ["/cl-and-te", "/two-lengths", "/trailer"]
            .iter()
            .map(|target| one_by_one(node, &[(&sized("POST", target, &[], b"a"), false)]))
            .collect::<Vec<_>>()
    });
    for view in &views {
        if let Ok(answer) = &view.answers[0] {
            assert!(
                answer.field("content-length").is_none()
                    || answer.field("transfer-encoding").is_none(),
                "an answer framed two ways went on: {answer:?}"
            );
        }
    }
    // both fields: framed by the chunks (RFC 9112 6.3), sent on chunked alone
    assert_eq!(views[0].answer(0).text(), "hello");
    assert_eq!(
        views[0].answer(0).field("transfer-encoding"),
        Some("chunked")
    );
    // two lengths: no way to tell where the answer ends, so none of it is passed on
    assert_eq!(views[1].answer(0).status, 502);
    // nothing of it reached the client, whose connection is between messages: kept (closed
    // until 2026-12-08, Pingora's close after any error answer)
    assert!(views[1].usable);
    // a trailer section ends the body where it ends; the connection goes on
    assert_eq!(views[2].answer(0).text(), "hello");
    assert!(views[2].usable);
    assert_direct_passes(&nodes, 3);
}

// ---------------------------------------------------------------------------------------------
// connections

#[test]
fn pipelined_requests_are_answered_in_order() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let mut requests = Vec::new();
    requests.extend(sized("POST", "/p1", &[], b"one"));
    requests.extend(sized("PUT", "/p2", &[], b"two!"));
    requests.extend(bodiless("GET", "/p3", &[]));
    requests.extend(bodiless("GET", "/p3", &[]));
    requests.extend(bodiless("DELETE", "/p4", &[]));
    requests.extend(sized("POST", "/p5", &[], b""));
    let (client, origin) = same(&nodes, |node, i| {
        (pipelined(node, &requests, 6), received(&origins[i]))
    });
    assert!(client.usable);
    let expected = [
        "POST /p1 3",
        "PUT /p2 4",
        "GET /p3 0",
        "GET /p3 0",
        "DELETE /p4 0",
        "POST /p5 0",
    ];
    for (n, text) in expected.iter().enumerate() {
        assert_eq!(client.answer(n).text(), *text);
        assert_eq!(
            format!(
                "{} {} {}",
                origin[n].method,
                origin[n].target,
                origin[n].body.len()
            ),
            *text
        );
    }
    assert_eq!(origin[0].body, b"one");
    assert_eq!(origin[1].body, b"two!");
    assert_direct_passes(&nodes, 5);
}

/// A client that sends a request, waits until the origin has it, and leaves; whether the
/// request reached the origin and whether the proxy then closed its origin connection.
fn leave_while_the_origin_is_slow(
    node: &Node,
    origin: &SocketOrigin,
    request: &[u8],
) -> (bool, bool) {
    let before = (origin.request_count(), origin.closed_by_proxy());
    let mut client = RawConn::connect(node.lacquer.addr());
    client.send(request);
    let arrived = poll_until(Duration::from_secs(10), || {
        origin.request_count() > before.0
    });
    drop(client);
    // the proxy's read timeout is the default 60 s: a close within 10 s is the proxy noticing
    // the client left
    let closed = poll_until(Duration::from_secs(10), || {
        origin.closed_by_proxy() > before.1
    });
    (arrived, closed)
}

/// An origin that answers a `/remembered` GET once (no-store) and then holds every request,
/// answering nothing, until the proxy closes the connection.
fn slow_origin() -> SocketOrigin {
    SocketOrigin::start(|nth, head, stream| {
        if target_of(head) == "/remembered" && nth == 1 {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 2\r\n\r\nok",
            );
            return Then::KeepOpen;
        }
        Then::HoldUntilClosed
    })
}

#[test]
fn a_client_that_leaves_while_the_origin_is_slow_closes_the_origin_connection() {
    let origins = [slow_origin(), slow_origin()];
    let nodes = pair([origins[0].addr, origins[1].addr], "", "");
    let post = sized("POST", "/slow", &[], b"a");
    let get = bodiless("GET", "/remembered", &[]);
    let seen = same(&nodes, |node, i| {
        leave_while_the_origin_is_slow(node, &origins[i], &post)
    });
    assert_eq!(seen, (true, true));
    // the GET of a URL remembered uncacheable: the direct pass closes the origin connection as
    // for the POST. The standard path enables the cache for that GET (its answer may be
    // storable now), and Pingora goes on with a miss's fetch after its client left so that it
    // can be stored: it holds the origin connection until the answer or the read timeout. A
    // legitimate difference, so only the direct node is asked.
    assert_eq!(
        one_by_one(&nodes[0], &[(&get, false)]).answer(0).text(),
        "ok"
    );
    assert_eq!(
        leave_while_the_origin_is_slow(&nodes[0], &origins[0], &get),
        (true, true)
    );
    assert_direct_passes(&nodes, 2);
}

/// An HTTP/1.0 client's POST and its GETs of a URL answered no-store (the second one a direct
/// pass), the GETs answered chunked by the origin; what each client saw.
fn http_1_0_exchanges() -> ([Node; 2], Vec<ClientView>) {
    let origin = || {
        TestOrigin::start(|req| {
            let resp = if req.path == "/chunked" {
                OriginResponse::chunked(["one", " two"])
            } else {
                OriginResponse::ok("sized")
            };
            resp.header("Cache-Control", "no-store")
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let post = b"POST /sized HTTP/1.0\r\nHost: shop.example\r\nContent-Length: 1\r\n\r\na";
    let get = b"GET /chunked HTTP/1.0\r\nHost: shop.example\r\n\r\n";
    let views = same(&nodes, |node, _| {
        vec![
            one_by_one(node, &[(post, false)]),
            one_by_one(node, &[(get, false)]),
            one_by_one(node, &[(get, false)]),
        ]
    });
    (nodes, views)
}

#[test]
fn an_http_1_0_clients_passes_are_answered_alike_and_end_its_connection() {
    let (nodes, views) = http_1_0_exchanges();
    let sized = views[0].answer(0);
    assert_eq!(sized.text(), "sized");
    assert_eq!(sized.field("content-length"), Some("5"));
    for view in &views {
        // no keep-alive asked: the connection ends with the answer
        assert!(!view.usable, "{view:?}");
    }
    for view in &views[1..] {
        assert_eq!(view.answer(0).text(), "one two");
    }
    assert_direct_passes(&nodes, 2);
}

/// RFC 9112 6.1: "A server MUST NOT send a response containing Transfer-Encoding unless the
/// corresponding request indicates HTTP/1.1 (or later minor revisions)". An HTTP/1.0 client
/// reads the chunk framing as body bytes.
#[test]
fn an_http_1_0_client_never_gets_a_chunked_answer() {
    let (_nodes, views) = http_1_0_exchanges();
    for view in &views[1..] {
        let answer = view.answer(0);
        assert!(
            answer.field("transfer-encoding").is_none(),
            "an HTTP/1.0 client got a chunked answer: {answer:?}"
        );
        // unframed, ended by the close: the body is the bytes the origin meant
        assert_eq!(answer.text(), "one two");
        assert!(!view.usable, "{view:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// upgrades, interim answers, cookies

#[test]
fn upgrade_requests_take_the_standard_path_and_a_declined_upgrade_is_a_plain_answer() {
    let origins = [echo_origin(), echo_origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let websocket = bodiless(
        "GET",
        "/ws",
        &[
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
        ],
    );
    let h2c = sized(
        "POST",
        "/h2c",
        &[
            "Connection: Upgrade, HTTP2-Settings",
            "Upgrade: h2c",
            "HTTP2-Settings: AAMAAABkAAQAAP__",
        ],
        b"body",
    );
    let control = sized("POST", "/control", &[], b"c");
    let (views, origin) = same(&nodes, |node, i| {
        let views = vec![
            one_by_one(node, &[(&websocket, false)]),
            one_by_one(node, &[(&h2c, false)]),
            one_by_one(node, &[(&control, false)]),
        ];
        (views, received(&origins[i]))
    });
    assert_eq!(views[0].answer(0).text(), "GET /ws 0");
    assert_eq!(views[1].answer(0).text(), "POST /h2c 4");
    assert_eq!(origin.len(), 3);
    assert_eq!(origin[1].body, b"body");
    assert_direct_passes(&nodes, 1);
}

/// An origin that answers `101 Switching Protocols` to a request that asked for no upgrade,
/// then writes what looks like an HTTP answer.
fn unasked_101_origin() -> SocketOrigin {
    SocketOrigin::start(|_, _, stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\
              HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        );
        Then::Close
    })
}

/// The answer to a POST that asked for no upgrade, and every byte the connection carried after
/// it (the client sends a PURGE, which the proxy answers itself).
fn after_an_unasked_101(node: &Node) -> (Result<Answer, String>, String) {
    let mut conn = RawConn::connect(node.lacquer.addr());
    conn.send(&sized("POST", "/no-upgrade", &[], b"a"));
    let answer = conn.try_read_response(false).map(Answer::of);
    let _ = conn.try_send(PROBE);
    let rest = String::from_utf8_lossy(&conn.read_rest()).into_owned();
    (answer, rest)
}

/// The direct pass refuses a `101` to a request that asked for no upgrade: a 502, nothing the
/// origin sent after the 101 passed on (the origin's connection is dropped; the client's, between
/// messages, is kept since 2026-12-08: its close was Pingora's after any error answer).
#[test]
fn an_unasked_101_ends_a_direct_pass_with_a_502() {
    let origin = unasked_101_origin();
    let nodes = pair([origin.addr, unasked_101_origin().addr], "", "");
    let (answer, rest) = after_an_unasked_101(&nodes[0]);
    let answer = answer.expect("a whole answer");
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(answer.field("connection"), Some("keep-alive"));
    assert!(!rest.contains("smuggled"), "{rest:?}");
    // what follows is the probe's own answer (the proxy's 404 to its PURGE), and only that
    assert!(rest.starts_with("HTTP/1.1 404 "), "{rest:?}");
    assert_eq!(rest.matches("HTTP/1.1").count(), 1, "{rest:?}");
    assert_direct_passes(&nodes, 1);
}

/// RFC 9110 7.8: a server must not switch to a protocol the request's `Upgrade` did not name,
/// and a request without `Upgrade` named none. An intermediary that passes such a 101 on and
/// turns the client's connection into a tunnel hands the client whatever the origin sends next
/// as the answer to its next request (here a whole `200 ... smuggled`), and the client's next
/// request to the origin unparsed: a response-splitting desync any origin or upstream attacker
/// can cause.
#[test]
fn an_unasked_101_never_switches_the_client() {
    let nodes = pair(
        [unasked_101_origin().addr, unasked_101_origin().addr],
        "",
        "",
    );
    let seen = same(&nodes, |node, _| {
        let (answer, rest) = after_an_unasked_101(node);
        let answer = answer.expect("a whole answer");
        (answer.status, rest.contains("smuggled"))
    });
    assert_eq!(seen, (502, false));
}

#[test]
fn interim_answers_reach_the_client_before_the_final_one() {
    let origin = || {
        TestOrigin::start(|_| {
            OriginResponse::ok("final")
                .header("Cache-Control", "no-store")
                .interim(103, &[("Link", "</style.css>; rel=preload")])
                .interim(102, &[])
                .interim(100, &[])
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let post = sized("POST", "/hints", &["Connection: close"], b"a");
    let get = bodiless("GET", "/hints-get", &["Connection: close"]);
    let seen = same(&nodes, |node, _| {
        [&post, &get, &get]
            .into_iter()
            .map(|request| {
                let bytes = raw_request(node.lacquer.addr(), request);
                parse_responses_with_interim(&bytes, false)
                    .into_iter()
                    .map(Answer::of)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    });
    for answers in &seen {
        let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        // every interim answer, in order, an unasked 100 too (RFC 9110 15.2: a proxy forwards
        // 1xx answers unless it asked for them itself)
        assert_eq!(statuses, [103, 102, 100, 200], "{answers:?}");
        assert_eq!(answers[3].text(), "final");
        assert_eq!(answers[0].field("link"), Some("</style.css>; rel=preload"));
    }
    assert_direct_passes(&nodes, 2);
}

#[test]
fn answers_setting_cookies_are_never_served_from_the_cache() {
    let origin = || {
        let n = AtomicUsize::new(0);
        TestOrigin::start(move |req| {
            let n = n.fetch_add(1, Ordering::SeqCst) + 1;
            OriginResponse::ok(format!("{} #{n}", req.path))
                .header("Cache-Control", "max-age=60")
                .header("Set-Cookie", format!("sid={n}; Path=/; HttpOnly"))
        })
    };
    let origins = [origin(), origin()];
    let nodes = pair([origins[0].addr(), origins[1].addr()], "", "");
    let get = bodiless("GET", "/session", &[]);
    let login = sized("POST", "/login", &[], b"user=a");
    let after_login = bodiless("GET", "/login", &[]);
    let (client, origin) = same(&nodes, |node, i| {
        let client = one_by_one(
            node,
            &[
                (&get, false),
                (&get, false),
                (&get, false),
                (&login, false),
                (&after_login, false),
            ],
        );
        (client, received(&origins[i]))
    });
    assert!(client.usable);
    // every answer came from the origin, with its own cookie
    for n in 0..5 {
        let answer = client.answer(n);
        let count = n + 1;
        assert!(answer.text().ends_with(&format!(" #{count}")), "{answer:?}");
        assert_eq!(
            answer.field("set-cookie"),
            Some(&*format!("sid={count}; Path=/; HttpOnly"))
        );
    }
    assert_eq!(origin.len(), 5);
    // only the POST went direct: an answer not stored because it sets a cookie does not make its
    // URL one remembered uncacheable, so each GET is a miss on the standard path, never stored
    assert_direct_passes(&nodes, 1);
}
