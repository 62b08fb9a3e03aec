//! What a purge or ban names, as it was asked for: a URL, a tag, a host, a host and a path
//! prefix. This is what the invalidation log carries and the answer reports; [`Target::scope`]
//! resolves it into the storage's terms (hashes), once per ban.

use crate::proxy::cache_key;
use crate::proxy::request_head::authority;
use crate::storage::ban_list::scope::{scope_hash, Scope};
use serde::Serialize;

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

    /// The URL target of one page: `host` (as a request or an operator wrote it) and `path`,
    /// reached over `https` or not. The key's text of a scheme starts with its host so:
    /// [`cache_key::HTTPS_PREFIX`] + host for `https`, the host alone for `http` (keys stored
    /// before the scheme was part of the key stay valid). Written lowercase once, in one
    /// allocation: every successful POST names two pages.
    pub fn page(https: bool, host: &str, path: &str) -> Target {
        let prefix = if https { cache_key::HTTPS_PREFIX } else { "" };
        let mut keyed = String::with_capacity(prefix.len() + host.len());
        keyed.push_str(prefix);
        keyed.push_str(host);
        keyed.make_ascii_lowercase();
        Target::Url {
            host: keyed,
            path: path.to_string(),
        }
    }

    /// Why the target's host cannot be one a cache key holds, if it cannot: an empty host, or
    /// one that is not `host[:port]` in RFC 3986 syntax (a request with such a `Host` is refused
    /// with a 400 before it is keyed). Such a target names nothing; worse, a host holding `/`
    /// would push part of its path into the key's host part (`docs/security.md`).
    pub fn host_problem(&self) -> Option<String> {
        match self {
            Target::Url { host, .. } => {
                host_problem(host.strip_prefix(cache_key::HTTPS_PREFIX).unwrap_or(host))
            }
            Target::Host(host) => host_problem(host),
            Target::Prefix {
                host: Some(host), ..
            } => host_problem(host),
            Target::Prefix { host: None, .. } | Target::Tag(_) => None,
        }
    }

    /// The scope entries are matched by.
    pub fn scope(&self) -> Scope {
        match self {
            Target::Url { host, path } => {
                Scope::Url(u128::from_be_bytes(cache_key::url_hash(host, path)))
            }
            Target::Tag(tag) => Scope::Tag(scope_hash(tag)),
            // hosts as keys spell them: lowercase, without an empty port or a final dot
            Target::Host(host) => Scope::Host(scope_hash(&cache_key::keyed_host_text(host))),
            Target::Prefix { host, prefix } => Scope::Prefix {
                host: host
                    .as_deref()
                    .map(|h| scope_hash(&cache_key::keyed_host_text(h))),
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

/// Why `host` (as a client writes it in `Host`, without a scheme) cannot be one a cache key
/// holds, if it cannot (see [`Target::host_problem`]).
pub fn host_problem(host: &str) -> Option<String> {
    if host.is_empty() {
        return Some("an empty host".into());
    }
    (!authority::names_a_host(host.as_bytes()))
        .then(|| format!("{host:?} is not a host (host or host:port)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ban_list::scope::{host_and_path, EntryScopes};
    use pingora_cache::key::CacheHashKey;

    #[test]
    fn a_page_target_is_the_url_target_of_its_schemes_key_host() {
        for https in [false, true] {
            for host in ["Shop.Example:8080", "a.test", "A.TEST."] {
                let keyed = if https {
                    format!("{}{host}", cache_key::HTTPS_PREFIX)
                } else {
                    host.to_string()
                };
                assert_eq!(
                    Target::page(https, host, "/a/B?c=D"),
                    Target::url(&keyed, "/a/B?c=D")
                );
            }
        }
        assert_eq!(
            Target::page(true, "A.test", "/").describe(),
            "url https://a.test/"
        );
    }

    #[test]
    fn a_url_target_covers_the_entry_of_that_key_and_the_key_text_splits_back() {
        let key = cache_key::of_url("Shop.Example:8080", "/a/b?c=/d");
        let text = std::str::from_utf8(key.primary_key()).unwrap();
        assert_eq!(host_and_path(text), ("shop.example:8080", "/a/b?c=/d"));
        let entry = EntryScopes::new(text, u128::from_be_bytes(key.primary_bin()), Box::new([]));
        assert!(Target::url("SHOP.example:8080", "/a/b?c=/d")
            .scope()
            .covers(&entry));
        assert!(!Target::url("shop.example", "/a/b?c=/d")
            .scope()
            .covers(&entry));
        assert!(Target::Host("Shop.Example:8080".into())
            .scope()
            .covers(&entry));
        let prefix = Target::Prefix {
            host: Some("shop.example:8080".into()),
            prefix: "/a/".into(),
        };
        assert!(prefix.scope().covers(&entry));
    }

    #[test]
    fn host_and_prefix_bans_name_hosts_as_keys_spell_them_without_an_empty_port() {
        let key = cache_key::of_url("shop.example:", "/a/b");
        let text = std::str::from_utf8(key.primary_key()).unwrap();
        let entry = EntryScopes::new(text, u128::from_be_bytes(key.primary_bin()), Box::new([]));
        for host in ["shop.example", "Shop.Example:"] {
            assert!(Target::Host(host.into()).scope().covers(&entry), "{host}");
            let prefix = Target::Prefix {
                host: Some(host.into()),
                prefix: "/a/".into(),
            };
            assert!(prefix.scope().covers(&entry), "{host}");
        }
    }
}
