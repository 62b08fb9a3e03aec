//! The `lacquer` binary: parse flags, load and validate the config, run the server.

use clap::Parser;
use lacquer::config::{Cli, Config};
use std::process::ExitCode;

fn main() -> ExitCode {
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
    match lacquer::server::run(config) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("lacquer: {e}");
            ExitCode::from(1)
        }
    }
}
