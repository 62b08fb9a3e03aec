//! Tags: the names a response carries in one configured field (`Surrogate-Key` by default, as
//! Fastly; `xkey` as Varnish's vmod), so that one ban invalidates every entry carrying a name.
//!
//! The field stays in the stored head, in memory and in memcached, so an entry read back
//! anywhere (or written by an application) still says what it is tagged with; it is removed on
//! the way to the client unless configured otherwise. Tags are separated by whitespace or
//! commas, across repeated fields too, and compared exactly (case matters).

use super::scope::scope_hash;
use http::header::HeaderName;
use pingora_http::ResponseHeader;

/// The field responses name their tags in.
#[derive(Debug, Clone)]
pub struct TagField {
    name: HeaderName,
}

impl TagField {
    /// The field called `name` (a valid header name, checked when the config is loaded).
    pub fn new(name: &str) -> Option<TagField> {
        HeaderName::from_bytes(name.as_bytes())
            .ok()
            .map(|name| TagField { name })
    }

    /// The field's name.
    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    /// The tags `header` carries, in order, each once. A field value is split as bytes: a tag
    /// that is not UTF-8 is skipped alone, not the field with it (a value holding `café` once
    /// hid every tag beside it from bans; `café` itself, in UTF-8, is a tag like any other).
    pub fn tags<'a>(&self, header: &'a ResponseHeader) -> Vec<&'a str> {
        let mut tags: Vec<&str> = Vec::new();
        for value in header.headers.get_all(&self.name) {
            for tag in value
                .as_bytes()
                .split(|&b| b.is_ascii_whitespace() || b == b',')
                .filter_map(|tag| std::str::from_utf8(tag).ok())
            {
                if !tag.is_empty() && !tags.contains(&tag) {
                    tags.push(tag);
                }
            }
        }
        tags
    }

    /// The hashes of the tags `header` carries (see [`TagField::tags`]).
    pub fn hashes(&self, header: &ResponseHeader) -> Box<[u64]> {
        // the common case, an untagged response, allocates nothing
        if !header.headers.contains_key(&self.name) {
            return Box::new([]);
        }
        self.tags(header).into_iter().map(scope_hash).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split_on_whitespace_and_commas_across_repeated_fields() {
        let field = TagField::new("surrogate-key").unwrap();
        let mut head = ResponseHeader::build(200, None).unwrap();
        assert!(field.hashes(&head).is_empty());
        head.append_header("Surrogate-Key", "product-7  catalog,home")
            .unwrap();
        head.append_header("surrogate-key", "catalog Sale").unwrap();
        assert_eq!(
            field.tags(&head),
            vec!["product-7", "catalog", "home", "Sale"]
        );
        assert_eq!(field.hashes(&head).len(), 4);
        assert_eq!(field.hashes(&head)[3], scope_hash("Sale"));
    }

    #[test]
    fn a_tag_that_is_not_ascii_hides_none_beside_it() {
        let field = TagField::new("surrogate-key").unwrap();
        let mut head = ResponseHeader::build(200, None).unwrap();
        let value = http::HeaderValue::from_bytes("product-7 café".as_bytes()).unwrap();
        head.append_header("surrogate-key", value).unwrap();
        let latin1 = http::HeaderValue::from_bytes(b"caf\xe9 home").unwrap();
        head.append_header("surrogate-key", latin1).unwrap();
        assert_eq!(field.tags(&head), vec!["product-7", "café", "home"]);
    }
}
