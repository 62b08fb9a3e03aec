//! `[cache.partial]`: partial content (RFC 9111 §3.3-3.4), off by default.
//!
//! Off, a range request on a miss fetches and stores the whole response (and later ranges are
//! served from it). On, the client's single range is forwarded on a miss, the `206` is stored as
//! a partial object, later ranges inside it are answered from it, and a range beyond it fetches
//! only the missing part and combines the two (`proxy/partial_content.rs`). Off by default because
//! fetching the whole response fills the cache for every later range in one origin request,
//! which is what most sites behind a cache want; partial content suits large media read in parts.

use super::ConfigError;
use serde::Deserialize;

/// The section as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialSection {
    pub enabled: Option<bool>,
}

/// The validated settings.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartialConfig {
    /// Whether a range request on a miss is forwarded and its `206` stored and combined.
    pub enabled: bool,
}

/// Validates the section (a boolean, which the file's own types already check).
pub fn validate(section: &PartialSection) -> Result<PartialConfig, ConfigError> {
    Ok(PartialConfig {
        enabled: section.enabled.unwrap_or(false),
    })
}
