//! Large hits sent from memory files across the process's life cycle. `file_body_hits.rs` attacks
//! a body sent with `sendfile(2)` from its memory file (`storage/memory/mapped.rs`, vendored
//! pingora-core 0033-0036) while the process itself stays as it is; this file exists for what
//! happens to such a send, which can last as long as its client reads slowly, when the process
//! changes under it: a reload (SIGHUP), a hand-over to a new process (`--upgrade`, SIGQUIT), a
//! drain (SIGTERM), and a frozen memcached under an object promoted from it.
//!
//! Every download here is of a body larger than the socket buffers between the proxy and a
//! client with a small receive buffer can hold ([`unbufferable_len`]), started and read in part
//! before the event: so the proxy is necessarily still sending it from its file when the event
//! happens, and the client then reads the rest and checks every byte against the origin's
//! generated body. The object must also come out of the event as it should: still a memory hit
//! from its file after a reload, served by the successor after a hand-over, the process gone
//! after a drain, no file or descriptor left behind by clients that reset meanwhile.
//!
//! Nothing asserts on a duration: waits are polls with generous bounds ([`BOUND`]) that only a
//! hang reaches.

use lacquer_test_support as support;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::mpsc;
use support::large_bodies::*;
// (named: `support::get`, reqwest's, is glob-imported too)
use support::large_bodies::get;
use support::*;

/// The receive buffer of a slow client (the kernel doubles it).
const SLOW_RCVBUF: u32 = 8 * 1024;
/// The most a slow client reads at once.
const SLOW_READ: usize = 16 * 1024;
/// How long a slow client waits before each read.
const SLOW_PAUSE: Duration = Duration::from_millis(1);
/// How much of the body a slow client reads before the event under test.
const READ_BEFORE: usize = 256 * 1024;

/// The config of a proxy on `port` in front of `upstream`, with `threads` workers, a 30 s
/// `shutdown_timeout` (far longer than any download here takes), `via_name` (which process, or
/// which reload, answered), objects up to 64 MiB; `extra` is appended inside `[cache]` (keys
/// first, then any sections of its own).
fn config(port: u16, upstream: SocketAddr, threads: usize, via_name: &str, extra: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{upstream}\"\nthreads = {threads}\n\
         shutdown_timeout = \"30s\"\n[log]\naccess = \"off\"\n[proxy]\nvia_name = \"{via_name}\"\n\
         [cache]\nmax_object_size = \"64MiB\"\n{extra}\n"
    )
}

/// The path of an object of [`unbufferable_len`] bytes; `tag` makes it an object of its own.
fn large_path(tag: &str) -> String {
    format!("/large/{}?{tag}", unbufferable_len())
}

/// The `Via` of `resp` (empty when there is none).
fn via(resp: &RawResponse) -> &str {
    resp.header("via").unwrap_or_default()
}

/// How many connections to the proxy on `port` the proxy still holds a socket of, as the kernel
/// lists them (`/proc/net/tcp`): established, or closed by the client and not yet by the proxy
/// (`CLOSE_WAIT`). (A connection a reset ended is no longer listed, whatever the proxy holds:
/// [`open_fds`] counts those.)
fn client_sockets(port: u16) -> usize {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 3 && cols[1] == local && (cols[3] == "01" || cols[3] == "08")
        })
        .count()
}

/// How many reload outcomes (applied or refused) `node` has logged.
fn reload_outcomes(node: &LacquerProcess) -> usize {
    let log = node.stderr_log();
    log.matches("configuration reloaded").count() + log.matches("reload refused").count()
}

/// Writes `config`, sends SIGHUP, runs `meanwhile` and waits until the node logged one more
/// reload outcome; returns whether that outcome was "applied".
fn sighup_with(node: &LacquerProcess, config: &str, meanwhile: impl FnOnce()) -> bool {
    node.write_config(config);
    let before_applied = node.stderr_log().matches("configuration reloaded").count();
    let before = reload_outcomes(node);
    assert!(node.signal("HUP"));
    meanwhile();
    assert!(
        poll_until(BOUND, || reload_outcomes(node) > before),
        "no reload outcome logged after SIGHUP; stderr:\n{}",
        node.stderr_log()
    );
    node.stderr_log().matches("configuration reloaded").count() > before_applied
}

/// How many requests `node` said were in flight when its drain began (its `draining: N requests
/// in flight` line), if it logged one.
fn drained_requests(node: &LacquerProcess) -> Option<usize> {
    let log = node.stderr_log();
    let (_, after) = log.split_once("draining: ")?;
    after.split_whitespace().next()?.parse().ok()
}

/// Waits until `node` has begun to drain; returns how many requests were in flight then.
fn wait_for_drain(node: &LacquerProcess) -> usize {
    assert!(
        wait_for_log(node, "draining: ", BOUND),
        "no drain began; stderr:\n{}",
        node.stderr_log()
    );
    drained_requests(node)
        .unwrap_or_else(|| panic!("an unreadable drain line; stderr:\n{}", node.stderr_log()))
}

/// Checks that `node` (process `pid`, listening on `port`) has begun to drain with `in_flight`
/// downloads, let go of its listener and kept running for them.
fn assert_draining(node: &mut LacquerProcess, pid: u32, port: u16, in_flight: usize) {
    assert_eq!(
        wait_for_drain(node),
        in_flight,
        "the drain did not count the downloads in flight"
    );
    assert!(
        poll_until(BOUND, || !process_listens_on(pid, port)),
        "the draining process still holds the listener"
    );
    assert!(
        node.is_running(),
        "the process exited with {in_flight} downloads in flight; stderr:\n{}",
        node.stderr_log()
    );
}

/// Checks that `node`, which exited with `status`, exited cleanly once drained (its `drained
/// after` line), not cut at `shutdown_timeout`; `who` names it in a failure.
fn assert_ended_drained(
    node: &LacquerProcess,
    status: Option<std::process::ExitStatus>,
    who: &str,
) {
    assert!(
        status.is_some_and(|s| s.success()),
        "{who}: {status:?}; stderr:\n{}",
        node.stderr_log()
    );
    let log = node.stderr_log();
    assert!(
        log.contains("drained after") && !log.contains("shutdown_timeout"),
        "{who} did not end drained; stderr:\n{log}"
    );
}

/// A slow client mid-body of a large hit: its request sent, the head and the first
/// [`READ_BEFORE`] bytes read; the rest of the body cannot all be in the socket buffers, so the
/// proxy is still sending it.
struct SlowDownload {
    reader: Reader,
    path: String,
    body: Vec<u8>,
}

impl SlowDownload {
    /// Asks `addr` for `path` with a small receive buffer (closed with a reset if `reset`) and
    /// reads the head (a `200` with the object's length) and [`READ_BEFORE`] body bytes.
    fn start(addr: SocketAddr, path: &str, reset: bool) -> SlowDownload {
        // what is left once the client stops must be more than the proxy's send buffer and the
        // client's receive buffer (doubled by the kernel) can hold together
        let unread = len_of(path) - READ_BEFORE;
        assert!(
            unread > wmem_max() + 2 * SLOW_RCVBUF as usize,
            "{path}: the {unread} bytes left could all be in the socket buffers"
        );
        let mut reader = Reader::new(connect_small(addr, SLOW_RCVBUF, reset));
        reader
            .stream
            .write_all(get(path, "").as_bytes())
            .expect("send");
        let (status, length) = reader.head();
        assert_eq!(
            (status, length),
            (200, len_of(path)),
            "{}",
            reader.last_head
        );
        let body = reader.body(READ_BEFORE, SLOW_READ, Duration::ZERO);
        assert_eq!(body.len(), READ_BEFORE, "cut before the event under test");
        SlowDownload {
            reader,
            path: path.to_string(),
            body,
        }
    }

    /// The head of the answer being read.
    fn head(&self) -> &str {
        &self.reader.last_head
    }

    /// Reads the rest of the body slowly, to its length or the end of the connection; returns
    /// the whole body read.
    fn finish(mut self) -> Vec<u8> {
        let len = len_of(&self.path);
        let rest = self
            .reader
            .body(len - self.body.len(), SLOW_READ, SLOW_PAUSE);
        self.body.extend(rest);
        self.body
    }
}

/// (1) A slow client mid-body of a large hit (sent from its memory file) while the proxy is
/// reloaded twice by SIGHUP: once with a valid file (a new `via_name`, and a restart-only key
/// changed, which is kept), once with an invalid one (refused). The client gets every byte; the
/// answers begun before the reload carry the old settings, those begun during the send the new
/// ones; the object stays a memory hit from its one file (no refetch, one memory file, and the
/// hits after it read their bodies from the file: `sendfile`'s bytes in `rchar`).
#[test]
fn a_slow_large_hit_across_reloads_is_sent_whole_and_stays_a_hit_from_its_file() {
    let origin = origin();
    let upstream = origin.addr();
    let lacquer =
        LacquerProcess::start_on_free_port(|port| config(port, upstream, 1, "before", ""));
    let (addr, pid, port) = (lacquer.addr(), lacquer.pid(), lacquer.port());
    let path = large_path("reload");
    let len = len_of(&path);
    warm(addr, &path);
    assert_eq!(memfds(pid), 1, "the stored body has no memory file");

    let slow = SlowDownload::start(addr, &path, false);
    assert!(head_is_hit(slow.head()), "{}", slow.head());
    assert!(
        head_field(slow.head(), "via").is_some_and(|v| v.contains("before")),
        "{}",
        slow.head()
    );

    let applied = config(port, upstream, 1, "after", "memory_size = \"1GiB\"\n");
    assert!(
        sighup_with(&lacquer, &applied, || {}),
        "a valid file was refused; stderr:\n{}",
        lacquer.stderr_log()
    );
    assert!(
        lacquer.stderr_log().contains("cache.memory_size"),
        "the restart-only key was not named; stderr:\n{}",
        lacquer.stderr_log()
    );
    let invalid = config(port, upstream, 1, "refused", "memory_size = \"12XB\"\n");
    assert!(
        !sighup_with(&lacquer, &invalid, || {}),
        "an invalid file was applied"
    );

    // the slow client has read nothing since: the send from the file is still going on
    for n in 0..3 {
        let resp = fetch(addr, &path);
        assert_body(&resp, &path, &format!("hit {n} during the send"));
        assert!(resp.is_hit(), "hit {n} during the send: {:?}", resp.headers);
        assert!(via(&resp).contains("after"), "hit {n}: {:?}", resp.headers);
    }
    assert_eq!(
        memfds(pid),
        1,
        "the object's file, held by the store and the send"
    );

    let body = slow.finish();
    assert_whole(&body, &path, "the download in flight across the reloads");

    // after the reloads: still the same object, a hit sent from its file
    let before = bytes_read(pid);
    let mut conn = RawConn::connect(addr);
    for n in 0..3 {
        conn.send(get(&path, "").as_bytes());
        let resp = conn.read_response(false);
        assert_body(&resp, &path, &format!("hit {n} after the reloads"));
        assert!(resp.is_hit(), "hit {n} after: {:?}", resp.headers);
        assert!(via(&resp).contains("after"), "hit {n}: {:?}", resp.headers);
    }
    let read = bytes_read(pid) - before;
    assert!(
        read >= 3 * len as u64,
        "3 hits of {len} bytes after the reloads read {read} bytes by read-like calls: not sent \
         from the file"
    );
    assert_eq!(memfds(pid), 1, "one memory file for the one object");
    assert_eq!(origin.hits_for(&path), 1, "the reloads emptied the cache");
    lacquer.assert_no_panic();
}

/// (2) A slow client mid-body of a large hit on a node that hands its listeners over to a new
/// process (`--upgrade`, SIGQUIT), with memcached behind both: the old process goes on sending
/// from its file while it drains (it stops listening, keeps running, its file open) and the
/// client gets every byte; the requests made once the old process has stopped accepting are
/// answered by the successor (its `via_name`) with the whole body, read from memcached and
/// kept in a memory file there, not refetched; the old process then exits cleanly, drained
/// rather than cut at `shutdown_timeout`.
#[test]
fn a_slow_large_hit_across_a_hand_over_is_drained_whole_by_the_old_process() {
    let origin = origin();
    let upstream = origin.addr();
    let memcached = MemcachedProcess::start();
    let dir = TempDir::new("file-body-hand-over");
    let upgrade_sock = dir.path().join("upgrade.sock");
    let shared = format!(
        "[server]\nupgrade_sock = \"{}\"\n[cache.memcached]\nservers = [\"{}\"]\n",
        upgrade_sock.display(),
        memcached.addr_string()
    );
    let mut old =
        LacquerProcess::start_on_free_port(|port| config(port, upstream, 2, "old", &shared));
    let (addr, old_pid, port) = (old.addr(), old.pid(), old.port());
    let path = large_path("hand-over");
    warm(addr, &path);
    assert_eq!(memfds(old_pid), 1, "the stored body has no memory file");
    // the manifest is written last: once it is there, the whole object is in memcached
    let key = MemcachedCluster::key_of(HOST, &path);
    assert!(
        poll_until(BOUND, || memcached.holds(&key)),
        "the fill never reached memcached; stderr:\n{}",
        old.stderr_log()
    );

    let slow = SlowDownload::start(addr, &path, false);
    assert!(head_is_hit(slow.head()), "{}", slow.head());
    assert!(
        head_field(slow.head(), "via").is_some_and(|v| v.contains("old")),
        "{}",
        slow.head()
    );

    // the successor reads the file as it is now
    old.write_config(&config(port, upstream, 2, "new", &shared));
    let successor = old.hand_over(&upgrade_sock);
    // the old process accepts beside the successor for a few seconds, then stops and drains
    assert_draining(&mut old, old_pid, port, 1);
    assert_eq!(memfds(old_pid), 1, "the file being sent was closed");

    for n in 0..3 {
        let resp = fetch(addr, &path);
        assert_body(&resp, &path, &format!("request {n} after the hand-over"));
        assert!(
            via(&resp).contains("new"),
            "request {n} after the old process stopped accepting was not the successor's: {:?}",
            resp.headers
        );
        assert!(resp.is_hit(), "request {n}: {:?}", resp.headers);
    }
    assert_eq!(
        origin.hits_for(&path),
        1,
        "the successor refetched instead of reading memcached"
    );
    assert_eq!(
        memfds(successor.pid()),
        1,
        "the successor's promoted copy is not in a memory file"
    );

    let body = slow.finish();
    assert_whole(&body, &path, "the download the old process drained");
    let status = old.wait_exit(BOUND);
    assert_ended_drained(&old, status, "the old process");
    old.assert_no_panic();
    successor.assert_no_panic();
}

/// (3) A slow client mid-body of a large hit when the proxy gets SIGTERM: the listener closes,
/// the process keeps running (its file open) while the client reads, the client gets every
/// byte, and the process then exits cleanly on its own, drained, not at `shutdown_timeout`.
#[test]
fn a_slow_large_hit_across_sigterm_is_sent_whole_before_the_process_exits() {
    let origin = origin();
    let upstream = origin.addr();
    let mut lacquer =
        LacquerProcess::start_on_free_port(|port| config(port, upstream, 2, "lacquer", ""));
    let (addr, pid, port) = (lacquer.addr(), lacquer.pid(), lacquer.port());
    let path = large_path("sigterm");
    warm(addr, &path);
    assert_eq!(memfds(pid), 1, "the stored body has no memory file");

    let slow = SlowDownload::start(addr, &path, false);
    assert!(head_is_hit(slow.head()), "{}", slow.head());
    assert!(lacquer.signal("TERM"));
    assert_draining(&mut lacquer, pid, port, 1);
    assert_eq!(memfds(pid), 1, "the file being sent was closed");

    let body = slow.finish();
    assert_whole(&body, &path, "the download in flight at SIGTERM");
    let status = lacquer.wait_exit(BOUND);
    assert_ended_drained(&lacquer, status, "the process");
    lacquer.assert_no_panic();
}

/// (4) A large object one node (A) wrote to memcached is read by a second node (B) for a slow
/// client, promoted into B's memory tier (a memory file) and sent; memcached is frozen
/// (SIGSTOP) while that client is mid-body. The client gets every byte; other clients' requests
/// for the object on B meanwhile are hits from B's memory, whole, with no read of memcached
/// (B's count of memcached hits and misses unchanged) and no refetch from the origin; after the
/// thaw the object is still a hit on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_hit_of_an_object_promoted_from_memcached_is_sent_whole_while_memcached_is_frozen() {
    slow_promoted_hit_with_memcached_frozen(false).await;
}

/// (4') As (4), and B gets SIGTERM while memcached is still frozen and the slow client mid-body:
/// B drains the download (counted in flight, the client gets every byte) and exits on its own,
/// drained: nothing in its drain (the shared tier's writes and lease deletes it waits for, the
/// invalidation log it keeps reading) waits on the frozen server until `shutdown_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_draining_with_memcached_frozen_sends_a_slow_promoted_hit_whole_and_exits() {
    slow_promoted_hit_with_memcached_frozen(true).await;
}

/// (4) and (4'): with `sigterm`, B is sent SIGTERM once memcached is frozen and must exit
/// drained after the slow download; memcached is thawed at the end either way.
async fn slow_promoted_hit_with_memcached_frozen(sigterm: bool) {
    let cluster = MemcachedCluster::start(1);
    let origin = origin();
    // the last section written is `[cache.memcached]`; `[cache]` may still follow it
    let extra = "local_ttl = \"1h\"\n[cache]\nmax_object_size = \"64MiB\"\n";
    let a = cluster.node(&origin, "A", extra);
    let mut b = cluster.node_with_top_level(&origin, "B", "shutdown_timeout = \"30s\"", "", extra);
    let (b_addr, b_pid) = (b.proxy.addr(), b.proxy.pid());
    let path = large_path(if sigterm { "frozen-drain" } else { "frozen" });

    let first = tokio::task::block_in_place(|| fetch(a.proxy.addr(), &path));
    assert_body(&first, &path, "A's fill");
    assert_eq!(
        wait_for_stat(a.admin, "writes", 1, BOUND).await,
        1,
        "A wrote the object to memcached"
    );

    // B reads it from memcached for a slow client, promotes it and sends it
    let slow = tokio::task::block_in_place(|| SlowDownload::start(b_addr, &path, false));
    assert!(head_is_hit(slow.head()), "{}", slow.head());
    assert_eq!(
        admin_stat(b.admin, "hits").await,
        1,
        "B read the object from memcached"
    );
    assert_eq!(
        memfds(b_pid),
        1,
        "B's promoted copy is not in a memory file"
    );
    let misses = admin_stat(b.admin, "misses").await;

    cluster.servers[0].freeze();
    tokio::task::block_in_place(|| {
        for n in 0..3 {
            let resp = fetch(b_addr, &path);
            assert_body(
                &resp,
                &path,
                &format!("B's hit {n} while memcached is frozen"),
            );
            assert!(resp.is_hit(), "B's hit {n}: {:?}", resp.headers);
        }
    });
    assert_eq!(
        admin_stat(b.admin, "hits").await,
        1,
        "B read memcached again"
    );
    assert_eq!(
        admin_stat(b.admin, "misses").await,
        misses,
        "B asked the frozen memcached"
    );
    assert_eq!(origin.hits_for(&path), 1, "the object was refetched");

    if sigterm {
        assert!(b.proxy.signal("TERM"));
        assert_eq!(
            tokio::task::block_in_place(|| wait_for_drain(&b.proxy)),
            1,
            "B's drain did not count the download in flight"
        );
        assert!(
            b.proxy.is_running(),
            "B exited with a download in flight; stderr:\n{}",
            b.proxy.stderr_log()
        );
    }
    let body = tokio::task::block_in_place(|| slow.finish());
    assert_whole(&body, &path, "the slow download while memcached was frozen");
    if sigterm {
        let status = tokio::task::block_in_place(|| b.proxy.wait_exit(BOUND));
        cluster.servers[0].thaw();
        assert_ended_drained(&b.proxy, status, "B");
    } else {
        cluster.servers[0].thaw();
        let after = tokio::task::block_in_place(|| fetch(b_addr, &path));
        assert_body(&after, &path, "B's hit after the thaw");
        assert!(after.is_hit(), "{:?}", after.headers);
        assert_eq!(memfds(b_pid), 1);
        assert_eq!(origin.hits_for(&path), 1);
    }
    b.proxy.assert_no_panic();
    a.proxy.assert_no_panic();
}

/// (5) Clients that leave with a reset (`SO_LINGER` 0) mid-body of a large hit while the proxy
/// (one worker) reloads: each reload is applied, the next client gets the object whole as a hit,
/// the process's descriptors come back to what they were (no connection or file kept by the cut
/// sends) with the object's one memory file, and a purge then closes that file: no cut send
/// kept a hold on it.
#[test]
fn clients_resetting_mid_body_during_reloads_leave_no_file_or_descriptor_behind() {
    let origin = origin();
    let upstream = origin.addr();
    // only the resets may end the sends: never the send timeout within the test
    let config = |port: u16, via_name: &str| {
        config(
            port,
            upstream,
            1,
            via_name,
            "[server]\nsend_timeout = \"10m\"\n",
        )
    };
    let lacquer = LacquerProcess::start_on_free_port(|port| config(port, "v0"));
    let (addr, pid, port) = (lacquer.addr(), lacquer.pid(), lacquer.port());
    let path = large_path("reset");
    warm(addr, &path);
    assert_eq!(memfds(pid), 1, "the stored body has no memory file");
    // counted once the proxy has closed its side of the connections used so far
    assert!(
        poll_until(BOUND, || client_sockets(port) == 0),
        "the proxy kept a finished client's connection open"
    );
    let fds = open_fds(pid);

    for round in 1..=4 {
        let leaving = SlowDownload::start(addr, &path, true);
        let name = format!("v{round}");
        let applied = sighup_with(&lacquer, &config(port, &name), || drop(leaving));
        assert!(applied, "reload {round} refused");
        let resp = fetch(addr, &path);
        assert_body(&resp, &path, &format!("the hit after reset {round}"));
        assert!(resp.is_hit(), "{:?}", resp.headers);
        assert!(via(&resp).contains(&name), "{:?}", resp.headers);
    }
    assert_eq!(memfds(pid), 1, "the object's one file");
    let left = settle(|| open_fds(pid), |n| n <= fds);
    assert!(
        left <= fds,
        "{left} descriptors open after the cut sends, {fds} before them"
    );

    purge(addr, &path);
    retire_removed(addr);
    assert_eq!(
        settle(|| memfds(pid), |n| n == 0),
        0,
        "a send cut by a reset during a reload kept the purged object's file open"
    );
    assert_eq!(origin.hits_for(&path), 1);
    lacquer.assert_no_panic();
}

/// How many slow downloads [`sigterm_during_many_slow_large_downloads_ends_with_every_one_whole`]
/// runs at once.
const DOWNLOADS: usize = 8;

/// (6) SIGTERM while [`DOWNLOADS`] slow clients are each mid-body of one of two large hits (on
/// two workers): the listener closes, the process keeps running while they read, every one of
/// them gets every byte of its object, and the process then exits cleanly, drained.
#[test]
fn sigterm_during_many_slow_large_downloads_ends_with_every_one_whole() {
    let origin = origin();
    let upstream = origin.addr();
    let mut lacquer =
        LacquerProcess::start_on_free_port(|port| config(port, upstream, 2, "lacquer", ""));
    let (addr, pid, port) = (lacquer.addr(), lacquer.pid(), lacquer.port());
    let paths = [large_path("many-a"), large_path("many-b")];
    for path in &paths {
        warm(addr, path);
    }
    assert_eq!(memfds(pid), 2, "the stored bodies have no memory files");

    let (mid_body, all_mid_body) = mpsc::channel::<usize>();
    let mut go = Vec::new();
    let clients: Vec<_> = (0..DOWNLOADS)
        .map(|n| {
            let path = paths[n % 2].clone();
            let mid_body = mid_body.clone();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            go.push(go_tx);
            std::thread::spawn(move || {
                let slow = SlowDownload::start(addr, &path, false);
                assert!(head_is_hit(slow.head()), "client {n}: {}", slow.head());
                mid_body.send(n).expect("the test is waiting");
                go_rx
                    .recv_timeout(BOUND)
                    .expect("the test never let the client read on");
                (path, slow.finish())
            })
        })
        .collect();
    drop(mid_body);
    for _ in 0..DOWNLOADS {
        all_mid_body
            .recv_timeout(BOUND)
            .expect("a client never got mid-body");
    }

    assert!(lacquer.signal("TERM"));
    assert_draining(&mut lacquer, pid, port, DOWNLOADS);
    for tx in go {
        tx.send(()).expect("a client is gone");
    }
    for (n, client) in clients.into_iter().enumerate() {
        let (path, body) = client.join().expect("a client failed");
        assert_whole(&body, &path, &format!("download {n} in flight at SIGTERM"));
    }

    let status = lacquer.wait_exit(BOUND);
    assert_ended_drained(&lacquer, status, "the process");
    lacquer.assert_no_panic();
}
