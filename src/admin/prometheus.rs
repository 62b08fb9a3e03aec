//! `GET /metrics`: every counter the node keeps, in the Prometheus / OpenMetrics text format.
//!
//! Nothing is counted here: at each scrape, one collector reads the components' own counters
//! ([`Sources`]) and writes them through `prometheus-client`'s encoder (which owns the format:
//! names, `_total` suffixes, label escaping, cumulative buckets, `# EOF`). Families, all prefixed
//! `lacquer_`:
//!
//! * requests: `requests_total{cache,tier}`, `response_body_bytes_total{cache}`,
//!   `request_duration_seconds{cache}` (histogram), `coalesced_requests_total`,
//!   `purge_requests_total{result}`, `read_ahead_bytes` (cache fills held for slow clients);
//! * memory tier: `memory_bytes`, `memory_limit_bytes`, `memory_objects`,
//!   `memory_evictions_total`, `memory_fills_in_flight`, `memory_files`,
//!   `decoded_copies_total{result}`;
//! * memcached: `memcached_{hits,decodes_shared,misses,rejected,writes,write_failures,writes_superseded,written_then_banned,purges_kept,writes_judged_late,ejections}_total`,
//!   `fill_leases_{claimed,renewed,lost}_total`, `fill_lease_waits_total`, and per server
//!   `memcached_server_up`, `memcached_server_errors_total`, `memcached_server_timeouts_total`,
//!   `memcached_server_connections`, `memcached_server_latency_seconds` and
//!   `memcached_batch_keys` (histograms);
//! * origin backends, per replica (labels `backend`, as configured, and `address`, one of a host
//!   name's addresses): `backend_requests_total`, `backend_failures_total`,
//!   `backend_ejections_total`, `backend_up`, `backend_health_check_up`, `backend_ejected`,
//!   `backend_in_flight`, `backend_queued`, `backend_response_seconds` (histogram); per backend
//!   given by host name, `backend_lookup_failures_total`; `fairness_queued`;
//! * invalidation: `invalidations_total{kind}`, `invalidations_learned_total`,
//!   `invalidation_rules`, `invalidation_log_reads_total{result}`, `invalidation_pending{kind}`.

use super::sources::Sources;
use crate::observe::metrics::histogram::Histogram;
use crate::observe::metrics::{CacheOutcome, SOURCES};
use lacquer_memcached::server_stats::{HistogramCounts, BATCH_BOUNDS, LATENCY_BOUNDS_MICROS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The content type of the OpenMetrics text format (Prometheus asks for it and reads it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `/metrics` registry: one collector over `sources`.
pub fn registry(sources: Sources) -> Registry {
    let mut registry = Registry::with_prefix("lacquer");
    registry.register_collector(Box::new(NodeCollector(sources)));
    registry
}

/// The `/metrics` document.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 * 1024);
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

#[derive(Debug)]
struct NodeCollector(Sources);

/// A histogram as the encoder takes it: sum, count and `(le, observations in the bucket)`
/// (the encoder writes them cumulated).
struct Buckets {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl From<&Histogram> for Buckets {
    fn from(h: &Histogram) -> Self {
        Buckets {
            sum: h.sum_seconds(),
            count: h.count(),
            buckets: h.with_bounds(),
        }
    }
}

impl Buckets {
    /// A histogram counted in integer units (`bounds` in those units, scaled by `scale` into
    /// the exported unit: 1e-6 for microseconds into seconds, 1 for keys).
    fn scaled(counts: &HistogramCounts, bounds: &[u64], scale: f64) -> Self {
        let buckets = counts
            .counts
            .iter()
            .enumerate()
            .map(|(i, count)| {
                let le = bounds
                    .get(i)
                    .map_or(f64::INFINITY, |bound| *bound as f64 * scale);
                (le, *count)
            })
            .collect();
        Buckets {
            sum: counts.sum as f64 * scale,
            count: counts.counts.iter().sum(),
            buckets,
        }
    }
}

/// Writes families to one descriptor encoder.
struct Families<'e, 'w>(&'e mut DescriptorEncoder<'w>);

impl Families<'_, '_> {
    fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let metric = ConstCounter::new(value);
        metric.encode(
            self.0
                .encode_descriptor(name, help, None, metric.metric_type())?,
        )
    }

    fn gauge(&mut self, name: &str, help: &str, value: i64) -> fmt::Result {
        let metric = ConstGauge::new(value);
        metric.encode(
            self.0
                .encode_descriptor(name, help, None, metric.metric_type())?,
        )
    }

    fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(L, u64)],
    ) -> fmt::Result {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, value) in rows {
            ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn gauges<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(L, i64)],
    ) -> fmt::Result {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, value) in rows {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn histograms<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(L, Buckets)],
    ) -> fmt::Result {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (labels, h) in rows {
            family
                .encode_family(labels)?
                .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
        }
        Ok(())
    }
}

fn gauge_of(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let mut f = Families(&mut encoder);
        if let Some(proxy) = &s.proxy {
            let r = proxy.requests.snapshot();
            let mut requests = Vec::new();
            for outcome in CacheOutcome::ALL {
                for source in SOURCES {
                    let count = r.requests(outcome, source);
                    // every outcome once, from where it usually comes; other pairs when they
                    // happened
                    let usual = match outcome {
                        CacheOutcome::Hit => source != "origin",
                        CacheOutcome::Miss | CacheOutcome::Pass => source == "origin",
                        CacheOutcome::Stale | CacheOutcome::Revalidated => source == "memory",
                    };
                    if usual || count > 0 {
                        requests.push(([("cache", outcome.label()), ("tier", source)], count));
                    }
                }
            }
            f.counters(
                "requests",
                "Requests by how the cache handled them and the tier whose copy was served \
                 (origin: not served from storage).",
                &requests,
            )?;
            let by_outcome = |values: &[u64]| -> Vec<([(&str, &str); 1], u64)> {
                CacheOutcome::ALL
                    .iter()
                    .zip(values)
                    .map(|(o, v)| ([("cache", o.label())], *v))
                    .collect()
            };
            f.counters(
                "response_body_bytes",
                "Response body bytes sent to clients, by cache outcome.",
                &by_outcome(&r.bytes),
            )?;
            let latency: Vec<_> = CacheOutcome::ALL
                .iter()
                .zip(&r.latency)
                .map(|(o, h)| ([("cache", o.label())], Buckets::from(h)))
                .collect();
            f.histograms(
                "request_duration_seconds",
                "Time from a request's arrival to the end of its response, by cache outcome.",
                &latency,
            )?;
            f.counter(
                "coalesced_requests",
                "Requests that waited for another request's fetch of the same object (the \
                 cache lock) instead of going to the origin.",
                r.coalesced,
            )?;
            f.counter(
                "direct_passes",
                "Passes (requests that will not be cached) forwarded over Lacquer's own HTTP/1 \
                 exchange and pool of idle origin connections (proxy.direct_passes), rather than \
                 through Pingora's proxy phases.",
                r.direct_passes,
            )?;
            f.counter(
                "direct_misses",
                "Misses (GETs found in no tier, no fill of them in flight) forwarded over the same \
                 exchange and stored from there (proxy.direct_misses), whatever their answer \
                 turned out to be.",
                r.direct_misses,
            )?;
            f.counters(
                "purge_requests",
                "PURGE requests by whether they removed something.",
                &[
                    ([("result", "removed")], r.purges_removed),
                    ([("result", "absent")], r.purges_absent),
                ],
            )?;
            if let Some(copies) = proxy.decoded_copies {
                let c = copies.counts();
                f.counters(
                    "decoded_copies",
                    "Decoded copies of gzip bodies for identity clients: served from a kept \
                     copy, or decoded and offered for keeping.",
                    &[
                        ([("result", "served")], c.served),
                        ([("result", "offered")], c.offered),
                    ],
                )?;
            }
            f.gauge(
                "read_ahead_bytes",
                "Bytes of cache fills held, or reserved, for clients slower than the fill (at \
                 most half of cache.memory_size in all).",
                gauge_of(proxy.read_ahead.iter().map(|budget| budget.held()).sum()),
            )?;
            if let Some(fairness) = &proxy.live.load().fairness {
                f.gauge(
                    "fairness_queued",
                    "Requests waiting for one of their client's origin slots.",
                    gauge_of(fairness.waiting()),
                )?;
            }
        }

        let m = s.memory.stats();
        f.gauge(
            "memory_bytes",
            "Bytes held by the memory tier.",
            gauge_of(m.bytes),
        )?;
        f.gauge(
            "memory_limit_bytes",
            "The memory tier's size limit.",
            gauge_of(m.limit),
        )?;
        f.gauge(
            "memory_objects",
            "Objects in the memory tier.",
            gauge_of(m.objects),
        )?;
        f.counter(
            "memory_evictions",
            "Objects evicted from the memory tier.",
            m.evictions,
        )?;
        f.gauge(
            "memory_fills_in_flight",
            "Responses being stored into the memory tier now.",
            gauge_of(m.in_flight),
        )?;
        f.gauge(
            "memory_files",
            "Large bodies held in memory files (open descriptors), sent with sendfile.",
            gauge_of(m.files),
        )?;

        if let Some(shared) = s.shared {
            let c = &shared.counters;
            let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
            let cluster = shared.cluster();
            for (name, help, value) in [
                ("memcached_hits", "Verified memcached hits.", load(&c.hits)),
                (
                    "memcached_decodes_shared",
                    "Memcached hits served from a value another request had just decoded.",
                    load(&c.decodes_shared),
                ),
                (
                    "memcached_misses",
                    "Keys memcached did not have (or could not be asked for).",
                    load(&c.misses),
                ),
                (
                    "memcached_rejected",
                    "Values memcached returned that failed verification.",
                    load(&c.rejected),
                ),
                (
                    "memcached_writes",
                    "Entries written to memcached.",
                    load(&c.writes),
                ),
                (
                    "memcached_write_failures",
                    "Entries that could not be written to memcached.",
                    load(&c.write_failures),
                ),
                (
                    "memcached_writes_superseded",
                    "Entries not written to memcached because it held a newer answer for the key.",
                    load(&c.writes_superseded),
                ),
                (
                    "memcached_written_then_banned",
                    "Entries deleted from memcached right after they were written: a purge or \
                     ban learned of only then covers them.",
                    load(&c.written_then_banned),
                ),
                (
                    "memcached_purges_kept",
                    "Purges kept for the whole retention because an entry written after one \
                     could not be deleted from memcached.",
                    load(&c.purges_kept),
                ),
                (
                    "memcached_writes_judged_late",
                    "Entries written to memcached that could not be judged by the bans until a \
                     later read of the cluster's log got an answer.",
                    load(&c.writes_judged_late),
                ),
                (
                    "memcached_ejections",
                    "Times a memcached server was ejected.",
                    cluster.counters.ejections.load(Ordering::Relaxed),
                ),
                (
                    "fill_leases_claimed",
                    "Fills this node claimed for the cluster.",
                    load(&c.fills_claimed),
                ),
                (
                    "fill_leases_renewed",
                    "Renewals that kept the lease of a slow fill alive.",
                    load(&c.fill_leases_renewed),
                ),
                (
                    "fill_leases_lost",
                    "Fill leases found gone while their fill was in flight (purged, or lost with \
                     their server): the fill was not kept.",
                    load(&c.fill_leases_lost),
                ),
                (
                    "fill_lease_waits",
                    "Requests served by another node's fill after waiting for it.",
                    load(&c.fills_awaited),
                ),
                (
                    "fills_under_another_claim",
                    "Misses fetched while another claim held the URL's fill lease (a Range or \
                     validator miss): served, not kept.",
                    load(&c.fills_under_another_claim),
                ),
            ] {
                f.counter(name, help, value)?;
            }
            let servers = cluster.server_reports();
            let label = |name: &str| [("server", name.to_string())];
            f.gauges(
                "memcached_server_up",
                "1 while the memcached server is in service, 0 while it is ejected.",
                &servers
                    .iter()
                    .map(|v| (label(&v.name), i64::from(!v.ejected)))
                    .collect::<Vec<_>>(),
            )?;
            f.counters(
                "memcached_server_errors",
                "Failed operations on the memcached server, timeouts included.",
                &servers
                    .iter()
                    .map(|v| (label(&v.name), v.stats.errors))
                    .collect::<Vec<_>>(),
            )?;
            f.counters(
                "memcached_server_timeouts",
                "Operations on the memcached server that did not finish within op_timeout.",
                &servers
                    .iter()
                    .map(|v| (label(&v.name), v.stats.timeouts))
                    .collect::<Vec<_>>(),
            )?;
            f.gauges(
                "memcached_server_connections",
                "Connections open to the memcached server.",
                &servers
                    .iter()
                    .map(|v| (label(&v.name), gauge_of(v.open_connections)))
                    .collect::<Vec<_>>(),
            )?;
            f.histograms(
                "memcached_server_latency_seconds",
                "Time of completed operations on the memcached server.",
                &servers
                    .iter()
                    .map(|v| {
                        (
                            label(&v.name),
                            Buckets::scaled(&v.stats.latency_micros, &LATENCY_BOUNDS_MICROS, 1e-6),
                        )
                    })
                    .collect::<Vec<_>>(),
            )?;
            f.histograms(
                "memcached_batch_keys",
                "Keys carried by each multi-get sent to the memcached server.",
                &servers
                    .iter()
                    .map(|v| {
                        (
                            label(&v.name),
                            Buckets::scaled(&v.stats.batch_keys, &BATCH_BOUNDS, 1.0),
                        )
                    })
                    .collect::<Vec<_>>(),
            )?;
        }

        let now = Instant::now();
        let replicas = s.replicas.load();
        let backends = &replicas.backends;
        let label = |b: &crate::upstream::backend::Backend| {
            [("backend", b.name.clone()), ("address", b.address.clone())]
        };
        let totals: Vec<_> = backends.iter().map(|b| b.totals()).collect();
        f.counters(
            "backend_requests",
            "Requests sent to the origin backend (a retry counts where it went).",
            &backends
                .iter()
                .zip(&totals)
                .map(|(b, t)| (label(b), t.requests))
                .collect::<Vec<_>>(),
        )?;
        f.counters(
            "backend_failures",
            "Connect errors, upstream errors and 5xx answers of the backend.",
            &backends
                .iter()
                .zip(&totals)
                .map(|(b, t)| (label(b), t.failures))
                .collect::<Vec<_>>(),
        )?;
        f.counters(
            "backend_ejections",
            "Passive ejections of the backend.",
            &backends
                .iter()
                .zip(&totals)
                .map(|(b, t)| (label(b), t.ejections))
                .collect::<Vec<_>>(),
        )?;
        f.gauges(
            "backend_up",
            "1 while the backend is offered traffic (health check up, not ejected).",
            &backends
                .iter()
                .map(|b| (label(b), i64::from(b.is_available(now))))
                .collect::<Vec<_>>(),
        )?;
        f.gauges(
            "backend_health_check_up",
            "The active health check's verdict (1 without active checks).",
            &backends
                .iter()
                .map(|b| (label(b), i64::from(b.active_up())))
                .collect::<Vec<_>>(),
        )?;
        f.gauges(
            "backend_ejected",
            "1 while passive checks keep the backend out.",
            &backends
                .iter()
                .map(|b| (label(b), i64::from(b.is_ejected(now))))
                .collect::<Vec<_>>(),
        )?;
        f.gauges(
            "backend_in_flight",
            "Requests sent to the backend and not yet finished (its queue).",
            &backends
                .iter()
                .map(|b| (label(b), gauge_of(b.in_flight())))
                .collect::<Vec<_>>(),
        )?;
        f.gauges(
            "backend_queued",
            "Requests waiting for one of the backend's max_in_flight slots.",
            &backends
                .iter()
                .map(|b| (label(b), gauge_of(b.queued())))
                .collect::<Vec<_>>(),
        )?;
        f.histograms(
            "backend_response_seconds",
            "Time from sending a request to the backend to its response head.",
            &backends
                .iter()
                .map(|b| (label(b), Buckets::from(&b.response_times())))
                .collect::<Vec<_>>(),
        )?;
        drop(replicas);
        f.counters(
            "backend_lookup_failures",
            "Look-ups of a backend's host name that failed or found no address (its addresses kept).",
            &s.replicas
                .lookup_failures()
                .into_iter()
                .filter_map(|(name, count)| Some(([("backend", name)], count?)))
                .collect::<Vec<_>>(),
        )?;

        let i = s.invalidator.stats();
        f.counters(
            "invalidations",
            "Purges and bans asked of this node (PURGE, unsafe methods, the admin API).",
            &[
                ([("kind", "purge")], i.issued.saturating_sub(i.issued_bans)),
                ([("kind", "ban")], i.issued_bans),
            ],
        )?;
        f.counter(
            "invalidations_learned",
            "Purges and bans learned from other nodes through the cluster's log.",
            i.learned,
        )?;
        f.gauge(
            "invalidation_rules",
            "Purge and ban rules held.",
            gauge_of(i.rules),
        )?;
        f.counters(
            "invalidation_log_reads",
            "Reads of the cluster's invalidation log.",
            &[
                ([("result", "ok")], i.polls),
                ([("result", "failed")], i.failed_polls),
            ],
        )?;
        f.gauges(
            "invalidation_pending",
            "Publications and deletes not yet on every server (retried).",
            &[
                ([("kind", "publications")], gauge_of(i.pending_publications)),
                ([("kind", "deletes")], gauge_of(i.pending_deletes)),
            ],
        )?;
        Ok(())
    }
}
