//! A memcached run without CAS tokens (`-C`, 8 bytes saved per item: some operators run it so)
//! gives every value the token 0 and answers every compare-and-swap `EX`. A node writes its
//! entries with `add`, and replaces what is there (older, or not an entry of the key) by a
//! compare-and-swap of what it read (`TieredStorage::store_unless_newer`): against such a server
//! that replace never landed, so a stale entry kept for revalidation (`keep`, an hour by
//! default) or a foreign value stayed in memcached, and every node refetched the page on each
//! read of it. These tests write over each with a real `memcached -C`.

use lacquer_test_support as support;

use support::*;

const HOST: &str = "shop.example";

/// A node with `server` as its only memcached, trusting its memory copy for no time at all, so
/// each request reads memcached.
fn node(server: &MemcachedProcess, origin: &TestOrigin) -> LacquerProcess {
    let config = format!(
        "\n[log]\naccess = \"off\"\n[cache.memcached]\nservers = [\"{}\"]\nlocal_ttl = \"0s\"\n\
         op_timeout = \"500ms\"\n",
        server.addr()
    );
    LacquerProcess::start_simple(origin.addr(), &config)
}

/// Whether memcached holds `bytes` in `path`'s entry.
fn entry_holds(server: &MemcachedProcess, path: &str, bytes: &[u8]) -> bool {
    server
        .get_raw(&MemcachedCluster::key_of(HOST, path))
        .is_some_and(|raw| raw.windows(bytes.len()).any(|w| w == bytes))
}

/// memcached's CAS token for `key` (`mg <key> c`): 0 on a server run with `-C`.
fn cas_of(server: &MemcachedProcess, key: &str) -> Option<u64> {
    let reply = server.command(&format!("mg {key} c"), None);
    let token = reply.split_whitespace().find_map(|t| t.strip_prefix('c'))?;
    token.parse().ok()
}

/// A value under a page's key that is no entry of it (another program's, or garbage): the node
/// reads it as a miss, fetches the page, and its write replaces the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_value_under_an_entrys_key_is_replaced() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let origin = TestOrigin::start(|req| {
        OriginResponse::ok(format!("page {}", req.path)).header("cache-control", "max-age=600")
    });
    let proxy = node(&server, &origin);
    let path = "/foreign";
    let key = MemcachedCluster::key_of(HOST, path);
    let junk = b"not an entry";
    let reply = server.command(&format!("set {key} 0 600 {}", junk.len()), Some(junk));
    assert!(reply.starts_with("STORED"), "{reply}");
    assert_eq!(cas_of(&server, &key), Some(0), "memcached not run with -C");
    let resp = get(&proxy.url(path), &[("host", HOST)]).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "page /foreign");
    assert!(
        poll_until_async(Duration::from_secs(5), || entry_holds(
            &server,
            path,
            b"page /foreign"
        ))
        .await,
        "the foreign value was never replaced: {:?}",
        server
            .get_raw(&key)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    );
    // and read back: the next request is a hit from memcached, not another fetch
    let again = get(&proxy.url(path), &[("host", HOST)]).await;
    assert_eq!(again.text(), "page /foreign");
    assert_eq!(origin.hits_for(path), 1);
}

/// A page fresh for one second, kept in memcached past its freshness (for revalidation): once
/// stale, a request refetches it, and the new answer replaces the stale entry; the request after
/// that is served the new answer from memcached, not refetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_entry_is_replaced_by_the_answer_fetched_after_it() {
    let server = MemcachedProcess::start_with(&["-C"]);
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = served.clone();
    let origin = TestOrigin::start(move |_req| {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        OriginResponse::ok(format!("answer {n}")).header("cache-control", "max-age=1")
    });
    let proxy = node(&server, &origin);
    let path = "/stale";
    let first = get(&proxy.url(path), &[("host", HOST)]).await;
    assert_eq!(first.text(), "answer 1");
    assert!(
        poll_until_async(Duration::from_secs(5), || entry_holds(
            &server,
            path,
            b"answer 1"
        ))
        .await,
        "the first answer was never written"
    );
    // stale now, still in memcached (`keep`)
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let second = get(&proxy.url(path), &[("host", HOST)]).await;
    assert_eq!(second.text(), "answer 2");
    assert!(
        poll_until_async(Duration::from_secs(5), || entry_holds(
            &server,
            path,
            b"answer 2"
        ))
        .await,
        "the stale entry was never replaced by the answer fetched after it"
    );
    let third = get(&proxy.url(path), &[("host", HOST)]).await;
    assert_eq!(
        third.text(),
        "answer 2",
        "served from memcached while fresh"
    );
    assert_eq!(origin.hits_for(path), 2);
}
