//! `[cache.compression]`: gzip on store for compressible identity responses.
//!
//! Decoding a stored gzip copy for clients that do not take gzip is always on; these keys govern
//! whether Lacquer itself compresses what the origin sent uncompressed, and how much memory keeps
//! decoded copies for such clients (`decoded_copies`).

use super::{check, ConfigError};
use serde::Deserialize;

/// The section as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionSection {
    pub enabled: Option<bool>,
    /// Media types to compress; `text/*` style prefixes allowed.
    pub types: Option<Vec<String>>,
    /// Responses with a smaller `Content-Length` are stored as they are.
    pub min_size: Option<String>,
    /// gzip level, 1 (fastest) to 9 (smallest).
    pub level: Option<i64>,
    /// Memory for decoded copies of small gzip bodies, e.g. "16MiB"; "0" turns them off.
    pub decoded_copies: Option<String>,
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct CompressionConfig {
    pub enabled: bool,
    /// Lowercase media types; an entry ending in `/*` matches the whole top-level type.
    pub types: Vec<String>,
    pub min_size: usize,
    pub level: u32,
    /// Bytes of decoded copies kept for clients that do not take gzip, on top of
    /// `cache.memory_size` (see [`crate::compression::decoded_copies`]); 0 = none.
    pub decoded_copies: usize,
}

/// The types compressed when `types` is not given: text, JSON, JavaScript, SVG, XML.
pub const DEFAULT_TYPES: [&str; 7] = [
    "text/*",
    "application/json",
    "application/javascript",
    "application/x-javascript",
    "application/xml",
    "image/svg+xml",
    "application/manifest+json",
];

impl Default for CompressionConfig {
    fn default() -> Self {
        CompressionConfig {
            enabled: false,
            types: DEFAULT_TYPES.iter().map(|t| t.to_string()).collect(),
            min_size: 256,
            level: 6,
            decoded_copies: 16 << 20,
        }
    }
}

impl CompressionConfig {
    /// Whether a lowercase media type (without parameters) is in the list.
    pub fn compressible(&self, media_type: &str) -> bool {
        self.types.iter().any(|t| match t.strip_suffix("/*") {
            Some(top) => media_type
                .strip_prefix(top)
                .is_some_and(|rest| rest.starts_with('/')),
            None => t == media_type,
        })
    }
}

/// Validates the section; every bad value names its key.
pub fn validate(section: &CompressionSection) -> Result<CompressionConfig, ConfigError> {
    let defaults = CompressionConfig::default();
    let types = match &section.types {
        None => defaults.types,
        Some(list) => {
            let mut out = Vec::new();
            for (i, t) in list.iter().enumerate() {
                let t = t.trim().to_ascii_lowercase();
                let valid = t
                    .split_once('/')
                    .is_some_and(|(top, sub)| !top.is_empty() && !sub.is_empty() && top != "*");
                if !valid {
                    return Err(ConfigError::new(
                        format!("cache.compression.types[{i}]"),
                        format!("\"{t}\" is not a media type (expected type/subtype or type/*)"),
                    ));
                }
                out.push(t);
            }
            out
        }
    };
    Ok(CompressionConfig {
        enabled: section.enabled.unwrap_or(defaults.enabled),
        types,
        min_size: check::size(
            "cache.compression.min_size",
            &section.min_size,
            defaults.min_size,
        )?,
        level: check::integer(
            "cache.compression.level",
            section.level,
            defaults.level,
            1..=9,
        )?,
        decoded_copies: check::size(
            "cache.compression.decoded_copies",
            &section.decoded_copies,
            defaults.decoded_copies,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_patterns() {
        let c = CompressionConfig::default();
        assert!(c.compressible("text/html"));
        assert!(c.compressible("application/json"));
        assert!(c.compressible("image/svg+xml"));
        assert!(!c.compressible("image/png"));
        assert!(!c.compressible("textual/html"));
    }
}
