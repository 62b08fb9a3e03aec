//! What the packages ship, checked on every run (building the .deb itself is nightly:
//! `packaging/build-deb.sh`): the packaged config validates as it is, the man page is generated
//! from the CLI and documents the signals, and the unit reloads through SIGHUP.

use lacquer_test_support as support;

use std::process::Command;
use support::*;

#[test]
fn the_packaged_config_is_valid_as_shipped() {
    let out = check_config(include_str!("../packaging/lacquer.toml"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
}

#[test]
fn the_man_page_documents_every_flag_and_the_signals() {
    let out = Command::new(env!("CARGO_BIN_EXE_lacquer-man"))
        .output()
        .expect("run lacquer-man");
    assert!(out.status.success());
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(
        page.starts_with(".ie") || page.contains(".TH lacquer 1"),
        "{page}"
    );
    let help = run_lacquer(&["--help"]);
    let help = String::from_utf8_lossy(&help.stdout).to_string();
    // every long flag of --help appears in the page (roff escapes the dashes)
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .collect();
    assert!(flags.len() > 10 && flags.contains(&"--upgrade"), "{help}");
    for flag in flags {
        let flag = flag.trim_end_matches([',', '=']);
        let flag = flag.split('<').next().unwrap();
        assert!(
            page.contains(&flag.replace('-', "\\-")),
            "{flag} missing from the man page"
        );
    }
    for signal in [
        "SIGHUP",
        "SIGTERM",
        "SIGQUIT",
        "SIGINT",
        "/etc/lacquer/lacquer.toml",
    ] {
        assert!(page.contains(signal), "{signal} missing from the man page");
    }
}

#[test]
fn the_unit_reloads_with_sighup_after_checking_the_file() {
    let unit = include_str!("../packaging/systemd/lacquer.service");
    let reloads: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecReload="))
        .collect();
    assert_eq!(
        reloads,
        [
            "/usr/bin/lacquer --check-config /etc/lacquer/lacquer.toml",
            "/bin/kill -HUP $MAINPID"
        ]
    );
    assert!(unit.contains("\nUser=lacquer\n") && unit.contains("\nProtectSystem=strict\n"));
}
