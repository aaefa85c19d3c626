//! The mock model server over real sockets: each API in JSON and SSE, turn counting, side
//! requests, scripted errors, pacing and broken streams.

use futures_util::StreamExt;
use loopwarden::mock::{ErrorReply, MockServer, Script, ToolCall, Turn};
use serde_json::{json, Value};

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A two-step script: a read, then a final text.
fn read_then_done() -> Script {
    Script::with_turns(vec![
        Turn {
            text: Some("Let me look.".into()),
            tool_calls: vec![ToolCall::function(
                "Read",
                json!({"file_path": "/repo/calc.py"}),
            )],
            ..Turn::default()
        },
        Turn::text("All fixed."),
    ])
}

/// Splits an SSE body into (event name, data) pairs.
fn sse_events(body: &str) -> Vec<(Option<String>, String)> {
    body.replace("\r\n", "\n")
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (name, data)
        })
        .collect()
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    client()
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .send()
        .await
        .unwrap()
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn anthropic_stream_and_json() {
    let mock = MockServer::start(read_then_done()).await.unwrap();
    let url = format!("{}/tenant/x/v1/messages?beta=true", mock.url());
    let mut req = json!({"model": "claude-test", "stream": true, "tools": [{"name": "Read"}],
        "messages": [{"role": "user", "content": "fix it"}]});
    let resp = post(&url, &req).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_events(&resp.text().await.unwrap());
    let names: Vec<_> = events.iter().map(|(n, _)| n.clone().unwrap()).collect();
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    assert_eq!(
        names.iter().filter(|n| *n == "content_block_start").count(),
        2
    );
    let mut partial = String::new();
    let mut json_deltas = 0;
    let mut tool_id = String::new();
    for (_, data) in &events {
        let v: Value = serde_json::from_str(data).unwrap();
        if v["delta"]["type"] == "input_json_delta" {
            json_deltas += 1;
            partial.push_str(v["delta"]["partial_json"].as_str().unwrap());
        }
        if v["content_block"]["type"] == "tool_use" {
            tool_id = v["content_block"]["id"].as_str().unwrap().to_string();
        }
        if v["type"] == "message_delta" {
            assert_eq!(v["delta"]["stop_reason"], "tool_use");
        }
    }
    assert!(
        json_deltas >= 2,
        "arguments must be streamed over several deltas"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        json!({"file_path": "/repo/calc.py"})
    );

    // The client echoes the turn and the result: the mock moves on to turn 1, as JSON.
    req["stream"] = json!(false);
    req["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": tool_id, "name": "Read", "input": {}}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": "1\tdef add"}]}),
    ]);
    let v: Value = json_of(post(&url, &req).await).await;
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "All fixed.");
    assert_eq!(v["stop_reason"], "end_turn");

    let seen = mock.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].api, "anthropic");
    assert_eq!(seen[0].path, "/tenant/x/v1/messages");
    assert_eq!(seen[0].query.as_deref(), Some("beta=true"));
    assert_eq!((seen[0].turn_index, seen[1].turn_index), (0, 1));
    assert_eq!(seen[1].body, serde_json::to_vec(&req).unwrap());
    mock.shutdown().await;
}

#[tokio::test]
async fn chat_completions_stream_json_and_side_request() {
    let mock = MockServer::start(read_then_done()).await.unwrap();
    let url = format!("{}/v1/chat/completions", mock.url());
    let req = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
        "tools": [{"type": "function", "function": {"name": "Read"}}],
        "messages": [{"role": "user", "content": "go"}]});
    let events = sse_events(&post(&url, &req).await.text().await.unwrap());
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Let me look.");
    let arg_pieces: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(arg_pieces.len() >= 2);
    assert_eq!(
        serde_json::from_str::<Value>(&arg_pieces.concat()).unwrap(),
        json!({"file_path": "/repo/calc.py"})
    );
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    assert!(
        chunks.last().unwrap()["usage"]["total_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // Non-streaming, no tools: a side request answered with side_text.
    let side = json!({"model": "m", "messages": [{"role": "user", "content": "title?"}]});
    let v: Value = json_of(post(&url, &side).await).await;
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "OK");
    assert_eq!(mock.requests()[1].answer, "side");
}

#[tokio::test]
async fn responses_custom_tool_call_and_turns() {
    let patch = "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch\n";
    let script = Script::with_turns(vec![
        Turn::calls(vec![
            ToolCall::function("exec_command", json!({"cmd": "cat calc.py"})),
            ToolCall::function("exec_command", json!({"cmd": "ls"})),
        ]),
        Turn::calls(vec![ToolCall::custom("apply_patch", patch)]),
        Turn::text("done"),
    ]);
    let mock = MockServer::start(script).await.unwrap();
    let url = format!("{}/v1/responses", mock.url());
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sys"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]}),
    ];
    let mut completed = Vec::new();
    for _ in 0..3 {
        let req = json!({"model": "gpt-5.5", "stream": true, "tools": [{"type": "function", "name": "exec_command"}],
            "input": input});
        let events = sse_events(&post(&url, &req).await.text().await.unwrap());
        let parsed: Vec<Value> = events
            .iter()
            .map(|(_, d)| serde_json::from_str(d).unwrap())
            .collect();
        for (i, ((name, _), v)) in events.iter().zip(&parsed).enumerate() {
            assert_eq!(name.as_deref(), v["type"].as_str());
            assert_eq!(v["sequence_number"], i);
        }
        assert_eq!(parsed[0]["type"], "response.created");
        let last = parsed.last().unwrap();
        assert_eq!(last["type"], "response.completed");
        let output = last["response"]["output"].as_array().unwrap().clone();
        // Every streamed item's deltas add up to the completed item.
        for item in &output {
            let deltas: String = parsed
                .iter()
                .filter(|e| {
                    e["item_id"] == item["id"] && e["type"].as_str().unwrap().ends_with(".delta")
                })
                .map(|e| e["delta"].as_str().unwrap())
                .collect();
            let whole = item["arguments"]
                .as_str()
                .or(item["input"].as_str())
                .or(item["content"][0]["text"].as_str())
                .unwrap();
            assert_eq!(deltas, whole);
        }
        for item in &output {
            input.push(item.clone());
        }
        for item in &output {
            if let Some(call_id) = item["call_id"].as_str() {
                let kind = if item["type"] == "custom_tool_call" {
                    "custom_tool_call_output"
                } else {
                    "function_call_output"
                };
                input.push(json!({"type": kind, "call_id": call_id, "output": "ok"}));
            }
        }
        completed.push(output);
    }
    assert_eq!(completed[0].len(), 2);
    assert_eq!(completed[1][0]["type"], "custom_tool_call");
    assert_eq!(completed[1][0]["input"], patch);
    assert_eq!(completed[2][0]["content"][0]["text"], "done");
    let turns: Vec<usize> = mock.requests().iter().map(|r| r.turn_index).collect();
    assert_eq!(turns, [0, 1, 2]);
}

#[tokio::test]
async fn gemini_json_sse_array_and_count_tokens() {
    let mock = MockServer::start(read_then_done()).await.unwrap();
    let base = format!("{}/v1beta/models/gemini-test", mock.url());
    let req = json!({"contents": [{"role": "user", "parts": [{"text": "fix"}]}],
        "tools": [{"functionDeclarations": [{"name": "read_file"}]}]});

    let v: Value = json_of(post(&format!("{base}:generateContent"), &req).await).await;
    let parts = &v["candidates"][0]["content"]["parts"];
    assert_eq!(parts[0]["text"], "Let me look.");
    assert_eq!(
        parts[1]["functionCall"]["args"],
        json!({"file_path": "/repo/calc.py"})
    );
    assert_eq!(v["candidates"][0]["finishReason"], "STOP");

    let sse = post(&format!("{base}:streamGenerateContent?alt=sse"), &req).await;
    assert!(sse.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let chunks: Vec<Value> = sse_events(&sse.text().await.unwrap())
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks.len() >= 3);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Let me look.");
    assert_eq!(
        chunks.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );
    assert!(
        chunks.last().unwrap()["candidates"][0]["content"]["parts"][0]["functionCall"].is_object()
    );

    let array: Value = json_of(post(&format!("{base}:streamGenerateContent"), &req).await).await;
    assert_eq!(array.as_array().unwrap().len(), chunks.len());

    let count: Value = json_of(post(&format!("{base}:countTokens"), &req).await).await;
    assert!(count["totalTokens"].as_u64().unwrap() > 0);

    // The model's turn echoed back moves the script on.
    let mut next = req.clone();
    next["contents"].as_array_mut().unwrap().extend([
        json!({"role": "model", "parts": parts.clone()}),
        json!({"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "x"}}}]}),
    ]);
    let v: Value = json_of(post(&format!("{base}:generateContent"), &next).await).await;
    assert_eq!(
        v["candidates"][0]["content"]["parts"][0]["text"],
        "All fixed."
    );
    let apis: Vec<String> = mock.requests().iter().map(|r| r.api.clone()).collect();
    assert_eq!(
        apis,
        [
            "gemini",
            "gemini",
            "gemini",
            "gemini_count_tokens",
            "gemini"
        ]
    );
}

#[tokio::test]
async fn scripted_error_with_times_then_recovers() {
    let mut headers = std::collections::BTreeMap::new();
    headers.insert("retry-after".to_string(), "1".to_string());
    let script = Script::with_turns(vec![Turn {
        error: Some(ErrorReply {
            status: 429,
            body: None,
            headers,
            times: Some(2),
        }),
        then: Some(Box::new(Turn::text("recovered"))),
        ..Turn::default()
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let url = format!("{}/v1/messages", mock.url());
    let req = json!({"model": "m", "tools": [{"name": "Bash"}], "messages": [{"role": "user", "content": "x"}]});
    for _ in 0..2 {
        let resp = post(&url, &req).await;
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "1");
        let v: Value = json_of(resp).await;
        assert_eq!(v["error"]["type"], "rate_limit_error");
    }
    let v: Value = json_of(post(&url, &req).await).await;
    assert_eq!(v["content"][0]["text"], "recovered");

    // set_script resets the error budget.
    mock.set_script(
        Script::from_json(r#"{"turns":[{"error":{"status":500,"times":1}}]}"#).unwrap(),
    );
    let resp = post(
        &format!("{}/v1/chat/completions", mock.url()),
        &json!({"tools": [{"type": "function"}], "messages": []}),
    )
    .await;
    assert_eq!(resp.status(), 500);
    let v: Value = json_of(resp).await;
    assert_eq!(v["error"]["type"], "server_error");
    let answers: Vec<String> = mock.requests().iter().map(|r| r.answer.clone()).collect();
    assert_eq!(answers, ["error", "error", "turn", "error"]);
}

#[tokio::test]
async fn paced_stream_arrives_event_by_event() {
    let mut script = read_then_done();
    script.chunk_delay_ms = 40;
    let mock = MockServer::start(script).await.unwrap();
    let resp = post(
        &format!("{}/v1/chat/completions", mock.url()),
        &json!({"stream": true, "tools": [{"type": "function"}], "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    let mut stream = resp.bytes_stream();
    let mut frames = Vec::new();
    while let Some(chunk) = stream.next().await {
        frames.push(String::from_utf8(chunk.unwrap().to_vec()).unwrap());
    }
    // With a pause between events each one reaches the client as its own read.
    assert!(frames.len() > 5);
    for frame in &frames {
        assert_eq!(sse_events(frame).len(), 1, "one event per read: {frame:?}");
    }
    assert_eq!(frames.last().unwrap(), "data: [DONE]\n\n");
}

#[tokio::test]
async fn break_after_events_cuts_the_stream() {
    let script = Script::with_turns(vec![Turn {
        text: Some("a long answer that will never finish".into()),
        break_after_events: Some(3),
        ..Turn::default()
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let resp = post(
        &format!("{}/v1/messages", mock.url()),
        &json!({"stream": true, "tools": [{"name": "Bash"}], "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut received = String::new();
    let mut failed = false;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) => received.push_str(&String::from_utf8_lossy(&bytes)),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the body must end in an error, not a clean end");
    let names: Vec<_> = sse_events(&received)
        .into_iter()
        .map(|(n, _)| n.unwrap())
        .collect();
    assert_eq!(names, ["message_start", "ping", "content_block_start"]);
}

#[tokio::test]
async fn hang_never_answers_but_is_recorded() {
    let script = Script::with_turns(vec![Turn {
        hang: true,
        ..Turn::default()
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let err = client()
        .post(format!("{}/v1/responses", mock.url()))
        .timeout(std::time::Duration::from_millis(300))
        .body(json!({"tools": [{"type": "function"}], "input": []}).to_string())
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout());
    assert_eq!(mock.requests().len(), 1);
    mock.shutdown().await;
}

#[tokio::test]
async fn force_json_answers_a_stream_request_with_json() {
    let script = Script::with_turns(vec![Turn {
        force_json: true,
        ..Turn::text("plain")
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let resp = post(
        &format!("{}/v1/chat/completions", mock.url()),
        &json!({"stream": true, "tools": [{"type": "function"}], "messages": []}),
    )
    .await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let v: Value = json_of(resp).await;
    assert_eq!(v["choices"][0]["message"]["content"], "plain");
}

#[tokio::test]
async fn probes_get_plausible_answers() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let models: Value = json_of(
        client()
            .get(format!("{}/v1/models", mock.url()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(!models["data"].as_array().unwrap().is_empty());
    let head = client()
        .head(format!("{}/anything", mock.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    let count: Value = json_of(
        post(
            &format!("{}/v1/messages/count_tokens", mock.url()),
            &json!({"messages": []}),
        )
        .await,
    )
    .await;
    assert!(count["input_tokens"].as_u64().is_some());
    let unknown = post(&format!("{}/v1/nope", mock.url()), &json!({})).await;
    assert_eq!(unknown.status(), 404);
    // An empty script answers every turn with end_text.
    let v: Value = json_of(post(&format!("{}/v1/chat/completions", mock.url()),
        &json!({"tools": [{"type": "function"}], "messages": [{"role": "user", "content": "hi"}]}))
        .await).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Done.");
}

#[tokio::test]
async fn latency_delays_the_response_head() {
    let mut script = read_then_done();
    script.latency_ms = 3000;
    let mock = MockServer::start(script).await.unwrap();
    let err = client()
        .post(format!("{}/v1/chat/completions", mock.url()))
        .timeout(std::time::Duration::from_millis(200))
        .body(json!({"tools": [{"type": "function"}], "messages": []}).to_string())
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    mock.set_script(read_then_done());
    let v = json_of(
        post(
            &format!("{}/v1/chat/completions", mock.url()),
            &json!({"tools": [{"type": "function"}], "messages": []}),
        )
        .await,
    )
    .await;
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "Read"
    );
}

/// A mock serving a load test keeps the most recent requests only (64 MiB of bodies), not
/// every body it was sent.
#[tokio::test]
async fn a_mock_under_load_keeps_only_its_most_recent_requests() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let big = |i: usize| {
        json!({"model": "m", "messages": [{"role": "user", "content": format!("{i} {}", "x".repeat(1 << 20))}]})
            .to_string()
    };
    let c = client();
    for i in 0..80 {
        let r = c
            .post(format!("{}/v1/chat/completions", mock.url()))
            .body(big(i))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let kept = mock.requests();
    assert!(kept.len() < 80, "{} kept", kept.len());
    assert!(kept.iter().map(|r| r.body.len()).sum::<usize>() <= 64 << 20);
    let last = kept.last().unwrap().json();
    assert!(last["messages"][0]["content"]
        .as_str()
        .unwrap()
        .starts_with("79 "));
}
