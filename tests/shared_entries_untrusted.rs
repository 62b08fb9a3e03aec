//! Entries read from memcached are untrusted input: hand-built entries with a valid CRC but a head
//! whose framing lies about the body are served with framing rebuilt from the body, on the fast
//! path and on the standard one, and the client's connection goes on working; entries Lacquer
//! would never store are misses.

use lacquer_test_support as support;

use bytes::Bytes;
use lacquer::storage::entry::{encode_complete, encode_manifest, ChunkList};
use lacquer::storage::object::StoredMeta;
use lacquer::storage::tiered::{logical_key, memcached_key};
use pingora_http::ResponseHeader;
use std::time::{Duration as StdDuration, SystemTime};
use support::*;

/// The `Host` a [`RawConn`] sends.
const HOST: &str = "test";
const BODY: &[u8] = b"the body as stored";

fn planted_meta(status: u16, fields: &[(&str, &str)]) -> StoredMeta {
    let mut header = ResponseHeader::build(status, None).unwrap();
    for (name, value) in fields {
        header.append_header(name.to_string(), *value).unwrap();
    }
    let now = SystemTime::now();
    StoredMeta {
        fresh_until: now + StdDuration::from_secs(300),
        created: now,
        epoch: now,
        stale_while_revalidate_sec: 0,
        stale_if_error_sec: 0,
        variance: None,
        header,
        wire_head: Default::default(),
    }
}

/// Writes `value` where a node looks for `path`'s entry.
fn plant(memcached: &MemcachedProcess, path: &str, value: &[u8]) {
    let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(HOST, path));
    let reply = memcached.command(&format!("set {key} 0 300 {}", value.len()), Some(value));
    assert!(reply.starts_with("STORED"), "{reply}");
}

fn plant_complete(memcached: &MemcachedProcess, path: &str, meta: &StoredMeta, body: &[u8]) {
    let logical = logical_key(&lacquer::proxy::cache_key::of_url(HOST, path));
    let value = encode_complete(&logical, meta, &[Bytes::copy_from_slice(body)]);
    plant(memcached, path, &value);
}

fn node(memcached: &MemcachedProcess, origin: &TestOrigin) -> (LacquerProcess, u16) {
    let admin = free_port();
    let config = format!(
        "[log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [cache.memcached]\nservers = [\"{}\"]",
        memcached.addr()
    );
    (LacquerProcess::start_simple(origin.addr(), &config), admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_framing_is_rebuilt_from_the_stored_body_and_the_connection_survives() {
    let memcached = MemcachedProcess::start();
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(format!("origin {}", req.path)).header("cache-control", "no-store")
    });
    let (lacquer, _admin) = node(&memcached, &origin);
    let lies: [(&str, Vec<(&str, &str)>); 5] = [
        ("longer", vec![("content-length", "1000")]),
        ("shorter", vec![("content-length", "3")]),
        ("chunked", vec![("transfer-encoding", "chunked")]),
        (
            "twice",
            vec![("content-length", "18"), ("content-length", "40")],
        ),
        (
            "closing",
            vec![("connection", "close"), ("keep-alive", "timeout=1")],
        ),
    ];
    let mut conn = RawConn::connect(lacquer.addr());
    conn.read_timeout = Duration::from_secs(5);
    for (name, fields) in &lies {
        // the fast path (a plain GET) and the standard path (a request directive declines the
        // fast path) each read their own planted entry
        for (path, extra) in [
            (format!("/{name}"), vec![]),
            (
                format!("/{name}/standard"),
                vec![("cache-control", "max-stale=0")],
            ),
        ] {
            let mut fields = fields.clone();
            fields.push(("content-type", "text/plain"));
            plant_complete(&memcached, &path, &planted_meta(200, &fields), BODY);
            let resp = conn.get(&path, &extra);
            assert_eq!(resp.status, 200, "{path}");
            assert_eq!(resp.body, BODY, "{path}: the body as stored, whole");
            assert_eq!(
                resp.header_all("content-length"),
                vec![BODY.len().to_string().as_str()],
                "{path}: one Content-Length, the body's"
            );
            assert!(resp.header("transfer-encoding").is_none(), "{path}");
            assert!(
                resp.header("cache-status")
                    .is_some_and(|s| s.contains("hit")),
                "{path}: {:?}",
                resp.header("cache-status")
            );
        }
    }
    // the same connection still carries requests: nothing of a body was left over or missing
    let after = conn.get("/from-origin", &[]);
    assert_eq!(after.status, 200);
    assert_eq!(after.text(), "origin /from-origin");
    assert_eq!(
        origin.hits(),
        1,
        "every planted entry was served from memcached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_this_cache_never_stores_are_misses() {
    let memcached = MemcachedProcess::start();
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(format!("origin {}", req.path)).header("cache-control", "no-store")
    });
    let (lacquer, admin) = node(&memcached, &origin);
    let partial = planted_meta(206, &[("content-range", "bytes 0-17/1000")]);
    plant_complete(&memcached, "/partial", &partial, BODY);
    let no_content = planted_meta(204, &[]);
    plant_complete(&memcached, "/no-content", &no_content, BODY);
    // a manifest that would have the reader build four billion chunk keys
    let logical = logical_key(&lacquer::proxy::cache_key::of_url(HOST, "/many"));
    let list = ChunkList {
        write_id: 1,
        body_len: u64::MAX,
        count: u32::MAX,
        body_crc: 0,
    };
    plant(
        &memcached,
        "/many",
        &encode_manifest(&logical, &planted_meta(200, &[]), &list),
    );
    let mut conn = RawConn::connect(lacquer.addr());
    for path in ["/partial", "/no-content", "/many"] {
        let resp = conn.get(path, &[]);
        assert_eq!(resp.status, 200, "{path}");
        assert_eq!(
            resp.text(),
            format!("origin {path}"),
            "{path} was served from memcached"
        );
    }
    assert_eq!(origin.hits(), 3);
    assert_eq!(admin_stat(admin, "rejected").await, 3);
}

/// An entry dated further ahead than clocks differ (an application's clock or code wrong) would
/// escape every purge issued before its date and keep Lacquer's own writes from replacing it: it
/// is refused as malformed, and the fill that follows replaces it. One dated a few seconds ahead
/// (clocks that differ a little) is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_dated_in_the_future_is_refused_and_replaced() {
    let memcached = MemcachedProcess::start();
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(format!("origin {}", req.path)).header("cache-control", "max-age=300")
    });
    let (lacquer, admin) = node(&memcached, &origin);
    let dated = |ahead: StdDuration| {
        let mut meta = planted_meta(200, &[("content-type", "text/plain")]);
        meta.created += ahead;
        meta.epoch += ahead;
        meta.fresh_until += ahead;
        meta
    };
    plant_complete(
        &memcached,
        "/tomorrow",
        &dated(StdDuration::from_secs(86_400)),
        BODY,
    );
    plant_complete(
        &memcached,
        "/skewed",
        &dated(StdDuration::from_secs(5)),
        BODY,
    );

    let mut conn = RawConn::connect(lacquer.addr());
    let skewed = conn.get("/skewed", &[]);
    assert_eq!(skewed.body, BODY, "a few seconds ahead: served");
    let refused = conn.get("/tomorrow", &[]);
    assert_eq!(refused.status, 200);
    assert_eq!(
        refused.text(),
        "origin /tomorrow",
        "served the entry dated tomorrow"
    );
    assert_eq!(admin_stat(admin, "rejected").await, 1);
    // the fill replaced it in memcached (it is not "a newer answer")
    assert_eq!(
        wait_for_stat(admin, "writes", 1, Duration::from_secs(10)).await,
        1
    );
    assert_eq!(admin_stat(admin, "writes_superseded").await, 0);
    let key = memcached_key("lq", &lacquer::proxy::cache_key::of_url(HOST, "/tomorrow"));
    let held = memcached.get_raw(&key).expect("an entry under the key");
    assert!(
        held.windows(b"origin /tomorrow".len())
            .any(|w| w == b"origin /tomorrow"),
        "memcached still holds the entry dated tomorrow"
    );
    assert_eq!(origin.hits(), 1);
}
