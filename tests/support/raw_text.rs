//! Raw HTTP text as tests read it: a request head's line, fields and query (origins that script
//! their answers from the request), and byte searches in bodies and heads. Written once here;
//! several attack files had their own copies.

/// The method and target of a request head.
pub fn request_line(head: &str) -> (String, String) {
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default().to_string();
    (method, target)
}

/// Whether a request head carries the field `name`.
pub fn has_field(head: &str, name: &str) -> bool {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .any(|(n, _)| n.trim().eq_ignore_ascii_case(name))
}

/// The value of `key` in the query of `target`.
pub fn query<'a>(target: &'a str, key: &str) -> Option<&'a str> {
    target
        .split_once('?')?
        .1
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Where `needle` first is in `data`.
pub fn find(data: &[u8], needle: &[u8]) -> Option<usize> {
    data.windows(needle.len()).position(|w| w == needle)
}

/// `data` with every `from` replaced by `to`.
pub fn replace_bytes(data: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut at = 0;
    while at < data.len() {
        if data[at..].starts_with(from) {
            out.extend_from_slice(to);
            at += from.len();
        } else {
            out.push(data[at]);
            at += 1;
        }
    }
    out
}
