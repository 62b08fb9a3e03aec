//! The binary under test: the real `lacquer` started as a child process with a generated config
//! (one origin, or several behind the balancer), run once to completion for start-up errors, and
//! read back through its logs and its admin `/stats`.
//!
//! A running proxy is killed when its handle is dropped, including when the test panics; on a
//! panic its stderr tail is printed to help debugging and its temp dir (config, logs) is kept.

use super::child::{read_lossy, run_with_timeout, send_signal, tail, OwnedChild, StartFailure};
use super::client::{get, Resp};
use super::net::{free_port, local_addr, port_accepts, process_listens_on};
use super::poll::poll_until;
use super::temp_dir::TempDir;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::Duration;

/// How long [`LacquerProcess`] waits for its listen port to accept connections.
pub const LACQUER_START_TIMEOUT: Duration = Duration::from_secs(15);

/// How long [`run_lacquer`] lets the binary run before killing it.
pub const RUN_LACQUER_TIMEOUT: Duration = Duration::from_secs(20);

/// Path of the `lacquer` binary under test: the `LACQUER_BIN` environment variable when set
/// (to run the tests against another build), else the one cargo built for the tests
/// (`CARGO_BIN_EXE_lacquer`, which cargo sets when it runs an integration test).
pub fn lacquer_bin() -> PathBuf {
    match std::env::var_os("LACQUER_BIN").or_else(|| std::env::var_os("CARGO_BIN_EXE_lacquer")) {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "lacquer binary unknown: neither LACQUER_BIN nor CARGO_BIN_EXE_lacquer (set by \
             `cargo test`) is set"
        ),
    }
}

/// The repository's root (this crate is `tests/support`), for the files tests read or run.
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// An example program of this package (`examples/NAME.rs`), built for the profile the tests
/// run under. (`cargo test --all-targets` builds examples as test harnesses, so the program is
/// always built here.) The build must reuse what `cargo test --workspace` built: it is made
/// with `--workspace` (the dependencies' features resolved as there) and without the variables
/// cargo sets for a test (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, `OUT_DIR`...), which build
/// scripts such as ring's watch. Otherwise it rebuilt a third of the dependency tree (47 s of
/// CI), and the next `cargo test` rebuilt it back.
pub fn example_bin(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/<test> -> target/<profile>/examples/<name>
    let profile_dir = test_exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("examples").join(name);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec!["build", "--quiet", "--workspace", "--example", name];
    if profile_dir.ends_with("release") {
        args.push("--release");
    }
    let mut build = Command::new(cargo);
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if SET_FOR_TESTS.contains(&key_text.as_ref())
            || key_text.starts_with("CARGO_PKG_")
            || key_text.starts_with("CARGO_BIN_EXE_")
        {
            build.env_remove(&key);
        }
    }
    let status = build
        .args(&args)
        .current_dir(repo_root())
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --example {name} failed");
    assert!(bin.exists(), "{} not built", bin.display());
    bin
}

/// Variables cargo sets for a test process (beside `CARGO_PKG_*` and `CARGO_BIN_EXE_*`), not
/// passed on to a nested cargo ([`example_bin`]).
const SET_FOR_TESTS: [&str; 9] = [
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_MANIFEST_LINKS",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// A running `lacquer` process; killed (SIGKILL) on drop.
pub struct LacquerProcess {
    child: OwnedChild,
    port: u16,
    args: Vec<String>,
    dir: TempDir,
    config_path: Option<PathBuf>,
    stdout_path: PathBuf,
    stderr_path: PathBuf,
    pid: u32,
    /// Another program than `lacquer` (one that embeds it, see [`example_bin`]).
    program: Option<PathBuf>,
    /// A command the binary is run through (its arguments follow), e.g. one that gives it a
    /// private mount namespace; empty: run directly.
    launcher: Vec<String>,
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
        LacquerProcess::start_on_free_port(|port| simple_config(port, upstream, extra_toml))
    }

    /// Picks a free port, starts lacquer with `config_for(port)` (which must listen on
    /// `127.0.0.1:<port>`) and waits until it accepts. Retries with another port (up to 3 times)
    /// if the chosen one turned out taken, as another test may bind it first.
    pub fn start_on_free_port(config_for: impl Fn(u16) -> String) -> LacquerProcess {
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            match LacquerProcess::try_start(port, Some(&config_for(port)), &[]) {
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

    /// Starts lacquer with `config_for(port, admin_port)` (which must listen on
    /// `127.0.0.1:<port>` and put the admin listener on `127.0.0.1:<admin_port>`), both ports
    /// from [`free_port`], and returns it with its admin port once the process holds both
    /// listening sockets.
    ///
    /// Pingora retries a failed bind every second instead of exiting, so an admin port that
    /// another process took would answer a test's `/metrics` scrape in the node's place: when
    /// either socket is not this process's own, it is stopped and started again on two other
    /// ports (up to 3 times).
    pub fn start_with_admin(config_for: impl Fn(u16, u16) -> String) -> (LacquerProcess, u16) {
        let mut last = String::new();
        for _ in 0..3 {
            let (port, admin) = (free_port(), free_port());
            if port == admin {
                continue;
            }
            match LacquerProcess::try_start(port, Some(&config_for(port, admin)), &[]) {
                Ok(mut p) => {
                    if poll_until(Duration::from_secs(10), || process_listens_on(p.pid, admin)) {
                        return (p, admin);
                    }
                    p.kill();
                    last = format!(
                        "lacquer never held its admin port {admin}; stderr:\n{}",
                        p.stderr_log()
                    );
                }
                Err(msg) => {
                    let lower = msg.to_ascii_lowercase();
                    if !(lower.contains("in use") || lower.contains("addrinuse")) {
                        panic!("{msg}");
                    }
                    last = msg;
                }
            }
        }
        panic!("{last}");
    }

    /// [`Self::start_simple`] with an admin listener, on ports as [`Self::start_with_admin`]
    /// picks them; `extra_toml` must not have an `[admin]` table of its own (it is appended
    /// last). Returns the process and its admin port.
    pub fn start_simple_with_admin(
        upstream: SocketAddr,
        extra_toml: &str,
    ) -> (LacquerProcess, u16) {
        LacquerProcess::start_with_admin(|port, admin| {
            format!(
                "{}[admin]\nlisten = \"127.0.0.1:{admin}\"\n",
                simple_config(port, upstream, extra_toml)
            )
        })
    }

    /// [`Self::start_on_free_port`] with another program than `lacquer`, one that embeds it and
    /// takes the same flags (an example, see [`example_bin`]).
    pub fn start_program_on_free_port(
        program: &Path,
        config_for: impl Fn(u16) -> String,
    ) -> LacquerProcess {
        let port = free_port();
        match LacquerProcess::try_start_program(Some(program), port, Some(&config_for(port)), &[]) {
            Ok(p) => p,
            Err(msg) => panic!("{msg}"),
        }
    }

    /// [`Self::start_on_free_port`] run through `launcher` (a command that ends by executing
    /// its trailing arguments in the same process, as `unshare -m sh -c '... && exec "$@"' sh`
    /// does, so the pid is lacquer's).
    pub fn start_on_free_port_via(
        launcher: &[&str],
        config_for: impl Fn(u16) -> String,
    ) -> LacquerProcess {
        let port = free_port();
        let mut p = LacquerProcess::unstarted(None, port, Some(&config_for(port)), &[]);
        p.launcher = launcher.iter().map(|s| s.to_string()).collect();
        if let Err(msg) = p.spawn_and_wait() {
            panic!("{msg}");
        }
        p
    }

    /// Spawns and waits for the port; on failure returns a message including stderr.
    pub fn try_start(
        port: u16,
        config_toml: Option<&str>,
        extra_args: &[&str],
    ) -> Result<LacquerProcess, String> {
        LacquerProcess::try_start_program(None, port, config_toml, extra_args)
    }

    /// [`Self::try_start`] of `program` (`None`: `lacquer`).
    fn try_start_program(
        program: Option<&Path>,
        port: u16,
        config_toml: Option<&str>,
        extra_args: &[&str],
    ) -> Result<LacquerProcess, String> {
        let mut p = LacquerProcess::unstarted(program, port, config_toml, extra_args);
        p.spawn_and_wait()?;
        Ok(p)
    }

    /// The handle, its config file written, before the process is spawned.
    fn unstarted(
        program: Option<&Path>,
        port: u16,
        config_toml: Option<&str>,
        extra_args: &[&str],
    ) -> LacquerProcess {
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
        LacquerProcess {
            child: OwnedChild::default(),
            port,
            args,
            dir,
            config_path,
            stdout_path,
            stderr_path,
            pid: 0,
            program: program.map(Path::to_path_buf),
            launcher: Vec::new(),
        }
    }

    /// Starts the binary with this handle's arguments, output appended to its logs.
    fn spawn(&mut self) {
        let bin = self.program.clone().unwrap_or_else(lacquer_bin);
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
        let mut cmd = match self.launcher.split_first() {
            None => Command::new(&bin),
            Some((launcher, launcher_args)) => {
                let mut cmd = Command::new(launcher);
                cmd.args(launcher_args).arg(&bin);
                cmd
            }
        };
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if std::env::var_os("RUST_BACKTRACE").is_none() {
            cmd.env("RUST_BACKTRACE", "1");
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("failed to spawn {}: {e}", bin.display()));
        self.pid = child.id();
        self.child.hold(child);
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let bin = self.program.clone().unwrap_or_else(lacquer_bin);
        self.spawn();

        match self
            .child
            .wait_until_listening(self.port, LACQUER_START_TIMEOUT)
        {
            Ok(()) => {}
            Err(StartFailure::Exited(status)) => {
                return Err(format!(
                    "lacquer ({} {}) exited with {status} before 127.0.0.1:{} accepted \
                     connections; stderr:\n{}",
                    bin.display(),
                    self.args.join(" "),
                    self.port,
                    self.stderr_log()
                ))
            }
            Err(StartFailure::TimedOut) => {
                return Err(format!(
                    "lacquer did not accept connections on 127.0.0.1:{} within {:?}; stderr:\n{}",
                    self.port,
                    LACQUER_START_TIMEOUT,
                    self.stderr_log()
                ))
            }
        }
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
        // Pingora does not exit when its port is taken: it retries the bind every second.
        // Another test's proxy that took the port meanwhile would answer for this one, so the
        // listening socket must be this process's own.
        if !process_listens_on(self.pid, self.port) {
            self.kill();
            return Err(format!(
                "port {} is in use by another process; lacquer was stopped",
                self.port
            ));
        }
        // The admin listener is another Pingora service, bound by its own thread: the proxy
        // port accepting says nothing of it, and a test's first admin call would be refused.
        let admin = self
            .config_path
            .as_ref()
            .and_then(|path| admin_port_from(&std::fs::read_to_string(path).unwrap_or_default()));
        if let Some(admin) = admin {
            if !poll_until(LACQUER_START_TIMEOUT, || {
                process_listens_on(self.pid, admin) || self.exit_status().is_some()
            }) || !process_listens_on(self.pid, admin)
            {
                let stderr = self.stderr_log();
                self.kill();
                return Err(format!(
                    "lacquer never held its admin port {admin} (in use by another process?); \
                     stderr:\n{stderr}"
                ));
            }
        }
        Ok(())
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

    /// Fails the test if the process has panicked (a worker's panic ends only its request, so
    /// the answers alone do not show it), with the lines around the first panic.
    pub fn assert_no_panic(&self) {
        let log = self.stderr_log();
        if let Some(at) = log.find("panicked") {
            let from = log[..at].rfind('\n').map_or(0, |i| i + 1);
            let to = log[at..].find("\n\n").map_or(log.len(), |i| at + i);
            panic!(
                "the proxy panicked:\n{}",
                &log[log.floor_char_boundary(from.saturating_sub(400))..to]
            );
        }
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
        self.child.is_running()
    }

    /// The exit status if the process has exited (non-blocking).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.exit_status()
    }

    /// Waits up to `timeout` for the process to exit; returns its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.child.wait_exit(timeout)
    }

    /// Sends signal `sig` (e.g. `"TERM"`, `"HUP"`, `"INT"`); returns whether it was delivered.
    pub fn signal(&self, sig: &str) -> bool {
        self.child.is_held() && send_signal(self.pid, sig)
    }

    /// SIGKILLs the process and reaps it. Idempotent.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Hands this process's listeners over to a new one (Pingora's graceful upgrade): starts
    /// `lacquer` with the same arguments plus `--upgrade`, waits until it waits on
    /// `upgrade_sock`, sends this process SIGQUIT, and returns the successor once it holds the
    /// listening socket. This process keeps running (it drains and exits on its own); its
    /// handle still kills it on drop. Panics with both processes' stderr on failure.
    pub fn hand_over(&self, upgrade_sock: &Path) -> LacquerProcess {
        let mut args = self.args.clone();
        args.push("--upgrade".into());
        let dir = TempDir::new("lacquer-successor");
        let mut next = LacquerProcess {
            child: OwnedChild::default(),
            port: self.port,
            args,
            stdout_path: dir.path().join("stdout.log"),
            stderr_path: dir.path().join("stderr.log"),
            dir,
            config_path: self.config_path.clone(),
            pid: 0,
            program: self.program.clone(),
            launcher: self.launcher.clone(),
        };
        next.spawn();
        let waiting = poll_until(LACQUER_START_TIMEOUT, || {
            upgrade_sock.exists() || !next.child.is_running()
        });
        assert!(
            waiting && next.child.is_running(),
            "the successor never waited on {}; its stderr:\n{}",
            upgrade_sock.display(),
            next.stderr_log()
        );
        assert!(self.signal("QUIT"), "SIGQUIT to {} failed", self.pid);
        let took_over = poll_until(LACQUER_START_TIMEOUT, || {
            process_listens_on(next.pid, next.port) || !next.child.is_running()
        });
        assert!(
            took_over && next.child.is_running(),
            "the successor did not take port {} over; its stderr:\n{}\nthe old process's:\n{}",
            next.port,
            next.stderr_log(),
            self.stderr_log()
        );
        next
    }

    /// Kills the process and starts it again with the same arguments and config file,
    /// waiting until the same port accepts again.
    pub fn restart(&mut self) {
        self.kill();
        // the old socket may linger a moment; the new process would retry its bind meanwhile
        poll_until(Duration::from_secs(5), || !port_accepts(self.port));
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

/// The port of the `[admin]` table's `listen = "127.0.0.1:PORT"` line, if the config has one.
pub fn admin_port_from(config_toml: &str) -> Option<u16> {
    let mut in_admin = false;
    for line in config_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            in_admin = line == "[admin]";
        } else if in_admin
            && line
                .strip_prefix("listen")
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        {
            return port_in(line);
        }
    }
    None
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

/// `[[upstreams]]` entries for these addresses and weights.
pub fn upstreams_toml(backends: &[(SocketAddr, u32)]) -> String {
    backends
        .iter()
        .map(|(addr, weight)| format!("[[upstreams]]\naddress = \"{addr}\"\nweight = {weight}\n"))
        .collect()
}

/// Starts lacquer in front of `backends` (address, weight) with `extra` TOML (which must not
/// open `[[upstreams]]`-like arrays after tables it relies on; it is appended last).
pub fn start_balancer(backends: &[(SocketAddr, u32)], extra: &str) -> LacquerProcess {
    LacquerProcess::start_on_free_port(|port| {
        format!(
            "listen = [\"127.0.0.1:{port}\"]\nthreads = 2\n{}\n{extra}\n",
            upstreams_toml(backends)
        )
    })
}

/// Waits (generously) until lacquer's stderr contains `needle`.
pub fn wait_for_log(proc: &LacquerProcess, needle: &str, timeout: Duration) -> bool {
    poll_until(timeout, || proc.stderr_log().contains(needle))
}

/// Reads `/stats` from the admin endpoint and returns the number after `"key":`.
pub async fn admin_stat(admin_port: u16, key: &str) -> u64 {
    let resp = get(&format!("http://127.0.0.1:{admin_port}/stats"), &[]).await;
    stat_in(&resp.text(), key)
}

/// The number after the first `"key":` in `text` (`/stats`, or one object of it).
pub fn stat_in(text: &str, key: &str) -> u64 {
    let needle = format!("\"{key}\":");
    let start = text
        .find(&needle)
        .unwrap_or_else(|| panic!("{key} not in {text}"))
        + needle.len();
    text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

/// Waits until the node's `/stats` counter `key` reaches `n`, for at most `timeout`; returns its
/// last value (the caller asserts on it, so a wait that runs out fails with its own message).
pub async fn wait_for_stat(admin_port: u16, key: &str, n: u64, timeout: Duration) -> u64 {
    wait_for_stat_where(admin_port, key, timeout, |value| value >= n).await
}

/// Polls `/stats` until `key` (a gauge) is at most `n`, or `timeout`; returns the last value.
pub async fn wait_for_stat_at_most(admin_port: u16, key: &str, n: u64, timeout: Duration) -> u64 {
    wait_for_stat_where(admin_port, key, timeout, |value| value <= n).await
}

/// Polls `/stats` until `key` satisfies `done`, or `timeout`; returns the last value.
async fn wait_for_stat_where(
    admin_port: u16,
    key: &str,
    timeout: Duration,
    done: impl Fn(u64) -> bool,
) -> u64 {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let value = admin_stat(admin_port, key).await;
        if done(value) || std::time::Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(super::poll::POLL_INTERVAL).await;
    }
}

/// Calls the admin invalidation API: `POST http://127.0.0.1:{admin_port}{path}` with the JSON
/// `body` and, when given, `Authorization: Bearer {token}`.
pub async fn admin_post(admin_port: u16, path: &str, token: Option<&str>, body: &str) -> Resp {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(value) = bearer.as_deref() {
        headers.push(("authorization", value));
    }
    let url = format!("http://127.0.0.1:{admin_port}{path}");
    super::client::request("POST", &url, &headers, Some(body.to_string().into())).await
}

/// The `[admin]` and `[invalidation]` TOML of a node whose invalidation API takes `token` (from
/// the file `token_file`), named `name`.
pub fn admin_toml(admin_port: u16, token_file: &Path, name: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:{admin_port}\"\ntoken_file = \"{}\"\n\
         [invalidation]\nnode_name = \"{name}\"\n",
        token_file.display()
    )
}
