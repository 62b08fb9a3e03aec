//! Origins given by host name are looked up again every `balancer.resolve_interval`, while
//! Lacquer runs: a name that moves takes its traffic with it, every address of a name is a
//! replica, and a look-up that fails keeps the addresses the name had.
//!
//! The name `origin.test` is made up in a hosts file of the test's own: Lacquer runs in a private
//! mount namespace (`unshare -m`) where that file is bind-mounted over `/etc/hosts` (and a
//! `nsswitch.conf` saying `hosts: files`, so no look-up leaves the machine). glibc reads
//! `/etc/hosts` on every look-up, so rewriting the file (in place: the bind mount holds its
//! inode) is a DNS change seen by the running process only. The origins listen on 127.0.0.2 and
//! 127.0.0.3, one port for both, as replicas of one service would. This needs root (to mount),
//! which the test machines and CI have.

use lacquer_test_support as support;

use std::net::SocketAddr;
use std::path::PathBuf;
use support::*;

/// The hosts and nsswitch files Lacquer sees, and the launcher that shows them to it.
struct Names {
    dir: TempDir,
}

impl Names {
    /// `/etc/hosts` for Lacquer starts as `hosts`.
    fn new(hosts: &str) -> Names {
        let dir = TempDir::new("lacquer-names");
        dir.write("hosts", hosts);
        dir.write("nsswitch.conf", "hosts: files\n");
        Names { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Rewrites the hosts file in place (same inode, so the bind mount shows the new content).
    fn set(&self, hosts: &str) {
        std::fs::write(self.path("hosts"), hosts).expect("rewrite the hosts file");
    }

    /// Starts Lacquer with `config_for(port)` in a mount namespace where these files are the
    /// system's.
    fn start_lacquer(&self, config_for: impl Fn(u16) -> String) -> LacquerProcess {
        let script = format!(
            "mount --bind '{}' /etc/hosts && mount --bind '{}' /etc/nsswitch.conf && exec \"$@\"",
            self.path("hosts").display(),
            self.path("nsswitch.conf").display()
        );
        LacquerProcess::start_on_free_port_via(
            &["unshare", "-m", "sh", "-c", &script, "sh"],
            config_for,
        )
    }
}

/// Two replicas of one service: `a` on 127.0.0.2, `b` on 127.0.0.3, the same port.
fn two_replicas() -> (Replica, Replica, u16) {
    let a = Replica::start_on("a", SocketAddr::from(([127, 0, 0, 2], 0)));
    let port = a.addr().port();
    let b = Replica::start_on("b", SocketAddr::from(([127, 0, 0, 3], port)));
    (a, b, port)
}

fn config(port: u16, origin_port: u16, admin: u16, extra: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"origin.test:{origin_port}\"\nthreads = 2\n\
         [log]\naccess = \"off\"\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\
         [balancer]\nresolve_interval = \"200ms\"\n{extra}"
    )
}

/// Which replica answered one request (its `x-backend`).
async fn answered_by(lacquer: &LacquerProcess, path: &str) -> String {
    let resp = get(&lacquer.url(path), &[]).await;
    assert_eq!(resp.status, 200, "{path}: {}", resp.text());
    resp.header("x-backend").unwrap_or_default().to_string()
}

/// Sends requests until one is answered by `replica` (bounded: the resolver runs every 200ms;
/// the bound only stops a broken build from hanging the suite).
async fn until_answered_by(lacquer: &LacquerProcess, replica: &str) -> bool {
    for i in 0..200 {
        if answered_by(lacquer, &format!("/wait/{i}")).await == replica {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The addresses `/stats` lists for the backends.
async fn stats_addresses(admin: u16) -> Vec<String> {
    let stats = get(&format!("http://127.0.0.1:{admin}/stats"), &[]).await;
    let json: serde_json::Value = serde_json::from_str(&stats.text()).expect("stats JSON");
    let mut addresses: Vec<String> = json["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["address"].as_str().expect("address").to_string())
        .collect();
    addresses.sort();
    addresses
}

#[tokio::test]
async fn a_name_that_moves_takes_its_traffic_and_a_failed_lookup_keeps_the_old_address() {
    let (a, b, origin_port) = two_replicas();
    let names = Names::new("127.0.0.2 origin.test\n");
    let admin = free_port();
    let lacquer = names.start_lacquer(|port| config(port, origin_port, admin, ""));
    for i in 0..3 {
        assert_eq!(answered_by(&lacquer, &format!("/first/{i}")).await, "a");
    }

    // the name disappears: the look-up fails, the address it had keeps serving
    names.set("");
    let failures =
        format!("lacquer_backend_lookup_failures_total{{backend=\"origin.test:{origin_port}\"}}");
    let mut counted = false;
    for _ in 0..200 {
        if scrape(admin).await.get(&failures).unwrap_or(0.0) >= 2.0 {
            counted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        counted,
        "no failed look-up counted:\n{}",
        lacquer.stderr_log()
    );
    for i in 0..3 {
        assert_eq!(answered_by(&lacquer, &format!("/failed/{i}")).await, "a");
    }
    assert!(lacquer
        .stderr_log()
        .contains("looking up \"origin.test\" failed"));
    assert_eq!(
        stats_addresses(admin).await,
        [format!("127.0.0.2:{origin_port}")]
    );

    // the name moves to b: requests follow it without a restart, and none go to a any more
    names.set("127.0.0.3 origin.test\n");
    assert!(
        until_answered_by(&lacquer, "b").await,
        "requests never moved to 127.0.0.3:\n{}",
        lacquer.stderr_log()
    );
    let served_by_a = a.served();
    for i in 0..6 {
        assert_eq!(answered_by(&lacquer, &format!("/moved/{i}")).await, "b");
    }
    assert_eq!(
        a.served(),
        served_by_a,
        "a replica the name left got traffic"
    );
    assert!(b.served() >= 7);
    assert_eq!(
        stats_addresses(admin).await,
        [format!("127.0.0.3:{origin_port}")]
    );
}

#[tokio::test]
async fn every_address_of_a_name_is_a_replica_and_a_new_one_is_health_checked() {
    let (a, b, origin_port) = two_replicas();
    let names = Names::new("127.0.0.2 origin.test\n");
    let admin = free_port();
    let checks =
        "[balancer.health_check]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"200ms\"\n";
    let lacquer = names.start_lacquer(|port| config(port, origin_port, admin, checks));
    assert_eq!(answered_by(&lacquer, "/one").await, "a");
    assert_eq!(b.origin.hits(), 0, "b is no replica yet");

    names.set("127.0.0.2 origin.test\n127.0.0.3 origin.test\n");
    assert!(
        until_answered_by(&lacquer, "b").await,
        "the name's second address never got traffic:\n{}",
        lacquer.stderr_log()
    );
    // both addresses share the traffic (round robin), a keeping its replica
    let (before_a, before_b) = (a.served(), b.served());
    for i in 0..10 {
        answered_by(&lacquer, &format!("/both/{i}")).await;
    }
    assert!(a.served() > before_a && b.served() > before_b);
    assert_eq!(a.served() + b.served(), before_a + before_b + 10);
    assert!(
        b.origin
            .wait_for_hits_for_async("/health", 1, Duration::from_secs(10))
            .await,
        "the new replica is not health-checked"
    );
    assert_eq!(
        stats_addresses(admin).await,
        [
            format!("127.0.0.2:{origin_port}"),
            format!("127.0.0.3:{origin_port}")
        ]
    );
    let metrics = scrape(admin).await;
    for ip in ["127.0.0.2", "127.0.0.3"] {
        let series = format!(
            "lacquer_backend_up{{backend=\"origin.test:{origin_port}\",address=\"{ip}:{origin_port}\"}}"
        );
        assert_eq!(metrics.value(&series), 1.0);
    }
}
