//! The variant key (RFC 9111 §4.1): which stored response matches a request under `Vary`.
//!
//! Every variant is stored under its own secondary key, so variants never overwrite each other
//! (the nginx trap). Request values are normalized before hashing: surrounding whitespace and the
//! spacing of comma lists do not create new variants, and `Accept-Encoding` creates none at all:
//! the one stored copy is gzip or identity, and [`crate::compression`] serves every client from it
//! (gzip as-is or decoded), so splitting on it would only multiply copies and origin fetches.
//!
//! `Accept-Language` is compared as what it means (RFC 9110 §12.5.4, §12.4.2), so that the
//! spellings browsers and libraries produce of one preference share a variant
//! ([`normalized_accept_language`]): language ranges in any case (they are case-insensitive, RFC
//! 4647 §2.1), whitespace anywhere, `q=1` written or not, `q=0.50` as `q=0.5`, and the order of
//! entries that have the same weight, which expresses no preference between them. Entries with
//! different weights keep their meaning whatever their order, so the normal form lists them by
//! weight, highest first, then by name. `en-US, fr;q=0.5` and `fr;q=0.5,EN-us;q=1.0` are one
//! variant; `en, fr` and `en, fr;q=0.9` are two. An entry whose weight is not a valid qvalue is
//! kept as written (lowercased), so a malformed field never shares a variant with a valid one.

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

/// Normalizes one request field's values, as bytes: split into list items at commas outside
/// quoted strings, each item trimmed of spaces and tabs and its runs of them made one space, empty
/// items dropped, the rest joined with ", ". Only HTTP's whitespace (space, tab) is whitespace
/// and only a comma outside quotes separates (RFC 9110 §5.6.1, §5.6.3, §5.6.4); every other byte
/// is kept as sent. Read as lossy UTF-8 and split on Unicode whitespace, values the origin saw
/// as different shared a variant: `\xc2\xa0v2` was the ordinary `v2`'s, every byte that is not
/// UTF-8 the same U+FFFD, `p="a,b"` the same as `p="a, b"`.
fn normalized_value(req: &RequestHeader, name: &str) -> Vec<u8> {
    if !req.headers.contains_key(name) {
        return ABSENT.to_vec();
    }
    if name == "accept-language"
        && req
            .headers
            .get_all(name)
            .iter()
            .all(|value| value.as_bytes().is_ascii())
    {
        return normalized_accept_language(req);
    }
    let mut out = Vec::new();
    for value in req.headers.get_all(name) {
        for item in list_items(value.as_bytes()) {
            let mut words = item
                .split(|&b| b == b' ' || b == b'\t')
                .filter(|word| !word.is_empty())
                .peekable();
            if words.peek().is_none() {
                continue;
            }
            if !out.is_empty() {
                out.extend_from_slice(b", ");
            }
            let mut first = true;
            for word in words {
                if !first {
                    out.push(b' ');
                }
                out.extend_from_slice(word);
                first = false;
            }
        }
    }
    out
}

/// The items of a comma-separated field value: split at commas outside quoted strings
/// ([`super::cache_control::quoted_string_end`]; an unclosed one runs to the end).
fn list_items(value: &[u8]) -> Vec<&[u8]> {
    let mut items = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < value.len() {
        match value[i] {
            b'"' => match super::cache_control::quoted_string_end(value, i) {
                Some(end) => i = end,
                None => break,
            },
            b',' => {
                items.push(&value[start..i]);
                start = i + 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    items.push(&value[start..]);
    items
}

/// `Accept-Language` in normal form (see the module doc): `lang;q=0.xyz` entries, lowercased,
/// without whitespace, `q` omitted when 1, by weight (highest first) then name, duplicates once.
pub fn normalized_accept_language(req: &RequestHeader) -> Vec<u8> {
    // (weight in thousandths, or -1 when invalid; the entry as it is keyed)
    let mut entries: Vec<(i32, String)> = Vec::new();
    for value in req.headers.get_all(http::header::ACCEPT_LANGUAGE) {
        let text = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        for item in text.split(',') {
            let item: String = item.split_whitespace().collect();
            if item.is_empty() {
                continue;
            }
            let mut parts = item.split(';');
            let range = parts.next().unwrap_or_default();
            let params: Vec<&str> = parts.collect();
            let weight = match params.as_slice() {
                [] => Some(1000),
                [q] => q.strip_prefix("q=").and_then(qvalue_thousandths),
                _ => None,
            };
            entries.push(match weight {
                Some(1000) => (1000, range.to_string()),
                Some(0) => (0, format!("{range};q=0")),
                Some(w) => (w, format!("{range};q=0.{}", thousandths_digits(w))),
                None => (-1, item),
            });
        }
    }
    entries.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    entries.dedup();
    let keyed: Vec<String> = entries.into_iter().map(|(_, entry)| entry).collect();
    keyed.join(", ").into_bytes()
}

/// A qvalue (RFC 9110 §12.4.2: `0[.ddd]` or `1[.000]`) in thousandths.
fn qvalue_thousandths(text: &str) -> Option<i32> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let fraction = format!("{fraction:0<3}").parse::<i32>().ok()?;
    match whole {
        "0" => Some(fraction),
        "1" if fraction == 0 => Some(1000),
        _ => None,
    }
}

/// The digits after `0.` of a weight between 0 and 1, without trailing zeros (`500` → `5`).
fn thousandths_digits(weight: i32) -> String {
    format!("{weight:03}").trim_end_matches('0').to_string()
}

/// Whether a stored response varies: its `Vary` names a field [`variance_key`] counts, so every
/// stored copy of it carries a variance. An entry read from memcached whose variance disagrees
/// (a planted one) is refused: served without a variance, it would answer every request alike.
pub fn varies(resp: &ResponseHeader) -> bool {
    vary_names(resp)
        .any(|name| !(name == "accept-encoding" && crate::compression::serves_every_client(resp)))
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
    fn only_http_whitespace_and_unquoted_commas_are_structure() {
        let r = resp("X-V");
        let key = |value: &[u8]| {
            let mut req = RequestHeader::build("GET", b"/", None).unwrap();
            req.insert_header("x-v", http::HeaderValue::from_bytes(value).unwrap())
                .unwrap();
            variance_key(&r, &req)
        };
        assert_eq!(key(b" v2 ,\tw "), key(b"v2, w"));
        assert_ne!(key("\u{a0}v2".as_bytes()), key(b"v2"));
        assert_ne!(key(b"caf\xe9"), key(b"caf\xe8"));
        assert_ne!(key(br#"t;p="a,b""#), key(br#"t;p="a, b""#));
        assert_eq!(key(br#"t;p="a,b", u"#), key(br#"t;p="a,b",u"#));
        let fr = |value: &[u8]| {
            let mut req = RequestHeader::build("GET", b"/", None).unwrap();
            req.insert_header(
                "accept-language",
                http::HeaderValue::from_bytes(value).unwrap(),
            )
            .unwrap();
            variance_key(&resp("Accept-Language"), &req)
        };
        assert_ne!(fr(b"fr\xe9"), fr(b"fr\xe8"));
        assert_eq!(fr(b"FR ; q=1"), fr(b"fr"));
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
    fn accept_language_is_compared_as_a_preference() {
        let al = |value: &str| {
            String::from_utf8(normalized_accept_language(&req(&[(
                "accept-language",
                value,
            )])))
            .unwrap()
        };
        assert_eq!(al("en-US, fr;q=0.5"), "en-us, fr;q=0.5");
        for same in [
            "fr;q=0.5,EN-us;q=1.0",
            "en-us;q=1, FR ; q=0.50",
            " en-US ,fr;q=0.500 ",
            "en-us, fr;q=0.5, en-us",
        ] {
            assert_eq!(al(same), "en-us, fr;q=0.5", "{same}");
        }
        // equal weights: order carries no preference
        assert_eq!(al("de, en"), al("en, de"));
        assert_eq!(al("de;q=0.8, en;q=0.8"), al("en;q=0.8, de;q=0.8"));
        // different weights are different preferences
        assert_ne!(al("en, fr"), al("en, fr;q=0.9"));
        assert_ne!(al("en;q=0.9, fr"), al("en, fr;q=0.9"));
        // not qvalues: kept as written, never equal to a valid form
        assert_eq!(al("en;q=2"), "en;q=2");
        assert_eq!(al("en;q=0.5555"), "en;q=0.5555");
        assert_ne!(al("en;q=x"), al("en"));
        assert_eq!(al("*;q=0.000"), "*;q=0");

        let r = resp("Accept-Language");
        assert_eq!(
            variance_key(&r, &req(&[("accept-language", "en-US, fr;q=0.5")])),
            variance_key(&r, &req(&[("accept-language", "FR;q=0.50, en-us")]))
        );
        assert_ne!(
            variance_key(&r, &req(&[("accept-language", "en")])),
            variance_key(&r, &req(&[]))
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
