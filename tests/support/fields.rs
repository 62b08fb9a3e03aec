//! Header fields kept as a `(name, value)` list, in the order they were sent: how the test origin
//! records a request, how a scripted origin response is built, and how the raw-socket client parses
//! a response. One case-insensitive lookup serves all three, so they agree on what "has this
//! field" means.

/// First value of field `name` (case-insensitive), if present.
pub fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Every value of field `name` (case-insensitive), in order.
pub fn field_values<'a>(fields: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    fields
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// Whether field `name` (case-insensitive) is present.
pub fn has_field(fields: &[(String, String)], name: &str) -> bool {
    field(fields, name).is_some()
}

/// Whether one comma-separated element of the values of field `name` is `token`
/// (case-insensitive), as in `Connection: close` or `Transfer-Encoding: gzip, chunked`.
pub fn has_token(fields: &[(String, String)], name: &str, token: &str) -> bool {
    field_values(fields, name)
        .into_iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Fields parsed by `httparse`, owned and with values as (lossy) text.
pub fn owned_fields(parsed: &[httparse::Header]) -> Vec<(String, String)> {
    parsed
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect()
}
