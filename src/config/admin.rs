//! `[admin]`: the operator endpoint (`/stats`, `/health`), on a listener of its own.

use super::check;
use super::ConfigError;
use serde::Deserialize;
use std::net::SocketAddr;

/// `[admin]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Address of the admin listener; absent means no admin endpoint.
    pub listen: Option<String>,
}

/// Validates the section: the admin listener's address, if any.
pub fn validate(section: &AdminSection) -> Result<Option<SocketAddr>, ConfigError> {
    section
        .listen
        .as_deref()
        .map(|addr| check::socket_addr("admin.listen", addr))
        .transpose()
}
