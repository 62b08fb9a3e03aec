//! The `lacquer` binary: parse flags, load and validate the config, run the server.

use clap::Parser;
use lacquer::config::{Cli, Config};
use std::process::ExitCode;

/// mimalloc returns freed cache memory to the system promptly; with glibc malloc, a byte-bounded
/// cache under churn kept about twice its size resident (measured in tests/memory_tier.rs). When
/// freed memory goes back to the system, and why this is not the `mimalloc` crate's allocator,
/// is in `lacquer::allocator`.
#[global_allocator]
static GLOBAL: lacquer::allocator::Mimalloc = lacquer::allocator::Mimalloc;

fn main() -> ExitCode {
    // before anything that can take time (the config's DNS look-ups): a SIGHUP from now on is
    // held for the reload handler, not the end of the process
    lacquer::lifecycle::signals::hold_hangups_until_handled();
    let cli = Cli::parse();
    let config = match Config::load(&cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("lacquer: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &cli.check_config {
        println!("lacquer: {path}: configuration is valid");
        return ExitCode::SUCCESS;
    }
    lacquer::allocator::return_freed_memory(config.memory_return_delay);
    match lacquer::server::run(config, &cli) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("lacquer: {e}");
            ExitCode::from(1)
        }
    }
}
