//! The admin endpoint: counters an operator (and the test suite) reads over HTTP.
//!
//! Served on its own listener (`admin.listen`, off unless configured) so it is never reachable
//! through the public port. `GET /stats` answers JSON with the memory tier's accounting, the
//! shared tier's counters and each origin backend's state (health verdicts, requests in flight,
//! requests sent, failures, ejections): what `varnishadm backend.list` or nginx's upstream status
//! tells an operator.

use crate::storage::memory::MemoryTier;
use crate::storage::tiered::TieredStorage;
use crate::upstream::backend::Backend;
use async_trait::async_trait;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The admin HTTP application.
pub struct AdminApp {
    memory: &'static MemoryTier,
    shared: Option<&'static TieredStorage>,
    backends: Vec<Arc<Backend>>,
}

impl AdminApp {
    /// An admin app reporting on `memory`, the shared tier when configured, and the origin
    /// `backends` (shared with the balancer, so their state is live).
    pub fn new(
        memory: &'static MemoryTier,
        shared: Option<&'static TieredStorage>,
        backends: Vec<Arc<Backend>>,
    ) -> Self {
        AdminApp {
            memory,
            shared,
            backends,
        }
    }

    /// The `/stats` document: one JSON object and a newline.
    pub fn stats_json(&self) -> String {
        let m = self.memory.stats();
        let now = Instant::now();
        let stats = Stats {
            memory: MemoryReport {
                bytes: m.bytes,
                objects: m.objects,
                limit: m.limit,
                evictions: m.evictions,
                in_flight: m.in_flight,
            },
            shared: self.shared.map(SharedReport::of),
            backends: self
                .backends
                .iter()
                .map(|b| {
                    let t = b.totals();
                    BackendReport {
                        name: &b.name,
                        weight: b.weight,
                        up: b.active_up(),
                        ejected: b.is_ejected(now),
                        requests: t.requests,
                        failures: t.failures,
                        ejections: t.ejections,
                        in_flight: b.in_flight(),
                    }
                })
                .collect(),
        };
        let mut body = serde_json::to_string(&stats).expect("stats serialize to JSON");
        body.push('\n');
        body
    }
}

/// The `/stats` document. Field order is the order in the output; tests and operators read
/// the first `"in_flight"` as the memory tier's.
#[derive(Serialize)]
struct Stats<'a> {
    memory: MemoryReport,
    /// `null` without a shared tier.
    shared: Option<SharedReport>,
    backends: Vec<BackendReport<'a>>,
}

/// The memory tier's accounting ([`crate::storage::memory::MemoryStats`]).
#[derive(Serialize)]
struct MemoryReport {
    bytes: usize,
    objects: usize,
    limit: usize,
    evictions: u64,
    in_flight: usize,
}

/// The shared tier's counters and the memcached servers currently ejected.
#[derive(Serialize)]
struct SharedReport {
    hits: u64,
    misses: u64,
    rejected: u64,
    writes: u64,
    write_failures: u64,
    fills_claimed: u64,
    fills_awaited: u64,
    fills_unguarded: u64,
    fill_waits_cut: u64,
    errors: u64,
    ejections: u64,
    skipped_ejected: u64,
    ejected: Vec<String>,
}

impl SharedReport {
    fn of(shared: &TieredStorage) -> Self {
        let c = &shared.counters;
        let cluster = shared.cluster();
        let n = &cluster.counters;
        SharedReport {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            fills_claimed: c.fills_claimed.load(Ordering::Relaxed),
            fills_awaited: c.fills_awaited.load(Ordering::Relaxed),
            fills_unguarded: c.fills_unguarded.load(Ordering::Relaxed),
            fill_waits_cut: c.fill_waits_cut.load(Ordering::Relaxed),
            errors: n.errors.load(Ordering::Relaxed),
            ejections: n.ejections.load(Ordering::Relaxed),
            skipped_ejected: n.skipped_ejected.load(Ordering::Relaxed),
            ejected: cluster.ejected(),
        }
    }
}

/// One origin backend: its weight, verdicts and counters.
#[derive(Serialize)]
struct BackendReport<'a> {
    /// As configured.
    name: &'a str,
    weight: u32,
    /// The active health check's verdict (true without active checks).
    up: bool,
    /// Passively ejected right now.
    ejected: bool,
    requests: u64,
    failures: u64,
    ejections: u64,
    in_flight: usize,
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        let (status, body, content_type) = match path.as_str() {
            "/stats" => (200, self.stats_json(), "application/json"),
            "/health" => (200, "ok\n".to_string(), "text/plain"),
            _ => (404, "not found\n".to_string(), "text/plain"),
        };
        http::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-length", body.len())
            .body(body.into_bytes())
            .expect("static response parts are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_are_escaped_for_json() {
        let report = BackendReport {
            name: "a\"b\\c\n",
            weight: 1,
            up: true,
            ejected: false,
            requests: 2,
            failures: 0,
            ejections: 0,
            in_flight: 0,
        };
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            "{\"name\":\"a\\\"b\\\\c\\n\",\"weight\":1,\"up\":true,\"ejected\":false,\
             \"requests\":2,\"failures\":0,\"ejections\":0,\"in_flight\":0}"
        );
    }
}
