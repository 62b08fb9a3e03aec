//! Pages written by the application: the reference Python writer (`examples/python/`) writes
//! pages into three real memcached servers, each on the server ketama places it on, and a
//! Lacquer node serves them without ever asking the origin; their tags can be banned like any
//! entry's.

use lacquer_test_support as support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use support::*;

/// The Python with the writer's memcached client: `scripts/setup.sh` makes `.venv`.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("LACQUER_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/setup.sh (it installs the example writer's memcached client)",
        venv.display()
    );
    venv
}

/// Runs the reference writer: writes `body` for `host` + `path`; returns the key it printed.
fn write_page(
    cluster: &MemcachedCluster,
    host: &str,
    path: &str,
    headers: &[&str],
    body: &[u8],
) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/python/lacquer_pages.py");
    let mut child = Command::new(python())
        .arg(script)
        .arg(cluster.names().join(","))
        .args([host, path, "300"])
        .args(headers)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Python writer");
    use std::io::Write;
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the writer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_written_by_the_python_writer_is_served_without_the_origin() {
    let cluster = MemcachedCluster::start(3);
    let origin = scripted_origin();
    let node = cluster.node(&origin, "A", "");
    let body = b"<html><body>written by the application</body></html>".to_vec();
    let path = "/app/page?id=7";
    let key = write_page(
        &cluster,
        "Shop.Example",
        path,
        &["Content-Type: text/html", "Surrogate-Key: app product-7"],
        &body,
    );
    // the writer put it where Lacquer looks: the key of the URL, on the server ketama names
    assert_eq!(key, MemcachedCluster::key_of("shop.example", path));
    let owner = cluster.server_for(&key);
    for (i, server) in cluster.servers.iter().enumerate() {
        assert_eq!(server.get_raw(&key).is_some(), i == owner, "server {i}");
    }

    let site = [("host", "shop.example")];
    let served = get(&node.proxy.url(path), &site).await;
    assert_eq!(served.status, 200);
    assert!(served.is_hit(), "{:?}", served.cache_status());
    assert_eq!(served.body, body);
    assert_eq!(served.header("content-type").as_deref(), Some("text/html"));
    assert!(!served.has_header("surrogate-key"));

    // the key is built from the Host the client sent, port included: a page for the address
    // the test client names (127.0.0.1:PORT) is another page
    let with_port = format!("127.0.0.1:{}", node.proxy.port());
    write_page(&cluster, &with_port, "/app/other", &[], b"other");
    let other = get(&node.proxy.url("/app/other"), &[]).await;
    assert!(other.is_hit(), "{:?}", other.cache_status());
    assert_eq!(other.text(), "other");
    assert_eq!(origin.hits(), 0, "the origin was never asked");

    // an application's page is banned by its tags like any entry
    let ban = admin_post(
        node.admin,
        "/ban",
        Some(ADMIN_TOKEN),
        r#"{"tag": "product-7"}"#,
    )
    .await;
    assert_eq!(ban.status, 200, "{}", ban.text());
    let after = get(&node.proxy.url(path), &site).await;
    assert!(!after.is_hit());
    assert_eq!(origin.hits_for(path), 1);
}
