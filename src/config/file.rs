//! The TOML file as written by the operator, before validation.
//!
//! Every field is optional so that the file, the CLI flags and the embedded defaults can be layered;
//! `deny_unknown_fields` makes a typo (`memry_size`) a start-up error that names the key instead of a
//! silently ignored line.

use serde::Deserialize;

/// The whole config file. Field names are the TOML keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Plain-text listening addresses (HTTP/1.1 and, unless disabled, h2c prior knowledge).
    pub listen: Option<Vec<String>>,
    /// The origin, `HOST:PORT`.
    pub upstream: Option<String>,
    /// Several origin replicas (`[[upstreams]]`), instead of `upstream`.
    pub upstreams: Option<Vec<super::balancing::UpstreamEntry>>,
    /// Worker threads; defaults to the number of cores.
    pub threads: Option<i64>,
    /// How long SIGTERM waits before it starts draining, e.g. `"5s"`.
    pub grace_period: Option<String>,
    /// How long draining may take after the grace period.
    pub shutdown_timeout: Option<String>,
    /// Upstream keep-alive pool size (idle connections kept per process).
    pub upstream_keepalive_pool: Option<i64>,
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub tls: TlsSection,
    #[serde(default)]
    pub proxy: ProxySection,
    #[serde(default)]
    pub cache: CacheSection,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub admin: AdminSection,
    /// `[balancer]`: algorithm, health checks, retries, timeouts.
    #[serde(default)]
    pub balancer: super::balancing::BalancerSection,
    /// `[fairness]`: per-client cap on requests going upstream.
    #[serde(default)]
    pub fairness: super::balancing::FairnessSection,
}

/// `[admin]`: the operator endpoint (stats), on its own listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Address of the admin listener; absent means no admin endpoint.
    pub listen: Option<String>,
}

/// `[server]`: the client-facing side.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Accept HTTP/2 prior knowledge (h2c) on plain listeners.
    pub h2c: Option<bool>,
    /// Per-connection write buffer for clients, e.g. "16KiB".
    pub write_buffer: Option<String>,
}

/// `[tls]`: TLS listeners with rustls; h2 is offered through ALPN.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub listen: Option<Vec<String>>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// `[proxy]`: how requests are forwarded to the origin.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySection {
    /// Add a `Via` header to requests and responses.
    pub via: Option<bool>,
    /// The pseudonym used in `Via`.
    pub via_name: Option<String>,
    /// `"x-forwarded-for"`, `"forwarded"`, `"both"` or `"none"`.
    pub forwarded: Option<String>,
    pub connect_timeout: Option<String>,
    pub read_timeout: Option<String>,
    pub write_timeout: Option<String>,
    /// How long an idle pooled upstream connection is kept.
    pub idle_timeout: Option<String>,
}

/// `[cache]`: storage and policy.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    pub enabled: Option<bool>,
    /// Hard bound on body + metadata bytes held by the memory tier, e.g. `"512MiB"`.
    pub memory_size: Option<String>,
    /// Larger responses pass through uncached.
    pub max_object_size: Option<String>,
    /// Expected number of objects; sizes TinyUFO's admission sketch.
    pub estimated_objects: Option<i64>,
    /// Freshness for responses that carry none (off when absent: such responses are not cached).
    pub default_ttl: Option<String>,
    /// Fraction of (Date - Last-Modified) used as heuristic freshness.
    pub heuristic_fraction: Option<f64>,
    /// Upper bound for heuristic freshness.
    pub heuristic_max: Option<String>,
    /// How long concurrent misses wait for the one origin fetch before going themselves.
    pub lock_timeout: Option<String>,
    /// The name this cache uses in `Cache-Status`.
    pub status_name: Option<String>,
    /// The cache-control field targeted at this cache (RFC 9213), obeyed before
    /// `CDN-Cache-Control` and `Cache-Control`.
    pub targeted_field: Option<String>,
    /// Forward the targeted fields (ours and `CDN-Cache-Control`) to clients.
    pub forward_targeted_fields: Option<bool>,
    /// Per path-prefix TTL overrides, off unless listed.
    pub ttl_overrides: Option<Vec<TtlOverrideEntry>>,
    /// Whether a client's `no-cache` forces revalidation with the origin.
    pub honor_client_no_cache: Option<bool>,
    /// How long a stale response may be served when the origin fails and the response has no
    /// `stale-if-error` of its own (RFC 5861 grace; off by default).
    pub stale_if_error_grace: Option<String>,
    /// Client addresses (`10.0.0.0/8`, `::1`) allowed to send PURGE.
    pub purge_from: Option<Vec<String>>,
    /// The shared memcached tier.
    #[serde(default)]
    pub memcached: super::memcached::MemcachedSection,
    /// gzip on store.
    #[serde(default)]
    pub compression: super::compression::CompressionSection,
}

/// One `[[cache.ttl_overrides]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtlOverrideEntry {
    pub prefix: String,
    pub ttl: String,
}

/// `[log]`: access and error logging.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `"stdout"`, `"stderr"`, `"off"` or a file path.
    pub access: Option<String>,
    /// `"common"` or `"json"`.
    pub format: Option<String>,
    /// Error log level: `error`, `warn`, `info`, `debug`, `trace`.
    pub level: Option<String>,
}
