//! Updating a stored response from the origin's 304 (RFC 9111 §3.2, §4.3.4).
//!
//! Pingora merges only a few fields of a 304 into the stored head (`Cache-Control`, `Expires`,
//! `ETag`, ...). RFC 9111 asks for every field the 304 carries to replace the stored ones, except
//! those the stored body depends on or that belong to the connection. [`merge`] does that; the
//! proxy calls it while deciding how to store the revalidated response.

use http::header::HeaderName;
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
pub fn merge(stored: &ResponseHeader, not_modified: &ResponseHeader) -> ResponseHeader {
    let mut merged = stored.clone();
    for name in not_modified.headers.keys().filter(|n| updatable(n)) {
        merged.remove_header(name);
        for value in not_modified.headers.get_all(name) {
            let _ = merged.append_header(name.clone(), value.clone());
        }
    }
    merged
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
        let merged = merge(&stored, &not_modified);
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
}
