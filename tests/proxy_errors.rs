//! When things go wrong: an unreachable or silent upstream, upstream errors, a stream that
//! breaks, a client that goes away. The proxy answers in the API's own error shape, passes
//! the upstream's errors and breaks on as they are, and never keeps an upstream busy for a
//! client that left.

mod proxy_support;

use loopwarden::mock::{ErrorReply, MockServer, Script, ToolCall, Turn};
use proxy_support::{client, closed_port, eventually, Api, Tap, TestProxy, ALL_APIS};
use serde_json::{json, Value};

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_in_the_apis_error_shape() {
    let dead = format!("http://127.0.0.1:{}", closed_port().await);
    let proxy = TestProxy::start(&dead).await;
    for api in ALL_APIS {
        for stream in [false, true] {
            let id = format!("dead-{api:?}-{stream}");
            let r = client()
                .post(proxy.url(api.path(stream)))
                .header("x-loopwarden-conversation", &id)
                .body(api.first_request("task", stream).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 502, "{api:?}");
            assert_eq!(r.headers()["content-type"], "application/json");
            assert_eq!(r.headers()["x-loopwarden-conversation"], id.as_str());
            let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            let message = match api {
                Api::Chat | Api::Responses => body["error"]["message"].as_str(),
                Api::Anthropic => {
                    assert_eq!(body["type"], "error");
                    assert_eq!(body["error"]["type"], "api_error");
                    body["error"]["message"].as_str()
                }
                Api::Gemini => {
                    assert_eq!(body["error"]["code"], 502);
                    assert_eq!(body["error"]["status"], "UNAVAILABLE");
                    body["error"]["message"].as_str()
                }
            };
            assert!(
                message.is_some_and(|m| m.contains("could not be reached")),
                "{api:?}: {body}"
            );
            let rows = proxy
                .rows(&format!(
                    "SELECT status, outcome FROM requests WHERE conversation_id = '{id}'"
                ))
                .await;
            assert_eq!(
                rows,
                vec![json!({"status": 502, "outcome": "upstream_unreachable"})]
            );
        }
    }
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_a_504() {
    let script = Script::with_turns(vec![Turn {
        hang: true,
        ..Turn::text("never")
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.upstream.response_timeout_secs = 1).await;
    let r = client()
        .post(proxy.url(Api::Anthropic.path(true)))
        .header("x-loopwarden-conversation", "slow")
        .body(Api::Anthropic.first_request("task", true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(body["type"], "error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("did not answer in time"));
    let rows = proxy
        .rows("SELECT status, outcome FROM requests WHERE conversation_id = 'slow'")
        .await;
    assert_eq!(
        rows,
        vec![json!({"status": 504, "outcome": "upstream_timeout"})]
    );
}

#[tokio::test]
async fn upstream_errors_reach_the_client_as_the_upstream_sent_them() {
    let script = Script::with_turns(vec![Turn {
        error: Some(ErrorReply {
            status: 429,
            body: None,
            headers: [("retry-after".to_string(), "7".to_string())].into(),
            times: None,
        }),
        ..Turn::text("unused")
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    for api in ALL_APIS {
        let r = client()
            .post(proxy.url(api.path(false)))
            .body(api.first_request("task", false).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429, "{api:?}");
        assert_eq!(r.headers()["retry-after"], "7", "{api:?}");
        let received = r.bytes().await.unwrap();
        assert_eq!(
            received.as_ref(),
            tap.upstream_bodies().pop().unwrap().as_slice(),
            "{api:?}"
        );
    }
}

#[tokio::test]
async fn a_broken_upstream_stream_reaches_the_client_broken() {
    let script = Script::with_turns(vec![Turn {
        text: Some("I will now look at many files, one after the other.".into()),
        tool_calls: vec![ToolCall::function("bash", json!({"command": "ls"}))],
        break_after_events: Some(3),
        ..Turn::default()
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    for api in [Api::Chat, Api::Anthropic, Api::Responses] {
        let id = format!("broken-{api:?}");
        let mut r = client()
            .post(proxy.url(api.path(true)))
            .header("x-loopwarden-conversation", &id)
            .body(api.first_request("task", true).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut received = Vec::new();
        let ended = loop {
            match r.chunk().await {
                Ok(Some(chunk)) => received.extend_from_slice(&chunk),
                Ok(None) => break "complete",
                Err(_) => break "error",
            }
        };
        assert_eq!(
            ended, "error",
            "{api:?}: the client must see the break, not a clean end"
        );
        let sent = tap.upstream_bodies().pop().unwrap();
        assert_eq!(
            received, sent,
            "{api:?}: everything before the break arrived"
        );
        let rows = proxy
            .rows(&format!(
                "SELECT outcome FROM requests WHERE conversation_id = '{id}'"
            ))
            .await;
        assert_eq!(rows, vec![json!({"outcome": "upstream_broken"})], "{api:?}");
    }
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_upstream_request() {
    let long_text = "This answer is long and slow. ".repeat(20);
    let mut script = Script::with_turns(vec![Turn::text(&long_text)]);
    script.chunk_delay_ms = 100;
    let mock = MockServer::start(script).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;

    let mut r = client()
        .post(proxy.url(Api::Anthropic.path(true)))
        .header("x-loopwarden-conversation", "gone")
        .body(Api::Anthropic.first_request("task", true).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    drop(r);

    assert!(
        eventually(|| tap.conns().iter().any(|c| c.closed_by_proxy)).await,
        "the proxy must close the upstream connection when its client leaves"
    );
    let conn = tap.conns().into_iter().find(|c| c.closed_by_proxy).unwrap();
    let sent = String::from_utf8_lossy(&conn.from_upstream).to_string();
    assert!(
        !sent.contains("message_stop"),
        "the upstream was cut off before it finished its answer"
    );
    let rows = proxy
        .rows("SELECT outcome FROM requests WHERE conversation_id = 'gone'")
        .await;
    assert_eq!(rows, vec![json!({"outcome": "client_disconnected"})]);

    // The proxy goes on serving.
    let r = client()
        .post(proxy.url(Api::Chat.path(false)))
        .body(Api::Chat.first_request("task", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_in_the_apis_shape() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.server.max_body_bytes = 1024).await;
    let big = Api::Gemini
        .first_request(&"x".repeat(4096), false)
        .to_string();
    let r = client()
        .post(proxy.url(Api::Gemini.path(false)))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT");
    assert!(mock.requests().is_empty(), "nothing reached the upstream");
    // Logged as a request, and not as a conversation.
    let rows = proxy
        .rows("SELECT path, status, outcome, applied, parse FROM requests")
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"path": "/v1beta/models/gemini-3.8-flash:generateContent", "status": 413,
            "outcome": "rejected", "applied": "rejected", "parse": "unparsed"})
        ]
    );
    assert_eq!(
        proxy.rows("SELECT id FROM conversations").await,
        Vec::<Value>::new()
    );
}

/// A client that announces a body over the limit and waits for `100 Continue` before
/// sending it is told 413 at once: the body is never asked for.
#[tokio::test]
async fn an_announced_body_over_the_limit_is_refused_before_it_is_sent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.server.max_body_bytes = 1024).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.running.addr())
        .await
        .unwrap();
    tcp.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 10000000000\r\nexpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    // The first answer line: the client sends nothing more until it has one.
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n") && tcp.read(&mut byte).await.unwrap() == 1 {
        answer.push(byte[0]);
    }
    let first = String::from_utf8_lossy(&answer).into_owned();
    assert!(first.starts_with("HTTP/1.1 413 "), "{first}");
    assert!(mock.requests().is_empty(), "nothing reached the upstream");
    let rows = proxy.rows("SELECT status, outcome FROM requests").await;
    assert_eq!(rows, vec![json!({"status": 413, "outcome": "rejected"})]);
}

/// A body that breaks off is a 400, logged.
#[tokio::test]
async fn a_body_that_breaks_off_is_a_logged_400() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.running.addr())
        .await
        .unwrap();
    tcp.write_all(
        b"POST /c/broken/v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    tcp.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    assert!(mock.requests().is_empty(), "nothing reached the upstream");
    let sql = "SELECT conversation_id, path, status, outcome FROM requests";
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = proxy.rows(sql).await;
        if !rows.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        rows,
        vec![
            json!({"conversation_id": "broken", "path": "/v1/messages", "status": 400,
            "outcome": "rejected"})
        ]
    );
}

/// A client whose every body is unreadable cannot flood the proxy's stderr: the warning is
/// written once per period, the next line counting the ones left out, while every request
/// is still forwarded (and logged with its parse error).
#[tokio::test]
async fn unreadable_bodies_warn_once_per_period_not_once_per_request() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    let served = proxy_support::Served::start(
        &["--db", &db],
        &[("LOOPWARDEN_OPENAI_BASE_URL", mock.url())],
    )
    .await;
    let sent = 200;
    let bad = br#"{"model": "gpt-5.5", "messages": [{"role": "user", "content": "unterminated"#;
    for i in 0..sent {
        let r = client()
            .post(format!("{}/v1/chat/completions", served.url))
            .header("x-loopwarden-conversation", format!("bad-{i}"))
            .body(bad.to_vec())
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
    }
    assert_eq!(mock.requests().len(), sent, "each one forwarded");
    let stderr = served.stop().await;
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("request body not parsed"))
        .count();
    assert!(
        (1..=3).contains(&warnings),
        "{warnings} warning lines for {sent} bodies:\n{stderr}"
    );
}
