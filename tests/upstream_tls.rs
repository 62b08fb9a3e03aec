//! `https` upstreams (issue 12 item 4): TLS to the origin with SNI, the origin's certificate
//! verified against a CA file (or the system roots), and a client certificate when the origin
//! asks for one. An origin whose certificate does not verify is refused before a byte of the
//! request reaches it: the client gets a 502 and the origin counts no request.
//!
//! The origins are [`TestOrigin`]s behind a [`TlsFront`] (rustls) with certificates from a
//! throw-away [`TestCa`].

use lacquer_test_support as support;
use std::time::Duration;
use support::*;

fn plain_origin() -> TestOrigin {
    TestOrigin::start(|req| {
        OriginResponse::ok(format!("over tls: {}", req.path)).header("cache-control", "no-store")
    })
}

/// Lacquer with one `[[upstreams]]` entry made of `entry` (its lines after `address`).
fn lacquer_for(address: &str, entry: &str) -> LacquerProcess {
    LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 1\n[log]\naccess = \"off\"\n\
             [balancer.retries]\nattempts = 0\n\
             [[upstreams]]\naddress = \"{address}\"\n{entry}\n"
        )
    })
}

fn toml_path(path: &std::path::Path) -> String {
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_certificate_signed_by_the_ca_file_is_verified_and_served() {
    let dir = TempDir::new("upstream-tls-ok");
    let ca = TestCa::new(dir.path(), "origin");
    let origin = plain_origin();
    let front = TlsFront::start(origin.addr(), &ca.server_cert("server"), None);

    // by IP address: the SNI defaults to the address's host, checked against the IP name
    let by_ip = lacquer_for(
        &format!("https://{}", front.addr()),
        &format!("ca_file = \"{}\"", toml_path(&ca.cert)),
    );
    let resp = get(&by_ip.url("/by-ip"), &[]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.text(), "over tls: /by-ip");

    // by name: `tls = true` with an explicit SNI the certificate carries
    let by_name = lacquer_for(
        &front.addr().to_string(),
        &format!(
            "tls = true\nsni = \"localhost\"\nca_file = \"{}\"",
            toml_path(&ca.cert)
        ),
    );
    let resp = get(&by_name.url("/by-name"), &[]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(origin.hits_for("/by-name"), 1);
    assert_eq!(origin.hits(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_the_ca_did_not_sign_is_refused_before_the_request_is_sent() {
    let dir = TempDir::new("upstream-tls-rogue");
    let trusted = TestCa::new(dir.path(), "trusted");
    let rogue = TestCa::new(dir.path(), "rogue");
    let origin = plain_origin();
    let front = TlsFront::start(origin.addr(), &rogue.server_cert("server"), None);

    let lacquer = lacquer_for(
        &format!("https://{}", front.addr()),
        &format!("ca_file = \"{}\"", toml_path(&trusted.cert)),
    );
    let resp = get(&lacquer.url("/secret"), &[]).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(origin.hits(), 0, "the origin never gets the request");
    assert_eq!(front.handshakes(), 0, "Lacquer aborted the handshake");

    // nor is the test CA among the system roots used when no ca_file is given
    let system_roots = lacquer_for(&format!("https://{}", front.addr()), "");
    assert_eq!(get(&system_roots.url("/x"), &[]).await.status, 502);
    assert_eq!(origin.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_refused() {
    let dir = TempDir::new("upstream-tls-name");
    let ca = TestCa::new(dir.path(), "origin");
    let origin = plain_origin();
    let front = TlsFront::start(origin.addr(), &ca.server_cert("server"), None);

    let lacquer = lacquer_for(
        &format!("https://{}", front.addr()),
        &format!(
            "sni = \"app.internal\"\nca_file = \"{}\"",
            toml_path(&ca.cert)
        ),
    );
    let resp = get(&lacquer.url("/x"), &[]).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(origin.hits(), 0);
    assert_eq!(front.handshakes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_asking_for_a_client_certificate_gets_the_configured_one() {
    let dir = TempDir::new("upstream-tls-client");
    let ca = TestCa::new(dir.path(), "origin");
    let clients = TestCa::new(dir.path(), "clients");
    let origin = plain_origin();
    let front = TlsFront::start(
        origin.addr(),
        &ca.server_cert("server"),
        Some(&clients.cert),
    );
    let client = clients.client_cert("lacquer");

    let with_cert = lacquer_for(
        &format!("https://{}", front.addr()),
        &format!(
            "ca_file = \"{}\"\nclient_cert = \"{}\"\nclient_key = \"{}\"",
            toml_path(&ca.cert),
            toml_path(&client.cert),
            toml_path(&client.key)
        ),
    );
    let resp = get(&with_cert.url("/mtls"), &[]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(origin.hits_for("/mtls"), 1);

    let without = lacquer_for(
        &format!("https://{}", front.addr()),
        &format!("ca_file = \"{}\"", toml_path(&ca.cert)),
    );
    let resp = get(&without.url("/no-cert"), &[]).await;
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(origin.hits_for("/no-cert"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_probe_over_tls_and_verify_the_certificate() {
    let dir = TempDir::new("upstream-tls-health");
    let trusted = TestCa::new(dir.path(), "trusted");
    let rogue = TestCa::new(dir.path(), "rogue");
    let origin = plain_origin();
    let good = TlsFront::start(origin.addr(), &trusted.server_cert("good"), None);
    let bad = TlsFront::start(origin.addr(), &rogue.server_cert("bad"), None);
    let ca_file = toml_path(&trusted.cert);
    let lacquer = LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 1\n[log]\naccess = \"off\"\n\
             [balancer.health_check]\npath = \"/health\"\ninterval = \"1s\"\n\
             timeout = \"1s\"\nfall = 2\n\
             [[upstreams]]\naddress = \"https://{}\"\nca_file = \"{ca_file}\"\n\
             [[upstreams]]\naddress = \"https://{}\"\nca_file = \"{ca_file}\"\n",
            good.addr(),
            bad.addr()
        )
    });
    let down = format!("backend {} is down", bad.addr());
    assert!(
        wait_for_log(&lacquer, &down, Duration::from_secs(20)),
        "{}",
        lacquer.stderr_log()
    );
    assert!(
        origin
            .wait_for_hits_for_async("/health", 2, Duration::from_secs(20))
            .await,
        "the good backend's probes never arrived over TLS"
    );
    assert_eq!(bad.handshakes(), 0);
    assert!(
        !lacquer
            .stderr_log()
            .contains(&format!("backend {} is down", good.addr())),
        "{}",
        lacquer.stderr_log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_replaced_in_place_is_used_after_a_reload() {
    let dir = TempDir::new("upstream-tls-reload");
    let right = TestCa::new(dir.path(), "right");
    let wrong = TestCa::new(dir.path(), "wrong");
    let origin = plain_origin();
    let front = TlsFront::start(origin.addr(), &right.server_cert("server"), None);
    // the configured path first holds a CA that did not sign the origin's certificate
    let ca_file = dir.path().join("origin-ca.pem");
    std::fs::copy(&wrong.cert, &ca_file).unwrap();
    let lacquer = lacquer_for(
        &format!("https://{}", front.addr()),
        &format!("ca_file = \"{}\"", toml_path(&ca_file)),
    );
    assert_eq!(get(&lacquer.url("/before"), &[]).await.status, 502);
    assert_eq!(origin.hits(), 0);

    // the file is replaced under the same name, as a certificate rotation does, then reloaded
    std::fs::copy(&right.cert, &ca_file).unwrap();
    assert!(lacquer.signal("HUP"));
    assert!(
        wait_for_log(&lacquer, "configuration reloaded", Duration::from_secs(10)),
        "{}",
        lacquer.stderr_log()
    );
    assert!(
        !lacquer.stderr_log().contains("need a hand-over or restart"),
        "the same files are no restart-only change: {}",
        lacquer.stderr_log()
    );
    let resp = get(&lacquer.url("/after"), &[]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(origin.hits_for("/after"), 1);
}
