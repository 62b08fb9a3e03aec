//! Loopback addresses and ports: finding a free port, telling whether something accepts on one,
//! and whether it is a given process that listens there.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// The ports [`free_port`] hands out: from 10000 (above the ports of system services) to the
/// kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by default), which a
/// port from `bind(0)` comes from, and which every outgoing connection of every process takes
/// its source port from too; at most up to 32000. Empty when the ephemeral range starts too low.
fn ports() -> std::ops::Range<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    10_000..ephemeral_low.min(32_000)
}

/// A currently free TCP port on 127.0.0.1, never handed out before by this process.
///
/// A port from `bind(0)` comes from the ephemeral range: released, it could be taken as the source
/// port of any outgoing connection, or be handed out again to a test running beside, before the
/// child meant to listen on it bound it (a CI run's admin listener found its port "in use", and
/// the test read another node's counters there). So ports come from [`ports`], from a
/// per-process counter that starts at a random place in it, each checked free when handed out.
/// (Another process running tests at the same time could still pick one; `cargo test` runs
/// test binaries one after another.)
pub fn free_port() -> u16 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU64> = std::sync::OnceLock::new();
    let range = ports();
    let span = u64::from(range.end.saturating_sub(range.start));
    if span < 1000 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        return l.local_addr().expect("local_addr").port();
    }
    let next = NEXT.get_or_init(|| std::sync::atomic::AtomicU64::new(pseudo_random() % span));
    for _ in 0..span {
        let offset = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span;
        let port = range.start + offset as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {range:?}");
}

/// `127.0.0.1:<port>` as a `SocketAddr`.
pub fn local_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// An address where nothing listens (connections are refused), for a dead backend.
pub fn refused_addr() -> SocketAddr {
    local_addr(free_port())
}

/// Whether something accepts TCP connections on `127.0.0.1:<port>` right now.
pub fn port_accepts(port: u16) -> bool {
    TcpStream::connect_timeout(&local_addr(port), Duration::from_millis(200)).is_ok()
}

/// Whether process `pid` holds the socket listening on TCP `port` (from `/proc/net/tcp{,6}` and
/// the process's file descriptors).
pub fn process_listens_on(pid: u32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let port_suffix = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == LISTEN && cols[1].ends_with(&port_suffix) {
                inodes.push(format!("socket:[{}]", cols[9]));
            }
        }
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .map(|target| {
                inodes
                    .iter()
                    .any(|inode| target.as_os_str() == inode.as_str())
            })
            .unwrap_or(false)
    })
}

/// A number that differs from call to call and from process to process (no `rand` dependency).
fn pseudo_random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

/// A loopback address that refuses every connection for as long as it is held: a TCP socket
/// bound to a port and never listening. A connection to it is refused (reset) as to a closed
/// port, and, unlike [`refused_addr`], the port stays taken: no other bind (a test origin on
/// port 0, a proxy's listener) can land on it and start accepting in its place.
pub struct RefusingPort {
    addr: SocketAddr,
    // held, never listening
    _socket: tokio::net::TcpSocket,
}

impl RefusingPort {
    /// Binds a socket to a free loopback port (without `SO_REUSEADDR`, so no other socket can
    /// share the port).
    pub fn bind() -> RefusingPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket
            .bind(local_addr(0))
            .expect("bind 127.0.0.1:0 without listening");
        let addr = socket.local_addr().expect("local_addr");
        RefusingPort {
            addr,
            _socket: socket,
        }
    }

    /// The address whose connections are refused.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}
