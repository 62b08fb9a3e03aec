//! A Lacquer cluster for the tests: real memcached servers, and nodes that share them, each with
//! its admin listener and invalidation API token.

use super::lacquer_process::{admin_toml, LacquerProcess};
use super::memcached::MemcachedProcess;
use super::net::free_port;
use super::origin::TestOrigin;
use super::temp_dir::TempDir;
use lacquer::storage::tiered::memcached_key;
use lacquer_memcached::ketama::KetamaRing;

/// The token every test node's invalidation API takes.
pub const ADMIN_TOKEN: &str = "test-token-0123456789abcdef";

/// Several real memcached servers.
pub struct MemcachedCluster {
    pub servers: Vec<MemcachedProcess>,
    /// Holds the token file.
    dir: TempDir,
}

/// One node of a test cluster: the process and its admin port.
pub struct Node {
    pub proxy: LacquerProcess,
    pub admin: u16,
    pub name: String,
}

impl MemcachedCluster {
    /// Whether the cluster's invalidation log on server `server` holds a record naming `path`
    /// among the long-lived records (`short: false`) or the short-lived ones, in the buckets of
    /// the last minute (their overflow parts included).
    pub fn log_names(&self, server: usize, path: &str, short: bool) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            / 10_000;
        let class = if short { "s:" } else { "" };
        (now.saturating_sub(6)..=now + 1).any(|bucket| {
            (0..lacquer::invalidation::cluster_log::PARTS).any(|part| {
                let suffix = match part {
                    0 => String::new(),
                    _ => format!(".{part}"),
                };
                self.servers[server]
                    .get_raw(&format!("lq:inval:{class}{bucket}{suffix}"))
                    .is_some_and(|value| value.windows(path.len()).any(|w| w == path.as_bytes()))
            })
        })
    }

    /// `n` servers.
    pub fn start(n: usize) -> MemcachedCluster {
        MemcachedCluster::start_with(n, &[])
    }

    /// `n` servers, each started with `extra_args` (a smaller item size limit, say).
    pub fn start_with(n: usize, extra_args: &[&str]) -> MemcachedCluster {
        let dir = TempDir::new("cluster");
        dir.write("admin.token", format!("{ADMIN_TOKEN}\n"));
        MemcachedCluster {
            servers: (0..n)
                .map(|_| MemcachedProcess::start_with(extra_args))
                .collect(),
            dir,
        }
    }

    /// The servers' names as the nodes' config lists them.
    pub fn names(&self) -> Vec<String> {
        self.servers.iter().map(|m| m.addr().to_string()).collect()
    }

    /// The server ketama places `key` on, computed apart from the proxy's own placement.
    pub fn server_for(&self, key: &str) -> usize {
        let ring = KetamaRing::new(&self.names().into_iter().map(|n| (n, 1)).collect::<Vec<_>>());
        ring.server_for(key.as_bytes()).unwrap()
    }

    /// The memcached key (default namespace) of the URL `host` + `path`.
    pub fn key_of(host: &str, path: &str) -> String {
        memcached_key("lq", &lacquer::proxy::cache_key::of_url(host, path))
    }

    /// Starts a node named `name` in front of `origin`, with `extra` TOML appended to its
    /// `[cache.memcached]` section (it is the last section written).
    pub fn node(&self, origin: &TestOrigin, name: &str, extra: &str) -> Node {
        self.node_with_invalidation(origin, name, "", extra)
    }

    /// [`MemcachedCluster::node`] with `invalidation` TOML (keys) added to its `[invalidation]`
    /// section, e.g. a `poll_interval`.
    pub fn node_with_invalidation(
        &self,
        origin: &TestOrigin,
        name: &str,
        invalidation: &str,
        extra: &str,
    ) -> Node {
        self.node_with_top_level(origin, name, "", invalidation, extra)
    }

    /// [`MemcachedCluster::node_with_invalidation`] with `top_level` TOML (keys outside any
    /// section, e.g. a `shutdown_timeout`) written before the sections.
    pub fn node_with_top_level(
        &self,
        origin: &TestOrigin,
        name: &str,
        top_level: &str,
        invalidation: &str,
        extra: &str,
    ) -> Node {
        let admin = free_port();
        let servers: Vec<String> = self.names().iter().map(|n| format!("\"{n}\"")).collect();
        let config = format!(
            "{top_level}\n[log]\naccess = \"off\"\n{}{invalidation}\n\
             [cache.memcached]\nservers = [{}]\nretry_after = \"1s\"\n\
             op_timeout = \"200ms\"\nconnect_timeout = \"100ms\"\n{extra}",
            admin_toml(admin, &self.dir.path().join("admin.token"), name),
            servers.join(", ")
        );
        Node {
            proxy: LacquerProcess::start_simple(origin.addr(), &config),
            admin,
            name: name.to_string(),
        }
    }
}
