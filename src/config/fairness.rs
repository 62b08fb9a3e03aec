//! `[fairness]`: how many requests one client may have going upstream at once, how a client is
//! told apart, and what happens to a request over its cap.

use super::{check, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// `[fairness]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairnessSection {
    /// Requests one client may have going upstream at once; 0 or absent = no cap.
    pub max_in_flight: Option<i64>,
    /// Identify clients by this request header (e.g. `x-api-key`) when present, else by address.
    pub key_header: Option<String>,
    /// `reject` (429 at once) or `queue` (wait for a slot, bounded).
    pub on_excess: Option<String>,
    /// Waiting requests per client before further ones are rejected (queue mode).
    pub queue_size: Option<i64>,
    /// How long a queued request waits before it is rejected.
    pub queue_timeout: Option<String>,
    /// The `Retry-After` value sent with 429, in whole seconds.
    pub retry_after: Option<String>,
}

/// What happens to a request over the per-client cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExcessPolicy {
    Reject,
    Queue,
}

/// Validated per-client fairness.
#[derive(Debug, Clone, PartialEq)]
pub struct FairnessConfig {
    pub max_in_flight: usize,
    /// Lowercase header name.
    pub key_header: Option<String>,
    pub on_excess: ExcessPolicy,
    pub queue_size: usize,
    pub queue_timeout: Duration,
    pub retry_after_secs: u64,
}

/// Validates the section; `None` when no cap is set. The other keys are checked either way, so
/// a typo does not wait for the day the cap is turned on.
pub fn validate(section: &FairnessSection) -> Result<Option<FairnessConfig>, ConfigError> {
    let max_in_flight: usize = check::integer(
        "fairness.max_in_flight",
        section.max_in_flight,
        0,
        0..=1_000_000,
    )?;
    let on_excess = check::one_of(
        "fairness.on_excess",
        section.on_excess.as_deref(),
        "reject",
        &[
            ("reject", ExcessPolicy::Reject),
            ("queue", ExcessPolicy::Queue),
        ],
    )?;
    let key_header = section
        .key_header
        .as_deref()
        .map(|name| check::header_name("fairness.key_header", name))
        .transpose()?;
    let queue_size = check::integer("fairness.queue_size", section.queue_size, 16, 0..=1_000_000)?;
    let queue_timeout = check::positive_duration(
        "fairness.queue_timeout",
        &section.queue_timeout,
        Duration::from_secs(5),
    )?;
    let retry_after = check::duration(
        "fairness.retry_after",
        &section.retry_after,
        Duration::from_secs(1),
    )?;
    if max_in_flight == 0 {
        return Ok(None);
    }
    Ok(Some(FairnessConfig {
        max_in_flight,
        key_header,
        on_excess,
        queue_size,
        queue_timeout,
        retry_after_secs: retry_after.as_secs().max(1),
    }))
}
