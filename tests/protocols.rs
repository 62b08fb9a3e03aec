//! Protocol handling: HTTP/2 (h2c and TLS with ALPN), malformed requests, upstream keep-alive,
//! and the access log.

mod support;

use std::process::Command;
use support::*;

#[tokio::test]
async fn h2c_prior_knowledge_is_served_and_cached() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let client = h2c_client();
    let url = lacquer.url("/h2?cc=max-age%3D60");
    let first = send(&client, "GET", &url, &[], None).await.unwrap();
    let second = send(&client, "GET", &url, &[], None).await.unwrap();
    assert_eq!(first.version, http::Version::HTTP_2);
    assert!(second.is_hit());
    assert_eq!(first.body, second.body);
    assert!(second.header("via").unwrap().contains("2 lacquer"));
    assert_eq!(origin.hits_for("/h2?cc=max-age%3D60"), 1);
}

#[test]
fn tls_listener_negotiates_h2_with_alpn() {
    let origin = scripted_origin();
    let dir = TempDir::new("lacquer-tls");
    let CertFiles { cert, key } = self_signed_cert(dir.path());
    let tls_port = free_port();
    let extra = format!(
        "[log]\naccess = \"off\"\n[tls]\nlisten = [\"127.0.0.1:{tls_port}\"]\ncert = \"{}\"\nkey = \"{}\"",
        cert.display(),
        key.display()
    );
    let _lacquer = LacquerProcess::start_simple(origin.addr(), &extra);
    let url = format!("https://127.0.0.1:{tls_port}/tls?cc=max-age%3D60");
    let curl = |extra: &[&str]| {
        let out = Command::new("curl")
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args(extra)
            .arg(&url)
            .output()
            .expect("curl is installed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(curl(&["--http2"]), "2 200");
    assert_eq!(curl(&["--http1.1"]), "1.1 200");
    assert_eq!(
        origin.hits_for("/tls?cc=max-age%3D60"),
        1,
        "second request was a hit"
    );
}

#[test]
fn malformed_requests_get_400_and_the_server_survives() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    for garbage in [
        &b"GARBAGE\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nBad Header Without Colon\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    ] {
        let answer = raw_request(lacquer.addr(), garbage);
        let status = raw_status(&answer);
        assert!(
            status == Some(400) || answer.is_empty(),
            "{:?} got {:?}",
            String::from_utf8_lossy(garbage),
            String::from_utf8_lossy(&answer)
        );
    }
    assert_eq!(origin.hits(), 0, "nothing malformed reached the origin");
    let mut conn = RawConn::connect(lacquer.addr());
    let ok = conn.get("/after?cc=max-age%3D60", &[]);
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn keep_alive_on_both_sides_reuses_upstream_connections() {
    let origin = scripted_origin();
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let client = http_client();
    for i in 0..20 {
        let url = lacquer.url(&format!("/ka/{i}?cc=no-store"));
        let r = send(&client, "GET", &url, &[], None).await.unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(origin.hits(), 20);
    assert!(
        origin.connections() <= 2,
        "{} upstream connections for 20 sequential requests",
        origin.connections()
    );
}

#[tokio::test]
async fn access_log_records_cache_status_as_json() {
    let origin = scripted_origin();
    let dir = TempDir::new("lacquer-log");
    let log_path = dir.path().join("access.log");
    let extra = format!(
        "[log]\naccess = \"{}\"\nformat = \"json\"",
        log_path.display()
    );
    let lacquer = LacquerProcess::start_simple(origin.addr(), &extra);
    let url = lacquer.url("/logged?cc=max-age%3D60");
    get(&url, &[("user-agent", "lacquer-test")]).await;
    get(&url, &[("user-agent", "lacquer-test")]).await;
    let mut lines = Vec::new();
    for _ in 0..50 {
        lines = std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if lines.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].contains("\"cache\":\"miss\"") && lines[0].contains("\"status\":200"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("\"cache\":\"hit\"") && lines[1].contains("lacquer-test"),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("\"uri\":\"/logged?cc=max-age%3D60\""),
        "{}",
        lines[1]
    );
}
