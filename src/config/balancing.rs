//! `[[upstreams]]`, `[balancer]` and `[fairness]`: the origin replicas, how requests are spread
//! over them, how a sick replica is noticed, and how much one client may have in flight.
//!
//! The single top-level `upstream = "host:port"` (and `--upstream`) stays valid: it is the
//! one-backend case of the same model. Giving both `upstream` and `[[upstreams]]` is an error,
//! because an operator reading either one alone would be misled.

use super::units::parse_duration;
use super::{resolve_addr, ConfigError, ProxyConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// One `[[upstreams]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamEntry {
    /// `HOST:PORT`, resolved once at start-up.
    pub address: String,
    /// Relative share of traffic; default 1.
    pub weight: Option<i64>,
}

/// `[balancer]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalancerSection {
    /// `round_robin`, `least_loaded`, `consistent` or `random_two_choices`.
    pub algorithm: Option<String>,
    #[serde(default)]
    pub health_check: HealthCheckSection,
    #[serde(default)]
    pub passive: PassiveSection,
    #[serde(default)]
    pub retries: RetriesSection,
    #[serde(default)]
    pub timeouts: TimeoutsSection,
}

/// `[balancer.health_check]` as written: active probes, on when `path` is set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckSection {
    pub path: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub rise: Option<i64>,
    pub fall: Option<i64>,
    pub expect_status: Option<i64>,
    /// `Host` header sent with probes; default the backend address.
    pub host: Option<String>,
}

/// `[balancer.passive]` as written: outlier ejection from live traffic.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassiveSection {
    pub enabled: Option<bool>,
    pub failures: Option<i64>,
    pub window: Option<String>,
    pub cooldown: Option<String>,
    /// Whether 5xx responses count as failures (connect errors and timeouts always do).
    pub count_5xx: Option<bool>,
}

/// `[balancer.retries]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetriesSection {
    /// Further attempts after the first, each on another backend when one is left.
    pub attempts: Option<i64>,
}

/// `[balancer.timeouts]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutsSection {
    pub connect: Option<String>,
    pub first_byte: Option<String>,
    pub idle: Option<String>,
    pub total: Option<String>,
}

/// `[fairness]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairnessSection {
    /// Requests one client may have going upstream at once; 0 or absent = no cap.
    pub max_in_flight: Option<i64>,
    /// Identify clients by this request header (e.g. `x-api-key`) when present, else by address.
    pub key_header: Option<String>,
    /// `reject` (429 at once) or `queue` (wait for a slot, bounded).
    pub on_excess: Option<String>,
    /// Waiting requests per client before further ones are rejected (queue mode).
    pub queue_size: Option<i64>,
    /// How long a queued request waits before it is rejected.
    pub queue_timeout: Option<String>,
    /// The `Retry-After` value sent with 429, in whole seconds.
    pub retry_after: Option<String>,
}

/// How the next backend is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Each backend in turn, `weight` turns per round.
    RoundRobin,
    /// The backend with the fewest requests in flight; ties go to the higher weight.
    LeastLoaded,
    /// Rendezvous hash of the cache key: each URL prefers one backend.
    Consistent,
    /// Two random backends (by weight), the less loaded of them.
    RandomTwoChoices,
}

/// One validated backend.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// As written, for logs and the `Host` fallback.
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
}

/// Validated active health checks.
#[derive(Debug, Clone)]
pub struct ActiveHealthConfig {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    pub expect_status: u16,
    pub host: Option<String>,
}

/// Validated passive outlier ejection.
#[derive(Debug, Clone)]
pub struct PassiveConfig {
    pub enabled: bool,
    pub failures: u32,
    pub window: Duration,
    pub cooldown: Duration,
    pub count_5xx: bool,
}

/// Validated per-upstream timeouts.
#[derive(Debug, Clone)]
pub struct TimeoutConfig {
    pub connect: Duration,
    pub first_byte: Duration,
    pub idle: Duration,
    pub total: Duration,
}

/// Everything the upstream pool needs.
#[derive(Debug, Clone)]
pub struct BalancerConfig {
    pub backends: Vec<BackendConfig>,
    pub algorithm: Algorithm,
    pub health_check: Option<ActiveHealthConfig>,
    pub passive: PassiveConfig,
    /// Further attempts after the first.
    pub retries: u32,
    pub timeouts: TimeoutConfig,
}

/// What happens to a request over the per-client cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExcessPolicy {
    Reject,
    Queue,
}

/// Validated per-client fairness.
#[derive(Debug, Clone)]
pub struct FairnessConfig {
    pub max_in_flight: usize,
    /// Lowercase header name.
    pub key_header: Option<String>,
    pub on_excess: ExcessPolicy,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub retry_after_secs: u64,
}

fn duration(key: &str, value: &Option<String>, default: &str) -> Result<Duration, ConfigError> {
    parse_duration(value.as_deref().unwrap_or(default)).map_err(|e| ConfigError::new(key, e))
}

fn positive(key: &str, value: &Option<String>, default: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, value, default)?;
    if d.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(d)
}

fn ranged(
    key: &str,
    value: Option<i64>,
    default: i64,
    min: i64,
    max: i64,
) -> Result<i64, ConfigError> {
    let v = value.unwrap_or(default);
    if v < min || v > max {
        return Err(ConfigError::new(
            key,
            format!("{v} is outside the allowed range {min}..={max}"),
        ));
    }
    Ok(v)
}

/// The backends: `[[upstreams]]`, or the single `upstream`, never both.
pub fn validate_backends(
    single: &Option<String>,
    list: &Option<Vec<UpstreamEntry>>,
) -> Result<Vec<BackendConfig>, ConfigError> {
    match (single, list) {
        (Some(_), Some(_)) => Err(ConfigError::new(
            "upstreams",
            "give either `upstream` or `[[upstreams]]`, not both",
        )),
        (Some(name), None) => Ok(vec![BackendConfig {
            name: name.clone(),
            addr: resolve_addr("upstream", name)?,
            weight: 1,
        }]),
        (None, Some(list)) if list.is_empty() => {
            Err(ConfigError::new("upstreams", "needs at least one entry"))
        }
        (None, Some(list)) => {
            let mut backends: Vec<BackendConfig> = Vec::with_capacity(list.len());
            for (i, entry) in list.iter().enumerate() {
                let addr = resolve_addr(&format!("upstreams[{i}].address"), &entry.address)?;
                if backends.iter().any(|b| b.addr == addr) {
                    return Err(ConfigError::new(
                        format!("upstreams[{i}].address"),
                        format!("\"{}\" is listed twice", entry.address),
                    ));
                }
                let weight = ranged(&format!("upstreams[{i}].weight"), entry.weight, 1, 1, 1000)?;
                backends.push(BackendConfig {
                    name: entry.address.clone(),
                    addr,
                    weight: weight as u32,
                });
            }
            Ok(backends)
        }
        (None, None) => Err(ConfigError::new(
            "upstream",
            "no origin configured (set `upstream = \"HOST:PORT\"`, `[[upstreams]]` or pass --upstream)",
        )),
    }
}

/// Validates `[balancer]`; the timeouts default to the `[proxy]` ones so older files keep working.
pub fn validate_balancer(
    section: &BalancerSection,
    backends: Vec<BackendConfig>,
    proxy: &ProxyConfig,
) -> Result<BalancerConfig, ConfigError> {
    let algorithm = match section.algorithm.as_deref().unwrap_or("round_robin") {
        "round_robin" => Algorithm::RoundRobin,
        "least_loaded" => Algorithm::LeastLoaded,
        "consistent" => Algorithm::Consistent,
        "random_two_choices" => Algorithm::RandomTwoChoices,
        other => {
            return Err(ConfigError::new(
                "balancer.algorithm",
                format!(
                    "\"{other}\" is not one of round_robin, least_loaded, consistent, random_two_choices"
                ),
            ))
        }
    };
    let hc = &section.health_check;
    let health_check = match &hc.path {
        None => {
            let stray = hc.interval.is_some()
                || hc.timeout.is_some()
                || hc.rise.is_some()
                || hc.fall.is_some()
                || hc.expect_status.is_some()
                || hc.host.is_some();
            if stray {
                return Err(ConfigError::new(
                    "balancer.health_check.path",
                    "required when other health_check keys are set (active checks probe this path)",
                ));
            }
            None
        }
        Some(path) => {
            if !path.starts_with('/') || path.bytes().any(|b| b <= b' ' || b == 0x7f) {
                return Err(ConfigError::new(
                    "balancer.health_check.path",
                    format!("\"{path}\" must start with / and contain no spaces or controls"),
                ));
            }
            let interval = positive("balancer.health_check.interval", &hc.interval, "2s")?;
            let timeout = positive("balancer.health_check.timeout", &hc.timeout, "1s")?;
            if timeout > interval {
                return Err(ConfigError::new(
                    "balancer.health_check.timeout",
                    "must not be longer than balancer.health_check.interval",
                ));
            }
            Some(ActiveHealthConfig {
                path: path.clone(),
                interval,
                timeout,
                rise: ranged("balancer.health_check.rise", hc.rise, 2, 1, 100)? as u32,
                fall: ranged("balancer.health_check.fall", hc.fall, 3, 1, 100)? as u32,
                expect_status: ranged(
                    "balancer.health_check.expect_status",
                    hc.expect_status,
                    200,
                    100,
                    599,
                )? as u16,
                host: hc.host.clone(),
            })
        }
    };
    let p = &section.passive;
    let passive = PassiveConfig {
        enabled: p.enabled.unwrap_or(true),
        failures: ranged("balancer.passive.failures", p.failures, 5, 1, 10_000)? as u32,
        window: positive("balancer.passive.window", &p.window, "10s")?,
        cooldown: positive("balancer.passive.cooldown", &p.cooldown, "10s")?,
        count_5xx: p.count_5xx.unwrap_or(true),
    };
    let retries = ranged(
        "balancer.retries.attempts",
        section.retries.attempts,
        2,
        0,
        10,
    )? as u32;
    let t = &section.timeouts;
    let read_default = humantime_like(proxy.read_timeout);
    let timeouts = TimeoutConfig {
        connect: positive(
            "balancer.timeouts.connect",
            &t.connect,
            &humantime_like(proxy.connect_timeout),
        )?,
        first_byte: positive("balancer.timeouts.first_byte", &t.first_byte, &read_default)?,
        idle: positive("balancer.timeouts.idle", &t.idle, &read_default)?,
        total: positive("balancer.timeouts.total", &t.total, "300s")?,
    };
    if timeouts.total < timeouts.connect {
        return Err(ConfigError::new(
            "balancer.timeouts.total",
            "must not be shorter than balancer.timeouts.connect",
        ));
    }
    Ok(BalancerConfig {
        backends,
        algorithm,
        health_check,
        passive,
        retries,
        timeouts,
    })
}

/// A duration as milliseconds text the unit parser accepts.
fn humantime_like(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Validates `[fairness]`; `None` when no cap is set.
pub fn validate_fairness(section: &FairnessSection) -> Result<Option<FairnessConfig>, ConfigError> {
    let max = ranged(
        "fairness.max_in_flight",
        section.max_in_flight,
        0,
        0,
        1_000_000,
    )?;
    let on_excess = match section.on_excess.as_deref().unwrap_or("reject") {
        "reject" => ExcessPolicy::Reject,
        "queue" => ExcessPolicy::Queue,
        other => {
            return Err(ConfigError::new(
                "fairness.on_excess",
                format!("\"{other}\" is not one of reject, queue"),
            ))
        }
    };
    let key_header = match &section.key_header {
        None => None,
        Some(name) => {
            let lower = name.to_ascii_lowercase();
            if http::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
                return Err(ConfigError::new(
                    "fairness.key_header",
                    format!("\"{name}\" is not a valid header name"),
                ));
            }
            Some(lower)
        }
    };
    let queue_size = ranged("fairness.queue_size", section.queue_size, 16, 0, 1_000_000)? as usize;
    let queue_timeout = positive("fairness.queue_timeout", &section.queue_timeout, "5s")?;
    let retry_after = duration("fairness.retry_after", &section.retry_after, "1s")?;
    if max == 0 {
        return Ok(None);
    }
    Ok(Some(FairnessConfig {
        max_in_flight: max as usize,
        key_header,
        on_excess,
        queue_size,
        queue_timeout,
        retry_after_secs: retry_after.as_secs().max(1),
    }))
}
