//! Why a memcached call failed: one error type for the protocol, the connection and the pool.

use std::fmt;
use std::io;

/// Why a memcached call failed.  Callers of the cache tier treat every error
/// as a miss (or a skipped write); the variants exist for logs and metrics.
#[derive(Debug)]
pub enum McError {
    /// No connection could be opened (refused, unreachable, or connect timeout).
    Connect,
    /// The call did not finish within `op_timeout`.
    Timeout,
    /// The connection failed mid-call (reset, closed, write error).
    Io(io::Error),
    /// An invalid key, or a response this client does not understand.
    Protocol(String),
    /// The server answered `SERVER_ERROR` (e.g. out of memory, value too large).
    ServerError(String),
}

impl fmt::Display for McError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McError::Connect => write!(f, "memcached: connect failed"),
            McError::Timeout => write!(f, "memcached: operation timed out"),
            McError::Io(e) => write!(f, "memcached: I/O error: {e}"),
            McError::Protocol(m) => write!(f, "memcached: protocol error: {m}"),
            McError::ServerError(m) => write!(f, "memcached: server error: {m}"),
        }
    }
}

impl std::error::Error for McError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            McError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for McError {
    fn from(e: io::Error) -> Self {
        McError::Io(e)
    }
}
