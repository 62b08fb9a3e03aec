//! Updating a stored response from the origin's 304 (RFC 9111 §3.2, §4.3.4).
//!
//! Pingora merges only a few fields of a 304 into the stored head (`Cache-Control`, `Expires`,
//! `ETag`, ...). RFC 9111 asks for every field the 304 carries to replace the stored ones, except
//! those the stored body depends on or that belong to the connection. [`merge`] does that; the
//! proxy calls it while deciding how to store the revalidated response.

use http::header::{self, HeaderName, HeaderValue};
use pingora_http::ResponseHeader;

/// Fields a 304 never replaces: framing and encoding of the stored body (§3.2: `Content-Length`,
/// and fields "the cache's stored response depends upon"), the variance the entry is stored
/// under (`Vary`, as Pingora keeps the old variance), and connection-specific fields (§3.1).
const KEPT_FROM_STORED: [&str; 11] = [
    "content-length",
    "content-encoding",
    "content-range",
    "transfer-encoding",
    "vary",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

fn updatable(name: &HeaderName) -> bool {
    !KEPT_FROM_STORED.contains(&name.as_str())
}

/// The stored head updated with the fields of `not_modified`: each field present in the 304
/// replaces all stored lines of that field, in the 304's order.
///
/// `etag_as_stored` is the `ETag` of the copy as it was stored (`stored` may already hold the
/// 304's: Pingora merges a few fields first). A weak one is never made strong by the 304: a copy
/// this cache compressed on store is tagged `W/"x"` for the origin's `"x"` (`encode_on_store`),
/// and the origin's 304 (`ETag: "x"`) validates the origin's bytes, not the copy's; stored
/// strong, the tag let a client's `If-Range: "x"` take a `206` of the gzip bytes as a part of
/// the identity representation. The 304's tag is kept, weakened.
pub fn merge(
    stored: &ResponseHeader,
    not_modified: &ResponseHeader,
    etag_as_stored: Option<&HeaderValue>,
) -> ResponseHeader {
    let mut merged = stored.clone();
    for name in not_modified.headers.keys().filter(|n| updatable(n)) {
        merged.remove_header(name);
        for value in not_modified.headers.get_all(name) {
            let _ = merged.append_header(name.clone(), value.clone());
        }
    }
    let was_weak = etag_as_stored.is_some_and(|tag| tag.as_bytes().starts_with(b"W/"));
    if was_weak {
        // as compression on store weakens the origin's tag
        crate::compression::weaken_etag(&mut merged);
    }
    merged
}

/// Why a 304 updated nothing: its `ETag` names another representation than the stored one.
pub const REASON_ANOTHER_REPRESENTATION: &str = "304-of-another-representation";

/// Whether the origin's 304 names a representation other than the stored one: both carry an
/// `ETag` and their opaque tags differ (weakness aside: a copy compressed on store is tagged
/// `W/"x"` for the origin's `"x"`). RFC 9111 §4.3.4: when no stored response has the 304's
/// validator, the cache "MUST NOT use the new response to update any stored responses". Merged
/// anyway, the stored bytes went out under the other tag from then on.
pub fn names_another_representation(
    etag_as_stored: Option<&HeaderValue>,
    not_modified: &ResponseHeader,
) -> bool {
    let (Some(stored), Some(new)) = (etag_as_stored, not_modified.headers.get(header::ETAG)) else {
        return false;
    };
    opaque_tag(stored) != opaque_tag(new)
}

/// An entity tag without its weakness indicator.
fn opaque_tag(tag: &HeaderValue) -> &[u8] {
    let bytes = tag.as_bytes().trim_ascii();
    bytes.strip_prefix(b"W/").unwrap_or(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_headers::response;

    #[test]
    fn the_304_fields_replace_the_stored_ones_except_framing() {
        let stored = response(&[
            ("content-length", "1000"),
            ("cache-control", "max-age=1"),
            ("x-a", "old"),
            ("x-kept", "yes"),
            ("vary", "accept"),
        ]);
        let not_modified = response(&[
            ("content-length", "0"),
            ("cache-control", "max-age=600"),
            ("x-a", "new-1"),
            ("x-a", "new-2"),
            ("x-new", "added"),
            ("vary", "*"),
        ]);
        let merged = merge(&stored, &not_modified, None);
        let all = |name: &str| -> Vec<&str> {
            merged
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(all("content-length"), ["1000"]);
        assert_eq!(all("cache-control"), ["max-age=600"]);
        assert_eq!(all("x-a"), ["new-1", "new-2"]);
        assert_eq!(all("x-new"), ["added"]);
        assert_eq!(all("x-kept"), ["yes"]);
        assert_eq!(all("vary"), ["accept"]);
    }

    #[test]
    fn a_304_of_another_tag_names_another_representation() {
        let tag = |t: &str| HeaderValue::from_str(t).unwrap();
        let with_tag = |t: &str| response(&[("etag", t)]);
        assert!(!names_another_representation(
            Some(&tag("\"x\"")),
            &with_tag("\"x\"")
        ));
        assert!(!names_another_representation(
            Some(&tag("W/\"x\"")),
            &with_tag("\"x\"")
        ));
        assert!(!names_another_representation(
            Some(&tag("\"x\"")),
            &response(&[])
        ));
        assert!(!names_another_representation(None, &with_tag("\"y\"")));
        assert!(names_another_representation(
            Some(&tag("\"x\"")),
            &with_tag("\"y\"")
        ));
        assert!(names_another_representation(
            Some(&tag("W/\"x\"")),
            &with_tag("W/\"y\"")
        ));
    }

    #[test]
    fn a_weak_stored_tag_is_never_made_strong_by_a_304() {
        let stored = response(&[("etag", "W/\"x\""), ("content-encoding", "gzip")]);
        let weak = stored.headers.get("etag").cloned();
        // Pingora's merge has already put the 304's tag in place
        let pingora_merged = response(&[("etag", "\"x\""), ("content-encoding", "gzip")]);
        let not_modified = response(&[("etag", "\"x\""), ("cache-control", "max-age=5")]);
        let merged = merge(&pingora_merged, &not_modified, weak.as_ref());
        assert_eq!(merged.headers.get("etag").unwrap(), "W/\"x\"");
        assert_eq!(merged.headers.get("cache-control").unwrap(), "max-age=5");
        let already_weak = response(&[("etag", "W/\"y\"")]);
        let merged = merge(&pingora_merged, &already_weak, weak.as_ref());
        assert_eq!(merged.headers.get("etag").unwrap(), "W/\"y\"");
        // a strong stored tag takes the 304's as it comes
        let strong = response(&[("etag", "\"x\"")]);
        let merged = merge(&strong, &not_modified, strong.headers.get("etag"));
        assert_eq!(merged.headers.get("etag").unwrap(), "\"x\"");
    }
}
