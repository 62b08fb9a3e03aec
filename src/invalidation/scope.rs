//! What a purge or ban names, and what a stored entry is, so that one can be matched against the
//! other.
//!
//! * [`Target`]: what was asked for, as text (a URL, a tag, a host, a host and a path prefix):
//!   what the invalidation log carries and the answer reports.
//! * [`Scope`]: the same, resolved into what entries are indexed by (hashes), once per rule.
//! * [`EntryScopes`]: what one entry is under every kind of scope (its URL's primary hash, its
//!   host, its path, its tags), computed once when the entry is stored or read from memcached.
//!
//! Hosts are matched as they appear in the cache key: lowercased, with the port when the client
//! sent one (`shop.example:8080` is not `shop.example`). Hashes of hosts and tags are 64-bit and
//! local to this process; a collision can only invalidate more than asked, never less.

use crate::proxy::cache_key;
use pingora_cache::key::CacheHashKey;
use serde::Serialize;
use std::hash::{DefaultHasher, Hash, Hasher};

/// What one purge or ban names, as it was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// One URL and every variant stored under it: the cache key's host (lowercased, port as
    /// sent) and the path with its query.
    Url { host: String, path: String },
    /// Every entry whose tag field names this tag.
    Tag(String),
    /// Every entry of this host.
    Host(String),
    /// Every entry whose path starts with `prefix`, of one host or (`None`) of every host.
    Prefix {
        host: Option<String>,
        prefix: String,
    },
}

impl Target {
    /// A URL target; the host is lowercased as the cache key lowercases it.
    pub fn url(host: &str, path: &str) -> Target {
        Target::Url {
            host: host.to_ascii_lowercase(),
            path: path.to_string(),
        }
    }

    /// The scope entries are matched by.
    pub fn scope(&self) -> Scope {
        match self {
            Target::Url { host, path } => Scope::Url(u128::from_be_bytes(
                cache_key::of_url(host, path).primary_bin(),
            )),
            Target::Tag(tag) => Scope::Tag(scope_hash(tag)),
            Target::Host(host) => Scope::Host(scope_hash(&host.to_ascii_lowercase())),
            Target::Prefix { host, prefix } => Scope::Prefix {
                host: host.as_deref().map(|h| scope_hash(&h.to_ascii_lowercase())),
                prefix: prefix.clone(),
            },
        }
    }

    /// A short description for logs: `url shop.example/a`, `tag "product-7"`.
    pub fn describe(&self) -> String {
        match self {
            Target::Url { host, path } => format!("url {host}{path}"),
            Target::Tag(tag) => format!("tag {tag:?}"),
            Target::Host(host) => format!("host {host}"),
            Target::Prefix {
                host: Some(h),
                prefix,
            } => format!("prefix {h}{prefix}"),
            Target::Prefix { host: None, prefix } => format!("prefix {prefix} (every host)"),
        }
    }
}

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
    /// Where the path starts in `url`.
    host_len: usize,
}

impl EntryScopes {
    /// The scopes of an entry whose primary key text is `primary_text` (host + path, see
    /// [`cache_key::host_and_path`]), whose primary hash is `primary`, carrying `tags`.
    pub fn new(primary_text: &str, primary: u128, tags: Box<[u64]>) -> EntryScopes {
        let (host, _) = cache_key::host_and_path(primary_text);
        EntryScopes {
            primary,
            host: scope_hash(host),
            tags,
            host_len: host.len(),
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

    fn entry(url: &str, tags: &[&str]) -> EntryScopes {
        let (host, path) = cache_key::host_and_path(url);
        let primary = Target::url(host, path).scope();
        let Scope::Url(primary) = primary else {
            unreachable!()
        };
        EntryScopes::new(url, primary, tags.iter().map(|t| scope_hash(t)).collect())
    }

    #[test]
    fn each_kind_of_scope_covers_what_it_names() {
        let page = entry("shop.example/products/7?x=1", &["product-7", "catalog"]);
        let covers = |target: Target| target.scope().covers(&page);
        assert!(covers(Target::url("SHOP.example", "/products/7?x=1")));
        assert!(!covers(Target::url("shop.example", "/products/7")));
        assert!(covers(Target::Tag("catalog".into())));
        assert!(!covers(Target::Tag("Catalog".into())), "tags are exact");
        assert!(covers(Target::Host("Shop.Example".into())));
        assert!(!covers(Target::Host("shop.example:8080".into())));
        let prefix = |host: Option<&str>, prefix: &str| Target::Prefix {
            host: host.map(str::to_string),
            prefix: prefix.into(),
        };
        assert!(covers(prefix(Some("shop.example"), "/products/")));
        assert!(covers(prefix(None, "/prod")));
        assert!(!covers(prefix(Some("other.example"), "/products/")));
        assert!(!covers(prefix(None, "/products/8")));
        assert_eq!(page.path(), "/products/7?x=1");
    }
}
