//! Upstream selection: which origin server a request is forwarded to, and how we connect.
//!
//! Today one origin address; load balancing over replicas builds on this module.

use crate::config::{Config, ProxyConfig};
use pingora_core::upstreams::peer::HttpPeer;
use std::net::SocketAddr;

/// The origin and the connection options every request to it uses.
#[derive(Debug, Clone)]
pub struct Upstream {
    addr: SocketAddr,
    host: String,
    options: ProxyConfig,
}

impl Upstream {
    /// Builds the upstream from the validated config.
    pub fn new(config: &Config) -> Self {
        Upstream {
            addr: config.upstream,
            host: config.upstream_name.clone(),
            options: config.proxy.clone(),
        }
    }

    /// A peer for one request, with our timeouts. Connections are pooled by Pingora per peer.
    pub fn peer(&self) -> HttpPeer {
        let mut peer = HttpPeer::new(self.addr, false, String::new());
        let options = &mut peer.options;
        options.connection_timeout = Some(self.options.connect_timeout);
        options.read_timeout = Some(self.options.read_timeout);
        options.write_timeout = Some(self.options.write_timeout);
        options.idle_timeout = Some(self.options.idle_timeout);
        peer
    }

    /// The origin as configured, used as `Host` when a request has none.
    pub fn host(&self) -> &str {
        &self.host
    }
}
