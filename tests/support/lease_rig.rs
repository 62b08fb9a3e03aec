//! Rigs for attacks on the cross-node fill leases (`storage::fill_lease`): a [`Relay`] between a
//! node and its memcached that delays or cuts chosen commands (a claim's `ms ... ME c` carried
//! out after its sender gave up, a reply lost after its command landed), an origin whose answers
//! wait behind gates the test opens ([`GatedOrigin`]), and nodes with one memcached server each
//! ([`node_via`], [`Nodes`]), and the waits and checks their tests repeat. Shared by
//! `tests/fill_lease_attacks.rs`, `tests/unanswered_claim_attacks.rs`,
//! `tests/fill_lease_renewal.rs`, `tests/purged_fill_attacks.rs`, and the attacks on fetches
//! under another claim's lease (`tests/kept_while_held_breaks.rs`, `takeover_breaks.rs`,
//! `guarded_elsewhere_attacks.rs`, `elsewhere_breaks.rs`).

use crate::{
    admin_stat, admin_toml, free_port, get, gets_at_once, poll_until_async, wait_for_stat_at_most,
    LacquerProcess, MemcachedCluster, MemcachedProcess, Node, OriginResponse, RecordedRequest,
    Resp, TempDir, TestOrigin, ADMIN_TOKEN,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The site every node of these tests serves.
pub const HOST: &str = "shop.example";
/// The `Host` field of a request for [`HOST`].
pub const SITE: [(&str, &str); 1] = [("host", HOST)];
/// The bound of every wait for something in the background (a write, a delete).
pub const SETTLE: Duration = Duration::from_secs(10);

/// The memcached key of `path`'s entry.
pub fn entry_key(path: &str) -> String {
    MemcachedCluster::key_of(HOST, path)
}

/// The memcached key of `path`'s lease.
pub fn lease_key(path: &str) -> String {
    entry_key(path).replacen("lq:", "lq:fill:", 1)
}

/// Whether `path`'s lease is in memcached (one server).
pub fn lease_present(server: &MemcachedProcess, path: &str) -> bool {
    server.holds(&lease_key(path))
}

/// Whether memcached (one server) holds `bytes` in `path`'s entry.
pub fn entry_holds(server: &MemcachedProcess, path: &str, bytes: &[u8]) -> bool {
    server
        .get_raw(&entry_key(path))
        .is_some_and(|raw| raw.windows(bytes.len()).any(|w| w == bytes))
}

/// A relay rule matching the claim (`ms <lease> ... ME c`) of `path`'s lease.
pub fn claim_of(path: &str) -> impl Fn(&str) -> bool + Send + Sync + 'static {
    let lease = lease_key(path);
    move |line: &str| line.starts_with(&format!("ms {lease} ")) && line.ends_with(" ME c")
}

/// A relay rule matching a renewal (`ms <lease> ... C<token>`, a compare-and-swap) of `path`'s
/// lease: the renewal tests' counterpart of [`claim_of`], which two of them wrote out alike.
pub fn renewal_of(path: &str) -> impl Fn(&str) -> bool + Send + Sync + 'static {
    let lease = lease_key(path);
    move |line: &str| line.starts_with(&format!("ms {lease} ")) && line.contains(" C")
}

/// The start of the line of a release of `path`'s lease by its token (`md <lease> C<token>`):
/// what a relay rule matches and [`Relay::lines_starting`] counts, in the release tests (each
/// built it alike).
pub fn release_prefix(path: &str) -> String {
    format!("md {} C", lease_key(path))
}

/// Whether `path`'s lease is on the server of `cluster` that holds `path`'s entry (for clusters
/// of more than one server, where [`lease_present`] would need that server named): the
/// renewal and purge tests each defined it alike.
pub fn lease_in(cluster: &MemcachedCluster, path: &str) -> bool {
    let entry = entry_key(path);
    cluster.servers[cluster.server_for(&entry)].holds(&lease_key(path))
}

/// Whether `path`'s entry is on the server of `cluster` that holds it: [`lease_in`]'s
/// counterpart for the entry.
pub fn entry_in(cluster: &MemcachedCluster, path: &str) -> bool {
    let entry = entry_key(path);
    cluster.servers[cluster.server_for(&entry)].holds(&entry)
}

// ---------------------------------------------------------------------------------------------
// The waits and checks these tests repeat
// ---------------------------------------------------------------------------------------------

/// `GET path` (with [`SITE`]) on `node`, sent now on a task of its own. It exists because the
/// tests start a node's request and go on while it is at the origin (a fill to race with, a
/// claim to watch) in a dozen places, each with the same three lines.
pub fn get_in_background(node: &Node, path: &str) -> tokio::task::JoinHandle<Resp> {
    let url = node.proxy.url(path);
    tokio::spawn(async move { get(&url, &SITE).await })
}

/// A lease value as a claim of another process makes it (`{ms} {holder:016x}`), claimed now:
/// planted straight into memcached by the attacks on the fill leases.
pub fn lease_naming(holder: u64) -> Vec<u8> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{now_ms} {holder:016x}").into_bytes()
}

/// A's request for `path` sent, held at the origin (the path's first arrival there: the caller
/// closed `origin`'s gate 1), then B's: B waits for A's fill as long as it may (two leases), and
/// fetches under A's lease (the origin's second arrival). Returns A's and B's requests. The
/// opening of the attacks on a fetch after two waits (`tests/kept_while_held_breaks.rs`,
/// `guarded_elsewhere_attacks`, `takeover_breaks`).
pub async fn b_fetching_after_two_waits(
    origin: &GatedOrigin,
    a: &Node,
    b: &Node,
    path: &str,
) -> (tokio::task::JoinHandle<Resp>, tokio::task::JoinHandle<Resp>) {
    let a_fill = get_in_background(a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    let b_fill = get_in_background(b, path);
    b_fetched_under_as_lease(origin, path).await;
    (a_fill, b_fill)
}

/// The page as a GET's `n`th arrival at the origin finds it (`body-{n}`, fresh for an hour): what
/// a [`GatedOrigin`] answers in the attacks on fetches under another claim's lease, where which
/// fetch's page a node serves is what they judge. Three test files wrote it alike.
pub fn nth_page(n: usize) -> OriginResponse {
    OriginResponse::ok(format!("body-{n}")).header("cache-control", "max-age=3600")
}

/// Waits (up to [`SETTLE`]) until `node`'s admin stat `stat` is at least `n`; returns it (the
/// caller asserts).
pub async fn stat_reaches(node: &Node, stat: &str, n: u64) -> u64 {
    let deadline = Instant::now() + SETTLE;
    loop {
        let now = admin_stat(node.admin, stat).await;
        if now >= n || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`b_fetching_after_two_waits`] with a crowd: A's request for `path` held at the origin (the
/// caller closed gate 1), then eight plain GETs of it at once on B. Each waits for A's fill two
/// leases; the first then fetches under A's lease (the origin's second arrival), and the other
/// seven end their waits too (B's `fill_waits` grown by 16) and queue behind it on B's cache
/// lock (300 ms more). Returns A's request and B's eight. The opening of the crowd attacks of
/// `tests/kept_while_held_breaks.rs`, which wrote it out three times.
pub async fn b_crowd_fetching_after_two_waits(
    origin: &GatedOrigin,
    a: &Node,
    b: &Node,
    path: &str,
) -> (
    tokio::task::JoinHandle<Resp>,
    tokio::task::JoinHandle<Vec<Resp>>,
) {
    let waits_before = admin_stat(b.admin, "fill_waits").await;
    let a_fill = get_in_background(a, path);
    assert!(origin.reached(path, 1).await, "A did not reach the origin");
    let url = b.proxy.url(path);
    let crowd = tokio::spawn(async move { gets_at_once((0..8).map(|_| url.clone()), &SITE).await });
    b_fetched_under_as_lease(origin, path).await;
    let waits = waits_before + 16;
    assert!(
        stat_reaches(b, "fill_waits", waits).await >= waits,
        "B's crowd did not end its waits"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    (a_fill, crowd)
}

/// Asserts that `path` reaches the origin a second time within 15 s: B's fetch under A's lease,
/// once B's two waits are over (a lease of 1 s each, and their polls).
pub async fn b_fetched_under_as_lease(origin: &GatedOrigin, path: &str) {
    assert!(
        origin
            .origin
            .wait_for_hits_for_async(path, 2, Duration::from_secs(15))
            .await,
        "B never fetched under A's lease"
    );
}

/// Waits (up to [`SETTLE`]) until `node` has no write to memcached left in the background,
/// asserting it has none then. It exists because every check of what memcached holds after a
/// fill (kept or not) must wait for this first, and the tests wrote the same assertion some
/// twenty times.
pub async fn writes_settled(node: &Node) {
    assert_eq!(
        wait_for_stat_at_most(node.admin, "background_writes", 0, SETTLE).await,
        0
    );
}

/// Asserts that the claim of `path`'s lease a [`Relay`] held (past `op_timeout`) reaches
/// memcached within 3 s. It exists because the tests of late claims each wait for it, alike,
/// before the lease it made can be watched.
pub async fn held_claim_landed(server: &MemcachedProcess, path: &str) {
    assert!(
        poll_until_async(Duration::from_secs(3), || lease_present(server, path)).await,
        "the claim held by the relay never reached memcached"
    );
}

/// Asserts that `path`'s lease is gone from memcached within [`SETTLE`] (`what`: the failure's
/// message). It exists because the tests check, after nearly every fill, that no lease was left
/// behind, each with the same wait.
pub async fn lease_released(server: &MemcachedProcess, path: &str, what: &str) {
    assert!(
        poll_until_async(SETTLE, || !lease_present(server, path)).await,
        "{what}"
    );
}

/// The holder `path`'s lease names now (the second word of its value: a renewal rewrites the
/// first, its time), if there is a lease.
pub fn lease_holder(server: &MemcachedProcess, path: &str) -> Option<Vec<u8>> {
    server
        .get_raw(&lease_key(path))
        .and_then(|lease| lease.split(|b| *b == b' ').nth(1).map(<[u8]>::to_vec))
}

/// Asserts that within [`SETTLE`] `path`'s lease no longer names `holder` (`what`: the failure's
/// message): released, or claimed since by another request. Not [`lease_released`] where other
/// requests wait for the URL: one of them may claim it the moment it is released, and a test
/// waiting for no lease at all then waits for that claim to end too.
pub async fn lease_left(server: &MemcachedProcess, path: &str, holder: &[u8], what: &str) {
    assert!(
        poll_until_async(SETTLE, || lease_holder(server, path).as_deref()
            != Some(holder))
        .await,
        "{what}"
    );
}

/// Where an answer (`bytes`, the page as it was before a POST) is still found once the fills are
/// over: whether memcached keeps it in `path`'s entry, and the names of the `nodes` (asked in
/// this order, after memcached was read) that serve it. It exists because the tests of a fill
/// from before a POST all end by this same look, then judge it with a message of their own.
pub async fn kept_and_served(
    server: &MemcachedProcess,
    nodes: &[&Node],
    path: &str,
    bytes: &[u8],
) -> (bool, Vec<String>) {
    let kept = entry_holds(server, path, bytes);
    let mut served = Vec::new();
    for node in nodes {
        if get(&node.proxy.url(path), &SITE).await.body[..] == bytes[..] {
            served.push(node.name.clone());
        }
    }
    (kept, served)
}

/// Asserts that `bytes`, a page from before a POST (`what`: how the failure names it), is
/// neither kept in `path`'s entry in memcached nor served by any of `nodes` ([`kept_and_served`]).
/// The ending of a dozen tests of a fill from before a POST, each of which wrote the look and the
/// same assertion out.
pub async fn assert_neither_kept_nor_served(
    server: &MemcachedProcess,
    nodes: &[&Node],
    path: &str,
    bytes: &[u8],
    what: &str,
) {
    let (kept, served) = kept_and_served(server, nodes, path, bytes).await;
    assert!(
        !kept && served.is_empty(),
        "{what} is served by {served:?}, kept in memcached: {kept}"
    );
}

/// After `server` restarted empty: gets pages `/other-0`, `/other-1`, ... through `node` until
/// one is found written to `server` (as `body`), asserting one is within 20. A node's pooled
/// connections to a restarted server fail once, so a test whose fill must then be written (or
/// released) first has the node reconnect this way; two tests did it alike.
pub async fn write_until_reconnected(node: &Node, server: &MemcachedProcess, body: &[u8]) {
    let mut reconnected = false;
    for i in 0..20 {
        let other = format!("/other-{i}");
        assert_eq!(get(&node.proxy.url(&other), &SITE).await.status, 200);
        if poll_until_async(Duration::from_secs(1), || entry_holds(server, &other, body)).await {
            reconnected = true;
            break;
        }
    }
    assert!(
        reconnected,
        "{} never wrote to the restarted server",
        node.name
    );
}

// ---------------------------------------------------------------------------------------------
// A relay between a node and memcached that holds or cuts chosen commands
// ---------------------------------------------------------------------------------------------

/// What a [`Relay`] does to a command a rule matches.
#[derive(Debug, Clone, Copy)]
pub enum Tamper {
    /// Sends it on this much later, after its sender gave up on it (`op_timeout`): memcached
    /// carries it out late.
    Delay(Duration),
    /// Sends it on, and when memcached's reply comes, closes the sender's connection instead of
    /// passing the reply on: the command was carried out, and its sender read nothing of the
    /// reply (so the client may retry it on a fresh connection).
    Cut,
}

type Matcher = Box<dyn Fn(&str) -> bool + Send + Sync>;

#[derive(Default)]
struct RelayState {
    /// Rules, each applied to the first command line it matches, once.
    rules: Mutex<Vec<(Matcher, Tamper, bool)>>,
    /// Every command line seen, in order (but the invalidation log's).
    lines: Mutex<Vec<String>>,
}

impl RelayState {
    fn tamper_for(&self, line: &str) -> Option<Tamper> {
        if !line.contains(":inval:") && line != "mn" {
            self.lines.lock().unwrap().push(line.to_string());
        }
        let mut rules = self.rules.lock().unwrap();
        let (_, tamper, used) = rules
            .iter_mut()
            .find(|(matches, _, used)| !*used && matches(line))?;
        *used = true;
        Some(*tamper)
    }
}

/// A TCP relay on a loopback port in front of one memcached server, for a node configured with
/// its address: passes every command and reply on, but the ones its rules name.
pub struct Relay {
    /// Where the node is to find "memcached".
    pub addr: SocketAddr,
    state: Arc<RelayState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// Starts a relay to the memcached server at `upstream`.
    pub async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(RelayState::default());
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay_connection(client, upstream, shared.clone()));
            }
        });
        Relay { addr, state, task }
    }

    /// [`Self::start`] then [`Self::on`]: a relay to `upstream` whose first command matching
    /// `matches` gets `tamper`. It exists because nearly every test sets one rule, on a fresh
    /// relay, before any node starts; the rule is in place before the relay takes a connection.
    pub async fn with(
        upstream: SocketAddr,
        matches: impl Fn(&str) -> bool + Send + Sync + 'static,
        tamper: Tamper,
    ) -> Relay {
        let relay = Relay::start(upstream).await;
        relay.on(matches, tamper);
        relay
    }

    /// [`Self::with`] the rule most tests set: the claim of `path`'s lease ([`claim_of`]) sent
    /// on `delay` late, past its sender's `op_timeout`, so that memcached carries it out after
    /// the node gave up on it.
    pub async fn holding_claim(upstream: SocketAddr, path: &str, delay: Duration) -> Relay {
        Relay::with(upstream, claim_of(path), Tamper::Delay(delay)).await
    }

    /// The first command whose line `matches` gets `tamper`.
    pub fn on(&self, matches: impl Fn(&str) -> bool + Send + Sync + 'static, tamper: Tamper) {
        self.state
            .rules
            .lock()
            .unwrap()
            .push((Box::new(matches), tamper, false));
    }

    /// The command lines seen so far that start with `prefix`.
    pub fn lines_starting(&self, prefix: &str) -> Vec<String> {
        self.state
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Whether every rule has been applied.
    pub fn rules_used(&self) -> bool {
        self.state.rules.lock().unwrap().iter().all(|r| r.2)
    }
}

/// The length of the first whole command in `bytes` (a meta command line, and for `ms` its data
/// block), and its line.
fn next_command(bytes: &[u8]) -> Option<(usize, String)> {
    let end = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let mut len = end + 2;
    if line.starts_with("ms ") || line.starts_with("set ") {
        let tokens: Vec<&str> = line.split(' ').collect();
        let data = if line.starts_with("ms ") {
            tokens.get(2)
        } else {
            tokens.get(4)
        };
        len += data.and_then(|d| d.parse::<usize>().ok()).unwrap_or(0) + 2;
    }
    (bytes.len() >= len).then_some((len, line))
}

async fn relay_connection(client: TcpStream, upstream: SocketAddr, state: Arc<RelayState>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let cut = Arc::new(AtomicBool::new(false));
    let cutting = cut.clone();
    let back = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_server.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // a cut command's reply: the client's connection closes before any byte of it
            if cutting.load(Ordering::SeqCst) {
                break;
            }
            if to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        // (dropping `to_client` closes the client's connection)
    });
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    'relay: loop {
        // the commands read so far go on in one write, but a tampered one, which goes alone
        let mut out = Vec::new();
        while let Some((len, line)) = next_command(&pending) {
            let command: Vec<u8> = pending.drain(..len).collect();
            let Some(tamper) = state.tamper_for(&line) else {
                out.extend_from_slice(&command);
                continue;
            };
            if to_server.write_all(&out).await.is_err() {
                break 'relay;
            }
            out.clear();
            match tamper {
                Tamper::Delay(d) => tokio::time::sleep(d).await,
                Tamper::Cut => cut.store(true, Ordering::SeqCst),
            }
            if to_server.write_all(&command).await.is_err() || matches!(tamper, Tamper::Cut) {
                break 'relay;
            }
        }
        if to_server.write_all(&out).await.is_err() {
            break;
        }
        match from_client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
    // a command sent on late is carried out and answered before memcached sees the end
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(to_server);
    let _ = back.await;
}

/// The admin token file of the nodes started by [`node_via`].
pub struct Tokens(TempDir);

impl Tokens {
    /// A fresh token file holding [`ADMIN_TOKEN`].
    #[allow(clippy::new_without_default)]
    pub fn new() -> Tokens {
        let dir = TempDir::new("lease-attacks");
        dir.write("admin.token", format!("{ADMIN_TOKEN}\n"));
        Tokens(dir)
    }
}

/// A node named `name` in front of `origin` whose one memcached server is `server` (a
/// [`Relay`]'s address, or memcached's own), configured as `MemcachedCluster::node`'s are
/// (`op_timeout` 200 ms), with `extra` appended to its `[cache.memcached]` section.
pub fn node_via(
    tokens: &Tokens,
    server: SocketAddr,
    origin: &TestOrigin,
    name: &str,
    extra: &str,
) -> Node {
    node_with(tokens, server, origin, name, "", extra)
}

/// [`node_via`] with `sections` (whole sections, e.g. `[server]`) written before the others.
pub fn node_with(
    tokens: &Tokens,
    server: SocketAddr,
    origin: &TestOrigin,
    name: &str,
    sections: &str,
    extra: &str,
) -> Node {
    node_configured(tokens, server, origin, name, sections, "", extra)
}

/// [`node_with`] with `invalidation` (keys, e.g. a `poll_interval`) in its `[invalidation]`
/// section.
pub fn node_configured(
    tokens: &Tokens,
    server: SocketAddr,
    origin: &TestOrigin,
    name: &str,
    sections: &str,
    invalidation: &str,
    extra: &str,
) -> Node {
    let admin = free_port();
    let config = format!(
        "\n{sections}\n[log]\naccess = \"off\"\n{}{invalidation}\n[cache.memcached]\n\
         servers = [\"{server}\"]\nretry_after = \"1s\"\nop_timeout = \"200ms\"\n\
         connect_timeout = \"100ms\"\n{extra}",
        admin_toml(admin, &tokens.0.path().join("admin.token"), name),
    );
    Node {
        proxy: LacquerProcess::start_simple(origin.addr(), &config),
        admin,
        name: name.to_string(),
    }
}

/// An origin whose `n`th GET of a path (counted per path from 1) is answered `answer(path, n)`,
/// once the gate of that GET is open if the test closed it ([`Self::close`]; at most 30 s). A
/// POST is answered `changed`.
pub struct GatedOrigin {
    /// The origin itself.
    pub origin: TestOrigin,
    closed: Arc<Mutex<Vec<(String, usize)>>>,
}

impl GatedOrigin {
    /// Answers `body-{n}-late`, fresh for an hour.
    pub fn start() -> GatedOrigin {
        GatedOrigin::answering(|_, n| {
            OriginResponse::ok(format!("body-{n}-late")).header("cache-control", "max-age=3600")
        })
    }

    /// Answers `answer(path, n)`.
    pub fn answering(
        answer: impl Fn(&str, usize) -> OriginResponse + Send + Sync + 'static,
    ) -> GatedOrigin {
        GatedOrigin::answering_request(move |req, n| answer(&req.path, n))
    }

    /// Answers `answer(request, n)`: [`Self::answering`] with the request in hand (a `Range`
    /// to answer with a `206`, a `Vary` field's value).
    pub fn answering_request(
        answer: impl Fn(&RecordedRequest, usize) -> OriginResponse + Send + Sync + 'static,
    ) -> GatedOrigin {
        let closed: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
        let served: Arc<Mutex<std::collections::HashMap<String, usize>>> = Arc::default();
        let gates = closed.clone();
        let origin = TestOrigin::start(move |req| {
            if req.method == "POST" {
                return OriginResponse::ok("changed");
            }
            let n = {
                let mut served = served.lock().unwrap();
                let n = served.entry(req.path.clone()).or_default();
                *n += 1;
                *n
            };
            let id = (req.path.clone(), n);
            let until = Instant::now() + Duration::from_secs(30);
            while gates.lock().unwrap().contains(&id) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            answer(req, n)
        });
        GatedOrigin { origin, closed }
    }

    /// The `n`th GET of `path` waits until [`Self::open`].
    pub fn close(&self, path: &str, n: usize) {
        self.closed.lock().unwrap().push((path.to_string(), n));
    }

    /// Opens the gate [`Self::close`] closed.
    pub fn open(&self, path: &str, n: usize) {
        self.closed
            .lock()
            .unwrap()
            .retain(|id| id != &(path.to_string(), n));
    }

    /// How many requests for `path` reached it.
    pub fn hits_for(&self, path: &str) -> usize {
        self.origin.hits_for(path)
    }

    /// Whether `n` requests for `path` reach it within 5 s.
    pub async fn reached(&self, path: &str, n: usize) -> bool {
        self.origin
            .wait_for_hits_for_async(path, n, Duration::from_secs(5))
            .await
    }
}

/// The nodes of one test: one admin token file, one origin and one configuration for all of
/// them. It exists because every test here started two or three nodes by [`node_via`] (or
/// [`node_with`], [`node_configured`]) with the same tokens, origin, sections and `extra`
/// written out again for each: with it a test says once how its nodes are configured, and each
/// node only what differs, its name and its memcached server (a [`Relay`]'s address or the
/// server's own). Nodes start when [`Self::start`] is called, in the order the test calls it.
pub struct Nodes<'a> {
    tokens: Tokens,
    origin: &'a TestOrigin,
    sections: &'a str,
    invalidation: &'a str,
    extra: &'a str,
}

impl<'a> Nodes<'a> {
    /// Nodes in front of `origin`, configured as [`node_via`]'s, with `extra` appended to their
    /// `[cache.memcached]` section; a fresh [`Tokens`] for them all.
    pub fn new(origin: &'a TestOrigin, extra: &'a str) -> Nodes<'a> {
        Nodes {
            tokens: Tokens::new(),
            origin,
            sections: "",
            invalidation: "",
            extra,
        }
    }

    /// The same with `sections` (whole sections, e.g. `[server]`) written before the others, as
    /// [`node_with`]'s.
    pub fn sections(self, sections: &'a str) -> Nodes<'a> {
        Nodes { sections, ..self }
    }

    /// The same with `invalidation` (keys, e.g. a `poll_interval`) in their `[invalidation]`
    /// section, as [`node_configured`]'s.
    pub fn invalidation(self, invalidation: &'a str) -> Nodes<'a> {
        Nodes {
            invalidation,
            ..self
        }
    }

    /// Starts node `name`, whose one memcached server is `server`.
    pub fn start(&self, name: &str, server: SocketAddr) -> Node {
        self.start_with(name, server, self.sections)
    }

    /// Starts node `name` with `sections` of its own instead of the shared ones: for the one
    /// node of a test configured apart (e.g. a short `shutdown_timeout`), so it still shares the
    /// others' tokens, origin and `extra`.
    pub fn start_with(&self, name: &str, server: SocketAddr, sections: &str) -> Node {
        node_configured(
            &self.tokens,
            server,
            self.origin,
            name,
            sections,
            self.invalidation,
            self.extra,
        )
    }
}
