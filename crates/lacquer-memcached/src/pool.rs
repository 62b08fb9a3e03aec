//! The connections to one memcached server, and the rules that bound them in number and time
//! and decide when one may be used again.
//!
//! * At most `pool_size` connections exist at once, opened lazily.
//! * Each call is bounded in total by `op_timeout` (pool wait, connect, request,
//!   response and the retry below); a connect attempt also by `connect_timeout`.
//! * A connection goes back to the pool only after a clean, complete exchange.
//!   It is owned by the call's future, so when the call fails, times out or is
//!   cancelled (its future dropped), the connection is closed, never reused.
//! * Retry: if a connection taken from the pool fails with an I/O error before
//!   any response byte was read (typically because memcached restarted while
//!   it sat idle), the idle pool is flushed and an idempotent call (get,
//!   get_multi, gets, set, cas, `add_retried`, delete, touch) is retried once on a
//!   fresh connection. `add` (a lease's) and append are never retried.  No other
//!   failure is retried.
//! * A command carrying a CAS token goes only over a connection known to reach the run of the
//!   server that gave the token: one this pool opened before the token was read, whose `stats`
//!   (read when it opened) name the token's run. A server restarted empty counts its tokens
//!   from 1 again ([`crate::cas_token`]). So a cas or compare-and-delete retried on a fresh
//!   connection is not sent again but answered [`CasOutcome::Changed`] (the connection broke,
//!   perhaps with the server's run); its caller reads the value again.
//! * A connection is used again only by a task of the runtime that opened it. Its socket is
//!   registered with that runtime's reactor, so a task of another runtime (Pingora runs the
//!   proxy, the admin listener and each background service on runtimes of their own) would be
//!   woken for every reply through the other runtime's thread: an extra epoll turn and a
//!   cross-thread wake on both sides (callgrind, one client's hits read from memcached: 3.8
//!   worker parks per hit, against 2.2 with this rule; see docs/benchmarks.md). A caller that
//!   finds no idle connection of its own opens one while the pool has room, and otherwise
//!   closes the longest-idle connection of another runtime to make room, so `pool_size` still
//!   bounds the connections.

use crate::cas_token::ReadOn;
use crate::connection::{Connection, OpenCount};
use crate::error::McError;
use crate::protocol::{CasOutcome, Command, Reply};
use crate::server_stats::ServerStats;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::{Handle, Id as RuntimeId};
use tokio::sync::Semaphore;

/// Settings for one memcached server, kept together so the tier can build a
/// [`crate::ServerClient`] per configured server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the server listens.
    pub addr: SocketAddr,
    /// Most connections open at once; callers beyond that wait (within `op_timeout`).
    pub pool_size: usize,
    /// Bound on opening one TCP connection.
    pub connect_timeout: Duration,
    /// Bound on a whole call, including pool wait, connect and one retry.
    pub op_timeout: Duration,
}

/// A bounded pool of connections to one server; see the module docs for its rules.
pub(crate) struct Pool {
    cfg: ServerConfig,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
    open: Arc<AtomicUsize>,
    /// Latency of completed exchanges and sizes of multi-gets (failures: the cluster's count).
    stats: ServerStats,
    /// This pool among the process's, so a token is sent only by the pool that read it.
    id: u64,
    /// Connections opened so far: each is numbered by this count when it has opened, and a token
    /// records it before its read is sent ([`ReadOn`]).
    opened: AtomicU64,
}

/// Pools made so far in this process, to number them.
static POOLS: AtomicU64 = AtomicU64::new(0);

impl Pool {
    /// Creates the pool; no connection is opened until the first call.
    pub(crate) fn new(cfg: ServerConfig) -> Pool {
        Pool {
            permits: Semaphore::new(cfg.pool_size.max(1)),
            cfg,
            idle: Mutex::new(Vec::new()),
            open: Arc::new(AtomicUsize::new(0)),
            stats: ServerStats::default(),
            id: POOLS.fetch_add(1, Ordering::Relaxed),
            opened: AtomicU64::new(0),
        }
    }

    pub(crate) fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Connections currently open (idle or in use) or being opened: the places taken.
    pub(crate) fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// This server's operation counters.
    pub(crate) fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Runs one exchange on a pooled or new connection, within `op_timeout`.
    pub(crate) async fn execute(&self, cmd: &Command<'_>) -> Result<Reply, McError> {
        let deadline = tokio::time::Instant::now() + self.cfg.op_timeout;
        self.execute_by(cmd, deadline).await
    }

    /// [`Self::execute`] for a command that reads or carries a CAS token: the reply comes with
    /// where it was read, and a command carrying a token read as `sent_to` is sent only over a
    /// connection known to reach the run that gave it. Over another (the server may have
    /// restarted since the token was read; see [`crate::cas_token`]) it is not sent, and the
    /// reply is [`CasOutcome::Changed`]: the value the token named may be gone.
    pub(crate) async fn execute_with_token(
        &self,
        cmd: &Command<'_>,
        sent_to: Option<&ReadOn>,
    ) -> Result<(Reply, ReadOn), McError> {
        let deadline = tokio::time::Instant::now() + self.cfg.op_timeout;
        self.execute_until(cmd, sent_to, deadline).await
    }

    /// Runs one exchange on a pooled or new connection, ending by `deadline` (a caller that
    /// has already started its own clock passes it here, so one timer bounds the whole call).
    pub(crate) async fn execute_by(
        &self,
        cmd: &Command<'_>,
        deadline: tokio::time::Instant,
    ) -> Result<Reply, McError> {
        if let Command::GetMulti(keys) = cmd {
            self.stats.on_batch(keys.len());
        }
        self.execute_until(cmd, None, deadline)
            .await
            .map(|(reply, _)| reply)
    }

    /// One exchange (and its retry) ending by `deadline`; a completed one's latency counted.
    async fn execute_until(
        &self,
        cmd: &Command<'_>,
        sent_to: Option<&ReadOn>,
        deadline: tokio::time::Instant,
    ) -> Result<(Reply, ReadOn), McError> {
        let started = std::time::Instant::now();
        let result = tokio::time::timeout_at(deadline, self.execute_once_or_retry(cmd, sent_to))
            .await
            .unwrap_or(Err(McError::Timeout));
        if result.is_ok() {
            self.stats.on_exchange(started.elapsed());
        }
        result
    }

    async fn execute_once_or_retry(
        &self,
        cmd: &Command<'_>,
        sent_to: Option<&ReadOn>,
    ) -> Result<(Reply, ReadOn), McError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the pool semaphore is never closed");
        let runtime = Handle::current().id();
        let pooled = self.take_idle(runtime, sent_to);
        let reused = pooled.is_ok();
        // `conn` is owned by this future: an error, a timeout or the caller
        // dropping the future closes it; only clean completion pools it.
        let mut conn = match pooled {
            Ok(conn) => conn,
            Err(place) => self.connect(place, runtime).await?,
        };
        if let Some(answer) = self.another_run(&conn, sent_to) {
            self.idle.lock().push(conn);
            return Ok(answer);
        }
        self.mark_sent(&mut conn);
        match conn.exchange(cmd).await {
            Ok(reply) => {
                let read = self.read_on(&conn);
                self.idle.lock().push(conn);
                Ok((reply, read))
            }
            Err(McError::Io(e)) if reused && !conn.reply_started() => {
                drop(conn);
                // The other idle connections most likely went stale together. The retry's place
                // is taken under the same lock as they are let go, as in `take_idle`, so a caller
                // seeing the room they leave cannot take it too and pass `pool_size`.
                let place = {
                    let mut idle = self.idle.lock();
                    idle.clear();
                    cmd.is_idempotent().then(|| OpenCount::reserve(&self.open))
                };
                let Some(place) = place else {
                    return Err(McError::Io(e));
                };
                log::debug!(
                    "memcached {}: stale pooled connection ({e}), retrying",
                    self.cfg.addr
                );
                let mut conn = self.connect(place, runtime).await?;
                if let Some(answer) = self.another_run(&conn, sent_to) {
                    self.idle.lock().push(conn);
                    return Ok(answer);
                }
                self.mark_sent(&mut conn);
                let reply = conn.exchange(cmd).await?;
                let read = self.read_on(&conn);
                self.idle.lock().push(conn);
                Ok((reply, read))
            }
            Err(e) => Err(e),
        }
    }

    /// The reply to a command carrying a token read as `sent_to`, when `conn` is not known to
    /// reach the run that gave it (see [`crate::cas_token`]): not sent, the value is taken as
    /// changed ([`Self::carries`]).
    fn another_run(&self, conn: &Connection, sent_to: Option<&ReadOn>) -> Option<(Reply, ReadOn)> {
        if self.carries(conn, sent_to?) {
            return None;
        }
        log::debug!(
            "memcached {}: a CAS token not sent over a connection that may reach another run \
             of the server than the one that gave it",
            self.cfg.addr
        );
        let read = ReadOn {
            instance: conn.instance(),
            pool: self.id,
            opened: self.opened.load(Ordering::SeqCst),
        };
        Some((Reply::Cas(CasOutcome::Changed), read))
    }

    /// Whether `conn` is known to reach the run that gave a token read as `token`: it reached
    /// that run's `stats` and was opened by this pool before the token's read was sent (and,
    /// being open, has not outlived that run).
    fn carries(&self, conn: &Connection, token: &ReadOn) -> bool {
        token.instance == conn.instance() && token.pool == self.id && conn.order() < token.opened
    }

    /// Where the reply just read over `conn` was read: the count of opened connections is the
    /// one [`Self::mark_sent`] noted before the command was sent, so that the connections it
    /// counts as opened before were open before the server answered.
    fn read_on(&self, conn: &Connection) -> ReadOn {
        ReadOn {
            instance: conn.instance(),
            pool: self.id,
            opened: conn.sent_after(),
        }
    }

    /// Notes on `conn`, before a command is sent over it, how many connections the pool has
    /// opened ([`Self::read_on`] reads it back once the reply is in). Kept on the connection
    /// rather than in the call's future: a larger future is copied on every memcached read
    /// (callgrind: about 400 instructions a memcached-tier hit when it was held there).
    fn mark_sent(&self, conn: &mut Connection) {
        conn.set_sent_after(self.opened.load(Ordering::SeqCst));
    }

    /// The most recently used idle connection opened by `runtime` (for a command carrying a
    /// token read as `sent_to`, the most recently used of those that may carry it, if any: one
    /// opened since the read, when the pool grew, would answer it "changed"), or else a place in
    /// the count to open one. When the pool has no room for another, the longest-idle
    /// connection of another runtime is closed to make it: the caller holds a permit, so while
    /// every place is taken at least one connection is idle, and it is not the caller's
    /// runtime's. Places are taken under the idle list's lock, so callers racing to open cannot
    /// pass `pool_size`.
    fn take_idle(
        &self,
        runtime: RuntimeId,
        sent_to: Option<&ReadOn>,
    ) -> Result<Connection, OpenCount> {
        let mut idle = self.idle.lock();
        let ours = |c: &Connection| c.runtime() == runtime;
        let carries = |c: &Connection| sent_to.is_none_or(|token| self.carries(c, token));
        let found = idle
            .iter()
            .rposition(|c| ours(c) && carries(c))
            .or_else(|| idle.iter().rposition(ours));
        if let Some(i) = found {
            return Ok(idle.remove(i));
        }
        if !idle.is_empty() && self.open.load(Ordering::Relaxed) >= self.cfg.pool_size.max(1) {
            drop(idle.remove(0));
        }
        Err(OpenCount::reserve(&self.open))
    }

    /// Opens a connection and numbers it, once the server has answered over it, among those
    /// this pool opened ([`ReadOn`]).
    async fn connect(&self, place: OpenCount, runtime: RuntimeId) -> Result<Connection, McError> {
        let mut conn =
            Connection::open(self.cfg.addr, self.cfg.connect_timeout, place, runtime).await?;
        conn.set_order(self.opened.fetch_add(1, Ordering::SeqCst));
        Ok(conn)
    }
}
