//! An origin that keeps every byte the proxy sent it, for the smuggling and poisoning tests:
//! what the origin received is the evidence, byte for byte, not what a forgiving parser made of
//! it.
//!
//! It frames requests the way a plain origin would: by `Transfer-Encoding: chunked` when the
//! last coding is chunked, else by a `Content-Length` that is exactly one number, else no body.
//! So a `Content-Length: 5, 5` reaching it frames no body, and those five bytes become the start
//! of a second "request" on the connection: the desync such a field causes, seen here as an
//! extra request line. Every request is answered `200` with `Cache-Control: max-age=60` (or what
//! [`CaptureOrigin::start_answering`] says) and the body `origin #N` (N counting requests from 1;
//! HEAD gets the head only); a head it cannot read is answered `400` and the connection closed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the origin framed it, with its bytes exactly as received.
#[derive(Clone, Debug)]
pub struct CapturedRequest {
    /// Which connection (from 0, in accept order) carried it.
    pub conn: usize,
    /// The head, request line to the empty line included, as received.
    pub head: Vec<u8>,
    /// The body bytes as received (chunked framing included).
    pub body: Vec<u8>,
}

impl CapturedRequest {
    /// The request line.
    pub fn request_line(&self) -> String {
        let end = self
            .head
            .windows(2)
            .position(|w| w == b"\r\n")
            .unwrap_or(self.head.len());
        String::from_utf8_lossy(&self.head[..end]).into_owned()
    }

    /// The values of every field line named `name` (case-insensitive), in order, as received.
    pub fn field_values(&self, name: &str) -> Vec<String> {
        field_lines(&self.head)
            .filter_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
            .collect()
    }
}

/// The field lines of a head (request line and final empty line excluded).
fn field_lines(head: &[u8]) -> impl Iterator<Item = String> + '_ {
    head.split(|&b| b == b'\n')
        .skip(1)
        .map(|line| String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line)).into_owned())
        .filter(|line| !line.is_empty())
}

struct Shared {
    requests: Mutex<Vec<CapturedRequest>>,
    raw: Mutex<Vec<Vec<u8>>>,
    served: AtomicUsize,
    /// The `Cache-Control` of every answer.
    cache_control: String,
}

/// A running capture origin; stops accepting when dropped.
pub struct CaptureOrigin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
}

impl CaptureOrigin {
    /// Starts one on `127.0.0.1:<free port>`.
    pub fn start() -> CaptureOrigin {
        Self::start_answering("max-age=60")
    }

    /// Starts one whose answers carry `Cache-Control: {cache_control}` (stale soon, for a
    /// background revalidation).
    pub fn start_answering(cache_control: &str) -> CaptureOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind capture origin");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            raw: Mutex::new(Vec::new()),
            served: AtomicUsize::new(0),
            cache_control: cache_control.to_string(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (state, halt) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let conn = {
                            let mut raw = state.raw.lock().unwrap();
                            raw.push(Vec::new());
                            raw.len() - 1
                        };
                        let state = state.clone();
                        std::thread::spawn(move || serve(stream, conn, &state));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        CaptureOrigin { addr, shared, stop }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request framed so far, in arrival order.
    pub fn requests(&self) -> Vec<CapturedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Every byte received, per connection, in accept order.
    pub fn received(&self) -> Vec<Vec<u8>> {
        self.shared.raw.lock().unwrap().clone()
    }

    /// Everything received on every connection, as text (lossy), for failure messages.
    pub fn received_text(&self) -> String {
        self.received()
            .iter()
            .enumerate()
            .map(|(i, bytes)| format!("[connection {i}] {}", String::from_utf8_lossy(bytes)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for CaptureOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Serves one connection: frame, record, answer, until the proxy closes it or a head is bad.
fn serve(mut stream: TcpStream, conn: usize, shared: &Shared) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut buf = Vec::new();
    loop {
        let Some(head_end) = read_until(&mut stream, &mut buf, conn, shared, |b| {
            b.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
        }) else {
            return;
        };
        let head = buf[..head_end].to_vec();
        let framing = framing_of(&head);
        let body_end = match framing {
            Framing::Unreadable => {
                record(shared, conn, head, Vec::new());
                let _ = stream.write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                return;
            }
            Framing::Length(n) => read_until(&mut stream, &mut buf, conn, shared, |b| {
                (b.len() >= head_end + n).then_some(head_end + n)
            }),
            Framing::Chunked => read_until(&mut stream, &mut buf, conn, shared, |b| {
                chunked_end(&b[head_end..]).map(|n| head_end + n)
            }),
        };
        let Some(body_end) = body_end else {
            record(shared, conn, head, buf[head_end..].to_vec());
            return;
        };
        let head_request = head.starts_with(b"HEAD ");
        record(shared, conn, head, buf[head_end..body_end].to_vec());
        buf.drain(..body_end);
        let n = shared.served.fetch_add(1, Ordering::SeqCst) + 1;
        let body = format!("origin #{n}");
        let answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: {}\r\n\r\n{}",
            body.len(),
            shared.cache_control,
            if head_request { "" } else { body.as_str() }
        );
        if stream.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn record(shared: &Shared, conn: usize, head: Vec<u8>, body: Vec<u8>) {
    shared
        .requests
        .lock()
        .unwrap()
        .push(CapturedRequest { conn, head, body });
}

/// Reads (keeping every byte in `buf` and in the connection's raw record) until `complete`
/// finds an end in `buf`; `None` when the connection ends first.
fn read_until(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    conn: usize,
    shared: &Shared,
    complete: impl Fn(&[u8]) -> Option<usize>,
) -> Option<usize> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = complete(buf) {
            return Some(end);
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                shared.raw.lock().unwrap()[conn].extend_from_slice(&chunk[..n]);
            }
        }
    }
}

enum Framing {
    Length(usize),
    Chunked,
    Unreadable,
}

/// How a plain origin frames a request with this head.
fn framing_of(head: &[u8]) -> Framing {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    if !matches!(req.parse(head), Ok(httparse::Status::Complete(_))) {
        return Framing::Unreadable;
    }
    let value = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    if let Some(te) = value("transfer-encoding") {
        if te.rsplit(',').next().map(str::trim) == Some("chunked") {
            return Framing::Chunked;
        }
    }
    match value("content-length") {
        Some(cl) => Framing::Length(cl.parse().unwrap_or(0)),
        None => Framing::Length(0),
    }
}

/// Where a chunked body starting at `data[0]` ends (trailers and final CRLF included), if all
/// of it is there.
fn chunked_end(data: &[u8]) -> Option<usize> {
    let mut pos = 0;
    loop {
        let eol = data[pos..].windows(2).position(|w| w == b"\r\n")?;
        let line = String::from_utf8_lossy(&data[pos..pos + eol]).into_owned();
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        pos += eol + 2;
        if size == 0 {
            loop {
                let eol = data[pos..].windows(2).position(|w| w == b"\r\n")?;
                pos += eol + 2;
                if eol == 0 {
                    return Some(pos);
                }
            }
        }
        if data.len() < pos + size + 2 {
            return None;
        }
        pos += size + 2;
    }
}
