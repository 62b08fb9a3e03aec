//! `[invalidation]`: how purges and bans reach every node (the poll interval of the cluster's
//! invalidation log), how long they are remembered, the tag field, and this node's name in
//! reports.

use super::{check, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// `[invalidation]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvalidationSection {
    /// How often each node reads the cluster's invalidation log: the bound on how long a purge
    /// made through another node takes to reach this one (plus one memcached round trip).
    pub poll_interval: Option<String>,
    /// How long purges and bans are remembered; memcached entries older than this are refetched.
    pub retention: Option<String>,
    /// The response field that names an entry's tags (`Surrogate-Key`, `xkey`); `""` for none.
    pub tag_header: Option<String>,
    /// Pass the tag field on to clients (it is removed by default: it is meant for the cache).
    pub forward_tag_header: Option<bool>,
    /// This node's name in purge reports and the other nodes' logs.
    pub node_name: Option<String>,
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct InvalidationConfig {
    pub poll_interval: Duration,
    pub retention: Duration,
    /// Lowercase; `None` when tags are off.
    pub tag_header: Option<String>,
    pub forward_tag_header: bool,
    pub node_name: String,
}

/// Validates the section; `first_listen_port` names the node when `node_name` is absent.
pub fn validate(
    section: &InvalidationSection,
    first_listen_port: Option<u16>,
) -> Result<InvalidationConfig, ConfigError> {
    let poll_interval = check::positive_duration(
        "invalidation.poll_interval",
        &section.poll_interval,
        Duration::from_millis(250),
    )?;
    if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&poll_interval) {
        return Err(ConfigError::new(
            "invalidation.poll_interval",
            "must be between 10ms and 10s",
        ));
    }
    let retention = check::duration(
        "invalidation.retention",
        &section.retention,
        Duration::from_secs(24 * 3600),
    )?;
    if !(Duration::from_secs(60)..=Duration::from_secs(7 * 24 * 3600)).contains(&retention) {
        return Err(ConfigError::new(
            "invalidation.retention",
            "must be between 1m and 7d (the log is read back that far when a node starts)",
        ));
    }
    let tag_header = match section.tag_header.as_deref().unwrap_or("surrogate-key") {
        "" => None,
        name => Some(check::header_name("invalidation.tag_header", name)?),
    };
    let node_name = match &section.node_name {
        Some(name) => {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return Err(ConfigError::new(
                    "invalidation.node_name",
                    "must be 1-128 characters without control characters",
                ));
            }
            name.clone()
        }
        None => default_node_name(first_listen_port),
    };
    Ok(InvalidationConfig {
        poll_interval,
        retention,
        tag_header,
        forward_tag_header: section.forward_tag_header.unwrap_or(false),
        node_name,
    })
}

/// `{hostname}:{first listen port}`: distinct for nodes on different hosts, and for nodes on one.
fn default_node_name(port: Option<u16>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "lacquer".into());
    match port {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> InvalidationSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_and_bounds() {
        let config = validate(&section(""), Some(6081)).unwrap();
        assert_eq!(config.poll_interval, Duration::from_millis(250));
        assert_eq!(config.retention, Duration::from_secs(86_400));
        assert_eq!(config.tag_header.as_deref(), Some("surrogate-key"));
        assert!(!config.forward_tag_header);
        assert!(config.node_name.ends_with(":6081"), "{}", config.node_name);
        let off = validate(&section("tag_header = \"\""), None).unwrap();
        assert_eq!(off.tag_header, None);
        for (text, key) in [
            ("poll_interval = \"5ms\"", "invalidation.poll_interval"),
            ("poll_interval = \"0s\"", "invalidation.poll_interval"),
            ("retention = \"30s\"", "invalidation.retention"),
            ("retention = \"8d\"", "invalidation.retention"),
            ("tag_header = \"x key\"", "invalidation.tag_header"),
            ("node_name = \"\"", "invalidation.node_name"),
        ] {
            let err = validate(&section(text), None).unwrap_err();
            assert_eq!(err.key, key, "{text}: {err}");
        }
    }
}
