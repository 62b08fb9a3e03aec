//! `upstream`, `[[upstreams]]` and `[balancer]`: the origin replicas, how requests are spread
//! over them, how a sick replica is noticed, and how long an attempt may take.
//!
//! The single top-level `upstream = "host:port"` (and `--upstream`) stays valid: it is the
//! one-backend case of the same model. Giving both `upstream` and `[[upstreams]]` is an error,
//! because an operator reading either one alone would be misled.

use super::{check, ConfigError, ProxyConfig};
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
    /// The backend group a request rule (`backend_group`) may send requests to.
    pub group: Option<String>,
    /// At most this many requests on the replica at once (others wait in `[balancer.queue]`).
    pub max_in_flight: Option<i64>,
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
    #[serde(default)]
    pub queue: QueueSection,
}

/// `[balancer.queue]` as written: where requests wait for a backend at its `max_in_flight`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// Requests that may wait per backend; one more is answered 503.
    pub length: Option<i64>,
    /// How long a request may wait; then 503.
    pub timeout: Option<String>,
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
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// As written, for logs and the `Host` fallback.
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
    /// The backend group (`[[rules]]` `backend_group` sends requests to one); `None`: the
    /// default pool.
    pub group: Option<String>,
    /// At most this many requests at once (`None`: no limit).
    pub max_in_flight: Option<u32>,
}

/// Validated `[balancer.queue]`.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    pub length: u32,
    pub timeout: Duration,
}

/// Validated active health checks.
#[derive(Debug, Clone, PartialEq)]
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
    /// The queue of each backend with a `max_in_flight`.
    pub queue: QueueConfig,
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
            addr: check::resolved_addr("upstream", name)?,
            weight: 1,
            group: None,
            max_in_flight: None,
        }]),
        (None, Some(list)) if list.is_empty() => {
            Err(ConfigError::new("upstreams", "needs at least one entry"))
        }
        (None, Some(list)) => {
            let mut backends: Vec<BackendConfig> = Vec::with_capacity(list.len());
            for (i, entry) in list.iter().enumerate() {
                let addr =
                    check::resolved_addr(&format!("upstreams[{i}].address"), &entry.address)?;
                if backends.iter().any(|b| b.addr == addr) {
                    return Err(ConfigError::new(
                        format!("upstreams[{i}].address"),
                        format!("\"{}\" is listed twice", entry.address),
                    ));
                }
                backends.push(BackendConfig {
                    name: entry.address.clone(),
                    addr,
                    weight: check::integer(
                        &format!("upstreams[{i}].weight"),
                        entry.weight,
                        1,
                        1..=1000,
                    )?,
                    group: group(i, &entry.group)?,
                    max_in_flight: entry
                        .max_in_flight
                        .map(|n| {
                            check::integer(
                                &format!("upstreams[{i}].max_in_flight"),
                                Some(n),
                                1,
                                1..=100_000,
                            )
                        })
                        .transpose()?,
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

/// `upstreams[i].group`: a name a rule's `backend_group` refers to.
fn group(i: usize, group: &Option<String>) -> Result<Option<String>, ConfigError> {
    match group {
        Some(name) if name.is_empty() => Err(ConfigError::new(
            format!("upstreams[{i}].group"),
            "must not be empty",
        )),
        _ => Ok(group.clone()),
    }
}

/// Validates `[balancer]`; the timeouts default to the `[proxy]` ones so older files keep working.
pub fn validate(
    section: &BalancerSection,
    backends: Vec<BackendConfig>,
    proxy: &ProxyConfig,
) -> Result<BalancerConfig, ConfigError> {
    let algorithm = check::one_of(
        "balancer.algorithm",
        section.algorithm.as_deref(),
        "round_robin",
        &[
            ("round_robin", Algorithm::RoundRobin),
            ("least_loaded", Algorithm::LeastLoaded),
            ("consistent", Algorithm::Consistent),
            ("random_two_choices", Algorithm::RandomTwoChoices),
        ],
    )?;
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
            let interval = check::positive_duration(
                "balancer.health_check.interval",
                &hc.interval,
                Duration::from_secs(2),
            )?;
            let timeout = check::positive_duration(
                "balancer.health_check.timeout",
                &hc.timeout,
                Duration::from_secs(1),
            )?;
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
                rise: check::integer("balancer.health_check.rise", hc.rise, 2, 1..=100)?,
                fall: check::integer("balancer.health_check.fall", hc.fall, 3, 1..=100)?,
                expect_status: check::integer(
                    "balancer.health_check.expect_status",
                    hc.expect_status,
                    200,
                    100..=599,
                )?,
                host: hc.host.clone(),
            })
        }
    };
    let p = &section.passive;
    let ten_seconds = Duration::from_secs(10);
    let passive = PassiveConfig {
        enabled: p.enabled.unwrap_or(true),
        failures: check::integer("balancer.passive.failures", p.failures, 5, 1..=10_000)?,
        window: check::positive_duration("balancer.passive.window", &p.window, ten_seconds)?,
        cooldown: check::positive_duration("balancer.passive.cooldown", &p.cooldown, ten_seconds)?,
        count_5xx: p.count_5xx.unwrap_or(true),
    };
    let retries = check::integer(
        "balancer.retries.attempts",
        section.retries.attempts,
        2,
        0..=10,
    )?;
    let t = &section.timeouts;
    let timeouts = TimeoutConfig {
        connect: check::positive_duration(
            "balancer.timeouts.connect",
            &t.connect,
            proxy.connect_timeout,
        )?,
        first_byte: check::positive_duration(
            "balancer.timeouts.first_byte",
            &t.first_byte,
            proxy.read_timeout,
        )?,
        idle: check::positive_duration("balancer.timeouts.idle", &t.idle, proxy.read_timeout)?,
        total: check::positive_duration(
            "balancer.timeouts.total",
            &t.total,
            Duration::from_secs(300),
        )?,
    };
    if timeouts.total < timeouts.connect {
        return Err(ConfigError::new(
            "balancer.timeouts.total",
            "must not be shorter than balancer.timeouts.connect",
        ));
    }
    let queue = QueueConfig {
        length: check::integer(
            "balancer.queue.length",
            section.queue.length,
            100,
            0..=1_000_000,
        )?,
        timeout: check::positive_duration(
            "balancer.queue.timeout",
            &section.queue.timeout,
            Duration::from_secs(10),
        )?,
    };
    Ok(BalancerConfig {
        backends,
        algorithm,
        health_check,
        passive,
        retries,
        timeouts,
        queue,
    })
}
