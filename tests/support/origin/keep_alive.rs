//! [`KeepAliveOrigin`]: a keep-alive HTTP/1.1 origin whose handler writes raw bytes to the socket
//! and says whether the connection stays open, with every request it read logged in order and
//! numbered on its connection. For tests of what the proxy does with a connection the origin keeps
//! open, closes, or answers wrongly: dead pooled connections, retries, response desync.

use crate::raw_text::{find, request_line};
use std::io::{ErrorKind, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as a [`KeepAliveOrigin`] read it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Its rank on its connection (1: the connection's first request; more: a reused one).
    pub nth: usize,
    pub method: String,
    pub path: String,
    /// The request head as received, its final blank line included.
    pub head: String,
    /// The body, by its `Content-Length` or de-chunked.
    pub body: Vec<u8>,
}

/// What a [`KeepAliveOrigin`] does with the connection after its handler ran.
pub enum Then {
    KeepAlive,
    Close,
}

type Handler = dyn Fn(&Seen, &mut TcpStream) -> Then + Send + Sync + 'static;

/// A keep-alive HTTP/1.1 origin: each connection on its own thread, requests read one after the
/// other (head, then a `Content-Length` or chunked body), logged, each handed to the handler,
/// which writes what it likes and says whether the connection stays open.
pub struct KeepAliveOrigin {
    pub addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl KeepAliveOrigin {
    pub fn start(handler: impl Fn(&Seen, &mut TcpStream) -> Then + Send + Sync + 'static) -> Self {
        let handler: Arc<Handler> = Arc::new(handler);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind origin");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, log, halt) = (accepted.clone(), seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        let (handler, log, halt) = (handler.clone(), log.clone(), halt.clone());
                        std::thread::spawn(move || serve(stream, &*handler, &log, &halt));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        KeepAliveOrigin {
            addr,
            accepted,
            seen,
            stop,
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Every request read so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests read for `path`.
    pub fn seen_for(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }

    /// The requests read whose path starts with `prefix`.
    pub fn seen_under(&self, prefix: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.path.starts_with(prefix))
            .collect()
    }
}

impl Drop for KeepAliveOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Serves one connection until the peer closes it, the handler closes it or the origin stops.
fn serve(mut stream: TcpStream, handler: &Handler, log: &Mutex<Vec<Seen>>, halt: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf: Vec<u8> = Vec::new();
    let mut nth = 0;
    loop {
        let head_end = loop {
            if let Some(at) = find(&buf, b"\r\n\r\n") {
                break at + 4;
            }
            if !read_more(&mut stream, &mut buf, halt) {
                return;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            loop {
                if let Some((body, used)) = dechunk(&buf) {
                    buf.drain(..used);
                    break body;
                }
                if !read_more(&mut stream, &mut buf, halt) {
                    return;
                }
            }
        } else {
            let length = content_length(&head);
            while buf.len() < length {
                if !read_more(&mut stream, &mut buf, halt) {
                    return;
                }
            }
            buf.drain(..length).collect()
        };
        nth += 1;
        let (method, path) = request_line(&head);
        let seen = Seen {
            nth,
            method,
            path,
            head,
            body,
        };
        log.lock().unwrap().push(seen.clone());
        match handler(&seen, &mut stream) {
            Then::KeepAlive => {}
            Then::Close => {
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

/// The whole chunked body at the start of `buf`, once it is all there: its payload and the
/// bytes it took.
fn dechunk(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut pos = 0;
    let mut body = Vec::new();
    loop {
        let eol = find(&buf[pos..], b"\r\n")?;
        let line = String::from_utf8_lossy(&buf[pos..pos + eol]).into_owned();
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        pos += eol + 2;
        if size == 0 {
            // no trailers here: the empty line ends the body
            if buf.len() < pos + 2 {
                return None;
            }
            return Some((body, pos + 2));
        }
        if buf.len() < pos + size + 2 {
            return None;
        }
        body.extend_from_slice(&buf[pos..pos + size]);
        pos += size + 2;
    }
}

fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, halt: &AtomicBool) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if halt.load(Ordering::SeqCst) {
            return false;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                return true;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return false,
        }
    }
}

fn content_length(head: &str) -> usize {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}
