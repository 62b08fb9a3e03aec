//! The Django test site (`tests/django_site/`) run by gunicorn: the real application the
//! "in front of a real site" tests put Lacquer in front of. It needs Django and gunicorn in the
//! project's virtualenv (`.venv`), which `scripts/setup.sh` makes; [`DjangoSite::venv`] says
//! whether they are there, so a test can skip with a clear message where they are not.

use super::child::{read_lossy, send_signal, OwnedChild};
use super::net::free_port;
use super::temp_dir::TempDir;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A running gunicorn serving the site, with its own SQLite database; stopped on drop.
pub struct DjangoSite {
    child: OwnedChild,
    pid: u32,
    port: u16,
    data: TempDir,
}

/// The site's directory in the source tree.
pub fn django_site_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/django_site")
}

impl DjangoSite {
    /// The virtualenv's `bin/` directory, when `scripts/setup.sh` has made it with gunicorn.
    pub fn venv() -> Option<PathBuf> {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin");
        bin.join("gunicorn").exists().then_some(bin)
    }

    /// Prepares a fresh database (users `alice` / `wonderland` and `bob` / `builder`) and starts
    /// gunicorn with two workers; `env` is added to the site's environment (e.g.
    /// `DJANGO_SSL_REDIRECT=1`). Panics if the virtualenv is missing: check [`Self::venv`].
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
        let port = free_port();
        let log = std::fs::File::create(data.path().join("gunicorn.log")).unwrap();
        let child = Command::new(bin.join("gunicorn"))
            .args(["--workers", "2", "--bind", &format!("127.0.0.1:{port}")])
            .arg("site_config.wsgi")
            .current_dir(django_site_dir())
            .env("DJANGO_DATA_DIR", data.path())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("gunicorn starts");
        let pid = child.id();
        let mut owned = OwnedChild::default();
        owned.hold(child);
        if owned
            .wait_until_listening(port, Duration::from_secs(30))
            .is_err()
        {
            panic!(
                "gunicorn did not start: {}",
                read_lossy(&data.path().join("gunicorn.log"))
            );
        }
        DjangoSite {
            child: owned,
            pid,
            port,
            data,
        }
    }

    /// Where gunicorn listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The requests that reached the app, `"METHOD /path?query"` each, in order (written by the
    /// app before it answers, so a request whose answer the test has is counted).
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

impl Drop for DjangoSite {
    fn drop(&mut self) {
        // SIGTERM first: gunicorn's master stops its workers, which SIGKILL would orphan
        send_signal(self.pid, "TERM");
        if self.child.wait_exit(Duration::from_secs(5)).is_none() {
            self.child.kill();
        }
    }
}
