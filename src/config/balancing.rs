//! `upstream`, `[[upstreams]]` and `[balancer]`: the origin replicas, how requests are spread
//! over them, how a sick replica is noticed, and how long an attempt may take.
//!
//! The single top-level `upstream = "host:port"` (and `--upstream`) stays valid: it is the
//! one-backend case of the same model. Giving both `upstream` and `[[upstreams]]` is an error,
//! because an operator reading either one alone would be misled.

use super::origin_address::OriginAddress;
use super::{check, ConfigError, ProxyConfig};
use crate::upstream::tls::{OriginTls, OriginTlsFiles, TlsFile};
use serde::Deserialize;
use std::time::Duration;

/// One `[[upstreams]]` entry as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamEntry {
    /// `HOST:PORT` (a name is looked up again every `balancer.resolve_interval`, each of its
    /// addresses a replica); `https://HOST:PORT` for TLS to the origin (`http://` may be written
    /// too).
    pub address: String,
    /// TLS to this origin (the same as an `https://` address).
    pub tls: Option<bool>,
    /// The name sent as SNI and verified in the origin's certificate; default the address's host.
    pub sni: Option<String>,
    /// PEM CA certificates the origin's certificate is verified against; default the system roots.
    pub ca_file: Option<String>,
    /// PEM client certificate (chain) presented to the origin, with `client_key`.
    pub client_cert: Option<String>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<String>,
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
    /// How often origin host names are looked up again; `"0s"`: never (only at start).
    pub resolve_interval: Option<String>,
    /// `max_in_flight` of every backend that sets none (the only way with `upstream`).
    pub max_in_flight: Option<i64>,
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
    /// The literal address, or the name whose every address is a replica.
    pub address: OriginAddress,
    pub weight: u32,
    /// The backend group (`[[rules]]` `backend_group` sends requests to one); `None`: the
    /// default pool.
    pub group: Option<String>,
    /// At most this many requests at once (`None`: `balancer.max_in_flight`, else no limit).
    pub max_in_flight: Option<u32>,
    /// TLS to the origin (`https` upstreams); `None`: plain HTTP.
    pub tls: Option<OriginTls>,
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
    /// How often the backends' host names are looked up again (`None`: never).
    pub resolve_interval: Option<Duration>,
    /// `balancer.max_in_flight`: the limit of a backend without one of its own (`None`: none).
    pub default_max_in_flight: Option<u32>,
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
        (Some(address), None) => {
            let (https, name) = split_scheme("upstream", address)?;
            let tls = match https {
                true => Some(origin_tls("upstream", name, &TlsKeys::default())?),
                false => None,
            };
            Ok(vec![BackendConfig {
                name: name.to_string(),
                address: OriginAddress::parse("upstream", name)?,
                weight: 1,
                group: None,
                max_in_flight: None,
                tls,
            }])
        }
        (None, Some(list)) if list.is_empty() => {
            Err(ConfigError::new("upstreams", "needs at least one entry"))
        }
        (None, Some(list)) => {
            let mut backends: Vec<BackendConfig> = Vec::with_capacity(list.len());
            for (i, entry) in list.iter().enumerate() {
                let key = format!("upstreams[{i}]");
                let (https, name) = split_scheme(&format!("{key}.address"), &entry.address)?;
                let address = OriginAddress::parse(&format!("{key}.address"), name)?;
                let tls = backend_tls(&key, entry, https, name)?;
                let overlaps = |b: &BackendConfig| {
                    b.address == address
                        || b.address.addrs().iter().any(|a| address.addrs().contains(a))
                };
                if backends.iter().any(overlaps) {
                    return Err(ConfigError::new(
                        format!("upstreams[{i}].address"),
                        format!("\"{}\" is listed twice", entry.address),
                    ));
                }
                backends.push(BackendConfig {
                    name: name.to_string(),
                    address,
                    tls,
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

/// The address without its scheme, and whether the scheme was `https://`.
fn split_scheme<'a>(key: &str, address: &'a str) -> Result<(bool, &'a str), ConfigError> {
    let address = address.trim();
    if let Some(rest) = address.strip_prefix("https://") {
        Ok((true, rest.trim_end_matches('/')))
    } else if let Some(rest) = address.strip_prefix("http://") {
        Ok((false, rest.trim_end_matches('/')))
    } else if let Some((scheme, _)) = address.split_once("://") {
        Err(ConfigError::new(
            key,
            format!("\"{address}\": scheme \"{scheme}\" is not http or https"),
        ))
    } else {
        Ok((false, address))
    }
}

/// An entry's TLS keys as written.
#[derive(Default)]
struct TlsKeys<'a> {
    sni: Option<&'a str>,
    ca_file: Option<&'a str>,
    client_cert: Option<&'a str>,
    client_key: Option<&'a str>,
}

/// One `[[upstreams]]` entry's TLS: on with an `https://` address or `tls = true` (which must
/// agree), and then its SNI, CA file and client certificate, each file read now.
fn backend_tls(
    key: &str,
    entry: &UpstreamEntry,
    https: bool,
    name: &str,
) -> Result<Option<OriginTls>, ConfigError> {
    let on = match (https, entry.tls) {
        (true, Some(false)) => {
            return Err(ConfigError::new(
                format!("{key}.tls"),
                "is false but the address is https://",
            ))
        }
        (false, Some(true)) if entry.address.trim().starts_with("http://") => {
            return Err(ConfigError::new(
                format!("{key}.tls"),
                "is true but the address is http://",
            ))
        }
        (https, tls) => https || tls == Some(true),
    };
    let keys = TlsKeys {
        sni: entry.sni.as_deref(),
        ca_file: entry.ca_file.as_deref(),
        client_cert: entry.client_cert.as_deref(),
        client_key: entry.client_key.as_deref(),
    };
    if !on {
        let stray = [
            ("sni", keys.sni),
            ("ca_file", keys.ca_file),
            ("client_cert", keys.client_cert),
            ("client_key", keys.client_key),
        ]
        .into_iter()
        .find(|(_, v)| v.is_some());
        return match stray {
            Some((field, _)) => Err(ConfigError::new(
                format!("{key}.{field}"),
                "only applies to TLS origins (an https:// address or tls = true)",
            )),
            None => Ok(None),
        };
    }
    origin_tls(key, name, &keys).map(Some)
}

/// Loads TLS settings for the origin at `name` (`HOST:PORT`); errors name `key`'s field.
fn origin_tls(key: &str, name: &str, keys: &TlsKeys) -> Result<OriginTls, ConfigError> {
    let field = |f: &str| {
        if key == "upstream" {
            key.to_string()
        } else {
            format!("{key}.{f}")
        }
    };
    let sni = match keys.sni {
        Some(sni) => {
            let sni = sni.trim();
            if sni.is_empty() || sni.bytes().any(|b| b <= b' ' || b == b'/' || b == b':') {
                return Err(ConfigError::new(
                    field("sni"),
                    format!("\"{sni}\" is not a host name"),
                ));
            }
            sni.to_string()
        }
        None => {
            let host = name.rsplit_once(':').map_or(name, |(host, _)| host);
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string()
        }
    };
    let client_cert_key = match (keys.client_cert, keys.client_key) {
        (Some(cert), Some(key)) => Some((cert.to_string(), key.to_string())),
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::new(
                field("client_key"),
                "required when client_cert is set",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                field("client_cert"),
                "required when client_key is set",
            ))
        }
    };
    let files = OriginTlsFiles {
        ca_file: keys.ca_file.map(str::to_string),
        client_cert_key,
    };
    OriginTls::load(sni, files).map_err(|(file, reason)| {
        let f = match file {
            TlsFile::Ca => "ca_file",
            TlsFile::ClientCert => "client_cert",
            TlsFile::ClientKey => "client_key",
        };
        ConfigError::new(field(f), reason)
    })
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
    let resolve_interval = check::duration(
        "balancer.resolve_interval",
        &section.resolve_interval,
        Duration::from_secs(30),
    )?;
    if !resolve_interval.is_zero() && resolve_interval < Duration::from_millis(100) {
        return Err(ConfigError::new(
            "balancer.resolve_interval",
            "must be at least 100ms (or 0s: never look names up again)",
        ));
    }
    let default_max_in_flight = section
        .max_in_flight
        .map(|n| check::integer("balancer.max_in_flight", Some(n), 1, 1..=100_000))
        .transpose()?;
    Ok(BalancerConfig {
        backends,
        algorithm,
        resolve_interval: (!resolve_interval.is_zero()).then_some(resolve_interval),
        default_max_in_flight,
        health_check,
        passive,
        retries,
        timeouts,
        queue,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn an_https_address_turns_tls_on_with_the_host_as_sni() {
        let config = Config::from_toml(
            "[[upstreams]]\naddress = \"https://127.0.0.1:8443/\"\n\
             [[upstreams]]\naddress = \"http://127.0.0.1:8080\"\n\
             [[upstreams]]\naddress = \"127.0.0.1:8081\"\ntls = true\nsni = \"app.internal\"\n",
        )
        .unwrap();
        let backends = &config.balancer.backends;
        let tls = backends[0].tls.as_ref().expect("https:// is TLS");
        assert_eq!(tls.sni, "127.0.0.1");
        assert_eq!(backends[0].name, "127.0.0.1:8443");
        assert_eq!(backends[0].address.addrs()[0].port(), 8443);
        assert!(backends[1].tls.is_none());
        assert_eq!(backends[2].tls.as_ref().unwrap().sni, "app.internal");

        let single = Config::from_toml("upstream = \"https://127.0.0.1:8443\"").unwrap();
        assert!(single.balancer.backends[0].tls.is_some());
        assert_eq!(single.upstream_name, "127.0.0.1:8443");
    }
}
