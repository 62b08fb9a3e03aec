//! CAS tokens across memcached restarts, as a flaky network and odd servers would test them:
//! a server restarted as pid 1 (a container) within the second its last run started, restarted
//! twice, frozen or hostile while a connection opens and reads its `stats`; and the cost of
//! that `stats` on a hit path (one per connection, not one per call).

mod support;

use bytes::Bytes;
use lacquer_memcached::{CasOutcome, Cluster, ClusterConfig, McError};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// memcached run as pid 1 of a pid namespace of its own, as in a container (`unshare`, which
/// an unprivileged user may run where user namespaces are allowed); killed on drop.
struct ContainedMemcached {
    child: Child,
    port: u16,
}

impl ContainedMemcached {
    /// Starts one on `port` and waits until it answers there; `None` where this machine cannot
    /// make pid namespaces (no `unshare`, or user namespaces not allowed).
    fn start_on(port: u16) -> Option<ContainedMemcached> {
        let child = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--kill-child",
            ])
            .args(["memcached", "-u", "root", "-l", "127.0.0.1", "-U", "0"])
            .args(["-m", "64", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut server = ContainedMemcached { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if server.child.try_wait().unwrap().is_some() {
                return None;
            }
            if let Some(run) = run_at(server.addr()) {
                assert_eq!(run.0, 1, "memcached in its own pid namespace is pid 1");
                return Some(server);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Kills it (SIGKILL to `unshare`, and by `--kill-child` to memcached) and waits until
    /// nothing answers on its port any more.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(self.addr()).is_ok() {
            assert!(Instant::now() < deadline, "memcached outlived its kill");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ContainedMemcached {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The run the memcached at `addr` reports: its pid and start time (`time - uptime`), or `None`
/// while nothing answers there.
fn run_at(addr: SocketAddr) -> Option<(u64, i64)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(b"stats\r\n").ok()?;
    let (mut pid, mut time, mut uptime) = (None, None, None);
    for line in BufReader::new(stream).lines() {
        let line = line.ok()?;
        if line == "END" {
            break;
        }
        let mut fields = line.split(' ').skip(1);
        let (name, value) = (fields.next()?, fields.next()?);
        match name {
            "pid" => pid = value.parse::<u64>().ok(),
            "time" => time = value.parse::<i64>().ok(),
            "uptime" => uptime = value.parse::<i64>().ok(),
            _ => {}
        }
    }
    Some((pid?, time? - uptime?))
}

/// A server restarted as pid 1 within the second its last run started (a container restarted
/// at once: Docker's restart policy waits 100 ms) reports the same pid and start time as the
/// last run, and counts its tokens from 1 again. A compare-and-delete by a token the last run
/// gave must still act on nothing: here it would delete the lease another client has since
/// been given the same number for.
#[tokio::test]
async fn a_token_of_a_container_restarted_within_the_same_second_acts_on_nothing_after_it() {
    let port = unassigned_port();
    for _attempt in 0..20 {
        let Some(mut first) = ContainedMemcached::start_on(port) else {
            eprintln!("skipped: this machine cannot run memcached in a pid namespace (unshare)");
            return;
        };
        let c = client(first.addr(), 2);
        let claimed = within(c.add_token(b"lease", Bytes::from_static(b"A"), 60))
            .await
            .unwrap()
            .expect("stored");
        let first_run = run_at(first.addr()).unwrap();
        first.kill();
        let Some(second) = ContainedMemcached::start_on(port) else {
            panic!("memcached in a pid namespace started once but not twice");
        };
        if run_at(second.addr()) != Some(first_run) {
            // the restart crossed a second: try again, to the same second
            continue;
        }
        let other = client(second.addr(), 1);
        let theirs = within(other.add_token(b"lease", Bytes::from_static(b"B"), 60))
            .await
            .unwrap()
            .expect("stored");
        assert_eq!(theirs.value(), claimed.value(), "numbered from 1 again");
        let deleted = within(c.delete_cas(b"lease", claimed)).await.unwrap();
        assert_eq!(
            deleted,
            CasOutcome::Changed,
            "the last run's token was sent"
        );
        assert_eq!(
            within(other.get(b"lease")).await.unwrap(),
            Some(Bytes::from_static(b"B")),
            "another client's lease deleted by a token of the server's last run"
        );
        // the new run's tokens, read by the same client, work
        let (_, now) = within(c.gets(b"lease")).await.unwrap().unwrap();
        let deleted = within(c.delete_cas(b"lease", now)).await.unwrap();
        assert_eq!(deleted, CasOutcome::Stored);
        return;
    }
    panic!("no restart within the second its last run started, in 20 tries");
}

/// Two restarts in a row: a token of the first run, and one of the second, both act on nothing
/// on the third, though it numbers its values as both did; the third's own tokens work, when
/// read by the client that sends them.
#[tokio::test]
async fn a_token_of_either_earlier_run_acts_on_nothing_after_two_restarts() {
    let mut mc = Memcached::start();
    let c = client(mc.addr(), 2);
    let first = within(c.add_token(b"k", Bytes::from_static(b"1"), 60))
        .await
        .unwrap()
        .unwrap();
    mc.kill();
    let mut mc = Memcached::start_on(mc.port);
    // an add is never retried, and the pooled connection broke with the first run: a get
    // (retried on a fresh connection) finds that out
    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
    let second = within(c.add_token(b"k", Bytes::from_static(b"2"), 60))
        .await
        .unwrap()
        .unwrap();
    mc.kill();
    let mc = Memcached::start_on(mc.port);
    assert_eq!(within(c.get(b"k")).await.unwrap(), None);
    let other = client(mc.addr(), 1);
    let third = within(other.add_token(b"k", Bytes::from_static(b"3"), 60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (first.value(), second.value()),
        (third.value(), third.value())
    );
    for stale in [first, second] {
        let deleted = within(c.delete_cas(b"k", stale)).await.unwrap();
        assert_eq!(deleted, CasOutcome::Changed);
        let swapped = within(c.cas(b"k", Bytes::from_static(b"x"), 60, stale)).await;
        assert_eq!(swapped.unwrap(), CasOutcome::Changed);
    }
    assert_eq!(
        within(other.get(b"k")).await.unwrap(),
        Some(Bytes::from_static(b"3"))
    );
    // a token read by another client is not this one's to send, though it names the value
    let swapped = within(c.cas(b"k", Bytes::from_static(b"4"), 60, third)).await;
    assert_eq!(swapped.unwrap(), CasOutcome::Changed);
    let (_, mine) = within(c.gets(b"k")).await.unwrap().unwrap();
    assert_eq!(mine, third);
    let swapped = within(c.cas(b"k", Bytes::from_static(b"4"), 60, mine)).await;
    assert_eq!(swapped.unwrap(), CasOutcome::Stored);
}

/// A server frozen when a connection opens (the kernel completes the TCP handshake, but no
/// `stats` reply comes): the call fails by one `op_timeout` (not `connect_timeout`, 2 s, nor
/// forever), the half-open connection is not kept, and the thawed server is used again.
#[tokio::test]
async fn a_server_frozen_while_a_connection_reads_its_stats_costs_one_op_timeout() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    mc.signal("-STOP");
    let started = Instant::now();
    let got = within(c.get(b"k")).await;
    let took = started.elapsed();
    mc.signal("-CONT");
    assert!(matches!(got, Err(McError::Timeout)), "{got:?}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert_eq!(
        c.open_connections(),
        0,
        "the unanswered connection was kept"
    );
    within(c.set(b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    assert_eq!(
        within(c.get(b"k")).await.unwrap(),
        Some(Bytes::from_static(b"v"))
    );
    assert_eq!(c.open_connections(), 1);
}

/// Something answering `stats` like no memcached: each reply must end the call with an error
/// or a run (never a panic, a hang, or a read without bound), and no connection that read a
/// broken one is kept. Served by a plain socket that answers `stats` with `reply`, then every
/// later command with `EN` (a miss).
#[tokio::test]
async fn odd_stats_replies_neither_panic_nor_hang() {
    let endless_line = format!("STAT {} 1\r\nEND\r\n", "x".repeat(64 << 10));
    let many_lines = "STAT x 1\r\n".repeat(100_000) + "END\r\n";
    let replies: Vec<(&str, Vec<u8>)> = vec![
        (
            "a start time below i64::MIN",
            b"STAT pid 1\r\nSTAT time -9223372036854775808\r\nSTAT uptime 1\r\nEND\r\n".to_vec(),
        ),
        (
            "a start time above i64::MAX",
            b"STAT pid 1\r\nSTAT time 9223372036854775807\r\nSTAT uptime -1\r\nEND\r\n".to_vec(),
        ),
        (
            "numbers that are not",
            b"STAT pid -1\r\nSTAT time 1e9\r\nSTAT uptime \r\nSTAT pid\r\nEND\r\n".to_vec(),
        ),
        ("a line without end", endless_line.into_bytes()),
        ("too many lines", many_lines.into_bytes()),
        ("not text", b"STAT pid \xff\xfe\r\nEND\r\n".to_vec()),
        ("an error", b"ERROR\r\n".to_vec()),
        ("bare LF", b"STAT pid 1\nEND\n".to_vec()),
        ("cut mid-way", b"STAT pid 1\r\nSTAT ti".to_vec()),
    ];
    for (what, reply) in replies {
        let addr = odd_server(reply);
        let c = client(addr, 1);
        let got = tokio::time::timeout(Duration::from_secs(5), c.get(b"k")).await;
        let got = got.unwrap_or_else(|_| panic!("{what}: hung"));
        match got {
            Ok(None) => assert_eq!(c.open_connections(), 1, "{what}"),
            Ok(Some(v)) => panic!("{what}: a value from nowhere: {v:?}"),
            Err(_) => assert_eq!(c.open_connections(), 0, "{what}: kept"),
        }
    }
}

/// A loopback server that answers a connection's first command (`stats`) with `reply`, then
/// each further line with `EN`, and closes when `reply` was cut (no `END`).
fn odd_server(reply: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                // the client may close once it has read enough
                if stream.write_all(&reply).is_err() || !reply.ends_with(b"END\r\n") {
                    return;
                }
                let mut rest = Vec::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => rest.extend_from_slice(b"EN\r\n"),
                    }
                    if stream.write_all(&rest).is_err() {
                        return;
                    }
                    rest.clear();
                }
            });
        }
    });
    addr
}

/// The `stats` round trip is paid once per connection: a hit path of many calls opens one
/// connection (memcached's `total_connections`), and sends memcached one `get` per hit.
#[tokio::test]
async fn a_hit_path_reads_the_servers_run_once() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 4);
    within(c.set(b"hit", Bytes::from_static(b"v"), 60))
        .await
        .unwrap();
    let accepted = connections_accepted(mc.addr());
    let gets = server_stat(mc.addr(), "cmd_get");
    for _ in 0..200 {
        assert!(within(c.get(b"hit")).await.unwrap().is_some());
    }
    // two more for the questions themselves (cmd_get, and this one)
    assert_eq!(connections_accepted(mc.addr()), accepted + 2);
    assert_eq!(server_stat(mc.addr(), "cmd_get"), gets + 200);
    assert_eq!(c.open_connections(), 1);
}

/// Through the cluster, each call a server frozen while its connection reads `stats` leaves
/// unanswered (a get, a multi-get, a gets, a compare-and-delete) costs one `op_timeout` and
/// is counted once, as one error and one timeout, and keeps no connection.
#[tokio::test]
async fn each_call_a_frozen_servers_stats_leave_unanswered_counts_once() {
    let mc = Memcached::start();
    let op_timeout = Duration::from_millis(300);
    // one server, ejected never within the test (every call counted, none skipped)
    let cluster_of = || {
        Cluster::new(&ClusterConfig {
            servers: servers_at([mc.addr()]),
            pool_size: 4,
            connect_timeout: Duration::from_secs(2),
            op_timeout,
            failure_limit: 1000,
            retry_after: Duration::from_secs(60),
            rehash_on_eject: false,
        })
    };
    let cluster = cluster_of();
    let token = within(cluster.add_token_with(b"k", b"k", Bytes::from_static(b"v"), 60))
        .await
        .unwrap()
        .unwrap();
    // a cluster of its own, with no idle connection when the server freezes: each call opens one
    let quiet = cluster_of();
    mc.signal("-STOP");
    let started = Instant::now();
    assert_eq!(within(quiet.get(b"k")).await, None);
    assert_eq!(
        within(quiet.get_multi_with(b"k", &[b"k".to_vec()])).await,
        None
    );
    assert_eq!(within(quiet.gets_with(b"k", b"k")).await, None);
    assert_eq!(within(quiet.delete_cas_with(b"k", b"k", token)).await, None);
    let took = started.elapsed();
    mc.signal("-CONT");
    assert!(took < Duration::from_secs(8), "4 calls took {took:?}");
    let report = &quiet.server_reports()[0];
    assert_eq!(
        (report.stats.errors, report.stats.timeouts),
        (4, 4),
        "{report:?}"
    );
    assert_eq!(report.open_connections, 0);
    // the thawed server answers, and the token of its run, read by another pool, is not sent
    assert_eq!(
        within(quiet.get(b"k")).await,
        Some(Bytes::from_static(b"v"))
    );
    assert_eq!(
        within(quiet.delete_cas_with(b"k", b"k", token)).await,
        Some(CasOutcome::Changed)
    );
    assert_eq!(
        within(cluster.delete_cas_with(b"k", b"k", token)).await,
        Some(CasOutcome::Stored)
    );
}

/// A token read before the pool grew (two calls at once opened a second connection, which is
/// then the most recently used) is still sent, over the connection open before its read: the
/// pool does not answer "changed" for a value nobody changed because its newest connection
/// cannot vouch for the token's run.
#[tokio::test]
async fn a_token_read_before_the_pool_grew_is_sent_over_a_connection_open_before() {
    let mc = Memcached::start();
    let c = client(mc.addr(), 2);
    let token = within(c.add_token(b"lease", Bytes::from_static(b"A"), 60))
        .await
        .unwrap()
        .unwrap();
    within(c.set(b"other", Bytes::from_static(b"x"), 60))
        .await
        .unwrap();
    // the first takes the open connection, the second opens one (and reads stats first)
    let (first, second) = within(async { tokio::join!(c.get(b"other"), c.get(b"other")) }).await;
    assert!(first.unwrap().is_some() && second.unwrap().is_some());
    assert_eq!(c.open_connections(), 2);
    let deleted = within(c.delete_cas(b"lease", token)).await.unwrap();
    assert_eq!(deleted, CasOutcome::Stored);
}
