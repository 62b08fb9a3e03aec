//! The admin endpoint: counters an operator (and the test suite) reads over HTTP, and the
//! invalidation API applications call.
//!
//! Served on its own listener (`admin.listen`, off unless configured) so it is never reachable
//! through the public port. `GET /stats` answers JSON with the memory tier's accounting, the
//! shared tier's counters, each origin backend's state (health verdicts, requests in flight,
//! requests sent, failures, ejections: what `varnishadm backend.list` or nginx's upstream status
//! tells an operator) and the invalidation service's. `POST /purge` and `POST /ban`
//! ([`invalidate`]) purge and ban across the cluster; `POST /reload` ([`reload`]) reloads the
//! config as SIGHUP does. Everything but `GET /health` is for the addresses in
//! `admin.allow_from` only, and the POST calls also demand the bearer token ([`auth`]). For
//! people and Prometheus: `GET /metrics` ([`prometheus`], the text format) and the live status
//! page, `GET /` with `GET /status.json` ([`status`]), both reading the components listed in
//! [`sources`].

pub mod auth;
pub mod invalidate;
pub mod prometheus;
pub mod reload;
pub mod sources;
pub mod status;

use crate::config::admin::AdminAccess;
use crate::invalidation::{InvalidationStats, Invalidator};
use crate::lifecycle::reload::Reloader;
use crate::storage::memory::MemoryTier;
use crate::storage::tiered::TieredStorage;
use crate::upstream::replicas::Replicas;
use async_trait::async_trait;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use serde::Serialize;
use sources::{ProxyCounters, Sources};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The admin HTTP application.
pub struct AdminApp {
    memory: &'static MemoryTier,
    shared: Option<&'static TieredStorage>,
    replicas: Arc<Replicas>,
    invalidator: &'static Invalidator,
    access: AdminAccess,
    /// What `/metrics` and the status page read.
    sources: Sources,
    /// `/metrics`'s registry, one collector over `sources`.
    metrics: prometheus_client::registry::Registry,
    reloader: Arc<Reloader>,
}

/// What a POST to the admin listener asks for.
enum Call {
    Invalidate(invalidate::Call),
    Reload,
}

impl AdminApp {
    /// An admin app reporting on `memory`, the shared tier when configured, and the origin
    /// backend `replicas` (shared with the balancer, so their state is live), and carrying out purges
    /// and bans through `invalidator` and reloads through `reloader` for the clients `access`
    /// lets in.
    pub fn new(
        memory: &'static MemoryTier,
        shared: Option<&'static TieredStorage>,
        replicas: Arc<Replicas>,
        invalidator: &'static Invalidator,
        access: AdminAccess,
        reloader: Arc<Reloader>,
    ) -> Self {
        let sources = Sources {
            memory,
            shared,
            replicas: replicas.clone(),
            invalidator,
            proxy: None,
        };
        AdminApp {
            memory,
            shared,
            replicas,
            invalidator,
            access,
            metrics: prometheus::registry(sources.clone()),
            sources,
            reloader,
        }
    }

    /// Adds what the proxy counts per request to `/metrics` and the status page.
    pub fn with_proxy_counters(mut self, counters: ProxyCounters) -> Self {
        self.sources.proxy = Some(counters);
        self.metrics = prometheus::registry(self.sources.clone());
        self
    }

    /// The `/stats` document: one JSON object and a newline.
    pub fn stats_json(&self) -> String {
        let m = self.memory.stats();
        let now = Instant::now();
        let replicas = self.replicas.load();
        let stats = Stats {
            memory: MemoryReport {
                bytes: m.bytes,
                objects: m.objects,
                limit: m.limit,
                evictions: m.evictions,
                in_flight: m.in_flight,
            },
            shared: self.shared.map(SharedReport::of),
            backends: replicas
                .backends
                .iter()
                .map(|b| {
                    let t = b.totals();
                    BackendReport {
                        name: &b.name,
                        address: &b.address,
                        weight: b.weight,
                        up: b.active_up(),
                        ejected: b.is_ejected(now),
                        requests: t.requests,
                        failures: t.failures,
                        ejections: t.ejections,
                        in_flight: b.in_flight(),
                        queued: b.queued(),
                    }
                })
                .collect(),
            invalidation: self.invalidator.stats(),
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
    /// Purges and bans: bans held (`rules`, the ban list's size), issued here, learned from
    /// others, log reads, retries.
    invalidation: InvalidationStats,
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
    decodes_shared: u64,
    misses: u64,
    rejected: u64,
    invalidated: u64,
    writes: u64,
    write_failures: u64,
    writes_superseded: u64,
    written_then_banned: u64,
    purges_kept: u64,
    writes_judged_late: u64,
    /// Writes and lease deletes not done yet (a gauge).
    background_writes: u64,
    fills_claimed: u64,
    fill_leases_renewed: u64,
    fill_leases_lost: u64,
    fills_awaited: u64,
    fills_unguarded: u64,
    fills_under_another_claim: u64,
    fill_waits: u64,
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
            decodes_shared: c.decodes_shared.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            invalidated: c.invalidated.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            writes_superseded: c.writes_superseded.load(Ordering::Relaxed),
            written_then_banned: c.written_then_banned.load(Ordering::Relaxed),
            purges_kept: c.purges_kept.load(Ordering::Relaxed),
            writes_judged_late: c.writes_judged_late.load(Ordering::Relaxed),
            background_writes: c.background.load(Ordering::Relaxed),
            fills_claimed: c.fills_claimed.load(Ordering::Relaxed),
            fill_leases_renewed: c.fill_leases_renewed.load(Ordering::Relaxed),
            fill_leases_lost: c.fill_leases_lost.load(Ordering::Relaxed),
            fills_awaited: c.fills_awaited.load(Ordering::Relaxed),
            fills_unguarded: c.fills_unguarded.load(Ordering::Relaxed),
            fills_under_another_claim: c.fills_under_another_claim.load(Ordering::Relaxed),
            fill_waits: c.fill_waits.load(Ordering::Relaxed),
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
    /// Requests waiting for a slot under the backend's `max_in_flight`.
    queued: usize,
    /// The replica's address (`IP:PORT`): one of the name's, for a backend given by host name.
    /// Last, so the fields before it read as they always did.
    address: &'a str,
}

impl AdminApp {
    /// The answer to one request: status, body, content type, and whether to ask for bearer
    /// credentials.
    async fn answer(&self, session: &mut ServerSession) -> (u16, String, &'static str, bool) {
        let req = session.req_header();
        let (method, path) = (req.method.clone(), req.uri.path().to_string());
        if path == "/health" {
            return (200, "ok\n".into(), "text/plain", false);
        }
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        if let Err(refusal) = auth::check_address(&self.access, client) {
            log::warn!(
                "admin: {method} {path} from {client:?} refused: {}",
                refusal.reason()
            );
            return refused(refusal);
        }
        let read_only = method == http::Method::GET || method == http::Method::HEAD;
        let call = match path.as_str() {
            "/stats" if method == http::Method::GET => {
                return (200, self.stats_json(), "application/json", false)
            }
            "/metrics" if read_only => {
                let body = prometheus::render(&self.metrics);
                return (200, body, prometheus::CONTENT_TYPE, false);
            }
            "/" if read_only => {
                let page = status::PAGE.to_string();
                return (200, page, "text/html; charset=utf-8", false);
            }
            "/status.json" if read_only => {
                let body = status::sample_json(&self.sources);
                return (200, body, "application/json", false);
            }
            "/metrics" | "/" | "/status.json" => {
                return (405, "method not allowed\n".into(), "text/plain", false)
            }
            "/purge" => Call::Invalidate(invalidate::Call::Purge),
            "/ban" => Call::Invalidate(invalidate::Call::Ban),
            "/reload" => Call::Reload,
            "/stats" => return (405, "method not allowed\n".into(), "text/plain", false),
            _ => return (404, "not found\n".into(), "text/plain", false),
        };
        if method != http::Method::POST {
            return (405, "method not allowed\n".into(), "text/plain", false);
        }
        if let Err(refusal) = auth::check_token(&self.access, session.req_header()) {
            log::warn!(
                "admin: {method} {path} from {client:?} refused: {}",
                refusal.reason()
            );
            return refused(refusal);
        }
        let (status, body) = match call {
            Call::Invalidate(call) => {
                invalidate::on_request(session, call, self.invalidator, client).await
            }
            Call::Reload => {
                log::info!("admin: reload asked by {client:?}");
                reload::on_request(&self.reloader).await
            }
        };
        (status, body, "application/json", false)
    }
}

fn refused(refusal: auth::Refusal) -> (u16, String, &'static str, bool) {
    let mut body = serde_json::json!({ "error": refusal.reason() }).to_string();
    body.push('\n');
    (
        refusal.status(),
        body,
        "application/json",
        refusal.status() == 401,
    )
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let (status, body, content_type, challenge) = self.answer(session).await;
        let mut response = http::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .header("content-length", body.len());
        if challenge {
            response = response.header("www-authenticate", "Bearer realm=\"lacquer admin\"");
        }
        response
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
            address: "127.0.0.1:1",
            weight: 1,
            up: true,
            ejected: false,
            requests: 2,
            failures: 0,
            ejections: 0,
            in_flight: 0,
            queued: 0,
        };
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            "{\"name\":\"a\\\"b\\\\c\\n\",\"weight\":1,\"up\":true,\"ejected\":false,\
             \"requests\":2,\"failures\":0,\"ejections\":0,\"in_flight\":0,\"queued\":0,\"address\":\"127.0.0.1:1\"}"
        );
    }
}
