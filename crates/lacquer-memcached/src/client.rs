//! A small async, pooled memcached client speaking the meta text protocol.
//!
//! This is the transport of Lacquer's shared cache tier: binary values of up
//! to about 1 MB, fetched one at a time or pipelined in batches, with hard
//! time bounds so that a slow or dead memcached degrades into a cache miss
//! instead of stalling requests.  One [`ServerClient`] talks to one server;
//! choosing the server for a key is [`crate::ketama`]'s job.
//!
//! Commands used (memcached >= 1.6, see its `protocol.txt`): `mg <key> v`,
//! `ms <key> <len> T<ttl>` (with `ME` for add), `md <key>`, `mg <key> T<ttl>`
//! for touch, and for batches `mg <key> v q O<i>` per key closed by `mn`.
//!
//! Connection rules:
//! * At most `pool_size` connections exist at once, opened lazily.
//! * Each call is bounded in total by `op_timeout` (pool wait, connect, request,
//!   response and the retry below); a connect attempt also by `connect_timeout`.
//! * A connection goes back to the pool only after a clean, complete exchange.
//!   It is owned by the call's future, so when the call fails, times out or is
//!   cancelled (its future dropped), the connection is closed, never reused.
//! * Retry: if a connection taken from the pool fails with an I/O error before
//!   any response byte was read (typically because memcached restarted while
//!   it sat idle), the idle pool is flushed and an idempotent call (get,
//!   get_multi, set, delete, touch) is retried once on a fresh connection.
//!   `add` is never retried.  No other failure is retried.

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// memcached's limit on key length, in bytes.
pub const MAX_KEY_LEN: usize = 250;
/// Longest TTL sent; memcached reads larger values as absolute Unix times.
const MAX_TTL_SECS: u32 = 30 * 24 * 3600;
/// Longest response header line accepted (they are short: `VA <len> O<n>`).
const MAX_LINE: u64 = 1024;
/// Largest value accepted from a server, to bound memory on a corrupt length.
const MAX_VALUE_LEN: usize = 128 << 20;

/// Why a memcached call failed.  Callers of the cache tier treat every error
/// as a miss (or a skipped write); the variants exist for logs and metrics.
#[derive(Debug)]
pub enum McError {
    /// No connection could be opened (refused, unreachable, or connect timeout).
    Connect,
    /// The call did not finish within `op_timeout`.
    Timeout,
    /// The connection failed mid-call (reset, closed, write error).
    Io(io::Error),
    /// An invalid key, or a response this client does not understand.
    Protocol(String),
    /// The server answered `SERVER_ERROR` (e.g. out of memory, value too large).
    ServerError(String),
}

impl fmt::Display for McError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McError::Connect => write!(f, "memcached: connect failed"),
            McError::Timeout => write!(f, "memcached: operation timed out"),
            McError::Io(e) => write!(f, "memcached: I/O error: {e}"),
            McError::Protocol(m) => write!(f, "memcached: protocol error: {m}"),
            McError::ServerError(m) => write!(f, "memcached: server error: {m}"),
        }
    }
}

impl std::error::Error for McError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            McError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for McError {
    fn from(e: io::Error) -> Self {
        McError::Io(e)
    }
}

/// Settings for one memcached server, kept together so the tier can build a
/// [`ServerClient`] per configured server.
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

/// A client for one memcached server with a bounded pool of connections, so
/// that concurrent requests share a few sockets and a bad server is bounded
/// in time.  Cheap to share behind an `Arc`.
pub struct ServerClient {
    cfg: ServerConfig,
    idle: Mutex<Vec<Conn>>,
    permits: Semaphore,
    open: Arc<AtomicUsize>,
}

impl ServerClient {
    /// Creates the client; no connection is opened until the first call.
    pub fn new(cfg: ServerConfig) -> ServerClient {
        ServerClient {
            permits: Semaphore::new(cfg.pool_size.max(1)),
            cfg,
            idle: Mutex::new(Vec::new()),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The configuration this client was built with, for logs and admin views.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Connections currently open (idle or in use), for metrics and to check
    /// that the pool stays bounded and discards broken connections.
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Fetches one value; `Ok(None)` on a miss.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, McError> {
        check_key(key)?;
        match self.execute(&Cmd::Get(key)).await? {
            Reply::Value(v) => Ok(v),
            _ => unreachable!("get yields a value"),
        }
    }

    /// Fetches many values in one pipelined round trip on one connection;
    /// the result has one entry per key, in the same order.
    pub async fn get_multi<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
    ) -> Result<Vec<Option<Bytes>>, McError> {
        let keys: Vec<&[u8]> = keys.iter().map(AsRef::as_ref).collect();
        keys.iter().try_for_each(|k| check_key(k))?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        match self.execute(&Cmd::GetMulti(&keys)).await? {
            Reply::Values(v) => Ok(v),
            _ => unreachable!("get_multi yields values"),
        }
    }

    /// Stores `value` under `key` for `ttl_secs` seconds (0 = no expiry;
    /// more than 30 days is capped at 30 days).
    pub async fn set(&self, key: &[u8], value: Bytes, ttl_secs: u32) -> Result<(), McError> {
        check_key(key)?;
        let cmd = Cmd::Store {
            key,
            value: &value,
            ttl: ttl_secs,
            add: false,
        };
        match self.execute(&cmd).await? {
            Reply::Flag(true) => Ok(()),
            _ => Err(McError::ServerError("value not stored".into())),
        }
    }

    /// Stores `value` only if `key` is absent: `Ok(true)` if stored, `Ok(false)`
    /// if the key exists.  Used for fill leases; never retried.
    pub async fn add(&self, key: &[u8], value: Bytes, ttl_secs: u32) -> Result<bool, McError> {
        check_key(key)?;
        let cmd = Cmd::Store {
            key,
            value: &value,
            ttl: ttl_secs,
            add: true,
        };
        match self.execute(&cmd).await? {
            Reply::Flag(stored) => Ok(stored),
            _ => unreachable!("add yields a flag"),
        }
    }

    /// Deletes `key`: `Ok(true)` if it existed, used for purges and lease release.
    pub async fn delete(&self, key: &[u8]) -> Result<bool, McError> {
        check_key(key)?;
        match self.execute(&Cmd::Delete(key)).await? {
            Reply::Flag(found) => Ok(found),
            _ => unreachable!("delete yields a flag"),
        }
    }

    /// Resets the TTL of `key` without fetching it: `Ok(true)` if it existed.
    pub async fn touch(&self, key: &[u8], ttl_secs: u32) -> Result<bool, McError> {
        check_key(key)?;
        match self.execute(&Cmd::Touch(key, ttl_secs)).await? {
            Reply::Flag(found) => Ok(found),
            _ => unreachable!("touch yields a flag"),
        }
    }

    async fn execute(&self, cmd: &Cmd<'_>) -> Result<Reply, McError> {
        tokio::time::timeout(self.cfg.op_timeout, self.execute_once_or_retry(cmd))
            .await
            .unwrap_or(Err(McError::Timeout))
    }

    async fn execute_once_or_retry(&self, cmd: &Cmd<'_>) -> Result<Reply, McError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .expect("the pool semaphore is never closed");
        let pooled = self.idle.lock().pop();
        let reused = pooled.is_some();
        // `conn` is owned by this future: an error, a timeout or the caller
        // dropping the future closes it; only clean completion pools it.
        let mut conn = match pooled {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        match conn.exchange(cmd).await {
            Ok(reply) => {
                self.idle.lock().push(conn);
                Ok(reply)
            }
            Err(McError::Io(e)) if reused && !conn.reader.read_any => {
                drop(conn);
                // The other idle connections most likely went stale together.
                self.idle.lock().clear();
                if !cmd.is_idempotent() {
                    return Err(McError::Io(e));
                }
                log::debug!(
                    "memcached {}: stale pooled connection ({e}), retrying",
                    self.cfg.addr
                );
                let mut conn = self.connect().await?;
                let reply = conn.exchange(cmd).await?;
                self.idle.lock().push(conn);
                Ok(reply)
            }
            Err(e) => Err(e),
        }
    }

    async fn connect(&self) -> Result<Conn, McError> {
        let addr = self.cfg.addr;
        let stream =
            match tokio::time::timeout(self.cfg.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    log::debug!("memcached {addr}: connect failed: {e}");
                    return Err(McError::Connect);
                }
                Err(_) => {
                    log::debug!("memcached {addr}: connect timed out");
                    return Err(McError::Connect);
                }
            };
        stream.set_nodelay(true)?;
        let (r, w) = stream.into_split();
        self.open.fetch_add(1, Ordering::Relaxed);
        Ok(Conn {
            reader: Reader {
                inner: BufReader::new(r),
                read_any: false,
            },
            writer: BufWriter::new(w),
            _open: OpenCount(self.open.clone()),
        })
    }
}

/// Rejects keys memcached's text protocol cannot carry, before anything is sent.
fn check_key(key: &[u8]) -> Result<(), McError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(McError::Protocol(format!(
            "key length {} not in 1..=250",
            key.len()
        )));
    }
    if key.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(McError::Protocol(
            "key contains whitespace or control bytes".into(),
        ));
    }
    Ok(())
}

/// One request, so a single exchange routine serves every call (and its retry).
enum Cmd<'a> {
    Get(&'a [u8]),
    GetMulti(&'a [&'a [u8]]),
    Store {
        key: &'a [u8],
        value: &'a Bytes,
        ttl: u32,
        add: bool,
    },
    Delete(&'a [u8]),
    Touch(&'a [u8], u32),
}

impl Cmd<'_> {
    fn is_idempotent(&self) -> bool {
        !matches!(self, Cmd::Store { add: true, .. })
    }
}

enum Reply {
    Value(Option<Bytes>),
    Values(Vec<Option<Bytes>>),
    Flag(bool),
}

/// Decrements the open-connection count when its connection is dropped.
struct OpenCount(Arc<AtomicUsize>);

impl Drop for OpenCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Conn {
    reader: Reader,
    writer: BufWriter<OwnedWriteHalf>,
    _open: OpenCount,
}

struct Reader {
    inner: BufReader<OwnedReadHalf>,
    /// Whether any byte of the current exchange's response has arrived.
    read_any: bool,
}

impl Conn {
    async fn exchange(&mut self, cmd: &Cmd<'_>) -> Result<Reply, McError> {
        self.reader.read_any = false;
        let w = &mut self.writer;
        match *cmd {
            Cmd::Get(key) => {
                write_parts(w, &[b"mg ", key, b" v\r\n"]).await?;
                self.reader.read_value().await.map(Reply::Value)
            }
            Cmd::GetMulti(keys) => {
                let send = async {
                    for (i, key) in keys.iter().enumerate() {
                        w.write_all(b"mg ").await?;
                        w.write_all(key).await?;
                        w.write_all(format!(" v q O{i}\r\n").as_bytes()).await?;
                    }
                    write_parts(w, &[b"mn\r\n"]).await.map_err(McError::from)
                };
                // Read while writing: a big batch of large values could
                // otherwise fill both directions' socket buffers and deadlock.
                let (_, values) = tokio::try_join!(send, self.reader.read_batch(keys.len()))?;
                Ok(Reply::Values(values))
            }
            Cmd::Store {
                key,
                value,
                ttl,
                add,
            } => {
                let mode = if add { " ME" } else { "" };
                let head = format!(" {} T{}{mode}\r\n", value.len(), ttl.min(MAX_TTL_SECS));
                write_parts(w, &[b"ms ", key, head.as_bytes(), value, b"\r\n"]).await?;
                let line = self.reader.read_line().await?;
                match line.as_str() {
                    "HD" => Ok(Reply::Flag(true)),
                    "NS" => Ok(Reply::Flag(false)),
                    _ => Err(unexpected(&line)),
                }
            }
            Cmd::Delete(key) => {
                write_parts(w, &[b"md ", key, b"\r\n"]).await?;
                self.reader.read_flag("HD", "NF").await.map(Reply::Flag)
            }
            Cmd::Touch(key, ttl) => {
                let tail = format!(" T{}\r\n", ttl.min(MAX_TTL_SECS));
                write_parts(w, &[b"mg ", key, tail.as_bytes()]).await?;
                self.reader.read_flag("HD", "EN").await.map(Reply::Flag)
            }
        }
    }
}

async fn write_parts(w: &mut BufWriter<OwnedWriteHalf>, parts: &[&[u8]]) -> io::Result<()> {
    for part in parts {
        w.write_all(part).await?;
    }
    w.flush().await
}

impl Reader {
    /// Reads one `\r\n`-terminated response line, without the terminator.
    async fn read_line(&mut self) -> Result<String, McError> {
        let mut buf = Vec::with_capacity(32);
        let n = (&mut self.inner)
            .take(MAX_LINE)
            .read_until(b'\n', &mut buf)
            .await?;
        self.read_any |= n > 0;
        if !buf.ends_with(b"\r\n") {
            if (n as u64) < MAX_LINE {
                let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed");
                return Err(McError::Io(eof));
            }
            return Err(McError::Protocol("response line too long".into()));
        }
        buf.truncate(buf.len() - 2);
        String::from_utf8(buf).map_err(|_| McError::Protocol("non-UTF-8 response line".into()))
    }

    /// Reads `len` data bytes and their `\r\n` terminator.
    async fn read_data(&mut self, len: &str) -> Result<Bytes, McError> {
        let len: usize = len
            .parse()
            .ok()
            .filter(|&n| n <= MAX_VALUE_LEN)
            .ok_or_else(|| McError::Protocol(format!("bad value length {len:?}")))?;
        let mut buf = BytesMut::zeroed(len + 2);
        self.inner.read_exact(&mut buf).await?;
        if &buf[len..] != b"\r\n" {
            return Err(McError::Protocol("value not terminated by CRLF".into()));
        }
        buf.truncate(len);
        Ok(buf.freeze())
    }

    /// Reads the reply to `mg <key> v`: `VA <len> ...` and data, or `EN`.
    async fn read_value(&mut self) -> Result<Option<Bytes>, McError> {
        let line = self.read_line().await?;
        if line == "EN" {
            return Ok(None);
        }
        match line.split(' ').collect::<Vec<_>>()[..] {
            ["VA", len, ..] => self.read_data(len).await.map(Some),
            _ => Err(unexpected(&line)),
        }
    }

    /// Reads the replies to a `mg <key> v q O<i>` batch up to the closing `MN`.
    async fn read_batch(&mut self, count: usize) -> Result<Vec<Option<Bytes>>, McError> {
        let mut values = vec![None; count];
        let mut next = 0;
        loop {
            let line = self.read_line().await?;
            if line == "MN" {
                return Ok(values);
            }
            let tokens: Vec<&str> = line.split(' ').collect();
            let (len, flags) = match tokens[..] {
                ["VA", len, ref flags @ ..] => (len, flags),
                _ => return Err(unexpected(&line)),
            };
            // Hits come back in request order, each tagged with its index.
            let index = flags
                .iter()
                .find_map(|f| f.strip_prefix('O'))
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|&i| i >= next && i < count)
                .ok_or_else(|| McError::Protocol(format!("bad opaque in {line:?}")))?;
            values[index] = Some(self.read_data(len).await?);
            next = index + 1;
        }
    }

    /// Reads a one-line reply that is either `yes` (true) or `no` (false).
    async fn read_flag(&mut self, yes: &str, no: &str) -> Result<bool, McError> {
        let line = self.read_line().await?;
        match line.as_str() {
            l if l == yes => Ok(true),
            l if l == no => Ok(false),
            _ => Err(unexpected(&line)),
        }
    }
}

/// Maps an unexpected response line to the matching error.
fn unexpected(line: &str) -> McError {
    match line.strip_prefix("SERVER_ERROR") {
        Some(msg) => McError::ServerError(msg.trim().to_string()),
        None => McError::Protocol(format!("unexpected response {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    /// A real memcached on a free loopback port, killed on drop.
    struct Memcached {
        child: Child,
        port: u16,
    }

    impl Memcached {
        fn start() -> Memcached {
            Memcached::start_on(free_port())
        }

        fn start_on(port: u16) -> Memcached {
            let child = Command::new("memcached")
                // `-u root` only matters when run as root, where memcached demands -u.
                .args([
                    "-p",
                    &port.to_string(),
                    "-l",
                    "127.0.0.1",
                    "-U",
                    "0",
                    "-m",
                    "64",
                ])
                .args(["-u", "root"])
                .stdout(Stdio::null())
                .spawn()
                .expect("memcached binary (apt-get install -y memcached)");
            let mut server = Memcached { child, port };
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                if let Some(status) = server.child.try_wait().unwrap() {
                    panic!("memcached exited early: {status}");
                }
                assert!(Instant::now() < deadline, "memcached did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            server
        }

        fn addr(&self) -> SocketAddr {
            SocketAddr::from(([127, 0, 0, 1], self.port))
        }

        fn kill(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }

        /// Sends `kill -STOP` / `kill -CONT` to freeze or resume the server.
        fn signal(&self, sig: &str) {
            let status = Command::new("kill")
                .args([sig, &self.child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            // `kill` only queues the signal: wait until every thread has
            // actually stopped (or resumed), or a busy machine lets the
            // server answer one more request after "-STOP".
            let want_stopped = sig == "-STOP";
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.is_stopped() != want_stopped {
                assert!(Instant::now() < deadline, "memcached ignored {sig}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        /// True when every thread of the server is in the stopped state.
        fn is_stopped(&self) -> bool {
            let tasks = format!("/proc/{}/task", self.child.id());
            std::fs::read_dir(tasks).unwrap().all(|task| {
                let stat =
                    std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the parenthesised command name.
                stat.rsplit(") ")
                    .next()
                    .is_some_and(|rest| rest.starts_with('T'))
            })
        }
    }

    impl Drop for Memcached {
        fn drop(&mut self) {
            self.kill();
        }
    }

    fn free_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    /// A loopback address that refuses connections: bound but never listening,
    /// so no other test's server can take the port while the socket lives.
    fn refusing_addr() -> (tokio::net::TcpSocket, SocketAddr) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
        let addr = socket.local_addr().unwrap();
        (socket, addr)
    }

    fn client(addr: SocketAddr, pool_size: usize) -> ServerClient {
        ServerClient::new(ServerConfig {
            addr,
            pool_size,
            connect_timeout: Duration::from_millis(500),
            op_timeout: Duration::from_millis(1000),
        })
    }

    /// Fails the test instead of hanging if `fut` takes more than 5 s.
    async fn within<T>(fut: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .expect("operation hung")
    }

    fn binary_value(len: usize) -> Bytes {
        let mut v: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
        v.extend_from_slice(b"\r\n\0END\r\n");
        Bytes::from(v)
    }

    #[tokio::test]
    async fn set_get_delete_round_trip_binary() {
        let mc = Memcached::start();
        let c = client(mc.addr(), 2);
        let value = Bytes::from_static(b"a\r\nb\0c\r\nEN\r\nVA 3\r\n\0");
        within(c.set(b"k1", value.clone(), 60)).await.unwrap();
        assert_eq!(within(c.get(b"k1")).await.unwrap(), Some(value));
        within(c.set(b"k1", Bytes::new(), 0)).await.unwrap();
        assert_eq!(within(c.get(b"k1")).await.unwrap(), Some(Bytes::new()));
        assert!(within(c.delete(b"k1")).await.unwrap());
        assert!(!within(c.delete(b"k1")).await.unwrap());
        assert_eq!(within(c.get(b"k1")).await.unwrap(), None);
        assert_eq!(within(c.get(b"never-set")).await.unwrap(), None);
        assert_eq!(
            c.open_connections(),
            1,
            "sequential calls reuse one connection"
        );
    }

    #[tokio::test]
    async fn get_multi_keeps_request_order() {
        let mc = Memcached::start();
        let c = client(mc.addr(), 2);
        for k in ["m1", "m3", "m4"] {
            let v = Bytes::from(format!("value of {k}\r\n"));
            within(c.set(k.as_bytes(), v, 60)).await.unwrap();
        }
        let keys = ["m0", "m1", "m2", "m3", "m1", "m4", "m5"];
        let got = within(c.get_multi(&keys)).await.unwrap();
        let want: Vec<Option<Bytes>> = keys
            .iter()
            .map(|k| {
                ["m1", "m3", "m4"]
                    .contains(k)
                    .then(|| Bytes::from(format!("value of {k}\r\n")))
            })
            .collect();
        assert_eq!(got, want);
        let none: [&str; 0] = [];
        assert!(within(c.get_multi(&none)).await.unwrap().is_empty());
        let misses = within(c.get_multi(&["x1", "x2"])).await.unwrap();
        assert_eq!(misses, vec![None, None]);
        // The connection stayed in sync: a plain get still works on it.
        assert!(within(c.get(b"m3")).await.unwrap().is_some());
        assert_eq!(c.open_connections(), 1);
    }

    #[tokio::test]
    async fn large_values_round_trip_alone_and_in_batches() {
        let mc = Memcached::start();
        let c = client(mc.addr(), 1);
        let big = binary_value(900 * 1024);
        within(c.set(b"big", big.clone(), 60)).await.unwrap();
        assert_eq!(within(c.get(b"big")).await.unwrap(), Some(big.clone()));
        // 40 x 900 KB in one pipelined batch: more than the socket buffers hold.
        let keys: Vec<String> = (0..40).map(|i| format!("big{}", i % 2)).collect();
        within(c.set(b"big0", big.clone(), 60)).await.unwrap();
        let got = within(c.get_multi(&keys)).await.unwrap();
        for (i, v) in got.iter().enumerate() {
            assert_eq!(v.as_ref(), (i % 2 == 0).then_some(&big), "index {i}");
        }
    }

    #[tokio::test]
    async fn pipelined_batch_larger_than_socket_buffers_both_ways() {
        let mc = Memcached::start();
        let c = ServerClient::new(ServerConfig {
            addr: mc.addr(),
            pool_size: 1,
            connect_timeout: Duration::from_secs(1),
            op_timeout: Duration::from_secs(20),
        });
        // 60,000 requests of ~270 bytes (16 MB up) for 1 KB hits (60 MB down):
        // writing all requests before reading any reply would deadlock.
        let key = "K".repeat(MAX_KEY_LEN - 1);
        let value = binary_value(1000);
        within(c.set(key.as_bytes(), value.clone(), 60))
            .await
            .unwrap();
        let keys = vec![key.as_str(); 60_000];
        let got = tokio::time::timeout(Duration::from_secs(30), c.get_multi(&keys))
            .await
            .expect("hung")
            .unwrap();
        assert_eq!(got.len(), keys.len());
        assert!(got.iter().all(|v| v.as_ref() == Some(&value)));
    }

    #[tokio::test]
    async fn server_error_is_reported_and_its_connection_discarded() {
        let mc = Memcached::start();
        let c = client(mc.addr(), 1);
        // memcached's default item size limit is 1 MB.
        let too_big = binary_value(2 << 20);
        let set = within(c.set(b"huge", too_big, 60)).await;
        assert!(matches!(set, Err(McError::ServerError(_))), "{set:?}");
        assert_eq!(c.open_connections(), 0);
        assert_eq!(within(c.get(b"huge")).await.unwrap(), None);
        assert_eq!(c.open_connections(), 1);
    }

    #[tokio::test]
    async fn add_only_stores_absent_keys() {
        let mc = Memcached::start();
        let c = client(mc.addr(), 2);
        assert!(within(c.add(b"lease", Bytes::from_static(b"a"), 60))
            .await
            .unwrap());
        assert!(!within(c.add(b"lease", Bytes::from_static(b"b"), 60))
            .await
            .unwrap());
        assert_eq!(
            within(c.get(b"lease")).await.unwrap(),
            Some(Bytes::from_static(b"a"))
        );
        assert!(within(c.delete(b"lease")).await.unwrap());
        assert!(within(c.add(b"lease", Bytes::from_static(b"c"), 60))
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn ttl_expires_and_touch_extends() {
        let mc = Memcached::start();
        let c = client(mc.addr(), 1);
        within(c.set(b"short", Bytes::from_static(b"v"), 1))
            .await
            .unwrap();
        within(c.set(b"touched", Bytes::from_static(b"v"), 1))
            .await
            .unwrap();
        assert!(within(c.touch(b"touched", 3600)).await.unwrap());
        assert!(!within(c.touch(b"absent", 60)).await.unwrap());
        assert!(within(c.get(b"short")).await.unwrap().is_some());
        let deadline = Instant::now() + Duration::from_secs(5);
        while within(c.get(b"short")).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "a 1 s TTL did not expire");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(within(c.get(b"touched")).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn invalid_keys_are_rejected_before_sending() {
        // Nothing listens here: any attempt to send would yield Connect instead.
        let (_socket, addr) = refusing_addr();
        let c = client(addr, 1);
        let long = vec![b'k'; 251];
        let bad: [&[u8]; 5] = [b"", b"has space", b"tab\tkey", b"nl\n", &long];
        for key in bad {
            assert!(matches!(c.get(key).await, Err(McError::Protocol(_))));
            assert!(matches!(c.delete(key).await, Err(McError::Protocol(_))));
            let set = c.set(key, Bytes::new(), 0).await;
            assert!(matches!(set, Err(McError::Protocol(_))));
        }
        let multi = c.get_multi(&[&b"ok"[..], &b"not ok"[..]]).await;
        assert!(matches!(multi, Err(McError::Protocol(_))));
        assert!(matches!(c.get(&long[..250]).await, Err(McError::Connect)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_concurrent_tasks_share_a_bounded_pool() {
        let mc = Memcached::start();
        // generous timeouts: 2,000 round trips through 4 connections on a loaded CI machine
        let c = Arc::new(ServerClient::new(ServerConfig {
            addr: mc.addr(),
            pool_size: 4,
            connect_timeout: Duration::from_secs(2),
            op_timeout: Duration::from_secs(4),
        }));
        let tasks: Vec<_> = (0..50)
            .map(|t| {
                let c = c.clone();
                tokio::spawn(async move {
                    for i in 0..20 {
                        let key = format!("t{t}:{i}");
                        let value = Bytes::from(format!("{t}/{i}").repeat(i * 50 + 1));
                        c.set(key.as_bytes(), value.clone(), 60).await.unwrap();
                        assert!(c.open_connections() <= 4);
                        assert_eq!(c.get(key.as_bytes()).await.unwrap(), Some(value));
                    }
                    let keys: Vec<String> = (0..20).map(|i| format!("t{t}:{i}")).collect();
                    let all = c.get_multi(&keys).await.unwrap();
                    assert!(all.iter().all(Option::is_some));
                })
            })
            .collect();
        for task in tasks {
            within(task).await.unwrap();
        }
        let open = c.open_connections();
        assert!((1..=4).contains(&open), "{open} connections open");
    }

    #[tokio::test]
    async fn unreachable_server_fails_fast() {
        let (_socket, addr) = refusing_addr();
        let c = client(addr, 2);
        // A refused connection is reported as such, not waited out as a timeout.
        assert!(matches!(within(c.get(b"k")).await, Err(McError::Connect)));
        let set = within(c.set(b"k", Bytes::from_static(b"v"), 1)).await;
        assert!(matches!(set, Err(McError::Connect)));
        assert_eq!(c.open_connections(), 0);
    }

    #[tokio::test]
    async fn killed_server_errors_then_recovers_after_restart() {
        let mut mc = Memcached::start();
        let port = mc.port;
        let c = client(mc.addr(), 2);
        within(c.set(b"k", Bytes::from_static(b"v"), 60))
            .await
            .unwrap();
        mc.kill();
        // The pooled connection is dead and reconnecting is refused.
        assert!(within(c.get(b"k")).await.is_err());
        assert!(within(c.add(b"k", Bytes::from_static(b"v"), 60))
            .await
            .is_err());
        assert!(within(c.delete(b"k")).await.is_err());
        assert_eq!(c.open_connections(), 0);
        let _mc = Memcached::start_on(port);
        // A fresh server: the old value is gone, and the client works again.
        assert_eq!(within(c.get(b"k")).await.unwrap(), None);
        within(c.set(b"k", Bytes::from_static(b"v2"), 60))
            .await
            .unwrap();
        assert_eq!(
            within(c.get(b"k")).await.unwrap(),
            Some(Bytes::from_static(b"v2"))
        );
    }

    #[tokio::test]
    async fn restart_between_calls_is_absorbed_by_one_retry() {
        let mut mc = Memcached::start();
        let port = mc.port;
        let c = client(mc.addr(), 1);
        within(c.set(b"k", Bytes::from_static(b"v"), 60))
            .await
            .unwrap();
        mc.kill();
        let _mc = Memcached::start_on(port);
        // The pooled connection is stale; the retry on a fresh one succeeds.
        assert_eq!(within(c.get(b"k")).await.unwrap(), None);
        within(c.set(b"k", Bytes::from_static(b"v2"), 60))
            .await
            .unwrap();
        assert_eq!(c.open_connections(), 1);
        // add is not idempotent, so it is not retried: it reports the failure.
        drop(_mc);
        let _mc = Memcached::start_on(port);
        let add = within(c.add(b"k", Bytes::from_static(b"v"), 60)).await;
        assert!(matches!(add, Err(McError::Io(_))), "{add:?}");
        assert!(within(c.add(b"k", Bytes::from_static(b"v"), 60))
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn frozen_server_times_out_and_its_connection_is_discarded() {
        let mc = Memcached::start();
        let c = ServerClient::new(ServerConfig {
            addr: mc.addr(),
            pool_size: 2,
            connect_timeout: Duration::from_millis(1000),
            op_timeout: Duration::from_millis(1000),
        });
        within(c.set(b"k", Bytes::from_static(b"v"), 60))
            .await
            .unwrap();
        mc.signal("-STOP");
        let frozen = within(c.get(b"k")).await;
        assert!(matches!(frozen, Err(McError::Timeout)), "{frozen:?}");
        assert_eq!(
            c.open_connections(),
            0,
            "a timed-out connection is not pooled"
        );
        // A caller cancelling mid-flight also discards the connection.
        let cancelled = tokio::time::timeout(Duration::from_millis(100), c.get(b"k")).await;
        assert!(cancelled.is_err());
        assert_eq!(
            c.open_connections(),
            0,
            "a cancelled connection is not pooled"
        );
        mc.signal("-CONT");
        let got = within(c.get(b"k")).await.unwrap();
        assert_eq!(got, Some(Bytes::from_static(b"v")));
        assert_eq!(c.open_connections(), 1);
    }
}
