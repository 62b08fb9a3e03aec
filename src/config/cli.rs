//! Command-line flags, and laying them over the file: each flag overrides the config file key
//! of the same meaning.

use super::balancing::UpstreamEntry;
use super::file::FileConfig;
use clap::Parser;

/// `lacquer`: a caching reverse proxy. Flags override the TOML file given with `--config`.
#[derive(Debug, Default, Clone, Parser)]
#[command(name = "lacquer", version, about, long_about = None)]
pub struct Cli {
    /// TOML config file. Without one, the embedded defaults apply (memory-only cache).
    #[arg(short = 'c', long, value_name = "FILE")]
    pub config: Option<String>,

    /// Validate FILE (plus any other flags given) and exit: 0 when valid, 2 when not.
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<String>,

    /// Origin server, HOST:PORT (config key `upstream`); repeat it for several replicas
    /// (config `[[upstreams]]`, weight 1 each).
    #[arg(short = 'u', long, value_name = "HOST:PORT")]
    pub upstream: Vec<String>,

    /// Listening address, may repeat (config key `listen`; default 0.0.0.0:6081).
    #[arg(short = 'l', long, value_name = "ADDR")]
    pub listen: Vec<String>,

    /// Worker threads (config key `threads`; default: number of cores).
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<i64>,

    /// Memory tier size, e.g. 512MiB (config key `cache.memory_size`).
    #[arg(long, value_name = "SIZE")]
    pub memory_size: Option<String>,

    /// Largest object cached; larger responses pass through (config key `cache.max_object_size`).
    #[arg(long, value_name = "SIZE")]
    pub max_object_size: Option<String>,

    /// Access log: stdout, stderr, off or a path (config key `log.access`).
    #[arg(long, value_name = "DEST")]
    pub access_log: Option<String>,

    /// Access log format: common or json (config key `log.format`).
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,

    /// Error log level: error, warn, info, debug or trace (config key `log.level`).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// TLS listening address, may repeat (config key `tls.listen`; needs --tls-cert and --tls-key).
    #[arg(long, value_name = "ADDR")]
    pub tls_listen: Vec<String>,

    /// PEM certificate chain for TLS listeners (config key `tls.cert`).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<String>,

    /// PEM private key for TLS listeners (config key `tls.key`).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<String>,

    /// Disable caching entirely: a plain reverse proxy (config key `cache.enabled = false`).
    #[arg(long)]
    pub no_cache: bool,

    /// Take the listening sockets over from the running lacquer (hand-over): start this, then
    /// send SIGQUIT to the old process. Both use `server.upgrade_sock`.
    #[arg(long)]
    pub upgrade: bool,
}

/// Lays the CLI flags over the file: a flag that is given wins.
pub fn apply_cli(mut file: FileConfig, cli: &Cli) -> FileConfig {
    match cli.upstream.as_slice() {
        [] => {}
        [one] => {
            file.upstream = Some(one.clone());
            file.upstreams = None;
        }
        many => {
            file.upstream = None;
            file.upstreams = Some(
                many.iter()
                    .map(|address| UpstreamEntry {
                        address: address.clone(),
                        weight: None,
                        group: None,
                        max_in_flight: None,
                        tls: None,
                        sni: None,
                        ca_file: None,
                        client_cert: None,
                        client_key: None,
                    })
                    .collect(),
            );
        }
    }
    if !cli.listen.is_empty() {
        file.listen = Some(cli.listen.clone());
    }
    if let Some(threads) = cli.threads {
        file.threads = Some(threads);
    }
    if let Some(size) = &cli.memory_size {
        file.cache.memory_size = Some(size.clone());
    }
    if let Some(size) = &cli.max_object_size {
        file.cache.max_object_size = Some(size.clone());
    }
    if cli.no_cache {
        file.cache.enabled = Some(false);
    }
    if let Some(access) = &cli.access_log {
        file.log.access = Some(access.clone());
    }
    if let Some(format) = &cli.log_format {
        file.log.format = Some(format.clone());
    }
    if let Some(level) = &cli.log_level {
        file.log.level = Some(level.clone());
    }
    if !cli.tls_listen.is_empty() {
        file.tls.listen = Some(cli.tls_listen.clone());
    }
    if let Some(cert) = &cli.tls_cert {
        file.tls.cert = Some(cert.clone());
    }
    if let Some(key) = &cli.tls_key {
        file.tls.key = Some(key.clone());
    }
    file
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn cli_overrides_file() {
        let file = FileConfig::parse("upstream = \"127.0.0.1:1\"\nthreads = 3", "test").unwrap();
        let cli = Cli {
            upstream: vec!["127.0.0.1:2".into()],
            threads: Some(1),
            ..Default::default()
        };
        let c = Config::validate(apply_cli(file, &cli)).unwrap();
        assert_eq!(c.upstream.port(), 2);
        assert_eq!(c.threads, 1);
    }

    #[test]
    fn several_upstream_flags_replace_the_file_list() {
        let file = FileConfig::parse("upstream = \"127.0.0.1:1\"", "test").unwrap();
        let cli = Cli {
            upstream: vec!["127.0.0.1:2".into(), "127.0.0.1:3".into()],
            ..Default::default()
        };
        let c = Config::validate(apply_cli(file, &cli)).unwrap();
        let ports: Vec<u16> = c
            .balancer
            .backends
            .iter()
            .map(|b| b.address.addrs()[0].port())
            .collect();
        assert_eq!(ports, [2, 3]);
    }
}
