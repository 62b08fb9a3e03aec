//! Which content coding a response carries (RFC 9110 §8.4), as far as Lacquer can act on it.
//!
//! Lacquer decodes the three codings browsers and CDNs use, gzip, brotli and zstd, so a copy
//! stored in any of them can be served to every client. Any other coding (`deflate`,
//! `compress`, a private one, or codings stacked on each other) is [`ContentCoding::Other`]: the
//! response passes through and is stored exactly as the origin sent it, because a proxy does not
//! judge the origin's codings.

use pingora_http::ResponseHeader;

/// The content coding of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentCoding {
    /// No `Content-Encoding` (or `identity`).
    Identity,
    /// Exactly `gzip` (or `x-gzip`).
    Gzip,
    /// Exactly `br` (brotli, RFC 7932).
    Br,
    /// Exactly `zstd` (Zstandard, RFC 8878).
    Zstd,
    /// Anything else, including stacked codings: passed on and stored as it is, never
    /// transformed.
    Other,
}

impl ContentCoding {
    /// The codings Lacquer can decode, in the order it names them to origins after the
    /// configured one.
    pub const DECODABLE: [ContentCoding; 3] =
        [ContentCoding::Gzip, ContentCoding::Br, ContentCoding::Zstd];

    /// Reads a response's `Content-Encoding`.
    pub fn of(resp: &ResponseHeader) -> Self {
        // the common case, one field with one coding, without splitting
        let mut fields = resp.headers.get_all(http::header::CONTENT_ENCODING).iter();
        match (fields.next(), fields.next()) {
            (None, _) => return ContentCoding::Identity,
            (Some(only), None) => {
                if let Some(coding) = Self::from_token(only.as_bytes()) {
                    return coding;
                }
            }
            _ => {}
        }
        let mut codings = resp
            .headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"));
        match (codings.next(), codings.next()) {
            (None, _) => ContentCoding::Identity,
            (Some(only), None) => Self::from_token(only.as_bytes()).unwrap_or(ContentCoding::Other),
            _ => ContentCoding::Other,
        }
    }

    /// The coding a single token names (case-insensitive), `None` for one Lacquer does not know.
    pub fn from_token(token: &[u8]) -> Option<Self> {
        let known = [
            (&b"gzip"[..], ContentCoding::Gzip),
            (b"x-gzip", ContentCoding::Gzip),
            (b"br", ContentCoding::Br),
            (b"zstd", ContentCoding::Zstd),
            (b"identity", ContentCoding::Identity),
        ];
        known
            .iter()
            .find(|(name, _)| token.eq_ignore_ascii_case(name))
            .map(|(_, coding)| *coding)
    }

    /// The token Lacquer writes for this coding (`Other` has none of its own; `"identity"` is
    /// returned for it only so the function is total).
    pub fn token(self) -> &'static str {
        match self {
            ContentCoding::Gzip => "gzip",
            ContentCoding::Br => "br",
            ContentCoding::Zstd => "zstd",
            ContentCoding::Identity | ContentCoding::Other => "identity",
        }
    }

    /// Whether Lacquer can decode this coding for a client that does not accept it.
    pub fn decodable(self) -> bool {
        matches!(
            self,
            ContentCoding::Gzip | ContentCoding::Br | ContentCoding::Zstd
        )
    }
}

/// Reads a response's `Content-Encoding` (see [`ContentCoding::of`]).
pub fn content_coding(resp: &ResponseHeader) -> ContentCoding {
    ContentCoding::of(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(headers: &[(&str, &str)]) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn codings_are_read_from_one_or_several_fields() {
        let coding = |v: &[&str]| {
            let fields: Vec<(&str, &str)> = v.iter().map(|v| ("content-encoding", *v)).collect();
            content_coding(&resp(&fields))
        };
        assert_eq!(coding(&[]), ContentCoding::Identity);
        assert_eq!(coding(&["identity"]), ContentCoding::Identity);
        assert_eq!(coding(&["GZIP"]), ContentCoding::Gzip);
        assert_eq!(coding(&["x-gzip"]), ContentCoding::Gzip);
        assert_eq!(coding(&["br"]), ContentCoding::Br);
        assert_eq!(coding(&["Zstd"]), ContentCoding::Zstd);
        assert_eq!(coding(&[" br "]), ContentCoding::Br);
        assert_eq!(coding(&["identity, zstd"]), ContentCoding::Zstd);
        assert_eq!(coding(&["identity", "br"]), ContentCoding::Br);
        assert_eq!(coding(&["deflate"]), ContentCoding::Other);
        assert_eq!(coding(&["gzip, br"]), ContentCoding::Other);
        assert_eq!(coding(&["gzip", "gzip"]), ContentCoding::Other);
        assert_eq!(coding(&["x-private-coding"]), ContentCoding::Other);
    }

    #[test]
    fn only_the_three_common_codings_are_decodable() {
        for c in ContentCoding::DECODABLE {
            assert!(c.decodable());
            assert_eq!(ContentCoding::from_token(c.token().as_bytes()), Some(c));
        }
        assert!(!ContentCoding::Identity.decodable());
        assert!(!ContentCoding::Other.decodable());
    }
}
