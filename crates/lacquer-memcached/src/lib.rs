//! Lacquer's shared-tier transport: memcached servers placed by ketama.
//!
//! * [`ketama`]: libmemcached-compatible consistent hashing, so other ketama clients agree on
//!   which server holds a key (`pingora-ketama` is CRC32/nginx-style and does not).
//! * [`cluster`]: placement plus per-server failure counting and ejection, built from a
//!   [`ClusterConfig`].
//! * [`client`]: a small async, pooled, pipelining client for one server, with connect and
//!   operation timeouts, so a slow or dead memcached costs a miss, never a stuck request.
//! * [`batch`]: concurrent gets to one server leave as one pipelined multi-get, so a busy node
//!   pays one round trip for many hits.
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

pub mod batch;
pub mod client;
pub mod cluster;
pub mod ketama;

pub use cluster::{Cluster, ClusterConfig, ClusterCounters, ClusterServer};
