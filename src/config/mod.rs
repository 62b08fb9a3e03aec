//! Configuration: one TOML file, CLI flags that override it, and embedded defaults.
//!
//! Loading happens in three steps, each in its own module:
//! 1. [`file`] deserializes the TOML as written, rejecting unknown keys;
//! 2. [`cli`] flags are laid over it;
//! 3. [`Config::validate`] turns strings into typed values, and every bad value becomes a
//!    [`ConfigError`] that names the key and the reason, so start-up stops before serving.
//!
//! With no file at all, `lacquer --upstream 127.0.0.1:8080` is a complete configuration:
//! a memory-only cache in front of that origin.

pub mod address_range;
pub mod balancing;
pub mod cli;
pub mod compression;
pub mod file;
pub mod memcached;
pub mod units;

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

pub use cli::Cli;
use file::FileConfig;
use units::{parse_duration, parse_size};

/// A configuration problem, naming the offending key and why it is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted TOML key (`cache.memory_size`) or the file itself.
    pub key: String,
    /// Human-readable reason.
    pub reason: String,
}

impl ConfigError {
    fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config: {}: {}", self.key, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// Which forwarding headers are added to upstream requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardedHeaders {
    /// Neither header is touched.
    None,
    /// `X-Forwarded-For` (appended), `X-Forwarded-Proto`, `X-Forwarded-Host`.
    XForwardedFor,
    /// RFC 7239 `Forwarded` (appended).
    Forwarded,
    /// Both styles.
    Both,
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    Off,
    Stdout,
    Stderr,
    File(String),
}

/// Access log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// NCSA common log format plus cache status and timings.
    Common,
    /// One JSON object per line.
    Json,
}

/// TLS listener settings.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub listen: Vec<SocketAddr>,
    pub cert: String,
    pub key: String,
}

/// Upstream timeouts and forwarding behaviour.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub via: bool,
    pub via_name: String,
    pub forwarded: ForwardedHeaders,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
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
    pub memcached: Option<memcached::MemcachedConfig>,
    /// Whether a client's `no-cache` forces revalidation (RFC 9111 allows ignoring it).
    pub honor_client_no_cache: bool,
    /// Stale responses without their own `stale-if-error` may be served this long past their
    /// freshness when the origin fails (zero: never). `must-revalidate` still forbids it.
    pub stale_if_error_grace: Duration,
    /// gzip on store (`[cache.compression]`).
    pub compression: compression::CompressionConfig,
    /// Client addresses allowed to send PURGE (default: loopback only); others get 405.
    pub purge_from: Vec<address_range::AddressRange>,
}

/// Logging settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub access: AccessLogTarget,
    pub format: AccessLogFormat,
    pub level: log::LevelFilter,
}

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: Vec<SocketAddr>,
    pub upstream: SocketAddr,
    /// The upstream as written (used for the `Host` fallback and logs).
    pub upstream_name: String,
    pub threads: usize,
    pub grace_period: Duration,
    pub shutdown_timeout: Duration,
    pub upstream_keepalive_pool: usize,
    pub h2c: bool,
    /// Per-connection buffer for writes to clients (`server.write_buffer`): a response whose
    /// head and body fit goes out in one `send`. Pingora's default is one MSS (1460 bytes), which
    /// splits any response over ~1 KB into two sends, two client wake-ups.
    pub write_buffer: usize,
    pub tls: Option<TlsConfig>,
    pub proxy: ProxyConfig,
    pub cache: CacheConfig,
    pub log: LogConfig,
    /// Admin endpoint address, if enabled.
    pub admin_listen: Option<SocketAddr>,
    /// The origin replicas and how requests are spread over them (`upstream` is the first one).
    pub balancer: balancing::BalancerConfig,
    /// Per-client cap on requests going upstream, if configured.
    pub fairness: Option<balancing::FairnessConfig>,
}

/// The largest `server.write_buffer`: it is allocated per client connection.
const MAX_WRITE_BUFFER: usize = 1 << 20;

/// The default plain listener, Varnish's customary port.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:6081";

impl Config {
    /// Loads the file named by `--config` (if any), applies the flags and validates.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        let path = cli.check_config.as_ref().or(cli.config.as_ref());
        let file = match path {
            Some(path) => read_file(Path::new(path))?,
            None => FileConfig::default(),
        };
        Config::validate(apply_cli(file, cli))
    }

    /// Parses TOML text (no flags), for tests and `--check-config`.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::validate(parse_toml(text, "config")?)
    }

    /// Turns the layered file into typed values, rejecting anything invalid.
    pub fn validate(file: FileConfig) -> Result<Config, ConfigError> {
        let listen = match &file.listen {
            Some(list) if list.is_empty() => {
                return Err(ConfigError::new("listen", "needs at least one address"))
            }
            Some(list) => list
                .iter()
                .map(|a| parse_socket_addr("listen", a))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![DEFAULT_LISTEN.parse().expect("default listen address")],
        };
        let backends = balancing::validate_backends(&file.upstream, &file.upstreams)?;
        let upstream_name = backends[0].name.clone();
        let upstream = backends[0].addr;

        let threads = match file.threads {
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            Some(n) if n <= 0 => {
                return Err(ConfigError::new(
                    "threads",
                    format!("must be at least 1 (got {n})"),
                ))
            }
            Some(n) if n > 1024 => {
                return Err(ConfigError::new(
                    "threads",
                    format!("{n} is more than the maximum of 1024"),
                ))
            }
            Some(n) => n as usize,
        };
        let grace_period = duration_or("grace_period", &file.grace_period, "5s")?;
        let shutdown_timeout = duration_or("shutdown_timeout", &file.shutdown_timeout, "10s")?;
        let upstream_keepalive_pool = match file.upstream_keepalive_pool {
            None => 128,
            Some(n) if n < 0 => {
                return Err(ConfigError::new(
                    "upstream_keepalive_pool",
                    "must not be negative",
                ))
            }
            Some(n) => n as usize,
        };

        let tls = validate_tls(&file)?;
        let proxy = validate_proxy(&file)?;
        let balancer = balancing::validate_balancer(&file.balancer, backends, &proxy)?;
        let fairness = balancing::validate_fairness(&file.fairness)?;
        let cache = validate_cache(&file)?;
        let log = validate_log(&file)?;
        let admin_listen = file
            .admin
            .listen
            .as_deref()
            .map(|a| parse_socket_addr("admin.listen", a))
            .transpose()?;

        let write_buffer = size_or("server.write_buffer", &file.server.write_buffer, "16KiB")?;
        if write_buffer > MAX_WRITE_BUFFER {
            return Err(ConfigError::new(
                "server.write_buffer",
                format!("{write_buffer} bytes is more than the 1MiB allowed per connection"),
            ));
        }
        Ok(Config {
            listen,
            upstream,
            upstream_name,
            threads,
            grace_period,
            shutdown_timeout,
            upstream_keepalive_pool,
            h2c: file.server.h2c.unwrap_or(true),
            write_buffer,
            tls,
            proxy,
            cache,
            log,
            admin_listen,
            balancer,
            fairness,
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(display.clone(), format!("cannot read file: {e}")))?;
    parse_toml(&text, &display)
}

fn parse_toml(text: &str, origin: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let message = e.message().to_string();
        let location = e
            .span()
            .map(|span| {
                let line = text[..span.start].matches('\n').count() + 1;
                format!(" (line {line})")
            })
            .unwrap_or_default();
        ConfigError::new(origin, format!("{message}{location}"))
    })
}

/// Lays the CLI flags over the file: a flag that is given wins.
fn apply_cli(mut file: FileConfig, cli: &Cli) -> FileConfig {
    match cli.upstream.as_slice() {
        [] => {}
        [one] => {
            file.upstream = Some(one.clone());
            file.upstreams = None;
        }
        many => {
            file.upstream = None;
            file.upstreams = Some(
                many.iter()
                    .map(|address| balancing::UpstreamEntry {
                        address: address.clone(),
                        weight: None,
                    })
                    .collect(),
            );
        }
    }
    if !cli.listen.is_empty() {
        file.listen = Some(cli.listen.clone());
    }
    if let Some(threads) = cli.threads {
        file.threads = Some(threads);
    }
    if let Some(size) = &cli.memory_size {
        file.cache.memory_size = Some(size.clone());
    }
    if let Some(size) = &cli.max_object_size {
        file.cache.max_object_size = Some(size.clone());
    }
    if cli.no_cache {
        file.cache.enabled = Some(false);
    }
    if let Some(access) = &cli.access_log {
        file.log.access = Some(access.clone());
    }
    if let Some(format) = &cli.log_format {
        file.log.format = Some(format.clone());
    }
    if let Some(level) = &cli.log_level {
        file.log.level = Some(level.clone());
    }
    if !cli.tls_listen.is_empty() {
        file.tls.listen = Some(cli.tls_listen.clone());
    }
    if let Some(cert) = &cli.tls_cert {
        file.tls.cert = Some(cert.clone());
    }
    if let Some(key) = &cli.tls_key {
        file.tls.key = Some(key.clone());
    }
    file
}

fn parse_socket_addr(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim().parse().map_err(|_| {
        ConfigError::new(
            key,
            format!("\"{text}\" is not an IP:PORT address (e.g. \"0.0.0.0:6081\")"),
        )
    })
}

/// Accepts `IP:PORT` or `HOSTNAME:PORT` (resolved once, at start-up).
pub(crate) fn resolve_addr(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = text.trim().parse() {
        return Ok(addr);
    }
    let (host, port) = text.trim().rsplit_once(':').ok_or_else(|| {
        ConfigError::new(key, format!("\"{text}\" has no port (expected HOST:PORT)"))
    })?;
    let port: u16 = port.parse().map_err(|_| {
        ConfigError::new(key, format!("\"{text}\": \"{port}\" is not a port number"))
    })?;
    if host.is_empty() {
        return Err(ConfigError::new(key, format!("\"{text}\" has no host")));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| ConfigError::new(key, format!("cannot resolve \"{host}\": {e}")))?
        .next()
        .ok_or_else(|| ConfigError::new(key, format!("\"{host}\" resolves to no address")))
}

fn duration_or(key: &str, value: &Option<String>, default: &str) -> Result<Duration, ConfigError> {
    parse_duration(value.as_deref().unwrap_or(default)).map_err(|e| ConfigError::new(key, e))
}

fn size_or(key: &str, value: &Option<String>, default: &str) -> Result<usize, ConfigError> {
    let bytes =
        parse_size(value.as_deref().unwrap_or(default)).map_err(|e| ConfigError::new(key, e))?;
    usize::try_from(bytes).map_err(|_| ConfigError::new(key, "too large for this machine"))
}

/// A duration that HTTP can express: whole seconds (delta-seconds), at most 2^31.
fn whole_seconds(
    key: &str,
    value: &Option<String>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let duration = duration_or(key, value, default)?;
    if duration.subsec_nanos() != 0 {
        return Err(ConfigError::new(key, "must be a whole number of seconds"));
    }
    if duration.as_secs() > 1 << 31 {
        return Err(ConfigError::new(key, "must be at most 2147483648s"));
    }
    Ok(duration)
}

fn positive_duration(
    key: &str,
    value: &Option<String>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let duration = duration_or(key, value, default)?;
    if duration.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(duration)
}

fn validate_tls(file: &FileConfig) -> Result<Option<TlsConfig>, ConfigError> {
    let section = &file.tls;
    let listen = match &section.listen {
        None => return Ok(None),
        Some(list) if list.is_empty() => return Ok(None),
        Some(list) => list
            .iter()
            .map(|a| parse_socket_addr("tls.listen", a))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let cert = section
        .cert
        .clone()
        .ok_or_else(|| ConfigError::new("tls.cert", "required when tls.listen is set"))?;
    let key = section
        .key
        .clone()
        .ok_or_else(|| ConfigError::new("tls.key", "required when tls.listen is set"))?;
    for (name, path) in [("tls.cert", &cert), ("tls.key", &key)] {
        if !Path::new(path).is_file() {
            return Err(ConfigError::new(
                name,
                format!("file \"{path}\" does not exist"),
            ));
        }
    }
    Ok(Some(TlsConfig { listen, cert, key }))
}

fn validate_proxy(file: &FileConfig) -> Result<ProxyConfig, ConfigError> {
    let section = &file.proxy;
    let forwarded = match section
        .forwarded
        .as_deref()
        .unwrap_or("x-forwarded-for")
        .to_ascii_lowercase()
        .as_str()
    {
        "none" => ForwardedHeaders::None,
        "x-forwarded-for" => ForwardedHeaders::XForwardedFor,
        "forwarded" => ForwardedHeaders::Forwarded,
        "both" => ForwardedHeaders::Both,
        other => {
            return Err(ConfigError::new(
                "proxy.forwarded",
                format!("\"{other}\" is not one of none, x-forwarded-for, forwarded, both"),
            ))
        }
    };
    let via_name = section.via_name.clone().unwrap_or_else(|| "lacquer".into());
    if via_name.is_empty() || !via_name.bytes().all(is_token_byte) {
        return Err(ConfigError::new(
            "proxy.via_name",
            format!("\"{via_name}\" must be a non-empty HTTP token"),
        ));
    }
    Ok(ProxyConfig {
        via: section.via.unwrap_or(true),
        via_name,
        forwarded,
        connect_timeout: positive_duration(
            "proxy.connect_timeout",
            &section.connect_timeout,
            "2s",
        )?,
        read_timeout: positive_duration("proxy.read_timeout", &section.read_timeout, "60s")?,
        write_timeout: positive_duration("proxy.write_timeout", &section.write_timeout, "60s")?,
        idle_timeout: positive_duration("proxy.idle_timeout", &section.idle_timeout, "60s")?,
    })
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn validate_cache(file: &FileConfig) -> Result<CacheConfig, ConfigError> {
    let section = &file.cache;
    let memory_size = size_or("cache.memory_size", &section.memory_size, "256MiB")?;
    if memory_size < 1 << 20 {
        return Err(ConfigError::new(
            "cache.memory_size",
            "must be at least 1MiB",
        ));
    }
    let max_object_size = size_or("cache.max_object_size", &section.max_object_size, "16MiB")?;
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
    let estimated_objects = match section.estimated_objects {
        None => (memory_size / 8192).clamp(1024, 4_000_000),
        Some(n) if n <= 0 => {
            return Err(ConfigError::new(
                "cache.estimated_objects",
                "must be at least 1",
            ))
        }
        Some(n) => n as usize,
    };
    let default_ttl = section
        .default_ttl
        .as_ref()
        .map(|t| parse_duration(t).map_err(|e| ConfigError::new("cache.default_ttl", e)))
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
    if status_name.is_empty() || !status_name.bytes().all(is_token_byte) {
        return Err(ConfigError::new(
            "cache.status_name",
            format!("\"{status_name}\" must be a non-empty HTTP token"),
        ));
    }
    let targeted_field = section
        .targeted_field
        .clone()
        .unwrap_or_else(|| "lacquer-cache-control".into())
        .to_ascii_lowercase();
    if http::HeaderName::from_bytes(targeted_field.as_bytes()).is_err() {
        return Err(ConfigError::new(
            "cache.targeted_field",
            format!("\"{targeted_field}\" is not a valid header name"),
        ));
    }
    let mut ttl_overrides = Vec::new();
    for (i, entry) in section.ttl_overrides.iter().flatten().enumerate() {
        let key = format!("cache.ttl_overrides[{i}]");
        if !entry.prefix.starts_with('/') {
            return Err(ConfigError::new(
                format!("{key}.prefix"),
                format!("\"{}\" must start with '/'", entry.prefix),
            ));
        }
        let ttl =
            parse_duration(&entry.ttl).map_err(|e| ConfigError::new(format!("{key}.ttl"), e))?;
        ttl_overrides.push(TtlOverride {
            prefix: entry.prefix.clone(),
            ttl,
        });
    }
    Ok(CacheConfig {
        enabled: section.enabled.unwrap_or(true),
        memory_size,
        max_object_size,
        estimated_objects,
        default_ttl,
        heuristic_fraction,
        heuristic_max: duration_or("cache.heuristic_max", &section.heuristic_max, "1d")?,
        lock_timeout: positive_duration("cache.lock_timeout", &section.lock_timeout, "10s")?,
        status_name,
        ttl_overrides,
        targeted_field,
        forward_targeted_fields: section.forward_targeted_fields.unwrap_or(false),
        memcached: memcached::validate(&section.memcached)?,
        honor_client_no_cache: section.honor_client_no_cache.unwrap_or(true),
        stale_if_error_grace: whole_seconds(
            "cache.stale_if_error_grace",
            &section.stale_if_error_grace,
            "0s",
        )?,
        compression: compression::validate(&section.compression)?,
        purge_from: purge_from(&section.purge_from)?,
    })
}

/// `cache.purge_from`: loopback only unless configured, as Varnish's customary `acl purge`.
fn purge_from(
    value: &Option<Vec<String>>,
) -> Result<Vec<address_range::AddressRange>, ConfigError> {
    let default = ["127.0.0.0/8".to_string(), "::1".to_string()];
    let entries = value.as_deref().unwrap_or(&default);
    entries
        .iter()
        .enumerate()
        .map(|(i, text)| {
            address_range::AddressRange::parse(text)
                .map_err(|reason| ConfigError::new(format!("cache.purge_from[{i}]"), reason))
        })
        .collect()
}

fn validate_log(file: &FileConfig) -> Result<LogConfig, ConfigError> {
    let section = &file.log;
    let access = match section.access.as_deref().unwrap_or("stdout") {
        "off" | "none" | "" => AccessLogTarget::Off,
        "stdout" | "-" => AccessLogTarget::Stdout,
        "stderr" => AccessLogTarget::Stderr,
        path => AccessLogTarget::File(path.to_string()),
    };
    let format = match section.format.as_deref().unwrap_or("common") {
        "common" => AccessLogFormat::Common,
        "json" => AccessLogFormat::Json,
        other => {
            return Err(ConfigError::new(
                "log.format",
                format!("\"{other}\" is not one of common, json"),
            ))
        }
    };
    let level = section
        .level
        .as_deref()
        .unwrap_or("info")
        .parse::<log::LevelFilter>()
        .map_err(|_| {
            ConfigError::new(
                "log.level",
                format!(
                    "\"{}\" is not one of off, error, warn, info, debug, trace",
                    section.level.as_deref().unwrap_or_default()
                ),
            )
        })?;
    Ok(LogConfig {
        access,
        format,
        level,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::from_toml(text).unwrap_err()
    }

    #[test]
    fn minimal_config_has_defaults() {
        let c = Config::from_toml("upstream = \"127.0.0.1:8080\"").unwrap();
        assert_eq!(c.listen, vec![DEFAULT_LISTEN.parse().unwrap()]);
        assert!(c.cache.enabled);
        assert_eq!(c.cache.memory_size, 256 << 20);
        assert!(c.threads >= 1);
    }

    #[test]
    fn errors_name_the_key() {
        let e = err("upstream = \"127.0.0.1:1\"\n[cache]\nmemory_size = \"12XB\"");
        assert_eq!(e.key, "cache.memory_size");
        assert!(e.reason.contains("unknown unit"), "{e}");

        let e = err("upstream = \"127.0.0.1:1\"\nthreads = 0");
        assert_eq!(e.key, "threads");

        let e = err("upstream = \"127.0.0.1:1\"\nlisten = [\"nowhere\"]");
        assert_eq!(e.key, "listen");

        let e = err("upstream = \"127.0.0.1:1\"\n[cache]\nmemry_size = \"1MiB\"");
        assert!(e.reason.contains("unknown field `memry_size`"), "{e}");
        assert!(e.reason.contains("line 3"), "{e}");

        let e = err("listen = [\"127.0.0.1:1\"]");
        assert_eq!(e.key, "upstream");
    }

    #[test]
    fn cli_overrides_file() {
        let file: FileConfig = toml::from_str("upstream = \"127.0.0.1:1\"\nthreads = 3").unwrap();
        let cli = Cli {
            upstream: vec!["127.0.0.1:2".into()],
            threads: Some(1),
            ..Default::default()
        };
        let c = Config::validate(apply_cli(file, &cli)).unwrap();
        assert_eq!(c.upstream.port(), 2);
        assert_eq!(c.threads, 1);
    }
}
