//! Origins that misbehave below HTTP, at the socket level (closing before answering, cutting a
//! body short, never answering), for the retry and timeout rules: what may be retried depends on
//! whether bytes reached the client, and a hang must end in a 504.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a raw origin does once it has read a request head: gets the head (as text) and the
/// stream, writes what it likes; the connection is closed when it returns.
type AfterHead = dyn Fn(&str, &mut TcpStream) + Send + Sync + 'static;

/// A raw origin that misbehaves at the socket level; counts the connections it accepted and
/// keeps the request heads it read. Each connection is served on its own thread, so one that
/// hangs does not hold up the next.
pub struct RawOrigin {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    heads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl RawOrigin {
    /// Reads the request head, then closes without answering (a reset before any byte).
    pub fn closing() -> RawOrigin {
        RawOrigin::answering(|_head, _stream| {})
    }

    /// Answers a response head promising 1000 bytes, sends 5, then closes.
    pub fn truncating() -> RawOrigin {
        RawOrigin::answering(|_head, stream| {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: no-store\r\n\r\nhello",
            );
            let _ = stream.flush();
            std::thread::sleep(Duration::from_millis(100));
        })
    }

    /// Accepts and reads the request, then never answers (until the origin is dropped, or a
    /// minute has passed).
    pub fn hanging() -> RawOrigin {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        RawOrigin::start_with_stop(
            Box::new(move |_head, _stream| {
                let until = Instant::now() + Duration::from_secs(60);
                while !halt.load(Ordering::SeqCst) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }),
            stop,
        )
    }

    /// An origin that answers each request head with whatever `after_head` writes to the
    /// stream, then closes the connection.
    pub fn answering(after_head: impl Fn(&str, &mut TcpStream) + Send + Sync + 'static) -> Self {
        RawOrigin::start_with_stop(Box::new(after_head), Arc::new(AtomicBool::new(false)))
    }

    fn start_with_stop(after_head: Box<AfterHead>, stop: Arc<AtomicBool>) -> RawOrigin {
        let after_head: Arc<AfterHead> = Arc::from(after_head);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind raw origin");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let (count, halt, seen) = (accepted.clone(), stop.clone(), heads.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        let (after_head, seen) = (after_head.clone(), seen.clone());
                        std::thread::spawn(move || {
                            let head = read_head(&mut stream);
                            seen.lock().unwrap().push(head.clone());
                            after_head(&head, &mut stream);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        RawOrigin {
            addr,
            accepted,
            heads,
            stop,
        }
    }

    /// Connections accepted so far: whether the balancer tried it at all.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The request heads read so far, in arrival order.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    /// The request lines read so far (the first line of each head), in arrival order: what a
    /// desync test compares with what the client sent.
    pub fn request_lines(&self) -> Vec<String> {
        self.heads()
            .iter()
            .map(|head| head.lines().next().unwrap_or("").to_string())
            .collect()
    }
}

/// The target of a request head (`GET /a HTTP/1.1` → `/a`), for an origin script that answers
/// by path.
pub fn path_of(head: &str) -> &str {
    head.split_whitespace().nth(1).unwrap_or("")
}

/// Writes `bytes` to a client and flushes, ignoring a client that has gone: what a scripted
/// origin does when its peer's disappearance is part of the test.
pub fn write_quietly(stream: &mut TcpStream, bytes: &[u8]) {
    let _ = stream.write_all(bytes);
    let _ = stream.flush();
}

/// Reads up to the end of a request head (2 s of silence or a closed connection end it early).
fn read_head(stream: &mut TcpStream) -> String {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
