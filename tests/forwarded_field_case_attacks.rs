//! Attacks on "a forwarded request gets a case map only when a name needs one" (pingora-core
//! patch 0028, pingora-http patch 0006): an HTTP/1 request forwarded to an HTTP/1 origin must
//! reach it with every field name byte for byte as the client wrote it, whether or not the proxy
//! decided it needed a case-preserving name map, minus the hop-by-hop fields and plus the fields
//! Lacquer adds (`x-forwarded-*`, `via`, on cacheable misses `Accept-Encoding: gzip`).
//!
//! Each test sends raw bytes to a real `lacquer` in front of a [`CaptureOrigin`] and compares
//! what the origin received with what was sent: per name (lower-cased), the received lines in
//! order, each name exactly as written, each value intact, nothing lost or duplicated, and the
//! added fields present once each. The attacks: a name's values interleaved with other names in
//! several forms, the odd form only on a later value, fields removed before or after the case
//! decision (hop-by-hop, Connection-nominated, request rules, a `Content-Length` dropped beside
//! `Transfer-Encoding`), names that collide in lower case with the titled forms Pingora knows
//! (`priority`, `DNT`, `sec-fetch-*`, `x-requested-with`), many fields, a name fifty times, long
//! names, pipelined and keep-alive requests in different forms, and every forwarding path (miss,
//! pass, POST with a sized or chunked body, `Expect: 100-continue`, HEAD, `no-cache`, direct pass,
//! cache disabled, HTTP/1.0, background revalidation), plus HTTP/2 clients forwarded over HTTP/1.
//!
//! Written by a session whose only job was to break the change. What it found: after a field
//! removed before forwarding, a name's first value could be spelled as its later one (the four
//! tests `..._does_not_shift_the_names`, `..._before_a_name_whose_...`; pingora-core patch
//! 0030, the same on the code before 0028), and an HTTP/2 client's stale hit was never
//! revalidated in the background (pingora-core patch 0031).

use lacquer_test_support as support;

use std::collections::BTreeMap;
use support::*;

const QUIET: &str = "[log]\naccess = \"off\"\n";

/// A capture origin and a proxy in front of it.
struct Setup {
    origin: CaptureOrigin,
    lacquer: LacquerProcess,
}

/// An origin answering with `Cache-Control: {cache_control}`, behind a proxy with `extra_toml`.
fn setup(cache_control: &str, extra_toml: &str) -> Setup {
    let origin = CaptureOrigin::start_answering(cache_control);
    let lacquer = LacquerProcess::start_simple(origin.addr(), &format!("{QUIET}{extra_toml}"));
    Setup { origin, lacquer }
}

impl Setup {
    /// Sends `request` on a new connection and reads its answer.
    fn exchange(&self, request: &[u8]) -> RawResponse {
        let mut conn = RawConn::connect(self.lacquer.addr());
        conn.send(request);
        conn.read_response(request.starts_with(b"HEAD "))
    }

    /// The one request the origin has received so far.
    fn only_request(&self) -> CapturedRequest {
        let requests = self.origin.requests();
        assert_eq!(
            requests.len(),
            1,
            "the origin should have one request: {}",
            self.origin.received_text()
        );
        requests.into_iter().next().unwrap()
    }

    /// The request the origin received with this request line.
    fn request_for(&self, request_line: &str) -> CapturedRequest {
        let matching: Vec<_> = self
            .origin
            .requests()
            .into_iter()
            .filter(|r| r.request_line() == request_line)
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "the origin should have one {request_line:?}: {}",
            self.origin.received_text()
        );
        matching.into_iter().next().unwrap()
    }
}

/// The field lines of a head, request line excluded, up to the empty line (a body after it is
/// not read).
fn field_lines(head: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .skip(1)
        .take_while(|line| !line.is_empty())
        .map(str::to_string)
        .collect()
}

fn name_of(line: &str) -> String {
    line.split(':')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Lines grouped by lower-cased name, each group in its order.
fn grouped(lines: impl IntoIterator<Item = String>) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines {
        groups.entry(name_of(&line)).or_default().push(line);
    }
    groups
}

/// What Lacquer adds to a request it forwards.
struct Added {
    /// `x-forwarded-host`'s value (the request's `Host`), if it has one.
    host: Option<&'static str>,
    /// `via`'s protocol version (`1.1`, `1.0`, `2`).
    via: &'static str,
    /// `Accept-Encoding: gzip`, on a request the cache may store the answer to.
    gzip: bool,
    /// `Transfer-Encoding: chunked`, for a body sent chunked.
    chunked: bool,
}

impl Added {
    /// A cacheable miss of an HTTP/1.1 request with `Host: test`.
    const MISS: Added = Added {
        host: Some("test"),
        via: "1.1",
        gzip: true,
        chunked: false,
    };
    /// A pass of an HTTP/1.1 request with `Host: test`.
    const PASS: Added = Added {
        host: Some("test"),
        via: "1.1",
        gzip: false,
        chunked: false,
    };

    /// Each added line (or, for `via`, its start) and whether it is a prefix.
    fn lines(&self) -> Vec<(String, bool)> {
        let mut lines = vec![
            ("x-forwarded-for: 127.0.0.1".to_string(), false),
            ("x-forwarded-proto: http".to_string(), false),
            (format!("via: {} ", self.via), true),
        ];
        if let Some(host) = self.host {
            lines.push((format!("x-forwarded-host: {host}"), false));
        }
        if self.gzip {
            lines.push(("Accept-Encoding: gzip".to_string(), false));
        }
        if self.chunked {
            lines.push(("Transfer-Encoding: chunked".to_string(), false));
        }
        lines
    }
}

/// Asserts that the origin got `request`'s fields (those named in `removed`, lower case, left
/// out), each name's lines in order and exactly as sent, and `added` once each, nothing else.
fn assert_forwarded(got: &CapturedRequest, request: &[u8], removed: &[&str], added: &Added) {
    let mut lines = field_lines(&got.head);
    let context = || {
        format!(
            "\n--- sent:\n{}\n--- the origin got:\n{}",
            String::from_utf8_lossy(request).trim_end(),
            String::from_utf8_lossy(&got.head).trim_end()
        )
    };
    for (added_line, prefix) in added.lines() {
        let is_it = |l: &String| {
            if prefix {
                l.starts_with(&added_line)
            } else {
                *l == added_line
            }
        };
        let count = lines.iter().filter(|l| is_it(l)).count();
        assert_eq!(count, 1, "{added_line:?} should be added once{}", context());
        lines.retain(|l| !is_it(l));
    }
    let expected = grouped(
        field_lines(request)
            .into_iter()
            .filter(|line| !removed.contains(&name_of(line).as_str())),
    );
    let got_groups = grouped(lines);
    for (name, sent) in &expected {
        assert_eq!(
            got_groups.get(name),
            Some(sent),
            "field {name:?} should reach the origin as sent{}",
            context()
        );
    }
    for (name, extra) in &got_groups {
        assert!(
            expected.contains_key(name),
            "the origin got fields {extra:?} that were neither sent nor added{}",
            context()
        );
    }
}

/// A cacheable miss of `request` on a fresh proxy: the origin got it as sent.
fn assert_miss_forwarded(request: &[u8], removed: &[&str]) {
    let s = setup("max-age=60", "");
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, removed, &Added::MISS);
}

// ---------------------------------------------------------------------------------------------
// A name's values in several forms

#[test]
fn interleaved_values_of_two_names_keep_each_value_s_form() {
    // the map lists a name's values together: x-alpha's third value is visited second, while
    // the field at the cursor is X-Beta's
    assert_miss_forwarded(
        b"GET /atk/interleaved HTTP/1.1\r\nHost: test\r\nX-Alpha: 1\r\nX-Beta: 2\r\n\
          x-alpha: 3\r\nX-BETA: 4\r\nx-alpha: 5\r\nx-beta: 6\r\n\r\n",
        &[],
    );
}

#[test]
fn interleaved_values_in_their_usual_form_but_one_on_another_name() {
    // a name's values interleaved, all usual, and the only odd name after them
    assert_miss_forwarded(
        b"GET /atk/interleaved-usual HTTP/1.1\r\nHost: test\r\nAccept: a\r\nx-b: 1\r\n\
          Accept: b\r\nx-b: 2\r\nUser-Agent: t\r\nX-Last: odd\r\n\r\n",
        &[],
    );
}

#[test]
fn three_forms_of_one_name_each_reach_the_origin() {
    assert_miss_forwarded(
        b"GET /atk/three HTTP/1.1\r\nHost: test\r\nx-tri: 1\r\nUser-Agent: u\r\nX-Tri: 2\r\n\
          Accept: */*\r\nX-TRI: 3\r\n\r\n",
        &[],
    );
}

#[test]
fn the_odd_form_only_on_the_third_value() {
    assert_miss_forwarded(
        b"GET /atk/third HTTP/1.1\r\nHost: test\r\nAccept: a\r\nx-v: 1\r\nAccept: b\r\n\
          x-v: 2\r\nACCEPT: c\r\nX-V: 3\r\n\r\n",
        &[],
    );
}

#[test]
fn the_odd_form_only_on_the_second_value_of_a_titled_name() {
    assert_miss_forwarded(
        b"GET /atk/second HTTP/1.1\r\nHost: test\r\nCookie: a=1\r\nUser-Agent: u\r\n\
          cookie: b=2\r\nCookie: c=3\r\n\r\n",
        &[],
    );
}

#[test]
fn the_usual_form_on_every_field_but_one_in_the_middle() {
    assert_miss_forwarded(
        b"GET /atk/all-but-one HTTP/1.1\r\nHost: test\r\nUser-Agent: Mozilla/5.0\r\n\
          Accept: text/html\r\nAccept-Language: en\r\nSec-Fetch-Dest: document\r\n\
          sec-fetch-SITE: none\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-User: ?1\r\n\
          Priority: u=0, i\r\nx-app: 1\r\n\r\n",
        &[],
    );
}

#[test]
fn only_the_first_or_only_the_last_field_in_another_form() {
    // Host, the first, lower case (its usual form is titled)
    assert_miss_forwarded(
        b"GET /atk/first-odd HTTP/1.1\r\nhost: test\r\nUser-Agent: u\r\nAccept: */*\r\n\
          x-app: 1\r\n\r\n",
        &[],
    );
    // the last, a custom name with a capital
    assert_miss_forwarded(
        b"GET /atk/last-odd HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\nAccept: */*\r\n\
          x-app: 1\r\nx-App: 2\r\n\r\n",
        &[],
    );
}

#[test]
fn a_request_in_the_usual_forms_reaches_the_origin_line_for_line_in_order() {
    // nothing removed, nothing odd: no case map, and the head written without one keeps the
    // client's order (the added fields after it)
    let request = b"GET /atk/order HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\nAccept: */*\r\n\
          Accept-Language: en\r\nCookie: a=b\r\nReferer: http://test/\r\nDNT: 1\r\n\
          Origin: http://test\r\nx-z: 1\r\nx-a: 2\r\n\r\n";
    let s = setup("max-age=60", "");
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    assert_forwarded(&got, request, &[], &Added::MISS);
    let lines = field_lines(&got.head);
    assert_eq!(
        lines[..field_lines(request).len()],
        field_lines(request)[..]
    );
}

// ---------------------------------------------------------------------------------------------
// Fields removed on the way

#[test]
fn hop_by_hop_fields_mid_list_are_skipped_and_odd_names_after_them_kept() {
    assert_miss_forwarded(
        b"GET /atk/hop HTTP/1.1\r\nHost: test\r\nKeep-Alive: timeout=5\r\nX-After-KA: 1\r\n\
          TE: trailers\r\nx-AFTER-te: 2\r\nProxy-Connection: keep-alive\r\nUser-agent: u\r\n\
          Connection: keep-alive, X-Nominated, te\r\nX-Nominated: gone\r\nACCEPT: */*\r\n\
          Proxy-Authorization: Basic YTpi\r\nx-after-pa: 3\r\nTrailer: X-T\r\nX-Last: 4\r\n\r\n",
        &[
            "keep-alive",
            "te",
            "proxy-connection",
            "connection",
            "x-nominated",
            "proxy-authorization",
            "trailer",
        ],
    );
}

#[test]
fn a_removed_field_that_is_the_only_odd_one_changes_nothing() {
    let request = b"GET /atk/only-removed-odd HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\n\
          KEEP-ALIVE: 5\r\nAccept: */*\r\nCONNECTION: keep-alive, X-GONE\r\nX-GONE: 1\r\n\
          x-kept: 2\r\n\r\n";
    let s = setup("max-age=60", "");
    assert_eq!(s.exchange(request).status, 200);
    // (removing a hop-by-hop field moves the header map's last name into its place, so the
    // kept fields' order may change: names, not order, are checked)
    assert_forwarded(
        &s.only_request(),
        request,
        &["keep-alive", "connection", "x-gone"],
        &Added::MISS,
    );
}

#[test]
fn an_odd_field_right_after_a_removed_one_and_a_second_value_after_that() {
    let request = b"GET /atk/after-removed HTTP/1.1\r\nHost: test\r\nConnection: X-Gone\r\n\
          X-Gone: 1\r\nX-ODD: a\r\nx-gone: 2\r\nx-odd: b\r\nUpgrade: h2c\r\nX-Odd: c\r\n\r\n";
    let s = setup("max-age=60", "");
    assert_eq!(s.exchange(request).status, 200);
    // a request asking for an upgrade is passed (not cached): no Accept-Encoding of Lacquer's
    assert_forwarded(
        &s.only_request(),
        request,
        &["connection", "x-gone", "upgrade"],
        &Added::PASS,
    );
}

#[test]
fn client_forwarding_fields_in_odd_forms_are_replaced_by_lacquer_s() {
    // from an untrusted peer, the client's forwarding fields go and Lacquer's come, once each
    assert_miss_forwarded(
        b"GET /atk/xff HTTP/1.1\r\nHost: test\r\nX-FORWARDED-FOR: 6.6.6.6\r\nx-Custom: 1\r\n\
          X-Forwarded-Proto: https\r\nx-forwarded-host: evil\r\nFORWARDED: for=6.6.6.6\r\n\r\n",
        &[
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
            "forwarded",
        ],
    );
}

#[test]
fn a_content_length_dropped_beside_transfer_encoding_does_not_shift_the_names() {
    // Content-Length and Transfer-Encoding together: Content-Length is removed while the head is
    // parsed, before the case map is decided, which moves the header map's last name into its
    // place (the map's order is no longer the received one)
    let request = b"POST /atk/te-cl HTTP/1.1\r\nHost: test\r\nContent-Length: 30\r\n\
          X-Odd: a\r\nTransfer-Encoding: chunked\r\nx-last: z\r\nx-odd: b\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n";
    let s = setup("max-age=60", "");
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    assert_eq!(got.body, b"5\r\nhello\r\n0\r\n\r\n");
    assert_forwarded(
        &got,
        request,
        &["content-length", "transfer-encoding"],
        &Added {
            chunked: true,
            ..Added::PASS
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Request rules editing the head before it is forwarded

#[test]
fn a_rule_removing_a_field_before_an_odd_one_does_not_shift_the_names() {
    // the rule's removal moves the header map's last name (x-last) into the removed one's
    // place: the map no longer lists names in the order they came
    let s = setup(
        "max-age=60",
        "[[rules]]\nremove_request_headers = [\"X-Drop\"]\n",
    );
    let request = b"GET /atk/rule-remove HTTP/1.1\r\nHost: test\r\nX-Drop: 1\r\nX-Odd: a\r\n\
          x-last: z\r\nx-odd: b\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &["x-drop"], &Added::MISS);
}

#[test]
fn a_rule_removing_a_field_before_a_name_whose_later_value_is_odd() {
    let s = setup(
        "max-age=60",
        "[[rules]]\nremove_request_headers = [\"X-Drop\"]\n",
    );
    let request = b"GET /atk/rule-remove-later HTTP/1.1\r\nHost: test\r\nX-Drop: 1\r\n\
          x-odd: a\r\nx-last: z\r\nX-ODD: b\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &["x-drop"], &Added::MISS);
}

#[test]
fn a_rule_setting_a_field_the_client_sent_keeps_the_client_s_name() {
    let s = setup(
        "max-age=60",
        "[[rules]]\nset_request_headers = { \"X-Site\" = \"blog\" }\n",
    );
    let request =
        b"GET /atk/rule-set HTTP/1.1\r\nHost: test\r\nx-SITE: old\r\nUser-Agent: u\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    let expected =
        b"GET /atk/rule-set HTTP/1.1\r\nHost: test\r\nx-SITE: blog\r\nUser-Agent: u\r\n\r\n";
    assert_forwarded(&got, expected, &[], &Added::MISS);
}

#[test]
fn a_rule_added_field_is_named_the_same_with_or_without_a_case_map() {
    // the field the rule adds was never received: its name must not depend on whether some
    // other field needed the case map
    let s = setup(
        "max-age=60",
        "[[rules]]\nset_request_headers = { \"X-Site\" = \"blog\", \"Priority\" = \"u=1\" }\n",
    );
    let usual = b"GET /atk/rule-add-1 HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\n\r\n";
    let odd = b"GET /atk/rule-add-2 HTTP/1.1\r\nHost: test\r\nUSER-AGENT: u\r\n\r\n";
    assert_eq!(s.exchange(usual).status, 200);
    assert_eq!(s.exchange(odd).status, 200);
    let site_line = |line: &str| {
        let got = s.request_for(line);
        let lines = field_lines(&got.head);
        let find = |name: &str| {
            lines
                .iter()
                .filter(|l| name_of(l) == name)
                .cloned()
                .collect::<Vec<_>>()
        };
        (find("x-site"), find("priority"), find("user-agent"))
    };
    let (site_usual, priority_usual, ua_usual) = site_line("GET /atk/rule-add-1 HTTP/1.1");
    let (site_odd, priority_odd, ua_odd) = site_line("GET /atk/rule-add-2 HTTP/1.1");
    assert_eq!(ua_usual, ["User-Agent: u"]);
    assert_eq!(ua_odd, ["USER-AGENT: u"]);
    assert_eq!(site_usual, site_odd, "x-site named differently");
    assert_eq!(priority_usual, priority_odd, "priority named differently");
    assert_eq!(site_usual.len(), 1, "{site_usual:?}");
    assert_eq!(priority_usual.len(), 1, "{priority_usual:?}");
}

#[test]
fn strip_cookies_removes_every_form_of_cookie_and_keeps_the_rest_as_sent() {
    let s = setup("max-age=60", "[[rules]]\nstrip_cookies = true\n");
    let request = b"GET /atk/strip HTTP/1.1\r\nHost: test\r\nCOOKIE: a=1\r\nX-After: 1\r\n\
          cookie: b=2\r\nx-after: 2\r\nUser-Agent: u\r\nCookie: c=3\r\nuser-AGENT: v\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &["cookie"], &Added::MISS);
}

#[test]
fn strip_cookies_before_a_name_whose_first_value_is_odd() {
    // README's stylesheet rule: removing Cookie moves the map's last name (x-last) into its
    // place; x-odd's first value is then looked for at the cursor, past it
    let s = setup("max-age=60", "[[rules]]\nstrip_cookies = true\n");
    let request = b"GET /atk/strip-shift HTTP/1.1\r\nHost: test\r\nCookie: a=1\r\nX-Odd: 1\r\n\
          x-last: z\r\nx-odd: 2\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &["cookie"], &Added::MISS);
}

// ---------------------------------------------------------------------------------------------
// Names that collide in lower case with the titled forms Pingora knows

#[test]
fn titled_names_written_in_other_forms_arrive_as_sent() {
    assert_miss_forwarded(
        b"GET /atk/collide HTTP/1.1\r\nHost: test\r\npriority: u=1\r\nPRIORITY: u=2\r\n\
          Priority: u=3\r\nsec-fetch-mode: cors\r\nx-requested-with: XMLHttpRequest\r\n\
          Dnt: 1\r\nuser-agent: lower\r\nUser-agent: half\r\nAccept-language: en\r\n\
          Upgrade-insecure-requests: 1\r\naccept: */*\r\nreferer: http://test/\r\n\
          ORIGIN: http://test\r\nSEC-FETCH-DEST: empty\r\nSec-Fetch-site: same-origin\r\n\r\n",
        &[],
    );
}

#[test]
fn dnt_in_its_titled_form_and_its_capitalised_form() {
    // `DNT` is its titled form, `Dnt` is not: the first request needs no map, the second does
    assert_miss_forwarded(
        b"GET /atk/dnt-1 HTTP/1.1\r\nHost: test\r\nDNT: 1\r\n\r\n",
        &[],
    );
    assert_miss_forwarded(
        b"GET /atk/dnt-2 HTTP/1.1\r\nHost: test\r\nDNT: 1\r\nDnt: 2\r\ndnt: 3\r\n\r\n",
        &[],
    );
}

#[test]
fn a_request_with_every_name_in_lower_case_arrives_in_lower_case() {
    // as some HTTP libraries write them: titled names too must arrive lower-case
    assert_miss_forwarded(
        b"GET /atk/lower HTTP/1.1\r\nhost: test\r\nuser-agent: node\r\naccept: */*\r\n\
          accept-language: en\r\ncookie: a=b\r\nauthorization: Bearer x\r\n\
          origin: http://test\r\nreferer: http://test/\r\n\
          sec-fetch-user: ?1\r\nx-requested-with: fetch\r\npriority: i\r\n\r\n",
        &[],
    );
}

#[test]
fn a_client_accept_encoding_in_another_form_is_replaced_on_a_miss_and_kept_on_a_pass() {
    // on a miss Lacquer asks for what it stores, named as its own field
    assert_miss_forwarded(
        b"GET /atk/ae HTTP/1.1\r\nHost: test\r\nACCEPT-ENCODING: br\r\nx-a: 1\r\n\r\n",
        &["accept-encoding"],
    );
    // a POST is passed with the client's
    let s = setup("max-age=60", "");
    let request = b"POST /atk/ae-post HTTP/1.1\r\nHost: test\r\naccept-encoding: br\r\n\
          Content-Length: 0\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &[], &Added::PASS);
}

// ---------------------------------------------------------------------------------------------
// Many fields, long names

#[test]
fn two_hundred_and_forty_fields_in_assorted_forms() {
    // 240 client fields + Host; with Lacquer's 4 added, under the 256-field limit
    let mut request = String::from("GET /atk/many HTTP/1.1\r\nHost: test\r\n");
    for i in 0..240 {
        let name = match i % 5 {
            0 => format!("x-field-{i}"),
            1 => format!("X-Field-{i}"),
            2 => format!("X-FIELD-{i}"),
            3 => "x-shared".to_string(),
            _ => "X-Shared".to_string(),
        };
        request.push_str(&format!("{name}: v{i}\r\n"));
    }
    request.push_str("\r\n");
    let s = setup("max-age=60", "[server]\nmax_header_size = \"64KiB\"\n");
    // the capture origin frames with room for 128 fields: it answers this one 400, having
    // recorded its head (what is checked)
    let _ = s.exchange(request.as_bytes());
    assert_forwarded(&s.only_request(), request.as_bytes(), &[], &Added::MISS);
}

#[test]
fn one_name_fifty_times_with_one_odd_value_deep_in() {
    let mut request = String::from("GET /atk/fifty HTTP/1.1\r\nHost: test\r\n");
    for i in 0..50 {
        let name = if i == 37 { "X-Many" } else { "x-many" };
        request.push_str(&format!("{name}: {i}\r\n"));
        if i % 10 == 0 {
            request.push_str(&format!("Accept: a{i}\r\n"));
        }
    }
    request.push_str("\r\n");
    assert_miss_forwarded(request.as_bytes(), &[]);
}

#[test]
fn one_name_fifty_times_all_usual_then_one_odd_name_last() {
    let mut request = String::from("GET /atk/fifty-usual HTTP/1.1\r\nHost: test\r\n");
    for i in 0..50 {
        request.push_str(&format!("x-many: {i}\r\n"));
    }
    request.push_str("X-Tail: t\r\n\r\n");
    assert_miss_forwarded(request.as_bytes(), &[]);
}

#[test]
fn long_names_in_mixed_case() {
    let long_odd: String = (0..3000)
        .map(|i| if i % 3 == 0 { 'X' } else { 'y' })
        .collect();
    let long_usual = "z".repeat(3000);
    let request = format!(
        "GET /atk/long HTTP/1.1\r\nHost: test\r\n{long_usual}: 1\r\n{long_odd}: 2\r\n\
         {}: 3\r\n\r\n",
        long_odd.to_ascii_lowercase()
    );
    assert_miss_forwarded(request.as_bytes(), &[]);
}

// ---------------------------------------------------------------------------------------------
// Several requests on one connection

#[test]
fn pipelined_requests_each_keep_their_own_forms() {
    let s = setup("max-age=60", "");
    let first = "GET /atk/pipe-1 HTTP/1.1\r\nHost: test\r\nX-PIPE: 1\r\nuser-agent: a\r\n\
                 x-more: 1\r\nx-more: 2\r\n\r\n";
    let second = "GET /atk/pipe-2 HTTP/1.1\r\nHost: test\r\nx-pipe: 2\r\nUser-Agent: b\r\n\r\n";
    let third = "GET /atk/pipe-3 HTTP/1.1\r\nhost: test\r\nx-Pipe: 3\r\nUSER-AGENT: c\r\n\
                 X-More: 3\r\n\r\n";
    let fourth = "GET /atk/pipe-4 HTTP/1.1\r\nHost: test\r\n\r\n";
    let mut conn = RawConn::connect(s.lacquer.addr());
    conn.send(format!("{first}{second}{third}{fourth}").as_bytes());
    for _ in 0..4 {
        assert_eq!(conn.read_response(false).status, 200);
    }
    for (request, line) in [
        (first, "GET /atk/pipe-1 HTTP/1.1"),
        (second, "GET /atk/pipe-2 HTTP/1.1"),
        (third, "GET /atk/pipe-3 HTTP/1.1"),
        (fourth, "GET /atk/pipe-4 HTTP/1.1"),
    ] {
        assert_forwarded(&s.request_for(line), request.as_bytes(), &[], &Added::MISS);
    }
}

#[test]
fn keep_alive_requests_alternating_odd_and_usual_forms() {
    let s = setup("max-age=60", "");
    let requests = [
        "GET /atk/ka-1 HTTP/1.1\r\nHost: test\r\nX-A: 1\r\nx-b: 1\r\nx-c: 1\r\nx-d: 1\r\n\r\n",
        "GET /atk/ka-2 HTTP/1.1\r\nHost: test\r\nx-a: 2\r\n\r\n",
        "POST /atk/ka-3 HTTP/1.1\r\nHost: test\r\nx-a: 3\r\nContent-length: 1\r\n\r\nz",
        "GET /atk/ka-4 HTTP/1.1\r\nHost: test\r\nx-a: 4\r\nx-b: 4\r\nX-C: 4\r\n\r\n",
        "GET /atk/ka-5 HTTP/1.1\r\nHost: test\r\nx-a: 5\r\nx-b: 5\r\nx-c: 5\r\nx-d: 5\r\n\r\n",
    ];
    let mut conn = RawConn::connect(s.lacquer.addr());
    for request in requests {
        conn.send(request.as_bytes());
        assert_eq!(conn.read_response(false).status, 200);
    }
    for request in requests {
        let line = request.split("\r\n").next().unwrap();
        let added = if request.starts_with("POST") {
            &Added::PASS
        } else {
            &Added::MISS
        };
        assert_forwarded(&s.request_for(line), request.as_bytes(), &[], added);
    }
}

// ---------------------------------------------------------------------------------------------
// Each forwarding path

#[test]
fn a_post_with_a_sized_body_in_odd_forms() {
    let s = setup("max-age=60", "");
    let request = b"POST /atk/post HTTP/1.1\r\nHost: test\r\nCONTENT-LENGTH: 5\r\n\
          content-type: text/plain\r\nX-Token: 1\r\nx-token: 2\r\n\r\nhello";
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    assert_eq!(got.body, b"hello");
    assert_forwarded(&got, request, &[], &Added::PASS);
}

#[test]
fn a_post_with_a_listed_content_length_keeps_its_name() {
    let s = setup("max-age=60", "");
    let request = b"POST /atk/post-listed HTTP/1.1\r\nHost: test\r\ncontent-LENGTH: 5, 5\r\n\
          X-Odd: 1\r\n\r\nhello";
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    assert_eq!(got.body, b"hello");
    let expected = b"POST /atk/post-listed HTTP/1.1\r\nHost: test\r\ncontent-LENGTH: 5\r\n\
          X-Odd: 1\r\n\r\n";
    assert_forwarded(&got, expected, &[], &Added::PASS);
}

#[test]
fn a_post_with_a_chunked_body_in_odd_forms() {
    let s = setup("max-age=60", "");
    let request = b"POST /atk/chunked HTTP/1.1\r\nHost: test\r\ntransfer-encoding: chunked\r\n\
          X-Odd: 1\r\ncontent-type: text/plain\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    assert_eq!(got.body, b"5\r\nhello\r\n0\r\n\r\n");
    assert_forwarded(
        &got,
        request,
        &["transfer-encoding"],
        &Added {
            chunked: true,
            ..Added::PASS
        },
    );
}

#[test]
fn a_post_with_expect_100_continue_in_odd_forms() {
    let s = setup("max-age=60", "");
    let head = b"POST /atk/expect HTTP/1.1\r\nHost: test\r\nEXPECT: 100-continue\r\n\
          Content-Length: 5\r\nx-Odd: 1\r\n\r\n";
    let mut conn = RawConn::connect(s.lacquer.addr());
    conn.send(head);
    // the body follows whether or not a 100 came first; read_response skips a 100
    conn.send(b"hello");
    assert_eq!(conn.read_response(false).status, 200);
    let got = s.only_request();
    assert_eq!(got.body, b"hello");
    assert_forwarded(&got, head, &[], &Added::PASS);
}

#[test]
fn a_head_request_in_odd_forms() {
    let s = setup("max-age=60", "");
    let request = b"HEAD /atk/head HTTP/1.1\r\nHost: test\r\nX-Odd: 1\r\naccept: */*\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    // a HEAD miss may be fetched as a GET to fill the cache; its names are what is checked
    assert!(
        got.request_line().ends_with(" /atk/head HTTP/1.1"),
        "{}",
        got.request_line()
    );
    assert_forwarded(&got, request, &[], &Added::MISS);
}

#[test]
fn a_no_cache_request_in_odd_forms() {
    let s = setup("max-age=60", "");
    let request = b"GET /atk/no-cache HTTP/1.1\r\nHost: test\r\ncache-control: no-cache\r\n\
          PRAGMA: no-cache\r\nX-Odd: 1\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &[], &Added::MISS);
}

#[test]
fn a_direct_pass_after_no_store_keeps_each_request_s_forms() {
    let s = setup("no-store", "");
    let first = b"GET /atk/direct HTTP/1.1\r\nHost: test\r\nx-odd: 1\r\nUser-Agent: u\r\n\r\n";
    let second = b"GET /atk/direct HTTP/1.1\r\nHost: test\r\nX-ODD: 2\r\nuser-agent: v\r\n\
          x-odd: 3\r\n\r\n";
    let third = b"GET /atk/direct HTTP/1.1\r\nHost: test\r\nx-odd: 4\r\nUser-Agent: w\r\n\r\n";
    for request in [&first[..], &second[..], &third[..]] {
        assert_eq!(s.exchange(request).status, 200);
    }
    let got = s.origin.requests();
    assert_eq!(got.len(), 3, "{}", s.origin.received_text());
    // the first is a miss (Lacquer did not yet know the URL is no-store); the next two may be
    // passed with or without Lacquer's Accept-Encoding
    assert_forwarded(&got[0], first, &[], &Added::MISS);
    for (got, sent) in got[1..].iter().zip([&second[..], &third[..]]) {
        let gzip = field_lines(&got.head)
            .iter()
            .any(|l| l == "Accept-Encoding: gzip");
        assert_forwarded(
            got,
            sent,
            &[],
            &Added {
                gzip,
                ..Added::PASS
            },
        );
    }
}

#[test]
fn a_request_through_a_proxy_with_caching_disabled_in_odd_forms() {
    let s = setup("max-age=60", "[cache]\nenabled = false\n");
    let request = b"GET /atk/disabled HTTP/1.1\r\nHost: test\r\nX-Odd: 1\r\nUser-Agent: u\r\n\
          user-agent: v\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &[], &Added::PASS);
}

#[test]
fn http_1_0_requests_in_odd_forms() {
    let s = setup("max-age=60", "");
    let request = b"GET /atk/ten HTTP/1.0\r\nHost: test\r\nconnection: keep-alive\r\n\
          X-Ten: 1\r\nuser-agent: old\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(
        &s.only_request(),
        request,
        &["connection"],
        &Added {
            via: "1.0",
            ..Added::MISS
        },
    );
}

#[test]
fn an_http_1_0_request_without_host_gets_one_and_keeps_its_forms() {
    let s = setup("max-age=60", "");
    let request = b"GET /atk/ten-no-host HTTP/1.0\r\nX-Ten: 1\r\nuser-agent: old\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    let got = s.only_request();
    let lines = field_lines(&got.head);
    let hosts: Vec<_> = lines.iter().filter(|l| name_of(l) == "host").collect();
    assert_eq!(hosts.len(), 1, "{lines:#?}");
    let host = hosts[0].clone();
    // the Host Lacquer adds (after its forwarding fields: no x-forwarded-host) counted as sent
    let expected =
        format!("GET /atk/ten-no-host HTTP/1.0\r\n{host}\r\nX-Ten: 1\r\nuser-agent: old\r\n\r\n");
    assert!(host.starts_with("Host: "), "{host}");
    assert_forwarded(
        &got,
        expected.as_bytes(),
        &[],
        &Added {
            host: None,
            via: "1.0",
            ..Added::MISS
        },
    );
}

#[test]
fn an_absolute_form_request_keeps_its_host_s_name() {
    let s = setup("max-age=60", "");
    let request = b"GET http://test/atk/absolute HTTP/1.1\r\nHOST: test\r\nx-A: 1\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    assert_forwarded(&s.only_request(), request, &[], &Added::MISS);
}

#[test]
fn a_background_revalidation_in_the_usual_forms_with_an_odd_later_value() {
    let s = setup("max-age=1, stale-while-revalidate=60", "");
    let request = b"GET /atk/swr HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\nAccept: */*\r\n\
          x-a: 1\r\nX-A: 2\r\nKeep-Alive: 3\r\nx-b: 3\r\n\r\n";
    assert_eq!(s.exchange(request).text(), "origin #1");
    std::thread::sleep(Duration::from_millis(2100));
    let again = b"GET /atk/swr HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\nAccept: */*\r\n\
          x-a: 1\r\nX-A: 2\r\nKeep-Alive: 3\r\nx-b: 3\r\n\r\n";
    assert_eq!(s.exchange(again).text(), "origin #1", "served stale");
    assert!(
        poll_until(Duration::from_secs(10), || s.origin.requests().len() == 2),
        "no background revalidation reached the origin: {}",
        s.origin.received_text()
    );
    let got = s.origin.requests();
    assert_forwarded(&got[0], request, &["keep-alive"], &Added::MISS);
    assert_forwarded(&got[1], again, &["keep-alive"], &Added::MISS);
}

#[test]
fn a_background_revalidation_in_the_usual_forms_only() {
    let s = setup("max-age=1, stale-while-revalidate=60", "");
    let request = b"GET /atk/swr-usual HTTP/1.1\r\nHost: test\r\nUser-Agent: u\r\n\
          Sec-Fetch-Mode: navigate\r\nx-a: 1\r\n\r\n";
    assert_eq!(s.exchange(request).text(), "origin #1");
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(s.exchange(request).text(), "origin #1", "served stale");
    assert!(
        poll_until(Duration::from_secs(10), || s.origin.requests().len() == 2),
        "no background revalidation reached the origin: {}",
        s.origin.received_text()
    );
    for got in s.origin.requests() {
        assert_forwarded(&got, request, &[], &Added::MISS);
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/2 clients forwarded over HTTP/1

/// The origin's lines for an h2 request: each name (lower-cased) to its lines.
fn h2_check(got: &CapturedRequest, sent: &[(&str, &str)], gzip: bool, via: &str) {
    let lines = field_lines(&got.head);
    let groups = grouped(lines.clone());
    for (name, value) in sent {
        let group = groups
            .get(*name)
            .unwrap_or_else(|| panic!("{name} lost: {lines:#?}"));
        let line = group
            .iter()
            .find(|l| l.ends_with(&format!(": {value}")))
            .unwrap_or_else(|| panic!("{name}: {value} lost: {lines:#?}"));
        let written = line.split(':').next().unwrap();
        // an h2 name arrives lower-case: it goes on in lower case or in Pingora's titled form
        assert!(
            written == *name || written.chars().any(|c| c.is_ascii_uppercase()),
            "{line}"
        );
        assert!(
            written.bytes().all(|b| b.is_ascii_graphic() && b != b':'),
            "{line}"
        );
    }
    for (name, group) in &groups {
        let sent_count = sent.iter().filter(|(n, _)| n == name).count();
        let expected = match name.as_str() {
            "host" | "x-forwarded-for" | "x-forwarded-proto" | "x-forwarded-host" | "via" => 1,
            "accept-encoding" if gzip => 1,
            _ => sent_count,
        };
        assert_eq!(group.len(), expected, "{name}: {lines:#?}");
    }
    assert!(
        lines.iter().any(|l| l.starts_with(&format!("via: {via} "))),
        "{lines:#?}"
    );
    if gzip {
        assert!(
            lines.iter().any(|l| l == "Accept-Encoding: gzip"),
            "{lines:#?}"
        );
    }
}

#[tokio::test]
async fn an_h2_request_reaches_an_h1_origin_complete() {
    let origin = CaptureOrigin::start();
    let lacquer = LacquerProcess::start_simple(origin.addr(), QUIET);
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let fields = [
        ("user-agent", "h2-client"),
        ("accept", "*/*"),
        ("x-custom", "1"),
        ("x-custom", "2"),
        ("priority", "u=1"),
        ("sec-fetch-mode", "cors"),
        ("dnt", "1"),
        ("x-requested-with", "fetch"),
        ("accept-language", "en"),
    ];
    let answer = h2_fetch(&sender, "GET", &lacquer.url("/atk/h2"), &fields)
        .await
        .expect("h2 answer");
    assert_eq!(answer.status, 200);
    let post = h2_fetch(&sender, "POST", &lacquer.url("/atk/h2-post"), &fields)
        .await
        .expect("h2 answer");
    assert_eq!(post.status, 200);
    driver.abort();
    let requests = origin.requests();
    assert_eq!(requests.len(), 2, "{}", origin.received_text());
    let get = requests
        .iter()
        .find(|r| r.request_line().starts_with("GET "))
        .unwrap();
    h2_check(get, &fields, true, "2");
    let post = requests
        .iter()
        .find(|r| r.request_line().starts_with("POST "))
        .unwrap();
    h2_check(post, &fields, false, "2");
}

#[tokio::test]
async fn an_h2_request_s_background_revalidation_reaches_an_h1_origin_complete() {
    let origin = CaptureOrigin::start_answering("max-age=1, stale-while-revalidate=60");
    let lacquer = LacquerProcess::start_simple(origin.addr(), QUIET);
    let fields = [
        ("user-agent", "h2-client"),
        ("x-custom", "1"),
        ("x-custom", "2"),
        ("priority", "u=1"),
    ];
    let url = lacquer.url("/atk/h2-swr");
    let (sender, driver) = h2_connect_default(lacquer.addr()).await;
    let first = h2_fetch(&sender, "GET", &url, &fields).await.unwrap();
    assert_eq!(first.text(), "origin #1");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let stale = h2_fetch(&sender, "GET", &url, &fields).await.unwrap();
    assert_eq!(stale.text(), "origin #1", "served stale");
    assert!(
        poll_until_async(Duration::from_secs(10), || origin.requests().len() == 2).await,
        "no background revalidation reached the origin: {}",
        origin.received_text()
    );
    // and its answer is the one stored: the next request gets the refreshed page
    let mut refreshed = false;
    for _ in 0..100 {
        let next = h2_fetch(&sender, "GET", &url, &fields).await.unwrap();
        if next.text() == "origin #2" {
            refreshed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refreshed,
        "the background revalidation's answer was not stored"
    );
    driver.abort();
    let requests = origin.requests();
    assert_eq!(requests.len(), 2, "{}", origin.received_text());
    h2_check(&requests[0], &fields, true, "2");
    // the revalidation is a request Lacquer makes of its own, over HTTP/1.1 (pingora-core
    // patch "h2 subrequests": it was never made for an HTTP/2 client's stale hit)
    h2_check(&requests[1], &fields, true, "1.1");
}

#[test]
fn a_range_request_s_fields_in_odd_forms() {
    let s = setup("max-age=60", "");
    let request = b"GET /atk/range HTTP/1.1\r\nHost: test\r\nRANGE: bytes=0-3\r\nX-Odd: 1\r\n\
          user-agent: r\r\n\r\n";
    assert_eq!(s.exchange(request).status, 206);
    // a range miss fetches the whole representation to store it: Range is not forwarded (the
    // cache removes it after the case map was decided); the other names are as sent
    assert_forwarded(&s.only_request(), request, &["range"], &Added::MISS);
}

// ---------------------------------------------------------------------------------------------
// Fields Lacquer adds or replaces beside the client's

#[test]
fn a_client_via_in_another_form_is_kept_and_lacquer_s_added_after_it() {
    assert_miss_forwarded(
        b"GET /atk/via HTTP/1.1\r\nHost: test\r\nVIA: 1.0 first\r\nx-a: 1\r\n\r\n",
        &[],
    );
    assert_miss_forwarded(
        b"GET /atk/via-usual HTTP/1.1\r\nHost: test\r\nvia: 1.0 first\r\nx-a: 1\r\n\r\n",
        &[],
    );
}

#[test]
fn a_trusted_peer_s_forwarding_fields_in_odd_forms() {
    // kept from a trusted peer: X-Forwarded-For gets the peer appended under Lacquer's name,
    // X-Forwarded-Proto and -Host stay as the peer wrote them
    let s = setup(
        "max-age=60",
        "[proxy]\ntrusted_proxies = [\"127.0.0.1/32\"]\nforwarded = \"both\"\n",
    );
    let request = b"GET /atk/trusted HTTP/1.1\r\nHost: test\r\nX-FORWARDED-FOR: 6.6.6.6\r\n\
          X-Forwarded-Proto: https\r\nx-Forwarded-Host: front\r\nX-Odd: 1\r\n\r\n";
    assert_eq!(s.exchange(request).status, 200);
    let mut got = field_lines(&s.only_request().head);
    let via: Vec<_> = got
        .iter()
        .filter(|l| name_of(l) == "via")
        .cloned()
        .collect();
    assert_eq!(via.len(), 1, "{got:#?}");
    assert!(via[0].starts_with("via: 1.1 "), "{got:#?}");
    got.retain(|l| name_of(l) != "via");
    got.sort();
    let mut expected = vec![
        "Host: test",
        "x-forwarded-for: 6.6.6.6, 127.0.0.1",
        "X-Forwarded-Proto: https",
        "x-Forwarded-Host: front",
        "X-Odd: 1",
        "Accept-Encoding: gzip",
        "forwarded: for=127.0.0.1;proto=https",
    ];
    expected.sort();
    assert_eq!(got, expected);
}

#[test]
fn a_websocket_request_s_names_do_not_depend_on_another_field_s_form() {
    // Lacquer re-adds Connection and Upgrade itself; their names must be the same whether or
    // not some other field needed the case map, and the client's other names as sent
    let s = setup("max-age=60", "");
    let usual = b"GET /atk/ws-1 HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\n\
          Upgrade: websocket\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          sec-websocket-version: 13\r\n\r\n";
    let odd = b"GET /atk/ws-2 HTTP/1.1\r\nHost: test\r\nCONNECTION: upgrade\r\n\
          UPGRADE: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\n";
    for request in [&usual[..], &odd[..]] {
        let mut conn = RawConn::connect(s.lacquer.addr());
        conn.send(request);
        // the origin answers 200, not 101: whatever the client gets, the origin's head counts
        let _ = conn.try_read_response(false);
    }
    let hop = |line: &str| {
        let lines = field_lines(&s.request_for(line).head);
        let (hop, rest): (Vec<String>, Vec<String>) = lines
            .into_iter()
            .partition(|l| ["connection", "upgrade"].contains(&name_of(l).as_str()));
        (hop, rest)
    };
    let (hop_usual, rest_usual) = hop("GET /atk/ws-1 HTTP/1.1");
    let (hop_odd, rest_odd) = hop("GET /atk/ws-2 HTTP/1.1");
    let mut sorted = (hop_usual.clone(), hop_odd.clone());
    sorted.0.sort();
    sorted.1.sort();
    assert_eq!(sorted.0, sorted.1, "Connection/Upgrade named differently");
    assert_eq!(hop_usual.len(), 2, "{hop_usual:?}");
    for (rest, sent) in [(rest_usual, &usual[..]), (rest_odd, &odd[..])] {
        for line in field_lines(sent)
            .into_iter()
            .filter(|l| name_of(l).starts_with("sec-websocket") || name_of(l) == "host")
        {
            assert!(rest.contains(&line), "{line:?} lost: {rest:#?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// How the head arrives

#[test]
fn pipelined_posts_with_bodies_between_gets_in_other_forms() {
    let s = setup("max-age=60", "");
    let first =
        "POST /atk/pp-1 HTTP/1.1\r\nHost: test\r\nCONTENT-length: 4\r\nX-Odd: 1\r\n\r\nbody";
    let second = "GET /atk/pp-2 HTTP/1.1\r\nHost: test\r\nx-odd: 2\r\nUser-Agent: u\r\n\r\n";
    let third = "POST /atk/pp-3 HTTP/1.1\r\nHost: test\r\ntransfer-ENCODING: chunked\r\n\
                 x-Odd: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    let fourth = "GET /atk/pp-4 HTTP/1.1\r\nhost: test\r\nUSER-agent: v\r\n\r\n";
    let mut conn = RawConn::connect(s.lacquer.addr());
    conn.send(format!("{first}{second}{third}{fourth}").as_bytes());
    for _ in 0..4 {
        assert_eq!(conn.read_response(false).status, 200);
    }
    let pass_chunked = Added {
        chunked: true,
        ..Added::PASS
    };
    for (request, line, removed, added) in [
        (first, "POST /atk/pp-1 HTTP/1.1", &[][..], &Added::PASS),
        (second, "GET /atk/pp-2 HTTP/1.1", &[][..], &Added::MISS),
        (
            third,
            "POST /atk/pp-3 HTTP/1.1",
            &["transfer-encoding"][..],
            &pass_chunked,
        ),
        (fourth, "GET /atk/pp-4 HTTP/1.1", &[][..], &Added::MISS),
    ] {
        assert_forwarded(&s.request_for(line), request.as_bytes(), removed, added);
    }
    assert_eq!(s.request_for("POST /atk/pp-1 HTTP/1.1").body, b"body");
}

#[test]
fn a_head_arriving_in_many_pieces_keeps_its_names() {
    // the head is read in several reads (split inside names), the buffer growing between them
    let s = setup("max-age=60", "");
    let request = b"GET /atk/pieces HTTP/1.1\r\nHost: test\r\nX-Piece-ONE: 1\r\n\
          user-agent: split\r\nx-piece-one: 2\r\nAccept: */*\r\nX-LAST-piece: 3\r\n\r\n";
    let mut conn = RawConn::connect(s.lacquer.addr());
    for piece in request.chunks(7) {
        conn.send(piece);
        std::thread::sleep(Duration::from_millis(15));
    }
    assert_eq!(conn.read_response(false).status, 200);
    assert_forwarded(&s.only_request(), request, &[], &Added::MISS);
}

#[test]
fn empty_values_and_unusual_token_names_keep_their_forms() {
    assert_miss_forwarded(
        b"GET /atk/tokens HTTP/1.1\r\nHost: test\r\nX-Empty: \r\nx_Under_Score: 1\r\n\
          X.Dot~Tilde: 2\r\nx.dot~tilde: 3\r\n!#$%&'*+-.^_`|~: 4\r\nx-empty: \r\nZ: 5\r\n\r\n",
        &[],
    );
}

// ---------------------------------------------------------------------------------------------
// Many generated heads

/// A small deterministic generator (a linear congruential one), so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn three_hundred_generated_heads_each_reach_the_origin_as_sent() {
    // names in their usual form and in others, repeated and interleaved, with hop-by-hop and
    // Connection-nominated fields among them; each value unique, so a name given to the wrong
    // value shows
    const NAMES: &[&str] = &[
        "Accept",
        "accept",
        "ACCEPT",
        "User-Agent",
        "user-agent",
        "Cookie",
        "cookie",
        "x-a",
        "X-A",
        "x-b",
        "X-b",
        "Priority",
        "priority",
        "DNT",
        "dnt",
        "Dnt",
        "Sec-Fetch-Mode",
        "sec-fetch-mode",
        "X-Requested-With",
        "x-requested-with",
        "Accept-Language",
        "Referer",
        "referer",
        "Origin",
        "Content-Type",
        "content-type",
        "Keep-Alive",
        "keep-alive",
        "TE",
        "Proxy-Connection",
        "X-Hop",
        "x-hop",
    ];
    const HOSTS: &[&str] = &["Host", "host", "HOST"];
    let s = setup("max-age=60", "");
    let mut rng = Lcg(0x5eed_c0de);
    let mut sent = Vec::new();
    let mut conn = RawConn::connect(s.lacquer.addr());
    for n in 0..300 {
        let mut fields: Vec<String> = (0..rng.below(12))
            .map(|i| format!("{}: v{n}-{i}", NAMES[rng.below(NAMES.len())]))
            .collect();
        let at = rng.below(fields.len() + 1);
        fields.insert(at, format!("{}: test", HOSTS[rng.below(HOSTS.len())]));
        if rng.below(3) == 0 {
            let at = rng.below(fields.len() + 1);
            fields.insert(at, "Connection: keep-alive, X-Hop".to_string());
        }
        let request = format!(
            "GET /atk/gen-{n} HTTP/1.1\r\n{}\r\n\r\n",
            fields.join("\r\n")
        );
        // a new connection now and then
        if n % 50 == 0 {
            conn = RawConn::connect(s.lacquer.addr());
        }
        conn.send(request.as_bytes());
        assert_eq!(conn.read_response(false).status, 200, "{request}");
        sent.push(request);
    }
    let got = s.origin.requests();
    assert_eq!(got.len(), sent.len());
    for request in &sent {
        let line = request.split("\r\n").next().unwrap();
        let mut hop_by_hop = vec!["keep-alive", "te", "proxy-connection"];
        if request.contains("Connection: keep-alive, X-Hop") {
            hop_by_hop.extend(["connection", "x-hop"]);
        }
        assert_forwarded(
            &s.request_for(line),
            request.as_bytes(),
            &hop_by_hop,
            &Added::MISS,
        );
    }
}
