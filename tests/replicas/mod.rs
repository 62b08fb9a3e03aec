//! Origin replicas for the load-balancing, health-check and fairness tests: real servers on
//! real sockets, each naming itself in `x-backend`, counting what it served and how many
//! requests it had in flight at once, with a switchable `/health` answer.
#![allow(dead_code)]

use crate::support::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Live counters of one replica, shared with its handler.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// Status `/health` answers with.
    pub health_status: AtomicU16,
    /// Requests other than `/health` received.
    pub served: AtomicUsize,
    in_flight: AtomicUsize,
    /// Most requests (other than `/health`) this replica ever had in progress at once.
    pub max_in_flight: AtomicUsize,
    /// Extra time every request takes, in milliseconds.
    pub delay_ms: AtomicU64,
}

/// One origin replica.
pub struct Replica {
    pub id: String,
    pub origin: TestOrigin,
    pub state: Arc<ReplicaState>,
}

impl Replica {
    /// Starts replica `id`. Responses are `no-store` (so every request goes upstream) unless
    /// the path starts with `/cacheable`. `?sleep=MS` (or [`set_delay`](Self::set_delay))
    /// holds the request that long, counted in flight.
    pub fn start(id: &str) -> Replica {
        let state = Arc::new(ReplicaState::default());
        state.health_status.store(200, Ordering::SeqCst);
        let handler_state = state.clone();
        let name = id.to_string();
        let origin = TestOrigin::start(move |req| {
            let s = &handler_state;
            if req.path_only() == "/health" {
                let status = s.health_status.load(Ordering::SeqCst);
                return OriginResponse::ok("health").status(status);
            }
            s.served.fetch_add(1, Ordering::SeqCst);
            let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            s.max_in_flight.fetch_max(now, Ordering::SeqCst);
            let sleep = crate::common::query_param(req, "sleep")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + s.delay_ms.load(Ordering::SeqCst);
            if sleep > 0 {
                std::thread::sleep(Duration::from_millis(sleep));
            }
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            let cc = if req.path_only().starts_with("/cacheable") {
                "max-age=300"
            } else {
                "no-store"
            };
            OriginResponse::ok(format!("{} from {name}", req.path))
                .header("x-backend", name.clone())
                .header("cache-control", cc)
        });
        Replica {
            id: id.to_string(),
            origin,
            state,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.origin.addr()
    }

    pub fn served(&self) -> usize {
        self.state.served.load(Ordering::SeqCst)
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn set_health(&self, status: u16) {
        self.state.health_status.store(status, Ordering::SeqCst);
    }

    pub fn set_delay(&self, ms: u64) {
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }
}

/// `[[upstreams]]` entries for these addresses and weights.
pub fn upstreams_toml(backends: &[(SocketAddr, u32)]) -> String {
    backends
        .iter()
        .map(|(addr, weight)| format!("[[upstreams]]\naddress = \"{addr}\"\nweight = {weight}\n"))
        .collect()
}

/// Starts lacquer in front of `backends` (address, weight) with `extra` TOML (which must not
/// open `[[upstreams]]`-like arrays after tables it relies on; it is appended last).
pub fn start_balancer(backends: &[(SocketAddr, u32)], extra: &str) -> LacquerProcess {
    let mut last = String::new();
    for _ in 0..3 {
        let port = free_port();
        let config = format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n{}\n{extra}\n",
            upstreams_toml(backends)
        );
        match LacquerProcess::try_start(port, Some(&config), &[]) {
            Ok(p) => return p,
            Err(msg) if msg.to_ascii_lowercase().contains("in use") => last = msg,
            Err(msg) => panic!("{msg}"),
        }
    }
    panic!("{last}");
}

/// Waits (generously) until lacquer's stderr contains `needle`.
pub fn wait_for_log(proc: &LacquerProcess, needle: &str, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if proc.stderr_log().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// An address where nothing listens (connections are refused).
pub fn refused_addr() -> SocketAddr {
    local_addr(free_port())
}

/// A raw origin that misbehaves at the socket level; counts the connections it accepted.
pub struct RawOrigin {
    pub addr: SocketAddr,
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

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for RawOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
