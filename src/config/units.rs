//! Human-friendly units in the config file: byte sizes (`"512MiB"`) and durations (`"30s"`).
//!
//! Operators write sizes and durations the way Varnish and nginx let them; a value that does not
//! parse is rejected at start-up with the reason, never silently treated as zero.

use std::time::Duration;

/// Parses a byte size such as `"512MiB"`, `"64 KB"`, `"1g"` or a bare number of bytes.
///
/// Binary (KiB, MiB, GiB, TiB) and decimal-looking (K, KB, M, MB, G, GB) suffixes are both read as
/// powers of 1024, as nginx and Varnish do; the suffix is case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "\"{text}\" is not a size (expected e.g. \"512MiB\")"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("\"{text}\" is not a size (bad number \"{number}\")"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "\"{text}\" has unknown unit \"{other}\" (use B, KiB, MiB, GiB or TiB)"
            ))
        }
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("\"{text}\" is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration such as `"30s"`, `"250ms"`, `"5m"`, `"1h"`, `"2d"`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "\"{text}\" is not a duration (expected e.g. \"30s\" or \"250ms\")"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("\"{text}\" is not a duration (bad number \"{number}\")"))?;
    let seconds = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" | "sec" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86400.0,
        other => {
            return Err(format!(
                "\"{text}\" has unknown unit \"{other}\" (use ms, s, m, h or d)"
            ))
        }
    };
    if !seconds.is_finite() || seconds > 1e10 {
        return Err(format!("\"{text}\" is too large"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("64 KB").unwrap(), 64 << 10);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
    }

    #[test]
    fn bad_sizes_name_the_problem() {
        assert!(parse_size("12XB")
            .unwrap_err()
            .contains("unknown unit \"xb\""));
        assert!(parse_size("MiB").unwrap_err().contains("not a size"));
        assert!(parse_size("").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert!(parse_duration("3 fortnights").is_err());
    }
}
