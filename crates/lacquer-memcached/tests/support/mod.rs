//! The crate's test harness: a real memcached process per test, and the client settings and
//! values the tests share.

// Each integration test binary uses only part of the harness.
#![allow(dead_code)]

use bytes::Bytes;
use lacquer_memcached::{ClusterServer, ServerClient, ServerConfig};
use std::future::Future;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A real memcached on a free loopback port, killed on drop.
pub struct Memcached {
    child: Child,
    /// Kept so a test can restart a server where its clients expect it.
    pub port: u16,
}

impl Memcached {
    /// Starts a server on a free port and waits until it is the one that answers there; picks
    /// another port when a server of another test took the chosen one first.
    pub fn start() -> Memcached {
        let mut last = String::new();
        for _ in 0..3 {
            match Memcached::spawn(unassigned_port()) {
                Ok(server) => return server,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    /// Starts a server on `port` (a restart, where a killed one listened).
    pub fn start_on(port: u16) -> Memcached {
        Memcached::spawn(port).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Spawns memcached on `port` and waits until the server answering there reports this
    /// process's pid. Accepting a connection is not enough: a killed server's port is free, and
    /// another test's server may bind it first, then leave with the test.
    fn spawn(port: u16) -> Result<Memcached, String> {
        let child = Command::new("memcached")
            // `-u root` only matters when run as root, where memcached demands -u.
            .args([
                "-p",
                &port.to_string(),
                "-l",
                "127.0.0.1",
                "-U",
                "0",
                "-m",
                "64",
            ])
            .args(["-u", "root"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("memcached binary (apt-get install -y memcached)");
        let mut server = Memcached { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = server.child.try_wait().unwrap() {
                return Err(format!("memcached on port {port} exited early: {status}"));
            }
            match served_pid(port) {
                Some(pid) if pid == server.child.id() => return Ok(server),
                Some(other) => {
                    return Err(format!(
                        "port {port} is served by memcached pid {other}, not ours"
                    ))
                }
                None if Instant::now() >= deadline => {
                    return Err(format!("memcached did not start on port {port}"))
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Kills the server, as a crash would; its clients' connections break.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `kill -STOP` / `kill -CONT` to freeze or resume the server.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        // `kill` only queues the signal: wait until every thread has
        // actually stopped (or resumed), or a busy machine lets the
        // server answer one more request after "-STOP".
        let want_stopped = sig == "-STOP";
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.is_stopped() != want_stopped {
            assert!(Instant::now() < deadline, "memcached ignored {sig}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// True when every thread of the server is in the stopped state.
    pub fn is_stopped(&self) -> bool {
        let tasks = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(tasks).unwrap().all(|task| {
            let stat =
                std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit(") ")
                .next()
                .is_some_and(|rest| rest.starts_with('T'))
        })
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Cluster members at `addrs`, each named by its address, of weight 1.
pub fn servers_at(addrs: impl IntoIterator<Item = SocketAddr>) -> Vec<ClusterServer> {
    addrs
        .into_iter()
        .map(|addr| ClusterServer {
            name: addr.to_string(),
            addr,
            weight: 1,
        })
        .collect()
}

/// A loopback port nothing listens on right now, from below the kernel's ephemeral range: the
/// kernel never hands such a port to a `bind(:0)` or to an outgoing connection, so only another
/// test's pick can collide with it (and [`Memcached::start`] then picks again).
pub fn unassigned_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    // 10,000-32,767: above system services, below Linux's default ephemeral range (32,768-)
    const LOW: u64 = 10_000;
    const SPAN: u64 = 22_000;
    for _ in 0..100 {
        // a RandomState's keys are random per process and differ from call to call
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let port = (LOW + h.finish() % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// The pid that the memcached answering on `port` reports (`stats`), or `None` while nothing
/// answers there.
fn served_pid(port: u16) -> Option<u32> {
    let pid = try_server_stat(SocketAddr::from(([127, 0, 0, 1], port)), "pid")?;
    u32::try_from(pid).ok()
}

/// A loopback address that refuses connections: bound but never listening,
/// so no other test's server can take the port while the socket lives.
pub fn refusing_addr() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// A client with short timeouts, so a failure shows within the test's patience.
pub fn client(addr: SocketAddr, pool_size: usize) -> ServerClient {
    ServerClient::new(ServerConfig {
        addr,
        pool_size,
        // a refused connection fails at once whatever this is; a loopback connect that waits
        // is the machine's load (2 cores under the whole suite: once seen past 500 ms)
        connect_timeout: Duration::from_secs(2),
        op_timeout: Duration::from_millis(1000),
    })
}

/// Fails the test instead of hanging if `fut` takes more than 5 s.
pub async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .expect("operation hung")
}

/// A value of `len` + 8 bytes that contains every byte and ends in protocol look-alikes
/// (`\r\n`, `END`), so a client that parses values as text would fail.
pub fn binary_value(len: usize) -> Bytes {
    let mut v: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
    v.extend_from_slice(b"\r\n\0END\r\n");
    Bytes::from(v)
}

/// How many connections the server at `addr` has accepted since it started (memcached's
/// `total_connections`, which counts this question's own connection too): what the server saw,
/// not what the client believes it opened.
pub fn connections_accepted(addr: SocketAddr) -> u64 {
    server_stat(addr, "total_connections")
}

/// One number of the `stats` of the server at `addr`, asked over a connection of its own.
pub fn server_stat(addr: SocketAddr, name: &str) -> u64 {
    try_server_stat(addr, name)
        .unwrap_or_else(|| panic!("memcached at {addr} gave no {name} in its stats"))
}

/// [`server_stat`], or `None` when the server cannot be asked (not listening yet, say) or its
/// stats have no such number.
fn try_server_stat(addr: SocketAddr, name: &str) -> Option<u64> {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"stats\r\n").ok()?;
    let prefix = format!("STAT {name} ");
    for line in BufReader::new(stream).lines() {
        let line = line.ok()?;
        if let Some(n) = line.strip_prefix(&prefix) {
            return n.trim().parse().ok();
        }
        if line == "END" {
            return None;
        }
    }
    None
}

/// A runtime of one worker thread, as Pingora gives each of its services.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}
