//! Loopback addresses and ports: finding a free port, telling whether something accepts on one,
//! and whether it is a given process that listens there.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// A currently free TCP port on 127.0.0.1 (bind port 0, read it, release it).
///
/// Another process could take it before you bind it; that race is rare on loopback.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
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
