//! The hand-over: a new process takes the listening sockets from the running one, so a restart
//! (a new binary, or a restart-only key changed) refuses no connection.
//!
//! This is Pingora's graceful upgrade. `lacquer --config FILE --upgrade` binds the Unix socket
//! `server.upgrade_sock` and waits (about five seconds) for the running process's listeners;
//! SIGQUIT to the running process makes it send them there, keep accepting for five seconds
//! beside the new process, then stop accepting and drain ([`super::drain`]). The new process
//! starts with an empty memory tier; with `[cache.memcached]` its first request for each URL
//! reads the shared tier and promotes the object into memory, so the origin does not see the
//! restart.
//!
//! The failure the README used to promise: a SIGQUIT with no new process waiting made Pingora
//! log "Unable to send listener sockets to new process: ENOENT" and exit anyway, taking the
//! listeners with it. [`successor_waiting`] makes SIGQUIT do nothing (logged) in that case.

use pingora_core::server::configuration::Opt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Pingora's command-line options for this start: only `upgrade` matters to Lacquer (the rest
/// is Lacquer's own CLI).
pub fn pingora_options(upgrade: bool) -> Opt {
    Opt {
        upgrade,
        ..Opt::default()
    }
}

/// Whether a new process is waiting for the listeners: its socket exists at `upgrade_sock`.
pub fn successor_waiting(upgrade_sock: &str) -> bool {
    std::fs::metadata(Path::new(upgrade_sock)).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listening_socket_means_a_successor_waits() {
        let dir = std::env::temp_dir().join(format!("lacquer-upgrade-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("upgrade.sock");
        let path = sock.to_str().unwrap();
        assert!(!successor_waiting(path), "nothing there yet");
        std::fs::write(&sock, b"not a socket").unwrap();
        assert!(!successor_waiting(path), "a plain file is no successor");
        std::fs::remove_file(&sock).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(successor_waiting(path));
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
