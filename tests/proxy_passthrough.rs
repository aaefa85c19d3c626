//! Transparent forwarding over real sockets: the upstream receives the client's exact
//! bytes and headers, the client receives the upstream's exact bytes, streams arrive event
//! by event, and loopwarden's own prefixes are stripped.

mod proxy_support;

use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, Api, Tap, TestProxy, ALL_APIS};
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
/// the proxy keeps rather than copying (`proxy::body`): every request still reaches the
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
