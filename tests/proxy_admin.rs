//! The admin API: access rules, the conversation list, a conversation's timeline, stats.

mod proxy_support;

use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, Api, Tap, TestProxy};
use serde_json::{json, Value};

async fn get(url: String, token: Option<&str>) -> (u16, Value) {
    let mut request = client().get(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_token_guards_the_admin_api_but_not_healthz() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.admin.token = "s3cret-admin".into()).await;
    let list = proxy.url("/admin/api/conversations");
    assert_eq!(get(list.clone(), None).await.0, 401);
    assert_eq!(get(list.clone(), Some("wrong")).await.0, 401);
    let (status, body) = get(list, Some("s3cret-admin")).await;
    assert_eq!(status, 200);
    assert_eq!(body, json!({"conversations": []}));
    assert_eq!(get(proxy.url("/admin/api/stats"), None).await.0, 401);
    assert_eq!(
        get(proxy.url("/admin/api/conversations/x"), None).await.0,
        401
    );
    let r = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// The proxy answers `/healthz` and `/admin/…` itself; forwarded requests skip its router, so
/// this pins where that line runs: paths beside those (a trailing slash, a longer word) still
/// go upstream, as any path the proxy does not serve.
#[tokio::test]
async fn only_healthz_and_the_admin_api_are_answered_here_paths_beside_them_go_upstream() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    for path in ["/healthz", "/admin/api/stats", "/admin/no-such-page"] {
        client().get(proxy.url(path)).send().await.unwrap();
    }
    let sent = |tap: &Tap| String::from_utf8_lossy(&tap.all_to_upstream()).into_owned();
    assert_eq!(sent(&tap), "", "answered by the proxy, not forwarded");
    let beside = ["/healthz/", "/administrator", "/v1/models"];
    for path in beside {
        client().get(proxy.url(path)).send().await.unwrap();
    }
    let sent = sent(&tap);
    for path in beside {
        assert!(
            sent.contains(&format!("GET {path} HTTP/1.1")),
            "{path} forwarded: {sent}"
        );
    }
}

#[tokio::test]
async fn without_a_token_loopback_clients_see_the_timeline() {
    let script = Script::with_turns(vec![
        Turn::calls(vec![ToolCall::function(
            "bash",
            json!({"command": "make test"}),
        )]),
        Turn::text("Done."),
    ]);
    let mock = MockServer::start(script).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let send = |id: &'static str, body: Value| {
        let url = proxy.url(Api::Anthropic.path(true));
        async move {
            let r = client()
                .post(url)
                .header("x-loopwarden-conversation", id)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            r.bytes().await.unwrap();
        }
    };
    send("older", Api::Anthropic.first_request("first task", true)).await;
    send("newer", Api::Anthropic.first_request("second task", true)).await;
    send(
        "newer",
        Api::Anthropic.request("second task", true, &[("make test", "ok")]),
    )
    .await;
    proxy.running.flush_log().await;

    let (status, body) = get(proxy.url("/admin/api/conversations"), None).await;
    assert_eq!(status, 200);
    let list = body["conversations"].as_array().unwrap();
    let ids: Vec<&str> = list.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["newer", "older"], "newest first");
    assert_eq!(list[0]["requests"], 2);
    assert_eq!(list[0]["tool_calls"], 1);
    assert_eq!(list[0]["last_decision"], "observe");
    assert_eq!(list[0]["dialect"], "anthropic");

    let (status, timeline) = get(proxy.url("/admin/api/conversations/newer"), None).await;
    assert_eq!(status, 200);
    assert_eq!(timeline["conversation"]["id"], "newer");
    let requests = timeline["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2);
    assert!(requests
        .iter()
        .all(|r| r["status"] == 200 && r["proxy_overhead_us"].is_i64()));
    // The conversation's mean overhead, as listed, is its requests' as logged.
    let logged: i64 = requests
        .iter()
        .map(|r| r["proxy_overhead_us"].as_i64().unwrap())
        .sum();
    let mean = timeline["conversation"]["mean_proxy_overhead_us"]
        .as_f64()
        .unwrap();
    assert!((mean - logged as f64 / 2.0).abs() < 1e-9, "{mean} {logged}");
    assert_eq!(list[0]["mean_proxy_overhead_us"], json!(mean));
    let calls = timeline["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["summary"], "bash: make test");
    assert_eq!(calls[0]["result_summary"], "ok");
    assert_eq!(timeline["findings"], json!([]));
    assert_eq!(timeline["decisions"], json!([]));

    assert_eq!(
        get(proxy.url("/admin/api/conversations/nope"), None)
            .await
            .0,
        404
    );

    let (status, stats) = get(proxy.url("/admin/api/stats"), None).await;
    assert_eq!(status, 200);
    assert_eq!(stats["proxy_overhead_us"]["requests"], 3);
    assert!(stats["proxy_overhead_us"]["p50_us"].is_i64());
    assert_eq!(stats["log"]["dropped"], 0);
    assert!(stats["log"]["written"].as_u64().unwrap() > 0);
}

/// A client that pauses halfway through its body: the pause is the client's, and the log
/// and the stats keep it apart from the proxy's own work.
#[tokio::test]
async fn the_body_s_arrival_is_told_apart_from_the_proxy_s_own_work() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(400);
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let body = Api::Chat.first_request("a task", false).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let (first, rest) = body.split_at(body.len() / 2);
    let mut tcp = tokio::net::TcpStream::connect(proxy.running.addr())
        .await
        .unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(first.as_bytes()).await.unwrap();
    tokio::time::sleep(PAUSE).await;
    tcp.write_all(rest.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"));
    proxy.running.flush_log().await;

    let rows = proxy
        .rows("SELECT proxy_overhead_us, body_read_us FROM requests")
        .await;
    assert_eq!(rows.len(), 1);
    let overhead = rows[0]["proxy_overhead_us"].as_i64().unwrap();
    let body_read = rows[0]["body_read_us"].as_i64().unwrap();
    // The clock starts once the proxy has the head, which a loaded machine may take a while
    // to get to: most of the pause, not all of it, is certain to fall in the body's arrival.
    assert!(body_read >= PAUSE.as_micros() as i64 / 2, "{}", rows[0]);
    assert!(overhead >= body_read, "{}", rows[0]);

    let (_, stats) = get(proxy.url("/admin/api/stats"), None).await;
    let stats = &stats["proxy_overhead_us"];
    assert_eq!(stats["requests"], 1);
    assert_eq!(stats["p50_us"], overhead);
    assert_eq!(stats["body_read"]["p50_us"], body_read);
    assert_eq!(stats["after_body_read"]["p50_us"], overhead - body_read);
}

#[tokio::test]
async fn idle_conversations_leave_nothing_in_memory() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.cache.idle_secs = 1).await;
    for task in ["first task", "second task", "third task"] {
        let r = client()
            .post(proxy.url(Api::Anthropic.path(false)))
            .body(Api::Anthropic.first_request(task, false).to_string())
            .send()
            .await
            .unwrap();
        r.bytes().await.unwrap();
    }
    let (_, stats) = get(proxy.url("/admin/api/stats"), None).await;
    // At least one entry per conversation (the last-request lookup may hold its own).
    assert!(
        stats["live_conversations"].as_u64().unwrap() >= 3,
        "{stats}"
    );
    assert!(stats["cache"]["bytes"].as_u64().unwrap() > 0, "{stats}");

    // The sweeper runs every second with idle_secs = 1: poll until it has been.
    let mut last = Value::Null;
    for _ in 0..100 {
        last = get(proxy.url("/admin/api/stats"), None).await.1;
        if last["live_conversations"] == 0 && last["cache"]["bytes"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(last["live_conversations"], 0, "{last}");
    assert_eq!(last["cache"], json!({"messages": 0, "bytes": 0}), "{last}");
}
