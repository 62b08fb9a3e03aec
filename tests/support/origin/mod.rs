//! Test origins: real HTTP/1.1 servers on loopback that the proxy under test fetches from.
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
//!
//! - [`request`]: [`RecordedRequest`], what the origin received.
//! - [`response`]: [`OriginResponse`] and its [`Body`] framings, what a handler answers.
//! - [`scripted`]: [`scripted_origin`], whose answers the request's query string scripts.
//! - [`replica`]: [`Replica`], one of several origins behind the balancer, counting its load.
//! - [`raw`]: [`RawOrigin`], an origin that misbehaves at the socket level.
//! - [`tls_front`]: [`TlsFront`], TLS in front of an origin (an `https` origin).
//! - [`capture`]: [`CaptureOrigin`], which keeps every byte the proxy sent it.
//! - [`keep_alive`]: [`KeepAliveOrigin`], raw answers on connections it keeps open or closes,
//!   every request logged with its rank on its connection.
//! - `wire`: the HTTP/1.1 server loop behind [`TestOrigin`].

pub mod capture;
pub mod counting;
pub mod keep_alive;
pub mod raw;
pub mod replica;
pub mod request;
pub mod response;
pub mod scripted;
pub mod tls_front;
mod wire;

pub use capture::*;
pub use counting::*;
pub use keep_alive::{KeepAliveOrigin, Seen, Then};
pub use raw::*;
pub use replica::*;
pub use request::*;
pub use response::*;
pub use scripted::*;
pub use tls_front::*;

use crate::poll::{poll_until, poll_until_async};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

type Handler = dyn Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static;

/// What the origin thread and [`TestOrigin`] share: the handler, the log of requests and the
/// connection counters.
struct Shared {
    handler: Box<Handler>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// The target of every request head read, whether or not its body then arrived whole.
    heads: Mutex<Vec<String>>,
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
        TestOrigin::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), handler)
    }

    /// [`Self::start`] on `bind`: another loopback address (`127.0.0.2:0`), or a port another
    /// origin has on its own address (two origins one host name resolves to).
    pub fn start_on<F>(bind: SocketAddr, handler: F) -> TestOrigin
    where
        F: Fn(&RecordedRequest) -> OriginResponse + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            handler: Box::new(handler),
            requests: Mutex::new(Vec::new()),
            heads: Mutex::new(Vec::new()),
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
                rt.block_on(wire::accept_loop(thread_shared, bind, addr_tx, shutdown_rx));
                rt.shutdown_timeout(Duration::from_secs(2));
            })
            .expect("spawn origin thread");
        let addr = match addr_rx.recv() {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => panic!("test origin failed to bind {bind}: {e}"),
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
        self.requests_for(path).len()
    }

    /// Request heads with the target `path` received so far, counting those whose body never
    /// arrived whole (a request the proxy abandoned after sending its head), which
    /// [`Self::hits_for`] leaves out.
    pub fn heads_for(&self, path: &str) -> usize {
        let heads = self.shared.heads.lock().unwrap();
        heads.iter().filter(|target| *target == path).count()
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
        poll_until(timeout, || self.hits() >= n)
    }

    /// Blocks (polling) until [`hits_for(path)`](Self::hits_for) reaches `n` or `timeout`
    /// passes; returns whether it was reached.
    pub fn wait_for_hits_for(&self, path: &str, n: usize, timeout: Duration) -> bool {
        poll_until(timeout, || self.hits_for(path) >= n)
    }

    /// Async version of [`wait_for_hits`](Self::wait_for_hits) for `#[tokio::test]`s
    /// (does not block the test's runtime).
    pub async fn wait_for_hits_async(&self, n: usize, timeout: Duration) -> bool {
        poll_until_async(timeout, || self.hits() >= n).await
    }

    /// Async version of [`wait_for_hits_for`](Self::wait_for_hits_for) for `#[tokio::test]`s
    /// (does not block the test's runtime).
    pub async fn wait_for_hits_for_async(&self, path: &str, n: usize, timeout: Duration) -> bool {
        poll_until_async(timeout, || self.hits_for(path) >= n).await
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
