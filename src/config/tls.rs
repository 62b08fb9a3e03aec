//! `[tls]`: TLS listeners (rustls; h2 offered through ALPN), their certificate and key.

use super::check;
use super::ConfigError;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;

/// `[tls]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub listen: Option<Vec<String>>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// TLS listener settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub listen: Vec<SocketAddr>,
    /// The TLS listeners whose connections start with a PROXY protocol header (before TLS).
    pub proxy_protocol: Vec<SocketAddr>,
    pub cert: String,
    pub key: String,
}

/// Validates the section; `None` when no TLS listener is configured. The certificate and key
/// must exist now, so a typo in a path stops start-up instead of the first handshake.
pub fn validate(section: &TlsSection) -> Result<Option<TlsConfig>, ConfigError> {
    let (listen, proxy_protocol) = match &section.listen {
        None => return Ok(None),
        Some(list) if list.is_empty() => return Ok(None),
        Some(list) => check::listen_addrs("tls.listen", list)?,
    };
    let cert = section
        .cert
        .clone()
        .ok_or_else(|| ConfigError::new("tls.cert", "required when tls.listen is set"))?;
    let key = section
        .key
        .clone()
        .ok_or_else(|| ConfigError::new("tls.key", "required when tls.listen is set"))?;
    for (name, path) in [("tls.cert", &cert), ("tls.key", &key)] {
        if !Path::new(path).is_file() {
            return Err(ConfigError::new(
                name,
                format!("file \"{path}\" does not exist"),
            ));
        }
    }
    Ok(Some(TlsConfig {
        listen,
        proxy_protocol,
        cert,
        key,
    }))
}
