//! Storage tiers behind Pingora's `Storage` trait: the product's core.
//!
//! * [`memory`]: the per-node in-process tier (TinyUFO, byte-bounded, streaming fills).
//! * [`object`]: what a stored response is (decoded metadata + chunked body), shared by tiers.
//! * [`partial`]: what a stored partial response (a `206`) is, and how two parts combine.
//! * [`entry`]: the value format of the shared memcached tier (versioned, checksummed, chunked).
//! * [`tiered`]: the memory tier in front of the memcached cluster shared by all nodes, reached
//!   through the `lacquer-memcached` crate (ketama placement, pooled client, ejection).
//! * [`fill_lease`]: fills coalesced across nodes through that cluster (one origin fetch per URL).
//! * [`guarded_fills`]: fills in flight fetched under another node's fill lease, joined only
//!   while that lease stands.
//! * [`decoded_values`]: the last few memcached values read for the fast path, decoded once.
//! * [`shared_framing`]: entries read from memcached are untrusted: framing rebuilt from the body.
//! * [`shared_counters`]: what the shared tier has done, for `/stats`.
//! * [`wire_head`]: a stored head's wire form, kept for the fast path on an object's first hit.
//! * [`tier`]: which tier served a hit, for `Cache-Status`, the log and the metrics.
//! * [`ban_list`]: the purges and bans both tiers judge entries by (carried out and spread over
//!   the cluster by `crate::invalidation`); Varnish's name for the same list.

pub mod ban_list;
pub mod decoded_values;
pub mod entry;
pub mod fill_lease;
pub mod guarded_fills;
pub mod memory;
pub mod object;
pub mod partial;
pub mod shared_counters;
pub mod shared_framing;
pub mod tier;
pub mod tiered;
pub mod wire_head;
