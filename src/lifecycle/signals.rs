//! The signals an operator sends, in place of Pingora's watcher (which knows no SIGHUP, so the
//! default action, ending the process, emptied the memory tier on every `systemctl reload` or
//! log rotation):
//!
//! * SIGHUP: reload the config ([`super::reload`]); the process keeps running whatever the
//!   outcome;
//! * SIGQUIT: hand the listeners to a new process waiting with `--upgrade` ([`super::upgrade`]),
//!   then drain; ignored (logged) when no new process is waiting;
//! * SIGTERM: stop accepting and drain ([`super::drain`]);
//! * SIGINT: stop at once.
//!
//! SIGHUP is ignored from the start of `main` ([`ignore_hangup_until_handled`]) until this
//! watcher installs its handler, so an early one cannot end the process either.

use super::reload::Reloader;
use super::upgrade;
use async_trait::async_trait;
use pingora_core::server::{ShutdownSignal, ShutdownSignalWatch};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};

/// Ignores SIGHUP until [`OperatorSignals`] handles it (the handler then replaces this).
pub fn ignore_hangup_until_handled() {
    // SAFETY: installs the SIG_IGN disposition, no handler code runs; done before any thread
    // that could race on the disposition exists.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
}

/// Pingora's main loop waits on this for the way to shut down; reloads happen meanwhile.
pub struct OperatorSignals {
    reloader: Arc<Reloader>,
    upgrade_sock: String,
}

impl OperatorSignals {
    /// Reloads through `reloader`; hands over through `upgrade_sock`.
    pub fn new(reloader: Arc<Reloader>, upgrade_sock: String) -> Self {
        OperatorSignals {
            reloader,
            upgrade_sock,
        }
    }
}

#[async_trait]
impl ShutdownSignalWatch for OperatorSignals {
    async fn recv(&self) -> ShutdownSignal {
        let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        let mut quit = signal(SignalKind::quit()).expect("SIGQUIT handler");
        let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    log::info!("SIGHUP received, reloading the configuration");
                    // reading and validating a file: brief, and nothing else runs on this thread
                    let _ = self.reloader.reload();
                }
                _ = quit.recv() => {
                    if upgrade::successor_waiting(&self.upgrade_sock) {
                        return ShutdownSignal::GracefulUpgrade;
                    }
                    log::error!(
                        "SIGQUIT ignored: no new process is waiting on {} (start `lacquer \
                         --upgrade` with the same config first); still serving",
                        self.upgrade_sock
                    );
                }
                _ = terminate.recv() => return ShutdownSignal::GracefulTerminate,
                _ = interrupt.recv() => return ShutdownSignal::FastShutdown,
            }
        }
    }
}
