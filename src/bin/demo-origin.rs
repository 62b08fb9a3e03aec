//! `demo-origin`: a deliberately slow application server to put Lacquer in front of.
//!
//! Every page takes `--render-ms` (default 200 ms) to "render", so the difference between a miss
//! and a hit is visible with curl. Pages:
//! * `/` and `/page/<anything>`: HTML, `Cache-Control: public, max-age=30`;
//! * `/tagged/<anything>`: the same with three tags in `Surrogate-Key` (for measuring what tags
//!   cost a hit, `bench/hit_instructions.sh --tags`);
//! * `/static/<anything>`: `max-age=3600`, with `Last-Modified` and `ETag`;
//! * `/private`: `Cache-Control: private` (never shared);
//! * `/nocache`: `Cache-Control: no-store`;
//! * `/heuristic`: only `Last-Modified` (heuristic freshness applies).

use async_trait::async_trait;
use clap::Parser;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
use pingora_core::services::listening::Service;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// Command-line flags of the demo origin.
#[derive(Parser)]
#[command(
    name = "demo-origin",
    about = "A slow demo application server for trying Lacquer"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Simulated render time per request, in milliseconds.
    #[arg(long, default_value_t = 200)]
    render_ms: u64,
}

/// The demo application: counts renders so hits are visible.
struct DemoOrigin {
    render: Duration,
    renders: AtomicU64,
}

#[async_trait]
impl ServeHttp for DemoOrigin {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        tokio::time::sleep(self.render).await;
        let n = self.renders.fetch_add(1, Ordering::Relaxed) + 1;
        let now = SystemTime::now();
        let rendered = httpdate::fmt_http_date(now);
        let hour_ago = httpdate::fmt_http_date(now - Duration::from_secs(3600));
        let body = format!(
            "<!doctype html><title>Lacquer demo</title><h1>{path}</h1>\
             <p>Rendered at {rendered}, render #{n}, took {} ms.</p>\n",
            self.render.as_millis()
        );
        let builder = http::Response::builder()
            .header("content-type", "text/html; charset=utf-8")
            .header("content-length", body.len())
            .header("x-render-count", n);
        let builder = match path.as_str() {
            "/private" => builder.header("cache-control", "private, max-age=30"),
            "/nocache" => builder.header("cache-control", "no-store"),
            "/heuristic" => builder.header("last-modified", hour_ago),
            p if p.starts_with("/static/") => builder
                .header("cache-control", "public, max-age=3600")
                .header("last-modified", hour_ago)
                .header("etag", format!("\"{}\"", p.len())),
            "/" => builder.header("cache-control", "public, max-age=30"),
            p if p.starts_with("/page/") => builder.header("cache-control", "public, max-age=30"),
            p if p.starts_with("/tagged/") => builder
                .header("cache-control", "public, max-age=30")
                .header("surrogate-key", format!("page{p} section-news site-all")),
            _ => {
                let body = b"not found\n".to_vec();
                return http::Response::builder()
                    .status(404)
                    .header("cache-control", "max-age=10")
                    .header("content-length", body.len())
                    .body(body)
                    .expect("valid response");
            }
        };
        builder.body(body.into_bytes()).expect("valid response")
    }
}

fn main() {
    let args = Args::parse();
    let conf = ServerConf {
        threads: 2,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let app = DemoOrigin {
        render: Duration::from_millis(args.render_ms),
        renders: AtomicU64::new(0),
    };
    let mut service = Service::new("demo origin".to_string(), app);
    service.add_tcp(&args.listen);
    server.add_service(service);
    eprintln!("demo-origin listening on http://{}", args.listen);
    server.run_forever();
}
