//! Origin host names looked up again every `balancer.resolve_interval`, off the request path.
//!
//! The [`Resolver`] is a Pingora background service: on each tick it looks up every backend
//! configured by name (`HOSTNAME:PORT`; literal addresses never change), all at once, through
//! tokio's `lookup_host` (the system resolver on a blocking thread, so `/etc/hosts`, DNS and
//! whatever `nsswitch.conf` says, as at start-up), and hands each answer to
//! [`Replicas::follow`], which keeps the replicas of addresses that stay and swaps the list when
//! something changed. A look-up that fails or finds no address keeps the addresses the name had
//! (a resolver hiccup must not empty a pool): it is counted (`/metrics`) and logged as a warning
//! when a name starts failing, and as information when it resolves again.

use super::replicas::Replicas;
use crate::config::origin_address::distinct;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Looks the backends' host names up again every `interval` until shutdown.
pub struct Resolver {
    replicas: Arc<Replicas>,
    interval: Duration,
}

impl Resolver {
    /// A resolver for the named backends of `replicas`.
    pub fn new(replicas: Arc<Replicas>, interval: Duration) -> Self {
        Resolver { replicas, interval }
    }
}

/// One named backend: its place in the list, its name, and whether its last look-up failed.
struct Name {
    entry: usize,
    label: String,
    host: String,
    port: u16,
    failing: bool,
}

#[async_trait]
impl BackgroundService for Resolver {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut names: Vec<Name> = self
            .replicas
            .entries()
            .iter()
            .enumerate()
            .filter_map(|(entry, backend)| {
                let (host, port) = backend.address.name()?;
                Some(Name {
                    entry,
                    label: backend.name.clone(),
                    host: host.to_string(),
                    port,
                    failing: false,
                })
            })
            .collect();
        if names.is_empty() {
            return;
        }
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is now: start-up has just looked them up
        loop {
            tokio::select! {
                _ = ticker.tick() => self.resolve_all(&mut names).await,
                _ = shutdown.changed() => return,
            }
        }
    }
}

impl Resolver {
    /// Looks every name up (at once) and applies each answer.
    async fn resolve_all(&self, names: &mut [Name]) {
        let mut lookups = tokio::task::JoinSet::new();
        for (i, name) in names.iter().enumerate() {
            let (host, port) = (name.host.clone(), name.port);
            lookups.spawn(async move { (i, lookup(&host, port).await) });
        }
        while let Some(done) = lookups.join_next().await {
            let Ok((i, answer)) = done else { continue };
            self.apply(&mut names[i], answer);
        }
    }

    fn apply(&self, name: &mut Name, answer: std::io::Result<Vec<SocketAddr>>) {
        let addrs = match answer {
            Ok(addrs) if !addrs.is_empty() => addrs,
            failed => {
                self.replicas.count_lookup_failure(name.entry);
                let why = match failed {
                    Err(e) => e.to_string(),
                    Ok(_) => "no address".to_string(),
                };
                if !name.failing {
                    log::warn!(
                        "upstream {}: looking up \"{}\" failed ({why}); keeping its addresses",
                        name.label,
                        name.host
                    );
                    name.failing = true;
                }
                return;
            }
        };
        if std::mem::take(&mut name.failing) {
            log::info!("upstream {}: \"{}\" resolves again", name.label, name.host);
        }
        if let Some(moved) = self.replicas.follow(name.entry, addrs) {
            log::info!(
                "upstream {}: \"{}\" now resolves to new addresses (added {:?}, removed {:?})",
                name.label,
                name.host,
                moved.added,
                moved.removed
            );
        }
    }
}

/// Every address of `host` (each once), with `port`.
async fn lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok(distinct(tokio::net::lookup_host((host, port)).await?))
}
