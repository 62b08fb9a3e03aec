//! Configuration: one TOML file, CLI flags that override it, and embedded defaults.
//!
//! Loading happens in three steps:
//! 1. [`file`](mod@file) deserializes the TOML as written, rejecting unknown keys;
//! 2. [`cli`] lays the flags over it;
//! 3. [`Config::validate`] hands each section to its module, which turns strings into typed
//!    values through the key-aware checks in [`check`]: every bad value becomes a
//!    [`ConfigError`] that names the key and the reason, so start-up stops before serving.
//!
//! One module per section, each holding the section as written, its validated form and its
//! checks: [`server`] (the top-level keys and `[server]`), [`tls`], [`proxy`], [`balancing`]
//! (`upstream`, `[[upstreams]]`, `[balancer]`), [`fairness`], [`cache`], [`memcached`]
//! (`[cache.memcached]`), [`compression`] (`[cache.compression]`), [`partial`]
//! (`[cache.partial]`), [`logging`] (`[log]`), [`admin`] and [`rules`] (`[[rules]]`). [`units`]
//! parses sizes and durations; [`address_range`] client address ranges.
//!
//! With no file at all, `lacquer --upstream 127.0.0.1:8080` is a complete configuration:
//! a memory-only cache in front of that origin.

pub mod address_range;
pub mod admin;
pub mod balancing;
pub mod cache;
mod check;
pub mod cli;
pub mod compression;
pub mod fairness;
pub mod file;
pub mod invalidation;
pub mod logging;
pub mod memcached;
pub mod origin_address;
pub mod partial;
pub mod proxy;
pub mod rules;
pub mod server;
pub mod tls;
pub mod units;

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use cache::{CacheConfig, TtlOverride};
pub use check::listener_takes;
pub use cli::Cli;
pub use logging::{AccessLogFormat, AccessLogTarget, LogConfig};
pub use proxy::{ForwardedHeaders, ProxyConfig};
pub use server::{ClientLimits, DEFAULT_LISTEN};
pub use tls::TlsConfig;

use file::FileConfig;

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

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: Vec<SocketAddr>,
    /// The plain listeners (`listen = ["ADDR proxy_protocol"]`) whose connections start with a
    /// PROXY protocol header naming the client (`tls.listen` has its own).
    pub proxy_protocol_listen: Vec<SocketAddr>,
    /// The first origin's first address when the configuration was loaded.
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
    /// Per-connection buffer in front of each client socket's reads (`server.read_buffer`, 0 by
    /// default): Pingora's default of 64 KiB, zero-filled, was most of what an idle client
    /// connection cost; without it reads go straight into the HTTP session's own buffers.
    pub read_buffer: usize,
    /// How long memory freed by the process stays in it before it is handed back to the system
    /// (`server.memory_return_delay`, see [`crate::allocator`]).
    pub memory_return_delay: Duration,
    /// What a client connection may take: head deadline and sizes, connection cap, h2 idle.
    pub client_limits: ClientLimits,
    /// The Unix socket a hand-over passes the listening sockets through (`server.upgrade_sock`,
    /// see [`crate::lifecycle::upgrade`]).
    pub upgrade_sock: String,
    pub tls: Option<TlsConfig>,
    pub proxy: ProxyConfig,
    pub cache: CacheConfig,
    pub log: LogConfig,
    /// Admin endpoint address, if enabled.
    pub admin_listen: Option<SocketAddr>,
    /// Who may use the admin endpoint, and the token its invalidation API demands.
    pub admin_access: admin::AdminAccess,
    /// How purges and bans reach every node (`[invalidation]`).
    pub invalidation: invalidation::InvalidationConfig,
    /// The origin replicas and how requests are spread over them (`upstream` is the first one).
    pub balancer: balancing::BalancerConfig,
    /// Per-client cap on requests going upstream, if configured.
    pub fairness: Option<fairness::FairnessConfig>,
    /// The request rules, in order (`[[cache.ttl_overrides]]` folded in first).
    pub rules: Vec<rules::Rule>,
}

impl Config {
    /// Loads the file named by `--config` (if any), applies the flags and validates.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        let path = cli.check_config.as_ref().or(cli.config.as_ref());
        let file = match path {
            Some(path) => FileConfig::read(Path::new(path))?,
            None => FileConfig::default(),
        };
        Config::validate(cli::apply_cli(file, cli))
    }

    /// Parses TOML text (no flags), for tests and `--check-config`.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::validate(FileConfig::parse(text, "config")?)
    }

    /// Turns the layered file into typed values, section by section; the first bad value stops.
    pub fn validate(file: FileConfig) -> Result<Config, ConfigError> {
        let server = server::validate(server::ServerKeys {
            listen: &file.listen,
            threads: file.threads,
            grace_period: &file.grace_period,
            shutdown_timeout: &file.shutdown_timeout,
            upstream_keepalive_pool: file.upstream_keepalive_pool,
            server: &file.server,
        })?;
        let first_listen_port = server.listen.first().map(|a| a.port());
        let backends = balancing::validate_backends(&file.upstream, &file.upstreams)?;
        let tls = tls::validate(&file.tls)?;
        let mut listeners: Vec<(&str, SocketAddr, bool)> = server
            .listen
            .iter()
            .map(|a| ("listen", *a, server.proxy_protocol.contains(a)))
            .collect();
        if let Some(tls) = &tls {
            listeners.extend(
                tls.listen
                    .iter()
                    .map(|a| ("tls.listen", *a, tls.proxy_protocol.contains(a))),
            );
        }
        check::listeners_told_apart(&listeners)?;
        let proxy = proxy::validate(&file.proxy)?;
        let cache = cache::validate(&file.cache)?;
        let groups = rules::backend_groups(&backends);
        let rules = rules::validate(&file.rules, &cache.ttl_overrides, &groups)?;
        Ok(Config {
            listen: server.listen,
            proxy_protocol_listen: server.proxy_protocol,
            upstream: backends[0].address.addrs()[0],
            upstream_name: backends[0].name.clone(),
            threads: server.threads,
            grace_period: server.grace_period,
            shutdown_timeout: server.shutdown_timeout,
            upstream_keepalive_pool: server.upstream_keepalive_pool,
            h2c: server.h2c,
            write_buffer: server.write_buffer,
            read_buffer: server.read_buffer,
            memory_return_delay: server.memory_return_delay,
            client_limits: server.client_limits,
            upgrade_sock: server.upgrade_sock,
            tls,
            balancer: balancing::validate(&file.balancer, backends, &proxy)?,
            proxy,
            fairness: fairness::validate(&file.fairness)?,
            cache,
            log: logging::validate(&file.log)?,
            admin_listen: admin::validate(&file.admin)?,
            admin_access: admin::validate_access(&file.admin)?,
            invalidation: invalidation::validate(&file.invalidation, first_listen_port)?,
            rules,
        })
    }
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
    fn a_proxy_protocol_listener_must_be_told_apart_from_a_plain_one() {
        for listen in [
            r#"["0.0.0.0:8080 proxy_protocol", "[::1]:8080"]"#,
            r#"["127.0.0.1:8080", "[::]:8080 proxy_protocol"]"#,
        ] {
            let e = err(&format!("upstream = \"127.0.0.1:1\"\nlisten = {listen}"));
            assert_eq!(e.key, "listen", "{listen}");
            assert!(e.reason.contains("share port 8080"), "{e}");
        }
        // distinct specific addresses, or separate ports, are told apart exactly
        for listen in [
            r#"["10.0.0.1:8080 proxy_protocol", "127.0.0.1:8080"]"#,
            r#"["0.0.0.0:8081 proxy_protocol", "0.0.0.0:8080"]"#,
            r#"["0.0.0.0:8080 proxy_protocol", "[::]:8080 proxy_protocol"]"#,
        ] {
            Config::from_toml(&format!("upstream = \"127.0.0.1:1\"\nlisten = {listen}"))
                .unwrap_or_else(|e| panic!("{listen}: {e}"));
        }
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
}
