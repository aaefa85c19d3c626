//! The wire side of interventions: reminders spliced into requests, halt replies, the
//! tails that close a partially forwarded stream, and error bodies. Every reply is read
//! back with our own decoder and checked for the events a client needs.

use loopwarden::dialect::{Dialect, HaltOptions, HaltToolCall, StreamEventKind, UpstreamFailure};
use loopwarden::transcript::Item;
use serde_json::{json, Value};

const ALL: [Dialect; 4] = [
    Dialect::OpenAiChat,
    Dialect::OpenAiResponses,
    Dialect::Anthropic,
    Dialect::Gemini,
];
const HALT: &str =
    "[loopwarden] Halted: the same failing test ran 5 times. Resume with a new instruction.";

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `data:` payloads of an SSE body, parsed (`[DONE]` as a string).
fn sse_data(body: &[u8]) -> Vec<Value> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .split(['\n', '\r'])
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap_or(Value::String(data.to_string())))
        .collect()
}

/// Checks that an SSE body is a complete, well-formed answer of its API, as a client
/// reading it from the start would see it.
fn assert_well_formed(dialect: Dialect, body: &[u8]) {
    let data = sse_data(body);
    assert!(!data.is_empty());
    match dialect {
        Dialect::Anthropic => {
            assert_eq!(data[0]["type"], "message_start");
            assert_eq!(data.last().unwrap()["type"], "message_stop");
            assert_eq!(data[data.len() - 2]["type"], "message_delta");
            let mut open: Option<u64> = None;
            let mut next = 0;
            for d in &data {
                match d["type"].as_str().unwrap() {
                    "content_block_start" => {
                        assert!(open.is_none(), "block started inside another");
                        assert_eq!(d["index"], next, "indexes continue");
                        open = d["index"].as_u64();
                        next += 1;
                    }
                    "content_block_delta" => assert_eq!(d["index"].as_u64(), open),
                    "content_block_stop" => assert_eq!(d["index"].as_u64(), open.take()),
                    _ => {}
                }
            }
            assert!(open.is_none());
        }
        Dialect::OpenAiResponses => {
            assert_eq!(data[0]["type"], "response.created");
            let last = data.last().unwrap();
            assert_eq!(last["type"], "response.completed");
            for (i, d) in data.iter().enumerate() {
                assert_eq!(d["sequence_number"], i as u64, "sequence numbers continue");
            }
            let done: Vec<&Value> = data
                .iter()
                .filter(|d| d["type"] == "response.output_item.done")
                .map(|d| &d["item"])
                .collect();
            let added: Vec<u64> = data
                .iter()
                .filter(|d| d["type"] == "response.output_item.added")
                .map(|d| d["output_index"].as_u64().unwrap())
                .collect();
            assert_eq!(
                added,
                (0..added.len() as u64).collect::<Vec<_>>(),
                "output indexes continue"
            );
            let output: Vec<&Value> = last["response"]["output"]
                .as_array()
                .unwrap()
                .iter()
                .collect();
            assert_eq!(output, done, "the final object lists every finished item");
            assert_eq!(last["response"]["status"], "completed");
            assert!(last["response"]["id"]
                .as_str()
                .unwrap()
                .starts_with("resp_"));
            assert_eq!(last["response"]["usage"]["output_tokens"], 0);
        }
        Dialect::OpenAiChat => {
            assert_eq!(data.last().unwrap(), &json!("[DONE]"));
            let chunks = &data[..data.len() - 1];
            let id = &chunks[0]["id"];
            assert!(id.as_str().unwrap().starts_with("chatcmpl-"));
            assert!(chunks
                .iter()
                .all(|c| &c["id"] == id && c["object"] == "chat.completion.chunk"));
            let finishes = chunks
                .iter()
                .filter(|c| !c["choices"][0]["finish_reason"].is_null())
                .count();
            assert_eq!(finishes, 1);
            assert!(!chunks.last().unwrap()["choices"][0]["finish_reason"].is_null());
        }
        Dialect::Gemini => {
            let last = data.last().unwrap();
            assert_eq!(last["candidates"][0]["finishReason"], "STOP");
            assert_eq!(last["usageMetadata"]["totalTokenCount"], 0);
        }
    }
}

fn decode(dialect: Dialect, body: &[u8]) -> loopwarden::dialect::ResponseTurn {
    let mut d = dialect.stream_decoder();
    let events: Vec<_> = body.chunks(17).flat_map(|c| d.feed(c)).collect();
    let last = events.last().map(|e| e.kind);
    // Gemini sends a call whole, in the same object as the finish reason
    let ends = last == Some(StreamEventKind::MessageEnd)
        || (dialect == Dialect::Gemini && last == Some(StreamEventKind::ToolCallComplete));
    assert!(ends, "{dialect:?} ends with {last:?}");
    d.finish()
}

fn submit_call() -> HaltToolCall {
    HaltToolCall {
        name: "bash".into(),
        arguments: json!({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    }
}

#[test]
fn halt_replies_are_complete_in_both_modes() {
    for dialect in ALL {
        for call in [None, Some(submit_call())] {
            let mut opts = HaltOptions {
                model: Some("model-x".into()),
                stream: true,
                tool_call: call.clone(),
            };
            let reply = dialect.halt_reply(&opts, HALT);
            assert!(
                reply.content_type.starts_with("text/event-stream"),
                "{dialect:?}"
            );
            assert_well_formed(dialect, &reply.body);
            let turn = decode(dialect, &reply.body);
            assert_eq!(turn.text, HALT, "{dialect:?}");
            assert_eq!(
                turn.input_tokens.unwrap_or(0) + turn.output_tokens.unwrap_or(0),
                0
            );
            let expected_stop = match (dialect, call.is_some()) {
                (Dialect::Anthropic, false) => "end_turn",
                (Dialect::Anthropic, true) => "tool_use",
                (Dialect::OpenAiChat, false) => "stop",
                (Dialect::OpenAiChat, true) => "tool_calls",
                (Dialect::OpenAiResponses, _) => "completed",
                (Dialect::Gemini, _) => "STOP",
            };
            assert_eq!(
                turn.stop_reason.as_deref(),
                Some(expected_stop),
                "{dialect:?}"
            );
            let names: Vec<_> = turn.calls.iter().map(|c| c.name.as_str()).collect();
            let args: Vec<_> = turn.calls.iter().map(|c| c.args.clone()).collect();
            match &call {
                Some(c) => {
                    assert_eq!(names, vec!["bash"]);
                    assert_eq!(args, vec![c.arguments.clone()]);
                }
                None => assert!(names.is_empty()),
            }

            opts.stream = false;
            let reply = dialect.halt_reply(&opts, HALT);
            assert_eq!(reply.content_type, "application/json");
            let json_turn = dialect.parse_response(&reply.body).unwrap();
            assert_eq!(json_turn.text, turn.text);
            assert_eq!(json_turn.calls.len(), turn.calls.len());
            assert_eq!(json_turn.stop_reason, turn.stop_reason);
            let v: Value = serde_json::from_slice(&reply.body).unwrap();
            let id = match dialect {
                Dialect::Anthropic => {
                    v["id"].as_str().unwrap().starts_with("msg_") && v["model"] == "model-x"
                }
                Dialect::OpenAiChat => {
                    v["id"].as_str().unwrap().starts_with("chatcmpl-") && v["model"] == "model-x"
                }
                Dialect::OpenAiResponses => {
                    v["id"].as_str().unwrap().starts_with("resp_") && v["model"] == "model-x"
                }
                Dialect::Gemini => v["modelVersion"] == "model-x",
            };
            assert!(id, "{dialect:?}: {v}");
        }
    }
    // two halts do not share ids
    let opts = HaltOptions {
        stream: false,
        ..Default::default()
    };
    assert_ne!(
        Dialect::Anthropic.halt_reply(&opts, HALT),
        Dialect::Anthropic.halt_reply(&opts, HALT)
    );
}

/// Forwards events the way an intervention layer does (text at once, tool-call events
/// held), halts at the first complete call, and checks the client's view.
fn forwarded_then_halted(dialect: Dialect, stream: &[u8], release_first: bool) -> Vec<u8> {
    let mut d = dialect.stream_decoder();
    let mut client = Vec::new();
    let mut held = Vec::new();
    let mut released = false;
    for chunk in stream.chunks(11) {
        for ev in d.feed(chunk) {
            let tool = matches!(
                ev.kind,
                StreamEventKind::ToolCallStart
                    | StreamEventKind::ToolCallDelta
                    | StreamEventKind::ToolCallComplete
            );
            if !tool && held.is_empty() {
                client.extend_from_slice(&ev.raw);
                continue;
            }
            held.extend_from_slice(&ev.raw);
            if ev.kind == StreamEventKind::ToolCallComplete {
                if release_first && !released {
                    released = true;
                    client.append(&mut held);
                    d.mark_released();
                } else {
                    client.extend_from_slice(&d.halt_tail(HALT));
                    return client;
                }
            }
        }
    }
    panic!("{dialect:?}: no call to halt on");
}

fn stream_fixture(name: &str) -> Vec<u8> {
    fixture(&format!("responses/{name}"))
}

#[test]
fn halt_tails_close_streams_in_place_of_the_held_call() {
    for (dialect, name, text_before) in [
        (Dialect::Anthropic, "anthropic.sse", "Let me read it again."),
        (Dialect::OpenAiChat, "openai-chat.sse", "Running the tests."),
        (
            Dialect::OpenAiResponses,
            "openai-responses.sse",
            "Patching now.",
        ),
        (Dialect::Gemini, "gemini.sse", "Reading the file."),
    ] {
        let client = forwarded_then_halted(dialect, &stream_fixture(name), false);
        assert_well_formed(dialect, &client);
        let turn = decode(dialect, &client);
        assert!(
            turn.calls.is_empty(),
            "{dialect:?}: the held call never reaches the client"
        );
        assert_eq!(turn.text, format!("{text_before}{HALT}"), "{dialect:?}");
    }
    // Gemini without alt=sse: the client gets one valid JSON array
    let client =
        forwarded_then_halted(Dialect::Gemini, &stream_fixture("gemini-array.json"), false);
    let array: Vec<Value> = serde_json::from_slice(&client).unwrap();
    assert_eq!(array.len(), 4);
    assert_eq!(
        array[3]["candidates"][0]["content"]["parts"][0]["text"],
        HALT
    );
    assert_eq!(
        Dialect::Gemini.parse_response(&client).unwrap().text,
        format!("Reading the file.{HALT}")
    );
}

#[test]
fn halt_tail_after_a_released_call_keeps_it() {
    for (dialect, name, first) in [
        (Dialect::Anthropic, "anthropic.sse", "Read"),
        (
            Dialect::OpenAiResponses,
            "openai-responses.sse",
            "exec_command",
        ),
    ] {
        let client = forwarded_then_halted(dialect, &stream_fixture(name), true);
        assert_well_formed(dialect, &client);
        let turn = decode(dialect, &client);
        let names: Vec<_> = turn.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec![first], "{dialect:?}");
        assert!(turn.text.ends_with(HALT));
    }
}

#[test]
fn halt_tail_with_nothing_forwarded_is_a_whole_reply() {
    for dialect in ALL {
        let tail = dialect.stream_decoder().halt_tail(HALT);
        assert_well_formed(dialect, &tail);
        assert_eq!(decode(dialect, &tail).text, HALT);
    }
}

/// The reminder is the last item of the last message, every message before it keeps
/// its bytes, and the body outside the edited region is unchanged.
fn check_reminder(dialect: Dialect, body: &[u8], stream_path: bool) -> Vec<u8> {
    let reminder =
        "[loopwarden] You ran `pytest -q` 4 times with the same failure. Try a different approach.";
    let out = dialect.append_reminder(body, reminder).unwrap();
    serde_json::from_slice::<Value>(&out).expect("valid JSON");
    let before = dialect.view(body, stream_path).unwrap();
    let after = dialect.view(&out, stream_path).unwrap();
    // earlier messages: byte for byte
    let kept = before.messages.len() - 1;
    for (a, b) in before.messages[..kept].iter().zip(&after.messages) {
        assert_eq!(a.get(), b.get());
    }
    // everything before the last message is the same bytes, and so is everything after
    // the edit (the end of the body)
    let last = before.messages[kept].get();
    let last_start = last.as_ptr() as usize - body.as_ptr() as usize;
    assert_eq!(&out[..last_start], &body[..last_start]);
    let tail = &body[last_start + last.len()..];
    assert!(out.ends_with(tail));
    let items: Vec<Item> = after
        .messages
        .iter()
        .flat_map(|m| dialect.parse_message(m.get()))
        .collect();
    match (dialect, items.last().unwrap()) {
        (Dialect::OpenAiChat | Dialect::OpenAiResponses, Item::System { text }) => {
            assert_eq!(text, reminder)
        }
        (Dialect::Anthropic | Dialect::Gemini, Item::User { text }) => {
            assert!(text.ends_with(reminder), "{text}")
        }
        (_, other) => panic!("{dialect:?}: last item {other:?}"),
    }
    // the transcript before the reminder is what it was
    let old = dialect.parse_request(body, stream_path).unwrap().transcript;
    let new = dialect.parse_request(&out, stream_path).unwrap().transcript;
    assert_eq!(old.steps.len(), new.steps.len());
    for (a, b) in old.steps.iter().zip(&new.steps) {
        assert_eq!(a.calls, b.calls);
    }
    out
}

#[test]
fn reminders_are_spliced_after_the_cached_prefix() {
    for (dialect, name) in [
        (Dialect::Anthropic, "claude-code-anthropic.json"),
        (Dialect::Anthropic, "opencode-anthropic.json"),
        (Dialect::OpenAiChat, "opencode-chat.json"),
        (Dialect::OpenAiChat, "mini-swe-agent-chat.json"),
        (Dialect::OpenAiChat, "mini-swe-agent-textbased.json"),
        (Dialect::OpenAiResponses, "codex-responses.json"),
        (Dialect::OpenAiResponses, "opencode-responses.json"),
        (Dialect::OpenAiResponses, "mini-swe-agent-responses.json"),
        (Dialect::Gemini, "gemini-cli.json"),
    ] {
        let body = fixture(name);
        let out = check_reminder(dialect, &body, dialect == Dialect::Gemini);
        // the system prompt / first message are untouched: a pure insertion or an edit
        // of the last message only
        assert!(out.len() > body.len(), "{name}");
    }
}

#[test]
fn reminder_keeps_tool_results_first_and_wraps_string_content() {
    // Anthropic: results first, reminder last
    let out = check_reminder(
        Dialect::Anthropic,
        &fixture("claude-code-anthropic.json"),
        false,
    );
    let v: Value = serde_json::from_slice(&out).unwrap();
    let content = v["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content[0]["type"], "tool_result");
    assert_eq!(content.last().unwrap()["type"], "text");

    // Anthropic string content becomes blocks, the original text first
    let body = br#"{"model":"m","messages":[{"role":"user","content":"Fix \"it\" please"}],"max_tokens":5}"#;
    let out = check_reminder(Dialect::Anthropic, body, false);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["messages"][0]["content"][0],
        json!({"type": "text", "text": "Fix \"it\" please"})
    );

    // Anthropic history ending with an assistant prefill: a new user turn
    let body =
        br#"{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Sure"}]}"#;
    let out = check_reminder(Dialect::Anthropic, body, false);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["messages"][2]["role"], "user");

    // Responses: a plain string input becomes a list
    let body = br#"{"model":"m","input":"What is \u00e9?","stream":true}"#;
    let out = Dialect::OpenAiResponses
        .append_reminder(body, "be brief")
        .unwrap();
    let p = Dialect::OpenAiResponses.parse_request(&out, false).unwrap();
    assert_eq!(p.transcript.task, vec!["What is é?".to_string()]);
    assert_eq!(p.transcript.system, vec!["be brief".to_string()]);
    assert!(p.stream);

    // Gemini: the text part goes after the function responses of the last user content
    let out = check_reminder(Dialect::Gemini, &fixture("gemini-cli.json"), true);
    let v: Value = serde_json::from_slice(&out).unwrap();
    let parts = v["contents"].as_array().unwrap().last().unwrap()["parts"]
        .as_array()
        .unwrap()
        .clone();
    assert!(parts[0].get("functionResponse").is_some());
    assert!(parts.last().unwrap()["text"]
        .as_str()
        .unwrap()
        .contains("pytest"));

    // nothing to append to, or not JSON: an error, never a panic
    let empty = b"{\"messages\":[],\"input\":[],\"contents\":[]}";
    for d in ALL {
        assert!(d.append_reminder(b"not json", "x").is_err());
        if d == Dialect::OpenAiResponses {
            // an empty input list still takes the reminder
            let out = d.append_reminder(empty, "x").unwrap();
            assert_eq!(
                d.parse_request(&out, false).unwrap().transcript.system,
                vec!["x".to_string()]
            );
        } else {
            assert!(d.append_reminder(empty, "x").is_err(), "{d:?}");
        }
    }
}

#[test]
fn error_bodies_use_each_apis_shape() {
    let msg = "loopwarden: upstream https://api.example unreachable (connection refused)";
    for d in ALL {
        for failure in [UpstreamFailure::Unreachable, UpstreamFailure::Timeout] {
            let v: Value = serde_json::from_slice(&d.error_body(msg, failure)).unwrap();
            match d {
                Dialect::Anthropic => {
                    assert_eq!(v["type"], "error");
                    assert_eq!(v["error"]["message"], msg);
                    assert!(v["error"]["type"].is_string());
                }
                Dialect::OpenAiChat | Dialect::OpenAiResponses => {
                    assert_eq!(v["error"]["message"], msg);
                    assert_eq!(v["error"]["type"], "server_error");
                }
                Dialect::Gemini => {
                    assert_eq!(v["error"]["code"], failure.status());
                    assert_eq!(v["error"]["message"], msg);
                }
            }
        }
    }
    assert_eq!(UpstreamFailure::Unreachable.status(), 502);
    assert_eq!(UpstreamFailure::Timeout.status(), 504);
}
