//! The Django test site (`tests/django_site/`): its pages run by gunicorn, its WebSocket endpoint
//! (Django Channels) by uvicorn, the way Channels' deployment docs split the two; the real
//! application the "in front of a real site" tests put Lacquer in front of. It needs Django,
//! gunicorn, Channels and uvicorn in the project's virtualenv (`.venv`), which
//! `scripts/setup.sh` makes; [`DjangoSite::venv`] says whether they are there, so a test can
//! skip with a clear message where they are not.

use super::child::{read_lossy, send_signal, OwnedChild};
use super::lacquer_process::repo_root;
use super::net::free_port;
use super::temp_dir::TempDir;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The running site, with its own SQLite database: gunicorn serving the pages and uvicorn the
/// WebSocket endpoint (`/ws/echo/`); both stopped on drop.
pub struct DjangoSite {
    pages: Server,
    sockets: Server,
    data: TempDir,
}

/// One of the site's two servers.
struct Server {
    child: OwnedChild,
    pid: u32,
    port: u16,
}

/// The site's directory in the source tree.
pub fn django_site_dir() -> PathBuf {
    repo_root().join("tests/django_site")
}

impl DjangoSite {
    /// The virtualenv's `bin/` directory, when `scripts/setup.sh` has made it with gunicorn and
    /// uvicorn.
    pub fn venv() -> Option<PathBuf> {
        let bin = repo_root().join(".venv/bin");
        (bin.join("gunicorn").exists() && bin.join("uvicorn").exists()).then_some(bin)
    }

    /// Prepares a fresh database (users `alice` / `wonderland` and `bob` / `builder`) and starts
    /// gunicorn with two workers and uvicorn with one; `env` is added to the site's environment
    /// (e.g. `DJANGO_SSL_REDIRECT=1`). Panics if the virtualenv is missing: check [`Self::venv`].
    pub fn start(env: &[(&str, &str)]) -> DjangoSite {
        let bin = DjangoSite::venv().expect("the Django virtualenv (scripts/setup.sh)");
        let data = TempDir::new("django-site");
        let prepared = Command::new(bin.join("python"))
            .arg("prepare.py")
            .current_dir(django_site_dir())
            .env("DJANGO_DATA_DIR", data.path())
            .envs(env.iter().copied())
            .output()
            .expect("python runs");
        assert!(
            prepared.status.success(),
            "prepare.py failed: {}",
            String::from_utf8_lossy(&prepared.stderr)
        );
        let spawn = |program: &str, args: &[&str], port: u16| {
            let log = std::fs::File::create(data.path().join(format!("{program}.log"))).unwrap();
            let child = Command::new(bin.join(program))
                .args(args)
                .current_dir(django_site_dir())
                .env("DJANGO_DATA_DIR", data.path())
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("{program} starts: {e}"));
            let pid = child.id();
            let mut owned = OwnedChild::default();
            owned.hold(child);
            Server {
                child: owned,
                pid,
                port,
            }
        };
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let pages = spawn(
            "gunicorn",
            &["--workers", "2", "--bind", &bind, "site_config.wsgi"],
            port,
        );
        let port = free_port();
        let port_text = port.to_string();
        let sockets = spawn(
            "uvicorn",
            &[
                "site_config.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                &port_text,
                "--ws",
                "websockets-sansio",
                "--lifespan",
                "off",
                "--no-access-log",
            ],
            port,
        );
        let mut site = DjangoSite {
            pages,
            sockets,
            data,
        };
        for (server, program) in [
            (&mut site.pages, "gunicorn"),
            (&mut site.sockets, "uvicorn"),
        ] {
            if server
                .child
                .wait_until_listening(server.port, Duration::from_secs(30))
                .is_err()
            {
                panic!(
                    "{program} did not start: {}",
                    read_lossy(&site.data.path().join(format!("{program}.log")))
                );
            }
        }
        site
    }

    /// Where gunicorn listens (the pages).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.pages.port))
    }

    /// Where uvicorn listens (the WebSocket endpoint).
    pub fn sockets_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.sockets.port))
    }

    /// The requests that reached the app, `"METHOD /path?query"` each, in order (written by the
    /// app before it answers, so a request whose answer the test has is counted); a WebSocket
    /// connection is `"WEBSOCKET /ws/echo/"`.
    pub fn requests(&self) -> Vec<String> {
        read_lossy(&self.data.path().join("requests.log"))
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// How many requests for `method target` reached the app.
    pub fn hits(&self, method: &str, target: &str) -> usize {
        let line = format!("{method} {target}");
        self.requests().iter().filter(|r| **r == line).count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first: gunicorn's master stops its workers, which SIGKILL would orphan
        send_signal(self.pid, "TERM");
        if self.child.wait_exit(Duration::from_secs(5)).is_none() {
            self.child.kill();
        }
    }
}
