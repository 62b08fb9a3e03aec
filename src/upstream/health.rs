//! Active health checks: every `interval`, each backend is sent `GET <path>` on a fresh
//! connection; a response with `expect_status` within `timeout` is a success. `fall`
//! consecutive failures take a backend out of rotation, `rise` consecutive successes bring it
//! back. State changes are logged at `warn`/`info`.
//!
//! The checker runs as a Pingora background service ([`HealthChecker`]), one task per backend,
//! so a backend that hangs does not delay the verdict on the others.
//!
//! An `https` backend is probed over TLS, verified as its requests are (same SNI, roots and
//! client certificate, through Pingora's connector): a certificate that stops verifying takes
//! the backend down like a connection that fails.

use super::backend::Backend;
use crate::config::balancing::ActiveHealthConfig;
use async_trait::async_trait;
use pingora_core::connectors::TransportConnector;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Probes every backend of a pool until shutdown.
pub struct HealthChecker {
    backends: Vec<Arc<Backend>>,
    config: ActiveHealthConfig,
}

impl HealthChecker {
    /// A checker for these backends.
    pub fn new(backends: Vec<Arc<Backend>>, config: ActiveHealthConfig) -> Self {
        HealthChecker { backends, config }
    }
}

#[async_trait]
impl BackgroundService for HealthChecker {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let tasks: Vec<_> = self
            .backends
            .iter()
            .map(|backend| tokio::spawn(watch(backend.clone(), self.config.clone())))
            .collect();
        let _ = shutdown.changed().await;
        for task in tasks {
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

async fn watch(backend: Arc<Backend>, config: ActiveHealthConfig) {
    let mut streak = Streak::default();
    // one connector per TLS backend: building one reads the system roots
    let tls = backend.tls.as_ref().map(|_| TransportConnector::new(None));
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let result =
            tokio::time::timeout(config.timeout, probe(&backend, &config, tls.as_ref())).await;
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
                    backend.name,
                    config.rise
                );
            } else {
                log::warn!(
                    "backend {} is down: {} consecutive health checks failed (last: {detail})",
                    backend.name,
                    config.fall
                );
            }
        }
    }
}

/// One `GET` on a fresh connection (over TLS with `tls`); returns the response status.
async fn probe(
    backend: &Backend,
    config: &ActiveHealthConfig,
    tls: Option<&TransportConnector>,
) -> std::io::Result<u16> {
    match tls {
        None => exchange(TcpStream::connect(backend.addr).await?, backend, config).await,
        Some(connector) => {
            let stream = connector
                .new_stream(&backend.peer())
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
