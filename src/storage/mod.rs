//! Storage tiers behind Pingora's `Storage` trait: the product's core.
//!
//! * [`memory`]: the per-node in-process tier (TinyUFO, byte-bounded, streaming fills).
//! * [`object`]: what a stored response is (decoded metadata + chunked body), shared by tiers.

pub mod memory;
pub mod object;
