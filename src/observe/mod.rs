//! Observability: what an operator reads to know what the cache is doing.
//!
//! [`access_log`] writes one line per request; `Cache-Status` on responses lives with the proxy
//! (`crate::proxy::cache_status`); counters are served by `crate::admin`.

pub mod access_log;
