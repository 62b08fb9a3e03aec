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
    /// What responses tell about the cache: `"status"` (`Cache-Status`), `"tier"` (`Cache-Status`
    /// naming the tier of a hit) or `"off"` (no `Cache-Status`).
    pub announce: Option<String>,
    /// The cache-control field targeted at this cache (RFC 9213), obeyed before
    /// `CDN-Cache-Control` and `Cache-Control`.
    pub targeted_field: Option<String>,
    /// Forward the targeted fields (ours and `CDN-Cache-Control`) to clients.
    pub forward_targeted_fields: Option<bool>,
    /// The fields removed from responses to clients (default: our targeted field alone).
    pub strip_targeted_fields: Option<Vec<String>>,
    /// Store responses that carry `Set-Cookie` (strict RFC 9111; off by default).
    pub store_set_cookie: Option<bool>,
    /// Reuse a POST response for later GETs when it says it is the URL's representation
    /// (RFC 9111 §4, RFC 9110 §9.3.3; off by default).
    pub reuse_post_responses: Option<bool>,
    /// Per path-prefix TTL overrides, off unless listed.
    pub ttl_overrides: Option<Vec<TtlOverrideEntry>>,
    /// Whether a client's `no-cache` forces revalidation with the origin.
    pub honor_client_no_cache: Option<bool>,
    /// How long a stale response may be served when the origin fails and the response has no
    /// `stale-if-error` of its own (RFC 9111 §4.2.4; default [`DEFAULT_STALE_IF_ERROR_GRACE`]).
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

/// What responses tell clients about the cache (`cache.announce`; mod_mcpage's `announce`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announce {
    /// `Cache-Status` (RFC 9211): hit or why the origin was asked.
    Status,
    /// `Cache-Status`, a hit also naming the tier it was read from (`detail=memcached`).
    Tier,
    /// No `Cache-Status` (the access log still has it all).
    Off,
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
    /// What responses say about the cache (`cache.announce`).
    pub announce: Announce,
    pub ttl_overrides: Vec<TtlOverride>,
    /// Our targeted cache-control field name, lowercase (RFC 9213).
    pub targeted_field: String,
    /// Whether targeted fields are passed on to clients.
    pub forward_targeted_fields: bool,
    /// The fields removed from responses to clients (lowercase names): our targeted field unless
    /// configured, none with `forward_targeted_fields`.
    pub strip_targeted_fields: Vec<String>,
    /// Responses with `Set-Cookie` are stored and served to every client (strict RFC 9111).
    pub store_set_cookie: bool,
    /// POST responses whose `Content-Location` is the request URL, with explicit freshness, are
    /// stored for later GETs of that URL.
    pub reuse_post_responses: bool,
    /// The shared memcached tier, if servers are configured.
    pub memcached: Option<MemcachedConfig>,
    /// Whether a client's `no-cache` forces revalidation (RFC 9111 allows ignoring it).
    pub honor_client_no_cache: bool,
    /// Stale responses without their own `stale-if-error` may be served this long past their
    /// freshness when the origin fails (zero: never). `must-revalidate`, `proxy-revalidate`,
    /// `s-maxage` and `no-cache` forbid it.
    pub stale_if_error_grace: Duration,
    /// gzip on store (`[cache.compression]`).
    pub compression: CompressionConfig,
    /// Client addresses allowed to send PURGE (default: loopback only); others get 405.
    pub purge_from: Vec<AddressRange>,
    /// Partial content (`[cache.partial]`).
    pub partial: PartialConfig,
}

/// How long past its freshness a stored response is served when the origin fails (refuses,
/// closes, times out, answers 500/502/503/504) and nothing forbids it (RFC 9111 §4.2.4).
///
/// Five minutes, not Varnish's 10 s: here the grace is used only when the origin has just been
/// asked and failed (a healthy origin is always asked first, so a long grace never delays an
/// update), and an application server's restart or a deploy takes tens of seconds to minutes,
/// which 10 s does not cover. It stays short enough that an outage shows within minutes: each
/// stale answer says `fwd=stale` with the origin's status in `Cache-Status` and the log, and
/// after the grace the error passes through. The grace also extends how long an entry is kept
/// in memcached past its freshness (by at most this much).
pub const DEFAULT_STALE_IF_ERROR_GRACE: Duration = Duration::from_secs(300);

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
    let announce = check::one_of(
        "cache.announce",
        section.announce.as_deref(),
        "status",
        &[
            ("status", Announce::Status),
            ("tier", Announce::Tier),
            ("off", Announce::Off),
        ],
    )?;
    let targeted_field = check::header_name(
        "cache.targeted_field",
        section
            .targeted_field
            .as_deref()
            .unwrap_or("lacquer-cache-control"),
    )?;
    let forward_targeted_fields = section.forward_targeted_fields.unwrap_or(false);
    let strip_targeted_fields = strip_targeted_fields(
        &section.strip_targeted_fields,
        forward_targeted_fields,
        &targeted_field,
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
        announce,
        ttl_overrides: ttl_overrides(&section.ttl_overrides)?,
        targeted_field,
        forward_targeted_fields,
        strip_targeted_fields,
        store_set_cookie: section.store_set_cookie.unwrap_or(false),
        reuse_post_responses: section.reuse_post_responses.unwrap_or(false),
        memcached: memcached::validate(&section.memcached)?,
        honor_client_no_cache: section.honor_client_no_cache.unwrap_or(true),
        stale_if_error_grace: check::whole_seconds(
            "cache.stale_if_error_grace",
            &section.stale_if_error_grace,
            DEFAULT_STALE_IF_ERROR_GRACE,
            MAX_DELTA_SECONDS,
            "HTTP expresses it in delta-seconds",
        )?,
        compression: compression::validate(&section.compression)?,
        purge_from: purge_from(&section.purge_from)?,
        partial: partial::validate(&section.partial)?,
    })
}

/// `cache.strip_targeted_fields`: header names, lowercased; by default our own targeted field
/// alone (`CDN-Cache-Control` is meant for every CDN on the path, so it is passed on), none when
/// `forward_targeted_fields = true`, which a list contradicts.
fn strip_targeted_fields(
    value: &Option<Vec<String>>,
    forward_targeted_fields: bool,
    targeted_field: &str,
) -> Result<Vec<String>, ConfigError> {
    let key = "cache.strip_targeted_fields";
    match value {
        None if forward_targeted_fields => Ok(Vec::new()),
        None => Ok(vec![targeted_field.to_string()]),
        Some(list) if forward_targeted_fields && !list.is_empty() => Err(ConfigError::new(
            key,
            "cannot list fields to strip while cache.forward_targeted_fields = true",
        )),
        Some(list) => list
            .iter()
            .enumerate()
            .map(|(i, name)| check::header_name(&format!("{key}[{i}]"), name))
            .collect(),
    }
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
