//! Codex's Responses WebSocket through the proxy, over real sockets: the upgrade refused
//! with 426 when `server.websocket = "refuse"`.

mod proxy_support;

use loopwarden::config::WebSocketMode;
use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{raw_request, TestProxy};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` on a new connection and reads one answer (head, and a body of its
/// `content-length`), leaving the connection open: a refused upgrade need not close it.
async fn one_answer(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, Value) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while got.len() < head_end + length {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed inside the body");
        got.extend_from_slice(&buf[..n]);
    }
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_slice(&got[head_end..]).unwrap_or(Value::Null);
    (status, head, body)
}

/// The upgrade request Codex opens the Responses API with (its headers, a fake key).
fn codex_upgrade(path: &str, conversation: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\n\
         host: 127.0.0.1\r\n\
         connection: Upgrade\r\n\
         upgrade: websocket\r\n\
         sec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         sec-websocket-extensions: permessage-deflate; client_max_window_bits\r\n\
         openai-beta: responses_websockets=2026-02-06\r\n\
         authorization: Bearer sk-test-not-a-key\r\n\
         session-id: {conversation}\r\n\
         originator: codex_exec\r\n\
         \r\n"
    )
    .into_bytes()
}

#[tokio::test]
async fn an_upgrade_is_refused_with_426_at_once_when_set_to_refuse() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("never asked")]))
        .await
        .unwrap();
    let proxy =
        TestProxy::start_with(&mock.url(), |c| c.server.websocket = WebSocketMode::Refuse).await;
    let (status, head, body) = one_answer(
        proxy.running.addr(),
        &codex_upgrade("/v1/responses", "ws-refused"),
    )
    .await;
    assert_eq!(status, 426, "{head}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("server.websocket"), "{message}");
    assert!(
        mock.requests().is_empty(),
        "nothing reaches the upstream: {:?}",
        mock.requests()
    );
    let rows = proxy
        .rows("SELECT method, path, status, outcome, applied FROM requests")
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"method": "GET", "path": "/v1/responses", "status": 426,
                    "outcome": "rejected", "applied": "rejected"})
        ]
    );
    // A plain GET of the same path is no upgrade: forwarded as before.
    let plain = raw_request(
        proxy.running.addr(),
        b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_ne!(plain.status, 426, "{}", plain.head);
    assert_eq!(mock.requests().len(), 1);
}
