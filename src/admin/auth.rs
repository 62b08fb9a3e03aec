//! Who may use the admin listener: an address allow-list for everything on it but `/health`,
//! and a bearer token for the calls that change the cache (the invalidation API).
//!
//! A refusal changes nothing and says only why in general terms: 403 for an address not on the
//! list, or when no token is configured (the invalidation API is then off); 401 with
//! `WWW-Authenticate: Bearer` for a missing or wrong token. The token is compared in constant
//! time ([`AdminToken::matches`]) and never logged; a refusal is logged with the client's
//! address only.

use crate::config::admin::{AdminAccess, AdminToken};
use pingora_http::RequestHeader;
use std::net::IpAddr;

/// Why a call was refused, and how to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client's address is not in `admin.allow_from`.
    AddressNotAllowed,
    /// No token is configured: the invalidation API is off.
    NoTokenConfigured,
    /// No `Authorization: Bearer` credentials.
    MissingToken,
    /// Credentials that are not the token.
    WrongToken,
}

impl Refusal {
    /// The status to answer with.
    pub fn status(self) -> u16 {
        match self {
            Refusal::AddressNotAllowed | Refusal::NoTokenConfigured => 403,
            Refusal::MissingToken | Refusal::WrongToken => 401,
        }
    }

    /// The reason given in the answer's body.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::AddressNotAllowed => "this address may not use the admin API",
            Refusal::NoTokenConfigured => {
                "the invalidation API is off: set admin.token_file or admin.token_env"
            }
            Refusal::MissingToken => "missing bearer token",
            Refusal::WrongToken => "wrong bearer token",
        }
    }
}

/// Whether `client` may use the admin listener at all.
pub fn check_address(access: &AdminAccess, client: Option<IpAddr>) -> Result<(), Refusal> {
    let allowed = client.is_some_and(|ip| access.allow_from.iter().any(|r| r.contains(ip)));
    allowed.then_some(()).ok_or(Refusal::AddressNotAllowed)
}

/// Whether `req` carries the configured bearer token.
pub fn check_token(access: &AdminAccess, req: &RequestHeader) -> Result<(), Refusal> {
    let token: &AdminToken = access.token.as_ref().ok_or(Refusal::NoTokenConfigured)?;
    let presented = req
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|value| bearer(value.as_bytes()))
        .ok_or(Refusal::MissingToken)?;
    if token.matches(presented) {
        Ok(())
    } else {
        Err(Refusal::WrongToken)
    }
}

/// The credentials of an `Authorization: Bearer <token>` value (the scheme is case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
        .filter(|token| !token.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::address_range::AddressRange;

    fn access(token: Option<&str>) -> AdminAccess {
        AdminAccess {
            allow_from: vec![AddressRange::parse("10.0.0.0/8").unwrap()],
            token: token.map(AdminToken::new),
        }
    }

    fn request(authorization: Option<&str>) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/purge", None).unwrap();
        if let Some(value) = authorization {
            req.insert_header("authorization", value).unwrap();
        }
        req
    }

    #[test]
    fn only_listed_addresses_and_the_right_token_pass() {
        let access = access(Some("0123456789abcdef-secret"));
        assert_eq!(
            check_address(&access, Some("10.1.2.3".parse().unwrap())),
            Ok(())
        );
        assert_eq!(
            check_address(&access, Some("127.0.0.1".parse().unwrap())),
            Err(Refusal::AddressNotAllowed)
        );
        assert_eq!(
            check_address(&access, None),
            Err(Refusal::AddressNotAllowed)
        );
        let ok = request(Some("Bearer 0123456789abcdef-secret"));
        assert_eq!(check_token(&access, &ok), Ok(()));
        let lower = request(Some("bearer  0123456789abcdef-secret "));
        assert_eq!(check_token(&access, &lower), Ok(()));
        for (value, refusal) in [
            (None, Refusal::MissingToken),
            (
                Some("Basic YWxhZGRpbjpvcGVuc2VzYW1l"),
                Refusal::MissingToken,
            ),
            (Some("Bearer "), Refusal::MissingToken),
            (Some("Bearer 0123456789abcdef-secreT"), Refusal::WrongToken),
        ] {
            assert_eq!(
                check_token(&access, &request(value)),
                Err(refusal),
                "{value:?}"
            );
        }
        let off = super::tests::access(None);
        assert_eq!(check_token(&off, &ok), Err(Refusal::NoTokenConfigured));
        assert_eq!(Refusal::NoTokenConfigured.status(), 403);
        assert_eq!(Refusal::WrongToken.status(), 401);
    }
}
