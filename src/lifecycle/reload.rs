//! Reloading: the config file is read and validated again, and what may change is swapped in
//! while connections stay open and the memory tier keeps its objects.
//!
//! The new file goes through the same loading as at start-up (the same CLI flags laid over it,
//! every check), so a file `--check-config` accepts is a file a reload accepts. An invalid file
//! is refused: the running settings stay and the reason is logged (and returned to the admin
//! endpoint). So is a file whose rules send requests to a backend group only its own
//! `[[upstreams]]` have: those keep their running value until a hand-over. A valid one replaces
//! the [`LiveSettings`] requests read; the keys of [`super::restart_keys`] keep
//! their running value and are named in a warning.
//! A reload also reopens the access log file (for `logrotate`) and applies `log.level`.
//!
//! Reading the file may block (a FIFO, a hung network mount), so a reload runs on a thread of
//! its own ([`Reloader::start`]), never on a runtime's: at most one running and one waiting for
//! its turn, the waiting one reading the file as it is when its turn comes, so it covers every
//! reload asked meanwhile. SIGHUP and `POST /reload` share these two places.

use super::live::{Live, LiveSettings};
use super::restart_keys;
use crate::config::{rules, Cli, Config, ConfigError};
use crate::observe::access_log::AccessLog;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What a reload did with a valid file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Restart-only keys the file changed; their running value was kept.
    pub needs_restart: Vec<&'static str>,
}

impl fmt::Display for Reloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("configuration reloaded")?;
        if !self.needs_restart.is_empty() {
            write!(
                f,
                "; changed keys that need a hand-over or restart (running values kept): {}",
                self.needs_restart.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Why [`Reloader::start`] started no reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// One reload runs and another waits to read the file after it: that one covers this call.
    Waiting,
    /// The system gave no thread to run it on (logged).
    NoThread,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Busy::Waiting => {
                "a reload is running and another is waiting to read the file after it: that one \
                 covers this request"
            }
            Busy::NoThread => "no thread could be started for the reload",
        })
    }
}

/// Re-reads the config the process was started with and applies it; shared by SIGHUP and the
/// admin endpoint.
pub struct Reloader {
    /// The flags given at start, laid over the file again on every reload.
    cli: Cli,
    live: Arc<Live>,
    access_log: Option<Arc<AccessLog>>,
    /// One reload at a time, so two cannot interleave their read and their swap.
    one_at_a_time: Mutex<()>,
    /// Reload threads running or waiting for their turn ([`Reloader::start`]).
    threads: AtomicUsize,
    /// `RUST_LOG` was set at start: it, not `log.level`, decides the level.
    level_from_env: bool,
}

impl Reloader {
    /// Reloads `live` from the file named by `cli` (with `cli`'s flags over it).
    pub fn new(cli: Cli, live: Arc<Live>, access_log: Option<Arc<AccessLog>>) -> Self {
        Reloader {
            cli,
            live,
            access_log,
            one_at_a_time: Mutex::new(()),
            threads: AtomicUsize::new(0),
            level_from_env: std::env::var_os("RUST_LOG").is_some(),
        }
    }

    /// Reloads on a thread of its own and hands the outcome to `done` there; `Err(Busy)` without
    /// starting one when a reload is running and another waiting (that one reads the file after
    /// this call, so it covers it). Callers on a runtime must not call [`Self::reload`] (it
    /// blocks on the file and on a reload in progress): a blocked file would hold the runtime's
    /// thread, and two of them the whole admin listener, purges included.
    pub fn start(
        self: &Arc<Self>,
        done: impl FnOnce(Result<Reloaded, ConfigError>) + Send + 'static,
    ) -> Result<(), Busy> {
        if self.threads.fetch_add(1, Ordering::SeqCst) >= 2 {
            self.threads.fetch_sub(1, Ordering::SeqCst);
            return Err(Busy::Waiting);
        }
        let reloader = self.clone();
        let spawned = std::thread::Builder::new()
            .name("lacquer-reload".into())
            .spawn(move || {
                let outcome = reloader.reload();
                reloader.threads.fetch_sub(1, Ordering::SeqCst);
                done(outcome);
            });
        spawned.map(drop).map_err(|e| {
            self.threads.fetch_sub(1, Ordering::SeqCst);
            log::error!("configuration reload not started: no thread for it: {e}");
            Busy::NoThread
        })
    }

    /// Reads, validates and applies the config file; logs the outcome. On error nothing changed.
    /// Blocks while the file does and while another reload runs: see [`Self::start`].
    pub fn reload(&self) -> Result<Reloaded, ConfigError> {
        let _one = self.one_at_a_time.lock();
        let mut config = match Config::load(&self.cli) {
            Ok(config) => config,
            Err(e) => {
                log::error!("configuration reload refused, the running configuration stays: {e}");
                return Err(e);
            }
        };
        let running = self.live.load_full();
        let needs_restart = restart_keys::keep_running(&running.config, &mut config);
        if let Err(e) = rules::check_groups_running(&config.rules, &config.balancer.backends) {
            log::error!("configuration reload refused, the running configuration stays: {e}");
            return Err(e);
        }
        if !self.level_from_env {
            log::set_max_level(config.log.level);
        }
        self.live.store(LiveSettings::reloaded(&running, config));
        if let Some(access_log) = &self.access_log {
            access_log.reopen();
        }
        let outcome = Reloaded { needs_restart };
        if outcome.needs_restart.is_empty() {
            log::info!("{outcome}");
        } else {
            log::warn!("{outcome}");
        }
        Ok(outcome)
    }
}
