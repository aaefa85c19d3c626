//! Client connections are reaped: a request head that stops half-way is cut after the
//! header timeout, a connection that carries no request after the idle timeout (never one
//! whose answer is still streaming), connections over the cap make room or get a 503 (the
//! proxy's own paths still served), a request body that stalls or trickles is cut, and
//! an upstream that stalls mid-stream is cut after the stream idle timeout, the client
//! seeing the stream break.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod proxy_support;

use std::time::{Duration, Instant};

use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{client, Api, TestProxy};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The first SSE event the stalling upstream sends, before it goes silent.
const FIRST_EVENT: &str = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n";

/// An upstream that answers every request with an SSE head and one event, then sends
/// nothing more while keeping the connection open (a stalled model server).
async fn stalling_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 65536];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                let chunk = format!("{:x}\r\n{FIRST_EVENT}\r\n", FIRST_EVENT.len());
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(chunk.as_bytes()).await;
                // Silent from here on; the connection stays open until the proxy drops it.
                let _ = stream.read(&mut buf).await;
            });
        }
    });
    url
}

/// Reads until the peer closes (`true`) or `within` passes (`false`); what arrived.
async fn read_until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> (bool, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (true, got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (false, got),
        }
    }
}

/// A streamed Anthropic request on a raw connection, sent whole.
fn streamed_request(conversation: &str) -> Vec<u8> {
    let body = Api::Anthropic.first_request("task", true).to_string();
    format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-loopwarden-conversation: {conversation}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn a_client_that_sends_half_a_request_head_is_disconnected_after_the_header_timeout() {
    let proxy = TestProxy::start_with("http://127.0.0.1:9", |c| {
        c.server.header_timeout_secs = 1;
    })
    .await;
    let mut slow = TcpStream::connect(proxy.running.addr()).await.unwrap();
    slow.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .unwrap();
    let (closed, got) = read_until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(closed, "a half-sent head must not hold its connection open");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // The proxy still serves everyone else.
    let r = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A client that sends its head and then its body too slowly (a byte at a time) or not at
/// all is answered 408 and disconnected after `server.body_timeout_secs`; nothing reaches
/// the upstream, and the request has its row.
#[tokio::test]
async fn a_body_that_stalls_or_trickles_is_cut_after_the_body_timeout() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.server.body_timeout_secs = 1;
    })
    .await;
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\
                content-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"model\"";
    for trickle in [false, true] {
        let slow = TcpStream::connect(proxy.running.addr()).await.unwrap();
        let (mut read, mut write) = slow.into_split();
        write.write_all(head.as_bytes()).await.unwrap();
        let drip = tokio::spawn(async move {
            // A byte every 100 ms: far below a kilobyte per timeout. Or nothing more.
            while trickle && write.write_all(b" ").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            write
        });
        let (closed, got) = read_until_closed(&mut read, Duration::from_secs(20)).await;
        drip.abort();
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(closed, "trickle={trickle}: the connection is closed");
        assert!(
            text.starts_with("http/1.1 408"),
            "trickle={trickle}: {text}"
        );
        assert!(text.contains("server.body_timeout_secs"), "{text}");
    }
    assert!(mock.requests().is_empty());
    let rows = proxy
        .rows("SELECT status, outcome FROM requests ORDER BY id")
        .await;
    assert_eq!(
        rows,
        vec![json!({"status": 408, "outcome": "rejected"}); 2],
        "{rows:?}"
    );
}

#[tokio::test]
async fn an_idle_connection_is_closed_but_never_one_whose_answer_is_streaming() {
    // Three events 700 ms apart: the answer takes longer than the idle timeout.
    let mut script = Script::with_turns(vec![Turn::text("one two three")]);
    script.chunk_delay_ms = 700;
    let mock = MockServer::start(script).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| {
        c.server.idle_timeout_secs = 1;
        c.server.header_timeout_secs = 1;
    })
    .await;

    // Connected and silent: closed.
    let mut idle = TcpStream::connect(proxy.running.addr()).await.unwrap();
    let (closed, _) = read_until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(
        closed,
        "a connection that never sends a request must be closed"
    );

    // A slow stream outlives both timeouts, whole; then the connection, idle, is closed.
    let mut busy = TcpStream::connect(proxy.running.addr()).await.unwrap();
    busy.write_all(&streamed_request("slow-stream"))
        .await
        .unwrap();
    let started = Instant::now();
    let (closed, got) = read_until_closed(&mut busy, Duration::from_secs(20)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        closed,
        "idle after its answer, the connection must be closed: {text}"
    );
    assert!(
        started.elapsed() > Duration::from_secs(1),
        "the answer was meant to outlast the idle timeout"
    );
    assert!(text.contains("message_stop"), "the answer was cut: {text}");
    assert!(text.ends_with("0\r\n\r\n"), "the answer was cut: {text}");
    let rows = proxy
        .rows("SELECT outcome FROM requests WHERE conversation_id = 'slow-stream'")
        .await;
    assert_eq!(rows, vec![json!({"outcome": "complete"})]);
}

#[tokio::test]
async fn over_the_cap_a_waiting_connection_makes_room_else_a_503_with_retry_after() {
    let upstream = stalling_upstream().await;
    let proxy = TestProxy::start_with(&upstream, |c| {
        c.server.max_connections = 3;
        c.server.threads = 1;
    })
    .await;

    // Three idle connections fill the cap; a fourth client is served all the same, the
    // connection that waited longest making room.
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(TcpStream::connect(proxy.running.addr()).await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = client()
        .get(proxy.url("/healthz"))
        .header("connection", "close")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (closed, _) = read_until_closed(&mut idle[0], Duration::from_secs(10)).await;
    assert!(closed, "the oldest idle connection made room");
    drop(idle);

    // Three connections each carrying a request (streams the upstream never finishes):
    // nothing can make room, so a fourth is told so, and closed.
    let mut busy = Vec::new();
    for i in 0..3 {
        let mut stream = TcpStream::connect(proxy.running.addr()).await.unwrap();
        stream
            .write_all(&streamed_request(&format!("busy-{i}")))
            .await
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        busy.push(stream);
    }
    let mut refused = TcpStream::connect(proxy.running.addr()).await.unwrap();
    let _ = refused.write_all(&streamed_request("refused")).await;
    let (closed, got) = read_until_closed(&mut refused, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(closed, "a refused connection is closed");
    assert!(text.starts_with("http/1.1 503"), "{text}");
    assert!(text.contains("\r\nretry-after: "), "{text}");
    assert!(text.contains("server.max_connections"), "{text}");
    // The proxy's own paths still get through at the cap: a health check, the admin API
    // (which says what the cap did), and the metrics, each on a connection of its own.
    for path in ["/healthz", "/admin/api/stats", "/metrics"] {
        let r = client()
            .get(proxy.url(path))
            .header("connection", "close")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path} at the cap");
        if path == "/admin/api/stats" {
            let stats: serde_json::Value =
                serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            assert!(
                stats["connections_at_cap"]["refused"].as_u64() >= Some(1),
                "{stats}"
            );
        }
    }
    // The connections in flight were left alone.
    for stream in &mut busy {
        let (closed, _) = read_until_closed(stream, Duration::from_millis(200)).await;
        assert!(!closed, "a connection carrying a request was closed");
    }
}

#[tokio::test]
async fn an_upstream_that_stalls_mid_stream_is_cut_and_the_client_sees_the_break() {
    let upstream = stalling_upstream().await;
    let proxy = TestProxy::start_with(&upstream, |c| c.upstream.stream_idle_secs = 1).await;
    let mut r = client()
        .post(proxy.url(Api::Anthropic.path(true)))
        .header("x-loopwarden-conversation", "stalled")
        .body(Api::Anthropic.first_request("task", true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut received = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match r.chunk().await {
                Ok(Some(chunk)) => received.extend_from_slice(&chunk),
                Ok(None) => break "complete",
                Err(_) => break "error",
            }
        }
    })
    .await;
    assert_eq!(
        ended,
        Ok("error"),
        "the client must see the stalled stream break, not wait or see a clean end"
    );
    assert_eq!(String::from_utf8_lossy(&received), FIRST_EVENT);
    let rows = proxy
        .rows("SELECT outcome FROM requests WHERE conversation_id = 'stalled'")
        .await;
    assert_eq!(rows, vec![json!({"outcome": "upstream_stalled"})]);
}

/// The built binary under `ulimit -n 256` (its hard limit too, so it cannot raise it),
/// flooded with more half-sent requests than it has file descriptors: the other clients
/// are served all the same, at once, the flood making room for them.
#[tokio::test]
async fn under_a_low_file_limit_a_flood_of_half_sent_requests_leaves_others_served() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -n 256 && exec \"$0\" serve --listen 127.0.0.1:0 --db \"$1\"",
            env!("CARGO_BIN_EXE_loopwarden"),
        ])
        .arg(format!("sqlite://{}", dir.path().join("log.db").display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = lines.next_line().await.unwrap().unwrap();
    let addr = line
        .strip_prefix("loopwarden listening on http://")
        .unwrap()
        .to_string();

    let mut flood = Vec::new();
    for _ in 0..300 {
        let Ok(mut stream) = TcpStream::connect(&addr).await else {
            continue;
        };
        let _ = stream
            .write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-half: ")
            .await;
        flood.push(stream);
    }
    for _ in 0..5 {
        let r = tokio::time::timeout(Duration::from_secs(10), async {
            client().get(format!("http://{addr}/healthz")).send().await
        })
        .await;
        assert!(
            matches!(&r, Ok(Ok(r)) if r.status() == 200),
            "another client was not served: {r:?}"
        );
    }
    drop(flood);
}
