//! `[cache.compression]`: the coding of stored copies, and coding on store for compressible
//! identity responses.
//!
//! Decoding a stored gzip, br or zstd copy for clients that do not take its coding is always on;
//! these keys govern which coding Lacquer asks origins for and codes in itself (`coding`),
//! whether it compresses what the origin sent uncompressed (`enabled`), and how much memory
//! keeps decoded copies for clients that take none of them (`decoded_copies`).

use super::{check, ConfigError};
use crate::compression::ContentCoding;
use serde::Deserialize;

/// The section as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionSection {
    pub enabled: Option<bool>,
    /// The coding of stored copies: "gzip" (default), "br" or "zstd".
    pub coding: Option<String>,
    /// Media types to compress; `text/*` style prefixes allowed.
    pub types: Option<Vec<String>>,
    /// Responses with a smaller `Content-Length` are stored as they are.
    pub min_size: Option<String>,
    /// Compression level for `coding`: gzip 1..=9, br 0..=11, zstd 1..=19.
    pub level: Option<i64>,
    /// Memory for decoded copies of small compressed bodies, e.g. "16MiB"; "0" turns them off.
    pub decoded_copies: Option<String>,
}

/// The validated settings.
#[derive(Debug, Clone)]
pub struct CompressionConfig {
    pub enabled: bool,
    /// The coding Lacquer asks origins for first and codes in on store (gzip, br or zstd).
    pub coding: ContentCoding,
    /// Lowercase media types; an entry ending in `/*` matches the whole top-level type.
    pub types: Vec<String>,
    pub min_size: usize,
    pub level: u32,
    /// Bytes of decoded copies kept for clients that do not take the stored coding, on top of
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
            coding: ContentCoding::Gzip,
            types: DEFAULT_TYPES.iter().map(|t| t.to_string()).collect(),
            min_size: 256,
            level: 6,
            decoded_copies: 16 << 20,
        }
    }
}

/// The codings `cache.compression.coding` may name, with the range and default of `level` for
/// each (the range each library accepts; the defaults trade speed for size as their own do, brotli
/// a little slower than its interactive default because a stored copy is coded once).
const CODINGS: [(&str, ContentCoding, std::ops::RangeInclusive<i64>, u32); 3] = [
    ("gzip", ContentCoding::Gzip, 1..=9, 6),
    ("br", ContentCoding::Br, 0..=11, 5),
    ("zstd", ContentCoding::Zstd, 1..=19, 3),
];

impl CompressionConfig {
    /// The `Accept-Encoding` sent to origins for a request that may be cached: the configured
    /// coding first, then the other codings Lacquer decodes at lower weights. For gzip, gzip
    /// alone, as before brotli and zstd were decoded: an origin that ignores weights then never
    /// picks a coding the operator did not choose.
    pub fn upstream_accept_encoding(&self) -> &'static str {
        match self.coding {
            ContentCoding::Br => "br, gzip;q=0.9, zstd;q=0.8",
            ContentCoding::Zstd => "zstd, br;q=0.9, gzip;q=0.8",
            _ => "gzip",
        }
    }

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
    let choices: Vec<(&str, usize)> = CODINGS
        .iter()
        .enumerate()
        .map(|(i, (name, ..))| (*name, i))
        .collect();
    let chosen = check::one_of(
        "cache.compression.coding",
        section.coding.as_deref(),
        "gzip",
        &choices,
    )?;
    let (_, coding, levels, default_level) = &CODINGS[chosen];
    Ok(CompressionConfig {
        enabled: section.enabled.unwrap_or(defaults.enabled),
        coding: *coding,
        types,
        min_size: check::size(
            "cache.compression.min_size",
            &section.min_size,
            defaults.min_size,
        )?,
        level: check::integer(
            "cache.compression.level",
            section.level,
            *default_level,
            levels.clone(),
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

    #[test]
    fn the_level_range_follows_the_coding() {
        let section = |coding: &str, level: Option<i64>| CompressionSection {
            coding: Some(coding.to_string()),
            level,
            ..CompressionSection::default()
        };
        assert_eq!(validate(&section("br", None)).unwrap().level, 5);
        assert_eq!(validate(&section("br", Some(11))).unwrap().level, 11);
        assert_eq!(validate(&section("zstd", Some(19))).unwrap().level, 19);
        let err = validate(&section("gzip", Some(11))).unwrap_err();
        assert!(err.to_string().contains("1..=9"), "{err}");
        let err = validate(&section("zstd", Some(0))).unwrap_err();
        assert!(err.to_string().contains("1..=19"), "{err}");
        let err = validate(&section("deflate", None)).unwrap_err();
        assert!(
            err.to_string().contains("cache.compression.coding"),
            "{err}"
        );
        assert_eq!(
            validate(&section("zstd", None))
                .unwrap()
                .upstream_accept_encoding(),
            "zstd, br;q=0.9, gzip;q=0.8"
        );
    }
}
