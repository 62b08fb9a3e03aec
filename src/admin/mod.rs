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

    fn backends_json(&self) -> String {
        let now = Instant::now();
        let entries: Vec<String> = self
            .backends
            .iter()
            .map(|b| {
                let t = b.totals();
                format!(
                    "{{\"name\":\"{}\",\"weight\":{},\"up\":{},\"ejected\":{},\"requests\":{},\"failures\":{},\"ejections\":{},\"in_flight\":{}}}",
                    json_escape(&b.name),
                    b.weight,
                    b.active_up(),
                    b.is_ejected(now),
                    t.requests,
                    t.failures,
                    t.ejections,
                    b.in_flight()
                )
            })
            .collect();
        format!("[{}]", entries.join(","))
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
            "{{\"hits\":{},\"misses\":{},\"rejected\":{},\"writes\":{},\"write_failures\":{},\"fills_claimed\":{},\"fills_awaited\":{},\"errors\":{},\"ejections\":{},\"skipped_ejected\":{},\"ejected\":[{}]}}",
            c.hits.load(Ordering::Relaxed),
            c.misses.load(Ordering::Relaxed),
            c.rejected.load(Ordering::Relaxed),
            c.writes.load(Ordering::Relaxed),
            c.write_failures.load(Ordering::Relaxed),
            c.fills_claimed.load(Ordering::Relaxed),
            c.fills_awaited.load(Ordering::Relaxed),
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
            "{{\"memory\":{{\"bytes\":{},\"objects\":{},\"limit\":{},\"evictions\":{},\"in_flight\":{}}},\"shared\":{},\"backends\":{}}}\n",
            m.bytes,
            m.objects,
            m.limit,
            m.evictions,
            m.in_flight,
            self.shared_json(),
            self.backends_json()
        )
    }
}

/// Escapes a string for a JSON string literal (backend names are as configured).
fn json_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
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
    fn names_are_escaped_for_json() {
        assert_eq!(json_escape("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(json_escape("a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
    }
}
