//! Reading the request's cookies and query parameters, as sent: the names and values rules match
//! on, without decoding (a rule names a parameter the way it appears in URLs).

use pingora_http::RequestHeader;

/// The `name=value` pairs of every `Cookie` field of `req` (HTTP/2 may send several).
pub fn cookies(req: &RequestHeader) -> impl Iterator<Item = (&str, &str)> {
    req.headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            Some((name.trim(), value.trim()))
        })
}

/// The `name=value` pairs of a query string (`value` empty for a bare `name`).
pub fn query_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// The name of one `&`-separated query parameter.
pub fn query_name(pair: &str) -> &str {
    pair.split_once('=').map_or(pair, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_come_from_every_cookie_field() {
        let mut req = RequestHeader::build("GET", b"/", None).unwrap();
        req.append_header("cookie", "a=1; b = 2;c").unwrap();
        req.append_header("cookie", "sessionid=xyz").unwrap();
        let all: Vec<_> = cookies(&req).collect();
        assert_eq!(all, [("a", "1"), ("b", "2"), ("sessionid", "xyz")]);
    }

    #[test]
    fn query_pairs_keep_bare_names() {
        let all: Vec<_> = query_pairs("a=1&&flag&b=x=y").collect();
        assert_eq!(all, [("a", "1"), ("flag", ""), ("b", "x=y")]);
        assert_eq!(query_name("utm_source=x"), "utm_source");
        assert_eq!(query_name("flag"), "flag");
    }
}
