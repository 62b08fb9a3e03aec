//! Start-up configuration: every bad value stops the binary with the key and the reason.

use lacquer_test_support as support;

use support::*;

#[test]
fn invalid_values_name_the_key_and_reason() {
    for (toml, key, reason) in [
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\nmemory_size = \"12XB\"",
            "cache.memory_size",
            "unknown unit",
        ),
        (
            "upstream = \"127.0.0.1:1\"\nthreads = 0",
            "threads",
            "at least 1",
        ),
        (
            "upstream = \"127.0.0.1:1\"\nlisten = [\"localhost\"]",
            "listen",
            "not an IP:PORT",
        ),
        ("upstream = \"nohost\"", "upstream", "no port"),
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\nmemry_size = \"1MiB\"",
            "unknown field `memry_size`",
            "line 3",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[log]\nformat = \"xml\"",
            "log.format",
            "not one of",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\nannounce = \"memcached\"",
            "cache.announce",
            "\"memcached\" is not one of status, tier, off",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[proxy]\nconnect_timeout = \"0s\"",
            "proxy.connect_timeout",
            "greater than zero",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[proxy]\ntrusted_proxies = [\"10.0.0.0/33\"]",
            "proxy.trusted_proxies[0]",
            "prefix length",
        ),
        (
            "upstream = \"127.0.0.1:1\"\nlisten = [\"127.0.0.1:1 proxy\"]",
            "listen",
            "unknown listen option",
        ),
        // a PROXY-protocol listener that a connection's local address cannot tell from a plain
        // one: a direct client of the plain listener could name any address in a PROXY header
        // (tests/proxy_protocol_and_health_attacks.rs)
        (
            "upstream = \"127.0.0.1:1\"\nlisten = [\"0.0.0.0:18080 proxy_protocol\", \"[::1]:18080\"]",
            "listen",
            "share port 18080",
        ),
        (
            "upstream = \"127.0.0.1:1\"\nlisten = [\"127.0.0.1:18080\", \"[::]:18080 proxy_protocol\"]",
            "listen",
            "share port 18080",
        ),
        (
            "upstream = \"localhost:1\"\n[balancer]\nresolve_interval = \"often\"",
            "balancer.resolve_interval",
            "not a duration",
        ),
        (
            "upstream = \"localhost:1\"\n[balancer]\nresolve_interval = \"10ms\"",
            "balancer.resolve_interval",
            "at least 100ms",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[balancer]\nmax_in_flight = 0",
            "balancer.max_in_flight",
            "at least 1",
        ),
        (
            "[[upstreams]]\naddress = \"127.0.0.1:1\"\nmax_in_flight = 0",
            "upstreams[0].max_in_flight",
            "at least 1",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[balancer.queue]\ntimeout = \"0s\"",
            "balancer.queue.timeout",
            "greater than zero",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[proxy]\ntunnel_idle_timeout = \"0s\"",
            "proxy.tunnel_idle_timeout",
            "greater than zero",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[tls]\nlisten = [\"127.0.0.1:0\"]",
            "tls.cert",
            "required",
        ),
        ("threads = 2", "upstream", "no origin configured"),
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\nstore_set_cookie = \"yes\"",
            "expected a boolean",
            "line 3",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\nreuse_post_responses = 1",
            "expected a boolean",
            "line 3",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\nstrip_targeted_fields = [\"a b\"]",
            "cache.strip_targeted_fields[0]",
            "not a valid header name",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[cache]\npurge_from = [\"127.0.0.1\", \"10.0.0.0/40\"]",
            "cache.purge_from[1]",
            "prefix length must be 0 to 32",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nwrite_buffer = \"2MiB\"",
            "server.write_buffer",
            "1MiB allowed",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nwrite_buffer = \"lots\"",
            "server.write_buffer",
            "not a size",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nread_buffer = \"4MiB\"",
            "server.read_buffer",
            "1MiB allowed",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nmemory_return_delay = \"2h\"",
            "server.memory_return_delay",
            "longer than the 1h allowed",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nmemory_return_delay = \"soon\"",
            "server.memory_return_delay",
            "not a duration",
        ),
        // request rules: a bad rule is refused with its index and its name
        (
            "upstream = \"127.0.0.1:1\"\n[[rules]]\npass = true\n[[rules]]\nname = \"admin\"\npath_regex = \"^/admin(\"\npass = true",
            "rules[1].path_regex",
            "rule \"admin\": bad regex",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[[rules]]\nname = \"noop\"\npath = \"/\"",
            "rules[0]",
            "rule \"noop\": has no action",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[[rules]]\nttl = \"soon\"",
            "rules[0].ttl",
            "is not a duration",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[[rules]]\nbackend_group = \"media\"",
            "rules[0].backend_group",
            "no [[upstreams]] entry has group = \"media\"",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[[rules]]\npaht = \"/\"\npass = true",
            "unknown field `paht`",
            "line 3",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nheader_read_timeout = \"0s\"",
            "server.header_read_timeout",
            "greater than zero",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nmax_header_size = \"100\"",
            "server.max_header_size",
            "between 1KiB and 1MiB",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nmax_request_line = \"64KiB\"",
            "server.max_request_line",
            "server.max_header_size",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nmax_connections = 0",
            "server.max_connections",
            "at least 1",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nh2_idle_timeout = \"soon\"",
            "server.h2_idle_timeout",
            "not a duration",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[server]\nsend_timeout = \"0s\"",
            "server.send_timeout",
            "greater than zero",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[cache.partial]\nenabled = \"yes\"",
            "expected a boolean",
            "line 3",
        ),
        (
            "upstream = \"127.0.0.1:1\"\n[cache.partial]\nenable = true",
            "unknown field `enable`",
            "line 3",
        ),
    ] {
        let out = check_config(toml);
        assert_eq!(out.status.code(), Some(2), "{toml}: {}", stderr_text(&out));
        let err = stderr_text(&out);
        assert!(err.contains(key) && err.contains(reason), "{toml}:\n{err}");
    }
}

#[test]
fn valid_config_checks_clean() {
    let out = check_config("upstream = \"127.0.0.1:8080\"\n[cache]\nmemory_size = \"64MiB\"");
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
    // not just "valid", which "invalid" contains too
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("configuration is valid"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn flags_are_validated_and_override_the_file() {
    let out = run_lacquer(&["--upstream", "127.0.0.1:1", "--memory-size", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_text(&out).contains("cache.memory_size"),
        "{}",
        stderr_text(&out)
    );

    let out = run_lacquer(&["--upstream", "127.0.0.1:1", "--threads", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_text(&out).contains("threads"));

    let out = run_lacquer(&["--listen", "127.0.0.1:9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_text(&out).contains("upstream"));

    // over a file: a flag replaces the file's value, so it mends a bad one and spoils a good one
    let dir = TempDir::new("lacquer-flags");
    let bad_threads = dir.write("bad.toml", "upstream = \"127.0.0.1:1\"\nthreads = 0");
    let bad_threads = bad_threads.to_string_lossy();
    let alone = run_lacquer(&["--check-config", &bad_threads]);
    assert_eq!(alone.status.code(), Some(2), "{}", stderr_text(&alone));
    let mended = run_lacquer(&["--check-config", &bad_threads, "--threads", "2"]);
    assert_eq!(mended.status.code(), Some(0), "{}", stderr_text(&mended));
    let good = dir.write(
        "good.toml",
        "upstream = \"127.0.0.1:1\"\n[cache]\nmemory_size = \"64MiB\"",
    );
    let good = good.to_string_lossy();
    assert_eq!(
        run_lacquer(&["--check-config", &good]).status.code(),
        Some(0)
    );
    let spoiled = run_lacquer(&["--check-config", &good, "--memory-size", "lots"]);
    assert_eq!(spoiled.status.code(), Some(2));
    assert!(
        stderr_text(&spoiled).contains("cache.memory_size"),
        "{}",
        stderr_text(&spoiled)
    );
}

#[test]
fn help_documents_every_flag() {
    let out = run_lacquer(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--check-config",
        "--upstream",
        "--listen",
        "--threads",
        "--memory-size",
        "--max-object-size",
        "--access-log",
        "--log-format",
        "--log-level",
        "--tls-listen",
        "--tls-cert",
        "--tls-key",
        "--no-cache",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn missing_config_file_is_named() {
    let out = run_lacquer(&["--config", "/nonexistent/lacquer.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_text(&out);
    assert!(
        err.contains("/nonexistent/lacquer.toml") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn invalidation_and_admin_access_keys_name_the_key_and_reason() {
    let base = "upstream = \"127.0.0.1:1\"\n";
    for (toml, key, reason) in [
        (
            "[invalidation]\npoll_interval = \"5ms\"",
            "invalidation.poll_interval",
            "between 10ms and 10s",
        ),
        (
            "[invalidation]\nretention = \"30d\"",
            "invalidation.retention",
            "between 1m and 7d",
        ),
        (
            "[invalidation]\ntag_header = \"surrogate key\"",
            "invalidation.tag_header",
            "not a valid header name",
        ),
        (
            "[invalidation]\nnode_name = \"\"",
            "invalidation.node_name",
            "1-128 characters",
        ),
        (
            "[admin]\nallow_from = [\"10.0.0.0/33\"]",
            "admin.allow_from[0]",
            "prefix length",
        ),
        (
            "[admin]\ntoken_file = \"/nonexistent/admin.token\"",
            "admin.token_file",
            "cannot read",
        ),
        (
            "[admin]\ntoken_env = \"LACQUER_TEST_TOKEN_NOT_SET\"",
            "admin.token_env",
            "not set",
        ),
        (
            "[admin]\ntoken_env = \"A\"\ntoken_file = \"/b\"",
            "admin.token_env",
            "not both",
        ),
        (
            "[server]\nupgrade_sock = \"up.sock\"",
            "server.upgrade_sock",
            "not an absolute path",
        ),
    ] {
        let out = check_config(&format!("{base}{toml}"));
        assert_eq!(out.status.code(), Some(2), "{toml}: {}", stderr_text(&out));
        let err = stderr_text(&out);
        assert!(err.contains(key) && err.contains(reason), "{toml}:\n{err}");
    }

    // a token too short to resist guessing is refused, and the error does not repeat it
    let dir = TempDir::new("lacquer-token");
    let short = dir.write("short.token", "hunter2\n");
    let out = check_config(&format!(
        "{base}[admin]\ntoken_file = \"{}\"",
        short.display()
    ));
    assert_eq!(out.status.code(), Some(2));
    let err = stderr_text(&out);
    assert!(
        err.contains("admin.token_file") && err.contains("at least 16"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let good = dir.write("good.token", "a-long-enough-admin-token\n");
    let out = check_config(&format!(
        "{base}[admin]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"{}\"\nallow_from = [\"10.0.0.0/8\"]\n\
         [invalidation]\npoll_interval = \"100ms\"\nretention = \"2h\"\ntag_header = \"xkey\"\n\
         forward_tag_header = true\nnode_name = \"edge-1\"",
        good.display()
    ));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_text(&out));
}

#[test]
fn tls_upstream_keys_name_the_key_and_reason() {
    let dir = TempDir::new("config-upstream-tls");
    let not_pem = dir.write("not.pem", "hello");
    let not_pem = not_pem.display();
    for (toml, key, reason) in [
        (
            "[[upstreams]]\naddress = \"https://127.0.0.1:1\"\nca_file = \"/nonexistent/ca.pem\""
                .to_string(),
            "upstreams[0].ca_file",
            "cannot read",
        ),
        (
            format!("[[upstreams]]\naddress = \"https://127.0.0.1:1\"\nca_file = \"{not_pem}\""),
            "upstreams[0].ca_file",
            "no PEM certificate",
        ),
        (
            format!(
                "[[upstreams]]\naddress = \"https://127.0.0.1:1\"\nclient_cert = \"{not_pem}\""
            ),
            "upstreams[0].client_key",
            "required when client_cert is set",
        ),
        (
            "[[upstreams]]\naddress = \"127.0.0.1:1\"\nsni = \"app.internal\"".to_string(),
            "upstreams[0].sni",
            "only applies to TLS origins",
        ),
        (
            "[[upstreams]]\naddress = \"https://127.0.0.1:1\"\ntls = false".to_string(),
            "upstreams[0].tls",
            "address is https://",
        ),
        (
            "upstream = \"ftp://127.0.0.1:1\"".to_string(),
            "upstream",
            "not http or https",
        ),
        (
            "[[upstreams]]\naddress = \"https://127.0.0.1:1\"\nsni = \"a b\"".to_string(),
            "upstreams[0].sni",
            "not a host name",
        ),
    ] {
        let out = check_config(&toml);
        assert_eq!(out.status.code(), Some(2), "{toml}: {}", stderr_text(&out));
        let err = stderr_text(&out);
        assert!(err.contains(key) && err.contains(reason), "{toml}:\n{err}");
    }
}
