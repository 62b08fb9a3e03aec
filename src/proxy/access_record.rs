//! The access-log record of a finished request: what the session and the request context know
//! about it, gathered in `logging` into the [`AccessRecord`] that `observe::access_log` formats
//! and writes.

use super::RequestCtx;
use crate::observe::access_log::{AccessLog, AccessRecord};
use pingora_proxy::Session;

/// `logging`: writes the request's line to `log`; `status_name` is the cache's name in
/// `Cache-Status` (`cache.status_name`); `client` is the client's address as
/// `proxy::forwarding` resolved it.
pub fn on_request_end(
    log: &AccessLog,
    session: &Session,
    ctx: &RequestCtx,
    status_name: &str,
    client: Option<std::net::IpAddr>,
) {
    let req = session.req_header();
    let header = |name: http::header::HeaderName| {
        req.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let status = session
        .response_written()
        .map(|r| r.status.as_u16())
        .unwrap_or(0);
    let cache_status = ctx.cache_status.clone().unwrap_or_default();
    let rendered = cache_status.header_value(status_name, true);
    log.log(&AccessRecord {
        client: client
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| "-".into()),
        method: req.method.as_str(),
        uri: logged_target(&req.uri, req.version),
        version: version_str(req.version),
        status,
        bytes: session.body_bytes_sent(),
        referer: header(http::header::REFERER),
        user_agent: header(http::header::USER_AGENT),
        cache: cache_status.log_word(),
        tier: cache_status.tier.map_or("-", |tier| tier.label()),
        cache_status: &rendered,
        upstream_ms: ctx.upstream.response_ms(),
        total_ms: ctx.started.elapsed().as_secs_f64() * 1000.0,
    });
}

/// The request target as an HTTP/1 request line carries it, which is what nginx's `$request`
/// and Varnish's `%r` log for every protocol: an HTTP/2 request's head is built by Pingora in
/// absolute form from its pseudo-fields (`http://authority/path`), so its path and query (its
/// `:path`) are logged; an HTTP/1 target as the client sent it (an absolute form stays one).
fn logged_target(uri: &http::Uri, version: http::Version) -> String {
    match (version, uri.path_and_query()) {
        (http::Version::HTTP_2, Some(target)) => target.as_str().to_string(),
        _ => uri.to_string(),
    }
}

/// The protocol as the combined log format writes it.
fn version_str(version: http::Version) -> &'static str {
    match version {
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2.0",
        http::Version::HTTP_3 => "HTTP/3.0",
        http::Version::HTTP_09 => "HTTP/0.9",
        _ => "HTTP/1.1",
    }
}

#[cfg(test)]
mod tests {
    use super::logged_target;
    use http::{Uri, Version};

    #[test]
    fn an_h2_request_is_logged_with_its_path_and_query_an_h1_one_as_sent() {
        let absolute: Uri = "http://example.com:8080/a/b?x=1&y".parse().unwrap();
        assert_eq!(logged_target(&absolute, Version::HTTP_2), "/a/b?x=1&y");
        assert_eq!(
            logged_target(&absolute, Version::HTTP_11),
            "http://example.com:8080/a/b?x=1&y"
        );
        let origin_form: Uri = "/a?x".parse().unwrap();
        assert_eq!(logged_target(&origin_form, Version::HTTP_11), "/a?x");
        assert_eq!(logged_target(&origin_form, Version::HTTP_2), "/a?x");
        let authority: Uri = "example.com:443".parse().unwrap();
        assert_eq!(
            logged_target(&authority, Version::HTTP_2),
            "example.com:443"
        );
    }
}
