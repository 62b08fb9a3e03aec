//! One request as the test origin received it, for tests to count and inspect what the proxy
//! forwarded, and the query parameters a handler reads its script from.

use crate::fields::{field, field_values, has_field};
use bytes::Bytes;

/// One request as the origin received it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Request method, e.g. `"GET"`.
    pub method: String,
    /// Request target exactly as sent: path plus query, e.g. `"/a?b=1"`.
    pub path: String,
    /// Header fields in the order received, names and values as sent.
    pub headers: Vec<(String, String)>,
    /// The request body, de-chunked if it was sent chunked.
    pub body: Bytes,
    /// HTTP/1 minor version of the request line (`1` for HTTP/1.1, `0` for HTTP/1.0).
    pub version: u8,
    /// Sequence number (from 0) of the TCP connection that carried this request.
    pub conn_id: usize,
}

impl RecordedRequest {
    /// The fields other than those named exactly `skip`, sorted: what two nodes asked an origin,
    /// compared without the fields that name each node.
    pub fn sorted_fields_except(&self, skip: &[&str]) -> Vec<(String, String)> {
        let mut fields: Vec<(String, String)> = self
            .headers
            .iter()
            .filter(|(name, _)| !skip.contains(&name.as_str()))
            .cloned()
            .collect();
        fields.sort();
        fields
    }

    /// First value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        field(&self.headers, name)
    }

    /// All values of header `name` (case-insensitive), in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        field_values(&self.headers, name)
    }

    /// Whether header `name` (case-insensitive) is present.
    pub fn has_header(&self, name: &str) -> bool {
        has_field(&self.headers, name)
    }

    /// The path without the query string.
    pub fn path_only(&self) -> &str {
        self.path.split('?').next().unwrap_or("")
    }

    /// The query string (without `?`), if any.
    pub fn query(&self) -> Option<&str> {
        self.path.split_once('?').map(|(_, q)| q)
    }
}

/// Every value of a repeatable query parameter, in order.
pub fn query_params(req: &RecordedRequest, name: &str) -> Vec<String> {
    req.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| url_decode(v))
        .collect()
}

/// The first value of query parameter `name` of a recorded request, decoded.
pub fn query_param(req: &RecordedRequest, name: &str) -> Option<String> {
    query_params(req, name).into_iter().next()
}

/// Decodes `%XX` and `+` in a query value.
pub fn url_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
