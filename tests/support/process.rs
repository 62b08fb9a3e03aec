//! Running the real `lacquer` binary and a real `memcached` as child processes.
//!
//! Everything spawned here is killed when its handle is dropped, including when the
//! test panics; on a panic the child's stderr tail is printed to help debugging and
//! its temp dir (config, logs) is kept.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long [`LacquerProcess`] waits for its listen port to accept connections.
pub const LACQUER_START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long [`run_lacquer`] lets the binary run before killing it.
pub const RUN_LACQUER_TIMEOUT: Duration = Duration::from_secs(20);

/// How long [`MemcachedProcess`] waits for its port to accept connections.
pub const MEMCACHED_START_TIMEOUT: Duration = Duration::from_secs(10);

/// A currently free TCP port on 127.0.0.1 (bind port 0, read it, release it).
///
/// Another process could take it before you bind it; that race is rare on loopback.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// `127.0.0.1:<port>` as a `SocketAddr`.
pub fn local_addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Whether something accepts TCP connections on `127.0.0.1:<port>` right now.
pub fn port_accepts(port: u16) -> bool {
    TcpStream::connect_timeout(&local_addr(port), Duration::from_millis(200)).is_ok()
}

/// Path of the `lacquer` binary under test: Cargo's `CARGO_BIN_EXE_lacquer` when
/// compiled as an integration test of the `lacquer` package, else the `LACQUER_BIN`
/// environment variable at run time. Panics if neither is available.
pub fn lacquer_bin() -> PathBuf {
    if let Some(p) = option_env!("CARGO_BIN_EXE_lacquer") {
        return PathBuf::from(p);
    }
    match std::env::var_os("LACQUER_BIN") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "lacquer binary unknown: CARGO_BIN_EXE_lacquer is not set at compile time \
             and LACQUER_BIN is not set at run time"
        ),
    }
}

// ---------------------------------------------------------------------------
// Temp dirs
// ---------------------------------------------------------------------------

static TEMP_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed on drop, except when the
/// thread is panicking (then it is kept and its path printed, for post-mortems).
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    /// Creates `<tmp>/<prefix>-<pid>-<n>-<nanos>`.
    pub fn new(prefix: &str) -> TempDir {
        loop {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let n = TEMP_COUNTER.fetch_add(1, Ordering::SeqCst);
            let path =
                std::env::temp_dir().join(format!("{prefix}-{}-{n}-{nanos}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return TempDir { path, keep: false },
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("create temp dir {}: {e}", path.display()),
            }
        }
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `contents` to `<dir>/<name>` and returns the file's path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path.join(name);
        std::fs::write(&p, contents).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        p
    }

    /// Keeps the directory on drop.
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep || std::thread::panicking() {
            eprintln!("[support] keeping temp dir {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn read_lossy(path: &Path) -> String {
    let mut v = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut v);
    }
    String::from_utf8_lossy(&v).into_owned()
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Sends signal `sig` (a name like `"TERM"`, `"HUP"`, `"INT"` or a number) to `pid`
/// using the `kill` command. Returns whether `kill` succeeded.
pub fn send_signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .arg("-s")
        .arg(sig)
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn wait_child_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// lacquer
// ---------------------------------------------------------------------------

/// A running `lacquer` process; killed (SIGKILL) on drop.
pub struct LacquerProcess {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    dir: TempDir,
    config_path: Option<PathBuf>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    pid: u32,
}

impl LacquerProcess {
    /// Starts `lacquer --config <file> <extra_args...>` with `config_toml` written to a
    /// temp file, and waits until it accepts TCP on its listen port.
    ///
    /// The port is taken from a `--listen 127.0.0.1:PORT` / `--listen=...` in
    /// `extra_args` if present, else from the first `127.0.0.1:PORT` on the config's
    /// `listen` line. Panics if neither is found; use [`start_with`](Self::start_with)
    /// to give the port explicitly.
    pub fn start(config_toml: &str, extra_args: &[&str]) -> LacquerProcess {
        let port = listen_port_from(config_toml, extra_args).unwrap_or_else(|| {
            panic!(
                "LacquerProcess::start: no 127.0.0.1:PORT listen address found in \
                 --listen args or the config's `listen` line; use start_with"
            )
        });
        LacquerProcess::start_with(port, config_toml, extra_args)
    }

    /// Starts `lacquer --config <file> <extra_args...>` and waits (up to 15 s) until
    /// `127.0.0.1:<port>` accepts TCP. The config is expected to listen on that port.
    /// Panics with the process's stderr if it exits first or never opens the port.
    pub fn start_with(port: u16, config_toml: &str, extra_args: &[&str]) -> LacquerProcess {
        match LacquerProcess::try_start(port, Some(config_toml), extra_args) {
            Ok(p) => p,
            Err(msg) => panic!("{msg}"),
        }
    }

    /// Starts `lacquer <args...>` with no generated config file (e.g.
    /// `["--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:PORT"]`) and waits until
    /// `127.0.0.1:<port>` accepts TCP.
    pub fn start_args(port: u16, args: &[&str]) -> LacquerProcess {
        match LacquerProcess::try_start(port, None, args) {
            Ok(p) => p,
            Err(msg) => panic!("{msg}"),
        }
    }

    /// Picks a free port and starts lacquer with the config
    ///
    /// ```toml
    /// listen = ["127.0.0.1:PORT"]
    /// upstream = "HOST:PORT"
    /// threads = 2
    /// <extra_toml, verbatim>
    /// ```
    ///
    /// Retries with another port (up to 3 times) if the chosen one turned out taken.
    pub fn start_simple(upstream: SocketAddr, extra_toml: &str) -> LacquerProcess {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let config = simple_config(port, upstream, extra_toml);
            match LacquerProcess::try_start(port, Some(&config), &[]) {
                Ok(p) => return p,
                Err(msg) => {
                    let lower = msg.to_ascii_lowercase();
                    if lower.contains("in use") || lower.contains("addrinuse") {
                        last = msg;
                        continue;
                    }
                    panic!("{msg}");
                }
            }
        }
        panic!("{last}");
    }

    /// Spawns and waits for the port; on failure returns a message including stderr.
    pub fn try_start(
        port: u16,
        config_toml: Option<&str>,
        extra_args: &[&str],
    ) -> Result<LacquerProcess, String> {
        let dir = TempDir::new("lacquer-test");
        let mut args: Vec<String> = Vec::new();
        let config_path = config_toml.map(|c| {
            let p = dir.write("lacquer.toml", c);
            args.push("--config".into());
            args.push(p.to_string_lossy().into_owned());
            p
        });
        args.extend(extra_args.iter().map(|s| s.to_string()));
        let stdout_path = dir.path().join("stdout.log");
        let stderr_path = dir.path().join("stderr.log");
        let mut p = LacquerProcess {
            child: None,
            port,
            args,
            dir,
            config_path,
            stdout_path,
            stderr_path,
            pid: 0,
        };
        p.spawn_and_wait()?;
        Ok(p)
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let bin = lacquer_bin();
        // Append, so a restart keeps the earlier run's output.
        let open = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
        };
        let stdout = open(&self.stdout_path);
        let stderr = open(&self.stderr_path);
        let mut cmd = Command::new(&bin);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if std::env::var_os("RUST_BACKTRACE").is_none() {
            cmd.env("RUST_BACKTRACE", "1");
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("failed to spawn {}: {e}", bin.display()))?;
        self.pid = child.id();
        self.child = Some(child);

        let deadline = Instant::now() + LACQUER_START_TIMEOUT;
        loop {
            if let Some(status) = self.exit_status() {
                return Err(format!(
                    "lacquer ({} {}) exited with {status} before 127.0.0.1:{} accepted \
                     connections; stderr:\n{}",
                    bin.display(),
                    self.args.join(" "),
                    self.port,
                    self.stderr_log()
                ));
            }
            if port_accepts(self.port) {
                // Something accepts; make sure it is not a stranger while lacquer died.
                std::thread::sleep(Duration::from_millis(20));
                if let Some(status) = self.exit_status() {
                    return Err(format!(
                        "lacquer exited with {status} (port {} is in use by something else?); \
                         stderr:\n{}",
                        self.port,
                        self.stderr_log()
                    ));
                }
                // Pingora does not exit when its port is taken: it retries the bind every
                // second. Another test's proxy that took the port meanwhile would answer for this
                // one, so the listening socket must be this process's own.
                if !process_listens_on(self.pid, self.port) {
                    self.kill();
                    return Err(format!(
                        "port {} is in use by another process; lacquer was stopped",
                        self.port
                    ));
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "lacquer did not accept connections on 127.0.0.1:{} within {:?}; stderr:\n{}",
                    self.port,
                    LACQUER_START_TIMEOUT,
                    self.stderr_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The proxy's address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        local_addr(self.port)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port><path>` (a missing leading `/` is added).
    pub fn url(&self, path: &str) -> String {
        let sep = if path.starts_with('/') { "" } else { "/" };
        format!("http://127.0.0.1:{}{}{}", self.port, sep, path)
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr_log(&self) -> String {
        read_lossy(&self.stderr_path)
    }

    /// Everything the process wrote to stdout so far (e.g. access logs).
    pub fn stdout_log(&self) -> String {
        read_lossy(&self.stdout_path)
    }

    /// The process id (of the most recent spawn).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Path of the generated config file, if one was written; rewrite it with
    /// [`write_config`](Self::write_config) for reload tests.
    pub fn config_path(&self) -> Option<&Path> {
        self.config_path.as_deref()
    }

    /// The temp dir holding the config and logs (a scratch place for the test too).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Overwrites the config file (panics if the process was started without one).
    pub fn write_config(&self, config_toml: &str) {
        let p = self
            .config_path
            .as_ref()
            .expect("started without a config file");
        std::fs::write(p, config_toml).expect("rewrite config");
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none() && self.child.is_some()
    }

    /// The exit status if the process has exited (non-blocking).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the process to exit; returns its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| wait_child_timeout(c, timeout))
    }

    /// Sends signal `sig` (e.g. `"TERM"`, `"HUP"`, `"INT"`); returns whether it was delivered.
    pub fn signal(&self, sig: &str) -> bool {
        self.child.is_some() && send_signal(self.pid, sig)
    }

    /// SIGKILLs the process and reaps it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the process and starts it again with the same arguments and config file,
    /// waiting until the same port accepts again.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(5);
        while port_accepts(self.port) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Err(msg) = self.spawn_and_wait() {
            panic!("{msg}");
        }
    }
}

impl Drop for LacquerProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let err = self.stderr_log();
            eprintln!(
                "[support] lacquer on port {} (args: {}) stderr tail:\n{}",
                self.port,
                self.args.join(" "),
                tail(&err, 8192)
            );
        }
    }
}

/// The config written by [`LacquerProcess::start_simple`].
pub fn simple_config(port: u16, upstream: SocketAddr, extra_toml: &str) -> String {
    format!(
        "listen = [\"127.0.0.1:{port}\"]\nupstream = \"{upstream}\"\nthreads = 2\n{extra_toml}\n"
    )
}

/// Finds the listen port for [`LacquerProcess::start`]: a `--listen` argument wins over
/// the config's `listen = [...]` line. Only `127.0.0.1:PORT` addresses are considered.
pub fn listen_port_from(config_toml: &str, args: &[&str]) -> Option<u16> {
    let mut from_args = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == "--listen" {
            if let Some(v) = it.next() {
                from_args = port_in(v).or(from_args);
            }
        } else if let Some(v) = a.strip_prefix("--listen=") {
            from_args = port_in(v).or(from_args);
        }
    }
    if from_args.is_some() {
        return from_args;
    }
    config_toml
        .lines()
        .map(str::trim)
        .find(|l| {
            l.strip_prefix("listen")
                .map(|r| r.trim_start().starts_with('='))
                .unwrap_or(false)
        })
        .and_then(port_in)
}

fn port_in(s: &str) -> Option<u16> {
    let i = s.find("127.0.0.1:")?;
    let digits: String = s[i + "127.0.0.1:".len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Runs `lacquer <args...>` to completion (killed after 20 s) and returns its output,
/// for start-up error, `--help` and `--check-config` tests.
pub fn run_lacquer(args: &[&str]) -> Output {
    run_with_timeout(&lacquer_bin(), args, RUN_LACQUER_TIMEOUT)
}

/// Writes `config_toml` to a temp file and runs `lacquer --check-config <file>`.
pub fn check_config(config_toml: &str) -> Output {
    let dir = TempDir::new("lacquer-check");
    let p = dir.write("lacquer.toml", config_toml);
    run_lacquer(&["--check-config", &p.to_string_lossy()])
}

/// Runs `program args...` with stdin closed, capturing stdout and stderr, killing it
/// after `timeout` (then its status reports the kill). Output written by orphaned
/// grandchildren that keep the pipes open is not waited for beyond 2 s.
pub fn run_with_timeout(program: &Path, args: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("failed to spawn {}: {e}", program.display()));
    let out = collect_pipe(child.stdout.take().expect("stdout pipe"));
    let err = collect_pipe(child.stderr.take().expect("stderr pipe"));
    let status = match wait_child_timeout(&mut child, timeout) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            child.wait().expect("wait for killed child")
        }
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    Output {
        status,
        stdout: out.finish(deadline),
        stderr: err.finish(deadline),
    }
}

/// A pipe drained into memory by a background thread.
struct PipeCollector {
    data: Arc<Mutex<Vec<u8>>>,
    done: std::sync::mpsc::Receiver<()>,
}

fn collect_pipe(mut pipe: impl Read + Send + 'static) -> PipeCollector {
    let data = Arc::new(Mutex::new(Vec::new()));
    let (tx, done) = std::sync::mpsc::channel();
    let sink = data.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => sink.lock().unwrap().extend_from_slice(&buf[..n]),
            }
        }
        let _ = tx.send(());
    });
    PipeCollector { data, done }
}

impl PipeCollector {
    /// Waits (until `deadline` at most) for EOF, then returns what was read.
    fn finish(self, deadline: Instant) -> Vec<u8> {
        let _ = self
            .done
            .recv_timeout(deadline.saturating_duration_since(Instant::now()));
        let v = self.data.lock().unwrap().clone();
        v
    }
}

// ---------------------------------------------------------------------------
// memcached
// ---------------------------------------------------------------------------

/// Path of the memcached binary; panics with install instructions if absent.
pub fn memcached_bin() -> PathBuf {
    let fixed = PathBuf::from("/usr/bin/memcached");
    if fixed.exists() {
        return fixed;
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("memcached");
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("memcached is not installed: run `apt-get install memcached`");
}

/// A real memcached (`-l 127.0.0.1 -U 0 -m 64`) on a free port; killed on drop.
pub struct MemcachedProcess {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl MemcachedProcess {
    /// Starts memcached on a free port and waits until it accepts connections.
    /// Retries with another port if the chosen one turned out taken.
    pub fn start() -> MemcachedProcess {
        let mut last = String::new();
        for _ in 0..3 {
            let mut m = MemcachedProcess {
                child: None,
                port: free_port(),
                dir: TempDir::new("memcached-test"),
            };
            match m.spawn_and_wait() {
                Ok(()) => return m,
                Err(e) => last = e,
            }
        }
        panic!("{last}");
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let bin = memcached_bin();
        let stderr_path = self.dir.path().join("memcached.log");
        let stderr = File::create(&stderr_path).expect("create memcached log");
        let port = self.port.to_string();
        // `-u root` is needed (and only used) when running as root.
        let child = Command::new(&bin)
            .args([
                "-p",
                &port,
                "-l",
                "127.0.0.1",
                "-U",
                "0",
                "-m",
                "64",
                "-u",
                "root",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("failed to spawn {}: {e}", bin.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + MEMCACHED_START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "memcached exited with {status} before accepting on port {}: {}",
                    self.port,
                    read_lossy(&stderr_path)
                ));
            }
            if port_accepts(self.port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "memcached did not accept on port {} within {:?}: {}",
                    self.port,
                    MEMCACHED_START_TIMEOUT,
                    read_lossy(&stderr_path)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        local_addr(self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `"127.0.0.1:<port>"`, the form used in the proxy's config.
    pub fn addr_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether the memcached process is running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILLs memcached and reaps it (its contents are lost). Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills memcached (if running) and starts a fresh, empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let mut last = String::new();
        for _ in 0..20 {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(e) => {
                    last = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!("memcached restart on port {} failed: {last}", self.port);
    }

    /// Sends one text-protocol command (without the trailing CRLF; `data` is appended as
    /// a data block for storage commands) and returns the raw reply. Waits for a
    /// terminating line (`END`, `OK`, `STORED`, `ERROR`, ...) or 2 s of silence.
    pub fn command(&self, cmd: &str, data: Option<&[u8]>) -> String {
        let mut s = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect to memcached {}: {e}", self.addr()));
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        let mut req = Vec::from(cmd.as_bytes());
        req.extend_from_slice(b"\r\n");
        if let Some(d) = data {
            req.extend_from_slice(d);
            req.extend_from_slice(b"\r\n");
        }
        s.write_all(&req).expect("write to memcached");
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if reply_complete(&out) {
                break;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `stats` as a name → value map.
    pub fn stats(&self) -> HashMap<String, String> {
        self.command("stats", None)
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("STAT"), Some(k), Some(v)) => Some((k.to_string(), v.trim().to_string())),
                    _ => None,
                }
            })
            .collect()
    }

    /// One numeric stat (e.g. `"curr_items"`, `"get_hits"`, `"cmd_set"`).
    pub fn stat(&self, name: &str) -> Option<u64> {
        self.stats().get(name).and_then(|v| v.parse().ok())
    }

    /// Number of items currently stored (`curr_items`).
    pub fn item_count(&self) -> u64 {
        self.stat("curr_items").unwrap_or(0)
    }

    /// Removes every item (`flush_all`).
    pub fn flush_all(&self) {
        let r = self.command("flush_all", None);
        assert!(r.starts_with("OK"), "flush_all failed: {r:?}");
    }
}

/// Whether process `pid` holds the socket listening on TCP `port` (from `/proc/net/tcp{,6}` and
/// the process's file descriptors).
fn process_listens_on(pid: u32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let port_suffix = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == LISTEN && cols[1].ends_with(&port_suffix) {
                inodes.push(format!("socket:[{}]", cols[9]));
            }
        }
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .map(|target| {
                inodes
                    .iter()
                    .any(|inode| target.as_os_str() == inode.as_str())
            })
            .unwrap_or(false)
    })
}

fn reply_complete(out: &[u8]) -> bool {
    if !out.ends_with(b"\r\n") {
        return false;
    }
    let text = String::from_utf8_lossy(out);
    let last = text
        .trim_end_matches("\r\n")
        .rsplit("\r\n")
        .next()
        .unwrap_or("")
        .to_string();
    const TERMINALS: [&str; 9] = [
        "END",
        "OK",
        "STORED",
        "NOT_STORED",
        "EXISTS",
        "NOT_FOUND",
        "DELETED",
        "TOUCHED",
        "ERROR",
    ];
    TERMINALS.contains(&last.as_str())
        || last.starts_with("VERSION ")
        || last.starts_with("CLIENT_ERROR")
        || last.starts_with("SERVER_ERROR")
        || (!text.starts_with("VALUE")
            && !text.starts_with("STAT")
            && last.chars().all(|c| c.is_ascii_digit())
            && !last.is_empty())
}

impl Drop for MemcachedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
