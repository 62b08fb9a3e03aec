//! The live status page: `GET /` is one self-contained HTML page (inline CSS, JavaScript and
//! SVG; no external assets, so it works offline), which fetches `GET /status.json` every second
//! and charts requests per second and hit ratio by tier, p50 / p99 latency and the memory tier's
//! fill, with the memcached servers and origin backends and their state.
//!
//! The JSON carries counters, not rates: the page works out rates and quantiles from the
//! difference between consecutive samples, so the node keeps no history and any number of open
//! pages cost it one small document a second each.

use super::sources::Sources;
use crate::observe::metrics::histogram::BOUNDS_SECONDS;
use crate::observe::metrics::CacheOutcome;
use serde::Serialize;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The page, compiled in.
pub const PAGE: &str = include_str!("status_page.html");

/// One sample for the page.
#[derive(Serialize)]
struct Sample<'a> {
    /// When it was taken, in milliseconds since the Unix epoch.
    time_ms: u64,
    requests: Requests,
    latency: Latency,
    memory: Memory,
    memcached: Vec<MemcachedServer>,
    backends: Vec<Backend<'a>>,
}

/// Requests since start by outcome and tier.
#[derive(Serialize, Default)]
struct Requests {
    hit_memory: u64,
    hit_memcached: u64,
    miss: u64,
    stale: u64,
    revalidated: u64,
    pass: u64,
}

/// Every request's latency since start: bucket upper bounds in seconds, and observations per
/// bucket (one more than bounds: the last is above every bound).
#[derive(Serialize)]
struct Latency {
    bounds: &'static [f64],
    counts: Vec<u64>,
}

#[derive(Serialize)]
struct Memory {
    bytes: usize,
    limit: usize,
    objects: usize,
    evictions: u64,
    /// Large bodies in memory files (open descriptors), sent with `sendfile`.
    files: usize,
}

#[derive(Serialize)]
struct MemcachedServer {
    name: String,
    up: bool,
    errors: u64,
    timeouts: u64,
}

#[derive(Serialize)]
struct Backend<'a> {
    name: &'a str,
    /// The replica's `IP:PORT` (a name has one replica per address).
    address: &'a str,
    /// Offered traffic now.
    up: bool,
    ejected: bool,
    in_flight: usize,
    requests: u64,
    failures: u64,
}

/// The `/status.json` document.
pub fn sample_json(s: &Sources) -> String {
    let (requests, counts) = match &s.proxy {
        Some(proxy) => {
            let r = proxy.requests.snapshot();
            let all = |outcome| {
                ["memory", "memcached", "origin"]
                    .iter()
                    .map(|source| r.requests(outcome, source))
                    .sum()
            };
            (
                Requests {
                    hit_memory: r.requests(CacheOutcome::Hit, "memory"),
                    hit_memcached: r.requests(CacheOutcome::Hit, "memcached"),
                    miss: all(CacheOutcome::Miss),
                    stale: all(CacheOutcome::Stale),
                    revalidated: all(CacheOutcome::Revalidated),
                    pass: all(CacheOutcome::Pass),
                },
                r.all_latency().counts.to_vec(),
            )
        }
        None => (Requests::default(), vec![0; BOUNDS_SECONDS.len() + 1]),
    };
    let m = s.memory.stats();
    let now = Instant::now();
    let replicas = s.replicas.load();
    let sample = Sample {
        time_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        requests,
        latency: Latency {
            bounds: &BOUNDS_SECONDS,
            counts,
        },
        memory: Memory {
            bytes: m.bytes,
            limit: m.limit,
            objects: m.objects,
            evictions: m.evictions,
            files: m.files,
        },
        memcached: s.shared.map_or_else(Vec::new, |shared| {
            shared
                .cluster()
                .server_reports()
                .into_iter()
                .map(|v| MemcachedServer {
                    name: v.name,
                    up: !v.ejected,
                    errors: v.stats.errors,
                    timeouts: v.stats.timeouts,
                })
                .collect()
        }),
        backends: replicas
            .backends
            .iter()
            .map(|b| {
                let t = b.totals();
                Backend {
                    name: &b.name,
                    address: &b.address,
                    up: b.is_available(now),
                    ejected: b.is_ejected(now),
                    in_flight: b.in_flight(),
                    requests: t.requests,
                    failures: t.failures,
                }
            })
            .collect(),
    };
    let mut body = serde_json::to_string(&sample).expect("a status sample serializes");
    body.push('\n');
    body
}
