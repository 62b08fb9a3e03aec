//! Reading a node's `/metrics` (Prometheus / OpenMetrics text) in tests.

use super::client::get;

/// One scrape of `/metrics`.
pub struct Scrape {
    pub text: String,
}

/// Scrapes `http://127.0.0.1:{admin_port}/metrics`; panics unless it answers 200 in the
/// OpenMetrics text format.
pub async fn scrape(admin_port: u16) -> Scrape {
    let resp = get(&format!("http://127.0.0.1:{admin_port}/metrics"), &[]).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let content_type = resp.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = resp.text();
    assert!(text.ends_with("# EOF\n"), "{text}");
    Scrape { text }
}

/// The value of `series` once it reads `expected`, or after 5 s the last value read: a
/// request is counted when it is logged, just after its answer went out.
pub async fn value_when(admin_port: u16, series: &str, expected: f64) -> f64 {
    let mut value = scrape(admin_port).await.value(series);
    for _ in 0..100 {
        if value == expected {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        value = scrape(admin_port).await.value(series);
    }
    value
}

impl Scrape {
    /// The value of the sample written exactly `series` (name and labels as exported, e.g.
    /// `lacquer_requests_total{cache="hit",tier="memory"}`); panics when there is none.
    pub fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("no sample {series} in\n{}", self.text))
    }

    /// The value of `series`, if exported.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.text.lines().find_map(|line| {
            let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
            rest.split(' ').next()?.parse().ok()
        })
    }
}
