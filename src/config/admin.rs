//! `[admin]`: the operator endpoint on a listener of its own, who may reach it, and the token its
//! invalidation API demands.

use super::address_range::AddressRange;
use super::check;
use super::ConfigError;
use blake2::{Blake2s256, Digest};
use serde::Deserialize;
use std::net::SocketAddr;
use subtle::ConstantTimeEq;

/// `[admin]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Address of the admin listener; absent means no admin endpoint.
    pub listen: Option<String>,
    /// Client addresses (`10.0.0.0/8`, `::1`) that may use the admin listener (all but
    /// `/health`); others get 403.
    pub allow_from: Option<Vec<String>>,
    /// A file holding the bearer token the invalidation API demands.
    pub token_file: Option<String>,
    /// The name of an environment variable holding that token (instead of a file).
    pub token_env: Option<String>,
}

/// The shortest token accepted: anything shorter can be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// The admin API's bearer token, kept only as its digest so that it is never printed, logged or
/// compared in a time that depends on how much of a guess was right.
#[derive(Clone, PartialEq)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// The token `secret` (surrounding whitespace, such as a file's final newline, removed).
    pub fn new(secret: &str) -> AdminToken {
        AdminToken {
            digest: Blake2s256::digest(secret.trim().as_bytes()).into(),
        }
    }

    /// Whether `presented` is the token, in constant time (digests of equal length are
    /// compared, so neither the token's length nor a matching prefix shows in the timing).
    pub fn matches(&self, presented: &[u8]) -> bool {
        let presented: [u8; 32] = Blake2s256::digest(presented).into();
        self.digest.ct_eq(&presented).into()
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// Who may use the admin listener.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// Clients allowed (default: loopback only).
    pub allow_from: Vec<AddressRange>,
    /// The token the invalidation API demands; without one, that API refuses every call.
    pub token: Option<AdminToken>,
}

/// Validates the section: the admin listener's address, if any.
pub fn validate(section: &AdminSection) -> Result<Option<SocketAddr>, ConfigError> {
    section
        .listen
        .as_deref()
        .map(|addr| check::socket_addr("admin.listen", addr))
        .transpose()
}

/// Validates who may use the admin listener, reading the token from its file or variable now,
/// so that a missing or empty one stops start-up instead of locking operators out later.
pub fn validate_access(section: &AdminSection) -> Result<AdminAccess, ConfigError> {
    let default = ["127.0.0.0/8".to_string(), "::1".to_string()];
    let allow_from = section
        .allow_from
        .as_deref()
        .unwrap_or(&default)
        .iter()
        .enumerate()
        .map(|(i, text)| {
            AddressRange::parse(text)
                .map_err(|reason| ConfigError::new(format!("admin.allow_from[{i}]"), reason))
        })
        .collect::<Result<_, _>>()?;
    let secret = match (&section.token_file, &section.token_env) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                "admin.token_env",
                "set admin.token_file or admin.token_env, not both",
            ))
        }
        (Some(path), None) => Some((
            "admin.token_file",
            std::fs::read_to_string(path).map_err(|e| {
                ConfigError::new("admin.token_file", format!("cannot read \"{path}\": {e}"))
            })?,
        )),
        (None, Some(name)) => Some((
            "admin.token_env",
            std::env::var(name).map_err(|_| {
                ConfigError::new(
                    "admin.token_env",
                    format!("the environment variable \"{name}\" is not set (or not UTF-8)"),
                )
            })?,
        )),
        (None, None) => None,
    };
    let token = match secret {
        Some((key, secret)) if secret.trim().len() < MIN_TOKEN_LEN => {
            return Err(ConfigError::new(
                key,
                format!("the token must be at least {MIN_TOKEN_LEN} characters"),
            ))
        }
        Some((_, secret)) => Some(AdminToken::new(&secret)),
        None => None,
    };
    Ok(AdminAccess { allow_from, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_only_itself_and_never_prints() {
        let token = AdminToken::new("correct horse battery staple\n");
        assert!(token.matches(b"correct horse battery staple"));
        assert!(!token.matches(b"correct horse battery stapl"));
        assert!(!token.matches(b""));
        assert_eq!(format!("{token:?}"), "AdminToken(<redacted>)");
    }

    #[test]
    fn a_short_missing_or_doubled_token_is_refused() {
        let section = |file: Option<&str>, env: Option<&str>| AdminSection {
            token_file: file.map(str::to_string),
            token_env: env.map(str::to_string),
            ..AdminSection::default()
        };
        let err = validate_access(&section(Some("/nonexistent/token"), None)).unwrap_err();
        assert_eq!(err.key, "admin.token_file");
        let err = validate_access(&section(None, Some("LACQUER_TEST_UNSET_VARIABLE"))).unwrap_err();
        assert_eq!(err.key, "admin.token_env");
        let err = validate_access(&section(Some("a"), Some("b"))).unwrap_err();
        assert_eq!(err.key, "admin.token_env");
        let access = validate_access(&section(None, None)).unwrap();
        assert!(access.token.is_none());
        assert_eq!(access.allow_from.len(), 2);
    }
}
