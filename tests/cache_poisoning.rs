//! Cache poisoning: requests that could make the shared cache store one client's answer under
//! another request's key. Raw bytes in, and both sides checked: what clients got and every byte
//! the origin received ([`CaptureOrigin`], which answers `origin #N` with `max-age=60`, so a
//! stored answer shows as a repeated N). `docs/security.md` lists the rows.

use lacquer_test_support as support;

use support::*;

fn proxy_for(origin: &CaptureOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"")
}

/// One request on a new connection, and its response.
fn exchange(lacquer: &LacquerProcess, bytes: &[u8]) -> RawResponse {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(bytes);
    conn.try_read_response(bytes.starts_with(b"HEAD"))
        .unwrap_or_else(|e| panic!("{:?}: {e}", String::from_utf8_lossy(bytes)))
}

/// Asserts that `bytes` on a new connection get 400 and the connection closed.
fn assert_refused(lacquer: &LacquerProcess, bytes: &[u8]) {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(bytes);
    let what = String::from_utf8_lossy(bytes);
    let resp = conn
        .try_read_response(false)
        .unwrap_or_else(|e| panic!("{what:?}: {e}"));
    assert_eq!(resp.status, 400, "{what:?}");
    assert!(
        conn.is_closed(Duration::from_secs(5)),
        "{what:?}: the connection is closed after a 400"
    );
}

fn get(lacquer: &LacquerProcess, host: &str, target: &str) -> RawResponse {
    exchange(
        lacquer,
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
    )
}

/// `Host` values that are not an RFC 3986 authority: each is refused with 400 and the
/// connection closed, and nothing reaches the origin.
#[test]
fn a_host_that_is_not_an_authority_is_refused() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    for host in [
        "shop.example/assets",
        "shop.example?x=1",
        "shop.example#top",
        "user@shop.example",
        "shop.example\\evil",
        "shop example",
        "shop.example:80:81",
        "shop.example:8o",
        "[::1",
        "%zz.example",
        "shop.example\"",
        "shop.example{x}",
    ] {
        assert_refused(
            &lacquer,
            format!("GET /v/app.js HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        );
    }
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "{}",
        origin.received_text()
    );
}

/// The report's attack: `Host: shop.example/assets` with `/v/app.js` must not fill the key
/// that `GET /assets/v/app.js` for `shop.example` reads.
#[test]
fn a_host_cannot_reach_into_the_path_part_of_the_key() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let attack = get(&lacquer, "shop.example/assets", "/v/app.js");
    assert_eq!(attack.status, 400);
    let victim = get(&lacquer, "shop.example", "/assets/v/app.js");
    assert_eq!(victim.status, 200);
    assert_eq!(
        victim.text(),
        "origin #1",
        "the victim's answer came from the origin"
    );
    let requests = origin.requests();
    assert_eq!(requests.len(), 1, "{}", origin.received_text());
    assert_eq!(requests[0].request_line(), "GET /assets/v/app.js HTTP/1.1");
    assert_eq!(requests[0].field_values("host"), ["shop.example"]);
    // and it is the victim's own answer that is now stored
    assert_eq!(
        get(&lacquer, "shop.example", "/assets/v/app.js").text(),
        "origin #1"
    );
}

#[test]
fn an_ip_literal_host_with_a_port_is_an_authority() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let resp = get(&lacquer, "[2001:db8::7]:8080", "/ip");
    assert_eq!(resp.status, 200);
    assert_eq!(
        origin.requests()[0].field_values("host"),
        ["[2001:db8::7]:8080"]
    );
}

#[test]
fn an_http_1_1_request_without_host_is_refused() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    assert_refused(&lacquer, b"GET /a HTTP/1.1\r\nAccept: */*\r\n\r\n");
    // absolute-form does not exempt HTTP/1.1 from sending Host (RFC 9112 §3.2)
    assert_refused(&lacquer, b"GET http://shop.example/a HTTP/1.1\r\n\r\n");
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "{}",
        origin.received_text()
    );
}

#[test]
fn an_http_1_0_request_without_host_is_served() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let resp = exchange(&lacquer, b"GET /old HTTP/1.0\r\nAccept: */*\r\n\r\n");
    assert_eq!(resp.status, 200);
    assert_eq!(origin.requests()[0].request_line(), "GET /old HTTP/1.1");
}

#[test]
fn two_host_lines_are_refused() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    for second in ["shop.example", "evil.example"] {
        assert_refused(
            &lacquer,
            format!("GET /a HTTP/1.1\r\nHost: shop.example\r\nHost: {second}\r\n\r\n").as_bytes(),
        );
    }
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "{}",
        origin.received_text()
    );
}

/// Absolute-form: the target's authority is the one used, for the key and for the origin.
#[test]
fn an_absolute_form_target_uses_its_authority() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let first = exchange(
        &lacquer,
        b"GET http://shop.example/abs HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    assert_eq!(first.status, 200);
    // the same resource in origin-form is the same key: a hit on what the first stored
    assert_eq!(get(&lacquer, "shop.example", "/abs").text(), first.text());
    // HTTP/1.0 may leave Host out: the target's authority is the host
    let old = exchange(&lacquer, b"GET http://other.example/abs HTTP/1.0\r\n\r\n");
    assert_eq!(old.status, 200);
    assert_ne!(old.text(), first.text(), "another host is another key");
    let requests = origin.requests();
    assert_eq!(requests.len(), 2, "{}", origin.received_text());
    assert_eq!(requests[1].field_values("host"), ["other.example"]);
}

/// A `Host` that differs from the absolute-form target's authority is refused (Pingora's rule,
/// stricter than RFC 9112 §3.2.2, which ignores such a Host: see docs/security.md).
#[test]
fn a_host_that_differs_from_the_absolute_form_authority_is_refused() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    assert_refused(
        &lacquer,
        b"GET http://shop.example/abs HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    );
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "{}",
        origin.received_text()
    );
}

#[test]
fn a_target_that_is_not_origin_or_absolute_form_is_refused() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    for target in ["shop.example", "*"] {
        assert_refused(
            &lacquer,
            format!("GET {target} HTTP/1.1\r\nHost: shop.example\r\n\r\n").as_bytes(),
        );
    }
    assert!(
        origin.received().iter().all(Vec::is_empty),
        "{}",
        origin.received_text()
    );
}

/// Hosts are case-insensitive: one entry serves every spelling (not a collision: the same
/// resource).
#[test]
fn hosts_that_differ_only_in_case_share_an_entry() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let first = get(&lacquer, "Shop.Example", "/case");
    assert_eq!(get(&lacquer, "shop.example", "/case").text(), first.text());
    assert_eq!(origin.requests().len(), 1, "{}", origin.received_text());
}

/// An absolute-form target and a `Host` naming the same host in other case are one authority
/// (hosts are case-insensitive, RFC 3986 §6.2.2.1): served, from the entry both spellings
/// share; a `Host` naming another host is still refused (above).
#[test]
fn an_absolute_form_authority_and_a_host_differing_only_in_case_agree() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let first = get(&lacquer, "shop.example", "/abs-case");
    assert_eq!(first.status, 200);
    let absolute = exchange(
        &lacquer,
        b"GET http://Shop.EXAMPLE/abs-case HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    assert_eq!(absolute.status, 200, "{}", absolute.text());
    assert_eq!(
        absolute.text(),
        first.text(),
        "the entry both spellings share"
    );
    assert_eq!(origin.requests().len(), 1, "{}", origin.received_text());
}

/// An HTTP/2 request whose `host` field and `:authority` name the same host in other case is one
/// authority (RFC 9113 §8.3.1 compares them normalised): served, not refused as two hosts; one
/// naming another host is refused.
#[tokio::test]
async fn an_h2_host_field_differing_from_authority_only_in_case_is_served() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let url = format!("http://Shop.Example:{}/h2-case", lacquer.port());
    let host = format!("shop.example:{}", lacquer.port());
    let (answer, _stream) = h2_request(&sender, "GET", &url, &[("host", &host)]).await;
    let answer = answer.await.expect("an answer");
    assert_eq!(answer.status(), 200);
    let other = format!("evil.example:{}", lacquer.port());
    let (refused, _stream) = h2_request(&sender, "GET", &url, &[("host", &other)]).await;
    let refused_status = match refused.await {
        Ok(answer) => Some(answer.status().as_u16()),
        Err(_) => None,
    };
    assert!(
        matches!(refused_status, None | Some(400)),
        "a host field naming another host: {refused_status:?}"
    );
    assert_eq!(origin.requests().len(), 1, "{}", origin.received_text());
    driver.abort();
}

/// A GET with a body goes to the origin with its body, and neither reads nor fills the cache:
/// one client's body must not decide what others get.
#[test]
fn a_get_with_a_body_is_forwarded_and_never_cached() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let stored = get(&lacquer, "shop.example", "/search");
    assert_eq!(stored.text(), "origin #1");
    for body_request in [
        &b"GET /search HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 11\r\n\r\n{\"q\":\"abc\"}"
            [..],
        b"GET /search HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\r\n\
          b\r\n{\"q\":\"def\"}\r\n0\r\n\r\n",
    ] {
        let resp = exchange(&lacquer, body_request);
        assert_eq!(resp.status, 200);
        assert_ne!(resp.text(), "origin #1", "not answered from the cache");
        assert_eq!(
            resp.header("cache-status")
                .map(|s| s.contains("fwd=request")),
            Some(true)
        );
    }
    // what the plain GET stored is still what plain GETs get
    assert_eq!(get(&lacquer, "shop.example", "/search").text(), "origin #1");
    let requests = origin.requests();
    assert_eq!(requests.len(), 3, "{}", origin.received_text());
    assert_eq!(requests[1].body, b"{\"q\":\"abc\"}");
    // re-chunked by Pingora (its chunk sizes are upper-case hex)
    assert_eq!(
        requests[2].body.to_ascii_lowercase(),
        b"b\r\n{\"q\":\"def\"}\r\n0\r\n\r\n"
    );
}

#[test]
fn a_get_with_a_body_does_not_fill_the_cache() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let with_body = exchange(
        &lacquer,
        b"GET /fill HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(with_body.text(), "origin #1");
    let plain = get(&lacquer, "shop.example", "/fill");
    assert_eq!(
        plain.text(),
        "origin #2",
        "the answer to the body was not stored"
    );
    assert_eq!(origin.requests().len(), 2, "{}", origin.received_text());
}

#[test]
fn a_head_with_a_body_is_forwarded_and_never_cached() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let resp = exchange(
        &lacquer,
        b"HEAD /h HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("cache-status")
            .map(|s| s.contains("fwd=request")),
        Some(true)
    );
    assert_eq!(get(&lacquer, "shop.example", "/h").text(), "origin #2");
    let requests = origin.requests();
    assert_eq!(requests[0].request_line(), "HEAD /h HTTP/1.1");
    assert_eq!(requests[0].body, b"hello", "{}", origin.received_text());
}

/// A zero `Content-Length` is no body: such a GET is an ordinary, cacheable one.
#[test]
fn a_get_with_content_length_zero_is_cached() {
    let origin = CaptureOrigin::start();
    let lacquer = proxy_for(&origin);
    let request = b"GET /zero HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 0\r\n\r\n";
    let first = exchange(&lacquer, request);
    let second = exchange(&lacquer, request);
    assert_eq!(first.text(), "origin #1");
    assert_eq!(second.text(), "origin #1");
}

/// `Host: https:` (an empty port: a valid authority) and the target `//shop.example/x` spelled,
/// in an `http` key, the text of the `https` key of shop.example/x, so a plain-http client stored
/// its answer as the page of https users (found by review). An empty port is the default port
/// (RFC 3986 §6.2.3) and is keyed as none.
#[test]
fn an_empty_port_cannot_make_an_http_key_spell_an_https_one() {
    let origin = CaptureOrigin::start();
    let lacquer = LacquerProcess::start_simple(
        origin.addr(),
        "[log]\naccess = \"off\"\n[proxy]\ntrusted_proxies = [\"127.0.0.1\"]",
    );
    let hostile = get(&lacquer, "https:", "//shop.example/x");
    assert_eq!(hostile.status, 200);
    let https = exchange(
        &lacquer,
        b"GET /x HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-Proto: https\r\n\r\n",
    );
    assert_eq!(https.status, 200);
    assert_ne!(
        https.body, hostile.body,
        "the https page was a plain-http client's answer"
    );
    // the empty port is the default one: both spellings share an entry
    let plain = get(&lacquer, "shop.example", "/y");
    let empty_port = get(&lacquer, "shop.example:", "/y");
    assert_eq!(plain.body, empty_port.body);
}
