//! Storage tiers behind Pingora's `Storage` trait: the product's core.
//!
//! * [`memory`]: the per-node in-process tier (TinyUFO, byte-bounded, streaming fills).
//! * [`object`]: what a stored response is (decoded metadata + chunked body), shared by tiers.
//! * [`entry`]: the value format of the shared memcached tier (versioned, checksummed, chunked).
//! * [`memcached`]: ketama placement, the async memcached client and the cluster's health.
//! * [`tiered`]: the memory tier in front of the memcached cluster shared by all nodes.
//! * [`fill_lease`]: fills coalesced across nodes through that cluster (one origin fetch per URL).
//! * [`shared_counters`]: what the shared tier has done, for `/stats`.

pub mod entry;
pub mod fill_lease;
pub mod memcached;
pub mod memory;
pub mod object;
pub mod shared_counters;
pub mod tiered;
