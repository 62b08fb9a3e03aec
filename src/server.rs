//! Start-up: turns a validated [`Config`] into a running Pingora server.
//!
//! Signals are Pingora's: SIGINT stops at once (fast shutdown), SIGTERM stops accepting, waits
//! `grace_period` and then drains for at most `shutdown_timeout`, SIGQUIT hands listeners to a new
//! process (graceful upgrade). Pingora's own default grace period is 300 s; ours is 5 s.

use crate::admin::AdminApp;
use crate::config::Config;
use crate::invalidation::{InvalidationService, Invalidator};
use crate::observe::access_log::AccessLog;
use crate::proxy::hooks::PhaseHooks;
use crate::proxy::LacquerProxy;
use crate::storage::memory::MemoryTier;
use crate::storage::rules::tags::TagField;
use crate::storage::rules::RuleBook;
use crate::storage::tiered::TieredStorage;
use crate::upstream::health::HealthChecker;
use pingora_core::apps::HttpServerOptions;
use pingora_core::listeners::tls::TlsSettings;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;
use std::convert::Infallible;
use std::fmt;
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

fn init_logging(config: &Config) {
    let _ = env_logger::Builder::new()
        .filter_level(config.log.level)
        .parse_default_env()
        .format_timestamp_millis()
        .try_init();
}

fn server_conf(config: &Config) -> ServerConf {
    ServerConf {
        threads: config.threads,
        grace_period_seconds: Some(config.grace_period.as_secs()),
        graceful_shutdown_timeout_seconds: Some(config.shutdown_timeout.as_secs()),
        upstream_keepalive_pool_size: config.upstream_keepalive_pool,
        ..ServerConf::default()
    }
}

/// Builds the memory tier the config asks for, judged by `rules`; with a shared tier it becomes
/// a near cache.
pub fn memory_tier(config: &Config, rules: &'static RuleBook) -> &'static MemoryTier {
    let mut memory = MemoryTier::new(
        config.cache.memory_size,
        config.cache.max_object_size,
        config.cache.estimated_objects,
    );
    if let Some(shared) = &config.cache.memcached {
        memory.set_local_ttl(shared.local_ttl);
    }
    memory.set_rule_book(rules);
    memory.leak()
}

/// The rule book every tier judges entries by (see [`crate::invalidation`]).
pub fn rule_book(config: &Config) -> &'static RuleBook {
    let tags = config
        .invalidation
        .tag_header
        .as_deref()
        .and_then(TagField::new);
    RuleBook::new(config.invalidation.retention, tags).leak()
}

/// Runs the server until a signal stops the process; returns only on a start-up failure.
pub fn run(config: Config) -> Result<Infallible, StartError> {
    serve(config, None)
}

/// [`run`] with an embedding program's own code in the request path (see
/// [`crate::proxy::hooks`]; `examples/device_rule.rs` is a complete program).
pub fn run_with_hooks(
    config: Config,
    hooks: Arc<dyn PhaseHooks>,
) -> Result<Infallible, StartError> {
    serve(config, Some(hooks))
}

fn serve(config: Config, hooks: Option<Arc<dyn PhaseHooks>>) -> Result<Infallible, StartError> {
    init_logging(&config);
    let mut server = Server::new_with_opt_and_conf(None, server_conf(&config));
    server.bootstrap();

    let rules = rule_book(&config);
    let memory = memory_tier(&config, rules);
    let access_log = AccessLog::start(&config.log.access, config.log.format)
        .map_err(|e| StartError(format!("log.access: cannot open: {e}")))?;
    let config = Arc::new(config);

    let tiered: Option<&'static TieredStorage> = config
        .cache
        .memcached
        .as_ref()
        .map(|shared| &*Box::leak(Box::new(TieredStorage::new(memory, shared, rules))));
    let invalidator = Invalidator::new(&config.invalidation, rules, memory, tiered).leak();
    server.add_service(background_service(
        "invalidation",
        InvalidationService(invalidator),
    ));
    let mut proxy = LacquerProxy::new(config.clone(), memory, tiered, invalidator, access_log);
    if let Some(hooks) = hooks {
        proxy = proxy.with_hooks(hooks);
    }
    let backends = proxy.upstream().backends().to_vec();
    if let Some(checks) = &config.balancer.health_check {
        let checker = HealthChecker::new(backends.clone(), checks.clone());
        server.add_service(background_service("health checks", checker));
    }
    let mut service =
        pingora_proxy::http_proxy_service_with_name(&server.configuration, proxy, "lacquer");
    if config.h2c {
        let mut options = HttpServerOptions::default();
        options.h2c = true;
        if let Some(app) = service.app_logic_mut() {
            app.server_options = Some(options);
        }
    }
    let buffers = L4BufferSettings::default().write(config.write_buffer);
    for addr in &config.listen {
        service.add_listener(ListenerConfig::tcp(addr.to_string()).l4_buffer(buffers));
    }
    if let Some(tls) = &config.tls {
        for addr in &tls.listen {
            let mut settings = TlsSettings::intermediate(&tls.cert, &tls.key)
                .map_err(|e| StartError(format!("tls.cert/tls.key: {e}")))?;
            settings.enable_h2();
            service.add_listener(
                ListenerConfig::tcp(addr.to_string())
                    .tls(settings)
                    .l4_buffer(buffers),
            );
        }
    }
    server.add_service(service);

    if let Some(addr) = config.admin_listen {
        let mut admin = Service::new(
            "lacquer admin".to_string(),
            AdminApp::new(
                memory,
                tiered,
                backends.clone(),
                invalidator,
                config.admin_access.clone(),
            ),
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
    server.run_forever()
}
