//! A raw HTTP/1.x client over a bare TCP socket, for what a well-behaved client library would not
//! send or would hide: malformed requests, pipelining, keep-alive reuse, and the exact framing
//! (`Content-Length` or chunked) of each response.

use crate::fields::{field, field_values, has_token, owned_fields};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

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
    /// Whether the last `Cache-Status` entry says `hit`: the check every raw-socket test of
    /// hits wrote out for itself.
    pub fn is_hit(&self) -> bool {
        self.header_all("cache-status")
            .last()
            .is_some_and(|entry| entry.split(';').skip(1).any(|p| p.trim() == "hit"))
    }

    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        field(&self.headers, name)
    }

    /// All values of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        field_values(&self.headers, name)
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
    let headers = owned_fields(r.headers);
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
    let chunked = has_token(&resp.headers, "transfer-encoding", "chunked");
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

/// Parses every consecutive complete response in `data`, interim 1xx responses included, in the
/// order they arrived (for tests of `103 Early Hints` and `102 Processing`).
pub fn parse_responses_with_interim(data: &[u8], head_request: bool) -> Vec<RawResponse> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        match parse_one(&data[pos..], head_request, true) {
            Parsed::Complete(r, n) => {
                pos += n;
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
