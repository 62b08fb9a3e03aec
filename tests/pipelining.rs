//! HTTP/1.1 pipelining (RFC 9112 §9.3.2): a client may send its requests back to back on one
//! connection without waiting for the answers; every one of them must be answered, in the order
//! sent, whether it is a hit, a miss or a request with a body. Each test writes its whole
//! pipeline to a raw socket at once and reads the answers one by one.

use lacquer_test_support as support;

use support::*;

/// A proxy in front of the scripted origin, with `extra` config.
fn proxy(origin: &TestOrigin, extra: &str) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), &format!("[log]\naccess = \"off\"\n{extra}"))
}

/// A cacheable path of the scripted origin (`max-age=600`), with `more` query parameters.
fn cacheable(name: &str, more: &str) -> String {
    format!("/pipe/{name}?cc={}{more}", q("max-age=600"))
}

/// `GET path` (or another method without a body) as raw bytes.
fn request(method: &str, path: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nHost: shop.example\r\n\r\n")
}

/// One request on its own connection.
fn fetch(lacquer: &LacquerProcess, method: &str, path: &str) -> RawResponse {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(request(method, path).as_bytes());
    conn.read_response(method == "HEAD")
}

/// Fetches `path` until it is a hit, so that it is stored before the pipeline.
fn warm(lacquer: &LacquerProcess, path: &str) {
    assert_eq!(fetch(lacquer, "GET", path).status, 200);
    let again = fetch(lacquer, "GET", path);
    assert!(again.is_hit(), "{path} is stored: {:?}", again.headers);
}

/// What one answer of a pipeline must be.
struct Expect<'a> {
    method: &'a str,
    path: &'a str,
    hit: bool,
}

/// Reads one answer per entry of `expected` from `conn`, in order, and checks each: 200, the
/// body of its own path (the scripted origin answers `"<path> #<n>"`; HEAD: none), and hit or
/// not. Returns the answers.
fn read_in_order(conn: &mut RawConn, expected: &[Expect]) -> Vec<RawResponse> {
    let mut answers = Vec::new();
    for (i, want) in expected.iter().enumerate() {
        let head = want.method == "HEAD";
        let resp = conn
            .try_read_response(head)
            .unwrap_or_else(|e| panic!("answer {i} ({} {}): {e}", want.method, want.path));
        assert_eq!(resp.status, 200, "answer {i}: {:?}", resp.headers);
        if head {
            assert!(resp.body.is_empty(), "answer {i}");
        } else {
            assert!(
                resp.text().starts_with(&format!("{} #", want.path)),
                "answer {i} must be for {}, got {:?}",
                want.path,
                resp.text()
            );
        }
        assert_eq!(
            resp.is_hit(),
            want.hit,
            "answer {i} ({} {}): {:?}",
            want.method,
            want.path,
            resp.header_all("cache-status")
        );
        answers.push(resp);
    }
    answers
}

#[test]
fn pipelined_hits_and_misses_are_answered_in_order() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let (a, b) = (cacheable("a", ""), cacheable("b", ""));
    warm(&lacquer, &a);
    warm(&lacquer, &b);
    // a slow miss ahead of hits: answered out of order, the hits would overtake it
    let slow_miss = cacheable("slow", "&sleep=200");
    let uncacheable = "/pipe/uncacheable?cc=no-store";
    let expected = [
        Expect {
            method: "GET",
            path: &a,
            hit: true,
        },
        Expect {
            method: "GET",
            path: &slow_miss,
            hit: false,
        },
        Expect {
            method: "GET",
            path: &b,
            hit: true,
        },
        Expect {
            method: "GET",
            path: uncacheable,
            hit: false,
        },
        Expect {
            method: "HEAD",
            path: &a,
            hit: true,
        },
        Expect {
            method: "GET",
            path: &b,
            hit: true,
        },
        Expect {
            method: "GET",
            path: uncacheable,
            hit: false,
        },
    ];
    let pipeline: String = expected.iter().map(|e| request(e.method, e.path)).collect();

    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(pipeline.as_bytes());
    let answers = read_in_order(&mut conn, &expected);

    assert_eq!(origin.hits_for(&slow_miss), 1);
    assert_eq!(
        origin.hits_for(uncacheable),
        2,
        "each miss went to the origin once"
    );
    assert_ne!(answers[3].body, answers[6].body, "two separate fetches");
    assert!(
        !conn.is_closed(Duration::from_millis(200)),
        "the connection stays open for more"
    );
    conn.send(request("GET", &a).as_bytes());
    assert!(
        conn.read_response(false).is_hit(),
        "and serves the next request"
    );
}

#[test]
fn a_pipelined_request_behind_a_post_body_is_answered() {
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let a = cacheable("a", "");
    warm(&lacquer, &a);
    let miss = "/pipe/after-posts?cc=no-store";
    let mut pipeline = String::new();
    pipeline.push_str(
        "POST /pipe/form HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 14\r\n\r\nname=lacquer&x",
    );
    pipeline.push_str(&request("GET", &a));
    pipeline.push_str(
        "POST /pipe/chunked HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\r\n\
         5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    );
    pipeline.push_str(&request("GET", miss));

    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(pipeline.as_bytes());
    read_in_order(
        &mut conn,
        &[
            Expect {
                method: "POST",
                path: "/pipe/form",
                hit: false,
            },
            Expect {
                method: "GET",
                path: &a,
                hit: true,
            },
            Expect {
                method: "POST",
                path: "/pipe/chunked",
                hit: false,
            },
            Expect {
                method: "GET",
                path: miss,
                hit: false,
            },
        ],
    );

    let form = origin.requests_for("/pipe/form");
    assert_eq!(form.len(), 1);
    assert_eq!(
        &form[0].body[..],
        b"name=lacquer&x",
        "the body, and no more"
    );
    let chunked = origin.requests_for("/pipe/chunked");
    assert_eq!(chunked.len(), 1);
    assert_eq!(&chunked[0].body[..], b"hello world");
    let after = origin.requests_for(miss);
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].method, "GET");
    assert!(after[0].body.is_empty(), "nothing of the bodies before it");
}

#[test]
fn a_pipeline_larger_than_max_header_size_is_answered_whole() {
    let origin = scripted_origin();
    // each head is far below the limit; together they are several times over it
    let lacquer = proxy(
        &origin,
        "[server]\nmax_header_size = \"1KiB\"\nmax_request_line = \"512\"",
    );
    let a = cacheable("a", "");
    warm(&lacquer, &a);
    let expected: Vec<Expect> = (0..80)
        .map(|_| Expect {
            method: "GET",
            path: &a,
            hit: true,
        })
        .collect();
    let pipeline: String = expected.iter().map(|e| request(e.method, e.path)).collect();
    assert!(pipeline.len() > 4 * 1024);

    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(pipeline.as_bytes());
    read_in_order(&mut conn, &expected);
    assert_eq!(origin.hits_for(&a), 1, "all from the cache");
}

/// Sends `pipeline` on a new connection to a proxy of a capture origin; the first answer, whether
/// the proxy then closed the connection, and what the origin framed.
fn first_answer_of(pipeline: &[u8]) -> (RawResponse, bool, Vec<CapturedRequest>, String) {
    let origin = CaptureOrigin::start();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(pipeline);
    let first = conn.read_response(false);
    let closed = conn.is_closed(Duration::from_secs(5));
    (first, closed, origin.requests(), origin.received_text())
}

/// What a pipeline must never do: a request behind a refused one is not served (the client and
/// the proxy may no longer agree on where it starts).
#[test]
fn nothing_behind_a_refused_request_is_served() {
    let (first, closed, requests, received) = first_answer_of(
        b"GET /v/app.js HTTP/1.1\r\nHost: shop.example/assets\r\n\r\n\
          GET /behind HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    assert_eq!(first.status, 400);
    assert!(closed, "closed after the refusal");
    assert!(requests.is_empty(), "{received}");
}

/// `Content-Length` with `Transfer-Encoding`: framed by the chunks, then the connection is closed
/// (RFC 9112 §6.1), so what follows the chunks is never read as a request.
#[test]
fn nothing_behind_content_length_with_transfer_encoding_is_served() {
    let (first, closed, requests, received) = first_answer_of(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 30\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
          GET /behind HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    assert_eq!(first.status, 200);
    assert!(closed, "closed after the response");
    assert_eq!(requests.len(), 1, "{received}");
    assert_eq!(requests[0].request_line(), "POST /a HTTP/1.1");
    assert_eq!(requests[0].body, b"5\r\nhello\r\n0\r\n\r\n", "{received}");
}

/// A client that sends a long pipeline and reads nothing until the proxy's writes have filled the
/// connection: the proxy's write of an answer waits for the client, and each request is ended
/// (its session finished, the connection kept for the next) only once its answer is written.
/// Every answer must arrive, whole and in order, and the connection must then serve more.
#[test]
fn a_pipeline_whose_client_reads_only_after_the_socket_filled_is_answered_whole() {
    const ANSWERS: usize = 1_500; // 1,500 x 8 KB: several times what the sockets hold
    let origin = scripted_origin();
    let lacquer = proxy(&origin, "");
    let a = cacheable("full", "&len=8000");
    warm(&lacquer, &a);
    let pipeline = request("GET", &a).repeat(ANSWERS);

    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(pipeline.as_bytes());
    // the proxy writes until the socket is full, then waits for the client
    std::thread::sleep(Duration::from_millis(500));
    for i in 0..ANSWERS {
        let resp = conn
            .try_read_response(false)
            .unwrap_or_else(|e| panic!("answer {i}: {e}"));
        assert_eq!(resp.status, 200, "answer {i}: {:?}", resp.headers);
        assert_eq!(resp.body.len(), 8000, "answer {i}");
        assert!(
            resp.is_hit(),
            "answer {i}: {:?}",
            resp.header_all("cache-status")
        );
    }
    assert_eq!(origin.hits_for(&a), 1, "all from the cache");
    conn.send(request("GET", &a).as_bytes());
    assert!(
        conn.read_response(false).is_hit(),
        "the connection serves more"
    );
    lacquer.assert_no_panic();
}
