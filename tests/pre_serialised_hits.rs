//! Fast hits answered with the stored head's kept wire form (`proxy::fast_hit::pre_serialised`,
//! pingora-core patch 0009) carry exactly the fields of a head built per hit, and leave the
//! connection as any answer does: kept alive, closed when the client asks or speaks HTTP/1.0
//! without keep-alive, HEAD without a body, pipelined hits answered in order.
//!
//! A rule that edits response heads (`set_response_headers`) sends its paths the way every hit
//! went before (the head built per hit); the other paths take the kept wire form. The origin
//! answers every path with the same fields and body, so the two ways can be compared field by
//! field.

use lacquer_test_support as support;

use std::time::Duration;
use support::*;

/// The origin's body, the same on every path.
const BODY: &str = "the same body on every path";

/// An origin answering every request with the same cacheable response: mixed-case names, an
/// `Age`, a `Via` and a `Cache-Status` of a cache before it, a field meant for this cache only
/// (`Lacquer-Cache-Control`, stripped), and a `Date` unless the path has `nodate`.
fn origin() -> RawOrigin {
    RawOrigin::answering(|head, stream| {
        let date = if head.contains("nodate") {
            String::new()
        } else {
            format!("Date: {}\r\n", http_date_offset(-5))
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-MiXeD-CaSe: yes\r\n\
             Cache-Control: max-age=600\r\nLacquer-Cache-Control: max-age=600\r\n\
             Via: 1.1 upstream-cache\r\nCache-Status: upstream; hit\r\nAge: 3\r\n{date}\
             Content-Length: {}\r\n\r\n{BODY}",
            BODY.len()
        );
        let _ = std::io::Write::write_all(stream, response.as_bytes());
    })
}

/// A proxy in front of `origin` whose `/built/` paths get a head edit (and so a head built per
/// hit).
fn proxy(origin: &RawOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(
        origin.addr,
        "[log]\naccess = \"off\"\n\n[[rules]]\npath_regex = \"^/built/\"\n\
         set_response_headers = { \"X-Built\" = \"1\" }\n",
    )
}

/// `method path` over HTTP/1.`minor` with `headers`, as raw bytes.
fn request(method: &str, path: &str, minor: u8, headers: &[(&str, &str)]) -> String {
    // the host `RawConn::get` sends
    let mut req = format!("{method} {path} HTTP/1.{minor}\r\nHost: test\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req + "\r\n"
}

/// Fetches `path` on a connection of its own until it is a hit (stored).
fn warm(lacquer: &LacquerProcess, path: &str) -> RawResponse {
    for _ in 0..2 {
        let mut conn = RawConn::connect(lacquer.addr());
        let resp = conn.get(path, &[]);
        if is_hit(&resp) {
            return resp;
        }
    }
    panic!("{path} never became a hit");
}

/// Whether a raw response's `Cache-Status` says `hit`.
fn is_hit(resp: &RawResponse) -> bool {
    resp.header_all("cache-status")
        .iter()
        .any(|entry| entry.starts_with("lacquer") && entry.contains("; hit"))
}

/// The fields of `resp` as `name: value` lines, names as sent, sorted, without those whose
/// values depend on the moment (`Age`, the `ttl` of `Cache-Status`, and `Date`: the two paths
/// are stored by two requests, which may fall on either side of a second's change) or on the way
/// taken (`X-Built`); `Age`, the `ttl` and `Date` must be present, `Date` in the IMF-fixdate form.
fn comparable_fields(resp: &RawResponse) -> Vec<String> {
    let mut fields: Vec<String> = resp
        .headers
        .iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case("x-built"))
        .map(|(name, value)| match name.as_str() {
            "Age" => {
                assert!(value.parse::<u64>().is_ok(), "Age: {value}");
                "Age: (a number)".to_string()
            }
            "Date" => {
                // IMF-fixdate: it reads back to a time that prints as the same text
                let read = httpdate::parse_http_date(value).map(httpdate::fmt_http_date);
                assert_eq!(read.ok().as_deref(), Some(value.as_str()), "Date: {value}");
                "Date: (an HTTP date)".to_string()
            }
            "cache-status" if value.starts_with("lacquer") => {
                let (before, ttl) = value.split_once("; ttl=").expect("a hit's ttl");
                assert!(ttl.parse::<i64>().is_ok(), "ttl={ttl}");
                format!("cache-status: {before}; ttl=(a number)")
            }
            _ => format!("{name}: {value}"),
        })
        .collect();
    fields.sort();
    fields
}

#[test]
fn a_hit_from_the_kept_wire_head_carries_the_fields_of_a_built_one() {
    let origin = origin();
    let lacquer = proxy(&origin);
    for (tail, minor, method, extra) in [
        ("page", 1, "GET", &[][..]),
        ("nodate", 1, "GET", &[][..]),
        ("page", 1, "HEAD", &[][..]),
        ("page", 0, "GET", &[][..]),
        ("page", 0, "GET", &[("Connection", "keep-alive")][..]),
        ("page", 1, "GET", &[("Connection", "close")][..]),
    ] {
        let (built_path, wire_path) = (format!("/built/{tail}"), format!("/wire/{tail}"));
        let warmed = warm(&lacquer, &built_path);
        assert_eq!(warmed.header("x-built"), Some("1"), "{:?}", warmed.headers);
        assert_eq!(warm(&lacquer, &wire_path).header("x-built"), None);
        let answers: Vec<RawResponse> = [&built_path, &wire_path]
            .iter()
            .map(|path| {
                let mut conn = RawConn::connect(lacquer.addr());
                conn.send(request(method, path, minor, extra).as_bytes());
                conn.read_response(method == "HEAD")
            })
            .collect();
        let [built, wire] = &answers[..] else {
            unreachable!()
        };
        let case = format!("{method} /{tail} HTTP/1.{minor} {extra:?}");
        assert!(is_hit(built) && is_hit(wire), "{case}: {built:?} {wire:?}");
        assert_eq!(
            comparable_fields(built),
            comparable_fields(wire),
            "{case}: built {:?}, wire {:?}",
            built.headers,
            wire.headers
        );
        assert_eq!((built.status, built.version), (wire.status, wire.version));
        assert_eq!(built.body, wire.body, "{case}");
        let expected_body = if method == "HEAD" { "" } else { BODY };
        assert_eq!(wire.text(), expected_body, "{case}");
        // a built head puts our `via` beside the origin's `Via` (a header map keeps a name's
        // values together); the kept wire head writes `Age`, `Cache-Status` and `Via` after the
        // stored fields, then Pingora's `Connection`: this answer took the kept wire form
        let names: Vec<&str> = wire.headers.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names[names.len() - 4..],
            ["Age", "cache-status", "via", "Connection"],
            "{case}: {:?}",
            wire.headers
        );
    }
}

#[test]
fn the_connection_after_a_hit_from_the_kept_wire_head_is_kept_or_closed_as_asked() {
    let origin = origin();
    let lacquer = proxy(&origin);
    warm(&lacquer, "/wire/a");
    warm(&lacquer, "/wire/b");

    // HTTP/1.1: kept alive, the next request answered on it
    let mut conn = RawConn::connect(lacquer.addr());
    for path in ["/wire/a", "/wire/b", "/wire/a"] {
        let resp = conn.get(path, &[]);
        assert!(is_hit(&resp), "{path}: {:?}", resp.headers);
        assert_eq!(resp.header("connection"), Some("keep-alive"));
        assert_eq!(resp.text(), BODY);
    }

    // the client's `Connection: close`, and HTTP/1.0 without keep-alive: answered, then closed
    for (minor, headers) in [(1, &[("Connection", "close")][..]), (0, &[][..])] {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(request("GET", "/wire/a", minor, headers).as_bytes());
        let resp = conn.read_response(false);
        assert!(is_hit(&resp), "{:?}", resp.headers);
        assert_eq!(resp.header("connection"), Some("close"));
        assert_eq!(resp.text(), BODY);
        assert!(
            conn.is_closed(Duration::from_secs(10)),
            "HTTP/1.{minor} {headers:?}"
        );
    }

    // HTTP/1.0 asking for keep-alive: kept
    let mut conn = RawConn::connect(lacquer.addr());
    let keep = [("Connection", "keep-alive")];
    for _ in 0..2 {
        conn.send(request("GET", "/wire/b", 0, &keep).as_bytes());
        let resp = conn.read_response(false);
        assert_eq!(resp.header("connection"), Some("keep-alive"));
        assert_eq!(resp.text(), BODY);
    }
}

#[test]
fn pipelined_hits_from_the_kept_wire_head_are_answered_in_order() {
    let origin = origin();
    let lacquer = proxy(&origin);
    for path in ["/wire/a", "/wire/b", "/built/a"] {
        warm(&lacquer, path);
    }
    let pipeline = [
        ("GET", "/wire/a"),
        ("HEAD", "/wire/b"),
        ("GET", "/built/a"),
        ("GET", "/wire/b"),
        ("GET", "/wire/a"),
    ];
    let bytes: String = pipeline
        .iter()
        .map(|(method, path)| request(method, path, 1, &[]))
        .collect();
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(bytes.as_bytes());
    for (method, path) in pipeline {
        let resp = conn.read_response(method == "HEAD");
        assert!(is_hit(&resp), "{method} {path}: {:?}", resp.headers);
        assert_eq!(
            resp.header("content-length"),
            Some(&*BODY.len().to_string())
        );
        let expected = if method == "HEAD" { "" } else { BODY };
        assert_eq!(resp.text(), expected, "{method} {path}");
        assert_eq!(
            resp.header("x-built").is_some(),
            path.starts_with("/built/")
        );
    }
    // and the connection still answers
    assert_eq!(conn.get("/wire/a", &[]).text(), BODY);
}
