//! `serial-origin`: an application server that serves ONE request at a time, for the blami
//! experiment (`bench/blami.sh`): the serial app servers of the paper, which only scale by being
//! replicated behind a balancer.
//!
//! Connections are accepted concurrently (so a balancer's idle keep-alive connection does not
//! lock others out), but every request takes the one global worker for `--delay-ms`, so one
//! replica's throughput is at most 1000 / delay-ms requests per second. Every response is
//! `Cache-Control: no-store` and names the replica in `X-Replica`. `--slow-factor 5` makes this
//! replica five times slower.

use clap::Parser;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Command-line flags of the serial origin.
#[derive(Parser)]
#[command(
    name = "serial-origin",
    about = "An origin that serves one request at a time"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Time the single worker spends on each request, in milliseconds.
    #[arg(long, default_value_t = 50)]
    delay_ms: u64,
    /// Multiplies the delay (5 = a replica five times slower).
    #[arg(long, default_value_t = 1)]
    slow_factor: u64,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let delay = Duration::from_millis(args.delay_ms * args.slow_factor);
    let worker = Arc::new(Mutex::new(0u64));
    let listener = TcpListener::bind(&args.listen)?;
    let name = args.listen.clone();
    for stream in listener.incoming().flatten() {
        let (worker, name) = (worker.clone(), name.clone());
        std::thread::spawn(move || {
            let _ = serve(stream, &worker, delay, &name);
        });
    }
    Ok(())
}

/// Serves requests on one keep-alive connection, each under the global worker lock.
fn serve(
    stream: TcpStream,
    worker: &Mutex<u64>,
    delay: Duration,
    name: &str,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let (mut length, mut close) = (0usize, false);
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            let lower = header.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            } else if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink())?;
        let served = {
            let mut count = worker.lock().expect("worker lock");
            std::thread::sleep(delay);
            *count += 1;
            *count
        };
        let body = format!("{path} served by {name}, request #{served}\n");
        write!(
            writer,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
             Cache-Control: no-store\r\nX-Replica: {name}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        )?;
        writer.flush()?;
        if close {
            return Ok(());
        }
    }
}
