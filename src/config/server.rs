//! The top-level keys and `[server]`: where this process listens, how many workers it runs, how
//! it shuts down, how many idle origin connections it keeps, how it reads from and writes to
//! clients, how soon freed memory goes back to the system, and what it allows a client
//! connection ([`ClientLimits`]).

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
    /// Per-connection read buffer in front of each client socket, e.g. "0" (none) or "16KiB".
    pub read_buffer: Option<String>,
    /// How long freed memory stays in the process before it is handed back, e.g. "1s".
    pub memory_return_delay: Option<String>,
    /// How long a request head may take to arrive, e.g. "10s".
    pub header_read_timeout: Option<String>,
    /// The largest request head (request line and header fields), e.g. "32KiB".
    pub max_header_size: Option<String>,
    /// The longest request line, e.g. "8KiB".
    pub max_request_line: Option<String>,
    /// The most client connections served at once.
    pub max_connections: Option<i64>,
    /// How long an HTTP/2 client connection with no request in flight is kept, e.g. "60s".
    pub h2_idle_timeout: Option<String>,
    /// How long one write of an answer to a client may wait for the client, e.g. "60s".
    pub send_timeout: Option<String>,
    /// The Unix socket a hand-over passes the listening sockets through (`lacquer --upgrade`).
    pub upgrade_sock: Option<String>,
}

/// What a client connection may take: the bounds that keep slow, idle or oversized clients
/// from holding memory without limit (`docs/security.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// `server.header_read_timeout`: a request head not complete this long after the connection
    /// was accepted (or, on a kept-alive connection, after its first byte) gets 408.
    pub header_read_timeout: Duration,
    /// `server.max_header_size`: a larger request head gets 431 (HTTP/2: the decoded header
    /// list, which h2 answers 431 too).
    pub max_header_size: usize,
    /// `server.max_request_line`: a longer HTTP/1 request line gets 414.
    pub max_request_line: usize,
    /// `server.max_connections`: connections beyond it are closed at once, unread.
    pub max_connections: usize,
    /// `server.h2_idle_timeout`: an HTTP/2 connection with no stream in flight is closed after it.
    pub h2_idle_timeout: Duration,
    /// `server.send_timeout`: a write of an answer that a client leaves waiting this long (it
    /// reads nothing, or holds its HTTP/2 window shut) fails, and its answer is cut, so a client
    /// cannot hold a connection, or a cache fill other clients are streaming, without limit
    /// (nginx's `send_timeout`). Applied per request, so a reload changes it.
    pub send_timeout: Duration,
}

/// The largest `server.max_header_size`: the request head is buffered whole, per connection.
const MAX_HEADER_SIZE: usize = 1 << 20;

/// The default plain listener, Varnish's customary port.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:6081";

/// Where a hand-over passes the listening sockets by default. Two Lacquer instances on one host
/// each need their own.
pub const DEFAULT_UPGRADE_SOCK: &str = "/tmp/lacquer-upgrade.sock";

/// The largest `server.write_buffer` and `server.read_buffer`: each is allocated per client
/// connection (the write buffer only while a response is being written).
const MAX_CONNECTION_BUFFER: usize = 1 << 20;

/// The longest `server.memory_return_delay`: beyond an hour, memory freed by a burst would stay
/// out of the system's reach for no gain.
const MAX_MEMORY_RETURN_DELAY: Duration = Duration::from_secs(3600);

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
    pub read_buffer: usize,
    pub memory_return_delay: Duration,
    pub client_limits: ClientLimits,
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
    let write_buffer =
        connection_buffer("server.write_buffer", &file.server.write_buffer, 16 << 10)?;
    let read_buffer = connection_buffer("server.read_buffer", &file.server.read_buffer, 0)?;
    let memory_return_delay = check::duration(
        "server.memory_return_delay",
        &file.server.memory_return_delay,
        Duration::from_secs(1),
    )?;
    if memory_return_delay > MAX_MEMORY_RETURN_DELAY {
        return Err(ConfigError::new(
            "server.memory_return_delay",
            format!("{memory_return_delay:?} is longer than the 1h allowed"),
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
    let client_limits = client_limits(file.server)?;
    Ok(ServerSettings {
        client_limits,
        listen,
        proxy_protocol,
        threads,
        grace_period,
        shutdown_timeout,
        upstream_keepalive_pool,
        h2c: file.server.h2c.unwrap_or(true),
        write_buffer,
        read_buffer,
        memory_return_delay,
        upgrade_sock,
    })
}

/// A per-connection buffer size: at most [`MAX_CONNECTION_BUFFER`], as every client connection
/// allocates one.
fn connection_buffer(
    key: &str,
    value: &Option<String>,
    default: usize,
) -> Result<usize, ConfigError> {
    let size = check::size(key, value, default)?;
    if size > MAX_CONNECTION_BUFFER {
        return Err(ConfigError::new(
            key,
            format!("{size} bytes is more than the 1MiB allowed per connection"),
        ));
    }
    Ok(size)
}

/// Validates the client limits of `[server]`.
fn client_limits(server: &ServerSection) -> Result<ClientLimits, ConfigError> {
    let header_read_timeout = check::positive_duration(
        "server.header_read_timeout",
        &server.header_read_timeout,
        Duration::from_secs(10),
    )?;
    let max_header_size = check::size("server.max_header_size", &server.max_header_size, 32 << 10)?;
    if !(1024..=MAX_HEADER_SIZE).contains(&max_header_size) {
        return Err(ConfigError::new(
            "server.max_header_size",
            format!("{max_header_size} bytes is not between 1KiB and 1MiB"),
        ));
    }
    let max_request_line =
        check::size("server.max_request_line", &server.max_request_line, 8 << 10)?;
    if !(256..=max_header_size).contains(&max_request_line) {
        return Err(ConfigError::new(
            "server.max_request_line",
            format!(
                "{max_request_line} bytes is not between 256 bytes and server.max_header_size \
                 ({max_header_size} bytes)"
            ),
        ));
    }
    let max_connections = check::integer(
        "server.max_connections",
        server.max_connections,
        10_000,
        1..=10_000_000,
    )?;
    let h2_idle_timeout = check::positive_duration(
        "server.h2_idle_timeout",
        &server.h2_idle_timeout,
        Duration::from_secs(60),
    )?;
    let send_timeout = check::positive_duration(
        "server.send_timeout",
        &server.send_timeout,
        Duration::from_secs(60),
    )?;
    Ok(ClientLimits {
        header_read_timeout,
        max_header_size,
        max_request_line,
        max_connections,
        h2_idle_timeout,
        send_timeout,
    })
}
