//! Everything the admin listener reports on, in one place: the storage tiers, the origin
//! backends, the invalidation service, and what the proxy counts per request.
//!
//! Each component keeps its own counters; `/stats`, `/metrics` and the status page read them
//! from here at request time, so nothing is counted twice.

use crate::compression::decoded_copies::DecodedCopies;
use crate::invalidation::Invalidator;
use crate::lifecycle::live::Live;
use crate::observe::metrics::RequestMetrics;
use crate::proxy::fill_relay::ReadAheadBudget;
use crate::storage::memory::MemoryTier;
use crate::storage::tiered::TieredStorage;
use crate::upstream::replicas::Replicas;
use std::sync::Arc;

/// What the proxy counts, handed to the admin listener by `server.rs`.
#[derive(Clone)]
pub struct ProxyCounters {
    /// Every finished request.
    pub requests: &'static RequestMetrics,
    /// Decoded copies of small gzip bodies, when kept.
    pub decoded_copies: Option<&'static DecodedCopies>,
    /// The settings a reload replaces, for what lives there (the fairness queue).
    pub live: Arc<Live>,
    /// What cache fills hold for clients slower than the fill (direct misses; the standard
    /// path's reservations).
    pub read_ahead: [&'static ReadAheadBudget; 2],
}

/// The components the admin listener reads.
#[derive(Clone)]
pub struct Sources {
    pub memory: &'static MemoryTier,
    pub shared: Option<&'static TieredStorage>,
    /// The origin replicas, as the resolver keeps them.
    pub replicas: Arc<Replicas>,
    pub invalidator: &'static Invalidator,
    /// `None` until the proxy's counters are handed over (an admin app built alone, in tests).
    pub proxy: Option<ProxyCounters>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("backends", &self.replicas.load().backends.len())
            .field("shared", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}
