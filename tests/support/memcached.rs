//! Memcached servers for the shared-tier tests: a real `memcached` on a free loopback port, killed
//! on drop, with a text-protocol side door to plant values and read its stats.

use super::child::{read_lossy, send_signal, OwnedChild, StartFailure};
use super::net::{free_port, local_addr, process_listens_on};
use super::temp_dir::TempDir;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long [`MemcachedProcess`] waits for its port to accept connections.
pub const MEMCACHED_START_TIMEOUT: Duration = Duration::from_secs(10);

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
    child: OwnedChild,
    port: u16,
    dir: TempDir,
    /// Options given after the usual ones ([`MemcachedProcess::start_with`]).
    extra_args: Vec<String>,
}

impl MemcachedProcess {
    /// Starts memcached on a free port and waits until it accepts connections there.
    /// Retries with another port if the chosen one turned out taken (by a server of another
    /// test, which may have bound it first and will leave with its test).
    pub fn start() -> MemcachedProcess {
        MemcachedProcess::start_with(&[])
    }

    /// [`MemcachedProcess::start`] with `extra_args` after the usual options (`-C`, say: no CAS
    /// tokens); a restart keeps them.
    pub fn start_with(extra_args: &[&str]) -> MemcachedProcess {
        let mut last = String::new();
        for _ in 0..3 {
            let mut m = MemcachedProcess {
                child: OwnedChild::default(),
                port: free_port(),
                dir: TempDir::new("memcached-test"),
                extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
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
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("failed to spawn {}: {e}", bin.display()))?;
        self.child.hold(child);
        match self
            .child
            .wait_until_listening(self.port, MEMCACHED_START_TIMEOUT)
        {
            Ok(())
                if self
                    .child
                    .pid()
                    .is_some_and(|pid| process_listens_on(pid, self.port)) =>
            {
                Ok(())
            }
            Ok(()) => {
                self.child.kill();
                Err(format!(
                    "port {} accepts, but another process listens there",
                    self.port
                ))
            }
            Err(StartFailure::Exited(status)) => Err(format!(
                "memcached exited with {status} before accepting on port {}: {}",
                self.port,
                read_lossy(&stderr_path)
            )),
            Err(StartFailure::TimedOut) => Err(format!(
                "memcached did not accept on port {} within {:?}: {}",
                self.port,
                MEMCACHED_START_TIMEOUT,
                read_lossy(&stderr_path)
            )),
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

    /// The value stored under `key`, byte for byte (`None` when absent).
    pub fn get_raw(&self, key: &str) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect_timeout(&self.addr(), Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("connect to memcached {}: {e}", self.addr()));
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        s.write_all(format!("get {key}\r\n").as_bytes())
            .expect("write to memcached");
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if out.ends_with(b"END\r\n") {
                break;
            }
        }
        let header_end = out.windows(2).position(|w| w == b"\r\n")?;
        let header = String::from_utf8_lossy(&out[..header_end]).into_owned();
        let len: usize = header
            .strip_prefix("VALUE ")?
            .split(' ')
            .nth(2)?
            .parse()
            .ok()?;
        Some(out[header_end + 2..header_end + 2 + len].to_vec())
    }

    /// Stores `value` under `key` for `ttl` seconds, byte for byte.
    pub fn set_raw(&self, key: &str, value: &[u8], ttl: u32) {
        let reply = self.command(&format!("set {key} 0 {ttl} {}", value.len()), Some(value));
        assert!(reply.starts_with("STORED"), "set {key}: {reply}");
    }

    /// Whether the memcached process is running.
    pub fn is_running(&mut self) -> bool {
        self.child.is_running()
    }

    /// SIGKILLs memcached and reaps it (its contents are lost). Idempotent.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// SIGSTOPs memcached, as a hung server: connections are still accepted by the kernel, but
    /// nothing is answered. Returns once every thread is stopped (`kill` only queues the signal).
    pub fn freeze(&self) {
        self.signal_and_wait("STOP", true);
    }

    /// SIGCONTs a frozen memcached; it then handles what queued up meanwhile.
    pub fn thaw(&self) {
        self.signal_and_wait("CONT", false);
    }

    fn signal_and_wait(&self, sig: &str, stopped: bool) {
        let pid = self.child.pid().expect("memcached is running");
        assert!(send_signal(pid, sig), "kill -{sig} {pid}");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while all_threads_stopped(pid) != stopped {
            assert!(
                std::time::Instant::now() < deadline,
                "memcached ignored SIG{sig}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Whether this server holds `key` (read directly, not through any proxy).
    pub fn holds(&self, key: &str) -> bool {
        self.command(&format!("get {key}"), None)
            .starts_with("VALUE")
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

/// Whether every thread of process `pid` is in the stopped state (`T` in `/proc/.../stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // the state follows the parenthesised command name
        stat.rsplit(") ")
            .next()
            .is_some_and(|rest| rest.starts_with('T'))
    })
}

/// Whether `out` ends with a complete memcached text-protocol reply (a terminal line).
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
