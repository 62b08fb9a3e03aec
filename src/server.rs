//! Start-up: turns a validated [`Config`] into a running Pingora server.
//!
//! The client side is bounded by `[server]`'s limits ([`ClientLimits`]): the request-head
//! deadline and sizes and the HTTP/2 idle timeout go into Pingora's server options (the head
//! limits through the vendored pingora-core's patches, `vendor/README.md`), and the number of
//! connections is capped around the proxy ([`connection_cap`]).
//!
//! What happens after start-up (SIGHUP reload, SIGQUIT hand-over, SIGTERM drain) is
//! [`crate::lifecycle`]'s: this module wires it in, passing Pingora our signal watcher, our
//! `upgrade_sock` and `--upgrade`, and a grace period just past `shutdown_timeout` that the drain
//! watcher ends as soon as no request is left.

mod connection_cap;

use crate::admin::sources::ProxyCounters;
use crate::admin::AdminApp;
use crate::config::{Cli, ClientLimits, Config};
use crate::invalidation::{InvalidationService, Invalidator};
use crate::lifecycle::drain::{self, InFlightRequests};
use crate::lifecycle::live::{Live, LiveSettings};
use crate::lifecycle::reload::Reloader;
use crate::lifecycle::signals::{self, OperatorSignals};
use crate::lifecycle::upgrade;
use crate::observe::access_log::AccessLog;
use crate::proxy::hooks::PhaseHooks;
use crate::proxy::LacquerProxy;
use crate::proxy_protocol::{PreTlsHeader, ProxyProtocolApp, ProxyProtocolListeners};
use crate::storage::ban_list::tags::TagField;
use crate::storage::ban_list::BanList;
use crate::storage::memory::MemoryTier;
use crate::storage::tiered::TieredStorage;
use crate::upstream::health::HealthChecker;
use crate::upstream::resolver::Resolver;
use connection_cap::ConnectionCap;
use pingora_core::apps::HttpServerOptions;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig, Listeners};
use pingora_core::protocols::http::v2::server::{default_h2_options, H2Options};
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{RunArgs, Server};
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Why the server could not start.
#[derive(Debug)]
pub struct StartError(String);

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// The logger lets everything through and `log::set_max_level` filters, so a reload can change
/// `log.level`; with `RUST_LOG` set, it decides instead, as before.
fn init_logging(config: &Config) {
    let from_env = std::env::var_os("RUST_LOG").is_some();
    let _ = env_logger::Builder::new()
        .filter_level(log::LevelFilter::Trace)
        .parse_default_env()
        .format_timestamp_millis()
        .try_init();
    if !from_env {
        log::set_max_level(config.log.level);
    }
}

fn server_conf(config: &Config) -> ServerConf {
    // the drain watcher exits once no request is left; Pingora's grace sleep, one second past
    // `shutdown_timeout`, is only a backstop, and its runtime shutdown drops what is left
    let drain_backstop = config.shutdown_timeout.as_secs_f64().ceil() as u64 + 1;
    ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(drain_backstop),
        graceful_shutdown_timeout_seconds: Some(0),
        upstream_keepalive_pool_size: config.upstream_keepalive_pool,
        upgrade_sock: config.upgrade_sock.clone(),
        ..ServerConf::default()
    }
}

/// Pingora's options for client connections: h2c, HTTP/1.1 pipelining (RFC 9112 §9.3.2: every
/// pipelined request answered in order; Pingora closes after the first without it), and the
/// bounds of `[server]`.
fn client_options(h2c: bool, limits: &ClientLimits) -> HttpServerOptions {
    let mut options = HttpServerOptions::default();
    options.h2c = h2c;
    options.h1_pipelining = true;
    options.request_head_timeout = Some(limits.header_read_timeout);
    options.request_head_max_bytes = Some(limits.max_header_size);
    options.request_line_max_bytes = Some(limits.max_request_line);
    options.h2_idle_timeout = Some(limits.h2_idle_timeout);
    options
}

/// Pingora's bounded HTTP/2 defaults, with the header list limited like an HTTP/1 head.
fn h2_options(limits: &ClientLimits) -> H2Options {
    let mut options = default_h2_options();
    options.max_header_list_size(u32::try_from(limits.max_header_size).unwrap_or(u32::MAX));
    options
}

/// Builds the memory tier the config asks for, judged by `bans`; with a shared tier it becomes
/// a near cache.
pub fn memory_tier(config: &Config, bans: &'static BanList) -> &'static MemoryTier {
    let mut memory = MemoryTier::new(
        config.cache.memory_size,
        config.cache.max_object_size,
        config.cache.estimated_objects,
    );
    if let Some(shared) = &config.cache.memcached {
        memory.set_local_ttl(shared.local_ttl);
    }
    memory.set_ban_list(bans);
    memory.leak()
}

/// The ban list every tier judges entries by (see [`crate::invalidation`]).
pub fn ban_list(config: &Config) -> &'static BanList {
    let tags = config
        .invalidation
        .tag_header
        .as_deref()
        .and_then(TagField::new);
    BanList::new(config.invalidation.retention, tags).leak()
}

/// Runs the server until a signal stops the process; returns only on a start-up failure.
/// `cli` is what the process was started with: a reload reads the same file with the same flags.
pub fn run(config: Config, cli: &Cli) -> Result<Infallible, StartError> {
    serve(config, cli, None)
}

/// [`run`] with an embedding program's own code in the request path (see
/// [`crate::proxy::hooks`]; `examples/device_rule.rs` is a complete program).
pub fn run_with_hooks(
    config: Config,
    cli: &Cli,
    hooks: Arc<dyn PhaseHooks>,
) -> Result<Infallible, StartError> {
    serve(config, cli, Some(hooks))
}

fn serve(
    config: Config,
    cli: &Cli,
    hooks: Option<Arc<dyn PhaseHooks>>,
) -> Result<Infallible, StartError> {
    signals::hold_hangups_until_handled();
    init_logging(&config);
    let options = upgrade::pingora_options(cli.upgrade);
    let mut server = Server::new_with_opt_and_conf(options, server_conf(&config));
    // with --upgrade, this waits for the running process's listeners (see lifecycle::upgrade)
    server.bootstrap();

    let bans = ban_list(&config);
    let memory = memory_tier(&config, bans);
    let access_log = AccessLog::start(&config.log.access, config.log.format)
        .map_err(|e| StartError(format!("log.access: cannot open: {e}")))?
        .map(Arc::new);
    let in_flight = InFlightRequests::leak();
    let live = Arc::new(Live::new(LiveSettings::initial(config)));
    let reloader = Arc::new(Reloader::new(cli.clone(), live.clone(), access_log.clone()));
    let config = live.load_full().config.clone();

    let tiered: Option<&'static TieredStorage> = config
        .cache
        .memcached
        .as_ref()
        .map(|shared| &*Box::leak(Box::new(TieredStorage::new(memory, shared, bans))));
    let shared_writes: drain::Count = match tiered {
        Some(tiered) => {
            let counters = tiered.counters.clone();
            Box::new(move || counters.background.load(Ordering::Acquire))
        }
        None => Box::new(|| 0),
    };
    let release_fill_leases: drain::OnCut = match tiered {
        Some(tiered) => Box::new(move || {
            // the drain thread runs in no runtime: one of its own carries the deletes
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                let released = runtime.block_on(tiered.fill_leases().release_held());
                log::info!("released {released} fill leases held by the requests cut");
            }
        }),
        None => Box::new(|| {}),
    };
    let invalidator = Invalidator::new(&config.invalidation, bans, memory, tiered).leak();
    server.add_service(background_service(
        "invalidation",
        InvalidationService(invalidator),
    ));
    let mut proxy = LacquerProxy::new(
        live.clone(),
        memory,
        tiered,
        invalidator,
        access_log,
        in_flight,
    );
    if let Some(hooks) = hooks {
        proxy = proxy.with_hooks(hooks);
    }
    let replicas = proxy.upstream().replicas().clone();
    let proxy_counters = ProxyCounters {
        requests: proxy.metrics(),
        decoded_copies: proxy.decoded_copies(),
        live: live.clone(),
        read_ahead: proxy.read_ahead(),
    };
    if let Some(checks) = &config.balancer.health_check {
        let checker = HealthChecker::new(replicas.clone(), checks.clone());
        server.add_service(background_service("health checks", checker));
    }
    let any_name = config
        .balancer
        .backends
        .iter()
        .any(|b| b.address.name().is_some());
    if let (Some(interval), true) = (config.balancer.resolve_interval, any_name) {
        let resolver = Resolver::new(replicas.clone(), interval);
        server.add_service(background_service("origin name resolver", resolver));
    }
    let mut http = pingora_proxy::http_proxy(&server.configuration, proxy);
    http.server_options = Some(client_options(config.h2c, &config.client_limits));
    http.h2_options = Some(h2_options(&config.client_limits));
    let mut listeners = Listeners::new();
    let buffers = L4BufferSettings::default()
        .read(config.read_buffer)
        .write(config.write_buffer);
    for addr in &config.listen {
        listeners.add_listener(ListenerConfig::tcp(addr.to_string()).l4_buffer(buffers));
    }
    if let Some(tls) = &config.tls {
        for addr in &tls.listen {
            let mut settings = TlsSettings::intermediate(&tls.cert, &tls.key)
                .map_err(|e| StartError(format!("tls.cert/tls.key: {e}")))?;
            settings.enable_h2();
            listeners.add_listener(
                ListenerConfig::tcp(addr.to_string())
                    .tls(settings)
                    .l4_buffer(buffers),
            );
        }
    }
    let expecting_header = ProxyProtocolListeners::new(
        config
            .proxy_protocol_listen
            .iter()
            .chain(config.tls.iter().flat_map(|tls| &tls.proxy_protocol))
            .copied()
            .collect(),
        config.client_limits.header_read_timeout,
    );
    if !expecting_header.is_empty() {
        listeners.set_pre_tls_callback(Arc::new(PreTlsHeader(expecting_header.clone())));
    }
    let app = ConnectionCap::new(
        ProxyProtocolApp::new(http, expecting_header),
        config.client_limits.max_connections,
    );
    drain::watch(
        server.watch_execution_phase(),
        in_flight,
        shared_writes,
        Box::new(app.serving()),
        release_fill_leases,
        config.shutdown_timeout,
    )
    .map_err(|e| StartError(format!("cannot start the drain watcher: {e}")))?;
    server.add_service(Service::with_listeners(
        "lacquer".to_string(),
        listeners,
        app,
    ));

    if let Some(addr) = config.admin_listen {
        let mut admin = Service::new(
            "lacquer admin".to_string(),
            AdminApp::new(
                memory,
                tiered,
                replicas.clone(),
                invalidator,
                config.admin_access.clone(),
                reloader.clone(),
            )
            .with_proxy_counters(proxy_counters),
        );
        admin.add_tcp(&addr.to_string());
        server.add_service(admin);
    }

    log::info!(
        "lacquer listening on {:?} -> origin {} ({} threads, memory tier {} bytes)",
        config.listen,
        config
            .balancer
            .backends
            .iter()
            .map(|b| b.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        config.threads,
        config.cache.memory_size
    );
    let signals = OperatorSignals::new(reloader, config.upgrade_sock.clone());
    server.run(RunArgs {
        shutdown_signal: Box::new(signals),
    });
    std::process::exit(0)
}
