//! Observability: what an operator reads to know what the cache is doing.
//!
//! [`access_log`] writes one line per request; [`metrics`] counts every request (by cache
//! outcome and tier, bytes, latency) for `/metrics` and the status page; `Cache-Status` on
//! responses lives with the proxy (`crate::proxy::cache_status`); the admin listener serves the
//! counters (`crate::admin`).

pub mod access_log;
pub mod metrics;
