//! The keys a reload cannot apply, and what a reload does with them.
//!
//! They shape things built once, at start: the listening sockets (`listen`, `[tls]`,
//! `admin.listen`, `[server]`), the worker threads, the memory tier (`cache.memory_size`,
//! `max_object_size`, `estimated_objects`, `enabled`, `compression.decoded_copies`), the memcached
//! cluster (`[cache.memcached]`), the backends and their health checker (`upstream`,
//! `[[upstreams]]`, `[balancer.health_check]`, `balancer.queue`, `balancer.max_in_flight`,
//! `balancer.resolve_interval`), the access log's destination and format, and the
//! shutdown timings Pingora reads when it starts. A reload that finds one of them changed applies
//! everything else, keeps the running value of these, and names them in a warning: changing them
//! takes a hand-over (`lacquer --upgrade`, see [`super::upgrade`]) or a restart.

use crate::config::Config;

/// Copies the running value of every restart-only key into `new`, and returns the dotted names
/// of those whose value differed (empty when the new file changes only reloadable keys).
pub fn keep_running(running: &Config, new: &mut Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    macro_rules! restart_only {
        ($($key:literal => $($field:ident).+;)*) => {$(
            if running.$($field).+ != new.$($field).+ {
                changed.push($key);
                new.$($field).+ = running.$($field).+.clone();
            }
        )*};
    }
    restart_only! {
        "listen" => listen;
        "listen" => proxy_protocol_listen;
        "threads" => threads;
        "shutdown_timeout" => shutdown_timeout;
        "upstream_keepalive_pool" => upstream_keepalive_pool;
        "server.h2c" => h2c;
        "server.write_buffer" => write_buffer;
        "server.read_buffer" => read_buffer;
        "server.memory_return_delay" => memory_return_delay;
        "server.upgrade_sock" => upgrade_sock;
        "server.header_read_timeout" => client_limits.header_read_timeout;
        "server.max_header_size" => client_limits.max_header_size;
        "server.max_request_line" => client_limits.max_request_line;
        "server.max_connections" => client_limits.max_connections;
        "server.h2_idle_timeout" => client_limits.h2_idle_timeout;
        "tls" => tls;
        "admin.listen" => admin_listen;
        "upstream" => upstream_name;
        "upstreams" => balancer.backends;
        "balancer.health_check" => balancer.health_check;
        "balancer.queue" => balancer.queue;
        "balancer.resolve_interval" => balancer.resolve_interval;
        "balancer.max_in_flight" => balancer.default_max_in_flight;
        "cache.enabled" => cache.enabled;
        "cache.memory_size" => cache.memory_size;
        "cache.max_object_size" => cache.max_object_size;
        "cache.estimated_objects" => cache.estimated_objects;
        "cache.memcached" => cache.memcached;
        "cache.compression.decoded_copies" => cache.compression.decoded_copies;
        "cache.partial" => cache.partial;
        "log.access" => log.access;
        "log.format" => log.format;
        "admin.allow_from" => admin_access.allow_from;
        "admin.token" => admin_access.token;
        "invalidation.poll_interval" => invalidation.poll_interval;
        "invalidation.retention" => invalidation.retention;
        "invalidation.tag_header" => invalidation.tag_header;
        "invalidation.node_name" => invalidation.node_name;
    }
    // the first origin's address as loaded: a name may resolve elsewhere now without the
    // configuration having changed (the resolver follows it), so only `upstream_name` says
    // whether it did
    new.upstream = running.upstream;
    changed.dedup();
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        Config::from_toml(&format!("upstream = \"127.0.0.1:8080\"\n{extra}")).expect(extra)
    }

    #[test]
    fn reloadable_keys_pass_through() {
        let running = config("");
        let mut new = config("[cache]\ndefault_ttl = \"30s\"\n[proxy]\nvia_name = \"edge\"");
        assert!(keep_running(&running, &mut new).is_empty());
        assert_eq!(
            new.cache.default_ttl,
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(new.proxy.via_name, "edge");
    }

    #[test]
    fn restart_only_keys_keep_their_running_value_and_are_named() {
        let running = config("listen = [\"127.0.0.1:6081\"]");
        let mut new = config(
            "listen = [\"127.0.0.1:7000\"]\n[cache]\nmemory_size = \"64MiB\"\ndefault_ttl = \"9s\"",
        );
        let changed = keep_running(&running, &mut new);
        // estimated_objects follows memory_size, and the node's name the first listen port,
        // when not given
        assert_eq!(
            changed,
            [
                "listen",
                "cache.memory_size",
                "cache.estimated_objects",
                "invalidation.node_name"
            ]
        );
        assert_eq!(new.listen, running.listen);
        assert_eq!(new.cache.memory_size, running.cache.memory_size);
        assert_eq!(
            new.cache.default_ttl,
            Some(std::time::Duration::from_secs(9))
        );
    }

    #[test]
    fn another_origin_needs_a_restart() {
        let running = config("");
        let mut new =
            Config::from_toml("upstream = \"127.0.0.1:9090\"\n[balancer]\nretries.attempts = 0")
                .unwrap();
        assert_eq!(keep_running(&running, &mut new), ["upstream", "upstreams"]);
        assert_eq!(new.upstream, running.upstream);
        assert_eq!(new.balancer.retries, 0);
    }

    #[test]
    fn a_name_that_resolves_elsewhere_on_reload_is_the_same_backend() {
        use crate::config::origin_address::OriginAddress;
        let running = Config::from_toml("upstream = \"localhost:8080\"").unwrap();
        let mut new = running.clone();
        let OriginAddress::Name { resolved, .. } = &mut new.balancer.backends[0].address else {
            panic!("localhost is a name");
        };
        *resolved = vec!["10.9.8.7:8080".parse().unwrap()];
        new.upstream = resolved[0];
        assert!(keep_running(&running, &mut new).is_empty());
    }
}
