//! Request smuggling: every way a request's framing could be read one way by Lacquer and another
//! way by the origin behind it. Each test sends raw bytes and checks both sides: what the client
//! got, and every byte the origin received ([`CaptureOrigin`], which frames requests as a plain
//! origin would). `docs/security.md` lists the rows; each test here is one of them.

use lacquer_test_support as support;

use support::*;

/// A proxy in front of a capture origin.
fn proxy_for(origin: &CaptureOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

/// Sends `bytes` on a new connection; the first response, and whether the proxy then closed the
/// connection.
fn exchange(lacquer: &LacquerProcess, bytes: &[u8]) -> (RawResponse, bool) {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(bytes);
    let resp = conn
        .try_read_response(false)
        .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(bytes)));
    let closed = conn.is_closed(Duration::from_secs(5));
    (resp, closed)
}

/// A refused request: 400, the connection closed, and nothing reached the origin.
fn assert_refused(bytes: &[u8]) {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let (resp, closed) = exchange(&lacquer, bytes);
    assert_eq!(resp.status, 400, "{:?}", String::from_utf8_lossy(bytes));
    assert!(closed, "the connection is closed after a 400");
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "nothing may reach the origin: {}",
        origin.received_text()
    );
}

/// What follows a request on the same client connection, to show whether its body was framed
/// as the client framed it: the origin must see exactly these two requests, nothing between.
const FOLLOW_UP: &[u8] = b"GET /next HTTP/1.1\r\nHost: shop.example\r\n\r\n";

/// Sends `first` then [`FOLLOW_UP`] on one connection and returns what the origin framed.
fn two_requests(first: &[u8]) -> (Vec<CapturedRequest>, String) {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(first);
    let resp = conn.read_response(false);
    assert_eq!(resp.status, 200, "{}", origin.received_text());
    // the proxy may close after the first (it does after a Content-Length + Transfer-Encoding)
    if conn.is_closed(Duration::from_millis(200)) {
        conn = RawConn::connect(lacquer.addr());
    }
    conn.send(FOLLOW_UP);
    assert_eq!(conn.read_response(false).status, 200);
    (origin.requests(), origin.received_text())
}

#[test]
fn content_length_and_transfer_encoding_together_frame_by_chunks_without_content_length() {
    let (requests, received) = two_requests(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 30\r\n\
          Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    );
    assert_eq!(requests.len(), 2, "{received}");
    assert!(
        requests[0].field_values("content-length").is_empty(),
        "{received}"
    );
    assert_eq!(requests[0].field_values("transfer-encoding"), ["chunked"]);
    assert_eq!(requests[0].body, b"5\r\nhello\r\n0\r\n\r\n", "{received}");
    assert_eq!(requests[1].request_line(), "GET /next HTTP/1.1");
}

#[test]
fn a_listed_content_length_reaches_the_origin_as_one_value() {
    let (requests, received) = two_requests(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5, 5\r\n\r\nhello",
    );
    assert_eq!(requests.len(), 2, "{received}");
    assert_eq!(
        requests[0].field_values("content-length"),
        ["5"],
        "{received}"
    );
    assert_eq!(requests[0].body, b"hello");
    assert_eq!(
        requests[1].request_line(),
        "GET /next HTTP/1.1",
        "{received}"
    );
}

#[test]
fn two_identical_content_lengths_reach_the_origin_as_one() {
    let (requests, received) = two_requests(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5\r\n\
          Content-Length: 5\r\n\r\nhello",
    );
    assert_eq!(requests.len(), 2, "{received}");
    assert_eq!(
        requests[0].field_values("content-length"),
        ["5"],
        "{received}"
    );
    assert_eq!(requests[0].body, b"hello");
    assert_eq!(
        requests[1].request_line(),
        "GET /next HTTP/1.1",
        "{received}"
    );
}

#[test]
fn content_lengths_that_differ_are_refused() {
    assert_refused(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5\r\n\
          Content-Length: 6\r\n\r\nhello!",
    );
}

#[test]
fn a_content_length_list_that_differs_is_refused() {
    assert_refused(b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5, 6\r\n\r\nhello!");
}

#[test]
fn a_content_length_that_is_not_digits_is_refused() {
    for value in ["+5", "-5", "5x", "0x5", "5 5"] {
        assert_refused(
            format!(
                "POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: {value}\r\n\r\nhello"
            )
            .as_bytes(),
        );
    }
}

#[test]
fn a_transfer_encoding_not_ending_in_chunked_is_refused() {
    for value in ["gzip", "chunked, gzip", "xchunked"] {
        assert_refused(
            format!(
                "POST /a HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: {value}\r\n\r\n\
                 5\r\nhello\r\n0\r\n\r\n"
            )
            .as_bytes(),
        );
    }
}

#[test]
fn transfer_encoding_on_http_1_0_is_refused() {
    assert_refused(
        b"POST /a HTTP/1.0\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    );
}

#[test]
fn obs_fold_is_refused() {
    assert_refused(b"GET /a HTTP/1.1\r\nHost: shop.example\r\nX-Long: one\r\n two\r\n\r\n");
}

#[test]
fn nul_in_a_field_value_is_refused() {
    assert_refused(b"GET /a HTTP/1.1\r\nHost: shop.example\r\nX-Nul: a\0b\r\n\r\n");
}

#[test]
fn a_bare_cr_in_the_head_is_refused() {
    assert_refused(b"GET /a HTTP/1.1\r\nHost: shop.example\r\nX-Cr: a\rb\r\n\r\n");
}

#[test]
fn whitespace_before_a_field_colon_is_refused() {
    assert_refused(b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length : 5\r\n\r\nhello");
}

#[test]
fn bare_lf_line_ends_are_read_and_sent_on_with_crlf() {
    // RFC 9112 §2.2 lets a recipient accept a bare LF as a line end; the origin gets a head
    // Pingora wrote itself, with CRLF throughout
    let (requests, received) =
        two_requests(b"POST /a HTTP/1.1\nHost: shop.example\nContent-Length: 5\n\nhello");
    assert_eq!(requests.len(), 2, "{received}");
    assert!(
        !requests[0]
            .head
            .windows(2)
            .any(|w| w[1] == b'\n' && w[0] != b'\r'),
        "{received}"
    );
    assert_eq!(requests[0].body, b"hello");
}

/// A chunked POST whose body Lacquer refuses: the client gets an error (or is disconnected),
/// and the origin never receives a complete body from it. (Pingora sends the head on before it
/// reads the body, so the origin may see the head and a body that stops short; the connection
/// carrying it is closed, never reused.)
fn assert_chunked_body_refused(body: &[u8]) {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let mut request =
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    request.extend_from_slice(body);
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(&request);
    let answer = conn.read_rest();
    let status = raw_status(&answer);
    assert!(
        status.is_some_and(|s| s >= 400) || answer.is_empty(),
        "{:?}: {:?}",
        String::from_utf8_lossy(body),
        String::from_utf8_lossy(&answer)
    );
    // an accepted body would have been answered by the origin before the client got anything,
    // so it would be among the captured requests by now
    let mut fresh = RawConn::connect(lacquer.addr());
    fresh.send(FOLLOW_UP);
    assert_eq!(fresh.read_response(false).status, 200);
    let captured = origin.requests();
    assert!(
        captured.iter().all(|r| !r.body.ends_with(b"0\r\n\r\n")),
        "the origin got a complete body: {}",
        origin.received_text()
    );
    assert!(
        captured
            .iter()
            .any(|r| r.request_line() == "GET /next HTTP/1.1"),
        "{}",
        origin.received_text()
    );
}

#[test]
fn a_bad_chunk_size_is_refused() {
    assert_chunked_body_refused(b"zz\r\nhello\r\n0\r\n\r\n");
    assert_chunked_body_refused(b"fffffffffffffffffff\r\nhello\r\n0\r\n\r\n");
    assert_chunked_body_refused(b"5 5\r\nhello\r\n0\r\n\r\n");
}

#[test]
fn a_bare_lf_in_a_chunk_extension_is_refused() {
    // httparse reads `5;a\nb` up to the CRLF as one size line (size 5, extension `a\nb`); a
    // parser that ends the line at the LF reads `b` as the start of the data: the two frame
    // every following byte differently
    assert_chunked_body_refused(b"5;a\nb\r\nhello\r\n0\r\n\r\n");
}

#[test]
fn a_bare_cr_or_nul_in_a_chunk_extension_is_refused() {
    assert_chunked_body_refused(b"5;ext=a\rb\r\nhello\r\n0\r\n\r\n");
    assert_chunked_body_refused(b"5;ext=a\0b\r\nhello\r\n0\r\n\r\n");
}

#[test]
fn a_chunk_extension_in_the_rfc_syntax_is_accepted() {
    let (requests, received) = two_requests(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\r\n\
          5;name=\"quoted value\"\r\nhello\r\n0\r\n\r\n",
    );
    assert_eq!(requests.len(), 2, "{received}");
    assert_eq!(requests[0].body, b"5\r\nhello\r\n0\r\n\r\n", "{received}");
}

// Pingora's reader notes once, while it stores the fields, whether any names the body's framing
// (a vendored patch, `request framing once`); a head with neither field is framed as bodiless
// without looking them up. These show the note sees the two names in any letter case, and that
// the bytes behind a bodiless head still reach the next request.

#[test]
fn a_content_length_in_any_letter_case_frames_the_body() {
    let (requests, received) =
        two_requests(b"POST /a HTTP/1.1\r\nHost: shop.example\r\ncOnTeNt-LeNgTh: 5\r\n\r\nhello");
    assert_eq!(requests.len(), 2, "{received}");
    assert_eq!(requests[0].body, b"hello", "{received}");
    assert_eq!(
        requests[1].request_line(),
        "GET /next HTTP/1.1",
        "{received}"
    );
}

#[test]
fn a_transfer_encoding_in_capitals_frames_by_chunks() {
    let (requests, received) = two_requests(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nTRANSFER-ENCODING: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    );
    assert_eq!(requests.len(), 2, "{received}");
    assert_eq!(requests[0].body, b"5\r\nhello\r\n0\r\n\r\n", "{received}");
    assert_eq!(
        requests[1].request_line(),
        "GET /next HTTP/1.1",
        "{received}"
    );
}

#[test]
fn content_lengths_that_differ_in_value_and_letter_case_are_refused() {
    assert_refused(
        b"POST /a HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5\r\n\
          CONTENT-length: 6\r\n\r\nhello!",
    );
}

#[test]
fn a_transfer_encoding_in_capitals_on_http_1_0_is_refused() {
    assert_refused(
        b"POST /a HTTP/1.0\r\nHost: shop.example\r\nTRANSFER-ENCODING: chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    );
}

#[test]
fn the_bytes_behind_a_head_without_framing_fields_are_the_next_request() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let mut conn = RawConn::connect(lacquer.addr());
    // one write: the GET's head, then the next request, which must not be read as a body
    conn.send(b"GET /first HTTP/1.1\r\nHost: shop.example\r\nX-Note: a\r\n\r\nGET /next HTTP/1.1\r\nHost: shop.example\r\n\r\n");
    assert_eq!(conn.read_response(false).status, 200);
    assert_eq!(conn.read_response(false).status, 200);
    let requests = origin.requests();
    let received = origin.received_text();
    assert_eq!(requests.len(), 2, "{received}");
    assert_eq!(requests[0].request_line(), "GET /first HTTP/1.1");
    assert!(requests[0].body.is_empty(), "{received}");
    assert_eq!(requests[1].request_line(), "GET /next HTTP/1.1");
}
