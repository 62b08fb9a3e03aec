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
        uri: req.uri.to_string(),
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
