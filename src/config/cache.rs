//! `[cache]`: the memory tier's size, what is stored and for how long, the names this cache
//! answers to, and who may PURGE. `[cache.memcached]` and `[cache.compression]` have modules of
//! their own.

use super::address_range::AddressRange;
use super::compression::{CompressionConfig, CompressionSection};
use super::memcached::{MemcachedConfig, MemcachedSection};
use super::partial::{PartialConfig, PartialSection};
use super::{check, compression, memcached, partial, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// `[cache]` as written.
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
    pub memcached: MemcachedSection,
    /// gzip on store.
    #[serde(default)]
    pub compression: CompressionSection,
    /// Partial content (206) stored and combined.
    #[serde(default)]
    pub partial: PartialSection,
}

/// One `[[cache.ttl_overrides]]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtlOverrideEntry {
    pub prefix: String,
    pub ttl: String,
}

/// A freshness override for paths under a prefix.
#[derive(Debug, Clone)]
pub struct TtlOverride {
    pub prefix: String,
    pub ttl: Duration,
}

/// Cache storage and policy settings.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub enabled: bool,
    pub memory_size: usize,
    pub max_object_size: usize,
    pub estimated_objects: usize,
    pub default_ttl: Option<Duration>,
    pub heuristic_fraction: f64,
    pub heuristic_max: Duration,
    pub lock_timeout: Duration,
    pub status_name: String,
    pub ttl_overrides: Vec<TtlOverride>,
    /// Our targeted cache-control field name, lowercase (RFC 9213).
    pub targeted_field: String,
    /// Whether targeted fields are passed on to clients.
    pub forward_targeted_fields: bool,
    /// The shared memcached tier, if servers are configured.
    pub memcached: Option<MemcachedConfig>,
    /// Whether a client's `no-cache` forces revalidation (RFC 9111 allows ignoring it).
    pub honor_client_no_cache: bool,
    /// Stale responses without their own `stale-if-error` may be served this long past their
    /// freshness when the origin fails (zero: never). `must-revalidate` still forbids it.
    pub stale_if_error_grace: Duration,
    /// gzip on store (`[cache.compression]`).
    pub compression: CompressionConfig,
    /// Client addresses allowed to send PURGE (default: loopback only); others get 405.
    pub purge_from: Vec<AddressRange>,
    /// Partial content (`[cache.partial]`).
    pub partial: PartialConfig,
}

/// The largest delta-seconds value a cache must handle (RFC 9111 §1.2.2).
const MAX_DELTA_SECONDS: Duration = Duration::from_secs(1 << 31);

/// Validates the section and its subsections.
pub fn validate(section: &CacheSection) -> Result<CacheConfig, ConfigError> {
    let memory_size = check::size("cache.memory_size", &section.memory_size, 256 << 20)?;
    if memory_size < 1 << 20 {
        return Err(ConfigError::new(
            "cache.memory_size",
            "must be at least 1MiB",
        ));
    }
    let max_object_size = check::size("cache.max_object_size", &section.max_object_size, 16 << 20)?;
    if max_object_size == 0 {
        return Err(ConfigError::new(
            "cache.max_object_size",
            "must be greater than zero",
        ));
    }
    if max_object_size > memory_size {
        return Err(ConfigError::new(
            "cache.max_object_size",
            format!(
                "{max_object_size} bytes is larger than cache.memory_size ({memory_size} bytes)"
            ),
        ));
    }
    // sized for 8 KB objects unless told; TinyUFO only uses the estimate to size its tables
    let estimated_objects = check::integer(
        "cache.estimated_objects",
        section.estimated_objects,
        (memory_size / 8192).clamp(1024, 4_000_000),
        1..=i64::MAX,
    )?;
    let default_ttl = section
        .default_ttl
        .as_deref()
        .map(|ttl| check::duration_value("cache.default_ttl", ttl))
        .transpose()?;
    let heuristic_fraction = section.heuristic_fraction.unwrap_or(0.1);
    if !(0.0..=1.0).contains(&heuristic_fraction) {
        return Err(ConfigError::new(
            "cache.heuristic_fraction",
            format!("{heuristic_fraction} is outside 0.0..=1.0"),
        ));
    }
    let status_name = section
        .status_name
        .clone()
        .unwrap_or_else(|| "lacquer".into());
    check::http_token("cache.status_name", &status_name)?;
    let targeted_field = check::header_name(
        "cache.targeted_field",
        section
            .targeted_field
            .as_deref()
            .unwrap_or("lacquer-cache-control"),
    )?;
    Ok(CacheConfig {
        enabled: section.enabled.unwrap_or(true),
        memory_size,
        max_object_size,
        estimated_objects,
        default_ttl,
        heuristic_fraction,
        heuristic_max: check::duration(
            "cache.heuristic_max",
            &section.heuristic_max,
            Duration::from_secs(86_400),
        )?,
        lock_timeout: check::positive_duration(
            "cache.lock_timeout",
            &section.lock_timeout,
            Duration::from_secs(10),
        )?,
        status_name,
        ttl_overrides: ttl_overrides(&section.ttl_overrides)?,
        targeted_field,
        forward_targeted_fields: section.forward_targeted_fields.unwrap_or(false),
        memcached: memcached::validate(&section.memcached)?,
        honor_client_no_cache: section.honor_client_no_cache.unwrap_or(true),
        stale_if_error_grace: check::whole_seconds(
            "cache.stale_if_error_grace",
            &section.stale_if_error_grace,
            Duration::ZERO,
            MAX_DELTA_SECONDS,
            "HTTP expresses it in delta-seconds",
        )?,
        compression: compression::validate(&section.compression)?,
        purge_from: purge_from(&section.purge_from)?,
        partial: partial::validate(&section.partial)?,
    })
}

/// `[[cache.ttl_overrides]]`: each prefix a path, each TTL a duration.
fn ttl_overrides(entries: &Option<Vec<TtlOverrideEntry>>) -> Result<Vec<TtlOverride>, ConfigError> {
    let mut overrides = Vec::new();
    for (i, entry) in entries.iter().flatten().enumerate() {
        let key = format!("cache.ttl_overrides[{i}]");
        if !entry.prefix.starts_with('/') {
            return Err(ConfigError::new(
                format!("{key}.prefix"),
                format!("\"{}\" must start with '/'", entry.prefix),
            ));
        }
        overrides.push(TtlOverride {
            prefix: entry.prefix.clone(),
            ttl: check::duration_value(&format!("{key}.ttl"), &entry.ttl)?,
        });
    }
    Ok(overrides)
}

/// `cache.purge_from`: loopback only unless configured, as Varnish's customary `acl purge`.
fn purge_from(value: &Option<Vec<String>>) -> Result<Vec<AddressRange>, ConfigError> {
    let default = ["127.0.0.0/8".to_string(), "::1".to_string()];
    let entries = value.as_deref().unwrap_or(&default);
    entries
        .iter()
        .enumerate()
        .map(|(i, text)| {
            AddressRange::parse(text)
                .map_err(|reason| ConfigError::new(format!("cache.purge_from[{i}]"), reason))
        })
        .collect()
}
