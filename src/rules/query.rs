//! Rewriting the query string for `drop_query` and `sort_query`: the request is changed in place,
//! so the cache key (built from the request by `crate::proxy::cache_key`) and the fetch both use
//! the rewritten URL, and no key code needs to know about rules (Varnish's `std.querysort` and
//! tracking-parameter removal change `req.url` the same way).

use super::fields::query_name;
use pingora_http::RequestHeader;

/// Drops the parameters whose names start with one of `drop` and, with `sort`, orders the rest
/// by name (stable: repeated names keep their order). Leaves the request untouched when nothing
/// changes, and the `?` out when no parameter is left.
pub fn rewrite(req: &mut RequestHeader, drop: &[String], sort: bool) {
    let Some(query) = req.uri.query() else {
        return;
    };
    let mut kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            let name = query_name(pair);
            !drop.iter().any(|prefix| name.starts_with(prefix.as_str()))
        })
        .collect();
    if sort {
        kept.sort_by_key(|pair| query_name(pair));
    }
    let rewritten = kept.join("&");
    if rewritten == query {
        return;
    }
    let path = req.uri.path();
    let target = match rewritten.is_empty() {
        true => path.to_string(),
        false => format!("{path}?{rewritten}"),
    };
    let mut parts = req.uri.clone().into_parts();
    parts.path_and_query = match target.parse() {
        Ok(path_and_query) => Some(path_and_query),
        // cannot happen (pieces of a valid target), but a rule must never break a request
        Err(_) => return,
    };
    if let Ok(uri) = http::Uri::from_parts(parts) {
        req.set_uri(uri);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(target: &str, drop: &[&str], sort: bool) -> String {
        let mut req = RequestHeader::build("GET", target.as_bytes(), None).unwrap();
        let drop: Vec<String> = drop.iter().map(|s| s.to_string()).collect();
        rewrite(&mut req, &drop, sort);
        String::from_utf8(req.raw_path().to_vec()).unwrap()
    }

    #[test]
    fn tracking_parameters_are_dropped_by_name_or_prefix() {
        let drop = ["utm_", "fbclid", "gclid"];
        assert_eq!(
            rewritten("/p?utm_source=x&id=7&fbclid=abc&utm_medium=y", &drop, false),
            "/p?id=7"
        );
        assert_eq!(rewritten("/p?gclid=1&utm_campaign=2", &drop, false), "/p");
        assert_eq!(rewritten("/p?id=7", &drop, false), "/p?id=7");
        assert_eq!(rewritten("/p", &drop, false), "/p");
    }

    #[test]
    fn sorting_orders_by_name_and_keeps_repeated_names_in_order() {
        assert_eq!(rewritten("/s?b=2&a=1&b=1&c", &[], true), "/s?a=1&b=2&b=1&c");
        assert_eq!(rewritten("/s?b=2&utm_x=1&a", &["utm_"], true), "/s?a&b=2");
    }
}
