//! The variant key (RFC 9111 §4.1): which stored response matches a request under `Vary`.
//!
//! Every variant is stored under its own secondary key, so variants never overwrite each other
//! (the nginx trap). Request values are normalized before hashing: surrounding whitespace and the
//! spacing of comma lists do not create new variants, and `Accept-Encoding` creates none at all:
//! the one stored copy is gzip or identity, and [`crate::compression`] serves every client from it
//! (gzip as-is or decoded), so splitting on it would only multiply copies and origin fetches.

use pingora_cache::key::HashBinary;
use pingora_cache::VarianceBuilder;
use pingora_http::{RequestHeader, ResponseHeader};

/// Whether the response has `Vary: *`, which no later request can match.
pub fn has_star(resp: &ResponseHeader) -> bool {
    vary_names(resp).any(|name| name == "*")
}

/// The lowercased field names listed in the response's `Vary` header(s).
pub fn vary_names(resp: &ResponseHeader) -> impl Iterator<Item = String> + '_ {
    resp.headers
        .get_all(http::header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
}

/// Stands for a field the request does not carry. No field value can contain NUL, so an absent
/// field never matches a present one, not even an empty one (RFC 9111 §4.1).
const ABSENT: &[u8] = b"\0absent";

/// Normalizes one request field's values: trimmed, comma lists re-joined with ", ".
fn normalized_value(req: &RequestHeader, name: &str) -> Vec<u8> {
    if !req.headers.contains_key(name) {
        return ABSENT.to_vec();
    }
    let mut out = String::new();
    for value in req.headers.get_all(name) {
        let text = String::from_utf8_lossy(value.as_bytes());
        for item in text.split(',') {
            let item = item.split_whitespace().collect::<Vec<_>>().join(" ");
            if item.is_empty() {
                continue;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(&item);
        }
    }
    out.into_bytes()
}

/// The variance hash for `req` against a stored response's `Vary`, or `None` without `Vary`.
pub fn variance_key(resp: &ResponseHeader, req: &RequestHeader) -> Option<HashBinary> {
    let mut builder = VarianceBuilder::new();
    for name in vary_names(resp) {
        if name == "accept-encoding" && crate::compression::serves_every_client(resp) {
            // served from the one stored copy whatever the client accepts (a coding Lacquer
            // cannot decode varies on it like any other field)
            continue;
        }
        let value = normalized_value(req, &name);
        builder.add_owned_name_value(name, value);
    }
    builder.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::policy::test_headers::request as req;

    fn resp(vary: &str) -> ResponseHeader {
        let mut r = ResponseHeader::build(200, None).unwrap();
        r.insert_header("vary", vary).unwrap();
        r
    }

    #[test]
    fn whitespace_does_not_make_new_variants() {
        let r = resp("Accept-Language");
        assert_eq!(
            variance_key(&r, &req(&[("accept-language", "en,  fr")])),
            variance_key(&r, &req(&[("accept-language", " en , fr ")]))
        );
        assert_ne!(
            variance_key(&r, &req(&[("accept-language", "en")])),
            variance_key(&r, &req(&[("accept-language", "fr")]))
        );
    }

    #[test]
    fn an_absent_field_differs_from_an_empty_one() {
        let r = resp("X-Client");
        assert_ne!(
            variance_key(&r, &req(&[])),
            variance_key(&r, &req(&[("x-client", "")]))
        );
    }

    #[test]
    fn accept_encoding_makes_no_variants() {
        let r = resp("accept-encoding");
        for ae in [
            "gzip, deflate, br",
            "br;q=1, gzip;q=0",
            "*",
            "identity;q=0, gzip",
        ] {
            assert_eq!(
                variance_key(&r, &req(&[("accept-encoding", ae)])),
                None,
                "{ae}"
            );
        }
        assert_eq!(variance_key(&r, &req(&[])), None);
        let both = resp("Accept-Encoding, Accept-Language");
        assert_eq!(
            variance_key(
                &both,
                &req(&[("accept-encoding", "gzip"), ("accept-language", "en")])
            ),
            variance_key(&both, &req(&[("accept-language", "en")]))
        );
    }

    #[test]
    fn accept_encoding_splits_variants_of_a_coding_lacquer_cannot_decode() {
        let mut r = resp("Accept-Encoding");
        r.insert_header("content-encoding", "x-private").unwrap();
        assert_ne!(
            variance_key(&r, &req(&[("accept-encoding", "x-private")])),
            variance_key(&r, &req(&[("accept-encoding", "gzip")]))
        );
        assert_eq!(
            variance_key(&r, &req(&[("accept-encoding", "gzip,  br")])),
            variance_key(&r, &req(&[("accept-encoding", "gzip, br")]))
        );
        r.insert_header("content-encoding", "zstd").unwrap();
        assert_eq!(variance_key(&r, &req(&[("accept-encoding", "gzip")])), None);
    }
}
