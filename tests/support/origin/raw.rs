//! Origins that misbehave below HTTP, at the socket level (closing before answering, cutting a
//! body short), for the retry rules: what may be retried depends on whether bytes reached the
//! client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A raw origin that misbehaves at the socket level; counts the connections it accepted.
pub struct RawOrigin {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl RawOrigin {
    /// Reads the request head, then closes without answering (a reset before any byte).
    pub fn closing() -> RawOrigin {
        RawOrigin::start(|_stream| {})
    }

    /// Answers a response head promising 1000 bytes, sends 5, then closes.
    pub fn truncating() -> RawOrigin {
        RawOrigin::start(|stream| {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nCache-Control: no-store\r\n\r\nhello",
            );
            let _ = stream.flush();
            std::thread::sleep(Duration::from_millis(100));
        })
    }

    /// Reads each request head, then hands the connection to `after_head`, which writes whatever
    /// it likes (a response without `Date`, a malformed one) before the connection is closed.
    pub fn answering(after_head: fn(&mut std::net::TcpStream)) -> RawOrigin {
        RawOrigin::start(after_head)
    }

    fn start(after_head: fn(&mut std::net::TcpStream)) -> RawOrigin {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind raw origin");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        count.fetch_add(1, Ordering::SeqCst);
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
                        after_head(&mut stream);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        RawOrigin {
            addr,
            accepted,
            stop,
        }
    }

    /// Connections accepted so far: whether the balancer tried it at all.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
