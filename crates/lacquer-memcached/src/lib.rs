//! Lacquer's shared-tier transport: memcached servers placed by ketama.
//!
//! * [`ketama`]: libmemcached-compatible consistent hashing, so other ketama clients agree on
//!   which server holds a key (`pingora-ketama` is CRC32/nginx-style and does not).
//! * [`cluster`]: placement plus per-server failure counting and ejection, built from a
//!   [`ClusterConfig`]; operations on one server by index, for data every server keeps a copy of.
//! * [`batch`]: concurrent gets to one server leave as one pipelined multi-get, so a busy node
//!   pays one round trip for many hits.
//! * [`client`]: [`ServerClient`], the operations on one server (get, pipelined multi-get, set,
//!   add, replace, gets and compare-and-swap, append, delete, touch), so a slow or dead
//!   memcached costs a miss, never a stuck request.
//! * [`pool`]: that server's connections: at most `pool_size`, every call bounded by
//!   `op_timeout`, no connection reused after a failed or cancelled call, one retry of an
//!   idempotent call on a stale pooled connection.
//! * `connection`: one TCP connection, opened within `connect_timeout`, one exchange at a time.
//! * [`protocol`]: the meta text protocol's bytes: commands encoded, replies parsed.
//! * [`cas_token`]: CAS tokens that carry the run of the server that gave them, so that a server
//!   restarted empty, counting its tokens from 1 again, is not sent a token of its last run.
//! * [`error`]: [`McError`], why a call failed (callers treat every error as a miss).
//! * [`server_stats`]: each server's latency, batch sizes, failures and timeouts, for metrics.
//!
//! # Why a crate of its own
//!
//! Nothing here knows HTTP, Pingora or Lacquer's cache: it moves opaque byte values under
//! byte keys. Lacquer's storage tier (`src/storage/tiered.rs`) decides what the values are
//! (`docs/entry-format.md`) and turns its validated `[cache.memcached]` section into a
//! [`ClusterConfig`]. As a crate the boundary is checked by the compiler rather than by
//! convention, it builds and tests on its own (`cargo test -p lacquer-memcached`), its
//! reference data (the ketama vectors in `tests/vectors/` and their generator) and its
//! benchmark (`bench/mc_client.rs`, against `async-memcached`) live beside it, and that
//! benchmark's dependency stays out of Lacquer's package.
//!
//! Read with `cargo doc --document-private-items` (`.ci/run` builds them so, warnings refused):
//! the docs link to the private items the design lives in.

#![allow(rustdoc::private_intra_doc_links)]

pub mod batch;
pub mod cas_token;
pub mod client;
pub mod cluster;
mod connection;
pub mod error;
pub mod ketama;
pub mod pool;
pub mod protocol;
pub mod server_stats;

pub use cas_token::{usable_cas_token, CasToken, ServerInstance};
pub use client::ServerClient;
pub use cluster::{
    Appended, Cluster, ClusterConfig, ClusterCounters, ClusterServer, DeleteOutcome, ServerReport,
};
pub use error::McError;
pub use pool::ServerConfig;
pub use protocol::CasOutcome;
pub use server_stats::{ServerStats, ServerStatsSnapshot};
