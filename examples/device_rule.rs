//! Embedding Lacquer with a rule of your own: a Rust program that runs Lacquer as a library and
//! adds its own code to the request path through [`PhaseHooks`], the way Pingora users extend a
//! proxy. It takes the same flags and config file as the `lacquer` binary.
//!
//! The custom rule is device buckets, what Varnish users write in VCL: `[[rules]]` match fixed
//! values, but this rule computes one. Every request gets `X-Device: mobile` or `desktop` from
//! its `User-Agent` before the cache is looked up, so an origin that answers with
//! `Vary: X-Device` has two variants stored instead of one per `User-Agent`, and clients are told
//! which bucket they got. Requests with an `X-Api-Key` are passed (never cached), whatever the
//! rules said.
//!
//!     cargo run --example device_rule -- --upstream 127.0.0.1:8000 --listen 127.0.0.1:6081
//!
//! `tests/embedding.rs` builds and runs it against a real origin.

use async_trait::async_trait;
use clap::Parser;
use lacquer::config::{Cli, Config};
use lacquer::proxy::hooks::PhaseHooks;
use lacquer::rules::Verdict;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use std::process::ExitCode;
use std::sync::Arc;

/// The custom rule.
struct DeviceBuckets;

impl DeviceBuckets {
    fn bucket(user_agent: &str) -> &'static str {
        let mobile = ["Mobile", "Android", "iPhone", "iPad"];
        match mobile.iter().any(|word| user_agent.contains(word)) {
            true => "mobile",
            false => "desktop",
        }
    }
}

#[async_trait]
impl PhaseHooks for DeviceBuckets {
    async fn request_filter(&self, session: &mut Session, rules: &mut Verdict) -> Result<bool> {
        let req = session.req_header_mut();
        if req.headers.contains_key("x-api-key") {
            rules.pass = true;
        }
        let user_agent = req
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let device = Self::bucket(user_agent);
        req.insert_header("x-device", device)?;
        Ok(false)
    }

    fn response_filter(&self, req: &RequestHeader, resp: &mut ResponseHeader) -> Result<()> {
        if let Some(device) = req.headers.get("x-device") {
            resp.insert_header("x-device", device.clone())?;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(&cli) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("device_rule: {e}");
            return ExitCode::from(2);
        }
    };
    match lacquer::server::run_with_hooks(config, &cli, Arc::new(DeviceBuckets)) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("device_rule: {e}");
            ExitCode::from(1)
        }
    }
}
