//! Small HTTP client helpers for tests: async `reqwest` wrappers that never decompress
//! or follow redirects, raw-socket helpers for malformed-request and keep-alive tests,
//! and gzip helpers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::HeaderMap;

/// Per-request timeout of the clients built here.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A fully read response.
#[derive(Clone, Debug)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body, exactly as received (never decompressed).
    pub body: Bytes,
    /// HTTP version the response came over.
    pub version: reqwest::Version,
}

impl Resp {
    /// First value of header `name` (case-insensitive), lossily as UTF-8.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    }

    /// All values of header `name`, in order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// Whether header `name` is present.
    pub fn has_header(&self, name: &str) -> bool {
        self.headers.contains_key(name)
    }

    /// The `Age` header as a number.
    pub fn age(&self) -> Option<u64> {
        self.header("age").and_then(|v| v.trim().parse().ok())
    }

    /// The `Content-Length` header as a number.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }

    /// The raw `Cache-Status` header (RFC 9211), all values joined with `", "`;
    /// falls back to `X-Cache` if there is no `Cache-Status`.
    pub fn cache_status(&self) -> Option<String> {
        let all = self.header_all("cache-status");
        if !all.is_empty() {
            return Some(all.join(", "));
        }
        self.header("x-cache")
    }

    /// A parameter of the last (closest to the client) `Cache-Status` entry:
    /// `Some("")` for a bare flag like `hit` or `stored`, `Some(value)` for `key=value`
    /// (quotes removed), `None` if absent. E.g. `cache_status_param("fwd")` → `"miss"`.
    pub fn cache_status_param(&self, name: &str) -> Option<String> {
        let cs = self.cache_status()?;
        let last = cs.rsplit(',').next()?.trim().to_string();
        last.split(';').skip(1).find_map(|p| {
            let p = p.trim();
            let (k, v) = match p.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim().trim_matches('"')),
                None => (p, ""),
            };
            k.eq_ignore_ascii_case(name).then(|| v.to_string())
        })
    }

    /// Whether the last `Cache-Status` entry says `hit` (or `X-Cache` starts with `HIT`).
    pub fn is_hit(&self) -> bool {
        if self.headers.contains_key("cache-status") {
            return self.cache_status_param("hit").is_some();
        }
        self.header("x-cache")
            .map(|v| v.trim().to_ascii_uppercase().starts_with("HIT"))
            .unwrap_or(false)
    }

    /// The `fwd` parameter of the last `Cache-Status` entry (`miss`, `stale`, `uri-miss`, ...).
    pub fn cache_fwd(&self) -> Option<String> {
        self.cache_status_param("fwd")
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client builder with the test defaults: no redirects followed, no proxy from the
/// environment, no automatic decompression (no such features are compiled in), and a
/// 30 s timeout. HTTP/1.1 for `http://` URLs.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(CLIENT_TIMEOUT)
}

/// A fresh HTTP/1.1 client from [`client_builder`]. Reuse one client across requests
/// to reuse connections; create it inside the runtime that will use it.
pub fn http_client() -> reqwest::Client {
    client_builder().build().expect("build reqwest client")
}

/// A fresh client that speaks HTTP/2 with prior knowledge (h2c) to `http://` URLs.
pub fn h2c_client() -> reqwest::Client {
    client_builder()
        .http2_prior_knowledge()
        .build()
        .expect("build h2c reqwest client")
}

/// Sends one request with `client` and reads the whole response.
/// `headers` are added in order (repeated names give repeated fields).
pub async fn send(
    client: &reqwest::Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Result<Resp, reqwest::Error> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("valid method");
    let mut rb = client.request(method, url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb.body(b);
    }
    let r = rb.send().await?;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let version = r.version();
    let body = r.bytes().await?;
    Ok(Resp {
        status,
        headers,
        body,
        version,
    })
}

/// `GET url` with the given extra headers on a fresh client; panics on transport errors.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Resp {
    request("GET", url, headers, None).await
}

/// Like [`get`] but returns transport errors (connection refused/reset, timeout, ...).
pub async fn try_get(url: &str, headers: &[(&str, &str)]) -> Result<Resp, reqwest::Error> {
    send(&http_client(), "GET", url, headers, None).await
}

/// `HEAD url` on a fresh client; panics on transport errors.
pub async fn head(url: &str, headers: &[(&str, &str)]) -> Resp {
    request("HEAD", url, headers, None).await
}

/// `POST url` with `body` on a fresh client; panics on transport errors.
pub async fn post(url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Resp {
    request("POST", url, headers, Some(body.into())).await
}

/// Any method on a fresh client; panics on transport errors.
pub async fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Resp {
    match send(&http_client(), method, url, headers, body).await {
        Ok(r) => r,
        Err(e) => panic!("{method} {url} failed: {e:?}"),
    }
}

// ---------------------------------------------------------------------------
// gzip
// ---------------------------------------------------------------------------

/// gzip-compresses `data`.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).expect("gzip write");
    enc.finish().expect("gzip finish")
}

/// Decompresses gzip `data`; panics if it is not valid gzip.
pub fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid gzip data");
    out
}

// ---------------------------------------------------------------------------
// Raw sockets
// ---------------------------------------------------------------------------

/// Writes `bytes` to a new connection to `addr` and returns everything read until the
/// server closes the connection or stays silent for 2 s (30 s overall cap).
/// Write errors (e.g. the server resetting early) are ignored; what was read is returned.
pub fn raw_request(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let _ = s.set_nodelay(true);
    let _ = s.write_all(bytes);
    let _ = s.flush();
    read_until_quiet(&mut s, Duration::from_secs(2), Duration::from_secs(30))
}

fn read_until_quiet(s: &mut TcpStream, silence: Duration, cap: Duration) -> Vec<u8> {
    let _ = s.set_read_timeout(Some(silence));
    let deadline = Instant::now() + cap;
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break, // timeout (silence) or reset
        }
    }
    out
}

/// The status code of the first response in raw bytes (`"HTTP/1.1 400 ..."` → 400).
pub fn raw_status(data: &[u8]) -> Option<u16> {
    let line = data.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.split_whitespace();
    let proto = parts.next()?;
    if !proto.starts_with("HTTP/") {
        return None;
    }
    parts.next()?.parse().ok()
}

/// One parsed HTTP/1.x response from a raw socket.
#[derive(Clone, Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Minor version (`1` for HTTP/1.1).
    pub version: u8,
    /// Reason phrase.
    pub reason: String,
    /// Header fields in order, as received.
    pub headers: Vec<(String, String)>,
    /// The body with transfer coding removed (chunks joined).
    pub body: Vec<u8>,
}

impl RawResponse {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

enum Parsed {
    Complete(RawResponse, usize),
    Partial,
    Error(String),
}

/// Parses one response at the start of `data`. `eof` means no more data will come
/// (which completes a close-delimited body).
fn parse_one(data: &[u8], head_request: bool, eof: bool) -> Parsed {
    let mut hdrs = [httparse::EMPTY_HEADER; 256];
    let mut r = httparse::Response::new(&mut hdrs);
    let n = match r.parse(data) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if eof => {
            return Parsed::Error(format!(
                "connection closed inside a response head ({} bytes)",
                data.len()
            ))
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(e) => return Parsed::Error(format!("invalid response head: {e}")),
    };
    let status = r.code.unwrap_or(0);
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let mut resp = RawResponse {
        status,
        version: r.version.unwrap_or(1),
        reason: r.reason.unwrap_or("").to_string(),
        headers,
        body: Vec::new(),
    };
    if head_request || (100..200).contains(&status) || status == 204 || status == 304 {
        return Parsed::Complete(resp, n);
    }
    let chunked = resp
        .header_all("transfer-encoding")
        .iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("chunked"));
    if chunked {
        let mut pos = n;
        loop {
            let Some(eol) = find_crlf(&data[pos..]) else {
                return partial_or_eof(eof, "inside a chunk size line");
            };
            let line = String::from_utf8_lossy(&data[pos..pos + eol]).into_owned();
            let size_str = line.split(';').next().unwrap_or("").trim().to_string();
            let Ok(size) = usize::from_str_radix(&size_str, 16) else {
                return Parsed::Error(format!("bad chunk size line {line:?}"));
            };
            pos += eol + 2;
            if size == 0 {
                loop {
                    let Some(eol) = find_crlf(&data[pos..]) else {
                        return partial_or_eof(eof, "inside the trailer section");
                    };
                    pos += eol + 2;
                    if eol == 0 {
                        return Parsed::Complete(resp, pos);
                    }
                }
            }
            if data.len() < pos + size + 2 {
                return partial_or_eof(eof, "inside a chunk");
            }
            resp.body.extend_from_slice(&data[pos..pos + size]);
            if &data[pos + size..pos + size + 2] != b"\r\n" {
                return Parsed::Error("missing CRLF after chunk data".into());
            }
            pos += size + 2;
        }
    }
    if let Some(cl) = resp.header("content-length") {
        let Ok(len) = cl.trim().parse::<usize>() else {
            return Parsed::Error(format!("bad content-length {cl:?}"));
        };
        if data.len() < n + len {
            if eof {
                return Parsed::Error(format!(
                    "connection closed after {} of {len} body bytes",
                    data.len() - n
                ));
            }
            return Parsed::Partial;
        }
        resp.body = data[n..n + len].to_vec();
        return Parsed::Complete(resp, n + len);
    }
    // Close-delimited.
    if eof {
        resp.body = data[n..].to_vec();
        Parsed::Complete(resp, data.len())
    } else {
        Parsed::Partial
    }
}

fn partial_or_eof(eof: bool, where_: &str) -> Parsed {
    if eof {
        Parsed::Error(format!("connection closed {where_}"))
    } else {
        Parsed::Partial
    }
}

fn find_crlf(data: &[u8]) -> Option<usize> {
    data.windows(2).position(|w| w == b"\r\n")
}

/// Parses the first complete response in `data` (e.g. the output of [`raw_request`]),
/// treating the end of `data` as the end of the connection. Interim 1xx responses
/// (except 101) are skipped. `head_request`: the response answers a HEAD (no body).
pub fn parse_response(data: &[u8], head_request: bool) -> Option<RawResponse> {
    parse_responses(data, head_request).into_iter().next()
}

/// Parses all consecutive complete responses in `data` (pipelining tests); stops at the
/// first incomplete or malformed one. Interim 1xx responses (except 101) are skipped.
pub fn parse_responses(data: &[u8], head_request: bool) -> Vec<RawResponse> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        match parse_one(&data[pos..], head_request, true) {
            Parsed::Complete(r, n) => {
                pos += n;
                if (100..200).contains(&r.status) && r.status != 101 {
                    continue;
                }
                out.push(r);
            }
            _ => break,
        }
    }
    out
}

/// A raw, persistent HTTP/1.x client connection for keep-alive and pipelining tests.
pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
    /// How long a read may stay silent before [`RawConn::try_read_response`] gives up.
    pub read_timeout: Duration,
}

impl RawConn {
    /// Connects to `addr` (panics on failure).
    pub fn connect(addr: SocketAddr) -> RawConn {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        let _ = stream.set_nodelay(true);
        RawConn {
            stream,
            buf: Vec::new(),
            eof: false,
            read_timeout: Duration::from_secs(10),
        }
    }

    /// Writes raw bytes (panics on failure).
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .expect("write to raw connection");
        let _ = self.stream.flush();
    }

    /// Writes raw bytes, returning any error (e.g. the peer already closed).
    pub fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Sends `GET path HTTP/1.1` with `Host: test` plus `headers` and reads the response.
    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> RawResponse {
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: test\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.send(req.as_bytes());
        self.read_response(false)
    }

    /// Reads the next complete response (skipping 1xx except 101); panics on EOF,
    /// timeout or a malformed response. `head_request`: it answers a HEAD.
    pub fn read_response(&mut self, head_request: bool) -> RawResponse {
        match self.try_read_response(head_request) {
            Ok(r) => r,
            Err(e) => panic!("reading response: {e}"),
        }
    }

    /// Reads the next complete response, or explains why it could not.
    pub fn try_read_response(&mut self, head_request: bool) -> Result<RawResponse, String> {
        loop {
            match parse_one(&self.buf, head_request, self.eof) {
                Parsed::Complete(r, n) => {
                    self.buf.drain(..n);
                    if (100..200).contains(&r.status) && r.status != 101 {
                        continue;
                    }
                    return Ok(r);
                }
                Parsed::Error(e) => return Err(e),
                Parsed::Partial if self.eof => {
                    return Err("connection closed before a response".into())
                }
                Parsed::Partial => {}
            }
            if self.buf.is_empty() && self.eof {
                return Err("connection closed".into());
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> Result<(), String> {
        let _ = self.stream.set_read_timeout(Some(self.read_timeout));
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(());
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return Err(format!("no data for {:?}", self.read_timeout));
                }
                Err(e) => {
                    // Treat resets like a close so buffered data can still be parsed.
                    self.eof = true;
                    if self.buf.is_empty() {
                        return Err(format!("read error: {e}"));
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Whether the peer has closed the connection: waits up to `wait` for EOF/reset.
    /// Data arriving instead is kept for the next read and counts as "not closed".
    pub fn is_closed(&mut self, wait: Duration) -> bool {
        if self.eof {
            return true;
        }
        let _ = self.stream.set_read_timeout(Some(wait));
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) => {
                self.eof = true;
                true
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                false
            }
            Err(_) => {
                self.eof = true;
                true
            }
        }
    }

    /// Everything still unread plus whatever arrives until close or 2 s of silence.
    pub fn read_rest(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.buf);
        if !self.eof {
            out.extend(read_until_quiet(
                &mut self.stream,
                Duration::from_secs(2),
                Duration::from_secs(30),
            ));
            self.eof = true;
        }
        out
    }

    /// The underlying stream (e.g. to half-close with `shutdown(Write)`).
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }
}
