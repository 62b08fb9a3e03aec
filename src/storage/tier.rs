//! Which tier served a hit: this node's memory, or the memcached cluster all nodes share.
//!
//! Learned where the object is found (the fast path's lookup, or the hit handler Pingora's state
//! machine reads from) and carried to the response's `Cache-Status`, the access log and the
//! request metrics, so an operator can tell a memcached hit from a memory hit.

/// The tier a stored response was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// This node's in-process memory tier.
    Memory,
    /// The shared memcached cluster (read, verified and promoted into memory by this request).
    Memcached,
}

impl Tier {
    /// The word used in logs, `Cache-Status` (`detail=`) and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Memcached => "memcached",
        }
    }
}
