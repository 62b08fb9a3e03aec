//! Attacks on the pool's per-runtime rule (a connection is used again only by tasks of the
//! runtime that opened it) over real sockets and real memcached processes: runtimes that die
//! with connections idle or in flight, many runtimes racing on a small pool, cancellation,
//! a frozen, restarted or refusing server. The bound is checked both as the client counts it
//! (`open_connections`) and as memcached sees it (`curr_connections`, once settled).

mod support;

use bytes::Bytes;
use lacquer_memcached::{McError, ServerClient, ServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio::runtime::Runtime;

fn cfg(addr: SocketAddr, pool_size: usize, op_timeout: Duration) -> ServerConfig {
    ServerConfig {
        addr,
        pool_size,
        connect_timeout: Duration::from_secs(2),
        op_timeout,
    }
}

/// Runs `fut` on `rt`, failing the test instead of hanging past 20 s.
fn on<T>(rt: &Runtime, fut: impl std::future::Future<Output = T>) -> T {
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), fut)
            .await
            .expect("operation hung")
    })
}

/// Waits for every task (they may belong to any runtime) from `rt`.
fn join_all<T>(rt: &Runtime, tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    tasks
        .into_iter()
        .map(|t| on(rt, t).expect("task panicked"))
        .collect()
}

/// memcached's `curr_connections`: what the server holds open right now (listener and this
/// question's own connection included).
fn curr_connections(addr: SocketAddr) -> u64 {
    server_stat(addr, "curr_connections")
}

/// memcached's `curr_connections` before the client opens any (the listener and the stats
/// connection): the least of a few readings, since the harness's own start-up probe may not be
/// closed yet on memcached's side at the first one.
fn baseline_connections(addr: SocketAddr) -> u64 {
    (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            curr_connections(addr)
        })
        .min()
        .unwrap()
}

/// The client's connections as memcached sees them, once memcached has processed the closes
/// (it notices a client's close asynchronously): polls until it equals `want`, or returns the
/// last value seen after 5 s.
fn server_side_connections(addr: SocketAddr, baseline: u64, want: usize) -> u64 {
    settles_at(want as u64, Duration::from_millis(20), || {
        curr_connections(addr).saturating_sub(baseline)
    })
}

/// Reads `read` every `every` until it gives `want`, for up to 5 s; returns the last reading.
fn settles_at<T: PartialEq>(want: T, every: Duration, read: impl Fn() -> T) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = read();
        if n == want || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(every);
    }
}

/// Samples `open_connections()` on a thread of its own until dropped; `max()` is the most seen.
struct OpenWatcher {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OpenWatcher {
    fn new(c: Arc<ServerClient>) -> OpenWatcher {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, max) = (stop.clone(), max.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    max.fetch_max(c.open_connections(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(50));
                }
            })
        };
        OpenWatcher {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn max(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.max.load(Ordering::Relaxed)
    }
}

fn value(s: &str) -> Bytes {
    Bytes::from(s.to_owned())
}

/// Waits (generously) until `open_connections()` is `want`; returns the last value seen.
fn open_becomes(c: &ServerClient, want: usize) -> usize {
    settles_at(want, Duration::from_millis(5), || c.open_connections())
}

#[test]
fn a_dead_runtimes_idle_connections_are_never_handed_out_and_are_reclaimed() {
    let mc = Memcached::start();
    let baseline = baseline_connections(mc.addr());
    let c = Arc::new(ServerClient::new(cfg(mc.addr(), 2, Duration::from_secs(1))));
    let (reloaded, survivor) = (runtime(), runtime());
    on(&reloaded, c.set(b"r", value("from-reloaded"), 60)).unwrap();
    on(&survivor, c.set(b"s", value("from-survivor"), 60)).unwrap();
    assert_eq!(c.open_connections(), 2);
    // the reload: the old runtime goes away with its connection idle in the pool
    drop(reloaded);
    // `add` is never retried: had the dead runtime's connection been handed out, it would fail
    for i in 0..5 {
        let key = format!("after-reload-{i}");
        assert!(on(&survivor, c.add(key.as_bytes(), value("a"), 60)).unwrap());
        assert_eq!(
            on(&survivor, c.get(b"r")).unwrap(),
            Some(value("from-reloaded"))
        );
    }
    assert_eq!(
        c.open_connections(),
        2,
        "the bound holds with a dead one idle"
    );
    // the new runtime finds the pool full: it must make room by closing the longest-idle
    // connection, which is the dead runtime's, and keep the survivor's
    let accepted = connections_accepted(mc.addr());
    let fresh = runtime();
    assert!(on(&fresh, c.add(b"fresh", value("f"), 60)).unwrap());
    for _ in 0..3 {
        assert_eq!(on(&survivor, c.get(b"fresh")).unwrap(), Some(value("f")));
        assert_eq!(
            on(&fresh, c.get(b"s")).unwrap(),
            Some(value("from-survivor"))
        );
    }
    assert_eq!(c.open_connections(), 2);
    assert_eq!(
        connections_accepted(mc.addr()),
        accepted + 2,
        "one new connection (the fresh runtime's) and the stats one: the survivor kept its own"
    );
    assert_eq!(server_side_connections(mc.addr(), baseline, 2), 2);
}

#[test]
fn places_held_by_dead_runtimes_are_taken_back_when_a_live_runtime_needs_them() {
    let mc = Memcached::start();
    let baseline = baseline_connections(mc.addr());
    let c = Arc::new(ServerClient::new(cfg(mc.addr(), 2, Duration::from_secs(1))));
    for key in ["a", "b"] {
        let rt = runtime();
        on(&rt, c.set(key.as_bytes(), value(key), 60)).unwrap();
        // each dies with its connection idle
    }
    assert_eq!(c.open_connections(), 2);
    let live = runtime();
    // freeze the server so that two calls of the live runtime are in flight at once: each
    // needs a place, and only closing both dead connections gives them
    mc.signal("-STOP");
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let c = c.clone();
            live.spawn(async move { c.get(b"a").await })
        })
        .collect();
    for r in join_all(&live, tasks) {
        assert!(matches!(r, Err(McError::Timeout)), "{r:?}");
    }
    assert_eq!(
        c.open_connections(),
        0,
        "the dead runtimes' connections were closed for the live one's calls, whose own \
         timed-out connections were discarded"
    );
    mc.signal("-CONT");
    assert_eq!(on(&live, c.get(b"b")).unwrap(), Some(value("b")));
    assert!(c.open_connections() <= 2);
    let open = c.open_connections();
    assert_eq!(
        server_side_connections(mc.addr(), baseline, open),
        open as u64
    );
}

#[test]
fn three_runtimes_hammering_pools_of_one_two_and_three() {
    let mc = Memcached::start();
    let baseline = baseline_connections(mc.addr());
    for pool_size in 1..=3 {
        let c = Arc::new(ServerClient::new(cfg(
            mc.addr(),
            pool_size,
            Duration::from_secs(5),
        )));
        let runtimes = [runtime(), runtime(), runtime()];
        let watcher = OpenWatcher::new(c.clone());
        let mut tasks = Vec::new();
        for (r, rt) in runtimes.iter().enumerate() {
            for t in 0..4 {
                let c = c.clone();
                tasks.push(rt.spawn(async move {
                    let mut worst = 0;
                    for i in 0..25 {
                        let key = format!("p{pool_size}:r{r}:t{t}:{i}");
                        let v = Bytes::from(key.repeat(i % 7 + 1));
                        c.set(key.as_bytes(), v.clone(), 60).await.unwrap();
                        worst = worst.max(c.open_connections());
                        assert_eq!(c.get(key.as_bytes()).await.unwrap(), Some(v));
                        worst = worst.max(c.open_connections());
                        if i % 5 == 4 {
                            let keys: Vec<String> = (i - 4..=i)
                                .map(|j| format!("p{pool_size}:r{r}:t{t}:{j}"))
                                .collect();
                            let all = c.get_multi(&keys).await.unwrap();
                            for (j, got) in (i - 4..=i).zip(all) {
                                let k = format!("p{pool_size}:r{r}:t{t}:{j}");
                                assert_eq!(got, Some(Bytes::from(k.repeat(j % 7 + 1))));
                            }
                        }
                    }
                    worst
                }));
            }
        }
        let worst_in_tasks = join_all(&runtimes[0], tasks).into_iter().max().unwrap();
        let worst = watcher.max().max(worst_in_tasks);
        assert!(
            worst <= pool_size,
            "pool_size {pool_size}: {worst} connections seen open"
        );
        let open = c.open_connections();
        assert!(
            (1..=pool_size).contains(&open),
            "pool_size {pool_size}: {open}"
        );
        assert_eq!(
            server_side_connections(mc.addr(), baseline, open),
            open as u64,
            "pool_size {pool_size}: memcached's count is the client's"
        );
        drop(runtimes);
        drop(c);
        assert_eq!(server_side_connections(mc.addr(), baseline, 0), 0);
    }
}

#[test]
fn calls_cancelled_at_any_point_on_three_runtimes_leak_no_places() {
    let mc = Memcached::start();
    let baseline = baseline_connections(mc.addr());
    let c = Arc::new(ServerClient::new(cfg(mc.addr(), 2, Duration::from_secs(1))));
    let runtimes = [runtime(), runtime(), runtime()];
    on(&runtimes[0], c.set(b"k", value("v"), 600)).unwrap();
    let watcher = OpenWatcher::new(c.clone());
    let mut tasks = Vec::new();
    let mut aborted = Vec::new();
    for (r, rt) in runtimes.iter().enumerate() {
        for t in 0..8u64 {
            let cc = c.clone();
            tasks.push(rt.spawn(async move {
                let c = cc;
                let mut done = 0;
                for i in 0..40u64 {
                    // 0 to ~400 us: some dropped waiting for a permit, some mid-connect, some
                    // mid-exchange, some not at all
                    let budget = Duration::from_micros((r as u64 * 131 + t * 37 + i * 53) % 400);
                    if let Ok(got) = tokio::time::timeout(budget, c.get(b"k")).await {
                        assert_eq!(got.unwrap(), Some(value("v")));
                        done += 1;
                    }
                }
                done
            }));
            let c = c.clone();
            aborted.push(rt.spawn(async move {
                loop {
                    assert_eq!(c.get(b"k").await.unwrap(), Some(value("v")));
                }
            }));
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    for (i, task) in aborted.iter().enumerate() {
        task.abort();
        if i % 3 == 0 {
            std::thread::yield_now();
        }
    }
    join_all(&runtimes[0], tasks);
    for task in aborted {
        let r = on(&runtimes[1], task);
        assert!(r.unwrap_err().is_cancelled());
    }
    let worst = watcher.max();
    assert!(worst <= 2, "{worst} connections seen open");
    let open = c.open_connections();
    assert!(open <= 2, "{open}");
    assert_eq!(
        server_side_connections(mc.addr(), baseline, open),
        open as u64,
        "the client counts {open} open: memcached must see as many"
    );
    // a leaked place would stay counted after every real connection is gone: two calls in
    // flight on a frozen server take both places (closing whatever is idle) and then discard
    // their connections
    mc.signal("-STOP");
    let frozen: Vec<_> = (0..2)
        .map(|_| {
            let c = c.clone();
            runtimes[2].spawn(async move { c.get(b"k").await })
        })
        .collect();
    for r in join_all(&runtimes[2], frozen) {
        assert!(matches!(r, Err(McError::Timeout)), "{r:?}");
    }
    assert_eq!(c.open_connections(), 0, "a place was leaked");
    mc.signal("-CONT");
    for rt in &runtimes {
        assert_eq!(on(rt, c.get(b"k")).unwrap(), Some(value("v")));
        assert!(on(rt, c.add(b"k", value("x"), 60)).is_ok());
    }
    assert!(c.open_connections() <= 2);
}

#[test]
fn a_frozen_server_bounds_both_runtimes_calls_and_no_timed_out_connection_is_reused() {
    let mc = Memcached::start();
    let op_timeout = Duration::from_millis(1000);
    let c = Arc::new(ServerClient::new(cfg(mc.addr(), 2, op_timeout)));
    let runtimes = [runtime(), runtime()];
    for (r, rt) in runtimes.iter().enumerate() {
        for i in 0..10 {
            let key = format!("r{r}:{i}");
            on(rt, c.set(key.as_bytes(), Bytes::from(key.clone()), 600)).unwrap();
        }
        on(rt, c.set(b"frozen", value("frozen-value"), 600)).unwrap();
    }
    assert_eq!(c.open_connections(), 2);
    mc.signal("-STOP");
    let mut tasks = Vec::new();
    for rt in &runtimes {
        for _ in 0..3 {
            let c = c.clone();
            tasks.push(rt.spawn(async move {
                let started = Instant::now();
                let r = c.get(b"frozen").await;
                (r, started.elapsed())
            }));
        }
    }
    for (r, took) in join_all(&runtimes[0], tasks) {
        assert!(matches!(r, Err(McError::Timeout)), "{r:?}");
        // op_timeout plus a loaded machine's slack; a call waiting past its own bound for a
        // permit would take 2-3 op_timeouts here
        assert!(took < op_timeout * 2, "a call took {took:?}");
    }
    assert_eq!(
        c.open_connections(),
        0,
        "timed-out connections are discarded"
    );
    mc.signal("-CONT");
    // had a timed-out connection been reused, its late "frozen" reply would be read as the
    // answer to one of these
    for (r, rt) in runtimes.iter().enumerate().cycle().take(4) {
        for i in 0..10 {
            let key = format!("r{r}:{i}");
            assert_eq!(
                on(rt, c.get(key.as_bytes())).unwrap(),
                Some(Bytes::from(key.clone()))
            );
        }
    }
    assert!(c.open_connections() <= 2);
}

#[test]
fn a_restart_with_idle_connections_of_two_runtimes_is_absorbed_for_both() {
    let mut mc = Memcached::start();
    let port = mc.port;
    let c = Arc::new(ServerClient::new(cfg(mc.addr(), 2, Duration::from_secs(2))));
    let (a, b) = (runtime(), runtime());
    on(&a, c.set(b"k", value("v"), 60)).unwrap();
    on(&b, c.set(b"k", value("v"), 60)).unwrap();
    assert_eq!(c.open_connections(), 2);

    mc.kill();
    mc = Memcached::start_on(port);
    // each runtime's first call meets a stale connection (its own, or none since the other's
    // retry flushed the pool): both succeed
    assert_eq!(on(&a, c.get(b"k")).unwrap(), None);
    on(&b, c.set(b"k", value("v2"), 60)).unwrap();
    assert_eq!(on(&a, c.get(b"k")).unwrap(), Some(value("v2")));
    assert!(c.open_connections() <= 2);

    // again, the other runtime first: its retry must flush the first runtime's stale
    // connection too, or that runtime's `add` (never retried) would fail on it
    on(&a, c.get(b"k")).unwrap();
    on(&b, c.get(b"k")).unwrap();
    assert_eq!(c.open_connections(), 2);
    mc.kill();
    mc = Memcached::start_on(port);
    assert!(!on(&b, c.delete(b"k")).unwrap());
    let add = on(&a, c.add(b"k", value("v3"), 60));
    assert!(matches!(add, Ok(true)), "{add:?}");
    assert_eq!(on(&b, c.get(b"k")).unwrap(), Some(value("v3")));

    // and both runtimes at once, several tasks each
    on(&a, c.get(b"k")).unwrap();
    on(&b, c.get(b"k")).unwrap();
    mc.kill();
    let mc = Memcached::start_on(port);
    let mut tasks = Vec::new();
    for rt in [&a, &b] {
        for _ in 0..4 {
            let c = c.clone();
            tasks.push(rt.spawn(async move { c.get(b"k").await }));
        }
    }
    for r in join_all(&a, tasks) {
        assert!(matches!(r, Ok(None)), "{r:?}");
    }
    assert!(c.open_connections() <= 2);
    drop(mc);
}

#[test]
fn refused_connects_from_two_runtimes_give_back_their_places() {
    let (_socket, addr) = refusing_addr();
    let c = Arc::new(ServerClient::new(cfg(addr, 2, Duration::from_secs(2))));
    let runtimes = [runtime(), runtime()];
    let watcher = OpenWatcher::new(c.clone());
    let mut tasks = Vec::new();
    for rt in &runtimes {
        for _ in 0..8 {
            let c = c.clone();
            tasks.push(rt.spawn(async move {
                for _ in 0..10 {
                    assert!(matches!(c.get(b"k").await, Err(McError::Connect)));
                    let set = c.set(b"k", value("v"), 1).await;
                    assert!(matches!(set, Err(McError::Connect)), "{set:?}");
                }
            }));
        }
    }
    join_all(&runtimes[0], tasks);
    let worst = watcher.max();
    assert!(worst <= 2, "{worst} places seen taken");
    assert_eq!(c.open_connections(), 0);
}

/// A listener whose accept queue is full and which never accepts: a connect to it hangs (the
/// kernel drops the SYN). Returns the address and what must be kept alive.
#[allow(clippy::type_complexity)]
fn hanging_addr(
    rt: &Runtime,
) -> (
    SocketAddr,
    (tokio::net::TcpListener, Vec<std::net::TcpStream>),
) {
    let (listener, addr) = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = socket.local_addr().unwrap();
        (socket.listen(1).unwrap(), addr)
    });
    let mut fillers = Vec::new();
    for _ in 0..64 {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(s) => fillers.push(s),
            Err(_) => return (addr, (listener, fillers)),
        }
    }
    panic!("the accept queue never filled");
}

#[test]
fn calls_cancelled_mid_connect_on_two_runtimes_give_back_their_places() {
    let runtimes = [runtime(), runtime()];
    let (addr, _keep) = hanging_addr(&runtimes[0]);
    let c = Arc::new(ServerClient::new(ServerConfig {
        addr,
        pool_size: 2,
        connect_timeout: Duration::from_secs(3),
        op_timeout: Duration::from_secs(5),
    }));
    let watcher = OpenWatcher::new(c.clone());
    let mut tasks = Vec::new();
    for rt in &runtimes {
        for _ in 0..4 {
            let c = c.clone();
            tasks.push(rt.spawn(async move {
                for _ in 0..3 {
                    let r = tokio::time::timeout(Duration::from_millis(100), c.get(b"k")).await;
                    assert!(r.is_err(), "{r:?}");
                }
            }));
        }
    }
    // and some aborted while connecting
    let mut aborted = Vec::new();
    for rt in &runtimes {
        let c = c.clone();
        aborted.push(rt.spawn(async move { c.get(b"k").await }));
    }
    std::thread::sleep(Duration::from_millis(100));
    for t in &aborted {
        t.abort();
    }
    join_all(&runtimes[0], tasks);
    for t in aborted {
        assert!(on(&runtimes[1], t).unwrap_err().is_cancelled());
    }
    assert!(watcher.max() <= 2);
    assert_eq!(
        c.open_connections(),
        0,
        "a cancelled connect kept its place"
    );
}

#[test]
fn a_runtime_shut_down_mid_exchange_gives_back_its_places() {
    let mc = Memcached::start();
    let c = Arc::new(ServerClient::new(cfg(
        mc.addr(),
        2,
        Duration::from_secs(10),
    )));
    let (doomed, survivor) = (runtime(), runtime());
    // stored through another client, so that no connection of `c` sits idle: once two are
    // counted, both places are the doomed runtime's calls (with one idle, the count could reach
    // two while the second call had not yet taken its place)
    let setup = ServerClient::new(cfg(mc.addr(), 1, Duration::from_secs(10)));
    on(&survivor, setup.set(b"k", value("v"), 600)).unwrap();
    drop(setup);
    mc.signal("-STOP");
    for _ in 0..3 {
        let c = c.clone();
        doomed.spawn(async move { c.get(b"k").await });
    }
    assert_eq!(open_becomes(&c, 2), 2);
    drop(doomed);
    assert_eq!(
        open_becomes(&c, 0),
        0,
        "the dropped runtime's calls kept places"
    );
    mc.signal("-CONT");
    for _ in 0..3 {
        assert_eq!(on(&survivor, c.get(b"k")).unwrap(), Some(value("v")));
        assert!(on(&survivor, c.add(b"k", value("x"), 60)).is_ok());
    }
    assert_eq!(c.open_connections(), 1);

    // the same with shutdown_background, which does not wait for the worker (a client of its
    // own, with no connection idle, for the reason above)
    let c = Arc::new(ServerClient::new(cfg(
        mc.addr(),
        2,
        Duration::from_secs(10),
    )));
    mc.signal("-STOP");
    let doomed = runtime();
    for _ in 0..3 {
        let c = c.clone();
        doomed.spawn(async move { c.get(b"k").await });
    }
    assert_eq!(open_becomes(&c, 2), 2);
    doomed.shutdown_background();
    assert_eq!(
        open_becomes(&c, 0),
        0,
        "the shut-down runtime's calls kept places"
    );
    mc.signal("-CONT");
    assert_eq!(on(&survivor, c.get(b"k")).unwrap(), Some(value("v")));
}

#[test]
fn each_of_three_runtimes_keeps_its_own_connection_and_a_newcomer_replaces_the_dead_one() {
    let mc = Memcached::start();
    let c = Arc::new(ServerClient::new(cfg(mc.addr(), 3, Duration::from_secs(2))));
    let mut runtimes = vec![runtime(), runtime(), runtime()];
    on(&runtimes[0], c.set(b"k", value("v"), 600)).unwrap();
    // five rounds of a get on each runtime; then what memcached accepted meanwhile
    let rounds_accepted = |runtimes: &[Runtime]| {
        let accepted = connections_accepted(mc.addr());
        for _ in 0..5 {
            for rt in runtimes {
                assert_eq!(on(rt, c.get(b"k")).unwrap(), Some(value("v")));
            }
        }
        assert_eq!(c.open_connections(), 3);
        connections_accepted(mc.addr()) - accepted
    };
    assert_eq!(
        rounds_accepted(&runtimes),
        3,
        "two new connections (runtimes 1 and 2) and the stats one"
    );
    // the first runtime dies; a newcomer finds the pool full and closes the longest idle
    // connection, the dead runtime's, not a live one
    drop(runtimes.remove(0));
    runtimes.push(runtime());
    assert_eq!(
        rounds_accepted(&runtimes),
        2,
        "the newcomer's connection and the stats one"
    );
}
