//! The admin API: access rules, the conversation list, a conversation's timeline, stats.

mod proxy_support;

use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, raw_request, Api, Tap, TestProxy};
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

/// The proxy answers its own paths itself (`/`, `/healthz`, `/admin` and below, `/metrics`,
/// `/ui` and below: `proxy::operator::own`); forwarded requests skip its router, so this pins where that
/// line runs: paths beside those (a trailing slash, a longer word) still go upstream, as any
/// path the proxy does not serve.
#[tokio::test]
async fn the_proxy_s_own_paths_are_answered_here_and_paths_beside_them_go_upstream() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    let own = [
        "/",
        "/healthz",
        "/admin",
        "/admin/",
        "/admin/api/stats",
        "/admin/no-such-page",
        "/metrics",
        "/ui",
        "/ui/",
        "/ui/conversations/x",
    ];
    for path in own {
        let r = client().get(proxy.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        match path {
            "/healthz" | "/admin/api/stats" => assert_eq!(status, 200, "{path}"),
            "/metrics" => {
                assert_eq!(status, 200, "{path}");
                assert!(body.ends_with("# EOF\n"), "{body}");
            }
            // The dashboard's page (tests/ui_dashboard.rs).
            "/ui" | "/ui/" => {
                assert_eq!(status, 200, "{path}");
                assert!(body.contains("/ui/app.js"), "{path}: {body}");
            }
            "/" => {
                assert_eq!(status, 200, "{path}");
                let index: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(index["name"], "loopwarden", "{body}");
                assert_eq!(index["admin_api"], "/admin/api/", "{body}");
            }
            _ => {
                assert_eq!(status, 404, "{path}: {body}");
                let error: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(
                    error["error"], "not found; the proxy owns this path",
                    "{path}"
                );
            }
        }
    }
    let sent = |tap: &Tap| String::from_utf8_lossy(&tap.all_to_upstream()).into_owned();
    assert_eq!(sent(&tap), "", "answered by the proxy, not forwarded");
    let rows = proxy.rows("SELECT path FROM requests").await;
    assert_eq!(rows, Vec::<Value>::new(), "nothing logged as proxied");
    let beside = [
        "/healthz/",
        "/administrator",
        "/metricsx",
        "/uix",
        "/index.html",
        "/v1/models",
    ];
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

/// DNS rebinding: a web page whose host name now resolves to 127.0.0.1 reaches the proxy
/// from a loopback address, with its own name in `Host`. Without a token only loopback names
/// are answered.
#[tokio::test]
async fn without_a_token_only_loopback_host_names_are_answered() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let addr = proxy.running.addr();
    let port = addr.port();
    let list = |host: String| {
        format!(
            "GET /admin/api/conversations HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n"
        )
    };
    for host in [
        "rebind.evil.example".to_string(),
        format!("rebind.evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
        format!("127.0.0.1.evil.example:{port}"),
        format!("0.0.0.0:{port}"),
        "".to_string(),
    ] {
        let r = raw_request(addr, list(host.clone()).as_bytes()).await;
        assert_eq!(r.status, 403, "Host {host:?}: {}", r.head);
        let error = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(error.contains("Host"), "Host {host:?}: {error}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_string(),
        format!("127.3.4.5:{port}"),
        format!("localhost:{port}"),
        "LocalHost".to_string(),
        format!("[::1]:{port}"),
        "[::1]".to_string(),
    ] {
        let r = raw_request(addr, list(host.clone()).as_bytes()).await;
        assert_eq!(r.status, 200, "Host {host:?}: {}", r.head);
        assert_eq!(r.json(), json!({"conversations": []}));
    }
    // `/healthz` and the index say nothing about the log: any Host may read them.
    let r = raw_request(
        addr,
        b"GET /healthz HTTP/1.1\r\nhost: rebind.evil.example\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
}

/// One request of conversation `id`, logged: the proxy has seen it.
async fn seen(proxy: &TestProxy, id: &str) {
    let r = client()
        .post(proxy.url(Api::Chat.path(false)))
        .header("x-loopwarden-conversation", id)
        .body(Api::Chat.first_request("task", false).to_string())
        .send()
        .await
        .unwrap();
    r.bytes().await.unwrap();
    proxy.running.flush_log().await;
}

/// A write by a web page: a cross-origin POST with `text/plain` needs no preflight, so a
/// browser sends it. Writes need a JSON body type and no foreign `Origin`.
#[tokio::test]
async fn without_a_token_cross_origin_and_non_json_writes_are_refused() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("fine")]))
        .await
        .unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let own_origin = proxy.running.url();
    let halt = proxy.url("/admin/api/conversations/victim/halt");
    // The conversation exists (halting one nobody has seen is a 404).
    seen(&proxy, "victim").await;
    let post = |content_type: Option<&str>, origin: Option<&str>| {
        let mut request = client().post(halt.clone()).body(r#"{"reason":"pwned"}"#);
        if let Some(t) = content_type {
            request = request.header("content-type", t);
        }
        if let Some(o) = origin {
            request = request.header("origin", o);
        }
        async move {
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            let bytes = r.bytes().await.unwrap();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    for (content_type, origin, status) in [
        (Some("text/plain"), Some("http://evil.example"), 403),
        (Some("application/json"), Some("http://evil.example"), 403),
        (Some("application/json"), Some("null"), 403),
        (
            Some("application/json"),
            Some(format!("http://localhost:{}", proxy.running.addr().port()).as_str()),
            403,
        ),
        (Some("text/plain"), None, 415),
        (Some("application/x-www-form-urlencoded"), None, 415),
        (None, None, 415),
        (Some("text/plain"), Some(own_origin.as_str()), 415),
    ] {
        let (got, body) = post(content_type, origin).await;
        assert_eq!(got, status, "{content_type:?} from {origin:?}: {body}");
        assert!(body["error"].is_string(), "{body}");
    }
    // None of them halted it: its next request goes upstream.
    let converse = || async {
        client()
            .post(proxy.url(Api::Chat.path(false)))
            .header("x-loopwarden-conversation", "victim")
            .body(Api::Chat.first_request("task", false).to_string())
            .send()
            .await
            .unwrap()
            .headers()["x-loopwarden-decision"]
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(converse().await, "observe");
    // A JSON write from a script (no Origin) or from the proxy's own origin is done.
    let (status, body) = post(Some("application/json; charset=utf-8"), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(converse().await, "halt");
    let resume = client()
        .post(proxy.url("/admin/api/conversations/victim/resume"))
        .header("content-type", "application/json")
        .header("origin", &own_origin)
        .send()
        .await
        .unwrap();
    assert_eq!(resume.status(), 200);
    assert_eq!(converse().await, "observe");
}

/// With a token, other hosts may call (Docker, a remote operator), but writes still need
/// JSON and no foreign `Origin`: a browser that holds the token must not be made to write.
#[tokio::test]
async fn with_a_token_any_host_may_call_but_writes_need_json_and_no_foreign_origin() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.admin.token = "s3cret-admin".into()).await;
    let r = raw_request(
        proxy.running.addr(),
        b"GET /admin/api/conversations HTTP/1.1\r\nhost: loopwarden.internal:8788\r\n\
          authorization: Bearer s3cret-admin\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    seen(&proxy, "x").await;
    let halt = proxy.url("/admin/api/conversations/x/halt");
    let post = |content_type: &str, origin: Option<&str>| {
        let mut request = client()
            .post(halt.clone())
            .header("authorization", "Bearer s3cret-admin")
            .header("content-type", content_type);
        if let Some(o) = origin {
            request = request.header("origin", o);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post("text/plain", None).await, 415);
    assert_eq!(
        post("application/json", Some("https://evil.example")).await,
        403
    );
    assert_eq!(post("application/json", None).await, 200);
    let own = proxy.running.url();
    assert_eq!(post("application/json", Some(&own)).await, 200);
}

/// On `[::]` (both IPv4 and IPv6), an IPv4 client arrives as `::ffff:127.0.0.1`: loopback.
#[tokio::test]
async fn ipv4_clients_of_a_dual_stack_listener_are_loopback() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let proxy = TestProxy::start_with(&mock.url(), |c| c.server.listen = "[::]:0".into()).await;
    let port = proxy.running.addr().port();
    let (status, body) = get(
        format!("http://127.0.0.1:{port}/admin/api/conversations"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"conversations": []}));
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
