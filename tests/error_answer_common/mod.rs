//! What `tests/error_answer_keepalive.rs` and `tests/error_keepalive_attacks.rs` share: the two
//! forwarding paths, the configuration that makes an origin failure one attempt with short
//! timers, and the raw client steps around an error answer. Included by each as a module (a
//! directory under `tests/` is not a test of its own); each file uses most of it, not all.
#![allow(dead_code)]

use lacquer_test_support::*;
use std::net::SocketAddr;
use std::time::Duration;

/// Lacquer's own exchange forwards everything when nothing is cached.
pub const DIRECT: &str = "[cache]\nenabled = false\n";
/// Pingora's proxy phases for every request.
pub const STANDARD: &str = "[proxy]\ndirect_passes = false\ndirect_misses = false\n";
pub const PATHS: [(&str, &str); 2] = [("direct", DIRECT), ("standard", STANDARD)];

/// One attempt per request and a backend that keeps failing stays in the rotation; short timers
/// so that a hang is a 504 quickly.
pub const COMMON: &str = "[log]\naccess = \"off\"\n\
    [balancer.passive]\nenabled = false\n\
    [balancer.retries]\nattempts = 1\n\
    [balancer.timeouts]\nconnect = \"1s\"\nfirst_byte = \"500ms\"\nidle = \"500ms\"\n";

/// A guard for reads that should not wait: only a hang reaches it.
pub const HANG_GUARD: Duration = Duration::from_secs(10);

/// A body made of a request: parsed as one, it would reach the origin as `GET /smuggled`.
pub const SMUGGLED: &[u8] = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

/// Lacquer in front of `backend` alone, with [`COMMON`] and `extra` (a path, and more).
pub fn start(backend: SocketAddr, extra: &str) -> LacquerProcess {
    start_balancer(&[(backend, 1)], &format!("{COMMON}{extra}"))
}

pub fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").into_bytes()
}

pub fn connect(lacquer: &LacquerProcess) -> RawConn {
    let mut conn = RawConn::connect(lacquer.addr());
    conn.read_timeout = HANG_GUARD;
    conn
}

/// Reads one whole answer, panicking with `why` when none comes.
pub fn answer(conn: &mut RawConn, why: &str) -> RawResponse {
    conn.try_read_response(false)
        .unwrap_or_else(|e| panic!("{why}: no whole answer: {e}"))
}

/// Whether an answer says it closes its connection.
pub fn says_close(r: &RawResponse) -> bool {
    r.header_all("connection")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("close"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
