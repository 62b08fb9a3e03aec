//! The TOML file as written by the operator, before validation: its top-level keys, and reading
//! and parsing it.
//!
//! Every field is optional so that the file, the CLI flags and the embedded defaults can be layered;
//! `deny_unknown_fields` makes a typo (`memry_size`) a start-up error that names the key instead of a
//! silently ignored line. Each section's table is declared by that section's module.

use super::admin::AdminSection;
use super::balancing::{BalancerSection, UpstreamEntry};
use super::cache::CacheSection;
use super::fairness::FairnessSection;
use super::invalidation::InvalidationSection;
use super::logging::LogSection;
use super::proxy::ProxySection;
use super::rules::RuleEntry;
use super::server::ServerSection;
use super::tls::TlsSection;
use super::ConfigError;
use serde::Deserialize;
use std::path::Path;

/// The whole config file. Field names are the TOML keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Plain-text listening addresses (HTTP/1.1 and, unless disabled, h2c prior knowledge).
    pub listen: Option<Vec<String>>,
    /// The origin, `HOST:PORT`.
    pub upstream: Option<String>,
    /// Several origin replicas (`[[upstreams]]`), instead of `upstream`.
    pub upstreams: Option<Vec<UpstreamEntry>>,
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
    pub balancer: BalancerSection,
    /// `[fairness]`: per-client cap on requests going upstream.
    #[serde(default)]
    pub fairness: FairnessSection,
    /// `[[rules]]`: request rules, in order.
    pub rules: Option<Vec<RuleEntry>>,
    /// `[invalidation]`: how purges and bans reach every node, tags.
    #[serde(default)]
    pub invalidation: InvalidationSection,
}

impl FileConfig {
    /// Reads and parses the file at `path`; an error names the file.
    pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(display.clone(), format!("cannot read file: {e}")))?;
        FileConfig::parse(&text, &display)
    }

    /// Parses TOML text; an error names `origin` (the file, or "config") and the line.
    pub fn parse(text: &str, origin: &str) -> Result<FileConfig, ConfigError> {
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
}
