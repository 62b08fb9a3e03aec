//! What a client's `Accept-Encoding` allows (RFC 9110 §12.5.3), reduced to the question Lacquer
//! asks: may the stored copy go out in its coding (gzip, br, zstd), or must it be decoded?
//!
//! The parse honours q-values, `*` and `identity;q=0`. One deliberate departure from the RFC: a
//! request *without* `Accept-Encoding` is treated as accepting identity only (the RFC would allow
//! any coding), because sending gzip to a client that did not ask for it breaks real clients.
//!
//! ```
//! use lacquer::compression::accept::AcceptEncoding;
//! let ae = AcceptEncoding::parse_values(["br;q=1, gzip;q=0"]);
//! assert!(!ae.accepts("gzip"));
//! assert!(ae.accepts("br"));
//! assert!(ae.accepts("identity"));
//! ```

use super::coding::ContentCoding;
use pingora_http::RequestHeader;

/// The parsed `Accept-Encoding` of one request.
#[derive(Debug, Clone, Default)]
pub struct AcceptEncoding {
    /// Whether the field was present at all.
    present: bool,
    /// Each listed coding (lowercased, `x-gzip` folded into `gzip`) with its q-value.
    codings: Vec<(String, f32)>,
}

impl AcceptEncoding {
    /// Parses every `Accept-Encoding` field of the request.
    pub fn parse(req: &RequestHeader) -> Self {
        let values = req
            .headers
            .get_all(http::header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok());
        Self::parse_values(values)
    }

    /// Parses field values as written, e.g. `["gzip, br;q=0.5"]`.
    pub fn parse_values<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = AcceptEncoding::default();
        for value in values {
            out.present = true;
            for item in value.split(',') {
                let mut parts = item.split(';');
                let mut coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
                if coding.is_empty() {
                    continue;
                }
                if coding == "x-gzip" {
                    coding = "gzip".into();
                }
                out.codings.push((coding, q_value(parts)));
            }
        }
        out
    }

    /// The q-value the client gives `coding`: its own entry, else `*`'s.
    fn q(&self, coding: &str) -> Option<f32> {
        let own = self.codings.iter().find(|(c, _)| c == coding);
        let star = self.codings.iter().find(|(c, _)| c == "*");
        own.or(star).map(|(_, q)| *q)
    }

    /// Whether a response with content-coding `coding` (`"identity"` for none) is acceptable.
    pub fn accepts(&self, coding: &str) -> bool {
        let coding = coding.to_ascii_lowercase();
        if coding == "identity" {
            // identity is acceptable unless explicitly excluded (directly or by `*;q=0`)
            return self.q("identity").is_none_or(|q| q > 0.0);
        }
        let coding = if coding == "x-gzip" { "gzip" } else { &coding };
        self.present && self.q(coding).is_some_and(|q| q > 0.0)
    }

    /// Whether the client takes gzip.
    pub fn accepts_gzip(&self) -> bool {
        self.accepts("gzip")
    }
}

/// Whether the request's `Accept-Encoding` takes gzip (see [`request_accepts`]).
pub fn request_accepts_gzip(req: &RequestHeader) -> bool {
    request_accepts(req, ContentCoding::Gzip)
}

/// Whether the request's `Accept-Encoding` takes `coding` (one of
/// [`ContentCoding::DECODABLE`]): the same answer as
/// `AcceptEncoding::parse(req).accepts(coding.token())`, read in one pass without allocating,
/// because every hit on a compressed copy asks it.
pub fn request_accepts(req: &RequestHeader, coding: ContentCoding) -> bool {
    let names: &[&str] = match coding {
        ContentCoding::Gzip => &["gzip", "x-gzip"],
        ContentCoding::Br => &["br"],
        ContentCoding::Zstd => &["zstd"],
        ContentCoding::Identity | ContentCoding::Other => return false,
    };
    let mut present = false;
    let mut own_q = None;
    let mut star_q = None;
    for value in req.headers.get_all(http::header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        present = true;
        for item in value.split(',') {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let slot = if names.iter().any(|n| name.eq_ignore_ascii_case(n)) {
                &mut own_q
            } else if name == "*" {
                &mut star_q
            } else {
                continue;
            };
            if slot.is_none() {
                *slot = Some(q_value(parts));
            }
        }
    }
    present && own_q.or(star_q).is_some_and(|q| q > 0.0)
}

/// The q-value among an item's parameters (1 when absent or unreadable, as in the full parse).
fn q_value<'a>(mut params: impl Iterator<Item = &'a str>) -> f32 {
    params
        .find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("q")
                .then(|| v.trim().parse::<f32>().ok())?
        })
        .unwrap_or(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ae(v: &str) -> AcceptEncoding {
        AcceptEncoding::parse_values([v])
    }

    #[test]
    fn no_field_means_identity_only() {
        let none = AcceptEncoding::parse_values([]);
        assert!(!none.accepts_gzip());
        assert!(none.accepts("identity"));
        assert!(!ae("").accepts_gzip());
    }

    #[test]
    fn one_pass_check_agrees_with_the_full_parse() {
        let cases = [
            None,
            Some(""),
            Some("gzip"),
            Some("x-gzip"),
            Some("GZIP;q=0.5"),
            Some("gzip;q=0"),
            Some("gzip ; q=0.000"),
            Some("br;q=1, gzip;q=0"),
            Some("*"),
            Some("*;q=0"),
            Some("gzip, *;q=0"),
            Some("*, gzip;q=0"),
            Some("deflate"),
            Some("gzip;q=0, gzip"),
            Some("identity, gzip;q=junk"),
            Some("br"),
            Some("BR;q=0.1, zstd;q=0"),
            Some("zstd, *;q=0"),
            Some("gzip, deflate, br, zstd"),
            Some("*, br;q=0"),
        ];
        for case in cases {
            let mut req = RequestHeader::build("GET", b"/", None).unwrap();
            if let Some(value) = case {
                req.insert_header("accept-encoding", value).unwrap();
            }
            let full = AcceptEncoding::parse(&req);
            for coding in ContentCoding::DECODABLE {
                assert_eq!(
                    request_accepts(&req, coding),
                    full.accepts(coding.token()),
                    "{case:?} {coding:?}"
                );
            }
        }
    }

    #[test]
    fn q_values_and_star() {
        assert!(ae("gzip").accepts_gzip());
        assert!(ae("x-gzip").accepts_gzip());
        assert!(ae("GZIP;q=0.5").accepts_gzip());
        assert!(!ae("gzip;q=0").accepts_gzip());
        assert!(!ae("gzip ; q=0.000").accepts_gzip());
        assert!(!ae("br;q=1, gzip;q=0").accepts_gzip());
        assert!(ae("br;q=1, gzip;q=0").accepts("br"));
        assert!(ae("*").accepts_gzip());
        assert!(!ae("*;q=0").accepts_gzip());
        assert!(ae("gzip, *;q=0").accepts_gzip());
        assert!(!ae("*, gzip;q=0").accepts_gzip());
        assert!(!ae("deflate").accepts_gzip());
    }

    #[test]
    fn identity_can_be_refused() {
        assert!(ae("gzip").accepts("identity"));
        assert!(!ae("gzip, identity;q=0").accepts("identity"));
        assert!(!ae("*;q=0").accepts("identity"));
        assert!(ae("*;q=0, identity").accepts("identity"));
    }
}
