//! `[cache.memcached]`: the shared tier's servers, timeouts and behaviour.
//!
//! No servers means no shared tier: the memory tier alone, as before.

use super::{check, ConfigError};
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// One server as written: `"host:port"` or `{ addr = "host:port", weight = 2 }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ServerEntry {
    Plain(String),
    Weighted { addr: String, weight: i64 },
}

/// The section as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemcachedSection {
    pub servers: Option<Vec<ServerEntry>>,
    pub namespace: Option<String>,
    pub connect_timeout: Option<String>,
    pub op_timeout: Option<String>,
    pub pool_size: Option<i64>,
    /// How long a node trusts its memory copy before asking the shared tier again.
    pub local_ttl: Option<String>,
    pub failure_limit: Option<i64>,
    pub retry_after: Option<String>,
    pub rehash_on_eject: Option<bool>,
    /// Largest value written to memcached; larger bodies are split into chunks.
    pub item_size: Option<String>,
    /// How long entries outlive their freshness in memcached, for revalidation.
    pub keep: Option<String>,
    /// How long one node's fill of a URL holds off the other nodes' fills of it; "0s" = off.
    pub fill_lease: Option<String>,
}

/// One validated server.
#[derive(Debug, Clone, PartialEq)]
pub struct MemcachedServer {
    /// As written (`host:port`), the name ketama hashes.
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
}

/// The validated shared-tier settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MemcachedConfig {
    pub servers: Vec<MemcachedServer>,
    pub namespace: String,
    pub connect_timeout: Duration,
    pub op_timeout: Duration,
    pub pool_size: usize,
    pub local_ttl: Duration,
    pub failure_limit: u32,
    pub retry_after: Duration,
    pub rehash_on_eject: bool,
    pub item_size: usize,
    pub keep: Duration,
    /// Cluster-wide fill coalescing (see [`crate::storage::fill_lease`]):
    /// how long other nodes wait for one node's fill of a URL; zero turns it off. Whole seconds.
    pub fill_lease: Duration,
}

/// `fill_lease`: whole seconds (memcached expiry granularity), at most a minute; 0 = off.
fn fill_lease(value: &Option<String>) -> Result<Duration, ConfigError> {
    check::whole_seconds(
        "cache.memcached.fill_lease",
        value,
        Duration::from_secs(3),
        Duration::from_secs(60),
        "memcached expires keys in whole seconds",
    )
}

/// Validates the section; `None` when no servers are configured.
pub fn validate(section: &MemcachedSection) -> Result<Option<MemcachedConfig>, ConfigError> {
    let entries = match &section.servers {
        None => return Ok(None),
        Some(list) if list.is_empty() => return Ok(None),
        Some(list) => list,
    };
    let mut servers: Vec<MemcachedServer> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = format!("cache.memcached.servers[{i}]");
        let (name, weight) = match entry {
            ServerEntry::Plain(addr) => (addr.trim().to_string(), 1),
            ServerEntry::Weighted { addr, weight } => (
                addr.trim().to_string(),
                check::integer(&format!("{key}.weight"), Some(*weight), 1, 1..=1000)?,
            ),
        };
        let addr = check::resolved_addr(&key, &name)?;
        if servers.iter().any(|s| s.name == name) {
            return Err(ConfigError::new(
                &key,
                format!("\"{name}\" is listed twice"),
            ));
        }
        servers.push(MemcachedServer { name, addr, weight });
    }
    let namespace = section.namespace.clone().unwrap_or_else(|| "lq".into());
    if namespace.is_empty()
        || namespace.len() > 64
        || !namespace.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ConfigError::new(
            "cache.memcached.namespace",
            format!("\"{namespace}\" must be 1-64 printable characters without spaces"),
        ));
    }
    let item_size = check::size("cache.memcached.item_size", &section.item_size, 1 << 20)?;
    if !(4096..=128 << 20).contains(&item_size) {
        return Err(ConfigError::new(
            "cache.memcached.item_size",
            "must be between 4KiB and 128MiB",
        ));
    }
    let timeout = |name: &str, value: &Option<String>, default: Duration| {
        check::positive_duration(&format!("cache.memcached.{name}"), value, default)
    };
    Ok(Some(MemcachedConfig {
        servers,
        namespace,
        connect_timeout: timeout(
            "connect_timeout",
            &section.connect_timeout,
            Duration::from_millis(50),
        )?,
        op_timeout: timeout(
            "op_timeout",
            &section.op_timeout,
            Duration::from_millis(100),
        )?,
        pool_size: check::integer("cache.memcached.pool_size", section.pool_size, 8, 1..=1024)?,
        // zero is allowed: no local copies at all, every hit is read from memcached
        local_ttl: check::duration(
            "cache.memcached.local_ttl",
            &section.local_ttl,
            Duration::from_secs(5),
        )?,
        failure_limit: check::integer(
            "cache.memcached.failure_limit",
            section.failure_limit,
            3,
            1..=1000,
        )?,
        retry_after: timeout("retry_after", &section.retry_after, Duration::from_secs(5))?,
        rehash_on_eject: section.rehash_on_eject.unwrap_or(false),
        item_size,
        keep: check::duration(
            "cache.memcached.keep",
            &section.keep,
            Duration::from_secs(3600),
        )?,
        fill_lease: fill_lease(&section.fill_lease)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(text: &str) -> Result<Duration, ConfigError> {
        fill_lease(&Some(text.to_string()))
    }

    #[test]
    fn fill_lease_is_whole_seconds_up_to_a_minute() {
        assert_eq!(fill_lease(&None).unwrap(), Duration::from_secs(3));
        assert_eq!(lease("0s").unwrap(), Duration::ZERO);
        assert_eq!(lease("60s").unwrap(), Duration::from_secs(60));
        for (bad, reason) in [
            ("1500ms", "whole seconds"),
            ("2m", "at most 60s"),
            ("soon", ""),
        ] {
            let err = lease(bad).unwrap_err();
            assert_eq!(err.key, "cache.memcached.fill_lease");
            assert!(err.reason.contains(reason), "{bad}: {}", err.reason);
        }
    }
}
