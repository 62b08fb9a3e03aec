//! The test origin's HTTP/1.1 wire side: accepting connections, reading requests (sized and
//! chunked bodies, `Expect: 100-continue`, pipelining), recording them, calling the handler and
//! writing its response in the framing it asks for.

use super::{Body, OriginResponse, RecordedRequest, Shared};
use crate::fields::{field_values, has_field, has_token, owned_fields};
use crate::generated::{fill_generated, GENERATED_CHUNK};
use crate::http_date::http_date;
use bytes::{Buf, Bytes, BytesMut};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Largest request head the origin accepts before answering 431 and closing.
const MAX_HEAD: usize = 1024 * 1024;

/// Binds `127.0.0.1:0`, reports the address (or the bind error) on `addr_tx`, and serves every
/// connection on its own task until `shutdown` fires.
pub(super) async fn accept_loop(
    shared: Arc<Shared>,
    bind: SocketAddr,
    addr_tx: std::sync::mpsc::Sender<std::io::Result<SocketAddr>>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let bound = (|| {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(bind)?;
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
        let req = match read_request(&mut stream, &mut buf, conn_id, &shared).await {
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
        if resp.is_close_without_answer() {
            let _ = stream.shutdown().await;
            return;
        }
        match write_response(&mut stream, &method, resp, req_close).await {
            Ok(true) => continue,
            Ok(false) | Err(_) => {
                let _ = stream.shutdown().await;
                return;
            }
        }
    }
}

/// Whether the client asked to close the connection after this request (`Connection: close`, or
/// HTTP/1.0 without `keep-alive`).
fn wants_close(req: &RecordedRequest) -> bool {
    has_token(&req.headers, "connection", "close")
        || (req.version == 0 && !has_token(&req.headers, "connection", "keep-alive"))
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
    shared: &Shared,
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
                    let headers = owned_fields(req.headers);
                    buf.advance(n);
                    shared.heads.lock().unwrap().push(path.clone());
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
        field_values(&headers, name)
            .into_iter()
            .map(|v| v.trim().to_string())
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
        interim,
    } = resp;
    for (status, fields) in interim {
        let mut head = format!("HTTP/1.1 {status} Interim\r\n");
        for (k, v) in fields {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.flush().await?;
    }
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }
    let is_head = method.eq_ignore_ascii_case("HEAD");
    let bodiless_status = status < 200 || status == 204 || status == 304;
    let send_body = !is_head && !bodiless_status;

    if !has_field(&headers, "date") {
        headers.push(("Date".into(), http_date(next_whole_second())));
    }
    let own_framing =
        has_field(&headers, "content-length") || has_field(&headers, "transfer-encoding");
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

/// Now, rounded up to the next whole second: the default `Date` of a scripted answer.
///
/// An HTTP date has whole seconds, so a `Date` of *now* truncated makes the answer look up to a
/// second old when it arrives (its apparent age, RFC 9111 §4.2.3). A `max-age=1` answer could then
/// be stale a millisecond after it was stored, and a test that expects the next request to hit
/// would pass or fail on where in the second it ran. Rounded up, the apparent age is zero and the
/// lifetime is the one the test scripted; tests of apparent age script `date=` themselves.
fn next_whole_second() -> SystemTime {
    let now = SystemTime::now();
    let since_epoch = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let whole = std::time::Duration::from_secs(
        since_epoch.as_secs() + u64::from(since_epoch.subsec_nanos() > 0),
    );
    SystemTime::UNIX_EPOCH + whole
}
