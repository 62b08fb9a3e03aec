//! What a forwarded request's field names look like at the origin: each as the client wrote it,
//! upper, lower or mixed case, on a cacheable miss, a pass, a POST and a background revalidation,
//! with the fields Lacquer removes gone and the ones it adds present. Requests are parsed without a case-preserving name
//! map (a hit never needs one); the map is built from the received head only when a request is
//! forwarded (pingora-http and pingora-core patches "case map on demand").

use lacquer_test_support as support;

use support::*;

/// The field lines of a captured head, as received (request line and empty line excluded).
fn field_lines(head: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect()
}

/// Sends `request` on a new connection through a proxy in front of a capture origin; the field
/// lines the origin received, and the response's status.
fn forward(request: &[u8]) -> (Vec<String>, u16) {
    let origin = CaptureOrigin::start();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(request);
    let resp = conn.read_response(false);
    let requests = origin.requests();
    assert_eq!(requests.len(), 1, "{}", origin.received_text());
    (field_lines(&requests[0].head), resp.status)
}

fn assert_has_line(lines: &[String], line: &str) {
    assert!(
        lines.iter().any(|l| l == line),
        "the origin did not get {line:?} as written: {lines:#?}"
    );
}

#[test]
fn a_miss_reaches_the_origin_with_each_field_name_as_the_client_wrote_it() {
    let (lines, status) = forward(
        b"GET /case/miss HTTP/1.1\r\nHost: test\r\nX-MiXeD-Case: 1\r\nuser-agent: lower\r\n\
          ACCEPT: */*\r\nx-dup: a\r\nX-Dup: b\r\nConnection: keep-alive, X-Hop\r\n\
          X-Hop: dropped\r\n\r\n",
    );
    assert_eq!(status, 200);
    for line in [
        "X-MiXeD-Case: 1",
        "user-agent: lower",
        "ACCEPT: */*",
        "x-dup: a",
        "X-Dup: b",
    ] {
        assert_has_line(&lines, line);
    }
    // a field the client named hop-by-hop is removed, whatever its case
    assert!(
        !lines
            .iter()
            .any(|l| l.to_ascii_lowercase().starts_with("x-hop")),
        "{lines:#?}"
    );
    // the fields Lacquer adds are there, in their usual form: names in lowercase, as Pingora
    // writes a name it has no titled form for (they are added as name and text together,
    // pingora-http patch "names parsed once")
    for line in [
        "x-forwarded-for: 127.0.0.1",
        "x-forwarded-proto: http",
        "x-forwarded-host: test",
    ] {
        assert_has_line(&lines, line);
    }
    assert!(
        lines.iter().any(|l| l.starts_with("via: 1.1 ")),
        "{lines:#?}"
    );
}

#[test]
fn a_pass_and_a_post_keep_the_client_s_field_names_too() {
    let (lines, status) = forward(
        b"GET /case/pass HTTP/1.1\r\nhost: test\r\nCache-Control: no-cache\r\n\
          Authorization: Basic YTpi\r\nx-REQUEST-id: 7\r\n\r\n",
    );
    assert_eq!(status, 200);
    for line in ["host: test", "Authorization: Basic YTpi", "x-REQUEST-id: 7"] {
        assert_has_line(&lines, line);
    }

    let (lines, status) = forward(
        b"POST /case/form HTTP/1.1\r\nHost: test\r\ncontent-length: 3\r\n\
          CONTENT-TYPE: text/plain\r\nX-Token: Abc\r\n\r\nabc",
    );
    assert_eq!(status, 200);
    for line in [
        "content-length: 3",
        "CONTENT-TYPE: text/plain",
        "X-Token: Abc",
    ] {
        assert_has_line(&lines, line);
    }
}

#[test]
fn a_background_revalidation_sends_the_names_of_the_request_that_triggered_it() {
    let origin = CaptureOrigin::start_answering("max-age=1, stale-while-revalidate=60");
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let request = b"GET /case/stale HTTP/1.1\r\nHost: test\r\nX-MiXeD-Case: 1\r\n\
                    accept-LANGUAGE: en\r\n\r\n";
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(request);
    assert_eq!(conn.read_response(false).text(), "origin #1");
    // stale after a second: served stale at once, and refreshed by a background subrequest
    std::thread::sleep(Duration::from_millis(2100));
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(request);
    assert_eq!(
        conn.read_response(false).text(),
        "origin #1",
        "served stale"
    );
    assert!(
        poll_until(Duration::from_secs(10), || origin.requests().len() == 2),
        "no background revalidation reached the origin: {}",
        origin.received_text()
    );
    let lines = field_lines(&origin.requests()[1].head);
    for line in ["X-MiXeD-Case: 1", "accept-LANGUAGE: en"] {
        assert_has_line(&lines, line);
    }
}

/// The lines of `request`'s head that the origin should get as they are: every field but the
/// hop-by-hop ones named here.
fn sent_lines(request: &[u8], hop_by_hop: &[&str]) -> Vec<String> {
    field_lines(request)
        .into_iter()
        .filter(|line| {
            let name = line
                .split(':')
                .next()
                .unwrap_or_default()
                .to_ascii_lowercase();
            !hop_by_hop.contains(&name.as_str())
        })
        .collect()
}

/// The origin's lines without the fields Lacquer adds.
fn without_added(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|line| {
            let name = line.split(':').next().unwrap_or_default();
            ![
                "via",
                "x-forwarded-for",
                "x-forwarded-proto",
                "x-forwarded-host",
                "Accept-Encoding",
            ]
            .contains(&name)
        })
        .cloned()
        .collect()
}

#[test]
fn a_request_with_every_name_in_its_usual_form_reaches_the_origin_line_for_line() {
    // each name as browsers and HTTP libraries write it, which a head without a case map is
    // written in too (so none is built: pingora-core patch "request case map only when
    // needed"), a custom name in lower case, and one removed on the way
    let request = b"GET /case/usual HTTP/1.1\r\nHost: test\r\nUser-Agent: Mozilla/5.0\r\n\
          Accept: text/html\r\nAccept-Language: en\r\nCookie: a=b\r\n\
          Upgrade-Insecure-Requests: 1\r\nSec-Fetch-Dest: document\r\nSec-Fetch-Mode: navigate\r\n\
          Sec-Fetch-Site: none\r\nSec-Fetch-User: ?1\r\nPriority: u=0, i\r\n\
          X-Requested-With: XMLHttpRequest\r\nConnection: keep-alive, x-hop\r\nx-hop: 1\r\n\
          x-app-trace: 5\r\n\r\n";
    let (lines, status) = forward(request);
    assert_eq!(status, 200);
    assert_eq!(
        without_added(&lines),
        sent_lines(request, &["connection", "x-hop"]),
        "{lines:#?}"
    );
    // a miss asks for the coding the cache stores, named as Pingora writes it
    assert_has_line(&lines, "Accept-Encoding: gzip");
}

#[test]
fn a_name_in_its_usual_form_then_in_another_keeps_both_forms() {
    // the second value of a name comes in another form: the head needs its case map after all,
    // found where the field is not the next one in the map's order
    let (lines, status) = forward(
        b"GET /case/later HTTP/1.1\r\nHost: test\r\nAccept: text/html\r\nUser-Agent: t\r\n\
          ACCEPT: */*\r\n\r\n",
    );
    assert_eq!(status, 200);
    for line in [
        "Host: test",
        "Accept: text/html",
        "User-Agent: t",
        "ACCEPT: */*",
    ] {
        assert_has_line(&lines, line);
    }

    // and the other way round, on a POST (a pass), with the odd form first
    let (lines, status) = forward(
        b"POST /case/first HTTP/1.1\r\nHost: test\r\nuser-AGENT: odd\r\nContent-Length: 2\r\n\
          Content-Type: text/plain\r\n\r\nab",
    );
    assert_eq!(status, 200);
    for line in [
        "Host: test",
        "user-AGENT: odd",
        "Content-Length: 2",
        "Content-Type: text/plain",
    ] {
        assert_has_line(&lines, line);
    }
}
