//! `[cache.memcached]`: the shared tier's servers, timeouts and behaviour.
//!
//! No servers means no shared tier: the memory tier alone, as before.

use super::units::{parse_duration, parse_size};
use super::ConfigError;
use serde::Deserialize;
use std::net::{SocketAddr, ToSocketAddrs};
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
#[derive(Debug, Clone)]
pub struct MemcachedServer {
    /// As written (`host:port`), the name ketama hashes.
    pub name: String,
    pub addr: SocketAddr,
    pub weight: u32,
}

/// The validated shared-tier settings.
#[derive(Debug, Clone)]
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
    let key = "cache.memcached.fill_lease";
    let d =
        parse_duration(value.as_deref().unwrap_or("3s")).map_err(|e| ConfigError::new(key, e))?;
    if d.subsec_nanos() != 0 {
        return Err(ConfigError::new(
            key,
            "must be whole seconds (memcached expires keys by the second)",
        ));
    }
    if d > Duration::from_secs(60) {
        return Err(ConfigError::new(key, "must be at most 60s"));
    }
    Ok(d)
}

fn duration(key: &str, value: &Option<String>, default: &str) -> Result<Duration, ConfigError> {
    let d = parse_duration(value.as_deref().unwrap_or(default))
        .map_err(|e| ConfigError::new(format!("cache.memcached.{key}"), e))?;
    if d.is_zero() {
        return Err(ConfigError::new(
            format!("cache.memcached.{key}"),
            "must be greater than zero",
        ));
    }
    Ok(d)
}

/// Validates the section; `None` when no servers are configured.
pub fn validate(section: &MemcachedSection) -> Result<Option<MemcachedConfig>, ConfigError> {
    let entries = match &section.servers {
        None => return Ok(None),
        Some(list) if list.is_empty() => return Ok(None),
        Some(list) => list,
    };
    let mut servers = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = format!("cache.memcached.servers[{i}]");
        let (name, weight) = match entry {
            ServerEntry::Plain(addr) => (addr.trim().to_string(), 1),
            ServerEntry::Weighted { addr, weight } => {
                if *weight <= 0 || *weight > 1000 {
                    return Err(ConfigError::new(
                        format!("{key}.weight"),
                        format!("{weight} is outside 1..=1000"),
                    ));
                }
                (addr.trim().to_string(), *weight as u32)
            }
        };
        let addr = name
            .to_socket_addrs()
            .map_err(|e| {
                ConfigError::new(&key, format!("\"{name}\" is not a usable HOST:PORT: {e}"))
            })?
            .next()
            .ok_or_else(|| ConfigError::new(&key, format!("\"{name}\" resolves to no address")))?;
        if servers.iter().any(|s: &MemcachedServer| s.name == name) {
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
    let pool_size = match section.pool_size {
        None => 8,
        Some(n) if (1..=1024).contains(&n) => n as usize,
        Some(n) => {
            return Err(ConfigError::new(
                "cache.memcached.pool_size",
                format!("{n} is outside 1..=1024"),
            ))
        }
    };
    let failure_limit = match section.failure_limit {
        None => 3,
        Some(n) if (1..=1000).contains(&n) => n as u32,
        Some(n) => {
            return Err(ConfigError::new(
                "cache.memcached.failure_limit",
                format!("{n} is outside 1..=1000"),
            ))
        }
    };
    let item_size = parse_size(section.item_size.as_deref().unwrap_or("1MiB"))
        .map_err(|e| ConfigError::new("cache.memcached.item_size", e))?
        as usize;
    if !(4096..=128 << 20).contains(&item_size) {
        return Err(ConfigError::new(
            "cache.memcached.item_size",
            "must be between 4KiB and 128MiB",
        ));
    }
    Ok(Some(MemcachedConfig {
        servers,
        namespace,
        connect_timeout: duration("connect_timeout", &section.connect_timeout, "50ms")?,
        op_timeout: duration("op_timeout", &section.op_timeout, "100ms")?,
        pool_size,
        // zero is allowed: no local copies at all, every hit is read from memcached
        local_ttl: parse_duration(section.local_ttl.as_deref().unwrap_or("5s"))
            .map_err(|e| ConfigError::new("cache.memcached.local_ttl", e))?,
        failure_limit,
        retry_after: duration("retry_after", &section.retry_after, "5s")?,
        rehash_on_eject: section.rehash_on_eject.unwrap_or(false),
        item_size,
        keep: parse_duration(section.keep.as_deref().unwrap_or("1h"))
            .map_err(|e| ConfigError::new("cache.memcached.keep", e))?,
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
