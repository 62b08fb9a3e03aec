//! The admin listener's live status page in a real browser: headless Chromium (Debian's
//! `chromium`, installed by `scripts/setup.sh`) loads `/` from a node under a little load, and
//! the DOM it ends with shows that every chart received samples and the memcached servers and
//! origin backends were listed with their state; a screenshot is saved beside the build
//! (`status-page.png` in cargo's target directory). Skipped, saying so, when Chromium is not installed.

use lacquer_test_support as support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use support::*;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|name| Path::new("/usr/bin").join(name))
        .find(|path| path.exists())
}

/// Runs headless Chromium on `url` for `ms` milliseconds of the page's (virtual) time with
/// `action` (`--dump-dom`, `--screenshot=...`); returns its standard output. Virtual time: the
/// page's timers run without waiting, and time stands still while a fetch is out, so the page
/// takes its once-a-second samples in quick succession, each with a real round trip.
fn headless(browser: &Path, profile: &Path, url: &str, ms: u64, action: &str) -> String {
    let profile = format!("--user-data-dir={}", profile.display());
    let budget = format!("--virtual-time-budget={ms}");
    let out = run_with_timeout(
        browser,
        &[
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,860",
            &profile,
            &budget,
            action,
            url,
        ],
        Duration::from_secs(60),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of attribute `name` of the element whose `id` is `id`, in serialized HTML.
fn attribute(dom: &str, id: &str, name: &str) -> Option<String> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let tag_start = dom[..start].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    let value_start = tag.find(&format!("{name}=\""))? + name.len() + 2;
    Some(tag[value_start..value_start + tag[value_start..].find('"')?].to_string())
}

/// The `points` of each polyline inside the element `id`.
fn polylines(dom: &str, id: &str) -> Vec<String> {
    let Some(start) = dom.find(&format!("id=\"{id}\"")) else {
        return Vec::new();
    };
    let end = start + dom[start..].find("</svg>").unwrap_or(dom.len() - start);
    dom[start..end]
        .split("<polyline")
        .skip(1)
        .filter_map(|p| {
            let s = p.find("points=\"")? + 8;
            Some(p[s..s + p[s..].find('"')?].to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_charts_live_data_in_chromium() {
    let Some(browser) = chromium() else {
        eprintln!(
            "SKIPPED the_status_page_charts_live_data_in_chromium: chromium is not installed \
             (scripts/setup.sh installs Debian's chromium package)"
        );
        return;
    };
    let memcached = MemcachedProcess::start();
    let r = [Replica::start("a"), Replica::start("b")];
    let admin = free_port();
    let node = start_balancer(
        &[(r[0].addr(), 1), (r[1].addr(), 1)],
        &format!(
            "[admin]\nlisten = \"127.0.0.1:{admin}\"\n[log]\naccess = \"off\"\n\
             [cache.memcached]\nservers = [\"{}\"]\n",
            memcached.addr_string()
        ),
    );
    // a little load while the page runs: mostly hits, some misses and passes (bounded)
    let running = Arc::new(AtomicBool::new(true));
    let load = {
        let (running, base) = (running.clone(), format!("http://127.0.0.1:{}", node.port()));
        tokio::spawn(async move {
            for i in 0..4000u32 {
                if !running.load(Ordering::Relaxed) {
                    break;
                }
                let path = match i % 10 {
                    0 => format!("/cacheable/new/{i}"),
                    1 => format!("/dynamic/{i}"),
                    _ => format!("/cacheable/{}", i % 20),
                };
                get(&format!("{base}{path}"), &[]).await;
            }
        })
    };
    let url = format!("http://127.0.0.1:{admin}/");
    let profile = TempDir::new("chromium-profile");
    let (browser_dom, url_dom, profile_dom) =
        (browser.clone(), url.clone(), profile.path().to_path_buf());
    let dom = tokio::task::spawn_blocking(move || {
        headless(&browser_dom, &profile_dom, &url_dom, 8000, "--dump-dom")
    })
    .await
    .unwrap();

    // where cargo builds (`CARGO_TARGET_DIR` when set, which need not be `<repo>/target`)
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&target).unwrap();
    let screenshot = target.join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    let shot = format!("--screenshot={}", screenshot.display());
    let profile_shot = profile.path().to_path_buf();
    tokio::task::spawn_blocking(move || headless(&browser, &profile_shot, &url, 4500, &shot))
        .await
        .unwrap();
    running.store(false, Ordering::Relaxed);
    load.await.unwrap();

    // every chart took samples; requests per second and the memory fill are drawn for each,
    // hit ratio and latency for each interval that saw requests (the load runs throughout)
    for (chart, least) in [
        ("chart-rps", 2),
        ("chart-memory", 2),
        ("chart-ratio", 1),
        ("chart-latency", 1),
    ] {
        let samples: usize = attribute(&dom, chart, "data-points")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{chart} has no data-points in\n{dom}"));
        assert!(samples >= 2, "{chart} received {samples} samples:\n{dom}");
        let lines = polylines(&dom, chart);
        assert!(!lines.is_empty(), "{chart} drew no series:\n{dom}");
        let longest = lines
            .iter()
            .map(|points| points.split_whitespace().count())
            .max()
            .unwrap_or(0);
        assert!(longest >= least, "{chart} drew {longest} points: {lines:?}");
    }
    // requests were charted as a rate, and the tables name every server and backend
    assert!(!dom.contains("id=\"now-rps\">–<"), "{dom}");
    assert!(dom.contains("req/s"), "{dom}");
    assert!(
        dom.contains(&format!(
            "data-server=\"{}\" data-up=\"true\"",
            memcached.addr_string()
        )),
        "{dom}"
    );
    for replica in &r {
        assert!(
            dom.contains(&format!(
                "data-backend=\"{}\" data-up=\"true\"",
                replica.addr()
            )),
            "{dom}"
        );
    }
    let png = std::fs::read(&screenshot).expect("chromium saved a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    drop(node);
}
