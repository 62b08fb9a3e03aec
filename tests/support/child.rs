//! Child processes the tests start (the `lacquer` binary, memcached, one-shot runs of the binary):
//! owned so that they are killed and reaped however the test ends, waited for with a deadline, and
//! their output read back for failure messages.

use super::net::port_accepts;
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a starting child is checked for having opened its port or exited.
const START_POLL: Duration = Duration::from_millis(20);

/// A spawned child process, or none yet; SIGKILLed and reaped on drop, including when the test
/// panics, so no test leaves a server running behind it.
#[derive(Debug, Default)]
pub struct OwnedChild {
    child: Option<Child>,
}

/// Why a child did not start listening.
#[derive(Debug)]
pub enum StartFailure {
    /// It exited first, with this status.
    Exited(ExitStatus),
    /// Its port did not accept within the time allowed; the child has been killed.
    TimedOut,
}

impl OwnedChild {
    /// Takes ownership of `child`, killing the one held before, if any.
    pub fn hold(&mut self, child: Child) {
        self.kill();
        self.child = Some(child);
    }

    /// The held child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether a child is held (spawned and not killed since).
    pub fn is_held(&self) -> bool {
        self.child.is_some()
    }

    /// The exit status if the child has exited (non-blocking).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether a child is held and still running.
    pub fn is_running(&mut self) -> bool {
        self.is_held() && self.exit_status().is_none()
    }

    /// Waits up to `timeout` for the child to exit; returns its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| wait_child_timeout(c, timeout))
    }

    /// SIGKILLs the child and reaps it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until something accepts on `127.0.0.1:<port>`, the child exits, or `timeout`
    /// passes (then the child is killed).
    pub fn wait_until_listening(
        &mut self,
        port: u16,
        timeout: Duration,
    ) -> Result<(), StartFailure> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Err(StartFailure::Exited(status));
            }
            if port_accepts(port) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(StartFailure::TimedOut);
            }
            std::thread::sleep(START_POLL);
        }
    }
}

impl Drop for OwnedChild {
    fn drop(&mut self) {
        self.kill();
    }
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

/// Resident set size of a process in bytes, from /proc.
pub fn rss_bytes(pid: u32) -> u64 {
    status_kb(pid, "VmRSS:") * 1024
}

/// The peak resident memory of process `pid` so far (`VmHWM`), in bytes: what a request that
/// allocated and freed again still shows.
pub fn peak_rss(pid: u32) -> u64 {
    status_kb(pid, "VmHWM:") * 1024
}

/// A field of `/proc/PID/status` given in kB (`field` with its colon, `VmHWM:`).
pub fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A file's contents as (lossy) text; empty if it cannot be read. For a child's log.
pub fn read_lossy(path: &Path) -> String {
    let mut v = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut v);
    }
    String::from_utf8_lossy(&v).into_owned()
}

/// The last `max` bytes of `s` (at a character boundary), for printing a log's end.
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// What a finished run wrote to stderr, as (lossy) text.
pub fn stderr_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
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
