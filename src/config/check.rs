//! Key-aware value checks: the one place where a config value (or its default) becomes a typed
//! value, and a bad one becomes a [`ConfigError`] naming the dotted key and the reason.
//!
//! Every section module validates through these, so a duration, a size, an integer range, an
//! address or a choice is read, and its error worded, the same way wherever it appears.
//! Checks that only one key has (`server.write_buffer` at most 1MiB) stay with their section.

use super::units::{parse_duration, parse_size};
use super::ConfigError;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::Duration;

/// A duration (`"250ms"`, `"5m"`), or `default` when the key is absent. Zero is allowed.
pub fn duration(
    key: &str,
    value: &Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    value
        .as_deref()
        .map_or(Ok(default), |text| duration_value(key, text))
}

/// A duration that is present (a required key, or an optional one without a default).
pub fn duration_value(key: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|reason| ConfigError::new(key, reason))
}

/// A duration that must be greater than zero: a timeout, an interval, a cooldown.
pub fn positive_duration(
    key: &str,
    value: &Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    let duration = duration(key, value, default)?;
    if duration.is_zero() {
        return Err(ConfigError::new(key, "must be greater than zero"));
    }
    Ok(duration)
}

/// A duration that its consumer counts in whole seconds, at most `max`; `why` names that
/// consumer (HTTP's delta-seconds, memcached's expiry times).
pub fn whole_seconds(
    key: &str,
    value: &Option<String>,
    default: Duration,
    max: Duration,
    why: &str,
) -> Result<Duration, ConfigError> {
    let duration = duration(key, value, default)?;
    if duration.subsec_nanos() != 0 {
        return Err(ConfigError::new(
            key,
            format!("must be a whole number of seconds ({why})"),
        ));
    }
    if duration > max {
        return Err(ConfigError::new(
            key,
            format!("must be at most {}s", max.as_secs()),
        ));
    }
    Ok(duration)
}

/// A byte size (`"512MiB"`), or `default` when the key is absent.
pub fn size(key: &str, value: &Option<String>, default: usize) -> Result<usize, ConfigError> {
    let Some(text) = value else {
        return Ok(default);
    };
    let bytes = parse_size(text).map_err(|reason| ConfigError::new(key, reason))?;
    usize::try_from(bytes).map_err(|_| ConfigError::new(key, "too large for this machine"))
}

/// An integer within `allowed` (`i64::MAX` as the upper end means no upper bound), converted to
/// the type its consumer uses; `default` when the key is absent.
pub fn integer<T: TryFrom<i64>>(
    key: &str,
    value: Option<i64>,
    default: T,
    allowed: RangeInclusive<i64>,
) -> Result<T, ConfigError> {
    let Some(v) = value else {
        return Ok(default);
    };
    let (min, max) = (*allowed.start(), *allowed.end());
    if !allowed.contains(&v) {
        let range = if max == i64::MAX {
            format!("{min}..")
        } else {
            format!("{min}..={max}")
        };
        let bound = if v < min {
            format!("at least {min}")
        } else {
            format!("at most {max}")
        };
        return Err(ConfigError::new(
            key,
            format!("{v} is outside the allowed range {range}: it must be {bound}"),
        ));
    }
    T::try_from(v).map_err(|_| ConfigError::new(key, "too large for this machine"))
}

/// One of a fixed set of words, each standing for a value; `default` (one of the words) when
/// the key is absent. Matching is exact: a caller that accepts any case lowercases first.
pub fn one_of<T: Copy>(
    key: &str,
    value: Option<&str>,
    default: &str,
    choices: &[(&str, T)],
) -> Result<T, ConfigError> {
    let word = value.unwrap_or(default);
    match choices.iter().find(|(name, _)| *name == word) {
        Some((_, chosen)) => Ok(*chosen),
        None => {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            Err(ConfigError::new(
                key,
                format!("\"{word}\" is not one of {}", names.join(", ")),
            ))
        }
    }
}

/// A literal `IP:PORT` (listeners: binding a name that resolves differently later would
/// surprise).
pub fn socket_addr(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.trim().parse().map_err(|_| {
        ConfigError::new(
            key,
            format!("\"{text}\" is not an IP:PORT address (e.g. \"0.0.0.0:6081\")"),
        )
    })
}

/// Listener addresses, each `IP:PORT` optionally followed by `proxy_protocol` (the connections
/// start with a PROXY protocol v1 or v2 header, as HAProxy and cloud load balancers send): every
/// address, and the ones that expect the header.
pub fn listen_addrs(
    key: &str,
    list: &[String],
) -> Result<(Vec<SocketAddr>, Vec<SocketAddr>), ConfigError> {
    let mut all = Vec::with_capacity(list.len());
    let mut proxy_protocol = Vec::new();
    for text in list {
        let mut words = text.split_whitespace();
        let addr = socket_addr(key, words.next().unwrap_or(""))?;
        for option in words {
            if option != "proxy_protocol" {
                return Err(ConfigError::new(
                    key,
                    format!(
                        "\"{text}\": unknown listen option \"{option}\" (known: proxy_protocol)"
                    ),
                ));
            }
            proxy_protocol.push(addr);
        }
        all.push(addr);
    }
    Ok((all, proxy_protocol))
}

/// Refuses a listener set in which a connection's local address would not tell a
/// `proxy_protocol` listener from a plain one: the two on one port, one of them a wildcard
/// (`0.0.0.0`, `[::]`) or both on the same address. Lacquer knows which kind a connection came
/// through only by its local address (`crate::proxy_protocol`), so such a set let a direct
/// client of the plain listener name any address in a PROXY header, or refused its plain
/// requests (found 2026-12-08, `tests/proxy_protocol_and_health_attacks.rs`). `listeners` are
/// `(key, address, expects the header)`; listeners on separate ports, or on distinct specific
/// addresses, are told apart exactly.
pub fn listeners_told_apart(listeners: &[(&str, SocketAddr, bool)]) -> Result<(), ConfigError> {
    for (i, &(key, a, a_proxied)) in listeners.iter().enumerate() {
        for &(other_key, b, b_proxied) in &listeners[i + 1..] {
            if a_proxied == b_proxied || a.port() != b.port() {
                continue;
            }
            if listener_takes(a, b) || listener_takes(b, a) {
                let (proxied, plain) = if a_proxied { (a, b) } else { (b, a) };
                let key = if a_proxied { key } else { other_key };
                return Err(ConfigError::new(
                    key,
                    format!(
                        "\"{proxied} proxy_protocol\" and the plain listener \"{plain}\" share \
                         port {}: a connection could not be told to come through one or the \
                         other (give them separate ports, or distinct specific addresses)",
                        a.port()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Whether a connection whose local address is `local` may have come through `listener`: the
/// same port, and the same address unless the listener is a wildcard. How Lacquer tells which
/// listener (one expecting a PROXY header, or a plain one) a connection came through
/// (`crate::proxy_protocol`), and so which listener sets it refuses ([`listeners_told_apart`]).
pub fn listener_takes(listener: SocketAddr, local: SocketAddr) -> bool {
    listener.port() == local.port()
        && (listener.ip().is_unspecified() || listener.ip() == local.ip())
}

/// `IP:PORT` or `HOSTNAME:PORT`, resolved once, at start-up, to its first address (memcached
/// servers; origins are `super::origin_address`, looked up again while running).
pub fn resolved_addr(key: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = text.trim().parse() {
        return Ok(addr);
    }
    let (host, port) = text.trim().rsplit_once(':').ok_or_else(|| {
        ConfigError::new(key, format!("\"{text}\" has no port (expected HOST:PORT)"))
    })?;
    let port: u16 = port.parse().map_err(|_| {
        ConfigError::new(key, format!("\"{text}\": \"{port}\" is not a port number"))
    })?;
    if host.is_empty() {
        return Err(ConfigError::new(key, format!("\"{text}\" has no host")));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| ConfigError::new(key, format!("cannot resolve \"{host}\": {e}")))?
        .next()
        .ok_or_else(|| ConfigError::new(key, format!("\"{host}\" resolves to no address")))
}

/// A non-empty HTTP token (RFC 9110 §5.6.2), for names that appear in header values.
pub fn http_token(key: &str, text: &str) -> Result<(), ConfigError> {
    let is_token_byte = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if text.is_empty() || !text.bytes().all(is_token_byte) {
        return Err(ConfigError::new(
            key,
            format!("\"{text}\" must be a non-empty HTTP token"),
        ));
    }
    Ok(())
}

/// A header field name, returned lowercase (the form `http` compares and sends).
pub fn header_name(key: &str, text: &str) -> Result<String, ConfigError> {
    let lower = text.to_ascii_lowercase();
    if http::HeaderName::from_bytes(lower.as_bytes()).is_err() {
        return Err(ConfigError::new(
            key,
            format!("\"{text}\" is not a valid header name"),
        ));
    }
    Ok(lower)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> Option<String> {
        Some(value.to_string())
    }

    #[test]
    fn absent_keys_take_the_default_and_present_ones_are_parsed() {
        let five = Duration::from_secs(5);
        assert_eq!(duration("k", &None, five).unwrap(), five);
        assert_eq!(
            duration("k", &text("250ms"), five).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(size("k", &None, 7).unwrap(), 7);
        assert_eq!(size("k", &text("2KiB"), 7).unwrap(), 2048);
        assert_eq!(integer::<u32>("k", None, 9, 1..=3).unwrap(), 9);
        assert_eq!(integer::<u32>("k", Some(3), 9, 1..=3).unwrap(), 3);
    }

    #[test]
    fn errors_name_the_key_and_the_reason() {
        let e = positive_duration("a.b", &text("0s"), Duration::ZERO).unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.reason.as_str()),
            ("a.b", "must be greater than zero")
        );

        let e = size("a.size", &text("12XB"), 0).unwrap_err();
        assert_eq!(e.key, "a.size");
        assert!(e.reason.contains("unknown unit"), "{e}");

        let e = integer::<u32>("a.n", Some(0), 1, 1..=9).unwrap_err();
        assert_eq!(e.key, "a.n");
        assert_eq!(
            e.reason,
            "0 is outside the allowed range 1..=9: it must be at least 1"
        );
        let e = integer::<u32>("a.n", Some(10), 1, 1..=9).unwrap_err();
        assert_eq!(
            e.reason,
            "10 is outside the allowed range 1..=9: it must be at most 9"
        );
        let e = integer::<usize>("a.n", Some(-1), 1, 0..=i64::MAX).unwrap_err();
        assert_eq!(
            e.reason,
            "-1 is outside the allowed range 0..: it must be at least 0"
        );

        let e = one_of("a.word", Some("xml"), "json", &[("common", 1), ("json", 2)]).unwrap_err();
        assert_eq!(e.reason, "\"xml\" is not one of common, json");
        assert_eq!(
            one_of("a.word", None, "json", &[("common", 1), ("json", 2)]),
            Ok(2)
        );

        let e = http_token("a.name", "two words").unwrap_err();
        assert!(e.reason.contains("HTTP token"), "{e}");
        assert_eq!(header_name("a.field", "X-Api-Key").unwrap(), "x-api-key");
        assert!(header_name("a.field", "x api key").is_err());
    }

    #[test]
    fn whole_seconds_say_who_counts_them() {
        let max = Duration::from_secs(60);
        let read = |value: &str| whole_seconds("a.lease", &text(value), max, max, "memcached");
        assert_eq!(read("60s").unwrap(), max);
        assert_eq!(
            read("1500ms").unwrap_err().reason,
            "must be a whole number of seconds (memcached)"
        );
        assert_eq!(read("2m").unwrap_err().reason, "must be at most 60s");
    }

    #[test]
    fn addresses_are_literal_or_resolved() {
        assert_eq!(
            socket_addr("listen", " 127.0.0.1:80 ").unwrap(),
            "127.0.0.1:80".parse().unwrap()
        );
        assert!(socket_addr("listen", "localhost:80").is_err());
        assert_eq!(
            resolved_addr("upstream", "localhost:80").unwrap().port(),
            80
        );
        let e = resolved_addr("upstream", "nohost").unwrap_err();
        assert!(e.reason.contains("no port"), "{e}");
        let e = resolved_addr("upstream", ":80").unwrap_err();
        assert!(e.reason.contains("no host"), "{e}");
    }
}
