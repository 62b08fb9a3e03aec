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
//! A SIGHUP that arrives before this watcher handles it (while `main` loads the config, which
//! may wait on DNS, or while a hand-over's successor takes the listeners) neither ends the
//! process nor is lost: from the start of `main` it is noted ([`hold_hangups_until_handled`]),
//! and the watcher reloads once for it as soon as it runs. A reload runs on a thread of its own,
//! so a config file that blocks its reader (a hung network mount, a FIFO) does not keep SIGTERM,
//! SIGQUIT or SIGINT from being handled.

use super::reload::{Busy, Reloader};
use super::upgrade;
use async_trait::async_trait;
use pingora_core::server::{ShutdownSignal, ShutdownSignalWatch};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};

/// A SIGHUP arrived before [`OperatorSignals`] handled them.
static HANGUP_HELD: AtomicBool = AtomicBool::new(false);

extern "C" fn hold_hangup(_signal: libc::c_int) {
    // async-signal-safe: one atomic store
    HANGUP_HELD.store(true, Ordering::SeqCst);
}

/// Notes SIGHUP instead of ending the process, until [`OperatorSignals`] handles it (its handler
/// then replaces this one, and it reloads once for a SIGHUP noted meanwhile). Called first thing
/// in `main` (and again when the server starts, for programs that embed it).
pub fn hold_hangups_until_handled() {
    // SAFETY: sigaction(2) with a handler that only stores to an atomic; SA_RESTART, so a
    // system call the start-up is in (reading the file, a DNS look-up) is resumed, not failed.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = hold_hangup as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGHUP, &action, std::ptr::null_mut());
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

impl OperatorSignals {
    /// Reloads on a thread of its own, not awaited: reading the file may block (see the module
    /// doc). While one reload runs and another waits, a SIGHUP adds none (the waiting one reads
    /// the file after it), so a storm of them, or a file that blocks, holds two threads.
    fn reload(&self) {
        if self.reloader.start(|_| {}) == Err(Busy::Waiting) {
            log::info!("a reload is already waiting to read the file: it covers this SIGHUP");
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
        if HANGUP_HELD.swap(false, Ordering::SeqCst) {
            log::info!("SIGHUP received while starting, reloading the configuration");
            self.reload();
        }
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    log::info!("SIGHUP received, reloading the configuration");
                    self.reload();
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
