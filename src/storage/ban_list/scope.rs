//! What a purge or ban covers, and what a stored entry is, so that one can be matched against the
//! other.
//!
//! * [`Scope`]: what a ban covers, in the terms entries are indexed by (hashes): a URL, a tag, a
//!   host, or a path prefix of one host or of all (`crate::invalidation` turns what was asked
//!   for into one).
//! * [`EntryScopes`]: what one entry is under every kind of scope (its URL's primary hash, its
//!   host, its path, its tags), computed once when the entry is stored or read from memcached.
//!
//! Hosts are matched as they appear in the cache key: lowercased, with the port when the client
//! sent one (`shop.example:8080` is not `shop.example`). Hashes of hosts and tags are 64-bit and
//! local to this process; a collision can only invalidate more than asked, never less.

use std::hash::{DefaultHasher, Hash, Hasher};

/// A target resolved into what entries are indexed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A URL's primary hash (the memory tier's key of the object, and of its variants' base).
    Url(u128),
    /// A tag's hash.
    Tag(u64),
    /// A host's hash.
    Host(u64),
    /// A path prefix, of one host's hash or of every host.
    Prefix { host: Option<u64>, prefix: String },
}

impl Scope {
    /// Whether an entry that is `entry` falls under this scope.
    pub fn covers(&self, entry: &EntryScopes) -> bool {
        match self {
            Scope::Url(primary) => entry.primary == *primary,
            Scope::Tag(tag) => entry.tags.contains(tag),
            Scope::Host(host) => entry.host == *host,
            Scope::Prefix { host, prefix } => prefix_covers(*host, prefix, entry),
        }
    }
}

/// Whether a prefix scope (of one host's hash, or of every host) covers `entry`.
pub fn prefix_covers(host: Option<u64>, prefix: &str, entry: &EntryScopes) -> bool {
    host.is_none_or(|h| h == entry.host) && entry.path().starts_with(prefix)
}

/// The hash hosts and tags are indexed and matched by.
pub fn scope_hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// What one stored entry is under every kind of scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryScopes {
    /// The primary hash of its URL (variants share their URL's).
    pub primary: u128,
    /// The hash of its host.
    pub host: u64,
    /// Its tags' hashes.
    pub tags: Box<[u64]>,
    /// The key's text (host then path), for prefix matching and for the variant index.
    url: Box<str>,
    /// Where the path starts in `url` (after the scheme prefix, if any, and the host).
    host_len: usize,
}

/// The host and the path-and-query a primary key's text was built from: the inverse of
/// `proxy::cache_key::of_url`, which writes the lowercased host then the path (after `https://`
/// for an HTTPS request's key: the host of both schemes' entries is the same host). The host is
/// everything before the first `/`: a host never contains one, and a cached request's path
/// always starts with one.
pub fn host_and_path(primary: &str) -> (&str, &str) {
    let text = primary
        .strip_prefix(crate::proxy::cache_key::HTTPS_PREFIX)
        .unwrap_or(primary);
    text.split_at(text.find('/').unwrap_or(text.len()))
}

impl EntryScopes {
    /// The scopes of an entry whose primary key text is `primary_text` (host + path, see
    /// [`host_and_path`]), whose primary hash is `primary`, carrying `tags`.
    pub fn new(primary_text: &str, primary: u128, tags: Box<[u64]>) -> EntryScopes {
        let (host, path) = host_and_path(primary_text);
        EntryScopes {
            primary,
            host: scope_hash(host),
            tags,
            host_len: primary_text.len() - path.len(),
            url: primary_text.into(),
        }
    }

    /// The path (with query) of the entry's URL.
    pub fn path(&self) -> &str {
        &self.url[self.host_len..]
    }

    /// Heap bytes this takes, charged to the memory tier's budget with the object.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.url.len() + self.tags.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_scope_covers_what_it_names() {
        let tags: Box<[u64]> = Box::new([scope_hash("product-7"), scope_hash("catalog")]);
        let page = EntryScopes::new("shop.example/products/7?x=1", 77, tags);
        assert_eq!(page.path(), "/products/7?x=1");
        assert!(Scope::Url(77).covers(&page));
        assert!(!Scope::Url(78).covers(&page));
        assert!(Scope::Tag(scope_hash("catalog")).covers(&page));
        assert!(
            !Scope::Tag(scope_hash("Catalog")).covers(&page),
            "tags are exact"
        );
        assert!(Scope::Host(scope_hash("shop.example")).covers(&page));
        assert!(!Scope::Host(scope_hash("shop.example:8080")).covers(&page));
        let prefix = |host: Option<&str>, prefix: &str| Scope::Prefix {
            host: host.map(scope_hash),
            prefix: prefix.into(),
        };
        assert!(prefix(Some("shop.example"), "/products/").covers(&page));
        assert!(prefix(None, "/prod").covers(&page));
        assert!(!prefix(Some("other.example"), "/products/").covers(&page));
        assert!(!prefix(None, "/products/8").covers(&page));
        assert_eq!(host_and_path("hostonly"), ("hostonly", ""));
        assert_eq!(host_and_path("/no-host"), ("", "/no-host"));
    }

    #[test]
    fn an_https_entry_has_the_host_and_path_of_its_http_twin() {
        let text = "https://shop.example/products/7";
        assert_eq!(host_and_path(text), ("shop.example", "/products/7"));
        let entry = EntryScopes::new(text, 9, Box::new([]));
        assert_eq!(entry.path(), "/products/7");
        assert!(Scope::Host(scope_hash("shop.example")).covers(&entry));
        assert!(prefix_covers(None, "/products/", &entry));
    }
}
