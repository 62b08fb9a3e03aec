//! `[[upstreams]]`, `[balancer]` and `[fairness]`: every bad value stops start-up with the key
//! and the reason; a full, valid configuration checks clean.

use lacquer_test_support as support;

use support::*;

const TWO: &str =
    "[[upstreams]]\naddress = \"127.0.0.1:1\"\n[[upstreams]]\naddress = \"127.0.0.1:2\"\n";

#[test]
fn invalid_balancing_values_name_the_key_and_reason() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("upstream = \"127.0.0.1:3\"\n{TWO}"),
            "upstreams",
            "not both",
        ),
        ("upstreams = []".into(), "upstreams", "at least one"),
        (
            "[[upstreams]]\naddress = \"127.0.0.1:1\"\nweight = 0".into(),
            "upstreams[0].weight",
            "outside the allowed range",
        ),
        (
            "[[upstreams]]\naddress = \"nohost\"".into(),
            "upstreams[0].address",
            "no port",
        ),
        (
            format!("{TWO}[[upstreams]]\naddress = \"127.0.0.1:1\""),
            "upstreams[2].address",
            "listed twice",
        ),
        (
            "[[upstreams]]\naddr = \"127.0.0.1:1\"".into(),
            "unknown field `addr`",
            "line",
        ),
        (
            format!("{TWO}[balancer]\nalgorithm = \"fastest\""),
            "balancer.algorithm",
            "not one of",
        ),
        (
            format!("{TWO}[balancer.health_check]\ninterval = \"1s\""),
            "balancer.health_check.path",
            "required",
        ),
        (
            format!("{TWO}[balancer.health_check]\npath = \"health\""),
            "balancer.health_check.path",
            "must start with /",
        ),
        (
            format!(
                "{TWO}[balancer.health_check]\npath = \"/h\"\ninterval = \"1s\"\ntimeout = \"2s\""
            ),
            "balancer.health_check.timeout",
            "not be longer",
        ),
        (
            format!("{TWO}[balancer.health_check]\npath = \"/h\"\nfall = 0"),
            "balancer.health_check.fall",
            "outside the allowed range",
        ),
        (
            format!("{TWO}[balancer.health_check]\npath = \"/h\"\nexpect_status = 42"),
            "balancer.health_check.expect_status",
            "outside the allowed range",
        ),
        (
            format!("{TWO}[balancer.passive]\ncooldown = \"0s\""),
            "balancer.passive.cooldown",
            "greater than zero",
        ),
        (
            format!("{TWO}[balancer.retries]\nattempts = -1"),
            "balancer.retries.attempts",
            "outside the allowed range",
        ),
        (
            format!("{TWO}[balancer.timeouts]\nfirst_byte = \"soon\""),
            "balancer.timeouts.first_byte",
            "not a duration",
        ),
        (
            format!("{TWO}[balancer.timeouts]\nconnect = \"5s\"\ntotal = \"1s\""),
            "balancer.timeouts.total",
            "not be shorter",
        ),
        (
            format!("{TWO}[fairness]\nmax_in_flight = 4\non_excess = \"drop\""),
            "fairness.on_excess",
            "not one of reject, queue",
        ),
        (
            format!("{TWO}[fairness]\nmax_in_flight = 4\nkey_header = \"x api key\""),
            "fairness.key_header",
            "not a valid header name",
        ),
        (
            format!("{TWO}[fairness]\nmax_in_flight = -2"),
            "fairness.max_in_flight",
            "outside the allowed range",
        ),
    ];
    for (toml, key, reason) in cases {
        let out = check_config(&toml);
        assert_eq!(out.status.code(), Some(2), "{toml}: {}", stderr_text(&out));
        let err = stderr_text(&out);
        assert!(err.contains(key) && err.contains(reason), "{toml}:\n{err}");
    }
}

#[test]
fn a_full_balancing_config_checks_clean() {
    let toml = format!(
        "{TWO}[balancer]\nalgorithm = \"least_loaded\"\n\
         [balancer.health_check]\npath = \"/healthz\"\ninterval = \"2s\"\ntimeout = \"1s\"\nrise = 2\nfall = 3\nexpect_status = 204\n\
         [balancer.passive]\nfailures = 5\nwindow = \"10s\"\ncooldown = \"30s\"\ncount_5xx = false\n\
         [balancer.retries]\nattempts = 2\n\
         [balancer.timeouts]\nconnect = \"1s\"\nfirst_byte = \"15s\"\nidle = \"10s\"\ntotal = \"60s\"\n\
         [fairness]\nmax_in_flight = 8\nkey_header = \"X-Api-Key\"\non_excess = \"queue\"\nqueue_size = 32\nqueue_timeout = \"2s\"\nretry_after = \"5s\"\n"
    );
    let out = check_config(&toml);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
}
