//! Active health checks: every `interval`, each backend is sent `GET <path>` on a fresh
//! connection; a response with `expect_status` within `timeout` is a success. `fall`
//! consecutive failures take a backend out of rotation, `rise` consecutive successes bring it
//! back. State changes are logged at `warn`/`info`.
//!
//! The checker runs as a Pingora background service ([`HealthChecker`]), one task per replica,
//! so a replica that hangs does not delay the verdict on the others. Every `interval` it also
//! compares its tasks with the replica list (which the resolver changes when a name's addresses
//! do): a new replica gets a task (it starts healthy, as at start-up), a vanished one's task ends.
//!
//! An `https` backend is probed over TLS, verified as its requests are (same SNI, roots and
//! client certificate, through Pingora's connector): a certificate that stops verifying takes
//! the backend down like a connection that fails.

use super::backend::Backend;
use super::replicas::Replicas;
use crate::config::balancing::ActiveHealthConfig;
use async_trait::async_trait;
use pingora_core::connectors::TransportConnector;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Probes every replica of a pool until shutdown.
pub struct HealthChecker {
    replicas: Arc<Replicas>,
    config: ActiveHealthConfig,
}

impl HealthChecker {
    /// A checker for the replicas, as they are now and as the resolver changes them.
    pub fn new(replicas: Arc<Replicas>, config: ActiveHealthConfig) -> Self {
        HealthChecker { replicas, config }
    }
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tasks: Vec<(Arc<Backend>, tokio::task::JoinHandle<()>)> = Vec::new();
        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let set = self.replicas.load();
            tasks.retain(|(backend, task)| {
                let kept = set.backends.iter().any(|b| Arc::ptr_eq(b, backend));
                if !kept {
                    task.abort();
                }
                kept
            });
            for backend in &set.backends {
                if !tasks.iter().any(|(b, _)| Arc::ptr_eq(b, backend)) {
                    let task = watch(backend.clone(), self.replicas.clone(), self.config.clone());
                    tasks.push((backend.clone(), tokio::spawn(task)));
                }
            }
            drop(set);
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.changed() => break,
            }
        }
        for (_, task) in tasks {
            task.abort();
        }
    }
}

/// Consecutive results, turned into up/down transitions by the rise/fall thresholds.
#[derive(Debug, Default)]
struct Streak {
    successes: u32,
    failures: u32,
}

impl Streak {
    /// Records one probe result; returns the new verdict when a threshold is crossed.
    fn record(&mut self, ok: bool, currently_up: bool, rise: u32, fall: u32) -> Option<bool> {
        if ok {
            self.successes += 1;
            self.failures = 0;
            (!currently_up && self.successes >= rise).then_some(true)
        } else {
            self.failures += 1;
            self.successes = 0;
            (currently_up && self.failures >= fall).then_some(false)
        }
    }
}

async fn watch(backend: Arc<Backend>, replicas: Arc<Replicas>, config: ActiveHealthConfig) {
    let mut streak = Streak::default();
    // one connector per TLS replica: building one reads the system roots
    let is_tls = replicas
        .entries()
        .get(backend.entry)
        .is_some_and(|e| e.tls.is_some());
    let tls = is_tls.then(|| TransportConnector::new(None));
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let peer = replicas.peer(&backend);
        let probe = probe(&backend, &peer, &config, tls.as_ref());
        let result = tokio::time::timeout(config.timeout, probe).await;
        let (ok, detail) = match result {
            Ok(Ok(status)) if status == config.expect_status => (true, format!("status {status}")),
            Ok(Ok(status)) => (false, format!("status {status}")),
            Ok(Err(e)) => (false, e.to_string()),
            Err(_) => (false, format!("no answer within {:?}", config.timeout)),
        };
        if let Some(up) = streak.record(ok, backend.active_up(), config.rise, config.fall) {
            backend.set_active_up(up);
            if up {
                log::info!(
                    "backend {} is up: {} consecutive health checks passed",
                    backend.label(),
                    config.rise
                );
            } else {
                log::warn!(
                    "backend {} is down: {} consecutive health checks failed (last: {detail})",
                    backend.label(),
                    config.fall
                );
            }
        }
    }
}

/// One `GET` on a fresh connection (over TLS with `tls`); returns the response status.
async fn probe(
    backend: &Backend,
    peer: &pingora_core::upstreams::peer::HttpPeer,
    config: &ActiveHealthConfig,
    tls: Option<&TransportConnector>,
) -> std::io::Result<u16> {
    match tls {
        None => exchange(TcpStream::connect(backend.addr).await?, backend, config).await,
        Some(connector) => {
            let stream = connector
                .new_stream(peer)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            exchange(stream, backend, config).await
        }
    }
}

/// Sends the probe on `stream` and reads the status line.
async fn exchange(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    backend: &Backend,
    config: &ActiveHealthConfig,
) -> std::io::Result<u16> {
    let host = config.host.as_deref().unwrap_or(&backend.name);
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: lacquer-health-check\r\nConnection: close\r\n\r\n",
        config.path
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    parse_status(&head)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status line"))
}

fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rise_and_fall_need_consecutive_results() {
        let mut s = Streak::default();
        assert_eq!(s.record(false, true, 2, 3), None);
        assert_eq!(s.record(false, true, 2, 3), None);
        assert_eq!(s.record(true, true, 2, 3), None);
        assert_eq!(s.record(false, true, 2, 3), None);
        assert_eq!(s.record(false, true, 2, 3), None);
        assert_eq!(s.record(false, true, 2, 3), Some(false));
        assert_eq!(s.record(true, false, 2, 3), None);
        assert_eq!(s.record(true, false, 2, 3), Some(true));
    }

    #[test]
    fn status_line_parsing() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.0 503 x\r\n"), Some(503));
        assert_eq!(parse_status(b"garbage\r\n"), None);
    }
}
