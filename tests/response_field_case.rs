//! What an answer's field names look like at the client: each as the origin wrote it, on a pass,
//! a stored miss and the hits after it, over the direct exchange and over Pingora's standard
//! path. An answer's head is read without a case-preserving name map when every name came in
//! the form a head without one is written in (`Content-Type`, `ETag`, a custom name in lower
//! case: pingora-http's titled forms), and with one as soon as a name came in another form
//! (`X-Request-Id`, `content-type`, `ETAG`): pingora-core patch "case map only when needed".
//! Either way the client must get the names byte for byte as sent, and in their order.

use lacquer_test_support as support;

use std::io::Write;
use support::*;

/// The fields the origin sends for each style of head (besides `Cache-Control`, which depends
/// on whether the answer may be stored, and `Content-Length`).
fn fields_for(style: &str) -> &'static [(&'static str, &'static str)] {
    match style {
        // every name in the form a head without a case map is written in
        "usual" => &[
            ("Content-Type", "text/plain"),
            ("ETag", "\"v1\""),
            ("Last-Modified", "Tue, 01 Sep 2026 10:00:00 GMT"),
            ("X-Frame-Options", "DENY"),
            ("x-lower-custom", "1"),
        ],
        // the first name in another form comes last: the fields before it get their case map
        // entries when it is met
        "irregular-last" => &[
            ("Content-Type", "text/plain"),
            ("ETag", "\"v1\""),
            ("x-lower-custom", "1"),
            ("X-Request-Id", "5f0c1b2a"),
        ],
        // names in other forms from the first field on, and one name twice in two cases
        "irregular-first" => &[
            ("content-type", "text/plain"),
            ("ETAG", "\"v1\""),
            ("x-dup", "1"),
            ("X-Dup", "2"),
            ("X-MiXeD-Case", "3"),
            ("last-MODIFIED", "Tue, 01 Sep 2026 10:00:00 GMT"),
        ],
        // a name received in lower case first and in another form later
        "lower-then-mixed" => &[
            ("x-dup", "1"),
            ("Content-Type", "text/plain"),
            ("X-Dup", "2"),
        ],
        // the framing named in other forms (`TRANSFER-ENCODING: chunked`): the body is framed
        // by it whatever its case, and the names around it keep theirs
        "odd-framing" => &[("content-TYPE", "text/plain"), ("X-Odd", "1")],
        other => panic!("no style {other}"),
    }
}

const STYLES: [&str; 5] = [
    "usual",
    "irregular-last",
    "irregular-first",
    "lower-then-mixed",
    "odd-framing",
];

/// An origin answering `/{style}/{pass|store}/...` with that style's fields, `no-store` or
/// `max-age=600`, and a 5-byte body (chunked for `odd-framing`).
fn origin() -> RawOrigin {
    RawOrigin::answering(|head, stream| {
        let path = head.split_whitespace().nth(1).unwrap_or("/");
        let mut parts = path.trim_start_matches('/').split('/');
        let (style, kind) = (parts.next().unwrap(), parts.next().unwrap_or("pass"));
        let cc = if kind == "store" {
            "max-age=600"
        } else {
            "no-store"
        };
        let mut answer = format!("HTTP/1.1 200 OK\r\nCache-Control: {cc}\r\n");
        for (name, value) in fields_for(style) {
            answer.push_str(&format!("{name}: {value}\r\n"));
        }
        if style == "odd-framing" {
            answer.push_str("TRANSFER-ENCODING: chunked\r\nconnection: CLOSE\r\n\r\n");
            answer.push_str("2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n");
        } else {
            answer.push_str("Content-Length: 5\r\nConnection: close\r\n\r\nhello");
        }
        let _ = stream.write_all(answer.as_bytes());
    })
}

/// Asserts that `resp` carries each of `style`'s fields as the origin wrote it, in its order:
/// the names in the order they first came, and a name's values in theirs (a header map keeps
/// a name's values together, as it always has).
fn assert_fields_as_sent(resp: &RawResponse, style: &str, way: &str) {
    assert_eq!(resp.status, 200, "{way}: {resp:?}");
    assert_eq!(resp.body, b"hello", "{way}");
    let mut last_new_name = 0;
    let mut seen: Vec<(String, usize)> = Vec::new();
    for (name, value) in fields_for(style) {
        let at = resp
            .headers
            .iter()
            .position(|(n, v)| n == name && v == value)
            .unwrap_or_else(|| {
                panic!(
                    "{way}: `{name}: {value}` not received as written: {:#?}",
                    resp.headers
                )
            });
        let lower = name.to_ascii_lowercase();
        let after = match seen.iter().find(|(n, _)| *n == lower) {
            Some((_, previous)) => *previous,
            None => {
                let after = last_new_name;
                last_new_name = at;
                after
            }
        };
        assert!(
            at >= after,
            "{way}: `{name}` out of the origin's order: {:#?}",
            resp.headers
        );
        seen.retain(|(n, _)| *n != lower);
        seen.push((lower, at));
    }
}

fn cache_status(resp: &RawResponse) -> String {
    resp.header_all("cache-status").join(", ")
}

/// Fetches each style as a pass, a stored miss, hits and a HEAD through a node with `config`;
/// `way` names the path taken in failures.
fn check(config: &str, way: &str) {
    let origin = origin();
    let lacquer = LacquerProcess::start_simple(origin.addr, config);
    for style in STYLES {
        // a pass, twice: the second time the URL is remembered uncacheable
        for round in 0..2 {
            let mut conn = RawConn::connect(lacquer.addr());
            let resp = conn.get(&format!("/{style}/pass/p"), &[]);
            assert_fields_as_sent(&resp, style, &format!("{way} pass #{round}"));
        }
        // a stored miss, then hits (the second from the head kept serialised)
        let path = format!("/{style}/store/s");
        let mut conn = RawConn::connect(lacquer.addr());
        let miss = conn.get(&path, &[]);
        assert_fields_as_sent(&miss, style, &format!("{way} miss"));
        for round in 0..2 {
            let mut conn = RawConn::connect(lacquer.addr());
            let hit = conn.get(&path, &[]);
            assert!(
                cache_status(&hit).contains("hit"),
                "{style}: not a hit: {}",
                cache_status(&hit)
            );
            assert_fields_as_sent(&hit, style, &format!("{way} hit #{round}"));
        }
        // a HEAD of the stored answer
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(format!("HEAD {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes());
        let head = conn.read_response(true);
        assert_eq!(head.status, 200);
        for (name, value) in fields_for(style) {
            assert!(
                head.headers.iter().any(|(n, v)| n == name && v == value),
                "{way} HEAD: `{name}` not as written: {:#?}",
                head.headers
            );
        }
    }
}

#[test]
fn answers_forwarded_directly_keep_the_origin_s_field_names() {
    check("[log]\naccess = \"off\"", "direct");
}

#[test]
fn answers_on_the_standard_path_keep_the_origin_s_field_names() {
    check(
        "[log]\naccess = \"off\"\n[proxy]\ndirect_passes = false\ndirect_misses = false",
        "standard",
    );
}
