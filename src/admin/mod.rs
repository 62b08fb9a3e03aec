//! The admin endpoint: counters an operator (and the test suite) reads over HTTP.
//!
//! Served on its own listener (`admin.listen`, off unless configured) so it is never reachable
//! through the public port. `GET /stats` answers JSON with the memory tier's accounting.

use crate::storage::memory::MemoryTier;
use crate::storage::tiered::TieredStorage;
use async_trait::async_trait;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use std::sync::atomic::Ordering;

/// The admin HTTP application.
pub struct AdminApp {
    memory: &'static MemoryTier,
    shared: Option<&'static TieredStorage>,
}

impl AdminApp {
    /// An admin app reporting on `memory` and, when configured, the shared tier.
    pub fn new(memory: &'static MemoryTier, shared: Option<&'static TieredStorage>) -> Self {
        AdminApp { memory, shared }
    }

    fn shared_json(&self) -> String {
        let Some(shared) = self.shared else {
            return "null".to_string();
        };
        let c = &shared.counters;
        let cluster = &shared.cluster().counters;
        let ejected: Vec<String> = shared
            .cluster()
            .ejected()
            .iter()
            .map(|name| format!("\"{name}\""))
            .collect();
        format!(
            "{{\"hits\":{},\"misses\":{},\"rejected\":{},\"writes\":{},\"write_failures\":{},\"errors\":{},\"ejections\":{},\"skipped_ejected\":{},\"ejected\":[{}]}}",
            c.hits.load(Ordering::Relaxed),
            c.misses.load(Ordering::Relaxed),
            c.rejected.load(Ordering::Relaxed),
            c.writes.load(Ordering::Relaxed),
            c.write_failures.load(Ordering::Relaxed),
            cluster.errors.load(Ordering::Relaxed),
            cluster.ejections.load(Ordering::Relaxed),
            cluster.skipped_ejected.load(Ordering::Relaxed),
            ejected.join(",")
        )
    }

    /// The `/stats` document.
    pub fn stats_json(&self) -> String {
        let m = self.memory.stats();
        format!(
            "{{\"memory\":{{\"bytes\":{},\"objects\":{},\"limit\":{},\"evictions\":{},\"in_flight\":{}}},\"shared\":{}}}\n",
            m.bytes,
            m.objects,
            m.limit,
            m.evictions,
            m.in_flight,
            self.shared_json()
        )
    }
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
