//! Transparent forwarding over real sockets: the upstream receives the client's exact
//! bytes and headers, the client receives the upstream's exact bytes, streams arrive event
//! by event, and loopwarden's own prefixes are stripped.

mod proxy_support;

use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, raw_request, Api, Tap, TestProxy, ALL_APIS};
use serde_json::json;

fn one_call_script() -> Script {
    Script::with_turns(vec![Turn {
        text: Some("Let me run the tests first, then look at the failure.".into()),
        tool_calls: vec![ToolCall::function(
            "bash",
            json!({"command": "python -m pytest -q tests/test_calc.py"}),
        )],
        ..Turn::default()
    }])
}

#[tokio::test]
async fn every_api_passes_bytes_through_unchanged_both_ways() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    for api in ALL_APIS {
        for stream in [false, true] {
            // Pretty-printed, with a field no API defines: re-serializing would change both.
            let mut body = api.first_request("Fix the failing test in calc.py", stream);
            body["x_unknown_field"] = json!({"kept": [1, 2.50, "three"]});
            let sent = serde_json::to_vec_pretty(&body).unwrap();
            let (auth_name, auth_value) = api.auth("FAKE-key-for-passthrough");
            let response = client()
                .post(proxy.url(api.path(stream)))
                .header(auth_name, &auth_value)
                .header("content-type", "application/json")
                .header("user-agent", "passthrough-test/1.0")
                .header("x-custom-header", "custom value, kept")
                .header("anthropic-beta", "a-2025,b-2026")
                .body(sent.clone())
                .send()
                .await
                .unwrap();
            let status = response.status();
            let headers = response.headers().clone();
            let received = response.bytes().await.unwrap();
            let what = format!("{api:?} stream={stream}");
            assert_eq!(status, 200, "{what}");

            let seen = mock.requests().pop().unwrap();
            assert_eq!(seen.body, sent, "{what}: request body bytes");
            let (path, query) = api
                .path(stream)
                .split_once('?')
                .unwrap_or((api.path(stream), ""));
            assert_eq!(seen.path, path, "{what}");
            assert_eq!(seen.query.as_deref().unwrap_or(""), query, "{what}");
            for (name, value) in [
                (auth_name, auth_value.as_str()),
                ("content-type", "application/json"),
                ("user-agent", "passthrough-test/1.0"),
                ("x-custom-header", "custom value, kept"),
                ("anthropic-beta", "a-2025,b-2026"),
            ] {
                assert_eq!(seen.header(name), Some(value), "{what}: header {name}");
            }
            assert_eq!(
                seen.header("content-length"),
                Some(sent.len().to_string().as_str()),
                "{what}"
            );

            let upstream_sent = tap.upstream_bodies().pop().unwrap();
            assert_eq!(
                received.as_ref(),
                upstream_sent.as_slice(),
                "{what}: response bytes"
            );
            assert!(!received.is_empty(), "{what}");
            let content_type = headers["content-type"].to_str().unwrap();
            assert_eq!(
                content_type.starts_with("text/event-stream"),
                stream,
                "{what}: {content_type}"
            );
            assert_eq!(headers["x-loopwarden-decision"], "observe", "{what}");
            assert!(headers.contains_key("x-loopwarden-conversation"), "{what}");
        }
    }
}

#[tokio::test]
async fn streamed_events_reach_the_client_before_the_upstream_has_sent_them_all() {
    let mut script = one_call_script();
    // The mock pauses between events, so an unbuffered proxy delivers the first event
    // while the mock still has most of the answer to send.
    script.chunk_delay_ms = 120;
    let mock = MockServer::start(script).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    for api in ALL_APIS {
        let before = tap.all_from_upstream().len();
        let mut response = client()
            .post(proxy.url(api.path(true)))
            .body(api.first_request("Fix the failing test", true).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let first = response.chunk().await.unwrap().unwrap();
        let upstream_at_first = tap.all_from_upstream().len() - before;
        let mut chunks = vec![first];
        while let Some(chunk) = response.chunk().await.unwrap() {
            chunks.push(chunk);
        }
        let upstream_total = tap.all_from_upstream().len() - before;
        assert!(
            upstream_at_first < upstream_total,
            "{api:?}: the client's first chunk came only after the upstream sent everything \
             ({upstream_at_first} of {upstream_total} bytes)"
        );
        assert!(
            chunks.len() >= 3,
            "{api:?}: events arrived batched in {} chunks",
            chunks.len()
        );
        let events = chunks.concat();
        assert_eq!(
            &events[..],
            tap.upstream_bodies().pop().unwrap().as_slice(),
            "{api:?}: stream bytes"
        );
    }
}

#[tokio::test]
async fn prefixes_are_stripped_and_other_paths_pass_through() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let c = client();

    let r = c
        .post(proxy.url("/c/run-7/anthropic/v1/messages?beta=true"))
        .header("x-api-key", "k")
        .body(Api::Anthropic.first_request("task", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-loopwarden-conversation"], "run-7");
    assert_eq!(r.status(), 200);
    let seen = mock.requests().pop().unwrap();
    assert_eq!(
        (seen.path.as_str(), seen.query.as_deref()),
        ("/v1/messages", Some("beta=true"))
    );

    let r = c
        .get(proxy.url("/v1/models?limit=5"))
        .header("authorization", "Bearer k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        !r.headers().contains_key("x-loopwarden-decision"),
        "not a conversation"
    );
    let seen = mock.requests().pop().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(seen.query.as_deref(), Some("limit=5"));

    let body = br#"{"model":"claude-opus-5-5","messages":[{"role":"user","content":"count me"}]}"#;
    let r = c
        .post(proxy.url("/v1/messages/count_tokens"))
        .body(&body[..])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = mock.requests().pop().unwrap();
    assert_eq!(seen.api, "anthropic_count_tokens");
    assert_eq!(seen.body.as_ref(), &body[..]);
}

#[tokio::test]
async fn a_request_never_chooses_the_upstream_host() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    // Absolute-form target and a foreign Host: a proxy that honoured either would be an
    // open relay. The request must still go to the configured upstream.
    let body = Api::Chat.first_request("task", false).to_string();
    let raw = format!(
        "POST http://relay-victim.example/v1/chat/completions HTTP/1.1\r\nhost: relay-victim.example\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut tcp = tokio::net::TcpStream::connect(proxy.running.addr())
        .await
        .unwrap();
    tcp.write_all(raw.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let seen = mock.requests().pop().unwrap();
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(seen.header("host"), Some(mock.addr().to_string().as_str()));
}

#[tokio::test]
async fn large_header_sections_pass_up_to_64_kib_and_beyond_it_get_a_clear_431() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let c = client();
    let send = |headers: usize| {
        let mut request = c
            .post(proxy.url("/v1/chat/completions"))
            .header("authorization", "Bearer k")
            .body(Api::Chat.first_request("task", false).to_string());
        // Large custom headers (tracing baggage, long cookies) of 1 KiB each.
        for i in 0..headers {
            request = request.header(format!("x-baggage-{i}"), "b".repeat(1024));
        }
        request.send()
    };
    // 40 KiB of headers: more than nginx accepts by default (32 KiB).
    let r = send(40).await.unwrap();
    assert_eq!(r.status(), 200);
    let seen = mock.requests().pop().unwrap();
    let baggage = seen
        .headers
        .iter()
        .filter(|(k, _)| k.starts_with("x-baggage-"));
    assert_eq!(baggage.count(), 40, "every header reached the upstream");
    // Past the bound (the read buffer's 64 KiB): refused with a status that says why.
    let r = send(72).await.unwrap();
    assert_eq!(r.status(), 431);
}

/// A long conversation's requests share most of their bytes with the one before, which
/// the proxy keeps rather than copying (`proxy::forward::body`): every request still reaches the
/// upstream byte for byte and is read as from scratch, whether it adds a turn, edits an
/// early one, or repeats the last body exactly.
#[tokio::test]
async fn a_long_conversation_reaches_the_upstream_byte_for_byte_as_its_requests_share_history() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    // Outputs of ~40 KB: bodies of up to ~0.6 MB, which arrive in many frames.
    let outputs: Vec<String> = (0..14)
        .map(|i| format!("line {i}: {}\n", "ok ".repeat(40)).repeat(330))
        .collect();
    let commands: Vec<String> = (0..14).map(|i| format!("cat src/module_{i}.py")).collect();
    for api in ALL_APIS {
        let task = format!("Fix the failing test ({api:?})");
        let mut done: Vec<(&str, &str)> = Vec::new();
        let mut bodies = Vec::new();
        for i in 0..14 {
            if i == 8 {
                // An early turn edited (as an agent that trims old tool output does).
                done[1].1 = "trimmed";
            }
            let sent = serde_json::to_vec(&api.request(&task, false, &done)).unwrap();
            bodies.push(sent.clone());
            if i == 11 {
                // The same body again, as a client's retry sends it.
                bodies.push(sent);
            }
            done.push((&commands[i], &outputs[i]));
        }
        for sent in &bodies {
            let (auth_name, auth_value) = api.auth("FAKE-key");
            let response = client()
                .post(proxy.url(api.path(false)))
                .header(auth_name, &auth_value)
                .header("content-type", "application/json")
                .body(sent.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{api:?}");
            let seen = mock.requests().pop().unwrap();
            assert!(seen.body == *sent, "{api:?}: request body bytes");
        }
        // Each request's steps as a read from scratch counts them.
        let dialect = match api {
            Api::Chat => loopwarden::dialect::Dialect::OpenAiChat,
            Api::Responses => loopwarden::dialect::Dialect::OpenAiResponses,
            Api::Anthropic => loopwarden::dialect::Dialect::Anthropic,
            Api::Gemini => loopwarden::dialect::Dialect::Gemini,
        };
        let expected: Vec<i64> = bodies
            .iter()
            .map(|b| {
                dialect
                    .parse_request(b, false)
                    .unwrap()
                    .transcript
                    .steps
                    .len() as i64
            })
            .collect();
        let path = api.path(false).split('?').next().unwrap().to_string();
        let sql =
            format!("SELECT parse, steps, applied FROM requests WHERE path = '{path}' ORDER BY id");
        let mut rows = Vec::new();
        for _ in 0..100 {
            rows = proxy.rows(&sql).await;
            if rows.len() == bodies.len() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(rows.len(), bodies.len(), "{api:?}");
        for (row, steps) in rows.iter().zip(&expected) {
            assert_eq!(row["parse"], "parsed", "{api:?}: {row}");
            assert_eq!(row["applied"], "forwarded", "{api:?}: {row}");
            assert_eq!(row["steps"], *steps, "{api:?}: {row}");
        }
    }
}

/// A model list, a token count: not a conversation, so the log has the request and the
/// conversation list stays as it was.
#[tokio::test]
async fn passthrough_requests_are_logged_as_requests_not_conversations() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let c = client();
    for path in ["/v1/models", "/c/run-9/v1/models"] {
        let r = c
            .get(proxy.url(path))
            .header("authorization", "Bearer k")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = c
        .post(proxy.url("/v1/messages/count_tokens"))
        .header("x-loopwarden-conversation", "counted")
        .body(r#"{"model":"claude-opus-5-5","messages":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rows = proxy
        .rows("SELECT path, parse, status FROM requests ORDER BY id")
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"path": "/v1/models", "parse": "not_conversation", "status": 200}),
            json!({"path": "/v1/models", "parse": "not_conversation", "status": 200}),
            json!({"path": "/v1/messages/count_tokens", "parse": "not_conversation", "status": 200}),
        ]
    );
    let list = conversation_list(&proxy).await;
    assert_eq!(list, json!({"conversations": []}));

    // A conversation's request still makes its conversation, and the passthrough requests
    // it names show in its timeline.
    let r = c
        .post(proxy.url("/c/run-9/v1/chat/completions"))
        .body(Api::Chat.first_request("task", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    proxy.running.flush_log().await;
    let list = conversation_list(&proxy).await;
    let list = list["conversations"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(
        (&list[0]["id"], &list[0]["requests"]),
        (&json!("run-9"), &json!(1))
    );
}

async fn conversation_list(proxy: &TestProxy) -> serde_json::Value {
    let r = client()
        .get(proxy.url("/admin/api/conversations"))
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// An upstream base URL with a path prefix (a gateway's `/openai-proxy`): `..` segments,
/// plain or percent-encoded, are resolved before forwarding, and a path that would climb
/// above the base is refused (and logged), never sent.
#[tokio::test]
async fn a_path_cannot_climb_out_of_the_upstream_base_url_s_prefix() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&format!("{}/gateway/openai", tap.url())).await;
    let get = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k\r\nconnection: close\r\n\r\n")
    };
    for path in [
        "/v1/../../admin",
        "/..",
        "/v1/%2e%2e/%2E%2E/secret",
        "/v1/.%2e/.%2E/secret?x=1",
        "/c/run/openai/../../../../secret",
        "/v1/./../../secret",
    ] {
        let r = raw_request(proxy.running.addr(), get(path).as_bytes()).await;
        assert_eq!(r.status, 400, "{path}: {}", r.head);
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(message.contains(".."), "{path}: {message}");
    }
    assert_eq!(tap.all_to_upstream(), b"", "nothing was forwarded");
    let rows = proxy
        .rows("SELECT status, outcome, applied FROM requests")
        .await;
    assert_eq!(rows.len(), 6, "each refusal is logged: {rows:?}");
    assert!(rows
        .iter()
        .all(|r| *r == json!({"status": 400, "outcome": "rejected", "applied": "rejected"})));

    // Inside the base, the segments are resolved and the result forwarded.
    for (path, forwarded) in [
        ("/v1/engines/../models", "/gateway/openai/v1/models"),
        (
            "/v1/%2e/models/%2E%2E/models?limit=2",
            "/gateway/openai/v1/models?limit=2",
        ),
        ("/v1/models/..", "/gateway/openai/v1/"),
        ("/v1/..models", "/gateway/openai/v1/..models"),
    ] {
        let r = raw_request(proxy.running.addr(), get(path).as_bytes()).await;
        assert_ne!(r.status, 400, "{path}: {}", r.head);
        let sent = String::from_utf8_lossy(&tap.all_to_upstream()).into_owned();
        assert!(
            sent.contains(&format!("GET {forwarded} HTTP/1.1")),
            "{path} → {forwarded}: {sent}"
        );
    }
}

/// `CONNECT` would make the proxy a tunnel: refused, nothing sent upstream.
#[tokio::test]
async fn connect_is_refused() {
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let tap = Tap::start(mock.addr()).await;
    let proxy = TestProxy::start(&tap.url()).await;
    let r = raw_request(
        proxy.running.addr(),
        b"CONNECT api.openai.com:443 HTTP/1.1\r\nhost: api.openai.com:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 405, "{}", r.head);
    // The proxy's own answers keep their length (not chunked) through the connection's
    // bookkeeping.
    assert!(r.head.contains("content-length"), "{}", r.head);
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("CONNECT"), "{message}");
    assert_eq!(tap.all_to_upstream(), b"", "nothing was forwarded");
}

/// The agents speak HTTP/1.1 to a plain-http base URL; HTTP/2 without TLS (prior knowledge)
/// is not spoken: its preface gets the connection closed, not HTTP/2 settings.
#[tokio::test]
async fn cleartext_http2_is_not_spoken() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = MockServer::start(one_call_script()).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let mut tcp = tokio::net::TcpStream::connect(proxy.running.addr())
        .await
        .unwrap();
    // The client preface and an empty SETTINGS frame.
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // An HTTP/2 server answers with its SETTINGS frame at once; HTTP/1.1 closes.
    let mut first = [0u8; 64];
    let n = tcp.read(&mut first).await.unwrap_or(0);
    assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&first[..n]));
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    assert!(h2.get(proxy.url("/healthz")).send().await.is_err());
}
