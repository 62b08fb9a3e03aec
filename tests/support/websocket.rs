//! A WebSocket client's checks through the proxy's upgrade tunnel, shared by the echo-origin
//! tests (`upgrade_tunnels`) and the Django site's Channels endpoint (`django_site`).

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A client's WebSocket connection, as `tokio_tungstenite::connect_async` opens it.
pub type WebSocket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Sends `text` and a 70 KB binary message (larger than any one read, so it crosses the tunnel
/// in pieces) and checks that each comes back unchanged.
pub async fn assert_echoes(ws: &mut WebSocket, text: &str) {
    ws.send(Message::text(text)).await.unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed, Message::text(text));
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    ws.send(Message::binary(binary.clone())).await.unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed, Message::binary(binary));
}

/// Closes from the client side and checks that the other end's answering Close comes back
/// through the tunnel (with a normal code) before the stream ends.
pub async fn assert_closes_normally(mut ws: WebSocket) {
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "done".into(),
    }))
    .await
    .unwrap();
    let mut answered = None;
    while let Some(msg) = ws.next().await {
        if let Message::Close(frame) = msg.unwrap() {
            answered = frame;
        }
    }
    assert_eq!(answered.map(|f| f.code), Some(CloseCode::Normal));
}
