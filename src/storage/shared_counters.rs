//! What the shared tier has done, for `/stats`: counted by the tiered store (reads, writes) and
//! by the fill leases (claims, waits), read by the admin endpoint.

use std::sync::atomic::AtomicU64;

/// Counters of the shared tier since start.
#[derive(Debug, Default)]
pub struct SharedCounters {
    /// Verified memcached hits.
    pub hits: AtomicU64,
    /// Of `hits`, those served from a value another request had just decoded: concurrent gets
    /// of one key share one value, decoded once (see [`super::decoded_values`]).
    pub decodes_shared: AtomicU64,
    /// Keys memcached did not have.
    pub misses: AtomicU64,
    /// Values memcached returned that failed verification (format, checksum, key, a chunk).
    pub rejected: AtomicU64,
    /// Verified entries not served because a purge or ban covers them, or because they are
    /// older than purges and bans are remembered (`invalidation.retention`).
    pub invalidated: AtomicU64,
    /// Entries written to memcached.
    pub writes: AtomicU64,
    /// Entries that could not be written.
    pub write_failures: AtomicU64,
    /// Fills this node claimed for the cluster (see [`super::fill_lease`]).
    pub fills_claimed: AtomicU64,
    /// Requests that waited for another node's fill and were served by it (requests on the
    /// filling node wait on Pingora's cache lock instead, and are not counted).
    pub fills_awaited: AtomicU64,
    /// Misses filled without a lease because the URL's memcached server was ejected, had just
    /// failed, or did not answer the claim: nothing more is asked of a failing server.
    pub fills_unguarded: AtomicU64,
    /// Waits for another node's fill begun (each ends served by that fill, cut short, or at the
    /// lease's end).
    pub fill_waits: AtomicU64,
    /// Waits for another node's fill cut short because the URL's memcached server failed.
    pub fill_waits_cut: AtomicU64,
}
