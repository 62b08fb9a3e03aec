//! `[proxy]`: how requests are forwarded to the origin: `Via`, the forwarding headers, and the
//! upstream timeouts (the defaults of `[balancer.timeouts]`).

use super::address_range::AddressRange;
use super::check;
use super::ConfigError;
use serde::Deserialize;
use std::time::Duration;

/// `[proxy]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySection {
    /// Add a `Via` header to requests and responses.
    pub via: Option<bool>,
    /// The pseudonym used in `Via`.
    pub via_name: Option<String>,
    /// `"x-forwarded-for"`, `"forwarded"`, `"both"` or `"none"`.
    pub forwarded: Option<String>,
    pub connect_timeout: Option<String>,
    pub read_timeout: Option<String>,
    pub write_timeout: Option<String>,
    /// How long an idle pooled upstream connection is kept.
    pub idle_timeout: Option<String>,
    /// How long an upgraded connection (a WebSocket) may stay silent in either direction.
    pub tunnel_idle_timeout: Option<String>,
    /// Peers (load balancers, TLS terminators) whose forwarding headers are believed.
    pub trusted_proxies: Option<Vec<String>>,
    /// Forward passes over Lacquer's own HTTP/1 exchange (`crate::proxy::direct_pass`).
    pub direct_passes: Option<bool>,
    /// Forward misses the same way and store their answers (`crate::proxy::direct_pass`).
    pub direct_misses: Option<bool>,
}

/// Which forwarding headers are added to upstream requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardedHeaders {
    /// Neither header is touched.
    None,
    /// `X-Forwarded-For` (appended), `X-Forwarded-Proto`, `X-Forwarded-Host`.
    XForwardedFor,
    /// RFC 7239 `Forwarded` (appended).
    Forwarded,
    /// Both styles.
    Both,
}

/// Upstream timeouts and forwarding behaviour.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub via: bool,
    pub via_name: String,
    pub forwarded: ForwardedHeaders,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
    /// An upgraded connection (a WebSocket tunnel) is closed when neither side has sent anything
    /// for this long (one side talking keeps it open: server-push WebSockets stay up).
    pub tunnel_idle_timeout: Duration,
    /// Peers whose `X-Forwarded-*` / `Forwarded` are believed: the client address, scheme and
    /// host they report are used and passed on. Empty (the default): nobody's are.
    pub trusted_proxies: Vec<AddressRange>,
    /// Requests that will not be cached go over Lacquer's own HTTP/1 exchange rather than
    /// Pingora's proxy phases (`crate::proxy::direct_pass`); on by default, off to compare.
    pub direct_passes: bool,
    /// A plain GET that found nothing stored in any tier and no fill of it in flight goes over
    /// the same exchange and is stored from there (`crate::proxy::direct_pass`); on by default,
    /// off to compare. Needs `direct_passes`.
    pub direct_misses: bool,
}

/// Validates the section; `forwarded` is read in any case.
pub fn validate(section: &ProxySection) -> Result<ProxyConfig, ConfigError> {
    let forwarded = check::one_of(
        "proxy.forwarded",
        section
            .forwarded
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        "x-forwarded-for",
        &[
            ("none", ForwardedHeaders::None),
            ("x-forwarded-for", ForwardedHeaders::XForwardedFor),
            ("forwarded", ForwardedHeaders::Forwarded),
            ("both", ForwardedHeaders::Both),
        ],
    )?;
    let via_name = section.via_name.clone().unwrap_or_else(|| "lacquer".into());
    check::http_token("proxy.via_name", &via_name)?;
    let timeout = |key: &str, value: &Option<String>, default_secs: u64| {
        check::positive_duration(key, value, Duration::from_secs(default_secs))
    };
    Ok(ProxyConfig {
        via: section.via.unwrap_or(true),
        via_name,
        forwarded,
        connect_timeout: timeout("proxy.connect_timeout", &section.connect_timeout, 2)?,
        read_timeout: timeout("proxy.read_timeout", &section.read_timeout, 60)?,
        write_timeout: timeout("proxy.write_timeout", &section.write_timeout, 60)?,
        idle_timeout: timeout("proxy.idle_timeout", &section.idle_timeout, 60)?,
        tunnel_idle_timeout: timeout(
            "proxy.tunnel_idle_timeout",
            &section.tunnel_idle_timeout,
            300,
        )?,
        trusted_proxies: trusted_proxies(&section.trusted_proxies)?,
        direct_passes: section.direct_passes.unwrap_or(true),
        direct_misses: section.direct_misses.unwrap_or(true),
    })
}

/// `proxy.trusted_proxies`: a list of addresses or CIDR ranges, none by default.
fn trusted_proxies(value: &Option<Vec<String>>) -> Result<Vec<AddressRange>, ConfigError> {
    let entries = value.as_deref().unwrap_or(&[]);
    entries
        .iter()
        .enumerate()
        .map(|(i, text)| {
            AddressRange::parse(text)
                .map_err(|reason| ConfigError::new(format!("proxy.trusted_proxies[{i}]"), reason))
        })
        .collect()
}
