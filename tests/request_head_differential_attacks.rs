//! Differential attacks on how Lacquer reads an HTTP/1 request head: for each odd request, what
//! the origin receives (every byte, through a raw origin of this file), the cache entry it is
//! stored under (filled with one spelling, asked with another), and the fast path's answer
//! against the standard path's (forced with `Cache-Control: max-stale`).
//!
//! Findings (2026-12-07, a breaker session's attack on 91bf805). The three failures were fixed in
//! the commit that added this file: `policy::vary::normalized_value` now works on bytes, treats
//! only space and tab as whitespace and splits lists only at commas outside quoted strings
//! (`list_items`). As found:
//!
//! * **(was) FAIL: non-UTF-8 values of a field named in `Vary` select one variant.**
//!   `policy::vary::normalized_value` reads values with `from_utf8_lossy`, so `X-V: \xff` and
//!   `X-V: \xfe` pick the same variant although the origin saw different values
//!   (`non_utf8_values_of_a_vary_field_are_different_variants`). Fast and standard path alike
//!   (one `variance_key`), so it is the proxy against the origin, not path against path.
//! * **(was) FAIL: Unicode whitespace in a field named in `Vary` is trimmed as if it were OWS.**
//!   The same function splits with `str::split_whitespace`, which takes U+00A0 (`\xc2\xa0`),
//!   U+0085 and U+3000 for whitespace: the variant filled by `X-V: \xc2\xa0v2` (or `v2\xc2\x85`,
//!   `v2\xe3\x80\x80`) is served to `X-V: v2`, though HTTP's OWS is SP and HTAB only and the
//!   origin saw another value
//!   (`unicode_whitespace_in_a_vary_field_is_not_http_whitespace`).
//! * **(was) FAIL: a comma inside a quoted string of a `Vary` field is taken for a list separator.**
//!   `normalized_value` splits on every `,` and re-joins with `", "`, so `X-V: p="a,b"` and
//!   `X-V: p="a, b"` are one variant though the quoted strings differ
//!   (`a_comma_inside_a_quoted_string_of_a_vary_field_is_not_a_list_separator`).
//! * PASS (guard): a target that is not UTF-8 would be keyed by its lossy rendering (Pingora
//!   puts `from_utf8_lossy` of it in the URI, `cache_key::path` keys the URI, the origin would
//!   get the bytes), but Pingora refuses such a head with 400 first (httparse, and the escaping
//!   regex matches only UTF-8), so `/p/\xff` never shares `/p/\xef\xbf\xbd`'s entry
//!   (`a_target_that_is_not_utf8_never_shares_the_entry_of_its_lossy_rendering`).
//! * PASS (guards): a fragment is dropped for key and origin alike; percent-encoding, dot
//!   segments, `//`, `;` parameters, `?` alone and case in the path are distinct keys, each sent
//!   to the origin verbatim; whitespace and control bytes in a target are escaped by Pingora
//!   before the key is made, so key and origin see the same escaped target; HTTP/1.0,
//!   absolute-form (any case of scheme and host) and `Host` in other case share the entry of the
//!   origin-form request; a lowercase `get` is never a cache read; a pipeline split at every
//!   byte offset is answered the same; ASCII spellings of a `Vary` field select the same variant
//!   on the fast and the standard path; two `Range` lines get the same answer on both paths.

use lacquer_test_support as support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use support::raw_text::find;
use support::*;

/// A raw origin: keeps every request head byte for byte, and answers each with `200`,
/// `Cache-Control: max-age=60`, the given extra fields (`Vary: X-V`, say) and the body `#N`
/// (N counting requests from 1), on a kept-alive connection.
struct WireOrigin {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
}

impl WireOrigin {
    fn start(extra_fields: &'static str) -> WireOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let counter = Arc::new(AtomicUsize::new(0));
        let (kept, halt) = (heads.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (kept, counter) = (kept.clone(), counter.clone());
                        std::thread::spawn(move || serve(stream, &kept, &counter, extra_fields));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        WireOrigin { addr, heads, stop }
    }

    /// Every request head received so far, in order.
    fn heads(&self) -> Vec<Vec<u8>> {
        self.heads.lock().unwrap().clone()
    }

    /// The request line of every request received, as bytes (CRLF excluded).
    fn request_lines(&self) -> Vec<Vec<u8>> {
        self.heads()
            .iter()
            .map(|head| {
                let end = find(head, b"\r\n").unwrap_or(head.len());
                head[..end].to_vec()
            })
            .collect()
    }

    /// The raw value bytes of every field line named `name` in request `index`.
    fn field_values(&self, index: usize, name: &str) -> Vec<Vec<u8>> {
        let head = &self.heads()[index];
        head.split(|&b| b == b'\n')
            .skip(1)
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|&b| b == b':')?;
                let value = &line[colon + 1..];
                let start = value
                    .iter()
                    .position(|&b| b != b' ' && b != b'\t')
                    .unwrap_or(value.len());
                line[..colon]
                    .eq_ignore_ascii_case(name.as_bytes())
                    .then(|| value[start..].to_vec())
            })
            .collect()
    }

    fn count(&self) -> usize {
        self.heads.lock().unwrap().len()
    }

    fn shown(&self) -> String {
        self.heads()
            .iter()
            .map(|h| format!("{}\n", h.escape_ascii()))
            .collect()
    }
}

impl Drop for WireOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(mut stream: TcpStream, heads: &Mutex<Vec<Vec<u8>>>, counter: &AtomicUsize, extra: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while let Some(end) = find(&buf, b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            heads.lock().unwrap().push(head.clone());
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let body = format!("#{n}");
            let answer = format!(
                "HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\n{extra}Content-Length: {}\r\n\r\n{}",
                body.len(),
                if head.starts_with(b"HEAD ") { "" } else { &body }
            );
            if stream.write_all(answer.as_bytes()).is_err() {
                return;
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn proxy_for(origin: &WireOrigin) -> LacquerProcess {
    LacquerProcess::start_simple(origin.addr, "[log]\naccess = \"off\"")
}

/// One request on a new connection, and its response.
fn exchange(lacquer: &LacquerProcess, bytes: &[u8]) -> RawResponse {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.send(bytes);
    conn.try_read_response(bytes.starts_with(b"HEAD"))
        .unwrap_or_else(|e| panic!("{}: {e}", bytes.escape_ascii()))
}

/// `GET {target}` for `shop.example`, with `fields` (each a whole line without CRLF).
fn get_with(lacquer: &LacquerProcess, target: &[u8], fields: &[&[u8]]) -> RawResponse {
    let mut req = b"GET ".to_vec();
    req.extend_from_slice(target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: shop.example\r\n");
    for field in fields {
        req.extend_from_slice(field);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"\r\n");
    exchange(lacquer, &req)
}

/// Asks `target` with `fields` on the fast path, then on the standard path (`Cache-Control:
/// max-stale` added): the paths that answered with the body `filled`, with their `Cache-Status`.
fn paths_serving(
    lacquer: &LacquerProcess,
    target: &[u8],
    fields: &[&[u8]],
    filled: &str,
) -> Vec<String> {
    let mut served = Vec::new();
    for standard in [false, true] {
        let mut asked = fields.to_vec();
        if standard {
            asked.push(b"Cache-Control: max-stale=60");
        }
        let resp = get_with(lacquer, target, &asked);
        if resp.text() == filled {
            let path = if standard { "standard" } else { "fast" };
            served.push(format!("{path} path ({:?})", resp.header("cache-status")));
        }
    }
    served
}

/// A target that is not UTF-8 would be keyed by its lossy rendering (Pingora puts
/// `from_utf8_lossy` of it in the URI, which `cache_key::path` reads) while the origin got the
/// bytes: `/p/\xff`, `/p/\xfe` and `/p/\xef\xbf\xbd` one entry. Pingora refuses such a head
/// before that (httparse, and the escaping regex that does not match invalid UTF-8), so it
/// must be refused, with nothing sent on; and a page filled through the literal U+FFFD is never
/// the answer to the invalid bytes, on either path.
#[test]
fn a_target_that_is_not_utf8_never_shares_the_entry_of_its_lossy_rendering() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    let first = get_with(&lacquer, b"/lossy/\xef\xbf\xbd", &[]);
    assert_eq!(first.status, 200);
    assert_eq!(first.text(), "#1");
    assert_eq!(
        origin.request_lines(),
        [b"GET /lossy/\xef\xbf\xbd HTTP/1.1".to_vec()],
        "{}",
        origin.shown()
    );
    for (other, fields) in [
        (&b"/lossy/\xff"[..], &[][..]),
        (b"/lossy/\xfe", &[]),
        (b"/lossy/\xef\xbf", &[]),
        (b"/lossy/\x80", &[&b"Cache-Control: max-stale=60"[..]][..]),
        (b"/lossy/\xff", &[&b"If-None-Match: \"x\""[..]][..]),
    ] {
        let before = origin.count();
        let resp = get_with(&lacquer, other, fields);
        assert_ne!(
            resp.text(),
            "#1",
            "{}: served the answer to /lossy/\\xef\\xbf\\xbd (Cache-Status {:?})",
            other.escape_ascii(),
            resp.header("cache-status")
        );
        if resp.status == 400 {
            assert_eq!(origin.count(), before, "{}", origin.shown());
            continue;
        }
        assert_eq!(resp.status, 200, "{}", other.escape_ascii());
        let mut line = b"GET ".to_vec();
        line.extend_from_slice(other);
        line.extend_from_slice(b" HTTP/1.1");
        assert_eq!(origin.request_lines()[before], line);
    }
}

/// A field named in `Vary` whose value is not UTF-8: the origin sees the bytes, so two values
/// are two variants.
#[test]
fn non_utf8_values_of_a_vary_field_are_different_variants() {
    let origin = WireOrigin::start("Vary: X-V\r\n");
    let lacquer = proxy_for(&origin);
    let first = get_with(&lacquer, b"/vary-bytes", &[b"X-V: caf\xe9"]);
    assert_eq!(first.text(), "#1");
    assert_eq!(origin.field_values(0, "x-v"), [b"caf\xe9".to_vec()]);
    assert_eq!(
        get_with(&lacquer, b"/vary-bytes", &[b"X-V: caf\xe9"]).text(),
        "#1",
        "the same value is the same variant"
    );
    let mut wrong = Vec::new();
    for other in [
        &b"X-V: caf\xe8"[..],
        b"X-V: caf\xef\xbf\xbd",
        b"X-V: caf\xff",
    ] {
        for path in paths_serving(&lacquer, b"/vary-bytes", &[other], "#1") {
            wrong.push(format!("{}: {path}", other.escape_ascii()));
        }
    }
    assert!(
        wrong.is_empty(),
        "served the variant the origin gave `X-V: caf\\xe9`: {wrong:#?}"
    );
}

/// HTTP's optional whitespace is SP and HTAB (RFC 9110 §5.6.3). A value that starts or ends
/// with a no-break space, U+0085 or an ideographic space is another value for the origin, so
/// it must not select the variant of the bare value.
#[test]
fn unicode_whitespace_in_a_vary_field_is_not_http_whitespace() {
    let origin = WireOrigin::start("Vary: X-V\r\n");
    let lacquer = proxy_for(&origin);
    let mut wrong = Vec::new();
    // the attacker's spellings, each filled first on its own URL, then the plain value asked
    for (n, spelling) in [
        &b"X-V: \xc2\xa0v2"[..],
        b"X-V: v2\xc2\x85",
        b"X-V: v2\xe3\x80\x80",
    ]
    .into_iter()
    .enumerate()
    {
        let target = format!("/vary-space/{n}");
        let attack = get_with(&lacquer, target.as_bytes(), &[spelling]);
        assert_eq!(attack.status, 200);
        let attacked = origin.count() - 1;
        let sent = &spelling[b"X-V: ".len()..];
        assert_eq!(
            origin.field_values(attacked, "x-v"),
            [sent.to_vec()],
            "the origin saw the spelling as sent"
        );
        for path in paths_serving(&lacquer, target.as_bytes(), &[b"X-V: v2"], &attack.text()) {
            wrong.push(format!("filled by `{}`: {path}", spelling.escape_ascii()));
        }
    }
    assert!(
        wrong.is_empty(),
        "`X-V: v2` was served the variant another value filled: {wrong:#?}"
    );
}

/// A comma inside a quoted string does not separate list members (RFC 9110 §5.6.1, §5.6.4):
/// `"a,b"` and `"a, b"` are two values for the origin (a parameter of `Accept`, say), so two
/// variants; splitting on every comma makes them one.
#[test]
fn a_comma_inside_a_quoted_string_of_a_vary_field_is_not_a_list_separator() {
    let origin = WireOrigin::start("Vary: X-V\r\n");
    let lacquer = proxy_for(&origin);
    let attack = get_with(&lacquer, b"/vary-quoted", &[b"X-V: text/html;p=\"a,b\""]);
    assert_eq!(attack.text(), "#1");
    assert_eq!(
        origin.field_values(0, "x-v"),
        [b"text/html;p=\"a,b\"".to_vec()]
    );
    let wrong = paths_serving(
        &lacquer,
        b"/vary-quoted",
        &[b"X-V: text/html;p=\"a, b\""],
        "#1",
    );
    assert!(
        wrong.is_empty(),
        "`p=\"a, b\"` was served the variant of `p=\"a,b\"`: {wrong:#?}"
    );
}

/// A fragment is not part of the target: dropped before the key is made and before the origin
/// is asked, so every fragment of a page is that page.
#[test]
fn a_fragment_is_dropped_for_key_and_origin_alike() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    assert_eq!(get_with(&lacquer, b"/frag?a=1#one", &[]).text(), "#1");
    assert_eq!(origin.request_lines(), [b"GET /frag?a=1 HTTP/1.1".to_vec()]);
    for same in [
        &b"/frag?a=1#two"[..],
        b"/frag?a=1",
        b"/frag?a=1#",
        b"/frag?a=1#?b",
    ] {
        assert_eq!(
            get_with(&lacquer, same, &[]).text(),
            "#1",
            "{}",
            same.escape_ascii()
        );
    }
    // `#` before the query: the query is part of the fragment
    assert_eq!(get_with(&lacquer, b"/frag#?a=1", &[]).text(), "#2");
    assert_eq!(origin.request_lines()[1], b"GET /frag HTTP/1.1");
    assert_eq!(origin.count(), 2, "{}", origin.shown());
}

/// Spellings a server may or may not read as one resource: the key normalises none of them,
/// and each reaches the origin verbatim, so each origin answer is stored under exactly the
/// target the origin read. (A key that normalised what the origin does not would be
/// poisoning; the reverse only costs a second entry.)
#[test]
fn path_spellings_are_distinct_keys_each_sent_verbatim() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    let spellings: [&[u8]; 16] = [
        b"/pe/a/b",
        b"/pe/a%2Fb",
        b"/pe/a%2fb",
        b"/pe/%61/b",
        b"/pe/x/../a/b",
        b"/pe/./a/b",
        b"/pe/a/b/.",
        b"/pe/%2e%2e/a/b",
        b"//pe/a/b",
        b"/pe/a/b;p=1",
        b"/pe/a/b?",
        b"/pe/a/b%00",
        b"/pe/a/b%",
        b"/PE/a/b",
        b"/pe/a/b\\",
        b"/pe/a/b?x=%20",
    ];
    for (i, target) in spellings.iter().enumerate() {
        let resp = get_with(&lacquer, target, &[]);
        assert_eq!(resp.status, 200, "{}", target.escape_ascii());
        assert_eq!(
            resp.text(),
            format!("#{}", i + 1),
            "{}",
            target.escape_ascii()
        );
        let mut line = b"GET ".to_vec();
        line.extend_from_slice(target);
        line.extend_from_slice(b" HTTP/1.1");
        assert_eq!(
            origin.request_lines()[i].escape_ascii().to_string(),
            line.escape_ascii().to_string()
        );
    }
    // each now a hit of its own answer, on both paths
    for (i, target) in spellings.iter().enumerate() {
        let fast = get_with(&lacquer, target, &[]);
        let standard = get_with(&lacquer, target, &[b"Cache-Control: max-stale=60"]);
        assert_eq!(
            fast.text(),
            format!("#{}", i + 1),
            "{}",
            target.escape_ascii()
        );
        assert_eq!(standard.text(), fast.text(), "{}", target.escape_ascii());
    }
    assert_eq!(origin.count(), spellings.len(), "{}", origin.shown());
}

/// Bytes httparse refuses in a target (space, tab, DEL, NUL, `"`, `<`) are percent-encoded by
/// Pingora before the head is read (`escape_illegal_request_line`): the key and the origin both
/// see the escaped target, so the raw and the escaped spelling are rightly one entry. Whatever
/// is done with such a target, key and origin must agree on it.
#[test]
fn bytes_escaped_in_a_target_are_escaped_for_key_and_origin_alike() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    for (raw, escaped) in [
        (&b"/esc/a b"[..], &b"/esc/a%20b"[..]),
        (b"/esc/a\tb", b"/esc/a%09b"),
        (b"/esc/a\x7fb", b"/esc/a%7Fb"),
        (b"/esc/a\x00b", b"/esc/a%00b"),
        // httparse takes these: sent on as they came
        (b"/esc/a\"b", b"/esc/a\"b"),
        (b"/esc/a{b}|`^", b"/esc/a{b}|`^"),
        (b"/esc/a HTTP/1.1 x", b"/esc/a%20HTTP/1.1%20x"),
    ] {
        let before = origin.count();
        let first = get_with(&lacquer, raw, &[]);
        if first.status == 400 {
            assert_eq!(origin.count(), before, "{}", raw.escape_ascii());
            continue;
        }
        assert_eq!(first.status, 200, "{}", raw.escape_ascii());
        let mut line = b"GET ".to_vec();
        line.extend_from_slice(escaped);
        line.extend_from_slice(b" HTTP/1.1");
        assert_eq!(
            origin.request_lines()[before].escape_ascii().to_string(),
            line.escape_ascii().to_string(),
            "{}",
            raw.escape_ascii()
        );
        let again = get_with(&lacquer, escaped, &[]);
        assert_eq!(again.text(), first.text(), "{}", escaped.escape_ascii());
        assert_eq!(origin.count(), before + 1, "{}", origin.shown());
    }
}

/// One resource asked in the ways that name it alike: HTTP/1.0, absolute-form with the scheme
/// and host in any case, `Host` in other case, `ws`: each is a hit of the origin-form request's
/// entry, and nothing more reaches the origin.
#[test]
fn spellings_of_one_resource_share_its_entry() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    let first = exchange(
        &lacquer,
        b"GET /one?x=1 HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    assert_eq!(first.text(), "#1");
    for same in [
        &b"GET /one?x=1 HTTP/1.0\r\nHost: shop.example\r\n\r\n"[..],
        b"GET /one?x=1 HTTP/1.1\r\nHost: SHOP.Example\r\n\r\n",
        b"GET /one?x=1 HTTP/1.1\r\nhOsT: shop.example\r\n\r\n",
        b"GET http://shop.example/one?x=1 HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET HTTP://Shop.Example/one?x=1 HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET http://shop.example/one?x=1 HTTP/1.0\r\n\r\n",
        b"GET /one?x=1 HTTP/1.1\r\nHost: shop.example\r\nContent-Length: 0\r\n\r\n",
    ] {
        let resp = exchange(&lacquer, same);
        assert_eq!(resp.status, 200, "{}", same.escape_ascii());
        assert_eq!(resp.text(), "#1", "{}", same.escape_ascii());
    }
    assert_eq!(origin.count(), 1, "{}", origin.shown());
}

/// Absolute-form targets whose authority could be read two ways are refused and never reach the
/// origin: userinfo, another port, a final dot against a `Host` without it.
#[test]
fn absolute_form_authorities_that_disagree_with_host_are_refused() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    for bad in [
        &b"GET http://user@shop.example/x HTTP/1.1\r\nHost: shop.example\r\n\r\n"[..],
        b"GET http://user@shop.example/x HTTP/1.0\r\n\r\n",
        b"GET http://evil.example@shop.example/x HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET http://shop.example:80/x HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET http://shop.example./x HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET http://shop.example/x HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        b"GET http:/shop.example/x HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET http:shop.example/x HTTP/1.1\r\nHost: shop.example\r\n\r\n",
        b"GET //shop.example/x HTTP/1.0\r\n\r\n",
    ] {
        let resp = exchange(&lacquer, bad);
        // `//shop.example/x` is origin-form (a path): served, but under its own key, as a path
        if bad.starts_with(b"GET //") {
            assert_eq!(resp.status, 200);
            continue;
        }
        assert_eq!(resp.status, 400, "{}", bad.escape_ascii());
    }
    // only the origin-form `//shop.example/x` reached the origin, as a path, with no Host
    assert_eq!(origin.count(), 1, "{}", origin.shown());
    assert_eq!(origin.request_lines()[0], b"GET //shop.example/x HTTP/1.1");
    // and it does not answer `http://shop.example/x`
    let page = exchange(&lacquer, b"GET /x HTTP/1.1\r\nHost: shop.example\r\n\r\n");
    assert_eq!(page.text(), "#2");
}

/// Methods are case-sensitive (RFC 9110 §9.1): `get` is not GET, so it is never answered from
/// GET's entry, and reaches the origin as sent; nor does it store anything GET would be served.
#[test]
fn a_lowercase_method_is_never_a_cache_read() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    assert_eq!(get_with(&lacquer, b"/method", &[]).text(), "#1");
    let lower = exchange(
        &lacquer,
        b"get /method HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    assert_ne!(lower.text(), "#1", "{:?}", lower.header("cache-status"));
    assert_eq!(origin.request_lines()[1], b"get /method HTTP/1.1");
    // a fresh URL filled by `get` is not GET's entry
    let lower_fill = exchange(
        &lacquer,
        b"get /method-2 HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    );
    let upper = get_with(&lacquer, b"/method-2", &[]);
    assert_ne!(upper.text(), lower_fill.text());
}

/// A pipeline of hits, cut into two TCP writes at every byte offset, and then sent a byte per
/// write: every cut gets the same answers in order, and nothing reaches the origin.
#[test]
fn a_pipeline_cut_at_every_byte_gets_the_same_answers() {
    let origin = WireOrigin::start("Vary: X-V\r\n");
    let lacquer = proxy_for(&origin);
    let a = get_with(&lacquer, b"/cut/a", &[b"X-V: 1"]);
    let b = get_with(&lacquer, b"/cut/b?q", &[b"X-V: 2"]);
    assert_eq!((a.text().as_str(), b.text().as_str()), ("#1", "#2"));
    let pipeline: &[u8] = b"GET /cut/a HTTP/1.1\r\nHost: shop.example\r\nX-V: 1\r\n\r\n\
        GET /cut/b?q HTTP/1.1\r\nhost: shop.example\nX-V:2\r\n\r\n\
        GET /cut/a#f HTTP/1.1\r\nHost: shop.example\r\nX-V:  1 \r\n\r\n";
    let check = |conn: &mut RawConn, what: &str| {
        for want in ["#1", "#2", "#1"] {
            let resp = conn
                .try_read_response(false)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(resp.status, 200, "{what}");
            assert_eq!(resp.text(), want, "{what}");
        }
    };
    for cut in 1..pipeline.len() {
        let mut conn = RawConn::connect(lacquer.addr());
        conn.send(&pipeline[..cut]);
        std::thread::sleep(Duration::from_millis(2));
        conn.send(&pipeline[cut..]);
        check(&mut conn, &format!("cut at {cut}"));
    }
    let mut conn = RawConn::connect(lacquer.addr());
    for byte in pipeline.chunks(1) {
        conn.send(byte);
    }
    check(&mut conn, "a byte per write");
    assert_eq!(origin.count(), 2, "{}", origin.shown());
}

/// ASCII spellings of one value of a field named in `Vary` (case of the name, surrounding
/// whitespace, one line or the list split over two) select the same variant on the fast path
/// and the standard path; an absent field and an empty one are two variants.
#[test]
fn ascii_spellings_of_a_vary_field_pick_one_variant_on_both_paths() {
    let origin = WireOrigin::start("Vary: X-V\r\n");
    let lacquer = proxy_for(&origin);
    assert_eq!(get_with(&lacquer, b"/vary", &[b"X-V: a, b"]).text(), "#1");
    assert_eq!(get_with(&lacquer, b"/vary", &[]).text(), "#2");
    let spellings: [&[&[u8]]; 5] = [
        &[b"X-V: a, b"],
        &[b"x-v:a,b"],
        &[b"X-V:   a ,  b   "],
        &[b"X-V: a", b"X-V: b"],
        &[b"X-V: a,", b"x-V: ,b"],
    ];
    for fields in spellings {
        let fast = get_with(&lacquer, b"/vary", fields);
        let mut forced = fields.to_vec();
        forced.push(b"Cache-Control: max-stale=60");
        let standard = get_with(&lacquer, b"/vary", &forced);
        let what = format!("{:?}", fields.iter().map(|f| f.escape_ascii().to_string()));
        assert_eq!(fast.text(), "#1", "{what}");
        assert_eq!(standard.text(), "#1", "{what}");
    }
    // absent and empty are two variants, the same on both paths
    let empty = get_with(&lacquer, b"/vary", &[b"X-V:"]);
    assert_eq!(empty.text(), "#3");
    for fields in [&[][..], &[&b"Cache-Control: max-stale=60"[..]][..]] {
        assert_eq!(get_with(&lacquer, b"/vary", fields).text(), "#2");
    }
    assert_eq!(
        get_with(
            &lacquer,
            b"/vary",
            &[b"X-V:", b"Cache-Control: max-stale=60"]
        )
        .text(),
        "#3"
    );
    assert_eq!(origin.count(), 3, "{}", origin.shown());
}

/// Two `Range` lines (not a list field: the request is not a valid range request) get the same
/// answer from the fast path and from the standard path.
#[test]
fn two_range_lines_get_one_answer_on_both_paths() {
    let origin = WireOrigin::start("");
    let lacquer = proxy_for(&origin);
    assert_eq!(get_with(&lacquer, b"/range", &[]).text(), "#1");
    let fields: &[&[u8]] = &[b"Range: bytes=0-0", b"Range: bytes=1-1"];
    let fast = get_with(&lacquer, b"/range", fields);
    let mut forced = fields.to_vec();
    forced.push(b"Cache-Control: max-stale=60");
    let standard = get_with(&lacquer, b"/range", &forced);
    assert_eq!(
        (fast.status, fast.text()),
        (standard.status, standard.text()),
        "fast {:?}, standard {:?}",
        fast.headers,
        standard.headers
    );
    assert_eq!(origin.count(), 1, "{}", origin.shown());
}
