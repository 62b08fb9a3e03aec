//! A real, scriptable HTTP/1.1 origin server for integration tests.
//!
//! [`TestOrigin::start`] binds `127.0.0.1:0` and serves every request by calling a
//! synchronous handler closure on its own background thread (with its own tokio
//! runtime), so it works the same from `#[test]` and `#[tokio::test]` functions.
//! Every request is recorded ([`RecordedRequest`]) so tests can count origin hits
//! and inspect exactly what the proxy forwarded.
//!
//! ```ignore
//! let origin = TestOrigin::start(|req: &RecordedRequest| {
//!     OriginResponse::ok(format!("hello {}", req.path)).header("Cache-Control", "max-age=60")
//! });
//! // ... point the proxy at origin.addr(), make requests ...
//! assert_eq!(origin.hits_for("/a"), 1);
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Size of the pieces a [`Body::Generated`] body is written in.
pub const GENERATED_CHUNK: usize = 64 * 1024;

/// Largest request head the origin accepts before answering 431 and closing.
const MAX_HEAD: usize = 1024 * 1024;

/// One request as the origin received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Request method, e.g. `"GET"`.
    pub method: String,
    /// Request target exactly as sent: path plus query, e.g. `"/a?b=1"`.
    pub path: String,
    /// Header fields in the order received, names and values as sent.
    pub headers: Vec<(String, String)>,
    /// The request body, de-chunked if it was sent chunked.
    pub body: Bytes,
    /// HTTP/1 minor version of the request line (`1` for HTTP/1.1, `0` for HTTP/1.0).
    pub version: u8,
    /// Sequence number (from 0) of the TCP connection that carried this request.
    pub conn_id: usize,
}

impl RecordedRequest {
    /// First value of header `name` (case-insensitive), if present.
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

    /// Whether header `name` (case-insensitive) is present.
    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    /// The path without the query string.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or("")
    }

    /// The query string (without `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.path.split_once('?').map(|(_, q)| q)
    }
}

/// A response body the origin can send.
#[derive(Clone, Debug, Default)]
pub enum Body {
    /// No body (`Content-Length: 0` unless the status forbids a body).
    #[default]
    Empty,
    /// A fixed body sent with `Content-Length` (unless the handler set its own framing,
    /// in which case these bytes are written verbatim).
    Bytes(Bytes),
    /// `len` bytes of deterministic content (see [`generated_bytes`]) streamed in
    /// 64 KiB pieces without ever being held in memory whole.
    Generated {
        /// Total body length in bytes.
        len: usize,
        /// Selects the content; different seeds give different bytes.
        seed: u8,
    },
    /// Sent with `Transfer-Encoding: chunked`, one HTTP chunk per element
    /// (empty elements are skipped: they would end the body).
    Chunked(Vec<Bytes>),
    /// Like [`Body::Chunked`], but the origin pauses `interval` before each chunk after
    /// the first, so the body trickles out (for streaming / coalescing tests).
    Paced {
        /// The chunks, each sent as one HTTP chunk.
        chunks: Vec<Bytes>,
        /// Pause before every chunk except the first, and before the terminating chunk.
        interval: Duration,
    },
    /// Advertises `Content-Length: declared_len` but sends only `data` and then closes
    /// the connection: a broken origin, for error-handling tests.
    Truncated {
        /// The Content-Length announced.
        declared_len: usize,
        /// What is actually sent before the connection is closed.
        data: Bytes,
    },
    /// No `Content-Length` and no chunking: the body ends when the origin closes
    /// the connection (HTTP/1.0-style close-delimited framing).
    CloseDelimited(Bytes),
}

impl Body {
    /// The number of body bytes that will be sent on the wire (before chunk framing).
    pub fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::Bytes(b) | Body::CloseDelimited(b) => b.len(),
            Body::Generated { len, .. } => *len,
            Body::Chunked(c) | Body::Paced { chunks: c, .. } => c.iter().map(|b| b.len()).sum(),
            Body::Truncated { data, .. } => data.len(),
        }
    }

    /// Whether [`Body::len`] is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body::Bytes(b)
    }
}

impl From<Vec<u8>> for Body {
    fn from(b: Vec<u8>) -> Self {
        Body::Bytes(Bytes::from(b))
    }
}

impl From<&[u8]> for Body {
    fn from(b: &[u8]) -> Self {
        Body::Bytes(Bytes::copy_from_slice(b))
    }
}

impl From<String> for Body {
    fn from(s: String) -> Self {
        Body::Bytes(Bytes::from(s))
    }
}

impl From<&str> for Body {
    fn from(s: &str) -> Self {
        Body::Bytes(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<&String> for Body {
    fn from(s: &String) -> Self {
        Body::from(s.as_str())
    }
}

/// What the origin answers to one request. Build with [`OriginResponse::ok`] /
/// [`OriginResponse::new`] and the chained helpers.
///
/// Framing rules: unless the handler set `Content-Length` or `Transfer-Encoding`
/// itself, the origin adds `Content-Length` for `Empty`/`Bytes`/`Generated`/`Truncated`
/// bodies and `Transfer-Encoding: chunked` for `Chunked`/`Paced` ones. No body (but the
/// same headers) is sent for `HEAD` requests and for 1xx/204/304 statuses. A `Date`
/// header is added if the handler didn't set one.
#[derive(Clone, Debug)]
pub struct OriginResponse {
    /// Status code.
    pub status: u16,
    /// Header fields, sent in this order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Body,
    /// Wait this long before sending the response head.
    pub delay: Option<Duration>,
}

impl OriginResponse {
    /// A response with status `status`, no headers and an empty body.
    pub fn new(status: u16) -> Self {
        OriginResponse {
            status,
            headers: Vec::new(),
            body: Body::Empty,
            delay: None,
        }
    }

    /// A `200 OK` response with the given body (`&str`, `String`, `Vec<u8>`, `Bytes` or a [`Body`]).
    pub fn ok(body: impl Into<Body>) -> Self {
        OriginResponse::new(200).body(body)
    }

    /// A `200 OK` response with a [`Body::Generated`] body of `len` bytes.
    pub fn generated(len: usize, seed: u8) -> Self {
        OriginResponse::ok(Body::Generated { len, seed })
    }

    /// A `200 OK` response with a [`Body::Chunked`] body.
    pub fn chunked<I, B>(chunks: I) -> Self
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        OriginResponse::ok(Body::Chunked(chunks.into_iter().map(Into::into).collect()))
    }

    /// Sets the status code.
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// Appends a header field (repeat the call for repeated fields).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Replaces the body.
    pub fn body(mut self, body: impl Into<Body>) -> Self {
        self.body = body.into();
        self
    }

    /// Delays the response head by `d`.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }

    /// First value of header `name` (case-insensitive) set so far, if any.
    pub fn get_header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A handler answering every request with `200`, `Cache-Control: <cache_control>`
/// (omitted if empty), `Content-Type: text/plain` and the given body.
pub fn static_handler(
    cache_control: &str,
    body: &str,
) -> impl Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static {
    let cc = cache_control.to_string();
    let body = Bytes::copy_from_slice(body.as_bytes());
    move |_req: &RecordedRequest| {
        let mut r = OriginResponse::ok(body.clone()).header("Content-Type", "text/plain");
        if !cc.is_empty() {
            r = r.header("Cache-Control", cc.clone());
        }
        r
    }
}

/// A handler answering every request with `200`, `Cache-Control: <cache_control>`
/// (omitted if empty) and a body naming the request: `"<METHOD> <path> #<n>"`, where
/// `n` counts the handler's calls from 1. Handy to tell a cached copy from a fresh one.
pub fn echo_handler(
    cache_control: &str,
) -> impl Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static {
    let cc = cache_control.to_string();
    let n = AtomicUsize::new(0);
    move |req: &RecordedRequest| {
        let i = n.fetch_add(1, Ordering::SeqCst) + 1;
        let mut r = OriginResponse::ok(format!("{} {} #{}", req.method, req.path, i))
            .header("Content-Type", "text/plain");
        if !cc.is_empty() {
            r = r.header("Cache-Control", cc.clone());
        }
        r
    }
}

type Handler = dyn Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static;

struct Shared {
    handler: Box<Handler>,
    requests: Mutex<Vec<RecordedRequest>>,
    connections: AtomicUsize,
    open_connections: AtomicUsize,
}

/// A running origin server; stops (closes its listener and all connections, ends its
/// thread) when dropped.
pub struct TestOrigin {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestOrigin {
    /// Starts an origin on `127.0.0.1:<free port>` answering every request with `handler`.
    ///
    /// The handler runs on a blocking-capable thread, so it may block briefly, but
    /// prefer [`OriginResponse::delay`] for slow responses.
    pub fn start<F>(handler: F) -> TestOrigin
    where
        F: Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            handler: Box::new(handler),
            requests: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            open_connections: AtomicUsize::new(0),
        });
        let (addr_tx, addr_rx) = std::sync::mpsc::channel::<std::io::Result<SocketAddr>>();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("test-origin".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("test-origin-worker")
                    .enable_all()
                    .build()
                    .expect("build origin runtime");
                rt.block_on(accept_loop(thread_shared, addr_tx, shutdown_rx));
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .expect("spawn origin thread");
        let addr = match addr_rx.recv() {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => panic!("test origin failed to bind 127.0.0.1:0: {e}"),
            Err(_) => panic!("test origin thread died before binding"),
        };
        TestOrigin {
            addr,
            shared,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    /// The listening address (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `"127.0.0.1:<port>"`, the form used for `upstream = ...` in the proxy config.
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:<port><path>` for talking to the origin directly
    /// (a missing leading `/` on `path` is added).
    pub fn url(&self, path: &str) -> String {
        let sep = if path.starts_with('/') { "" } else { "/" };
        format!("http://{}{}{}", self.addr, sep, path)
    }

    /// Total number of requests received since start or the last [`reset_counts`](Self::reset_counts).
    /// A request counts as soon as its head and body have been read (before any delay).
    pub fn hits(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }

    /// Number of requests whose target (path plus query) equals `path` exactly.
    pub fn hits_for(&self, path: &str) -> usize {
        self.shared
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    /// All requests received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// All requests whose target equals `path` exactly, in arrival order.
    pub fn requests_for(&self, path: &str) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// The most recent request, if any.
    pub fn last_request(&self) -> Option<RecordedRequest> {
        self.shared.requests.lock().unwrap().last().cloned()
    }

    /// Forgets all recorded requests (hit counts restart from zero).
    pub fn reset_counts(&self) {
        self.shared.requests.lock().unwrap().clear();
    }

    /// Total number of TCP connections accepted since start (not reset by `reset_counts`).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Number of TCP connections currently open.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections.load(Ordering::SeqCst)
    }

    /// Blocks (polling) until [`hits`](Self::hits) reaches `n` or `timeout` passes;
    /// returns whether it was reached. For background fetches (revalidation, prefetch).
    pub fn wait_for_hits(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.hits() >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Blocks (polling) until [`hits_for(path)`](Self::hits_for) reaches `n` or `timeout`
    /// passes; returns whether it was reached.
    pub fn wait_for_hits_for(&self, path: &str, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.hits_for(path) >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Async version of [`wait_for_hits`](Self::wait_for_hits) for `#[tokio::test]`s
    /// (does not block the test's runtime).
    pub async fn wait_for_hits_async(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.hits() >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Async version of [`wait_for_hits_for`](Self::wait_for_hits_for) for `#[tokio::test]`s
    /// (does not block the test's runtime).
    pub async fn wait_for_hits_for_async(&self, path: &str, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.hits_for(path) >= n {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for TestOrigin {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    addr_tx: std::sync::mpsc::Sender<std::io::Result<SocketAddr>>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let bound = (|| {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let listener = socket.listen(1024)?;
        let addr = listener.local_addr()?;
        Ok((listener, addr))
    })();
    let listener = match bound {
        Ok((l, addr)) => {
            let _ = addr_tx.send(Ok(addr));
            l
        }
        Err(e) => {
            let _ = addr_tx.send(Err(e));
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            res = listener.accept() => match res {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let id = shared.connections.fetch_add(1, Ordering::SeqCst);
                    shared.open_connections.fetch_add(1, Ordering::SeqCst);
                    let s = shared.clone();
                    tokio::spawn(async move {
                        let _guard = OpenGuard(s.clone());
                        serve_conn(stream, s, id).await;
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }
}

struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

enum ReadError {
    /// Connection closed cleanly between requests.
    Closed,
    /// Socket error or EOF mid-request: just drop the connection.
    Io,
    /// Malformed request: answer with this status and close.
    Bad(u16, String),
}

async fn serve_conn(mut stream: TcpStream, shared: Arc<Shared>, conn_id: usize) {
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        let req = match read_request(&mut stream, &mut buf, conn_id).await {
            Ok(r) => r,
            Err(ReadError::Closed) | Err(ReadError::Io) => return,
            Err(ReadError::Bad(status, msg)) => {
                let resp = OriginResponse::new(status)
                    .header("Connection", "close")
                    .body(format!("bad request: {msg}\n"));
                let _ = write_response(&mut stream, "GET", resp, true).await;
                let _ = stream.shutdown().await;
                return;
            }
        };
        shared.requests.lock().unwrap().push(req.clone());

        let req_close = wants_close(&req);
        let method = req.method.clone();
        let handler_shared = shared.clone();
        let resp = match tokio::task::spawn_blocking(move || (handler_shared.handler)(&req)).await {
            Ok(r) => r,
            Err(e) => OriginResponse::new(500)
                .header("Content-Type", "text/plain")
                .body(format!("test origin handler panicked: {e}\n")),
        };
        match write_response(&mut stream, &method, resp, req_close).await {
            Ok(true) => continue,
            Ok(false) | Err(_) => {
                let _ = stream.shutdown().await;
                return;
            }
        }
    }
}

fn wants_close(req: &RecordedRequest) -> bool {
    let conn_tokens: Vec<String> = req
        .header_all("connection")
        .iter()
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    if conn_tokens.iter().any(|t| t == "close") {
        return true;
    }
    req.version == 0 && !conn_tokens.iter().any(|t| t == "keep-alive")
}

async fn read_more(stream: &mut TcpStream, buf: &mut BytesMut) -> Result<(), ReadError> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(16 * 1024);
    }
    match stream.read_buf(buf).await {
        Ok(0) | Err(_) => Err(ReadError::Io),
        Ok(_) => Ok(()),
    }
}

async fn read_request(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    conn_id: usize,
) -> Result<RecordedRequest, ReadError> {
    // --- head ---
    let (method, path, version, headers) = loop {
        // Tolerate stray CRLFs between pipelined requests.
        while buf.starts_with(b"\r\n") {
            buf.advance(2);
        }
        if !buf.is_empty() {
            let mut hdrs = [httparse::EMPTY_HEADER; 256];
            let mut req = httparse::Request::new(&mut hdrs);
            match req.parse(buf) {
                Ok(httparse::Status::Complete(n)) => {
                    let method = req.method.unwrap_or("").to_string();
                    let path = req.path.unwrap_or("").to_string();
                    let version = req.version.unwrap_or(1);
                    let headers: Vec<(String, String)> = req
                        .headers
                        .iter()
                        .map(|h| {
                            (
                                h.name.to_string(),
                                String::from_utf8_lossy(h.value).into_owned(),
                            )
                        })
                        .collect();
                    buf.advance(n);
                    break (method, path, version, headers);
                }
                Ok(httparse::Status::Partial) => {
                    if buf.len() > MAX_HEAD {
                        return Err(ReadError::Bad(431, "request head too large".into()));
                    }
                }
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(ReadError::Bad(431, "too many headers".into()));
                }
                Err(e) => return Err(ReadError::Bad(400, e.to_string())),
            }
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match stream.read_buf(buf).await {
            Ok(0) if buf.is_empty() => return Err(ReadError::Closed),
            Ok(0) | Err(_) => return Err(ReadError::Io),
            Ok(_) => {}
        }
    };

    let find = |name: &str| {
        headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect::<Vec<_>>()
    };
    let te = find("transfer-encoding");
    let chunked = te
        .last()
        .and_then(|v| v.rsplit(',').next())
        .map(|c| c.trim().eq_ignore_ascii_case("chunked"))
        .unwrap_or(false);
    if !te.is_empty() && !chunked {
        return Err(ReadError::Bad(400, "unsupported transfer-encoding".into()));
    }
    let cl = find("content-length");
    let content_length = if chunked {
        None
    } else if let Some(v) = cl.first() {
        if cl.iter().any(|x| x != v) {
            return Err(ReadError::Bad(400, "conflicting content-length".into()));
        }
        match v.parse::<usize>() {
            Ok(n) => Some(n),
            Err(_) => return Err(ReadError::Bad(400, "invalid content-length".into())),
        }
    } else {
        None
    };

    let expects_body = chunked || content_length.unwrap_or(0) > 0;
    let expect_continue = find("expect")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_body && expect_continue && buf.is_empty() {
        let sent = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
        sent.map_err(|_| ReadError::Io)?;
    }

    // --- body ---
    let body = if chunked {
        read_chunked_body(stream, buf).await?
    } else if let Some(n) = content_length {
        while buf.len() < n {
            read_more(stream, buf).await?;
        }
        buf.split_to(n).freeze()
    } else {
        Bytes::new()
    };

    Ok(RecordedRequest {
        method,
        path,
        headers,
        body,
        version,
        conn_id,
    })
}

async fn read_line(stream: &mut TcpStream, buf: &mut BytesMut) -> Result<String, ReadError> {
    loop {
        if let Some(pos) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = buf.split_to(pos + 2);
            return Ok(String::from_utf8_lossy(&line[..pos]).into_owned());
        }
        if buf.len() > 64 * 1024 {
            return Err(ReadError::Bad(400, "chunk line too long".into()));
        }
        read_more(stream, buf).await?;
    }
}

async fn read_chunked_body(stream: &mut TcpStream, buf: &mut BytesMut) -> Result<Bytes, ReadError> {
    let mut body = BytesMut::new();
    loop {
        let line = read_line(stream, buf).await?;
        let size_str = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_str, 16)
            .map_err(|_| ReadError::Bad(400, format!("bad chunk size {size_str:?}")))?;
        if size == 0 {
            // Trailer section, ended by an empty line.
            loop {
                if read_line(stream, buf).await?.is_empty() {
                    return Ok(body.freeze());
                }
            }
        }
        while buf.len() < size + 2 {
            read_more(stream, buf).await?;
        }
        body.extend_from_slice(&buf[..size]);
        if &buf[size..size + 2] != b"\r\n" {
            return Err(ReadError::Bad(400, "missing CRLF after chunk".into()));
        }
        buf.advance(size + 2);
    }
}

fn has_token(headers: &[(String, String)], name: &str, token: &str) -> bool {
    headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .flat_map(|(_, v)| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

fn has_header(headers: &[(String, String)], name: &str) -> bool {
    headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
}

/// Writes one response. Returns `Ok(true)` if the connection may be reused.
async fn write_response(
    stream: &mut TcpStream,
    method: &str,
    resp: OriginResponse,
    req_close: bool,
) -> std::io::Result<bool> {
    let OriginResponse {
        status,
        mut headers,
        body,
        delay,
    } = resp;
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let is_head = method.eq_ignore_ascii_case("HEAD");
    let bodiless_status = status < 200 || status == 204 || status == 304;
    let send_body = !is_head && !bodiless_status;

    if !has_header(&headers, "date") {
        headers.push(("Date".into(), http_date(SystemTime::now())));
    }
    let own_framing =
        has_header(&headers, "content-length") || has_header(&headers, "transfer-encoding");
    let mut close = req_close || has_token(&headers, "connection", "close");
    if !(own_framing || status < 200 || status == 204) {
        match &body {
            Body::Empty | Body::Bytes(_) | Body::Generated { .. } if status != 304 => {
                headers.push(("Content-Length".into(), body.len().to_string()));
            }
            Body::Truncated { declared_len, .. } => {
                headers.push(("Content-Length".into(), declared_len.to_string()));
            }
            Body::Chunked(_) | Body::Paced { .. } if status != 304 => {
                headers.push(("Transfer-Encoding".into(), "chunked".into()));
            }
            _ => {}
        }
    }
    if matches!(body, Body::CloseDelimited(_) | Body::Truncated { .. }) && send_body {
        close = true;
    }
    if close && !has_token(&headers, "connection", "close") {
        headers.push(("Connection".into(), "close".into()));
    }
    let chunk_encode = has_token(&headers, "transfer-encoding", "chunked");

    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unknown");
    let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
    for (k, v) in &headers {
        head.push_str(k);
        head.push_str(": ");
        head.push_str(v);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();

    if !send_body {
        stream.write_all(&out).await?;
        stream.flush().await?;
        return Ok(!close);
    }

    match body {
        Body::Empty => stream.write_all(&out).await?,
        Body::Bytes(b) | Body::CloseDelimited(b) | Body::Truncated { data: b, .. } => {
            out.extend_from_slice(&b);
            stream.write_all(&out).await?;
        }
        Body::Generated { len, seed } => {
            stream.write_all(&out).await?;
            let mut piece = vec![0u8; GENERATED_CHUNK];
            let mut offset = 0;
            while offset < len {
                let n = GENERATED_CHUNK.min(len - offset);
                fill_generated(&mut piece[..n], offset, seed);
                if chunk_encode {
                    stream.write_all(format!("{n:x}\r\n").as_bytes()).await?;
                    stream.write_all(&piece[..n]).await?;
                    stream.write_all(b"\r\n").await?;
                } else {
                    stream.write_all(&piece[..n]).await?;
                }
                offset += n;
            }
            if chunk_encode {
                stream.write_all(b"0\r\n\r\n").await?;
            }
        }
        Body::Chunked(chunks) => {
            write_chunks(stream, out, chunks, None, chunk_encode).await?;
        }
        Body::Paced { chunks, interval } => {
            write_chunks(stream, out, chunks, Some(interval), chunk_encode).await?;
        }
    }
    stream.flush().await?;
    Ok(!close)
}

async fn write_chunks(
    stream: &mut TcpStream,
    head: Vec<u8>,
    chunks: Vec<Bytes>,
    interval: Option<Duration>,
    encode: bool,
) -> std::io::Result<()> {
    stream.write_all(&head).await?;
    stream.flush().await?;
    for (i, c) in chunks.iter().enumerate() {
        if c.is_empty() {
            continue;
        }
        if i > 0 {
            if let Some(d) = interval {
                tokio::time::sleep(d).await;
            }
        }
        if encode {
            let mut piece = format!("{:x}\r\n", c.len()).into_bytes();
            piece.extend_from_slice(c);
            piece.extend_from_slice(b"\r\n");
            stream.write_all(&piece).await?;
        } else {
            stream.write_all(c).await?;
        }
        stream.flush().await?;
    }
    if encode {
        if let Some(d) = interval {
            tokio::time::sleep(d).await;
        }
        stream.write_all(b"0\r\n\r\n").await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Deterministic generated content
// ---------------------------------------------------------------------------

fn gen_word(index: u64, seed: u8) -> [u8; 8] {
    // splitmix64 of the 8-byte word index, keyed by the seed.
    let mut z = index
        .wrapping_add((seed as u64).wrapping_mul(0xA24B_AED4_963E_E407))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// Fills `buf` with the generated content for `seed` starting at byte `offset` of the
/// stream, i.e. `buf[k]` = byte `offset + k` of a [`Body::Generated`] body.
pub fn fill_generated(buf: &mut [u8], offset: usize, seed: u8) {
    let mut k = 0;
    // Unaligned head.
    while k < buf.len() && (offset + k) & 7 != 0 {
        let i = offset + k;
        buf[k] = gen_word((i / 8) as u64, seed)[i % 8];
        k += 1;
    }
    // Whole words.
    while k + 8 <= buf.len() {
        let i = offset + k;
        buf[k..k + 8].copy_from_slice(&gen_word((i / 8) as u64, seed));
        k += 8;
    }
    // Tail.
    while k < buf.len() {
        let i = offset + k;
        buf[k] = gen_word((i / 8) as u64, seed)[i % 8];
        k += 1;
    }
}

/// The first `len` bytes of the generated content for `seed` (what a
/// `Body::Generated { len, seed }` body contains).
pub fn generated_bytes(len: usize, seed: u8) -> Vec<u8> {
    generated_range(0, len, seed)
}

/// Bytes `offset .. offset + len` of the generated content for `seed` (for Range tests).
pub fn generated_range(offset: usize, len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_generated(&mut v, offset, seed);
    v
}

/// Whether `data` equals bytes `offset .. offset + data.len()` of the generated
/// content for `seed`. Uses only a 64 KiB scratch buffer.
pub fn verify_generated(data: &[u8], seed: u8, offset: usize) -> bool {
    generated_mismatch(data, seed, offset).is_none()
}

/// Index into `data` of the first byte that differs from the generated content for
/// `seed` starting at `offset`, or `None` if all match.
pub fn generated_mismatch(data: &[u8], seed: u8, offset: usize) -> Option<usize> {
    let mut scratch = vec![0u8; GENERATED_CHUNK];
    let mut pos = 0;
    while pos < data.len() {
        let n = GENERATED_CHUNK.min(data.len() - pos);
        fill_generated(&mut scratch[..n], offset + pos, seed);
        if data[pos..pos + n] != scratch[..n] {
            let k = data[pos..pos + n]
                .iter()
                .zip(&scratch[..n])
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(pos + k);
        }
        pos += n;
    }
    None
}

// ---------------------------------------------------------------------------
// HTTP dates
// ---------------------------------------------------------------------------

/// Formats `t` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), as used by
/// `Date`, `Expires` and `Last-Modified`.
pub fn http_date(t: SystemTime) -> String {
    let secs: i64 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    };
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    const WD: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MO: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let wd = WD[(days + 4).rem_euclid(7) as usize];
    format!(
        "{wd}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        MO[(m - 1) as usize],
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

/// [`http_date`] of now plus `offset_secs` (negative for the past), e.g. for
/// `Expires` or `Last-Modified` values.
pub fn http_date_offset(offset_secs: i64) -> String {
    let now = SystemTime::now();
    let t = if offset_secs >= 0 {
        now + Duration::from_secs(offset_secs as u64)
    } else {
        now - Duration::from_secs(offset_secs.unsigned_abs())
    };
    http_date(t)
}

/// (year, month 1-12, day 1-31) for a count of days since 1970-01-01
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}
