//! The top-level keys and `[server]`: where this process listens, how many workers it runs, how
//! it shuts down, how many idle origin connections it keeps, and how it writes to clients.

use super::check;
use super::ConfigError;
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

/// `[server]` as written: the client-facing side.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Accept HTTP/2 prior knowledge (h2c) on plain listeners.
    pub h2c: Option<bool>,
    /// Per-connection write buffer for clients, e.g. "16KiB".
    pub write_buffer: Option<String>,
    /// The Unix socket a hand-over passes the listening sockets through (`lacquer --upgrade`).
    pub upgrade_sock: Option<String>,
}

/// The default plain listener, Varnish's customary port.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:6081";

/// Where a hand-over passes the listening sockets by default. Two Lacquer instances on one host
/// each need their own.
pub const DEFAULT_UPGRADE_SOCK: &str = "/tmp/lacquer-upgrade.sock";

/// The largest `server.write_buffer`: it is allocated per client connection.
const MAX_WRITE_BUFFER: usize = 1 << 20;

/// The validated process settings; [`super::Config`] keeps them as its top-level fields.
pub(super) struct ServerSettings {
    pub listen: Vec<SocketAddr>,
    /// The plain listeners whose connections start with a PROXY protocol header.
    pub proxy_protocol: Vec<SocketAddr>,
    pub threads: usize,
    pub grace_period: Duration,
    pub shutdown_timeout: Duration,
    pub upstream_keepalive_pool: usize,
    pub h2c: bool,
    pub write_buffer: usize,
    pub upgrade_sock: String,
}

/// The top-level keys of the file that configure the server, with `[server]`: borrowed from the
/// file by the caller, so this section does not depend on the file's whole shape.
pub(super) struct ServerKeys<'a> {
    pub listen: &'a Option<Vec<String>>,
    pub threads: Option<i64>,
    pub grace_period: &'a Option<String>,
    pub shutdown_timeout: &'a Option<String>,
    pub upstream_keepalive_pool: Option<i64>,
    pub server: &'a ServerSection,
}

/// Validates `listen`, `threads`, `grace_period`, `shutdown_timeout`,
/// `upstream_keepalive_pool` and `[server]` (`server.upgrade_sock`: an absolute path).
pub(super) fn validate(file: ServerKeys<'_>) -> Result<ServerSettings, ConfigError> {
    let (listen, proxy_protocol) = match &file.listen {
        Some(list) if list.is_empty() => {
            return Err(ConfigError::new("listen", "needs at least one address"))
        }
        Some(list) => check::listen_addrs("listen", list)?,
        None => (
            vec![DEFAULT_LISTEN.parse().expect("default listen address")],
            Vec::new(),
        ),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = check::integer("threads", file.threads, cores, 1..=1024)?;
    let grace_period = check::duration("grace_period", file.grace_period, Duration::from_secs(5))?;
    let shutdown_timeout = check::duration(
        "shutdown_timeout",
        file.shutdown_timeout,
        Duration::from_secs(10),
    )?;
    let upstream_keepalive_pool = check::integer(
        "upstream_keepalive_pool",
        file.upstream_keepalive_pool,
        128,
        0..=i64::MAX,
    )?;
    let write_buffer = check::size("server.write_buffer", &file.server.write_buffer, 16 << 10)?;
    if write_buffer > MAX_WRITE_BUFFER {
        return Err(ConfigError::new(
            "server.write_buffer",
            format!("{write_buffer} bytes is more than the 1MiB allowed per connection"),
        ));
    }
    let upgrade_sock = file
        .server
        .upgrade_sock
        .clone()
        .unwrap_or_else(|| DEFAULT_UPGRADE_SOCK.to_string());
    if !upgrade_sock.starts_with('/') {
        return Err(ConfigError::new(
            "server.upgrade_sock",
            format!("{upgrade_sock:?} is not an absolute path"),
        ));
    }
    Ok(ServerSettings {
        listen,
        proxy_protocol,
        threads,
        grace_period,
        shutdown_timeout,
        upstream_keepalive_pool,
        h2c: file.server.h2c.unwrap_or(true),
        write_buffer,
        upgrade_sock,
    })
}
