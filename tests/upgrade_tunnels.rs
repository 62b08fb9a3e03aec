//! Protocol upgrades through Lacquer (issue 12 item 1): a WebSocket client library talks to a
//! WebSocket echo origin through the proxy, text and binary frames and the close handshake; the
//! `101` keeps its `Upgrade`/`Connection`; nothing is cached; the tunnel is logged.

use lacquer_test_support as support;
use support::*;

use futures_util::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;

/// A WebSocket origin that echoes every data frame and answers the close handshake; counts the
/// handshakes it accepted.
struct EchoOrigin {
    addr: std::net::SocketAddr,
    handshakes: Arc<AtomicUsize>,
}

async fn echo_origin() -> EchoOrigin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                while let Some(Ok(msg)) = ws.next().await {
                    if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                        return;
                    }
                    // a Close is answered by the library itself; the stream then ends
                }
            });
        }
    });
    EchoOrigin { addr, handshakes }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_echoes_text_and_binary_frames_and_closes_cleanly() {
    let origin = echo_origin().await;
    let lacquer = LacquerProcess::start_simple(origin.addr, "");
    let url = format!("ws://127.0.0.1:{}/chat", lacquer.port());

    for round in 1..=2 {
        let (mut ws, response) = tokio_tungstenite::connect_async(&url).await.unwrap();
        assert_eq!(response.status(), 101);
        let field = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase()
        };
        assert_eq!(field("upgrade"), "websocket");
        assert!(field("connection").contains("upgrade"));

        assert_echoes(&mut ws, "hello through lacquer").await;
        // the origin's answering Close comes back through the tunnel, then the stream ends
        assert_closes_normally(ws).await;
        // never cached: every handshake reaches the origin
        assert_eq!(origin.handshakes.load(Ordering::SeqCst), round);
    }

    let logged = poll_until_async(Duration::from_secs(10), || {
        lacquer
            .stdout_log()
            .matches("GET /chat HTTP/1.1\" 101")
            .count()
            >= 2
    })
    .await;
    let log = lacquer.stdout_log();
    assert!(logged, "two tunnels logged with status 101: {log}");
    assert!(
        log.lines()
            .filter(|l| l.contains("\" 101 "))
            .all(|l| l.contains("tunnel")),
        "{log}"
    );
}

#[test]
fn an_upgrade_the_origin_refuses_is_an_ordinary_uncached_response() {
    // a plain HTTP origin that ignores `Upgrade` and answers 200, cacheable
    let origin =
        TestOrigin::start(|_req| OriginResponse::ok("plain").header("cache-control", "max-age=60"));
    let lacquer = LacquerProcess::start_simple(origin.addr(), "[log]\naccess = \"off\"");
    let upgrade = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    for _ in 0..2 {
        let resp = RawConn::connect(lacquer.addr()).get("/page", &upgrade);
        assert_eq!(resp.status, 200);
        assert_eq!(resp.text(), "plain");
    }
    assert_eq!(
        origin.hits_for("/page"),
        2,
        "an upgrade request is never a hit"
    );
    let forwarded = origin.last_request().unwrap();
    assert_eq!(forwarded.header("upgrade"), Some("websocket"));
    assert_eq!(
        forwarded.header("connection").map(str::to_ascii_lowercase),
        Some("upgrade".into())
    );
}
