//! Range requests answered on the fast hit path, attacked over real sockets.
//!
//! Until 2026-12 every request with `Range` took the standard path (Pingora's cache state
//! machine and its range filter). Now the fast path (`proxy/fast_hit/`, `Answer::for_range`)
//! answers a request naming one satisfiable range (and no `If-Range`) of a fresh `200` in this
//! node's memory tier itself: a `206` of that part; to a plain-TCP HTTP/1.1 client, a part of
//! 64 KiB or more of a body kept in a memory file goes from the file with `sendfile` from the
//! range's offset (vendored pingora-core's `FileBody { fd, offset }`), anything else as slices of
//! the stored chunks (`part_of`). Everything else (several ranges, unsatisfiable or unreadable
//! ones, another stored status, a body to decode for the client, an object only in memcached,
//! a stale one) is declined to the standard path, whose answers are the reference.
//!
//! This file exists to show that the new answers are exactly the old ones, byte for byte and
//! field for field, however a client asks: every edge of a body (first and last bytes, suffixes,
//! open and clamped ends, page and stored-chunk boundaries), the standard path's answer to the
//! same object and range (forced with the object's `ETag` in `If-Range`, or read from memcached
//! on a node that keeps no copy), variants, garbage and hostile `Range` values, HEAD, pipelining,
//! HTTP/1.0, h2c, TLS, slow readers of an object purged under them, many clients at once,
//! clients that reset mid-part, and a low open-file limit. That a part went from the memory file
//! is shown by the proxy's `rchar` (`/proc/PID/io`), which grows by what `sendfile` reads from
//! the file and not by a body written from memory.
//!
//! Found by these tests (2026-12-07), and fixed: the tests at the end. One was new with the fast
//! path's ranges: a body stored without a length was answered `206` where the standard path sent
//! it whole; the memory tier now stores such a body with its length, as memcached reads do, and
//! both paths answer `206`. Four were the standard path's too, in
//! Pingora's range parser (vendored pingora-proxy 0017): a range of an empty body panicked the
//! connection's task on `r.end - 1` (debug builds; a release build sent `bytes
//! 0-18446744073709551615/0`), now the empty body is sent whole; `bytes=-0` was a `206` of no
//! bytes with an invalid `Content-Range`, now `416`; a first byte or a suffix length of more
//! digits than a machine word holds was read as absent (`99999999999999999999999-5` became the
//! suffix `-5`; `-99999999999999999999999` a `416`), now it is larger than any length.

use lacquer_test_support as support;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use support::large_bodies::*;
// (named: `support::get`, reqwest's, is glob-imported too)
use support::large_bodies::get;
use support::raw_text::{find, replace_bytes};
use support::*;

const MB1: usize = 1024 * 1024;

/// The `Last-Modified` of every answer of [`origin`].
const LAST_MODIFIED: &str = "Tue, 01 Dec 2026 10:00:00 GMT";

/// The sizes of the pieces `/pieces/36391` arrives in (pauses between them, so that each is a
/// stored chunk of its own): boundaries at 1000, 4096, 4097, 8192, 16384, 16391, 20487, 22536.
const PIECES: [usize; 9] = [1000, 3096, 1, 4095, 8192, 7, 4096, 2049, 13_855];

/// The length of `/pieces/36391`: the sum of [`PIECES`], under 64 KiB (no memory file).
const PIECED_LEN: usize = 36_391;

/// The path of the small body that arrives in [`PIECES`].
const PIECED: &str = "/pieces/36391";

/// What `rchar` may grow by besides the part `sendfile` reads: the requests the proxy reads.
const RCHAR_SLACK: u64 = 64 * 1024;

/// Parts at least this long of a body in a memory file go from the file; shorter ones are
/// copied from memory (`PART_FROM_FILE_MIN` in `proxy/fast_hit/answer.rs`).
const PART_FROM_FILE_MIN: usize = 64 * 1024;

/// The number after `prefix` in `path` (its query ignored).
fn number_after(path: &str, prefix: &str) -> Option<usize> {
    path.split('?').next()?.strip_prefix(prefix)?.parse().ok()
}

/// The length of the body [`origin`] generates for `path` (`/large/N`, `/pieces/N`, ...: N; for
/// `/gzip/N`, before it is coded).
fn length_of(path: &str) -> usize {
    ["/large/", "/pieces/", "/chunked/", "/gzip/", "/variant/"]
        .iter()
        .find_map(|prefix| number_after(path, prefix))
        .unwrap_or_else(|| panic!("no generated length in {path}"))
}

/// The strong `ETag` [`origin`] gives `path` (its query included).
fn etag_of(path: &str) -> String {
    format!("\"{}-{}\"", seed_for(path), path.len())
}

/// The seed of the body of `/variant/N` for `X-Variant: variant`.
fn variant_seed(path: &str, variant: &str) -> u8 {
    seed_for(&format!("{path}#{variant}"))
}

/// The `ETag` of the body of `/variant/N` for `X-Variant: variant`.
fn variant_etag(path: &str, variant: &str) -> String {
    format!("\"{variant}-{}\"", variant_seed(path, variant))
}

/// The generated body of `/pieces/36391` seeded `seed`, cut into [`PIECES`].
fn pieces(seed: u8) -> Vec<Bytes> {
    let body = generated_bytes(PIECED_LEN, seed);
    let mut at = 0;
    PIECES
        .iter()
        .map(|len| {
            at += len;
            Bytes::copy_from_slice(&body[at - len..at])
        })
        .collect()
}

/// An origin whose every answer is cacheable (`max-age=600`; `max-age=1` for a path ending in
/// `?ttl=1`), with a strong `ETag` of its path ([`etag_of`]), a `Last-Modified` and a
/// `Content-Type`:
/// * `/large/N[?...]`: N generated bytes seeded by the whole path ([`seed_for`]), with a length;
/// * `/pieces/36391`: such a body, with a length, sent in [`PIECES`] 10 ms apart;
/// * `/chunked/N`: such a body chunked, with no length;
/// * `/gzip/N`: such a body gzip-coded (`Content-Encoding: gzip`, `Vary: Accept-Encoding`);
/// * `/variant/N`: N generated bytes seeded by the path and the request's `X-Variant`
///   ([`variant_seed`]), with `Vary: X-Variant` and an `ETag` of that variant ([`variant_etag`]);
/// * `/status/C`: status C (a `Location` with it) and a short body;
/// * `/empty`: a `200` with no body;
/// * anything else: "small body".
fn origin() -> TestOrigin {
    TestOrigin::start(|req: &RecordedRequest| {
        let seed = seed_for(&req.path);
        let path = req.path.as_str();
        let variant = req.header("x-variant").unwrap_or("none");
        let answer = if let Some(len) = number_after(path, "/large/") {
            OriginResponse::generated(len, seed)
        } else if number_after(path, "/pieces/") == Some(PIECED_LEN) {
            OriginResponse::ok(Body::Paced {
                chunks: pieces(seed),
                interval: Duration::from_millis(10),
            })
            .header("Content-Length", PIECED_LEN.to_string())
        } else if let Some(len) = number_after(path, "/chunked/") {
            OriginResponse::chunked(generated_chunks(len, 4000, seed))
        } else if let Some(len) = number_after(path, "/gzip/") {
            OriginResponse::ok(gzip(&generated_bytes(len, seed)))
                .header("Content-Encoding", "gzip")
                .header("Vary", "Accept-Encoding")
        } else if let Some(code) = number_after(path, "/status/") {
            OriginResponse::new(code as u16)
                .body(format!("the stored {code} body"))
                .header("Location", "/elsewhere")
        } else if let Some(len) = number_after(path, "/variant/") {
            OriginResponse::generated(len, variant_seed(path, variant)).header("Vary", "X-Variant")
        } else if path == "/empty" {
            OriginResponse::new(200)
        } else {
            OriginResponse::ok("small body")
        };
        let etag = match path.starts_with("/variant/") {
            true => variant_etag(path, variant),
            false => etag_of(path),
        };
        let cache_control = match path.ends_with("?ttl=1") {
            true => "max-age=1",
            false => "max-age=600",
        };
        answer
            .header("Cache-Control", cache_control)
            .header("ETag", etag)
            .header("Last-Modified", LAST_MODIFIED)
            .header("Content-Type", "application/octet-stream")
    })
}

/// The config of a proxy on `port` in front of `upstream`, with `threads` workers and `extra`
/// TOML (sections) appended.
fn config(port: u16, upstream: SocketAddr, threads: usize, extra: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{upstream}\"\nthreads = {threads}\n\
         [log]\naccess = \"off\"\n{extra}\n"
    )
}

/// A proxy in front of `origin` with `threads` workers and `extra` TOML.
fn proxy(origin: &TestOrigin, threads: usize, extra: &str) -> LacquerProcess {
    let upstream = origin.addr();
    LacquerProcess::start_on_free_port(|port| config(port, upstream, threads, extra))
}

/// A GET of `path` for [`HOST`] with `Range: range`.
fn ranged(path: &str, range: &str) -> String {
    get(path, &format!("Range: {range}\r\n"))
}

/// A HEAD of `path` for [`HOST`] with `Range: range`.
fn ranged_head(path: &str, range: &str) -> String {
    format!("HEAD {path} HTTP/1.1\r\nHost: {HOST}\r\nRange: {range}\r\n\r\n")
}

/// [`ranged`] with the `If-Range` of the stored object's current `ETag`: the range is served (the
/// validator matches), by the standard path (the fast path declines every `If-Range`).
fn ranged_standard(path: &str, range: &str) -> String {
    get(
        path,
        &format!("Range: {range}\r\nIf-Range: {}\r\n", etag_of(path)),
    )
}

/// GETs `path` (a miss) and again (a hit), both whole, on a new connection.
fn store(addr: SocketAddr, path: &str) {
    let mut conn = RawConn::connect(addr);
    for n in 0..2 {
        conn.send(get(path, "").as_bytes());
        let resp = conn.read_response(false);
        assert_whole(&resp, path, &format!("{path}: answer {n} of its fill"));
        if n == 1 {
            assert!(resp.is_hit(), "{path} not stored: {:?}", resp.headers);
        }
    }
}

/// Checks that `resp` is a `200` with the whole generated body of `path`.
fn assert_whole(resp: &RawResponse, path: &str, what: &str) {
    let len = length_of(path);
    assert_eq!(resp.status, 200, "{what}: {:?}", resp.headers);
    assert_eq!(resp.body.len(), len, "{what}");
    assert_eq!(
        generated_mismatch(&resp.body, seed_for(path), 0),
        None,
        "{what}: the body differs from this byte on"
    );
}

/// Checks that `resp` is a `206` of the bytes `start..end` of `path`: its `Content-Range`,
/// `Content-Length` and every byte.
fn assert_part_of(resp: &RawResponse, path: &str, start: usize, end: usize, what: &str) {
    let len = length_of(path);
    assert_eq!(resp.status, 206, "{what}: {:?}", resp.headers);
    assert_eq!(
        resp.header("content-range"),
        Some(format!("bytes {start}-{}/{len}", end - 1).as_str()),
        "{what}"
    );
    assert_eq!(
        resp.header("content-length"),
        Some((end - start).to_string().as_str()),
        "{what}"
    );
    assert_eq!(resp.body.len(), end - start, "{what}");
    assert_eq!(
        generated_mismatch(&resp.body, seed_for(path), start),
        None,
        "{what}: the part differs from this byte of it on"
    );
}

/// [`assert_part_of`], and the answer is a hit.
fn assert_part(resp: &RawResponse, path: &str, start: usize, end: usize, what: &str) {
    assert_part_of(resp, path, start, end, what);
    assert!(resp.is_hit(), "{what}: {:?}", resp.headers);
}

/// Ranges that probe the edges of a body of `len` bytes (more than 8 KiB): `(Range value, first
/// byte, one past the last)`. First, last, a middle byte; the whole body three ways; suffixes
/// shorter than, as long as and longer than the body; an open end; ends past the body (clamped);
/// ranges across page boundaries and, for long enough bodies, across the 64 KiB pieces the
/// origin writes and at 1 MiB.
fn edge_ranges(len: usize) -> Vec<(String, usize, usize)> {
    let mid = len / 2 + 3;
    let mut ranges = vec![
        ("bytes=0-0".to_string(), 0, 1),
        ("bytes=0-99".into(), 0, 100),
        (format!("bytes={}-{}", len - 1, len - 1), len - 1, len),
        (format!("bytes={}-", len - 1), len - 1, len),
        (format!("bytes={mid}-{mid}"), mid, mid + 1),
        ("bytes=0-".into(), 0, len),
        (format!("bytes=0-{}", len - 1), 0, len),
        ("bytes=-1".into(), len - 1, len),
        ("bytes=-777".into(), len - 777, len),
        (format!("bytes=-{len}"), 0, len),
        (format!("bytes=-{}", len + 5000), 0, len),
        (format!("bytes={}-", len / 3), len / 3, len),
        ("bytes=4095-4096".into(), 4095, 4097),
        ("bytes=4096-8191".into(), 4096, 8192),
        ("bytes=4095-8192".into(), 4095, 8193),
        (
            format!("bytes={}-{}", len - 10, len + 100_000),
            len - 10,
            len,
        ),
        ("bytes=100-99999999999".into(), 100, len),
    ];
    for (start, last) in [
        (65_535, 65_536),
        (65_530, 131_080),
        (1_048_575, 1_048_576),
        (1_000_000, 3_999_999),
        (4096, 4096 + PART_FROM_FILE_MIN - 2),
        (4096, 4096 + PART_FROM_FILE_MIN - 1),
    ] {
        if last < len {
            ranges.push((format!("bytes={start}-{last}"), start, last + 1));
        }
    }
    ranges
}

/// What a client sees of an answer, to compare two answers: the status, the field names
/// (lowercase, once each) other than `Date` and `Age`, the values of all fields but `Date`,
/// `Age` and `Cache-Status` (whose `ttl` ticks), a multipart boundary replaced by `BOUNDARY`
/// wherever it appears (each answer draws its own).
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    names: BTreeSet<String>,
    values: Vec<(String, String)>,
}

/// [`Seen`] of `resp`, and its body (boundary replaced).
fn seen(resp: &RawResponse) -> (Seen, Vec<u8>) {
    let boundary = resp
        .header("content-type")
        .and_then(|ct| ct.split_once("boundary="))
        .map(|(_, b)| b.trim().to_string());
    let unbound = |text: &str| match &boundary {
        Some(b) => text.replace(b.as_str(), "BOUNDARY"),
        None => text.to_string(),
    };
    let names = resp
        .headers
        .iter()
        .map(|(name, _)| name.to_ascii_lowercase())
        .filter(|name| name != "date" && name != "age")
        .collect();
    let mut values: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), unbound(value)))
        .filter(|(name, _)| !["date", "age", "cache-status"].contains(&name.as_str()))
        .collect();
    values.sort();
    let body = match &boundary {
        Some(b) => replace_bytes(&resp.body, b.as_bytes(), b"BOUNDARY"),
        None => resp.body.clone(),
    };
    (
        Seen {
            status: resp.status,
            names,
            values,
        },
        body,
    )
}

/// Checks that two answers are the same to a client ([`seen`]), a failure naming `what`.
fn assert_same_answer(fast: &RawResponse, standard: &RawResponse, what: &str) {
    let (fast_seen, fast_body) = seen(fast);
    let (standard_seen, standard_body) = seen(standard);
    assert_eq!(
        fast_seen, standard_seen,
        "{what}: fast path vs standard path"
    );
    let differs = fast_body
        .iter()
        .zip(&standard_body)
        .position(|(a, b)| a != b);
    assert!(
        fast_body.len() == standard_body.len() && differs.is_none(),
        "{what}: bodies of {} and {} bytes, first difference at {differs:?}",
        fast_body.len(),
        standard_body.len()
    );
    assert!(
        fast.is_hit() && standard.is_hit(),
        "{what}: both hits: {:?} / {:?}",
        fast.header("cache-status"),
        standard.header("cache-status")
    );
}

/// The parts of a `multipart/byteranges` body: `(first byte, one past the last, bytes)`.
fn multipart_parts(body: &[u8], boundary: &str) -> Vec<(usize, usize, Vec<u8>)> {
    let delimiter = format!("\r\n--{boundary}");
    let mut parts = Vec::new();
    let mut at = 0;
    loop {
        let found = find(&body[at..], delimiter.as_bytes()).expect("a closing delimiter");
        at += found + delimiter.len();
        if body[at..].starts_with(b"--") {
            return parts;
        }
        let head_end = at + find(&body[at..], b"\r\n\r\n").expect("a part's head");
        let head = String::from_utf8_lossy(&body[at..head_end]).into_owned();
        let range = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.trim()
                    .eq_ignore_ascii_case("content-range")
                    .then(|| value.trim().to_string())
            })
            .expect("a part's Content-Range");
        let (first, last) = range
            .strip_prefix("bytes ")
            .and_then(|r| r.split_once('/'))
            .and_then(|(span, _)| span.split_once('-'))
            .expect("a byte range");
        let (first, end): (usize, usize) =
            (first.parse().unwrap(), last.parse::<usize>().unwrap() + 1);
        let data = head_end + 4;
        parts.push((first, end, body[data..data + end - first].to_vec()));
        at = data + end - first;
    }
}

/// Checks that `resp`, an answer to some `Range` of `path`, is well formed and carries the right
/// bytes of it: a whole `200`; a `206` of one part (as its `Content-Range` names it) or of
/// several (`multipart/byteranges`); or a `416` naming the length, with no body. Returns which.
fn assert_sound(resp: &RawResponse, path: &str, what: &str) -> &'static str {
    let len = length_of(path);
    let seed = seed_for(path);
    match resp.status {
        200 => {
            assert_whole(resp, path, what);
            "whole"
        }
        206 => {
            let content_type = resp.header("content-type").unwrap_or_default();
            if let Some((_, boundary)) = content_type.split_once("boundary=") {
                assert!(content_type.starts_with("multipart/byteranges"), "{what}");
                assert_eq!(resp.header("content-range"), None, "{what}");
                let parts = multipart_parts(&resp.body, boundary.trim());
                assert!(parts.len() >= 2, "{what}: {} parts", parts.len());
                for (first, end, data) in parts {
                    assert_eq!(
                        generated_mismatch(&data, seed, first),
                        None,
                        "{what}: part {first}-{end}"
                    );
                }
                return "multipart";
            }
            let range = resp.header("content-range").expect("a Content-Range");
            let (span, total) = range
                .strip_prefix("bytes ")
                .and_then(|r| r.split_once('/'))
                .unwrap_or_else(|| panic!("{what}: Content-Range {range}"));
            assert_eq!(total, len.to_string(), "{what}");
            let (first, last) = span.split_once('-').expect("first-last");
            let (first, last): (usize, usize) = (first.parse().unwrap(), last.parse().unwrap());
            let n = (last + 1).saturating_sub(first);
            assert_eq!(resp.body.len(), n, "{what}: {range}");
            assert_eq!(
                resp.header("content-length"),
                Some(n.to_string().as_str()),
                "{what}"
            );
            assert_eq!(generated_mismatch(&resp.body, seed, first), None, "{what}");
            "part"
        }
        416 => {
            assert_eq!(
                resp.header("content-range"),
                Some(format!("bytes */{len}").as_str()),
                "{what}"
            );
            assert!(resp.body.is_empty(), "{what}");
            "unsatisfiable"
        }
        status => panic!("{what}: status {status}: {:?}", resp.headers),
    }
}

/// (1) A 4 MiB body kept in a memory file: each of [`edge_ranges`] is a `206` hit with the right
/// `Content-Range` and `Content-Length` and exactly those bytes; each part of 64 KiB or more
/// went from the file (the proxy's `rchar` grows by the part's length, and hardly more, which a
/// part written from memory would not do), each shorter one (4 KiB or more) from memory, one
/// byte short of 64 KiB among them. The object is fetched once, stays one file, and is still
/// whole.
#[test]
fn ranges_of_a_large_body_are_byte_exact_and_leave_from_its_memory_file() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let len = 4 * MB1 + 4097;
    let path = format!("/large/{len}");
    store(addr, &path);
    assert_eq!(memfds(pid), 1, "the body is not kept in a memory file");

    let mut conn = RawConn::connect(addr);
    for (range, start, end) in edge_ranges(len) {
        let before = bytes_read(pid);
        conn.send(ranged(&path, &range).as_bytes());
        let resp = conn.read_response(false);
        let read = bytes_read(pid) - before;
        assert_part(&resp, &path, start, end, &range);
        let part = (end - start) as u64;
        if end - start >= PART_FROM_FILE_MIN {
            assert!(
                read >= part && read <= part + RCHAR_SLACK,
                "{range}: a part of {part} bytes, {read} bytes read by read-like calls: not \
                 sent from the memory file"
            );
        } else if part >= 4096 {
            assert!(
                read < part / 2,
                "{range}: a part of {part} bytes, {read} bytes read: sent from the file"
            );
        }
    }
    conn.send(get(&path, "").as_bytes());
    assert_whole(&conn.read_response(false), &path, "the whole body after");
    assert_eq!(memfds(pid), 1);
    assert_eq!(origin.hits_for(&path), 1);
    lacquer.assert_no_panic();
}

/// The sizes of the DATA frames an h2c client gets for a whole GET of `path` (for [`HOST`]) from
/// the proxy at `addr`: a fast hit over HTTP/2 writes the stored body chunk by chunk, a frame
/// each (a chunk over the 16 KiB frame size in several), so they show how the body is stored.
fn stored_chunks_seen_over_h2(addr: SocketAddr, path: &str) -> Vec<usize> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let (sender, _driver) = h2_connect_default(addr).await;
        let url = format!("http://{HOST}{path}");
        let (response, _) = h2_request(&sender, "GET", &url, &[]).await;
        let response = response.await.expect("an h2 answer");
        let cache_status = response.headers().get("cache-status");
        assert!(
            cache_status.is_some_and(|v| v.to_str().unwrap_or("").contains("; hit")),
            "h2c {path}: not a hit: {cache_status:?}"
        );
        let mut body = response.into_body();
        let mut sizes = Vec::new();
        while let Some(frame) = body.data().await {
            let frame = frame.expect("a DATA frame");
            sizes.push(frame.len());
            let _ = body.flow_control().release_capacity(frame.len());
        }
        sizes
    })
}

/// (1') A 36 KB body (no memory file) that arrived in pieces 10 ms apart, stored in several
/// chunks (an h2c client's DATA frames show them: the pieces, one of a single byte, unless a
/// busy machine read two pieces at once), asked for every range between the points around each
/// boundary of a chunk or a piece, page boundaries among them, and [`edge_ranges`]: every answer
/// a `206` hit of exactly those bytes, sliced from the chunks; no memory file, and the whole body
/// read by nothing.
#[test]
fn ranges_of_a_small_body_are_byte_exact_across_its_stored_chunks() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    store(addr, PIECED);
    assert_eq!(memfds(pid), 0, "a 36 KB body in a memory file");
    let chunks = stored_chunks_seen_over_h2(addr, PIECED);
    assert_eq!(chunks.iter().sum::<usize>(), PIECED_LEN, "{chunks:?}");
    assert!(
        chunks.len() >= 4,
        "the body is stored in {} chunks ({chunks:?}), not in the pieces it arrived in",
        chunks.len()
    );

    let mut points = BTreeSet::from([0, 1, PIECED_LEN - 2, PIECED_LEN - 1]);
    for sizes in [&chunks[..], &PIECES[..]] {
        let mut boundary = 0;
        for size in &sizes[..sizes.len() - 1] {
            boundary += size;
            points.extend([boundary - 1, boundary, boundary + 1]);
        }
    }
    let mut ranges = edge_ranges(PIECED_LEN);
    for &start in &points {
        for &last in points.range(start..) {
            ranges.push((format!("bytes={start}-{last}"), start, last + 1));
        }
    }
    assert!(ranges.len() > 300, "{} ranges", ranges.len());

    let mut conn = RawConn::connect(addr);
    let before = bytes_read(pid);
    for (range, start, end) in &ranges {
        conn.send(ranged(PIECED, range).as_bytes());
        assert_part(&conn.read_response(false), PIECED, *start, *end, range);
    }
    let read = bytes_read(pid) - before;
    assert!(
        read < PIECED_LEN as u64,
        "{read} bytes read by read-like calls for {} parts of a body with no file",
        ranges.len()
    );
    assert_eq!(memfds(pid), 0);
    assert_eq!(origin.hits_for(PIECED), 1);
    lacquer.assert_no_panic();
}

/// (2) For a large body (from its file; a rule adds a field to its answers), a small one in
/// pieces and a gzip body for a client that takes gzip, each of [`edge_ranges`] answered by the
/// fast path is exactly those bytes and equals the standard path's answer to it (forced with the
/// matching `If-Range`): status, fields (but `Date`, `Age`), the values of all but
/// `Cache-Status`, and the body. The two answers did take two paths: only the fast path's parts
/// of 64 KiB or more of the large body were read from the file.
#[test]
fn a_range_is_answered_as_the_standard_path_answers_it() {
    let origin = origin();
    let lacquer = proxy(
        &origin,
        2,
        "[[rules]]\npath_regex = \"^/large/\"\n\
         set_response_headers = { \"X-Edited\" = \"1\" }\n",
    );
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let large = format!("/large/{}", 3 * MB1 + 333);
    let gzipped = "/gzip/200000";
    let gzip_ok = "Accept-Encoding: gzip\r\n";
    store(addr, &large);
    store(addr, PIECED);
    let mut conn = RawConn::connect(addr);
    for _ in 0..2 {
        conn.send(get(gzipped, gzip_ok).as_bytes());
        let resp = conn.read_response(false);
        assert_eq!(resp.header("content-encoding"), Some("gzip"));
    }
    let coded = gzip(&generated_bytes(200_000, seed_for(gzipped)));

    let objects = [
        (
            large.as_str(),
            "",
            generated_bytes(length_of(&large), seed_for(&large)),
        ),
        (PIECED, "", generated_bytes(PIECED_LEN, seed_for(PIECED))),
        (gzipped, gzip_ok, coded),
    ];
    for (path, extra, whole) in &objects {
        let len = whole.len();
        for (range, start, end) in edge_ranges(len) {
            let what = format!("{path} {range}");
            let before = bytes_read(pid);
            conn.send(get(path, &format!("{extra}Range: {range}\r\n")).as_bytes());
            let fast = conn.read_response(false);
            let fast_read = bytes_read(pid) - before;
            let before = bytes_read(pid);
            let if_range = format!("{extra}Range: {range}\r\nIf-Range: {}\r\n", etag_of(path));
            conn.send(get(path, &if_range).as_bytes());
            let standard = conn.read_response(false);
            let standard_read = bytes_read(pid) - before;
            assert_eq!(fast.status, 206, "{what}: {:?}", fast.headers);
            assert_eq!(
                fast.header("content-range"),
                Some(format!("bytes {start}-{}/{len}", end - 1).as_str()),
                "{what}"
            );
            assert!(
                fast.body == whole[start..end],
                "{what}: not the stored bytes"
            );
            let edited = fast.header("x-edited").is_some();
            assert_eq!(edited, *path == large, "{what}: the rule's field");
            assert_same_answer(&fast, &standard, &what);
            let part = (end - start) as u64;
            if *path == large && part >= PART_FROM_FILE_MIN as u64 {
                assert!(
                    fast_read >= part && standard_read < part / 2,
                    "{what}: read {fast_read} (fast) and {standard_read} (standard): the same \
                     path both times?"
                );
            }
        }
    }
    assert_eq!(origin.hits_for(&large), 1);
    assert_eq!(origin.hits_for(PIECED), 1);
    assert_eq!(origin.hits_for(gzipped), 1);
    lacquer.assert_no_panic();
}

/// (2') Three nodes share one memcached: A stores each object (fetched once) and answers its
/// ranges on the fast path, from memory; B keeps no local copies (`local_ttl = "0s"`), so the
/// fast path declines every range there (its memory tier holds nothing) and the standard path
/// reads the object from memcached each time; C promotes what it reads, so its first range is
/// read from memcached (the standard path) and the others from its memory (the fast path). For
/// a large body (memcached chunks; a memory file on A and C) and a small one, every range is
/// the same answer on all three (status, fields, values but `Cache-Status`, body), and
/// `Cache-Status` names the tier each was read from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_read_from_memcached_on_another_node_is_answered_as_the_fast_path_answers_it() {
    let cluster = MemcachedCluster::start(1);
    let origin = origin();
    let announce = "[cache]\nannounce = \"tier\"";
    let a = cluster.node(&origin, "A", &format!("local_ttl = \"1h\"\n{announce}"));
    let b = cluster.node(&origin, "B", &format!("local_ttl = \"0s\"\n{announce}"));
    let c = cluster.node(&origin, "C", &format!("local_ttl = \"1h\"\n{announce}"));
    let paths = [format!("/large/{}", 2 * MB1 + 4099), PIECED.to_string()];
    for (i, path) in paths.iter().enumerate() {
        let a_addr = a.proxy.addr();
        let owned = path.clone();
        tokio::task::spawn_blocking(move || store(a_addr, &owned))
            .await
            .unwrap();
        let expected = i as u64 + 1;
        let writes = wait_for_stat(a.admin, "writes", expected, BOUND).await;
        assert_eq!(writes, expected, "A wrote {path} to memcached");

        let addrs = [a_addr, b.proxy.addr(), c.proxy.addr()];
        let owned = path.clone();
        let answers = tokio::task::spawn_blocking(move || {
            let mut conns = addrs.map(RawConn::connect);
            edge_ranges(length_of(&owned))
                .into_iter()
                .map(|(range, start, end)| {
                    let answers = conns.each_mut().map(|conn| {
                        conn.send(ranged(&owned, &range).as_bytes());
                        conn.read_response(false)
                    });
                    (range, start, end, answers)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        let tier = |resp: &RawResponse| resp.header("cache-status").unwrap_or("").to_string();
        for (n, (range, start, end, [on_a, on_b, on_c])) in answers.iter().enumerate() {
            let what = format!("{path} {range}");
            for (node, resp) in [("A", on_a), ("B", on_b), ("C", on_c)] {
                assert_part(resp, path, *start, *end, &format!("{what} on {node}"));
            }
            assert!(
                tier(on_a).contains("detail=memory"),
                "{what}: A: {}",
                tier(on_a)
            );
            assert!(
                tier(on_b).contains("detail=memcached"),
                "{what}: B: {}",
                tier(on_b)
            );
            let c_tier = if n == 0 {
                "detail=memcached"
            } else {
                "detail=memory"
            };
            assert!(tier(on_c).contains(c_tier), "{what}: C: {}", tier(on_c));
            assert_same_answer(
                on_a,
                on_b,
                &format!("{what}, A's (fast) vs B's (memcached)"),
            );
            assert_same_answer(on_c, on_b, &format!("{what}, C's vs B's (memcached)"));
        }
        assert_eq!(origin.hits_for(path), 1);
    }
    for node in [&a, &b, &c] {
        node.proxy.assert_no_panic();
    }
}

/// The `Range` values of (3): garbage, hostile and odd ones, and ranges the standard path
/// answers (several, none satisfiable), for a body of `len` bytes.
fn hostile_ranges(len: usize) -> Vec<Vec<u8>> {
    let many = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("{}-{}", 4 * i, 4 * i + 1)).collect();
        format!("bytes={}", list.join(","))
    };
    let mut values: Vec<Vec<u8>> = [
        "bytes=0-9,100-109".to_string(),
        "bytes=0-0,-1".into(),
        "bytes=0-9 , 20-29".into(),
        "bytes=0-9,5-14".into(),
        "bytes=-5,0-0".into(),
        "bytes=5000000-".into(),
        format!("bytes={len}-"),
        format!("bytes={len}-{}", len + 10),
        "bytes=abc".into(),
        "bytes=5-3".into(),
        "items=0-1".into(),
        "bytes=-0".into(),
        "bytes=0-99999999999999999999999".into(),
        "bytes=99999999999999999999999-".into(),
        "bytes=18446744073709551615-".into(),
        "bytes=0-18446744073709551615".into(),
        "bytes=-18446744073709551615".into(),
        "bytes=".into(),
        "bytes=-".into(),
        "bytes=,".into(),
        "bytes=0-0,,,,".into(),
        ",,,,,,,,,,".into(),
        many(150),
        many(250),
        "bytes= 0-9".into(),
        "bytes=\t0-9".into(),
        "BYTES=0-9".into(),
        "bytes = 0-9".into(),
        "bytes=0 - 9".into(),
        "bytes=0-9;x".into(),
        "bytes=+0-9".into(),
        "bytes=0x0-9".into(),
        "bytes=0-9=".into(),
        "bytes==0-9".into(),
        "=0-9".into(),
        "bytes".into(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    values.push(b"bytes=0-9\xff".to_vec());
    values.push(b"bytes=\xc3\xa9-9".to_vec());
    values
}

/// A GET of `path` with `Range: value` (raw bytes) and `extra` lines.
fn ranged_raw(path: &str, value: &[u8], extra: &str) -> Vec<u8> {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {HOST}\r\n{extra}Range: ").into_bytes();
    request.extend_from_slice(value);
    request.extend_from_slice(b"\r\n\r\n");
    request
}

/// (3) Garbage, hostile and declined `Range` values ([`hostile_ranges`]) of a body in a memory
/// file and of a small one: each answer is well formed with the right bytes ([`assert_sound`]:
/// a whole `200`, a `206` of the bytes its `Content-Range` names, a `multipart/byteranges` of
/// the right parts, or a `416` naming the length), never a 5xx, and the same as the standard
/// path's answer to it (the matching `If-Range`); the connection they were all sent on, a small
/// page between each, stays usable throughout. A few are pinned to what they must be: several
/// ranges a multipart `206`; a first byte past the end a `416`; an unknown unit or unreadable
/// syntax the whole `200`; more than 200 ranges the whole `200`.
#[test]
fn garbage_hostile_and_declined_ranges_are_answered_as_the_standard_path_answers_them() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let addr = lacquer.addr();
    let large = format!("/large/{}", 200 * 1024 + 11);
    store(addr, &large);
    store(addr, PIECED);
    assert_eq!(memfds(lacquer.pid()), 1);
    let pinned: [(&[u8], &str); 8] = [
        (b"bytes=0-9,100-109", "multipart"),
        (b"bytes=5000000-", "unsatisfiable"),
        (b"bytes=abc", "whole"),
        (b"items=0-1", "whole"),
        (b"bytes=0 - 9", "whole"),
        (b"bytes=0-9\xff", "whole"),
        (b"BYTES=0-9", "part"),
        (b"bytes=0-99999999999999999999999", "part"),
    ];
    let mut conn = RawConn::connect(addr);
    for path in [large.as_str(), PIECED] {
        let mut kinds = BTreeSet::new();
        for value in hostile_ranges(length_of(path)) {
            let what = format!("{path} Range: {}", String::from_utf8_lossy(&value));
            conn.send(&ranged_raw(path, &value, ""));
            let resp = conn
                .try_read_response(false)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(resp.status < 500, "{what}: {}", resp.status);
            let kind = assert_sound(&resp, path, &what);
            kinds.insert(kind);
            if let Some((_, expected)) = pinned.iter().find(|(v, _)| *v == &value[..]) {
                assert_eq!(kind, *expected, "{what}");
            }
            let ranges_named = value.iter().filter(|b| **b == b',').count() + 1;
            if value.starts_with(b"bytes=0-1,") {
                let expected = if ranges_named > 200 {
                    "whole"
                } else {
                    "multipart"
                };
                assert_eq!(kind, expected, "{ranges_named} ranges");
            }
            // the standard path's answer, on a connection of its own (it may close it)
            let mut other = RawConn::connect(addr);
            let if_range = format!("If-Range: {}\r\n", etag_of(path));
            other.send(&ranged_raw(path, &value, &if_range));
            let standard = other
                .try_read_response(false)
                .unwrap_or_else(|e| panic!("{what} with If-Range: {e}"));
            assert_same_answer(&resp, &standard, &what);
            // and the connection is still good for the next request
            conn.send(get("/small", "").as_bytes());
            let next = conn
                .try_read_response(false)
                .unwrap_or_else(|e| panic!("after {what}: {e}"));
            assert_eq!(next.text(), "small body", "after {what}");
        }
        assert_eq!(
            kinds,
            BTreeSet::from(["whole", "part", "multipart", "unsatisfiable"]),
            "{path}"
        );
    }
    assert_eq!(origin.hits_for(&large), 1);
    assert_eq!(origin.hits_for(PIECED), 1);
    lacquer.assert_no_panic();
}

/// (3') A stored `404` and `301` asked for a range: each served as stored, whole, its status
/// and body, a hit; several times, on one connection.
#[test]
fn a_stored_404_or_301_asked_for_a_range_is_served_whole_as_stored() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let mut conn = RawConn::connect(lacquer.addr());
    for code in [404u16, 301] {
        let path = format!("/status/{code}");
        let body = format!("the stored {code} body");
        conn.send(get(&path, "").as_bytes());
        assert_eq!(conn.read_response(false).status, code);
        for range in [
            "bytes=0-3",
            "bytes=-2",
            "bytes=4-",
            "bytes=0-0,5-6",
            "bytes=900-",
        ] {
            conn.send(ranged(&path, range).as_bytes());
            let resp = conn.read_response(false);
            assert_eq!(resp.status, code, "{path} {range}");
            assert_eq!(resp.text(), body, "{path} {range}");
            assert_eq!(resp.header("content-range"), None, "{path} {range}");
            assert!(resp.is_hit(), "{path} {range}: {:?}", resp.headers);
        }
        assert_eq!(origin.hits_for(&path), 1);
    }
    lacquer.assert_no_panic();
}

/// (3'') A gzip body stored as gzip (a small one, and one of 300 KB in a memory file), asked for
/// a range by a client that does not take gzip: the whole body decoded, a `200` with no
/// `Content-Encoding` (the range of the decoded body is unknown until it is decoded), as
/// before; by a client that takes gzip, a `206` of the stored gzip bytes. One fill each.
#[test]
fn a_gzip_body_asked_for_a_range_by_a_client_without_gzip_is_sent_whole_and_decoded() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let mut conn = RawConn::connect(lacquer.addr());
    let gzip_ok = "Accept-Encoding: gzip\r\n";
    for len in [20_000, 300_000] {
        let path = format!("/gzip/{len}");
        let plain = generated_bytes(len, seed_for(&path));
        let coded = gzip(&plain);
        conn.send(get(&path, gzip_ok).as_bytes());
        assert!(conn.read_response(false).body == coded, "{path}: the fill");
        for range in ["bytes=0-99", "bytes=-10", "bytes=1000-", "bytes=0-"] {
            for extra in [
                "",
                "Accept-Encoding: identity\r\n",
                "Accept-Encoding: br\r\n",
            ] {
                let what = format!("{path} {range} {extra:?}");
                conn.send(get(&path, &format!("{extra}Range: {range}\r\n")).as_bytes());
                let resp = conn.read_response(false);
                assert_eq!(resp.status, 200, "{what}: {:?}", resp.headers);
                assert_eq!(resp.header("content-encoding"), None, "{what}");
                assert_eq!(resp.header("content-range"), None, "{what}");
                assert!(resp.body == plain, "{what}: not the whole decoded body");
            }
            conn.send(get(&path, &format!("{gzip_ok}Range: {range}\r\n")).as_bytes());
            let resp = conn.read_response(false);
            assert_eq!(resp.status, 206, "{path} {range}");
            assert_eq!(resp.header("content-encoding"), Some("gzip"));
            let range = resp.header("content-range").expect("a Content-Range");
            let (span, _) = range["bytes ".len()..].split_once('/').unwrap();
            let (first, last) = span.split_once('-').unwrap();
            let (first, last): (usize, usize) = (first.parse().unwrap(), last.parse().unwrap());
            assert!(resp.body == coded[first..=last], "{path} {range}");
            assert!(resp.is_hit());
        }
        assert_eq!(origin.hits_for(&path), 1);
    }
    lacquer.assert_no_panic();
}

/// (3''') HEAD with a range, of a large body and a small one, pipelined with GETs on one
/// connection: each HEAD a `206` head (its `Content-Range`, the part's `Content-Length`) and no
/// body bytes at all, the GETs after it whole and exact, in order; HEAD of an unsatisfiable range
/// a `416` head; the connection still open and usable after.
#[test]
fn head_with_a_range_is_a_206_head_without_body_and_the_connection_goes_on() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let addr = lacquer.addr();
    let large = format!("/large/{}", 2 * MB1 + 5);
    store(addr, &large);
    store(addr, PIECED);
    let large_len = length_of(&large);
    let mut conn = RawConn::connect(addr);
    let requests = [
        ranged_head(&large, "bytes=100-199"),
        ranged(&large, "bytes=100-199"),
        ranged_head(PIECED, "bytes=-1000"),
        ranged(PIECED, "bytes=4000-4100"),
        ranged_head(&large, "bytes=0-"),
        ranged_head(&large, "bytes=9999999-"),
        get(&large, ""),
        ranged_head(PIECED, "bytes=0-0"),
        ranged(&large, &format!("bytes={}-", large_len - 5000)),
    ];
    conn.send(requests.concat().as_bytes());
    assert_head(&conn.read_response(true), &large, 100, 200);
    assert_part(
        &conn.read_response(false),
        &large,
        100,
        200,
        "GET after HEAD",
    );
    assert_head(
        &conn.read_response(true),
        PIECED,
        PIECED_LEN - 1000,
        PIECED_LEN,
    );
    assert_part(
        &conn.read_response(false),
        PIECED,
        4000,
        4101,
        "GET after HEAD",
    );
    assert_head(&conn.read_response(true), &large, 0, large_len);
    let unsatisfiable = conn.read_response(true);
    assert_eq!(unsatisfiable.status, 416, "{:?}", unsatisfiable.headers);
    assert_eq!(
        unsatisfiable.header("content-range"),
        Some(format!("bytes */{large_len}").as_str())
    );
    assert_whole(&conn.read_response(false), &large, "GET after HEADs");
    assert_head(&conn.read_response(true), PIECED, 0, 1);
    assert_part(
        &conn.read_response(false),
        &large,
        large_len - 5000,
        large_len,
        "the last GET",
    );
    // nothing more: no HEAD answer carried stray body bytes
    assert!(!conn.is_closed(Duration::from_millis(300)));
    conn.send(get("/small", "").as_bytes());
    assert_eq!(conn.read_response(false).text(), "small body");
    assert_eq!(origin.hits_for(&large), 1);
    lacquer.assert_no_panic();
}

/// Checks that `resp`, the answer to a HEAD, is the `206` head of bytes `start..end` of `path`.
fn assert_head(resp: &RawResponse, path: &str, start: usize, end: usize) {
    let len = length_of(path);
    assert_eq!(resp.status, 206, "HEAD {path}: {:?}", resp.headers);
    assert_eq!(
        resp.header("content-range"),
        Some(format!("bytes {start}-{}/{len}", end - 1).as_str()),
        "HEAD {path}"
    );
    assert_eq!(
        resp.header("content-length"),
        Some((end - start).to_string().as_str()),
        "HEAD {path}"
    );
    assert!(resp.body.is_empty());
    assert!(resp.is_hit(), "HEAD {path}: {:?}", resp.headers);
}

/// (4a) A slow client (small receive buffer) is in the middle of a large part (more than the
/// socket buffers hold, sent from the memory file) when the object is purged: the send keeps the
/// purged object's file open, a request meanwhile misses (the origin is asked again) and gets
/// its part, and the slow client then gets its part whole, every byte right. Once it is done,
/// the purged object's file is closed.
#[test]
fn a_slow_reader_of_a_large_range_gets_it_whole_though_the_object_is_purged_mid_send() {
    let len = unbufferable_len();
    let origin = origin();
    let lacquer = proxy(
        &origin,
        1,
        "[server]\nsend_timeout = \"10m\"\n[cache]\nmax_object_size = \"64MiB\"\n",
    );
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = format!("/large/{len}?purged");
    store(addr, &path);
    assert_eq!(memfds(pid), 1);

    let (start, end) = (777_777, len - 4_444);
    let mut slow = Reader::new(connect_small(addr, 4096, false));
    slow.stream
        .write_all(ranged(&path, &format!("bytes={start}-{}", end - 1)).as_bytes())
        .expect("send");
    let (status, length) = slow.head();
    assert_eq!((status, length), (206, end - start), "{}", slow.last_head);
    assert_eq!(
        head_field(&slow.last_head, "content-range"),
        Some(format!("bytes {start}-{}/{len}", end - 1).as_str())
    );
    let mut body = slow.body(256 * 1024, 4096, Duration::ZERO);

    // the client reads nothing meanwhile: most of its part is still to send
    purge(addr, &path);
    retire_removed(addr);
    assert_eq!(
        memfds(pid),
        1,
        "the send in progress must hold the purged (and retired) object's file"
    );
    let mut conn = RawConn::connect(addr);
    conn.send(ranged(&path, "bytes=1000-1999").as_bytes());
    let after = conn.read_response(false);
    assert_part_of(&after, &path, 1000, 2000, "a range after the purge");
    assert!(
        !after.is_hit(),
        "a hit after the purge: {:?}",
        after.headers
    );
    assert_eq!(origin.hits_for(&path), 2);

    body.extend(slow.body(length - body.len(), 64 * 1024, Duration::ZERO));
    assert_eq!(body.len(), length, "the slow client's part was cut");
    assert_eq!(
        generated_mismatch(&body, seed_for(&path), start),
        None,
        "the slow client's part differs from this byte of it on"
    );
    drop(slow);
    assert_eq!(
        memfds_settle(pid, 1),
        1,
        "the purged object's file outlived its send"
    );
    conn.send(ranged(&path, "bytes=-100").as_bytes());
    assert_part(
        &conn.read_response(false),
        &path,
        len - 100,
        len,
        "a hit again",
    );
    lacquer.assert_no_panic();
}

/// (4a') A slow client is in the middle of a large part (sent from the memory file) when the
/// proxy is reloaded (SIGHUP, a new `via_name`) and then told to stop (SIGTERM): the reload is
/// applied, a range asked meanwhile is a fast-path hit from the same file under the new settings,
/// the draining process keeps sending, the slow client gets its part whole, and the process
/// exits cleanly once it has, drained, not cut at `shutdown_timeout`.
#[test]
fn a_slow_reader_of_a_large_range_gets_it_whole_across_a_reload_and_a_drain() {
    let len = unbufferable_len();
    let origin = origin();
    let upstream = origin.addr();
    let extra = |via: &str| {
        format!(
            "[server]\nsend_timeout = \"10m\"\n[proxy]\n\
             via_name = \"{via}\"\n[cache]\nmax_object_size = \"64MiB\"\n"
        )
    };
    let mut lacquer =
        LacquerProcess::start_on_free_port(|port| config(port, upstream, 1, &extra("before")));
    let (addr, pid, port) = (lacquer.addr(), lacquer.pid(), lacquer.port());
    let path = format!("/large/{len}?signals");
    store(addr, &path);
    assert_eq!(memfds(pid), 1);

    let (start, end) = (123_457, len - 1_111);
    let mut slow = Reader::new(connect_small(addr, 4096, false));
    slow.stream
        .write_all(ranged(&path, &format!("bytes={start}-{}", end - 1)).as_bytes())
        .expect("send");
    let (status, length) = slow.head();
    assert_eq!((status, length), (206, end - start), "{}", slow.last_head);
    let mut body = slow.body(256 * 1024, 4096, Duration::ZERO);

    // a reload while the client reads nothing: most of its part is still to send
    lacquer.write_config(&config(port, upstream, 1, &extra("after")));
    assert!(lacquer.signal("HUP"));
    assert!(
        wait_for_log(&lacquer, "configuration reloaded", BOUND),
        "the reload was not applied; stderr:\n{}",
        lacquer.stderr_log()
    );
    let before = bytes_read(pid);
    let resp = fetch_range(addr, &path, "bytes=0-99999");
    assert_part(&resp, &path, 0, 100_000, "a range after the reload");
    assert!(resp.is_hit(), "{:?}", resp.headers);
    assert!(
        resp.header("via").is_some_and(|via| via.contains("after")),
        "{:?}",
        resp.headers
    );
    assert!(
        bytes_read(pid) - before >= 100_000,
        "the part after the reload was not sent from the memory file"
    );

    body.extend(slow.body(256 * 1024, 4096, Duration::ZERO));
    assert!(lacquer.signal("TERM"));
    assert!(
        wait_for_log(&lacquer, "draining: ", BOUND),
        "no drain began; stderr:\n{}",
        lacquer.stderr_log()
    );
    assert!(lacquer.is_running(), "exited with a part in flight");
    body.extend(slow.body(length - body.len(), 64 * 1024, Duration::ZERO));
    assert_eq!(body.len(), length, "the slow client's part was cut");
    assert_eq!(
        generated_mismatch(&body, seed_for(&path), start),
        None,
        "the slow client's part differs from this byte of it on"
    );
    assert!(
        slow.last_head.to_ascii_lowercase().contains("before"),
        "the part begun before the reload is answered with the settings it began under: {}",
        slow.last_head
    );
    let status = lacquer.wait_exit(BOUND);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; stderr:\n{}",
        lacquer.stderr_log()
    );
    let log = lacquer.stderr_log();
    assert!(
        log.contains("drained after") && !log.contains("shutdown_timeout"),
        "the process did not end drained; stderr:\n{log}"
    );
    assert_eq!(origin.hits_for(&path), 1);
    lacquer.assert_no_panic();
}

/// One GET of `path` with `Range: range` on a new connection.
fn fetch_range(addr: SocketAddr, path: &str, range: &str) -> RawResponse {
    let mut conn = RawConn::connect(addr);
    conn.send(ranged(path, range).as_bytes());
    conn.read_response(false)
}

/// Waits until `pid` holds `want` memory files, for at most [`BOUND`]; returns the last count.
fn memfds_settle(pid: u32, want: usize) -> usize {
    settle(|| memfds(pid), |n| n == want)
}

/// (4b) 16 clients at once (half with small receive windows, so each send is taken in pieces
/// and the `sendfile`s of different offsets interleave), each asking 4 different ranges of one
/// 4 MB object on its keep-alive connection, on two workers: every part a hit, every byte its
/// own, one fetch, one file.
#[test]
fn many_clients_asking_different_ranges_of_one_object_at_once_each_get_their_own_bytes() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let len = 4 * MB1 + 777;
    let path = Arc::new(format!("/large/{len}?crowd"));
    store(addr, &path);
    let clients: Vec<_> = (0..16u64)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let stream = if t % 2 == 0 {
                    connect_small(addr, 16 * 1024, false)
                } else {
                    let stream = std::net::TcpStream::connect(addr).expect("connect");
                    stream
                        .set_read_timeout(Some(BOUND))
                        .expect("a read timeout");
                    stream
                };
                let mut conn = Reader::new(stream);
                // a different start and length for each client and request
                let mut state = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                for i in 0..4 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let start = (state % len as u64) as usize;
                    let most = 1 + (state >> 32) as usize % (600 * 1024);
                    let end = (start + most).min(len);
                    let what = format!("client {t}, request {i}: bytes={start}-{}", end - 1);
                    conn.stream
                        .write_all(ranged(&path, &format!("bytes={start}-{}", end - 1)).as_bytes())
                        .expect("send");
                    let (status, length) = conn.head();
                    assert_eq!((status, length), (206, end - start), "{what}");
                    assert!(head_is_hit(&conn.last_head), "{what}: {}", conn.last_head);
                    assert_eq!(
                        head_field(&conn.last_head, "content-range"),
                        Some(format!("bytes {start}-{}/{len}", end - 1).as_str()),
                        "{what}"
                    );
                    let part = conn.body(length, 64 * 1024, Duration::ZERO);
                    assert_eq!(part.len(), length, "{what}");
                    assert_eq!(
                        generated_mismatch(&part, seed_for(&path), start),
                        None,
                        "{what}"
                    );
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a client failed");
    }
    assert_eq!(origin.hits_for(&path), 1);
    assert_eq!(memfds(pid), 1);
    lacquer.assert_no_panic();
}

/// A request of (4c): its text, whether it is a HEAD, its path and the part it asks for (`None`:
/// an answer to check with [`assert_sound`], or a small page).
type Pipelined<'a> = (String, bool, &'a str, Option<(usize, usize)>);

/// (4c) Range requests pipelined on one connection, sent in one write: GETs and HEADs of ranges
/// of a body in a memory file and of a small one, a whole GET, several ranges (multipart, the
/// standard path), an unsatisfiable range and a small page between them: answered in order,
/// each exact, on a connection that stays open.
#[test]
fn pipelined_range_requests_are_answered_in_order_and_byte_exact() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "[server]\nwrite_buffer = \"1KiB\"\n");
    let addr = lacquer.addr();
    let large = format!("/large/{}", 3 * MB1 + 17);
    let large_len = length_of(&large);
    store(addr, &large);
    store(addr, PIECED);
    // (request, is HEAD, path, the part expected: `None` for "check it is sound")
    let order: Vec<Pipelined> = vec![
        (
            ranged(&large, "bytes=0-65535"),
            false,
            &large,
            Some((0, 65_536)),
        ),
        (
            ranged(PIECED, "bytes=999-4097"),
            false,
            PIECED,
            Some((999, 4098)),
        ),
        (
            ranged_head(&large, "bytes=-5"),
            true,
            &large,
            Some((large_len - 5, large_len)),
        ),
        (
            ranged(&large, "bytes=2000000-"),
            false,
            &large,
            Some((2_000_000, large_len)),
        ),
        (get("/small", ""), false, "/small", None),
        (ranged(&large, "bytes=0-9,100-109"), false, &large, None),
        (ranged_head(PIECED, "bytes=1-1"), true, PIECED, Some((1, 2))),
        (ranged(&large, "bytes=99999999-"), false, &large, None),
        (get(PIECED, ""), false, PIECED, None),
        (
            ranged(PIECED, "bytes=-36391"),
            false,
            PIECED,
            Some((0, PIECED_LEN)),
        ),
        (
            ranged(&large, "bytes=4095-1048576"),
            false,
            &large,
            Some((4095, 1_048_577)),
        ),
    ];
    let mut conn = RawConn::connect(addr);
    let pipeline: String = order.iter().map(|(request, ..)| request.as_str()).collect();
    conn.send(pipeline.as_bytes());
    for (n, (_, is_head, path, part)) in order.iter().enumerate() {
        let resp = conn.read_response(*is_head);
        let what = format!("answer {n} ({path})");
        match (part, *is_head) {
            (Some((start, end)), true) => assert_head(&resp, path, *start, *end),
            (Some((start, end)), false) => assert_part(&resp, path, *start, *end, &what),
            (None, _) if *path == "/small" => assert_eq!(resp.text(), "small body", "{what}"),
            (None, _) => {
                assert_sound(&resp, path, &what);
            }
        }
    }
    assert!(!conn.is_closed(Duration::from_millis(300)));
    conn.send(ranged(PIECED, "bytes=0-0").as_bytes());
    assert_part(
        &conn.read_response(false),
        PIECED,
        0,
        1,
        "after the pipeline",
    );
    assert_eq!(origin.hits_for(&large), 1);
    lacquer.assert_no_panic();
}

/// (4d) Clients that leave in the middle of a large part: half with a reset (`SO_LINGER` 0, the
/// proxy's `sendfile` then fails), half closing with their socket full and unread, some after
/// pipelining another range: the next client gets its part exact each time, the proxy's
/// descriptors settle back to what they were before them, and no cut send keeps the file (none
/// open once the object is purged and retired).
#[test]
fn clients_that_leave_mid_range_leave_no_descriptor_behind() {
    let origin = origin();
    let lacquer = proxy(&origin, 1, "[cache]\nmax_object_size = \"64MiB\"\n");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let len = unbufferable_len();
    let path = format!("/large/{len}?leaving");
    store(addr, &path);
    let mut conn = RawConn::connect(addr);
    conn.send(ranged(&path, "bytes=0-0").as_bytes());
    assert_part(&conn.read_response(false), &path, 0, 1, "before");
    let before = open_fds(pid);
    for i in 0..10 {
        let start = 100_000 * i + 1;
        let mut leaving = Reader::new(connect_small(addr, 8192, i % 2 == 0));
        let request = ranged(&path, &format!("bytes={start}-"));
        leaving
            .stream
            .write_all(request.repeat(1 + i % 3).as_bytes())
            .expect("send");
        let (status, length) = leaving.head();
        assert_eq!((status, length), (206, len - start));
        leaving.body(50_000 * (i + 1), 8192, Duration::ZERO);
        drop(leaving);
        conn.send(ranged(&path, &format!("bytes={start}-{}", start + 9999)).as_bytes());
        assert_part(
            &conn.read_response(false),
            &path,
            start,
            start + 10_000,
            "after a leaver",
        );
    }
    let after = settle(|| open_fds(pid), |n| n <= before);
    assert!(
        after <= before,
        "{after} descriptors open after the leavers, {before} before them"
    );
    assert_eq!(memfds(pid), 1);
    purge(addr, &path);
    retire_removed(addr);
    assert_eq!(
        memfds_settle(pid, 0),
        0,
        "a part cut by its client's leaving kept the file open"
    );
    lacquer.assert_no_panic();
}

/// (4e) HTTP/1.0 clients asking for ranges: without keep-alive, the part then the close; with
/// `Connection: keep-alive`, several parts on one connection; of a body in a memory file and of
/// a small one.
#[test]
fn http_1_0_clients_get_their_ranges_exact() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let addr = lacquer.addr();
    let large = format!("/large/{}", MB1 + 3);
    store(addr, &large);
    store(addr, PIECED);
    for (path, start, end) in [(large.as_str(), 4096, 900_000), (PIECED, 999, 20_488)] {
        let request = |keep: &str| {
            format!(
                "GET {path} HTTP/1.0\r\nHost: {HOST}\r\n{keep}Range: bytes={start}-{}\r\n\r\n",
                end - 1
            )
        };
        let mut conn = RawConn::connect(addr);
        conn.send(request("").as_bytes());
        let resp = conn.read_response(false);
        assert_part(&resp, path, start, end, "HTTP/1.0");
        assert!(
            conn.is_closed(Duration::from_secs(5)),
            "{path}: an HTTP/1.0 connection stays open"
        );
        let mut conn = RawConn::connect(addr);
        for n in 0..3 {
            conn.send(request("Connection: keep-alive\r\n").as_bytes());
            let resp = conn.read_response(false);
            assert_part(&resp, path, start, end, &format!("HTTP/1.0 keep-alive {n}"));
        }
    }
    assert_eq!(origin.hits_for(&large), 1);
    lacquer.assert_no_panic();
}

/// (4f) An h2c client asking for ranges of a body that has a memory file (HTTP/2 is never sent
/// from it: slices of the chunks) and of a small one: each a `206` hit of exactly those bytes,
/// the same as the standard path's (`If-Range`), none read from the file; and the empty part
/// `bytes=-0` answers as it does over HTTP/1.1 instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_client_gets_its_ranges_exact_from_the_stored_chunks() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let pid = lacquer.pid();
    let client = h2c_client();
    let large = format!("/large/{}", 2 * MB1 + 1);
    for path in [large.as_str(), PIECED] {
        let url = lacquer.url(path);
        for _ in 0..2 {
            let resp = send(&client, "GET", &url, &[], None).await.expect("h2c");
            assert_eq!(resp.status, 200);
            assert_eq!(resp.version, reqwest::Version::HTTP_2);
        }
        let len = length_of(path);
        let mut ranges = edge_ranges(len);
        ranges.retain(|(_, start, end)| end - start < MB1 || *start == 0);
        for (range, start, end) in ranges {
            let what = format!("h2c {path} {range}");
            let before = bytes_read(pid);
            let fast = send(&client, "GET", &url, &[("range", &range)], None)
                .await
                .expect("an h2c answer");
            let read = bytes_read(pid) - before;
            assert_eq!(fast.status, 206, "{what}: {:?}", fast.headers);
            assert!(fast.is_hit(), "{what}: {:?}", fast.cache_status());
            assert_eq!(
                fast.header("content-range"),
                Some(format!("bytes {start}-{}/{len}", end - 1)),
                "{what}"
            );
            assert_eq!(fast.content_length(), Some((end - start) as u64), "{what}");
            assert_eq!(fast.body.len(), end - start, "{what}");
            assert_eq!(
                generated_mismatch(&fast.body, seed_for(path), start),
                None,
                "{what}"
            );
            let part = (end - start) as u64;
            assert!(
                part < 4096 || read < part / 2,
                "{what}: {read} bytes read for a part of {part}: sent from the file over h2?"
            );
            let etag = etag_of(path);
            let standard = send(
                &client,
                "GET",
                &url,
                &[("range", &range), ("if-range", &etag)],
                None,
            )
            .await
            .expect("an h2c answer");
            let skip = ["date", "age", "cache-status"];
            assert_eq!(
                fast.seen_except(&skip),
                standard.seen_except(&skip),
                "{what}"
            );
        }
        let empty = tokio::time::timeout(
            Duration::from_secs(5),
            send(&client, "GET", &url, &[("range", "bytes=-0")], None),
        )
        .await
        .unwrap_or_else(|_| panic!("h2c {path} bytes=-0: no answer within 5 s"))
        .expect("an h2c answer");
        assert!(empty.body.is_empty(), "h2c {path} bytes=-0");
        assert!(empty.status < 500, "h2c {path} bytes=-0: {}", empty.status);
    }
    assert_eq!(origin.hits_for(&large), 1);
    lacquer.assert_no_panic();
}

/// (5) Under `prlimit --nofile=64:64` at most 16 memory files are open (a quarter of the limit):
/// of 24 large objects stored, the first 16 have one and the last 8 are in anonymous memory.
/// Ranges of every one of them are `206` hits of exactly their bytes; the parts of 64 KiB or
/// more of the first 16 went from the file, those of the last 8 were written from memory; new
/// connections are still accepted meanwhile.
#[test]
fn ranges_stay_byte_exact_under_a_low_open_file_limit() {
    let origin = origin();
    let upstream = origin.addr();
    let lacquer = start_with_open_file_limit(64, |port| config(port, upstream, 1, ""));
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let paths: Vec<String> = (0..24)
        .map(|i| format!("/large/{}?f={i}", 100 * 1024 + i * 1021))
        .collect();
    for path in &paths {
        store(addr, path);
    }
    assert_eq!(
        memfds(pid),
        16,
        "the first 16 large bodies take the whole budget"
    );
    for round in 0..2 {
        let mut conn = RawConn::connect(addr);
        for (i, path) in paths.iter().enumerate() {
            let len = length_of(path);
            for (start, end) in [
                (0, 1),
                (4095, 70_001),
                (len - 30_000, len),
                (len - 65_536, len),
            ] {
                let what = format!("round {round}, {path} bytes={start}-{}", end - 1);
                let before = bytes_read(pid);
                conn.send(ranged(path, &format!("bytes={start}-{}", end - 1)).as_bytes());
                let resp = conn.read_response(false);
                let read = bytes_read(pid) - before;
                assert_part(&resp, path, start, end, &what);
                let part = (end - start) as u64;
                if end - start >= PART_FROM_FILE_MIN {
                    let from_file = read >= part;
                    assert_eq!(
                        from_file,
                        i < 16,
                        "{what}: {read} bytes read for a part of {part}"
                    );
                }
            }
        }
        assert_eq!(fetch(addr, "/small").text(), "small body");
    }
    assert!(memfds(pid) <= 16);
    lacquer.assert_no_panic();
}

/// (2'') Three variants of one URL (`Vary: X-Variant`, each with a memory file and its own
/// bytes), their ranges asked in turn on one connection: each part is of its own variant's bytes,
/// a hit, and the same as the standard path's answer (`If-Range` with that variant's `ETag`).
#[test]
fn a_range_of_a_variant_is_of_that_variant() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let (addr, pid) = (lacquer.addr(), lacquer.pid());
    let path = "/variant/300007";
    let len = length_of(path);
    let variants = ["a", "b", "c"];
    let mut conn = RawConn::connect(addr);
    for variant in variants {
        for _ in 0..2 {
            conn.send(get(path, &format!("X-Variant: {variant}\r\n")).as_bytes());
            let resp = conn.read_response(false);
            assert_eq!(resp.body.len(), len);
            assert_eq!(
                generated_mismatch(&resp.body, variant_seed(path, variant), 0),
                None
            );
        }
    }
    assert_eq!(memfds(pid), 3, "one memory file per variant");
    for (range, start, end) in edge_ranges(len) {
        for variant in variants {
            let what = format!("X-Variant: {variant}, {range}");
            let extra = format!("X-Variant: {variant}\r\nRange: {range}\r\n");
            conn.send(get(path, &extra).as_bytes());
            let fast = conn.read_response(false);
            assert_eq!(fast.status, 206, "{what}");
            assert_eq!(fast.body.len(), end - start, "{what}");
            assert_eq!(
                generated_mismatch(&fast.body, variant_seed(path, variant), start),
                None,
                "{what}: not this variant's bytes"
            );
            let if_range = format!("If-Range: {}\r\n", variant_etag(path, variant));
            conn.send(get(path, &format!("{extra}{if_range}")).as_bytes());
            assert_same_answer(&fast, &conn.read_response(false), &what);
        }
    }
    assert_eq!(origin.hits_for(path), 3);
    lacquer.assert_no_panic();
}

/// (2''') A stored object gone stale (`max-age=1`) asked for a range: the fast path does not
/// serve it (the origin is asked again, the answer is not a hit) and the part is right; the
/// next range of the refreshed object is a hit again.
#[test]
fn a_range_of_a_stale_object_is_not_served_from_it() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let addr = lacquer.addr();
    let path = "/large/100003?ttl=1";
    store(addr, path);
    let mut conn = RawConn::connect(addr);
    conn.send(ranged(path, "bytes=70000-").as_bytes());
    assert_part(&conn.read_response(false), path, 70_000, 100_003, "fresh");
    std::thread::sleep(Duration::from_millis(2100));
    conn.send(ranged(path, "bytes=70000-").as_bytes());
    let stale = conn.read_response(false);
    assert_part_of(&stale, path, 70_000, 100_003, "stale");
    assert!(
        !stale.is_hit(),
        "a stale object served: {:?}",
        stale.headers
    );
    assert_eq!(origin.hits_for(path), 2);
    conn.send(ranged(path, "bytes=-3").as_bytes());
    assert_part(
        &conn.read_response(false),
        path,
        100_000,
        100_003,
        "refreshed",
    );
    lacquer.assert_no_panic();
}

/// One answer over TLS, by `curl` (`http` is `--http1.1` or `--http2`): status, fields (names
/// lowercased) and body.
fn curl(url: &str, http: &str, range: Option<&str>, dir: &std::path::Path) -> RawResponse {
    let (head_file, body_file) = (dir.join("head"), dir.join("body"));
    let mut command = std::process::Command::new("curl");
    command
        .args(["-sk", http, "-D"])
        .arg(&head_file)
        .arg("-o")
        .arg(&body_file);
    if let Some(range) = range {
        command.args(["-H", &format!("Range: {range}")]);
    }
    let out = command.arg(url).output().expect("curl is installed");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let head = std::fs::read_to_string(&head_file).expect("the head curl wrote");
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    RawResponse {
        status,
        version: if status_line.starts_with("HTTP/2") {
            2
        } else {
            1
        },
        reason: String::new(),
        headers,
        body: std::fs::read(&body_file).expect("the body curl wrote"),
    }
}

/// (4g) Ranges over TLS, HTTP/1.1 and h2 (by `curl`), of a body kept in a memory file and of a
/// small one: each a `206` hit of exactly its bytes, the part written from the stored chunks
/// (a TLS stream is never given the file), none read from the file.
#[test]
fn ranges_over_tls_are_byte_exact() {
    let origin = origin();
    let dir = TempDir::new("fast-path-ranges-tls");
    let tls = self_signed_cert(dir.path());
    let tls_port = free_port();
    let upstream = origin.addr();
    let tls_toml = tls.tls_toml(&format!("127.0.0.1:{tls_port}"));
    let lacquer = LacquerProcess::start_on_free_port(|port| config(port, upstream, 2, &tls_toml));
    let pid = lacquer.pid();
    let large = format!("/large/{}", MB1 + 7);
    for path in [large.as_str(), PIECED] {
        let url = format!("https://127.0.0.1:{tls_port}{path}");
        let len = length_of(path);
        for _ in 0..2 {
            let whole = curl(&url, "--http1.1", None, dir.path());
            assert_whole(&whole, path, &url);
        }
        for http in ["--http1.1", "--http2"] {
            for (range, start, end) in [
                ("bytes=0-0".to_string(), 0, 1),
                ("bytes=4095-70000".into(), 4095, 70_001.min(len)),
                (format!("bytes=-{}", len - 1), 1, len),
                (format!("bytes={}-", len / 2), len / 2, len),
            ] {
                let what = format!("{http} {path} {range}");
                let before = bytes_read(pid);
                let resp = curl(&url, http, Some(&range), dir.path());
                let read = bytes_read(pid) - before;
                assert_eq!(
                    resp.version,
                    if http == "--http2" { 2 } else { 1 },
                    "{what}"
                );
                assert_part(&resp, path, start, end, &what);
                let part = (end - start) as u64;
                assert!(
                    part < 4096 || read < part / 2,
                    "{what}: {read} bytes read for a part of {part}: sent from the file over TLS?"
                );
            }
        }
    }
    assert_eq!(origin.hits_for(&large), 1);
    lacquer.assert_no_panic();
}

// Found by this file (2026-12-07), each failing before its fix (see the module doc).

/// A body the origin sent chunked (no `Content-Length`) is framed by its length once stored
/// (`storage::object::framed_by_length`), in memory as in memcached: a whole hit of it carries
/// `Content-Length`, and its ranges are `206`s of the right bytes from the fast path, from the
/// standard path (the matching `If-Range`) and from a node that reads it from memcached, all
/// three the same answer. Before, this node's memory tier sent every hit of it chunked and each
/// range whole (`200`), while the node reading memcached answered `206`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_origin_sent_chunked_is_stored_with_its_length_and_its_ranges_are_parts() {
    let cluster = MemcachedCluster::start(1);
    let origin = origin();
    let a = cluster.node(&origin, "A", "local_ttl = \"1h\"");
    let b = cluster.node(&origin, "B", "local_ttl = \"0s\"");
    let path = "/chunked/50000";
    let a_addr = a.proxy.addr();
    tokio::task::spawn_blocking(move || store(a_addr, path))
        .await
        .unwrap();
    let writes = wait_for_stat(a.admin, "writes", 1, BOUND).await;
    assert_eq!(writes, 1, "A wrote {path} to memcached");
    let b_addr = b.proxy.addr();
    tokio::task::spawn_blocking(move || {
        let mut conn = RawConn::connect(a_addr);
        let mut on_b = RawConn::connect(b_addr);
        conn.send(get(path, "").as_bytes());
        let whole = conn.read_response(false);
        assert_whole(&whole, path, "a whole hit");
        assert!(whole.is_hit(), "{:?}", whole.headers);
        assert_eq!(whole.header("content-length"), Some("50000"));
        assert_eq!(whole.header("transfer-encoding"), None);
        for (range, start, end) in [
            ("bytes=0-99", 0, 100),
            ("bytes=-10", 49_990, 50_000),
            ("bytes=4000-8000", 4000, 8001),
        ] {
            conn.send(ranged(path, range).as_bytes());
            let fast = conn.read_response(false);
            conn.send(ranged_standard(path, range).as_bytes());
            let standard = conn.read_response(false);
            on_b.send(ranged(path, range).as_bytes());
            let from_memcached = on_b.read_response(false);
            assert_part(&fast, path, start, end, &format!("{range}, fast path"));
            assert_part(
                &standard,
                path,
                start,
                end,
                &format!("{range}, standard path"),
            );
            assert_part(&from_memcached, path, start, end, &format!("{range}, B"));
            assert_same_answer(&fast, &standard, &format!("{path} {range}"));
            assert_same_answer(&fast, &from_memcached, &format!("{path} {range}, A vs B"));
        }
    })
    .await
    .unwrap();
    assert_eq!(origin.hits_for(path), 1);
    a.proxy.assert_no_panic();
    b.proxy.assert_no_panic();
}

/// Sends `request` on a new connection to `addr`; its answer, or why there was none.
fn answer_to(addr: SocketAddr, request: &str) -> Result<RawResponse, String> {
    let mut conn = RawConn::connect(addr);
    conn.send(request.as_bytes());
    conn.try_read_response(false)
}

/// RFC 9110 §14.1.1: a suffix range of length zero is not satisfiable; `bytes=-0` (the only
/// range asked) must be answered `416` with `Content-Range: bytes */len` (on the fast path and on
/// the standard path alike).
#[test]
fn a_zero_length_suffix_range_is_unsatisfiable() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    store(lacquer.addr(), PIECED);
    for request in [
        ranged(PIECED, "bytes=-0"),
        ranged_standard(PIECED, "bytes=-0"),
    ] {
        let resp = answer_to(lacquer.addr(), &request).unwrap();
        assert_eq!(resp.status, 416, "{request:?}: {:?}", resp.headers);
        assert_eq!(
            resp.header("content-range"),
            Some(format!("bytes */{PIECED_LEN}").as_str())
        );
    }
    lacquer.assert_no_panic();
}

/// A first byte too large for a machine word.
const HUGE: &str = "99999999999999999999999";

/// RFC 9110 §14.1.1: `bytes=99999999999999999999999-5` names a first byte past the end and a
/// last byte before it, an invalid range: it must be ignored (`200`, the whole body) or refused
/// (`416`), never read as the suffix `-5` (on either path).
#[test]
fn a_first_byte_too_large_for_a_machine_word_is_not_read_as_a_suffix() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    store(lacquer.addr(), PIECED);
    let range = format!("bytes={HUGE}-5");
    for request in [ranged(PIECED, &range), ranged_standard(PIECED, &range)] {
        let resp = answer_to(lacquer.addr(), &request).unwrap();
        assert!(
            resp.status == 200 || resp.status == 416,
            "{request:?}: {} {:?}",
            resp.status,
            resp.header("content-range")
        );
        assert_sound(&resp, PIECED, &range);
    }
    lacquer.assert_no_panic();
}

/// RFC 9110 §14.1.1: a suffix longer than the body is the whole body, however long:
/// `bytes=-99999999999999999999999` is a `206` of all of it, as `bytes=-36392` is.
#[test]
fn a_suffix_longer_than_a_machine_word_is_the_whole_body() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    store(lacquer.addr(), PIECED);
    let range = format!("bytes=-{HUGE}");
    for request in [ranged(PIECED, &range), ranged_standard(PIECED, &range)] {
        let resp = answer_to(lacquer.addr(), &request).unwrap();
        assert_part(&resp, PIECED, 0, PIECED_LEN, &format!("{request:?}"));
    }
    lacquer.assert_no_panic();
}

/// A stored `200` with an empty body, asked for ranges (on the fast path and on the standard
/// path): no range of it is satisfiable (RFC 9110 §14.1.1), so `416` (`bytes */0`), or the whole
/// empty `200` were the field ignored; never a `206`, and never a panic.
#[test]
fn ranges_of_an_empty_body_are_unsatisfiable() {
    let origin = origin();
    let lacquer = proxy(&origin, 2, "");
    let mut conn = RawConn::connect(lacquer.addr());
    for _ in 0..2 {
        conn.send(get("/empty", "").as_bytes());
        let resp = conn.read_response(false);
        assert_eq!((resp.status, resp.body.len()), (200, 0));
    }
    let if_range = format!("If-Range: {}\r\n", etag_of("/empty"));
    for range in ["bytes=0-", "bytes=0-0", "bytes=-5", "bytes=-0"] {
        for extra in ["", if_range.as_str()] {
            let what = format!("/empty {range} {extra:?}");
            let request = get("/empty", &format!("{extra}Range: {range}\r\n"));
            let resp =
                answer_to(lacquer.addr(), &request).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                resp.status == 416 || resp.status == 200,
                "{what}: {} {:?}",
                resp.status,
                resp.headers
            );
            assert!(resp.body.is_empty(), "{what}");
        }
    }
    lacquer.assert_no_panic();
}
