//! PURGE from a client that `cache.purge_from` lists and that is not on loopback.
//!
//! Every address of 127.0.0.0/8 is loopback, so this needs an address that is not: the test
//! creates a network namespace of its own, gives that namespace's `lo` the documentation address
//! 192.0.2.1/32 (TEST-NET-1), and runs the origin, the proxy and the client inside it. One thread
//! enters the namespace (`setns`) before it creates any socket or process; the origin's thread and
//! the `lacquer` child it starts inherit the namespace. The namespace is removed when the test
//! ends, whether it passes or fails. Creating one needs root (CAP_SYS_ADMIN), which the test
//! machines and CI have; without it the test fails and says why.

use lacquer_test_support as support;

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use support::*;

/// The non-loopback address the client sends from and the proxy listens on.
const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// A network namespace made for this test, deleted on drop (also when the test panics).
struct Namespace {
    name: String,
}

impl Namespace {
    /// `ip netns add`, then 192.0.2.1/32 on its `lo` and `lo` up.
    fn create() -> Namespace {
        let name = format!("lacquer-purge-{}", std::process::id());
        ip(&["netns", "add", &name]);
        let namespace = Namespace { name };
        let host = format!("{CLIENT}/32");
        ip(&["-n", &namespace.name, "addr", "add", &host, "dev", "lo"]);
        ip(&["-n", &namespace.name, "link", "set", "lo", "up"]);
        namespace
    }

    /// Moves the calling thread into the namespace; sockets it creates afterwards, threads it
    /// spawns and processes it starts live there.
    fn enter(name: &str) {
        use std::os::fd::AsRawFd;
        let path = format!("/var/run/netns/{name}");
        let handle = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns on a valid namespace descriptor changes only this thread's namespace
        let rc = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "setns into {path}: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let deleted = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        if !deleted.is_ok_and(|s| s.success()) {
            eprintln!("could not delete network namespace {}", self.name);
        }
    }
}

/// Runs `ip ARGS`; panics with its error output when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip`: {e}"));
    assert!(
        out.status.success(),
        "`ip {}` failed (this test needs root to create a network namespace): {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `lacquer` run with `ip netns exec` in the namespace; killed on drop. (Not the harness's
/// `LacquerProcess`: its check that the port is lacquer's own reads `/proc/net`, which shows the
/// test process's namespace, not this thread's. In a namespace of its own nothing else can hold
/// the port.)
struct ProxyInNamespace {
    child: std::process::Child,
    dir: TempDir,
}

impl ProxyInNamespace {
    /// Starts lacquer with `config` and waits until it accepts on `CLIENT:port`.
    fn start(namespace: &str, port: u16, config: &str) -> ProxyInNamespace {
        let dir = TempDir::new("lacquer-netns");
        let config_path = dir.write("lacquer.toml", config);
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr log");
        let child = Command::new("ip")
            .args(["netns", "exec", namespace])
            .arg(lacquer_bin())
            .arg("--config")
            .arg(&config_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn ip netns exec lacquer");
        let mut proxy = ProxyInNamespace { child, dir };
        let deadline = std::time::Instant::now() + LACQUER_START_TIMEOUT;
        let addr = std::net::SocketAddr::from((CLIENT, port));
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Ok(Some(status)) = proxy.child.try_wait() {
                panic!("lacquer exited with {status}: {}", proxy.stderr());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "lacquer did not accept on {addr}: {}",
                proxy.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for ProxyInNamespace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("lacquer stderr:\n{}", self.stderr());
        }
    }
}

/// A client whose connections leave from `source`.
fn client_from(source: IpAddr) -> reqwest::Client {
    client_builder()
        .local_address(source)
        .build()
        .expect("build client")
}

async fn send_from(client: &reqwest::Client, method: &str, url: &str) -> Resp {
    send(client, method, url, &[], None)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e:?}"))
}

/// Inside the namespace: a listed client at 192.0.2.1 purges; an unlisted one is refused.
async fn purge_scenario(namespace: &str) {
    let origin = TestOrigin::start(|req: &RecordedRequest| {
        OriginResponse::ok(format!("body of {}", req.path)).header("Cache-Control", "max-age=600")
    });
    let port = free_port();
    let config = format!(
        "listen = [\"127.0.0.1:{port}\", \"{CLIENT}:{port}\"]\nupstream = \"{}\"\nthreads = 2\n\
         [log]\naccess = \"off\"\n[cache]\npurge_from = [\"{CLIENT}\"]\n",
        origin.addr()
    );
    let _lacquer = ProxyInNamespace::start(namespace, port, &config);
    let listed = client_from(IpAddr::V4(CLIENT));
    let url = |path: &str| format!("http://{CLIENT}:{port}{path}");

    let path = "/stored";
    let first = send_from(&listed, "GET", &url(path)).await;
    assert_eq!(first.status, 200);
    let forwarded_for = origin
        .last_request()
        .and_then(|r| r.header("x-forwarded-for").map(|v| v.to_string()));
    assert_eq!(
        forwarded_for.as_deref(),
        Some("192.0.2.1"),
        "the client must reach the proxy from the non-loopback address"
    );
    assert!(send_from(&listed, "GET", &url(path)).await.is_hit());

    let purged = send_from(&listed, "PURGE", &url(path)).await;
    assert_eq!(
        purged.status, 200,
        "a listed client's PURGE of a stored URL"
    );
    assert!(
        purged.body.is_empty() && !purged.has_header("cache-status"),
        "a PURGE must be answered as a purge, not with the stored object: {:?} {:?}",
        purged.cache_status(),
        purged.text()
    );
    // a purge is kept to the millisecond, rounded up, and covers a fill whose request came
    // within it (a fill is dated by its request: `policy::RequestSent`), which is then not
    // stored; the refetch below must be stored, so it is made in a later millisecond
    tokio::time::sleep(Duration::from_millis(2)).await;
    let after = send_from(&listed, "GET", &url(path)).await;
    assert!(!after.is_hit(), "the purged object was served");
    assert_eq!(
        origin.hits_for(path),
        2,
        "the purged object must be fetched again"
    );

    let never_stored = send_from(&listed, "PURGE", &url("/never-stored")).await;
    assert_eq!(
        never_stored.status, 404,
        "PURGE of a URL nothing is stored under"
    );
    assert_eq!(
        origin.hits_for("/never-stored"),
        0,
        "a PURGE never goes to the origin"
    );

    // 127.0.0.1 is not in this purge_from: the decision is the list's, not loopback's (same
    // `Host`, so the same cache key)
    let unlisted = client_from(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let unlisted_url = format!("http://127.0.0.1:{port}{path}");
    let host = format!("{CLIENT}:{port}");
    let same_host = [("host", host.as_str())];
    let stored = send(&unlisted, "GET", &unlisted_url, &same_host, None).await;
    let stored = stored.expect("GET from 127.0.0.1");
    assert!(stored.is_hit(), "{:?}", stored.cache_status());
    let refused = send(&unlisted, "PURGE", &unlisted_url, &same_host, None).await;
    assert_eq!(
        refused.expect("PURGE from 127.0.0.1").status,
        405,
        "PURGE from a client not in purge_from"
    );
    let kept = send(&unlisted, "GET", &unlisted_url, &same_host, None).await;
    let kept = kept.expect("GET from 127.0.0.1");
    assert!(kept.is_hit(), "a refused PURGE removed the object");
    assert_eq!(origin.hits_for(path), 2);
}

#[test]
fn purge_from_a_listed_client_outside_loopback_purges() {
    let namespace = Namespace::create();
    let name = namespace.name.clone();
    let outcome = std::thread::spawn(move || {
        Namespace::enter(&name);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(purge_scenario(&name));
    })
    .join();
    drop(namespace);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
