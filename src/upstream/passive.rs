//! Passive health: live traffic reports failures, and a backend with `failures` of them inside
//! `window` is ejected for `cooldown` (then offered traffic again, and ejected again if it
//! still fails). Connect errors and upstream timeouts/resets always count; 5xx responses count
//! when `count_5xx` is set.

use super::backend::Backend;
use crate::config::balancing::PassiveConfig;
use std::time::Instant;

/// What went wrong on an attempt, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Connect,
    Proxy,
    ServerError(u16),
}

/// Reports a failure of `backend`; logs when it starts an ejection.
pub fn report(backend: &Backend, failure: Failure, config: &PassiveConfig) {
    if !config.enabled {
        return;
    }
    if matches!(failure, Failure::ServerError(_)) && !config.count_5xx {
        return;
    }
    if backend.record_failure(
        Instant::now(),
        config.failures,
        config.window,
        config.cooldown,
    ) {
        log::warn!(
            "backend {} ejected for {:?}: {} failures within {:?} (last: {:?})",
            backend.label(),
            config.cooldown,
            config.failures,
            config.window,
            failure
        );
    }
}
