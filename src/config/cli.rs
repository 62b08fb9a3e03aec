//! Command-line flags. Each flag overrides the config file key of the same meaning.

use clap::Parser;

/// `lacquer`: a caching reverse proxy. Flags override the TOML file given with `--config`.
#[derive(Debug, Default, Parser)]
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
}
