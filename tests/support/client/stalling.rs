//! A raw HTTP/1 client that can stall: its socket's receive buffer small, so that while it reads
//! nothing the proxy's writes to it wait once the socket buffers between them are full (a
//! slow-read attack, a phone in a tunnel); or reading at a pace; or reading at once. It then
//! reads its answers whole, de-chunked, and says whether each ended as its framing says or was
//! cut by the connection's end ([`StallingClient`], [`StallingAnswer`]). Shared by
//! `fill_pace_attacks`, `fill_failures` and `direct_miss_attacks`.
//!
//! Unlike [`super::raw`], it is async (tokio) and never waits for a quiet connection: it reads
//! exactly one answer's framing, so a test can hold a request unread while it does other things.

use super::super::generated::generated_mismatch;
use std::fmt::Display;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The receive buffer of a stalling connection: 4 KiB, so little that the proxy's writes to a
/// client that reads nothing wait almost at once.
const STALLED_RECV_BUFFER: u32 = 4096;

/// How long a read waits for bytes before the client takes the connection for ended: longer than
/// any case of its tests takes when nothing hangs (their own `BOUND`s, also 40 s), far shorter
/// than the `server.send_timeout` (ten minutes) they configure.
const SILENCE: Duration = Duration::from_secs(40);

/// Most bytes taken by one read.
const READ_SIZE: usize = 64 << 10;

/// One answer as a [`StallingClient`] read it.
#[derive(Debug)]
pub struct StallingAnswer {
    /// The head, up to and without its blank line (empty when none arrived).
    pub head: String,
    /// The status code; `0` when no head arrived.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// The body ended as its framing says; `false`: the connection ended first.
    pub complete: bool,
}

impl StallingAnswer {
    /// The value of the head's field `name` (any letter case), if it has one.
    pub fn field(&self, name: &str) -> Option<String> {
        head_field(&self.head, name)
    }

    /// Asserts a `200` answer cut short (its connection ended before its framing did), of at
    /// most `most` body bytes, which are the start of the generated page of `seed`
    /// ([`crate::generated`]): what a client gets of a page whose origin failed or
    /// which it was given up on.
    pub fn assert_cut_start(&self, seed: u8, most: usize, what: &str) {
        assert_eq!(self.status, 200, "{what}: {}", self.head);
        assert!(
            !self.complete,
            "{what}: a cut body ({} bytes) was reported complete",
            self.body.len()
        );
        assert!(self.body.len() <= most, "{what}: {} bytes", self.body.len());
        assert_eq!(generated_mismatch(&self.body, seed, 0), None, "{what}");
    }
}

/// A raw HTTP/1 client connection over tokio. Connected by [`connect`](Self::connect),
/// [`get`](Self::get) or [`stalled`](Self::stalled), its receive buffer is 4 KiB, so that
/// while it reads nothing the proxy's writes to it wait once the socket buffers are full; by
/// [`connect_eager`](Self::connect_eager) or [`eager`](Self::eager), the system's, to read at
/// once. Reads either as fast as bytes come or at a [`pace`](Self::pace).
pub struct StallingClient {
    stream: TcpStream,
    /// Read and not yet taken by an answer.
    buf: Vec<u8>,
    /// The connection has ended (a close, a reset, or [`SILENCE`]).
    eof: bool,
    /// `Some((most, pause))`: each read takes at most `most` bytes and waits `pause` first, a
    /// client that reads slowly. `None` (the default): reads as bytes come.
    pub pace: Option<(usize, Duration)>,
}

impl StallingClient {
    /// Connects to `addr` with a 4 KiB receive buffer; sends nothing.
    pub async fn connect(addr: SocketAddr) -> StallingClient {
        StallingClient::connect_with(addr, Some(STALLED_RECV_BUFFER)).await
    }

    /// Connects to `addr` with the system's receive buffer; sends nothing.
    pub async fn connect_eager(addr: SocketAddr) -> StallingClient {
        StallingClient::connect_with(addr, None).await
    }

    async fn connect_with(addr: SocketAddr, recv_buffer: Option<u32>) -> StallingClient {
        let socket = TcpSocket::new_v4().unwrap();
        if let Some(size) = recv_buffer {
            socket.set_recv_buffer_size(size).unwrap();
        }
        let stream = socket.connect(addr).await.unwrap();
        StallingClient {
            stream,
            buf: Vec::new(),
            eof: false,
            pace: None,
        }
    }

    /// [`connect`](Self::connect)s (4 KiB) and sends `GET path` with `Host: <addr>` and `fields`
    /// (lines ending in CRLF); then reads nothing until told.
    pub async fn get(addr: SocketAddr, path: &str, fields: &str) -> StallingClient {
        let mut client = StallingClient::connect(addr).await;
        client.send_get(addr, path, fields).await;
        client
    }

    /// [`connect`](Self::connect)s (4 KiB) and sends `GET path` with `Host: host` and no other
    /// field; then reads nothing until told.
    pub async fn stalled(addr: SocketAddr, host: &str, path: &str) -> StallingClient {
        let mut client = StallingClient::connect(addr).await;
        client.send_get(host, path, "").await;
        client
    }

    /// [`connect_eager`](Self::connect_eager)s (the system's buffer) and sends `GET path` with
    /// `Host: host` and no other field, to read the answer at once.
    pub async fn eager(addr: SocketAddr, host: &str, path: &str) -> StallingClient {
        let mut client = StallingClient::connect_eager(addr).await;
        client.send_get(host, path, "").await;
        client
    }

    /// Sends `GET path` with `Host: host` and `fields` (lines ending in CRLF).
    pub async fn send_get(&mut self, host: impl Display, path: &str, fields: &str) {
        self.send(&format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\n{fields}\r\n"
        ))
        .await;
    }

    /// Sends `text` as it is.
    pub async fn send(&mut self, text: &str) {
        self.stream.write_all(text.as_bytes()).await.unwrap();
    }

    /// The socket, for a test that reads it itself; only before anything was read.
    pub fn into_stream(self) -> TcpStream {
        assert!(self.buf.is_empty(), "bytes already read off the socket");
        self.stream
    }

    /// Reads until a response head is in the buffer; `false` if the connection ended first.
    pub async fn until_head(&mut self) -> bool {
        while find(&self.buf, b"\r\n\r\n").is_none() {
            if !self.fill().await {
                return false;
            }
        }
        true
    }

    /// Reads the next final answer (interim ones skipped); `head_only`: it answers a HEAD.
    pub async fn answer(&mut self, head_only: bool) -> StallingAnswer {
        loop {
            let answer = self.one_answer(head_only).await;
            if !(100..200).contains(&answer.status) {
                return answer;
            }
        }
    }

    /// Reads more; `false` at the connection's end (a close, a reset, or [`SILENCE`]).
    async fn fill(&mut self) -> bool {
        if self.eof {
            return false;
        }
        let mut chunk = vec![0u8; READ_SIZE];
        let want = match self.pace {
            Some((most, pause)) => {
                tokio::time::sleep(pause).await;
                most.min(chunk.len())
            }
            None => chunk.len(),
        };
        match tokio::time::timeout(SILENCE, self.stream.read(&mut chunk[..want])).await {
            Ok(Ok(n)) if n > 0 => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            _ => {
                self.eof = true;
                false
            }
        }
    }

    /// Reads until `n` bytes (head and framing included) have arrived; `false` if the
    /// connection ended first.
    pub async fn until_len(&mut self, n: usize) -> bool {
        self.need(n).await
    }

    /// Until the buffer holds `n` bytes; `false` if the connection ended first.
    async fn need(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            if !self.fill().await {
                return false;
            }
        }
        true
    }

    /// The next CRLF-ended line (without its CRLF), taken from the buffer.
    async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(at) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..at]).into_owned();
                self.buf.drain(..at + 2);
                return Some(line);
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Reads the next answer, interim or final.
    async fn one_answer(&mut self, head_only: bool) -> StallingAnswer {
        let mut answer = StallingAnswer {
            head: String::new(),
            status: 0,
            body: Vec::new(),
            complete: false,
        };
        loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                answer.head = String::from_utf8_lossy(&self.buf[..at]).into_owned();
                self.buf.drain(..at + 4);
                break;
            }
            if !self.fill().await {
                return answer;
            }
        }
        answer.status = answer
            .head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if head_only || (100..200).contains(&answer.status) || matches!(answer.status, 204 | 304) {
            answer.complete = true;
            return answer;
        }
        let chunked = head_field(&answer.head, "transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let length = head_field(&answer.head, "content-length").and_then(|v| v.parse().ok());
        if chunked {
            loop {
                let Some(size_line) = self.line().await else {
                    return answer;
                };
                let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16)
                    .unwrap_or_else(|_| panic!("a bad chunk-size line: {size_line:?}"));
                if size == 0 {
                    // no trailers expected: the blank line ends the body
                    match self.line().await {
                        Some(blank) if blank.is_empty() => answer.complete = true,
                        _ => {}
                    }
                    return answer;
                }
                if !self.need(size + 2).await {
                    let have = self.buf.len().min(size);
                    answer.body.extend_from_slice(&self.buf[..have]);
                    return answer;
                }
                answer.body.extend_from_slice(&self.buf[..size]);
                assert_eq!(
                    &self.buf[size..size + 2],
                    b"\r\n",
                    "a chunk not ended by CRLF"
                );
                self.buf.drain(..size + 2);
            }
        }
        match length {
            Some(length) => {
                answer.complete = self.need(length).await;
                let have = self.buf.len().min(length);
                answer.body = self.buf.drain(..have).collect();
            }
            None => {
                // delimited by the close
                while self.fill().await {}
                answer.body = std::mem::take(&mut self.buf);
                answer.complete = true;
            }
        }
        answer
    }
}

/// Position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The value of field `name` in a raw response head (its status line skipped).
fn head_field(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}
