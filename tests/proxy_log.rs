//! What the log records, over real sockets and a real database (each test on SQLite and on
//! PostgreSQL): conversations, requests, tool calls with their results, conversation
//! identity, and unparsed bodies.

mod proxy_support;

use loopwarden::mock::{MockServer, Script, ToolCall as MockCall, Turn};
use loopwarden::transcript::ToolCall;
use proxy_support::{client, Api, Backend, TestProxy, ALL_APIS};
use serde_json::{json, Value};

on_both_backends!(
    a_conversation_with_a_tool_call_is_logged_in_every_api,
    the_new_call_is_logged_from_the_response_before_its_result_arrives,
    conversation_identity_follows_the_documented_order,
    a_body_that_does_not_parse_is_forwarded_untouched_and_logged_as_unparsed,
);

const TASK: &str = "Fix the failing test in calc.py";

fn test_then_done() -> Script {
    Script::with_turns(vec![
        Turn {
            text: Some("Running the tests.".into()),
            tool_calls: vec![MockCall::function("bash", json!({"command": "pytest -q"}))],
            ..Turn::default()
        },
        Turn::text("Fixed."),
    ])
}

async fn send(
    proxy: &TestProxy,
    api: Api,
    stream: bool,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client()
        .post(proxy.url(api.path(stream)))
        .header("content-type", "application/json")
        .header(
            "user-agent",
            "opencode/1.4.3 ai-sdk/provider-utils/3.0.20 runtime/bun/1.3.5",
        )
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn a_conversation_with_a_tool_call_is_logged_in_every_api(backend: Backend) {
    let mock = MockServer::start(test_then_done()).await.unwrap();
    let proxy = TestProxy::on(backend, &mock.url()).await;
    for (api, stream) in [
        (Api::Chat, false),
        (Api::Responses, true),
        (Api::Anthropic, true),
        (Api::Gemini, true),
        (Api::Chat, true),
        (Api::Anthropic, false),
    ] {
        let id = format!("log-{api:?}-{stream}");
        let first = api.first_request(TASK, stream);
        let r = send(
            &proxy,
            api,
            stream,
            &first,
            &[("x-loopwarden-conversation", &id)],
        )
        .await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        let second = api.request(TASK, stream, &[("pytest -q", "1 failed, 3 passed")]);
        let r = send(
            &proxy,
            api,
            stream,
            &second,
            &[("x-loopwarden-conversation", &id)],
        )
        .await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        let what = format!("{api:?} stream={stream}");

        let conv = proxy
            .rows(&format!("SELECT * FROM conversations WHERE id = '{id}'"))
            .await;
        assert_eq!(conv.len(), 1, "{what}");
        let c = &conv[0];
        assert_eq!(c["requests"], 2, "{what}");
        // The policies' name of the client, not its user-agent's.
        assert_eq!(c["client"], "opencode", "{what}");
        assert_eq!(c["id_source"], "x-loopwarden-conversation", "{what}");
        let expected_dialect = match api {
            Api::Chat => "openai_chat",
            Api::Responses => "openai_responses",
            Api::Anthropic => "anthropic",
            Api::Gemini => "gemini",
        };
        assert_eq!(c["dialect"], expected_dialect, "{what}");
        let expected_model = match api {
            Api::Chat | Api::Responses => "gpt-5.5",
            Api::Anthropic => "claude-opus-5-5",
            Api::Gemini => "gemini-3.8-flash",
        };
        assert_eq!(c["model"], expected_model, "{what}");

        let requests = proxy
            .rows(&format!(
                "SELECT * FROM requests WHERE conversation_id = '{id}' ORDER BY steps"
            ))
            .await;
        assert_eq!(requests.len(), 2, "{what}");
        for (i, (row, body)) in requests.iter().zip([&first, &second]).enumerate() {
            assert_eq!(row["status"], 200, "{what}");
            assert_eq!(row["parse"], "parsed", "{what}");
            assert_eq!(row["steps"], i, "{what}");
            assert_eq!(row["decision"], "observe", "{what}");
            assert_eq!(row["applied"], "forwarded", "{what}");
            assert_eq!(row["outcome"], "complete", "{what}");
            assert_eq!(row["stream"], i64::from(stream), "{what}");
            assert_eq!(row["request_bytes"], body.to_string().len(), "{what}");
            assert!(row["response_bytes"].as_i64().unwrap() > 0, "{what}");
            assert!(row["upstream_latency_us"].as_i64().is_some(), "{what}");
            assert!(
                row["upstream_total_us"].as_i64() >= row["upstream_latency_us"].as_i64(),
                "{what}"
            );
            let overhead = row["proxy_overhead_us"].as_i64().unwrap();
            let body_read = row["body_read_us"].as_i64().unwrap();
            assert!((0..=overhead).contains(&body_read), "{what}: {row}");
            assert!(
                !row["path"].as_str().unwrap().contains('?'),
                "{what}: the query is never logged"
            );
        }
        // The response was decoded: usage and stop reason of the first answer.
        assert!(
            requests[0]["output_tokens"].as_i64().unwrap_or(0) > 0,
            "{what}: {}",
            requests[0]
        );
        assert!(requests[0]["stop_reason"].is_string(), "{what}");

        let calls = proxy
            .rows(&format!(
                "SELECT * FROM tool_calls WHERE conversation_id = '{id}'"
            ))
            .await;
        assert_eq!(calls.len(), 1, "{what}: {calls:?}");
        let call = &calls[0];
        assert_eq!(
            (call["step"].as_i64(), call["call_index"].as_i64()),
            (Some(0), Some(0)),
            "{what}"
        );
        assert_eq!(call["name"], "bash", "{what}");
        assert_eq!(call["summary"], "bash: pytest -q", "{what}");
        let expected_hash = ToolCall {
            id: String::new(),
            name: "bash".into(),
            args: json!({"command": "pytest -q"}),
        }
        .hash();
        assert_eq!(
            call["args_hash"],
            blake3::Hash::from(expected_hash).to_hex().as_str(),
            "{what}"
        );
        assert!(
            call["result_hash"].is_string(),
            "{what}: the second request carried the result"
        );
        assert!(
            call["result_summary"]
                .as_str()
                .unwrap()
                .contains("1 failed, 3 passed"),
            "{what}: {call}"
        );
        if api != Api::Gemini {
            assert_eq!(
                call["result_hash"],
                blake3::hash(b"1 failed, 3 passed").to_hex().as_str(),
                "{what}"
            );
        }
        if api == Api::Anthropic {
            assert_eq!(call["is_error"], 0, "{what}: Anthropic carries is_error");
        }
    }
}

async fn the_new_call_is_logged_from_the_response_before_its_result_arrives(backend: Backend) {
    let mock = MockServer::start(test_then_done()).await.unwrap();
    let proxy = TestProxy::on(backend, &mock.url()).await;
    for api in ALL_APIS {
        let id = format!("resp-{api:?}");
        let r = send(
            &proxy,
            api,
            true,
            &api.first_request(TASK, true),
            &[("x-loopwarden-conversation", &id)],
        )
        .await;
        r.bytes().await.unwrap();
        let calls = proxy
            .rows(&format!("SELECT name, step, summary, result_hash FROM tool_calls WHERE conversation_id = '{id}'"))
            .await;
        assert_eq!(
            calls,
            vec![
                json!({"name": "bash", "step": 0, "summary": "bash: pytest -q", "result_hash": null})
            ],
            "{api:?}"
        );
    }
}

async fn conversation_identity_follows_the_documented_order(backend: Backend) {
    let mock = MockServer::start(test_then_done()).await.unwrap();
    let proxy = TestProxy::on(backend, &mock.url()).await;
    let body = Api::Chat.first_request(TASK, false);
    let id_of = |r: &reqwest::Response| {
        r.headers()["x-loopwarden-conversation"]
            .to_str()
            .unwrap()
            .to_string()
    };
    // (request headers, expected id, expected id_source)
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("x-claude-code-session-id", "37546eee-2ef1")],
            "37546eee-2ef1",
            "x-claude-code-session-id",
        ),
        (
            vec![
                ("x-claude-code-session-id", "37546eee-2ef1"),
                ("x-claude-code-agent-id", "a1b2"),
            ],
            "37546eee-2ef1:a1b2",
            "x-claude-code-session-id",
        ),
        (
            vec![("session-id", "019a-thread"), ("thread-id", "019a-thread")],
            "019a-thread",
            "thread-id",
        ),
        (
            vec![("x-session-id", "ses_42"), ("x-session-affinity", "ses_42")],
            "ses_42",
            "x-session-id",
        ),
        (
            vec![
                ("x-loopwarden-conversation", "mine"),
                ("x-claude-code-session-id", "other"),
            ],
            "mine",
            "x-loopwarden-conversation",
        ),
    ];
    for (headers, expected, source) in cases {
        let r = send(&proxy, Api::Chat, false, &body, &headers).await;
        assert_eq!(id_of(&r), expected, "{headers:?}");
        let rows = proxy
            .rows(&format!(
                "SELECT id_source FROM conversations WHERE id = '{expected}'"
            ))
            .await;
        assert_eq!(rows, vec![json!({"id_source": source})]);
    }
    // The /c/{id} prefix names the conversation for clients that send no id...
    let r = client()
        .post(proxy.url("/c/run-9/v1/chat/completions"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&r), "run-9");
    // ...but our own header still wins over it.
    let r = client()
        .post(proxy.url("/c/run-9/v1/chat/completions"))
        .header("x-loopwarden-conversation", "hdr")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&r), "hdr");

    // No id at all: the hash of the stable head (system + first user message), the same
    // for every later request of the conversation, different for another task.
    let head = id_of(&send(&proxy, Api::Chat, false, &body, &[]).await);
    assert!(head.starts_with("h-"), "{head}");
    let later = Api::Chat.request(
        TASK,
        false,
        &[("pytest -q", "1 failed"), ("cat calc.py", "def add")],
    );
    assert_eq!(
        id_of(&send(&proxy, Api::Chat, false, &later, &[]).await),
        head
    );
    let other = Api::Chat.first_request("Another task entirely", false);
    assert_ne!(
        id_of(&send(&proxy, Api::Chat, false, &other, &[]).await),
        head
    );
    // Same head in another API: the head is the text, so it is the same conversation.
    let anthropic = Api::Anthropic.first_request(TASK, false);
    assert_eq!(
        id_of(&send(&proxy, Api::Anthropic, false, &anthropic, &[]).await),
        head
    );
}

async fn a_body_that_does_not_parse_is_forwarded_untouched_and_logged_as_unparsed(
    backend: Backend,
) {
    let mock = MockServer::start(test_then_done()).await.unwrap();
    let proxy = TestProxy::on(backend, &mock.url()).await;
    let bodies: [(&str, &[u8]); 3] = [
        (
            "/v1/chat/completions",
            br#"{"model": "gpt-5.5", "messages": [{"role": "user", "content": "unterminated"#,
        ),
        ("/v1/messages", b"\xff\xfe not json at all \x00\x01"),
        (
            "/v1beta/models/gemini-3.8-flash:generateContent",
            br#"{"contents": "should be a list"}"#,
        ),
    ];
    for (i, (path, body)) in bodies.iter().enumerate() {
        let id = format!("bad-{i}");
        let r = client()
            .post(proxy.url(path))
            .header("x-loopwarden-conversation", &id)
            .body(body.to_vec())
            .send()
            .await
            .unwrap();
        assert!(
            !r.headers().contains_key("x-loopwarden-decision"),
            "{path}: nothing was decided"
        );
        let status = r.status().as_u16();
        let seen = mock.requests().pop().unwrap();
        assert_eq!(seen.body.as_ref(), *body, "{path}: forwarded byte for byte");
        assert_eq!(seen.path, *path);
        let rows = proxy
            .rows(&format!("SELECT parse, parse_error, status, decision FROM requests WHERE conversation_id = '{id}'"))
            .await;
        assert_eq!(rows.len(), 1, "{path}");
        assert_eq!(rows[0]["parse"], "unparsed", "{path}");
        assert!(
            rows[0]["parse_error"]
                .as_str()
                .is_some_and(|e| !e.is_empty()),
            "{path}"
        );
        assert_eq!(rows[0]["status"], status, "{path}");
        assert_eq!(rows[0]["decision"], Value::Null, "{path}");
    }
}

/// A client's text that reaches the process log (here an unknown `previous_response_id`,
/// sent with every request: a newline that would forge an `ERROR` line, escape sequences
/// that would clear and colour the terminal) is written escaped, and the warning it causes
/// is written once per period however many requests cause it.
#[tokio::test]
async fn a_client_s_text_in_the_process_log_is_escaped_and_its_warning_rate_limited() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("Done.")]))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    let served = proxy_support::Served::start(
        &["--db", &db],
        &[
            ("LOOPWARDEN_OPENAI_BASE_URL", mock.url()),
            ("RUST_LOG", "info".into()),
        ],
    )
    .await;
    let forged =
        "resp_x\n2026-12-07T16:00:00.000000Z ERROR loopwarden: forged line\u{1b}[2J\u{1b}[31m";
    for _ in 0..20 {
        let body = json!({"model": "gpt-test", "stream": false, "previous_response_id": forged,
            "input": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "go on"}]}]});
        let r = client()
            .post(format!("{}/v1/responses", served.url))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let stderr = served.stop().await;
    assert!(
        !stderr.contains('\u{1b}'),
        "an escape reached the log: {stderr:?}"
    );
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("forged line"))
        .collect();
    assert_eq!(warned.len(), 1, "one line for 20 requests: {stderr}");
    assert!(warned[0].contains("never relayed"), "{stderr}");
    assert!(
        warned[0].contains("resp_x\\n2026-12-07T16:00:00.000000Z ERROR"),
        "{stderr}"
    );
}
