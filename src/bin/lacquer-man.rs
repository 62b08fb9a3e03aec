//! `lacquer-man`: writes the lacquer(1) man page to stdout, generated from the CLI definition
//! (`lacquer::config::Cli`) so the page cannot drift from `lacquer --help`, plus the sections
//! clap does not know: signals, files, exit status. `packaging/build-deb.sh` runs it; it is a
//! binary of its own so `lacquer` itself does not carry the generator.

use clap::CommandFactory;
use std::io::Write;

/// What the man page says beyond the flags, in roff.
const EXTRA_SECTIONS: &str = r#".SH SIGNALS
.TP
.B SIGHUP
Reload the configuration file: it is read and validated again; a valid file is applied without
dropping connections or emptying the memory tier (keys that need a restart keep their running
value and are named in the log); an invalid one is refused, logged, and the running
configuration stays. The access log file is reopened (for logrotate).
.TP
.B SIGTERM
Stop accepting connections, let requests in flight finish for at most \fBshutdown_timeout\fR
(10 s by default), exit as soon as none is left.
.TP
.B SIGQUIT
Hand the listening sockets to a new process started with \fB\-\-upgrade\fR (same
\fBserver.upgrade_sock\fR), keep serving beside it for five seconds, then drain as for SIGTERM.
Ignored, and logged, when no new process is waiting.
.TP
.B SIGINT
Stop at once.
.SH FILES
.TP
.I /etc/lacquer/lacquer.toml
The configuration file of the Debian package and the container image.
.TP
.I /run/lacquer/upgrade.sock
The hand-over socket under systemd (\fBserver.upgrade_sock\fR).
.SH EXIT STATUS
0 after a shutdown, 1 when the server cannot start, 2 for an invalid configuration.
.SH SEE ALSO
The configuration reference is README.md, installed in /usr/share/doc/lacquer.
"#;

fn main() -> std::io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(lacquer::config::Cli::command()).render(&mut page)?;
    page.extend_from_slice(EXTRA_SECTIONS.as_bytes());
    std::io::stdout().write_all(&page)
}
