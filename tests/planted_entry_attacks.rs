//! Entries planted in memcached by anyone who can write to it (an application, a buggy writer, a
//! co-tenant) are untrusted input: every test here writes values byte by byte (its own encoder of
//! `docs/entry-format.md`, so names, values, statuses, dates and chunk lists the library's
//! encoder could not produce can be planted) and checks what a real Lacquer node makes of them
//! on real sockets (HTTP/1.1 fast path, the standard path, HTTP/1.0, h2c).
//!
//! Found (2026-12-07, a helper session's attack on 7c7980b), each failing before its fix in the
//! commit that added this file: an entry's head of more than 1,024 fields is refused
//! (`entry::MAX_STORED_FIELDS`), its values trimmed of surrounding whitespace; a manifest over
//! `max_object_size` is refused before any chunk is fetched; an entry whose variance and `Vary`
//! disagree is refused (`policy::vary::varies`); tags are split as bytes
//! (`ban_list::tags::TagField::tags`). What was found:
//! - A head with as many distinct field names as a header map holds (24,576: possible in one
//!   memcached item, impossible from an origin, whose heads Pingora caps at 256 fields) panics
//!   the node's worker: `shared_framing::reframe` inserts `Content-Length` with the panicking
//!   `insert_header` (http's `HeaderMap::insert`, "size overflows MAX_SIZE"), and with a
//!   `Content-Length` planted, the `Age` insert panics on the standard path (pingora-proxy
//!   `proxy_cache.rs` `cache_hit_header`) and on the h2 fast path (`fast_hit/answer.rs`). Every
//!   request for the URL loses its connection (h2: its stream reset), on every node, with a
//!   backtrace in the log each time; never a miss.
//! - A manifest whose body is larger than `cache.max_object_size` (chunks present and valid) is
//!   fetched whole and served by every request: each concurrent request holds the whole body
//!   (3 requests of a 27 to 36 MB planted body with `max_object_size = 1MiB` grew the node's
//!   VmHWM by 120 to 250 MiB). Nothing bounds a reader but the 65,536-chunk cap (64 GiB).
//! - A planted head with `Vary` and no stored variance (`Vary: *` included) is served as a hit
//!   by the fast path to every client, while the standard path (a request with a directive)
//!   judges the same entry a vary miss: the two paths disagree, and `Vary: *` is served as a
//!   match (RFC 9111 §4.1 says it never matches).
//! - A tag field holding one non-ASCII byte anywhere (`Surrogate-Key: product-7 café`) is
//!   skipped whole (`TagField::tags` gives up on a value that is not visible ASCII), so a ban
//!   of `product-7` leaves the page served (from origins too: the same code reads their tags).
//! - Field values with leading or trailing whitespace (which no origin's head can give Lacquer:
//!   the HTTP/1 parser trims them) are passed to h2 clients as they are, which RFC 9113 §8.2.1
//!   makes a malformed message.
//!
//! Held (guards): hostile names and values (CR, LF, NUL, DEL, colon, space, obs-fold, non-ASCII
//! names) are misses and never reach the wire, a pipelined request behind each is answered
//! intact; hop-by-hop and framing fields are stripped for HTTP/1.0, 1.1 and h2c clients and a
//! planted `Connection: close` closes nothing; statuses 0, 1xx, 101, 600 and 999 are misses;
//! broken manifests (chunks of another URL, of another write, missing, short, of the wrong kind,
//! absurd counts) are misses within a bound; a purged or banned planted page stays purged when
//! its bytes are planted again (promoted or not, the tag nominated by `Connection` included); a
//! fix written to memcached replaces a promoted planted page after `local_ttl`, even one fresh
//! until the end of time; identical value bytes under two URLs serve only the URL they name;
//! absurd dates neither panic nor escape the horizon.

use lacquer_test_support as support;

use lacquer::storage::tiered::{logical_key, memcached_key};
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};
use support::raw_text::find;
use support::*;

/// The `Host` every request here sends (and `RawConn` sends).
const HOST: &str = "test";
/// The body of every planted page.
const BODY: &[u8] = b"the body as planted";
/// A hang guard for an answer: only a hang reaches it.
const BOUND: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Planting: the value layout of `docs/entry-format.md`, every byte the test's.

/// A complete entry or manifest as anyone who can write to memcached may write it.
#[derive(Clone)]
struct Planted {
    status: u16,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    created_ms: u64,
    epoch_ms: u64,
    fresh_until_ms: u64,
    swr: u32,
    sie: u32,
    variance: Option<[u8; 16]>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

impl Planted {
    /// A `200` with `fields` and [`BODY`], written now, fresh for five minutes.
    fn page(fields: &[(&str, &str)]) -> Planted {
        let now = now_ms();
        Planted {
            status: 200,
            fields: fields
                .iter()
                .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
            body: BODY.to_vec(),
            created_ms: now,
            epoch_ms: now,
            fresh_until_ms: now + 300_000,
            swr: 0,
            sie: 0,
            variance: None,
        }
    }

    /// [`Planted::page`] with fields given as raw bytes.
    fn raw(status: u16, fields: &[(&[u8], &[u8])]) -> Planted {
        let mut page = Planted::page(&[]);
        page.status = status;
        page.fields = fields
            .iter()
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect();
        page
    }

    /// Dated `ms` earlier (so a purge or ban issued now covers it).
    fn older_by(mut self, ms: u64) -> Planted {
        self.created_ms -= ms;
        self.epoch_ms -= ms;
        self
    }

    fn put_meta(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.created_ms.to_be_bytes());
        out.extend_from_slice(&self.epoch_ms.to_be_bytes());
        out.extend_from_slice(&self.fresh_until_ms.to_be_bytes());
        out.extend_from_slice(&self.swr.to_be_bytes());
        out.extend_from_slice(&self.sie.to_be_bytes());
        match self.variance {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&v);
            }
        }
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&(self.fields.len() as u16).to_be_bytes());
        for (name, value) in &self.fields {
            out.extend_from_slice(&(name.len() as u16).to_be_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
    }

    /// The complete entry (kind 1) for logical key `logical`.
    fn complete(&self, logical: &str) -> Vec<u8> {
        let mut out = prefix(1, logical);
        self.put_meta(&mut out);
        out.extend_from_slice(&(self.body.len() as u64).to_be_bytes());
        out.extend_from_slice(&self.body);
        seal(out)
    }

    /// A manifest (kind 2) for `logical` with this head and the chunk list given.
    fn manifest(
        &self,
        logical: &str,
        write_id: u64,
        body_len: u64,
        count: u32,
        crc: u32,
    ) -> Vec<u8> {
        let mut out = prefix(2, logical);
        self.put_meta(&mut out);
        out.extend_from_slice(&write_id.to_be_bytes());
        out.extend_from_slice(&body_len.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&crc.to_be_bytes());
        seal(out)
    }
}

/// A body chunk (kind 3).
fn chunk_value(logical: &str, write_id: u64, index: u32, data: &[u8]) -> Vec<u8> {
    let mut out = prefix(3, logical);
    out.extend_from_slice(&write_id.to_be_bytes());
    out.extend_from_slice(&index.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    seal(out)
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = flate2::Crc::new();
    crc.update(data);
    crc.sum()
}

fn prefix(kind: u8, logical: &str) -> Vec<u8> {
    let mut out = b"LQ".to_vec();
    out.extend_from_slice(&[1, kind, 0]);
    out.extend_from_slice(&(logical.len() as u16).to_be_bytes());
    out.extend_from_slice(logical.as_bytes());
    out
}

fn seal(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// The memcached key and the logical key of `path` on [`HOST`].
fn keys_of(path: &str) -> (String, String) {
    let key = lacquer::proxy::cache_key::of_url(HOST, path);
    (memcached_key("lq", &key), logical_key(&key))
}

/// The key of chunk `index` of write `write_id` of the entry under `key`.
fn chunk_key(key: &str, write_id: u64, index: u32) -> String {
    format!("{key}:{write_id:016x}:{index}")
}

/// Plants `entry` as `path`'s complete entry.
fn plant(memcached: &MemcachedProcess, path: &str, entry: &Planted) {
    let (key, logical) = keys_of(path);
    memcached.set_raw(&key, &entry.complete(&logical), 300);
}

// ---------------------------------------------------------------------------------------------
// Nodes, origins and requests.

/// An origin whose every answer is `origin {path}`, never stored (so a planted entry is all a
/// node can serve from the cache, and a miss shows as the origin's body).
fn origin() -> TestOrigin {
    TestOrigin::start(|req| {
        OriginResponse::ok(format!("origin {}", req.path)).header("cache-control", "no-store")
    })
}

fn origin_body(path: &str) -> Vec<u8> {
    format!("origin {path}").into_bytes()
}

/// A node on one memcached server, with `extra` TOML before `[cache.memcached]` and
/// `memcached_extra` in it; returns it with its admin port.
fn node(
    memcached: &MemcachedProcess,
    origin: &TestOrigin,
    extra: &str,
    memcached_extra: &str,
) -> (LacquerProcess, u16) {
    let admin = free_port();
    let config = format!(
        "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{extra}\n\
         [cache.memcached]\nservers = [\"{}\"]\n{memcached_extra}\n",
        memcached.addr()
    );
    (LacquerProcess::start_simple(origin.addr(), &config), admin)
}

/// `GET path` over HTTP/`version` with `extra` request fields, on a connection of its own that
/// the request asks to close; everything read.
fn get_raw(addr: SocketAddr, path: &str, version: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut req = format!("GET {path} HTTP/{version}\r\nHost: {HOST}\r\n");
    for (name, value) in extra {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    raw_request(addr, req.as_bytes())
}

/// `GET path` with `extra` fields, then `GET /sentinel` pipelined behind it on the same
/// connection: both answers as parsed.
fn get_with_sentinel(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Vec<RawResponse> {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n");
    for (name, value) in extra {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str(&format!(
        "\r\nGET /sentinel HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
    ));
    parse_responses(&raw_request(addr, req.as_bytes()), false)
}

/// `GET http://test{path}` over h2c on `sender`, within [`BOUND`].
async fn h2_get_path(
    sender: &::h2::client::SendRequest<bytes::Bytes>,
    path: &str,
) -> Result<H2Answer, String> {
    let url = format!("http://{HOST}{path}");
    match tokio::time::timeout(BOUND, h2_fetch(sender, "GET", &url, &[])).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(format!("h2 error: {e:?}")),
        Err(_) => Err(format!("no answer within {BOUND:?}")),
    }
}

/// The first line of `data` and its last 40 bytes, for failure messages.
fn summary(data: &[u8]) -> String {
    let text = String::from_utf8_lossy(data);
    let first = text.lines().next().unwrap_or("(nothing)");
    let tail = &data[data.len().saturating_sub(40)..];
    format!(
        "{first:?} ... {:?} ({} bytes)",
        String::from_utf8_lossy(tail),
        data.len()
    )
}

/// The panics in `node`'s log, each by its message and the first frame of Lacquer's own (when
/// the log has backtraces).
fn panics_of(node: &LacquerProcess) -> Vec<String> {
    let log = node.stderr_log();
    let lines: Vec<&str> = log.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.contains("panicked at") {
            let message = lines.get(i + 1).map_or("", |l| l.trim());
            let ours = lines[i..]
                .iter()
                .take(80)
                .find(|l| l.contains("at ./src/") || l.contains("at ./vendor/"))
                .map_or("", |l| l.trim());
            found.push(format!("{message} {ours}"));
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Heads.

/// A head with as many distinct field names as a header map can hold (24,576; 280 KB in one
/// memcached item; an origin's head is capped at 256 fields by Pingora) must cost a miss or be
/// served, never a worker's panic and a dropped connection. With no `Content-Length`, the
/// reframing inserts one into the full map (`HeaderMap::insert` panics past its size); with the
/// right `Content-Length` planted, the standard path and h2 insert `Age` and panic the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_with_as_many_fields_as_a_map_holds_is_answered_not_dropped() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let distinct = |n: usize| -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n)
            .map(|i| (format!("x-{i:x}").into_bytes(), Vec::new()))
            .collect()
    };
    let mut unframed = Planted::page(&[]);
    unframed.fields = distinct(24_576);
    plant(&memcached, "/full", &unframed);
    let mut framed = Planted::page(&[]);
    framed.fields = distinct(24_575);
    framed.fields.push((
        b"content-length".to_vec(),
        BODY.len().to_string().into_bytes(),
    ));
    plant(&memcached, "/full-framed", &framed);

    let mut failures = Vec::new();
    let (sender, _driver) = h2_connect_default(lacquer.addr()).await;
    for path in ["/full", "/full-framed"] {
        let standard = [("Cache-Control", "max-stale=0")];
        for (how, version, extra) in [
            ("HTTP/1.1 fast path", "1.1", &[][..]),
            ("HTTP/1.1 standard path", "1.1", &standard[..]),
            ("HTTP/1.0", "1.0", &[][..]),
        ] {
            let got = get_raw(lacquer.addr(), path, version, extra);
            let answered = got.starts_with(b"HTTP/1.1 200 ")
                && (got.ends_with(BODY) || got.ends_with(&origin_body(path)));
            if !answered {
                failures.push(format!("{path} over {how}: {}", summary(&got)));
            }
        }
        match h2_get_path(&sender, path).await {
            Ok(answer)
                if answer.status == 200
                    && (answer.body == BODY || answer.body == origin_body(path)) => {}
            Ok(answer) => failures.push(format!(
                "{path} over h2c: {} {:?}",
                answer.status,
                answer.text()
            )),
            Err(e) => failures.push(format!("{path} over h2c: {e}")),
        }
    }
    let panics = panics_of(&lacquer);
    assert!(
        failures.is_empty() && panics.is_empty(),
        "answers lost:\n{}\npanics:\n{}",
        failures.join("\n"),
        panics.join("\n")
    );
}

/// Names and values no head may carry (CR, LF, NUL, DEL, a colon, a space, obs-fold, non-ASCII
/// names, an empty name) make the entry a miss on every path: nothing of them reaches the wire,
/// no planted line ends the head early, and the request pipelined behind is answered intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_and_values_never_reach_the_wire() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let cases: [(&str, &[u8], &[u8]); 13] = [
        ("/value-crlf", b"x-a", b"1\r\nx-injected: 1"),
        ("/value-lf", b"x-a", b"1\nx-injected: 1"),
        ("/value-cr", b"x-a", b"1\rx-injected: 1"),
        (
            "/value-split",
            b"x-a",
            b"1\r\n\r\nHTTP/1.1 200 OK\r\nx-injected: 1",
        ),
        ("/value-fold", b"x-a", b"1\r\n x-injected: 1"),
        ("/value-nul", b"x-a", b"1\0x-injected"),
        ("/value-del", b"x-a", b"1\x7fx-injected"),
        ("/name-crlf", b"x-a\r\nx-injected", b"1"),
        ("/name-colon", b"x-injected:", b"1"),
        ("/name-space", b"x-injected x", b"1"),
        ("/name-utf8", b"x-injected-\xc3\xa9", b"1"),
        ("/name-nul", b"x-injected\0", b"1"),
        ("/name-empty", b"", b"x-injected"),
    ];
    for (path, name, value) in cases {
        let entry = Planted::raw(200, &[(b"content-type", b"text/plain"), (name, value)]);
        plant(&memcached, path, &entry);
    }
    let mut failures = Vec::new();
    let (sender, _driver) = h2_connect_default(lacquer.addr()).await;
    for (path, _, _) in cases {
        for extra in [&[][..], &[("Cache-Control", "max-stale=0")][..]] {
            let answers = get_with_sentinel(lacquer.addr(), path, extra);
            let as_expected = answers.len() == 2
                && answers[0].status == 200
                && answers[0].body == origin_body(path)
                && answers[1].body == origin_body("/sentinel")
                && answers
                    .iter()
                    .all(|a| a.headers.iter().all(|(n, _)| !n.contains("injected")));
            if !as_expected {
                let seen: Vec<String> = answers
                    .iter()
                    .map(|a| format!("{} {:?} {:?}", a.status, a.headers, a.text()))
                    .collect();
                failures.push(format!("{path} {extra:?}: {seen:?}"));
            }
        }
        let old = get_raw(lacquer.addr(), path, "1.0", &[]);
        if !old.ends_with(&origin_body(path)) || find(&old, b"injected").is_some() {
            failures.push(format!("{path} over HTTP/1.0: {}", summary(&old)));
        }
        match h2_get_path(&sender, path).await {
            Ok(answer) if answer.body == origin_body(path) => {}
            Ok(answer) => failures.push(format!("{path} over h2c: {:?}", answer.text())),
            Err(e) => failures.push(format!("{path} over h2c: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    lacquer.assert_no_panic();
}

/// Hop-by-hop and framing fields in a planted head (`Connection: close, X-Foo`, `Keep-Alive`,
/// `Transfer-Encoding: chunked` over a plain body, `Upgrade`, `TE`, `Trailer`,
/// `Proxy-Connection`, a `Connection` naming the framing fields) go to no client: HTTP/1.1
/// keeps its connection (the pipelined request is answered), HTTP/1.0 gets the body whole, an
/// h2c client gets a well-formed answer (connection-specific fields are malformed in h2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_of_a_planted_head_reach_no_client() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let hop = Planted::page(&[
        ("connection", "close, x-foo"),
        ("x-foo", "1"),
        ("keep-alive", "timeout=1, max=1"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("te", "trailers"),
        ("trailer", "x-t"),
        ("proxy-connection", "close"),
        ("content-type", "text/plain"),
    ]);
    plant(&memcached, "/hop", &hop);
    let nominating = Planted::page(&[
        (
            "connection",
            "content-length, transfer-encoding, date, keep-alive",
        ),
        ("content-length", "5"),
        ("content-type", "text/plain"),
    ]);
    plant(&memcached, "/nominating", &nominating);
    let gone = [
        "connection",
        "x-foo",
        "keep-alive",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
        "proxy-connection",
    ];
    let mut failures = Vec::new();
    let (sender, _driver) = h2_connect_default(lacquer.addr()).await;
    for path in ["/hop", "/nominating"] {
        for extra in [&[][..], &[("Cache-Control", "max-stale=0")][..]] {
            let answers = get_with_sentinel(lacquer.addr(), path, extra);
            let ok = answers.len() == 2
                && answers[0].body == BODY
                && answers[0].header_all("content-length") == vec!["19"]
                && gone[1..].iter().all(|f| answers[0].header(f).is_none())
                && answers[0].header("connection") == Some("keep-alive")
                && answers[1].body == origin_body("/sentinel");
            if !ok {
                let seen: Vec<String> = answers
                    .iter()
                    .map(|a| format!("{} {:?} {:?}", a.status, a.headers, a.text()))
                    .collect();
                failures.push(format!("{path} {extra:?}: {seen:?}"));
            }
        }
        let old = get_raw(lacquer.addr(), path, "1.0", &[]);
        match parse_response(&old, false) {
            Some(r) if r.body == BODY && gone[1..].iter().all(|f| r.header(f).is_none()) => {}
            _ => failures.push(format!("{path} over HTTP/1.0: {}", summary(&old))),
        }
        match h2_get_path(&sender, path).await {
            Ok(answer)
                if answer.body == BODY && gone.iter().all(|f| !answer.fields.contains_key(*f)) => {}
            Ok(answer) => failures.push(format!(
                "{path} over h2c: {:?} {:?}",
                answer.fields,
                answer.text()
            )),
            Err(e) => failures.push(format!("{path} over h2c: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    lacquer.assert_no_panic();
}

/// Statuses no stored answer has (0, 1xx, 101, 600, 999) are misses, and the connection goes on;
/// so is a `205` with a body (RFC 9110 §15.3.6: it MUST NOT carry content), which was served
/// with it until the stop after this file was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_never_stored_are_misses() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let statuses = [0u16, 100, 101, 103, 205, 600, 999, 1000, u16::MAX];
    for status in statuses {
        let entry = Planted::raw(status, &[(b"upgrade", b"websocket")]);
        plant(&memcached, &format!("/status-{status}"), &entry);
    }
    let mut failures = Vec::new();
    for status in statuses {
        let path = format!("/status-{status}");
        for extra in [&[][..], &[("Cache-Control", "max-stale=0")][..]] {
            let answers = get_with_sentinel(lacquer.addr(), &path, extra);
            let ok = answers.len() == 2
                && answers[0].status == 200
                && answers[0].body == origin_body(&path)
                && answers[1].body == origin_body("/sentinel");
            if !ok {
                let seen: Vec<String> = answers
                    .iter()
                    .map(|a| format!("{} {:?}", a.status, a.text()))
                    .collect();
                failures.push(format!("{path} {extra:?}: {seen:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    lacquer.assert_no_panic();
}

/// RFC 9113 §8.2.1: an h2 field value must not start or end with whitespace (a message that
/// does is malformed, and strict clients reset the stream). No origin's head can give Lacquer
/// such a value (the HTTP/1 parser trims it); a planted one must be trimmed, or the entry be a
/// miss, not passed on as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_values_reach_h2_clients_without_surrounding_whitespace() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let entry = Planted::raw(
        200,
        &[
            (b"x-lead", b"  value"),
            (b"x-trail", b"value\t"),
            (b"x-both", b"\t value \t"),
            (b"x-obs", b"caf\xc3\xa9"),
        ],
    );
    plant(&memcached, "/spaced", &entry);
    let (sender, _driver) = h2_connect_default(lacquer.addr()).await;
    let answer = h2_get_path(&sender, "/spaced").await.unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        answer.body == BODY || answer.body == origin_body("/spaced"),
        "{:?}",
        answer.text()
    );
    let malformed: Vec<String> = answer
        .fields
        .iter()
        .filter(|(_, v)| {
            let v = v.as_bytes();
            v.first().is_some_and(|b| *b == b' ' || *b == b'\t')
                || v.last().is_some_and(|b| *b == b' ' || *b == b'\t')
        })
        .map(|(n, v)| format!("{n}: {v:?}"))
        .collect();
    assert!(
        malformed.is_empty(),
        "h2 field values with surrounding whitespace: {malformed:?}"
    );
    // obs-text is a valid value in h2 and HTTP/1.1: left as planted
    if answer.body == BODY {
        assert_eq!(answer.fields["x-obs"].as_bytes(), b"caf\xc3\xa9");
    }
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Manifests.

/// A manifest announcing a body larger than `cache.max_object_size` (every chunk present and
/// valid) is an object this cache never stores: it must be a miss before any chunk is fetched.
/// Served, every concurrent request buffers the whole body (a reader's only bound is 65,536
/// items of up to 1 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_larger_than_max_object_size_is_a_miss_held_by_no_request() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(
        &memcached,
        &origin,
        "[cache]\nmax_object_size = \"1MiB\"",
        "",
    );
    let path = "/huge";
    let (key, logical) = keys_of(path);
    let (write_id, count, piece) = (5u64, 30u32, 900 * 1024);
    let mut crc = flate2::Crc::new();
    for i in 0..count {
        let data = vec![b'a' + (i % 26) as u8; piece];
        crc.update(&data);
        memcached.set_raw(
            &chunk_key(&key, write_id, i),
            &chunk_value(&logical, write_id, i, &data),
            300,
        );
    }
    let body_len = u64::from(count) * piece as u64;
    let manifest = Planted::page(&[]).manifest(&logical, write_id, body_len, count, crc.sum());
    memcached.set_raw(&key, &manifest, 300);

    let before = peak_rss(lacquer.pid());
    let addr = lacquer.addr();
    let readers: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(move || get_raw(addr, path, "1.1", &[])))
        .collect();
    let answers: Vec<Vec<u8>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let growth = peak_rss(lacquer.pid()).saturating_sub(before);
    let served: Vec<String> = answers
        .iter()
        .filter(|a| !a.ends_with(&origin_body(path)))
        .map(|a| summary(a))
        .collect();
    assert!(
        served.is_empty(),
        "a {body_len}-byte planted body (max_object_size 1 MiB) was not a miss: {served:?}; \
         the node's peak memory grew {} MiB",
        growth >> 20
    );
    assert!(
        growth < 32 << 20,
        "the node's peak memory grew {} MiB",
        growth >> 20
    );
    lacquer.assert_no_panic();
}

/// Manifests whose chunks do not make the body they announce are misses, answered within a
/// bound, never a partial or mixed body: chunks under another URL's logical key, of another
/// write, one missing, one short (length and CRC of the whole then disagree), a complete entry
/// where a chunk should be, and a count of 65,536 chunks of a 64 GiB body that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_manifests_are_misses_never_partial_bodies() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let pieces: [&[u8]; 3] = [b"first piece, ", b"second piece, ", b"third piece"];
    let whole: Vec<u8> = pieces.concat();
    let head = Planted::page(&[("content-type", "text/plain")]);
    type Chunk = Box<dyn Fn(&str, &str, u32, &[u8]) -> Option<(String, Vec<u8>)>>;
    let as_written: Chunk = Box::new(|key, logical, i, data| {
        Some((chunk_key(key, 7, i), chunk_value(logical, 7, i, data)))
    });
    let cases: Vec<(&str, Chunk)> = vec![
        (
            "/other-urls-chunks",
            Box::new(|key, _, i, data| {
                let (_, other) = keys_of("/another-page");
                Some((chunk_key(key, 7, i), chunk_value(&other, 7, i, data)))
            }),
        ),
        (
            "/other-writes-chunks",
            Box::new(|key, logical, i, data| {
                Some((chunk_key(key, 7, i), chunk_value(logical, 8, i, data)))
            }),
        ),
        (
            "/missing-chunk",
            Box::new(|key, logical, i, data| {
                (i != 1).then(|| (chunk_key(key, 7, i), chunk_value(logical, 7, i, data)))
            }),
        ),
        (
            "/short-chunk",
            Box::new(|key, logical, i, data| {
                let data = if i == 1 { &data[..4] } else { data };
                Some((chunk_key(key, 7, i), chunk_value(logical, 7, i, data)))
            }),
        ),
        (
            "/entry-as-chunk",
            Box::new(|key, logical, i, data| {
                let value = if i == 2 {
                    Planted::page(&[]).complete(logical)
                } else {
                    chunk_value(logical, 7, i, data)
                };
                Some((chunk_key(key, 7, i), value))
            }),
        ),
        ("/intact", as_written),
    ];
    for (path, chunk) in &cases {
        let (key, logical) = keys_of(path);
        for (i, data) in pieces.iter().enumerate() {
            if let Some((k, v)) = chunk(&key, &logical, i as u32, data) {
                memcached.set_raw(&k, &v, 300);
            }
        }
        let manifest = head.manifest(&logical, 7, whole.len() as u64, 3, crc32(&whole));
        memcached.set_raw(&key, &manifest, 300);
    }
    let (key, logical) = keys_of("/absurd-count");
    memcached.set_raw(&key, &head.manifest(&logical, 9, 1 << 36, 65_536, 0), 300);

    let mut failures = Vec::new();
    let mut paths: Vec<&str> = cases.iter().map(|(p, _)| *p).collect();
    paths.push("/absurd-count");
    for path in paths {
        let expected = if path == "/intact" {
            whole.clone()
        } else {
            origin_body(path)
        };
        for extra in [&[][..], &[("Cache-Control", "max-stale=0")][..]] {
            let answers = get_with_sentinel(lacquer.addr(), path, extra);
            let ok = answers.len() == 2
                && answers[0].body == expected
                && answers[1].body == origin_body("/sentinel");
            if !ok {
                let seen: Vec<String> = answers
                    .iter()
                    .map(|a| format!("{} {:?}", a.status, a.text()))
                    .collect();
                failures.push(format!("{path} {extra:?}: {seen:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    lacquer.assert_no_panic();
}

// ---------------------------------------------------------------------------------------------
// Variance and identity.

/// A planted head with `Vary` but no stored variance cannot say which request it answered:
/// `Vary: *` never matches (RFC 9111 §4.1), and an entry varying on `Accept-Language` without
/// the variance is not known to match any request. The standard path judges both a vary miss;
/// the fast path must not serve them as hits where the standard path would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vary_entry_without_its_variance_is_judged_alike_on_both_paths() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    plant(&memcached, "/vary-star", &Planted::page(&[("vary", "*")]));
    plant(
        &memcached,
        "/vary-language",
        &Planted::page(&[("vary", "accept-language")]),
    );
    let mut failures = Vec::new();
    for path in ["/vary-star", "/vary-language"] {
        let language = [("Accept-Language", "fr")];
        let language_standard = [("Accept-Language", "fr"), ("Cache-Control", "max-stale=0")];
        let mut seen = Vec::new();
        for (how, extra) in [
            ("fast path", &[][..]),
            ("fast path, fr", &language[..]),
            ("standard path, fr", &language_standard[..]),
            ("If-None-Match", &[("If-None-Match", "\"x\"")][..]),
        ] {
            let got = get_raw(lacquer.addr(), path, "1.1", extra);
            let answer = parse_response(&got, false);
            let served_planted = answer.as_ref().is_some_and(|a| a.body == BODY);
            let status = answer.and_then(|a| a.header("cache-status").map(str::to_string));
            seen.push((how, served_planted, status.unwrap_or_default()));
        }
        let planted_by: Vec<_> = seen.iter().filter(|s| s.1).collect();
        if !planted_by.is_empty() {
            failures.push(format!("{path}: served as planted by {seen:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    lacquer.assert_no_panic();
}

/// Decoded values are recognised by their bytes (`storage::decoded_values`, `local_ttl = "0s"`)
/// and promoted ones by their key: URL A's value planted byte for byte under URL B's key too is
/// served for A only; B's read finds A's logical key in it and is a miss, however often A's
/// value was read just before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_value_bytes_under_two_urls_serve_only_the_url_they_name() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    for local_ttl in ["0s", "5s"] {
        let (lacquer, _admin) = node(
            &memcached,
            &origin,
            "",
            &format!("local_ttl = \"{local_ttl}\""),
        );
        let a = format!("/a-{local_ttl}");
        let b = format!("/b-{local_ttl}");
        let (_, logical_a) = keys_of(&a);
        let (key_b, _) = keys_of(&b);
        let value = Planted::page(&[]).complete(&logical_a);
        memcached.set_raw(&keys_of(&a).0, &value, 300);
        memcached.set_raw(&key_b, &value, 300);
        let mut conn = RawConn::connect(lacquer.addr());
        for round in 0..3 {
            let got_a = conn.get(&a, &[]);
            assert_eq!(got_a.body, BODY, "{local_ttl} round {round}: A");
            let got_b = conn.get(&b, &[]);
            assert_eq!(
                got_b.text(),
                format!("origin {b}"),
                "{local_ttl} round {round}: A's value served for B"
            );
        }
        lacquer.assert_no_panic();
    }
}

// ---------------------------------------------------------------------------------------------
// Purges, bans and promotion.

/// A ban of a tag covers every page whose tag field names it, whatever else the field holds:
/// `Surrogate-Key: product-7 café` is tagged `product-7`. Tags are split on whitespace and
/// commas and compared exactly (`docs/entry-format.md`, `ban_list/tags.rs`); one non-ASCII tag
/// beside it must not hide the field from bans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_ban_covers_a_page_whose_tag_field_also_holds_a_non_ascii_tag() {
    let cluster = MemcachedCluster::start(1);
    let origin = origin();
    let node = cluster.node(&origin, "A", "");
    let memcached = &cluster.servers[0];
    let plain = Planted::page(&[("surrogate-key", "product-7 catalog")]).older_by(2_000);
    let accented = Planted::page(&[("surrogate-key", "product-7 caf\u{e9}")]).older_by(2_000);
    plant(memcached, "/plain-tags", &plain);
    plant(memcached, "/accented-tags", &accented);
    let mut conn = RawConn::connect(node.proxy.addr());
    for path in ["/plain-tags", "/accented-tags"] {
        assert_eq!(conn.get(path, &[]).body, BODY, "{path} before the ban");
    }
    let ban = admin_post(
        node.admin,
        "/ban",
        Some(ADMIN_TOKEN),
        r#"{"tag": "product-7"}"#,
    )
    .await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    for path in ["/plain-tags", "/accented-tags"] {
        let after = conn.get(path, &[]);
        assert_eq!(
            after.text(),
            format!("origin {path}"),
            "{path}: served after a ban of its tag product-7 ({:?})",
            after.header("cache-status")
        );
    }
    node.proxy.assert_no_panic();
}

/// A purge is never undone by a planted copy: a page planted, read (promoted into memory, or
/// with `local_ttl = "0s"` remembered as decoded bytes), purged (by `PURGE`, or by a ban of a
/// tag its head nominates in `Connection`, which strips the field before the client), and then
/// planted again byte for byte, stays a miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_page_planted_again_stays_purged() {
    let cluster = MemcachedCluster::start(1);
    let origin = origin();
    let memcached = &cluster.servers[0];
    for local_ttl in ["5s", "0s"] {
        let node = cluster.node(&origin, "A", &format!("local_ttl = \"{local_ttl}\""));
        let purged = format!("/purged-{local_ttl}");
        let banned = format!("/banned-{local_ttl}");
        let tag = format!("t-{}", local_ttl.trim_end_matches('s'));
        let page = Planted::page(&[]).older_by(2_000);
        let tagged = Planted::page(&[("surrogate-key", &tag), ("connection", "surrogate-key")])
            .older_by(2_000);
        plant(memcached, &purged, &page);
        plant(memcached, &banned, &tagged);
        let mut conn = RawConn::connect(node.proxy.addr());
        for path in [&purged, &banned] {
            for _ in 0..2 {
                let got = conn.get(path, &[]);
                assert_eq!(got.body, BODY, "{local_ttl} {path} before");
                assert!(got.header("surrogate-key").is_none());
            }
        }
        let purge = request("PURGE", &node.proxy.url(&purged), &[("host", HOST)], None).await;
        assert_eq!(purge.status, 200, "{}", purge.text());
        let ban = admin_post(
            node.admin,
            "/ban",
            Some(ADMIN_TOKEN),
            &format!(r#"{{"tag": "{tag}"}}"#),
        )
        .await;
        assert_eq!(ban.status, 200, "{}", ban.text());
        for replant in [false, true] {
            if replant {
                plant(memcached, &purged, &page);
                plant(memcached, &banned, &tagged);
            }
            for path in [&purged, &banned] {
                for extra in [&[][..], &[("Cache-Control", "max-stale=0")][..]] {
                    let got = conn.get(path, extra);
                    assert_eq!(
                        got.text(),
                        format!("origin {path}"),
                        "{local_ttl} {path} {extra:?} (planted again: {replant}): {:?}",
                        got.header("cache-status")
                    );
                }
            }
        }
        node.proxy.assert_no_panic();
    }
}

/// A planted page promoted into a node's memory is trusted there for `local_ttl` only: a fix
/// written to memcached is served once that has passed, even when the planted page said it was
/// fresh until the end of time, or stale-while-revalidate for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fix_in_memcached_replaces_a_promoted_planted_page_after_local_ttl() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "local_ttl = \"1s\"");
    let mut forever = Planted::page(&[]);
    forever.fresh_until_ms = u64::MAX;
    let mut stale_for_ever = Planted::page(&[]);
    stale_for_ever.fresh_until_ms = now_ms() - 1_000;
    stale_for_ever.swr = u32::MAX;
    stale_for_ever.sie = u32::MAX;
    let cases = [
        ("/fix-plain", Planted::page(&[])),
        ("/fix-forever", forever),
        ("/fix-stale", stale_for_ever),
    ];
    let mut conn = RawConn::connect(lacquer.addr());
    for (path, entry) in &cases {
        plant(&memcached, path, entry);
        assert_eq!(conn.get(path, &[]).body, BODY, "{path}");
    }
    let mut fix = Planted::page(&[]);
    fix.body = b"the fixed body".to_vec();
    for (path, _) in &cases {
        plant(&memcached, path, &fix);
    }
    std::thread::sleep(Duration::from_millis(1_600));
    for (path, _) in &cases {
        for extra in [&[][..], &[("Cache-Control", "max-stale=0")][..]] {
            let got = conn.get(path, extra);
            assert_eq!(
                got.text(),
                "the fixed body",
                "{path} {extra:?}: the planted page outlived local_ttl ({:?})",
                got.header("cache-status")
            );
        }
    }
    lacquer.assert_no_panic();
}

/// Absurd dates neither panic a node nor let an entry escape the bans' horizon: created at the
/// epoch or at `u64::MAX` ms is a miss; fresh until `u64::MAX` ms, or with its `Age` reference at
/// the epoch, is served (the writer's word) on every path without a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_dates_neither_panic_nor_escape_the_horizon() {
    let memcached = MemcachedProcess::start();
    let origin = origin();
    let (lacquer, _admin) = node(&memcached, &origin, "", "");
    let mut created_at_epoch = Planted::page(&[]);
    created_at_epoch.created_ms = 0;
    created_at_epoch.epoch_ms = 0;
    let mut created_at_max = Planted::page(&[]);
    created_at_max.created_ms = u64::MAX;
    created_at_max.epoch_ms = u64::MAX;
    created_at_max.fresh_until_ms = u64::MAX;
    let mut fresh_for_ever = Planted::page(&[]);
    fresh_for_ever.fresh_until_ms = u64::MAX;
    let mut aged = Planted::page(&[]);
    aged.epoch_ms = 0;
    let cases = [
        ("/created-at-epoch", created_at_epoch, false),
        ("/created-at-max", created_at_max, false),
        ("/fresh-for-ever", fresh_for_ever, true),
        ("/aged", aged, true),
    ];
    for (path, entry, _) in &cases {
        plant(&memcached, path, entry);
    }
    let mut failures = Vec::new();
    let (sender, _driver) = h2_connect_default(lacquer.addr()).await;
    for (path, _, served) in &cases {
        let expected = if *served {
            BODY.to_vec()
        } else {
            origin_body(path)
        };
        for extra in [
            &[][..],
            &[("Cache-Control", "max-stale=0")][..],
            &[("If-None-Match", "\"x\"")][..],
        ] {
            let answers = get_with_sentinel(lacquer.addr(), path, extra);
            if answers.len() != 2 || answers[0].body != expected {
                let seen: Vec<String> = answers.iter().map(|a| a.text()).collect();
                failures.push(format!("{path} {extra:?}: {seen:?}"));
            }
        }
        match h2_get_path(&sender, path).await {
            Ok(answer) if answer.body == expected => {}
            Ok(answer) => failures.push(format!("{path} over h2c: {:?}", answer.text())),
            Err(e) => failures.push(format!("{path} over h2c: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    lacquer.assert_no_panic();
}
