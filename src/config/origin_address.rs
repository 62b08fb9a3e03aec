//! An origin's `HOST:PORT` as configured: a literal IP address is itself for the process's life,
//! a host name stands for every address it resolves to, now and after each re-resolution
//! (`balancer.resolve_interval`, see `crate::upstream::resolver`).
//!
//! The name is looked up once here, at start-up (and on each reload's validation), so a name that
//! does not resolve at all stops start-up with the key named; from then on the resolver owns the
//! addresses. Two configured addresses are equal when they are the same literal or the same name,
//! whatever the name resolved to: a reload that finds a name pointing elsewhere has not changed
//! the configuration (the resolver follows the name), so it does not ask for a restart.

use super::ConfigError;
use std::net::{SocketAddr, ToSocketAddrs};

/// Where an origin is, as configured.
#[derive(Debug, Clone)]
pub enum OriginAddress {
    /// `IP:PORT`: never looked up.
    Literal(SocketAddr),
    /// `HOSTNAME:PORT`, with the addresses the name had when the configuration was loaded.
    Name {
        host: String,
        port: u16,
        /// Every address of the name at load time, in the resolver's order, without repeats;
        /// never empty.
        resolved: Vec<SocketAddr>,
    },
}

impl PartialEq for OriginAddress {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (OriginAddress::Literal(a), OriginAddress::Literal(b)) => a == b,
            (
                OriginAddress::Name { host, port, .. },
                OriginAddress::Name {
                    host: other_host,
                    port: other_port,
                    ..
                },
            ) => host.eq_ignore_ascii_case(other_host) && port == other_port,
            _ => false,
        }
    }
}

impl OriginAddress {
    /// Reads `text` (`IP:PORT` or `HOSTNAME:PORT`) and, for a name, looks it up now; an error
    /// names `key`.
    pub fn parse(key: &str, text: &str) -> Result<Self, ConfigError> {
        let text = text.trim();
        if let Ok(addr) = text.parse() {
            return Ok(OriginAddress::Literal(addr));
        }
        let (host, port) = text.rsplit_once(':').ok_or_else(|| {
            ConfigError::new(key, format!("\"{text}\" has no port (expected HOST:PORT)"))
        })?;
        let port: u16 = port.parse().map_err(|_| {
            ConfigError::new(key, format!("\"{text}\": \"{port}\" is not a port number"))
        })?;
        if host.is_empty() {
            return Err(ConfigError::new(key, format!("\"{text}\" has no host")));
        }
        let resolved = distinct(
            (host, port)
                .to_socket_addrs()
                .map_err(|e| ConfigError::new(key, format!("cannot resolve \"{host}\": {e}")))?,
        );
        if resolved.is_empty() {
            return Err(ConfigError::new(
                key,
                format!("\"{host}\" resolves to no address"),
            ));
        }
        Ok(OriginAddress::Name {
            host: host.to_string(),
            port,
            resolved,
        })
    }

    /// The addresses now known: the literal, or the name's addresses at load time.
    pub fn addrs(&self) -> &[SocketAddr] {
        match self {
            OriginAddress::Literal(addr) => std::slice::from_ref(addr),
            OriginAddress::Name { resolved, .. } => resolved,
        }
    }

    /// The host name and port to look up again; `None` for a literal address.
    pub fn name(&self) -> Option<(&str, u16)> {
        match self {
            OriginAddress::Literal(_) => None,
            OriginAddress::Name { host, port, .. } => Some((host, *port)),
        }
    }
}

/// The addresses of a lookup in its order, each once (a resolver may list one per socket type).
pub fn distinct(addrs: impl IntoIterator<Item = SocketAddr>) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for addr in addrs {
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_not_looked_up_and_names_are() {
        let literal = OriginAddress::parse("k", " 127.0.0.1:80 ").unwrap();
        assert_eq!(literal.addrs(), ["127.0.0.1:80".parse().unwrap()]);
        assert_eq!(literal.name(), None);
        let name = OriginAddress::parse("k", "localhost:80").unwrap();
        assert_eq!(name.name(), Some(("localhost", 80)));
        assert!(!name.addrs().is_empty());
        assert!(name.addrs().iter().all(|a| a.port() == 80));
    }

    #[test]
    fn a_name_equals_itself_whatever_it_resolved_to() {
        let at = |ip: &str| OriginAddress::Name {
            host: "app.internal".into(),
            port: 8080,
            resolved: vec![format!("{ip}:8080").parse().unwrap()],
        };
        assert_eq!(at("10.0.0.1"), at("10.0.0.2"));
        let literal = OriginAddress::Literal("10.0.0.1:8080".parse().unwrap());
        assert_ne!(at("10.0.0.1"), literal);
    }

    #[test]
    fn errors_name_the_key() {
        let e = OriginAddress::parse("upstream", "nohost").unwrap_err();
        assert!(e.reason.contains("no port"), "{e}");
        let e = OriginAddress::parse("upstream", ":80").unwrap_err();
        assert!(e.reason.contains("no host"), "{e}");
        let e = OriginAddress::parse("upstreams[0].address", "host:http").unwrap_err();
        assert_eq!(e.key, "upstreams[0].address");
    }
}
