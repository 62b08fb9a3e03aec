//! SIGUSR1 reopens the access log file, as logrotate's `postrotate` expects: after the file is
//! renamed, lines keep going to the renamed file until the signal, and to a new file under the
//! configured path after it. The process keeps running and serving.

use lacquer_test_support as support;

use std::path::Path;
use support::*;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_reopens_the_access_log_under_its_path() {
    let origin =
        TestOrigin::start(|_| OriginResponse::ok("page").header("cache-control", "max-age=60"));
    let dir = TempDir::new("log-reopen");
    let log = dir.path().join("access.log");
    let rotated = dir.path().join("access.log.1");
    let mut node = LacquerProcess::start_simple(
        origin.addr(),
        &format!("[log]\naccess = \"{}\"\n", log.display()),
    );

    get(&node.url("/before-rotation"), &[]).await;
    assert!(poll_until(Duration::from_secs(10), || read(&log)
        .contains("/before-rotation")));
    std::fs::rename(&log, &rotated).unwrap();
    // renamed but not yet signalled: the open file is the renamed one
    get(&node.url("/after-rename"), &[]).await;
    assert!(poll_until(Duration::from_secs(10), || read(&rotated)
        .contains("/after-rename")));
    assert!(!log.exists());

    assert!(node.signal("USR1"));
    let mut reopened = false;
    for i in 0..100 {
        let resp = get(&node.url(&format!("/after-signal/{i}")), &[]).await;
        assert_eq!(resp.status, 200);
        if read(&log).contains("/after-signal/") {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        reopened,
        "no new file at {}: {}",
        log.display(),
        node.stderr_log()
    );
    let new_file = read(&log);
    assert!(
        !new_file.contains("/before-rotation") && !new_file.contains("/after-rename"),
        "{new_file}"
    );
    let old_file = read(&rotated);
    assert!(
        old_file.contains("/before-rotation") && old_file.contains("/after-rename"),
        "{old_file}"
    );
    assert!(node.is_running());
    assert!(
        node.stderr_log().contains("access log reopened"),
        "{}",
        node.stderr_log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_without_an_access_log_changes_nothing() {
    let origin = TestOrigin::start(|_| OriginResponse::ok("page"));
    let mut node = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"\n");
    assert!(node.signal("USR1"));
    let resp = get(&node.url("/still-serving"), &[]).await;
    assert_eq!(resp.status, 200);
    assert!(node.is_running(), "{}", node.stderr_log());
}
