//! Client connections are spread over the serving threads: a burst of keep-alive
//! connections opened at once lands evenly, each keeps being served where it landed, and
//! the admin API's per-thread count falls back as they close.

mod proxy_support;

use proxy_support::TestProxy;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 GET on `stream`, keeping the connection open; the response's body.
async fn get(stream: &mut TcpStream, path: &str, close: bool) -> String {
    let connection = if close { "close" } else { "keep-alive" };
    // The admin API answers a loopback Host only (`proxy::operator::admin::check`).
    let head =
        format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: {connection}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before a full response");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap())
                })
                .expect("a content-length");
            if got.len() >= end + 4 + length {
                return text[end + 4..end + 4 + length].to_string();
            }
        }
    }
}

async fn open_per_thread(proxy: &TestProxy) -> Vec<u64> {
    let mut stream = TcpStream::connect(proxy.running.addr()).await.unwrap();
    let stats: Value =
        serde_json::from_str(&get(&mut stream, "/admin/api/stats", true).await).unwrap();
    stats["connections"]
        .as_array()
        .expect("connections per thread")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_burst_of_connections_is_spread_evenly_over_the_serving_threads() {
    let proxy = TestProxy::start_with("http://127.0.0.1:9", |c| c.server.threads = 3).await;
    // Twelve clients connect at once, as a load driver or a fleet of agents does.
    let connects = (0..12).map(|_| TcpStream::connect(proxy.running.addr()));
    let mut streams: Vec<TcpStream> = futures_util::future::join_all(connects)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for stream in &mut streams {
        assert_eq!(get(stream, "/healthz", false).await, "ok\n");
    }
    // The stats call's own connection is one more (13 over 3 threads).
    let open = open_per_thread(&proxy).await;
    assert_eq!(open.len(), 3, "{open:?}");
    assert_eq!(open.iter().sum::<u64>(), 13, "{open:?}");
    assert!(
        open.iter().max().unwrap() - open.iter().min().unwrap() <= 1,
        "uneven: {open:?}"
    );
    // Every connection is still served, again and again, wherever it landed.
    for stream in &mut streams {
        assert_eq!(get(stream, "/healthz", false).await, "ok\n");
    }
    drop(streams);
    // Only the stats call's own connection stays counted (polled: a close is seen by the
    // thread serving it when it next reads).
    let mut last = Vec::new();
    for _ in 0..200 {
        last = open_per_thread(&proxy).await;
        if last.iter().sum::<u64>() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        last.iter().sum::<u64>(),
        1,
        "closed connections still counted: {last:?}"
    );
}
