//! `[log]`: where access log lines go, in which format, and the error log's level.

use super::check;
use super::ConfigError;
use serde::Deserialize;

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `"stdout"`, `"stderr"`, `"off"` or a file path.
    pub access: Option<String>,
    /// `"common"` or `"json"`.
    pub format: Option<String>,
    /// Error log level: `error`, `warn`, `info`, `debug`, `trace`.
    pub level: Option<String>,
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    Off,
    Stdout,
    Stderr,
    File(String),
}

/// Access log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// NCSA common log format plus cache status and timings.
    Common,
    /// One JSON object per line.
    Json,
}

/// Logging settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub access: AccessLogTarget,
    pub format: AccessLogFormat,
    pub level: log::LevelFilter,
}

/// Validates the section; the level is read in any case, as `RUST_LOG` is.
pub fn validate(section: &LogSection) -> Result<LogConfig, ConfigError> {
    let access = match section.access.as_deref().unwrap_or("stdout") {
        "off" | "none" | "" => AccessLogTarget::Off,
        "stdout" | "-" => AccessLogTarget::Stdout,
        "stderr" => AccessLogTarget::Stderr,
        path => AccessLogTarget::File(path.to_string()),
    };
    let format = check::one_of(
        "log.format",
        section.format.as_deref(),
        "common",
        &[
            ("common", AccessLogFormat::Common),
            ("json", AccessLogFormat::Json),
        ],
    )?;
    let level = check::one_of(
        "log.level",
        section
            .level
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        "info",
        &[
            ("off", log::LevelFilter::Off),
            ("error", log::LevelFilter::Error),
            ("warn", log::LevelFilter::Warn),
            ("info", log::LevelFilter::Info),
            ("debug", log::LevelFilter::Debug),
            ("trace", log::LevelFilter::Trace),
        ],
    )?;
    Ok(LogConfig {
        access,
        format,
        level,
    })
}
