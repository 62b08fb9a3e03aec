//! The shared tier's transport: memcached servers placed by ketama.
//!
//! * [`ketama`]: libmemcached-compatible consistent hashing, so other ketama clients agree on
//!   which server holds a key (`pingora-ketama` is CRC32/nginx-style and does not).
//! * [`cluster`]: placement plus per-server failure counting and ejection.
//! * [`client`]: a small async, pooled, pipelining client for one server, with connect and
//!   operation timeouts, so a slow or dead memcached costs a miss, never a stuck request.
//! * [`batch`]: concurrent gets to one server leave as one pipelined multi-get, so a busy node
//!   pays one round trip for many hits.

pub mod batch;
pub mod client;
pub mod cluster;
pub mod ketama;
