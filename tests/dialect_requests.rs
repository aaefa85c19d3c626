//! Request parsing: each client's wire shape (our own fixtures, same shapes as the
//! captured ones) parsed to the expected transcript, plus every captured request in
//! ../shared/fixtures/requests/ (beside the checkout) when that directory exists.

use loopwarden::dialect::compaction;
use loopwarden::dialect::Dialect;
use loopwarden::transcript::{CallWithResult, Transcript};
use serde_json::json;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn parse(
    dialect: Dialect,
    name: &str,
    stream_path: bool,
) -> (loopwarden::dialect::ParsedRequest, Transcript) {
    let body = fixture(name);
    let parsed = dialect.parse_request(&body, stream_path).expect(name);
    let t = parsed.transcript.clone();
    (parsed, t)
}

/// (name, canonical args, result text, error flag) of one call.
fn call(c: &CallWithResult) -> (&str, String, Option<&str>, Option<bool>) {
    (
        c.call.name.as_str(),
        c.call.canonical_args(),
        c.result.as_ref().map(|r| r.text.as_str()),
        c.result.as_ref().and_then(|r| r.is_error),
    )
}

#[test]
fn claude_code_anthropic() {
    let (p, t) = parse(Dialect::Anthropic, "claude-code-anthropic.json", false);
    assert_eq!(p.model.as_deref(), Some("claude-test-model"));
    assert!(p.stream && p.has_tools);
    assert_eq!(
        t.system,
        vec![
            "x-anthropic-billing-header: cc_version=0.0.0;\nYou are a coding agent.".to_string(),
            "# Environment\nWorking directory: /work/proj".to_string(),
            "The user hasn't heard from you in a while.".to_string(),
        ]
    );
    assert_eq!(
        t.task,
        vec![
            "<system-reminder>\ngit status: clean\n</system-reminder>\nMake the tests pass."
                .to_string()
        ]
    );
    assert_eq!(t.steps.len(), 4);
    // thinking is ignored, text kept
    assert_eq!(t.steps[0].text, "Reading the module first.");
    assert_eq!(
        call(&t.steps[0].calls[0]),
        (
            "Read",
            r#"{"file_path":"/work/proj/mod.py","limit":50}"#.into(),
            Some("1\tx = 1\n2\ty = 2"),
            None
        )
    );
    // parallel calls; key order does not matter; block-list result joined
    assert_eq!(t.steps[1].calls.len(), 2);
    assert_eq!(
        t.steps[1].calls[0].call.hash(),
        t.steps[0].calls[0].call.hash()
    );
    assert_eq!(
        t.steps[1].calls[0].result.as_ref().unwrap().text,
        "1\tx = 1\n2\ty = 2"
    );
    assert_eq!(
        call(&t.steps[1].calls[1]),
        (
            "Bash",
            r#"{"command":"pytest -q","description":"Run tests"}"#.into(),
            Some("Exit code 1\nFAILED test_mod.py::test_x"),
            Some(true)
        )
    );
    assert_eq!(call(&t.steps[2].calls[0]).3, Some(true));
    assert_eq!(
        t.steps[2].calls[0].call.args,
        json!({"file_path": "/work/proj/mod.py", "new_string": "x = 2", "old_string": "x = 1", "replace_all": false})
    );
    // text after the results in a user message is a human speaking
    assert_eq!(
        t.steps[2].user_after,
        vec!["Please stop editing that file.".to_string()]
    );
    assert_eq!(call(&t.steps[3].calls[0]).2, Some("2 passed"));
    assert_eq!(call(&t.steps[3].calls[0]).3, Some(false));
}

#[test]
fn opencode_anthropic() {
    let (p, t) = parse(Dialect::Anthropic, "opencode-anthropic.json", false);
    assert!(p.stream && p.has_tools);
    assert_eq!(t.system, vec!["You are opencode.".to_string()]);
    assert_eq!(t.goal(), "\"Fix the failing test.\"");
    assert_eq!(t.steps.len(), 2);
    assert_eq!(
        call(&t.steps[0].calls[0]),
        (
            "read",
            r#"{"filePath":"/p/calc.py"}"#.into(),
            Some("File not found: /p/calc.py"),
            Some(true)
        )
    );
    // opencode's failing shell result: output only, no flag
    assert_eq!(call(&t.steps[1].calls[0]).2, Some("FAILED: test_add\n"));
    assert_eq!(call(&t.steps[1].calls[0]).3, None);
}

#[test]
fn codex_responses() {
    let (p, t) = parse(Dialect::OpenAiResponses, "codex-responses.json", false);
    assert_eq!(p.model.as_deref(), Some("gpt-test"));
    assert!(p.stream && p.has_tools);
    assert_eq!(
        t.system,
        vec![
            "You are Codex.".to_string(),
            "<skills_instructions>none</skills_instructions>".to_string()
        ]
    );
    assert_eq!(t.task.len(), 2);
    assert_eq!(
        t.goal(),
        "<environment_context>\n  <cwd>/p</cwd>\n</environment_context>"
    );
    assert_eq!(t.task[1], "Fix the failing test.");
    // reasoning + message + function_call form one turn; the next calls (after outputs)
    // another; the parallel pair one; the custom call one.
    assert_eq!(t.steps.len(), 3, "{:#?}", t.steps);
    assert_eq!(t.steps[0].text, "Looking first.");
    assert_eq!(t.steps[0].calls.len(), 1);
    assert_eq!(
        call(&t.steps[0].calls[0]),
        (
            "exec_command",
            r#"{"cmd":"cat calc.py","workdir":"/p"}"#.into(),
            Some("Chunk ID: 1a2b3c\nWall time: 0.0000 seconds\nProcess exited with code 0\nOutput:\ndef add(a, b):\n"),
            None
        )
    );
    assert_eq!(t.steps[1].calls.len(), 2);
    assert_eq!(
        t.steps[1].calls[0].call.hash(),
        t.steps[0].calls[0].call.hash()
    );
    assert_eq!(
        call(&t.steps[1].calls[1]).2,
        Some("Chunk ID: 777777\nProcess exited with code 1\nOutput:\nFAILED\n")
    );
    let patch = &t.steps[2].calls[0];
    assert_eq!(patch.call.name, "apply_patch");
    assert_eq!(patch.call.id, "call_4");
    assert_eq!(
        patch.call.args,
        json!("*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch\n")
    );
    assert_eq!(
        patch.result.as_ref().unwrap().text,
        "apply_patch verification failed: Failed to find expected lines"
    );
    assert_eq!(t.steps[2].user_after, vec!["Try again.".to_string()]);
}

#[test]
fn opencode_responses() {
    let (p, t) = parse(Dialect::OpenAiResponses, "opencode-responses.json", false);
    assert!(p.stream && p.has_tools);
    assert_eq!(t.system, vec!["You are OpenCode.".to_string()]);
    assert_eq!(t.goal(), "\"Fix the failing test.\"");
    assert_eq!(t.steps.len(), 3);
    assert_eq!(t.steps[0].text, "Reading.");
    assert_eq!(call(&t.steps[0].calls[0]).0, "read");
    assert_eq!(call(&t.steps[1].calls[0]).0, "invalid");
    assert_eq!(
        t.steps[1].calls[0].call.args,
        json!({"error": "Model tried to call unavailable tool 'edit'.", "tool": "edit"})
    );
    assert_eq!(
        call(&t.steps[2].calls[0]),
        (
            "apply_patch",
            r#"{"patchText":"*** Begin Patch\n*** Add File: NOTES.md\n+done\n*** End Patch"}"#
                .into(),
            Some("Success. Updated the following files:\nA NOTES.md"),
            None
        )
    );
}

#[test]
fn mini_swe_agent_responses_with_litellm_fields() {
    let (p, t) = parse(
        Dialect::OpenAiResponses,
        "mini-swe-agent-responses.json",
        false,
    );
    assert!(!p.stream && p.has_tools);
    assert_eq!(
        t.system,
        vec!["You are a helpful assistant that can interact with a computer.".to_string()]
    );
    assert_eq!(t.steps.len(), 2);
    assert_eq!(t.steps[0].text, "THOUGHT: look first.");
    assert_eq!(
        call(&t.steps[0].calls[0]),
        (
            "bash",
            r#"{"command":"cat calc.py"}"#.into(),
            Some("{\n  \"returncode\": 0,\n  \"output\": \"def add(a, b):\\n\"\n}"),
            None
        )
    );
    assert_eq!(
        call(&t.steps[1].calls[0]).1,
        r#"{"command":"python3 test.py"}"#
    );
}

#[test]
fn responses_plain_string_input() {
    let body = br#"{"model":"m","instructions":"Be brief.","input":"What is 2+2?","stream":false}"#;
    let p = Dialect::OpenAiResponses.parse_request(body, false).unwrap();
    assert!(!p.has_tools && !p.stream);
    assert_eq!(p.transcript.system, vec!["Be brief.".to_string()]);
    assert_eq!(p.transcript.task, vec!["What is 2+2?".to_string()]);
    assert!(p.transcript.steps.is_empty());
}

#[test]
fn opencode_chat() {
    let (p, t) = parse(Dialect::OpenAiChat, "opencode-chat.json", false);
    assert!(p.stream && p.has_tools);
    assert_eq!(t.system, vec!["You are opencode.".to_string()]);
    assert_eq!(t.steps.len(), 3);
    assert_eq!(t.steps[0].text, "Reading first.");
    // parallel calls, results out of order, paired by id; block-list result joined
    assert_eq!(
        call(&t.steps[1].calls[0]),
        (
            "read",
            r#"{"filePath":"/p/calc.py"}"#.into(),
            Some("<path>/p/calc.py</path>\n1: def add(a, b):"),
            None
        )
    );
    assert_eq!(
        call(&t.steps[1].calls[1]),
        (
            "bash",
            r#"{"command":"python3 test.py","description":"Run"}"#.into(),
            Some("FAILED: test_add\n"),
            None
        )
    );
    // empty arguments string = no arguments
    assert_eq!(t.steps[2].calls[0].call.args, json!({}));
    assert_eq!(t.steps[2].text, "");
}

#[test]
fn mini_swe_agent_chat() {
    let (p, t) = parse(Dialect::OpenAiChat, "mini-swe-agent-chat.json", false);
    assert!(!p.stream && p.has_tools);
    assert_eq!(p.model.as_deref(), Some("openai/test-mini"));
    assert_eq!(t.steps.len(), 2);
    assert_eq!(
        call(&t.steps[0].calls[0]),
        (
            "bash",
            r#"{"command":"cat calc.py"}"#.into(),
            Some("{\n  \"returncode\": 0,\n  \"output\": \"def add(a, b):\\n\"\n}"),
            None
        )
    );
    // consecutive user messages after a format error
    assert_eq!(
        t.steps[0].user_after,
        vec![
            "Tool call error: No tool calls found in the response.".to_string(),
            "Please continue.".to_string()
        ]
    );
    assert_eq!(
        call(&t.steps[1].calls[0]).2,
        Some("{\n  \"returncode\": 1,\n  \"output\": \"FAILED\\n\"\n}")
    );
}

#[test]
fn mini_swe_agent_textbased_chat() {
    let (p, t) = parse(Dialect::OpenAiChat, "mini-swe-agent-textbased.json", false);
    assert!(!p.has_tools && !p.stream);
    assert_eq!(t.steps.len(), 2);
    // actions live in the assistant text; results are user messages
    assert_eq!(
        t.steps[1].text,
        "THOUGHT: run tests.\n\n```mswea_bash_command\npython3 test.py\n```"
    );
    assert!(t.steps[1].calls.is_empty());
    assert_eq!(
        t.steps[1].user_after,
        vec!["<returncode>1</returncode>\n<output>\nFAILED\n</output>".to_string()]
    );
}

#[test]
fn gemini_cli() {
    let (p, t) = parse(Dialect::Gemini, "gemini-cli.json", true);
    assert!(p.stream && p.has_tools);
    assert_eq!(p.model, None);
    assert_eq!(t.system, vec!["You are Gemini CLI.".to_string()]);
    assert_eq!(t.task.len(), 2);
    assert_eq!(t.steps.len(), 3);
    // thought parts are not text
    assert_eq!(t.steps[0].text, "Reading first.");
    assert_eq!(
        call(&t.steps[0].calls[0]),
        (
            "read_file",
            r#"{"file_path":"/p/calc.py"}"#.into(),
            Some("def add(a, b):\n"),
            None
        )
    );
    assert_eq!(
        call(&t.steps[1].calls[1]),
        (
            "run_shell_command",
            r#"{"command":"python3 test.py","description":"Run"}"#.into(),
            Some("<untrusted_context>\nOutput: FAILED\nExit Code: 1\nProcess Group PGID: 4242\n</untrusted_context>"),
            None
        )
    );
    assert_eq!(call(&t.steps[1].calls[0]).2, Some("def add(a, b):\n"));
    // no ids: paired by name; response.error is an error
    assert_eq!(t.steps[2].calls[0].call.id, "");
    assert_eq!(
        call(&t.steps[2].calls[0]),
        (
            "read_file",
            r#"{"file_path":"/p/missing.py"}"#.into(),
            Some("File not found: /p/missing.py"),
            Some(true)
        )
    );
    // not streaming when the path does not ask for it
    let p = Dialect::Gemini
        .parse_request(&fixture("gemini-cli.json"), false)
        .unwrap();
    assert!(!p.stream);
}

#[test]
fn parse_message_depends_only_on_its_bytes() {
    let body = fixture("codex-responses.json");
    let view = Dialect::OpenAiResponses.view(&body, false).unwrap();
    assert_eq!(view.messages.len(), 15);
    for raw in &view.messages {
        // each raw slice points into the body
        let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
        assert_eq!(&body[start..start + raw.get().len()], raw.get().as_bytes());
        let copy = raw.get().to_string();
        assert_eq!(
            Dialect::OpenAiResponses.parse_message(raw.get()),
            Dialect::OpenAiResponses.parse_message(&copy)
        );
    }
}

#[test]
fn bad_bodies_are_errors_not_panics() {
    for d in [
        Dialect::OpenAiChat,
        Dialect::OpenAiResponses,
        Dialect::Anthropic,
        Dialect::Gemini,
    ] {
        for body in [
            &b""[..],
            b"{",
            b"[]",
            b"null",
            b"{\"messages\": 3}",
            b"\xff\xfe",
            b"{\"model\":\"x\"}",
        ] {
            assert!(d.view(body, false).is_err(), "{d:?} {body:?}");
        }
        for raw in [
            "",
            "{",
            "3",
            "[1,2]",
            "{\"role\":5}",
            "{\"content\":[1,{\"type\":7}]}",
            "\"\\ud800\"",
        ] {
            let _ = d.parse_message(raw);
        }
    }
    // a message with one bad block keeps the good ones
    let items = Dialect::Anthropic.parse_message(
        r#"{"role":"assistant","content":[{"type":"text","text":5},{"type":"tool_use","id":"t","name":"Read","input":{"a":1}}]}"#,
    );
    assert_eq!(items.len(), 1);
    match &items[0] {
        loopwarden::transcript::Item::Assistant { calls, .. } => assert_eq!(calls[0].name, "Read"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn from_path_recognises_each_api() {
    let cases: &[(&str, Option<(Dialect, bool)>)] = &[
        ("/v1/chat/completions", Some((Dialect::OpenAiChat, false))),
        (
            "/openai/v1/chat/completions",
            Some((Dialect::OpenAiChat, false)),
        ),
        ("/v1/responses", Some((Dialect::OpenAiResponses, false))),
        (
            "/c/abc/v1/responses?x=1",
            Some((Dialect::OpenAiResponses, false)),
        ),
        ("/v1/messages?beta=true", Some((Dialect::Anthropic, false))),
        ("/c/abc/v1/messages", Some((Dialect::Anthropic, false))),
        ("/anthropic/v1/messages", Some((Dialect::Anthropic, false))),
        ("/v1/messages/count_tokens", None),
        (
            "/v1beta/models/gemini-x:generateContent",
            Some((Dialect::Gemini, false)),
        ),
        (
            "/v1beta/models/gemini-x:streamGenerateContent?alt=sse",
            Some((Dialect::Gemini, true)),
        ),
        (
            "/tenant/abc/v1/models/gemini-x:streamGenerateContent",
            Some((Dialect::Gemini, true)),
        ),
        ("/v1beta/models/gemini-x:countTokens", None),
        ("/v1/models", None),
        ("/v1/responses/resp_123", None),
        ("/", None),
        ("", None),
    ];
    for (path, want) in cases {
        assert_eq!(Dialect::from_path(path), *want, "{path}");
    }
    assert_eq!(
        Dialect::model_from_path("/v1beta/models/gemini-x:generateContent?key=k"),
        Some("gemini-x")
    );
    assert_eq!(Dialect::model_from_path("/v1/messages"), None);
}

/// Every captured request parses to a sensible transcript. Reference data that lives
/// outside the project: skipped when absent.
#[test]
fn shared_captured_requests_parse() {
    // `../shared` beside the checkout (as CI lays it out), else the workplace's copy.
    let beside =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/requests");
    let dir = if beside.is_dir() {
        beside
    } else {
        std::path::PathBuf::from("/work/shared/fixtures/requests")
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let mut seen = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".json") || name.ends_with(".meta.json") {
            continue;
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.with_extension("meta.json")).unwrap())
                .unwrap();
        let route = format!(
            "{}?{}",
            meta["path"].as_str().unwrap(),
            meta["query"].as_str().unwrap_or("")
        );
        let (dialect, stream_path) =
            Dialect::from_path(&route).unwrap_or_else(|| panic!("{name}: {route}"));
        let body = std::fs::read(&path).unwrap();
        let p = dialect
            .parse_request(&body, stream_path)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = &p.transcript;
        assert!(!t.goal().is_empty(), "{name}: no task");
        let side = name.contains("router") || name.contains("title") || name.contains("subagent");
        // textbased mini-swe-agent offers no tools: its actions are fenced blocks in the text
        let tool_less =
            name.contains("router") || name.contains("title") || name.contains("textbased");
        assert_eq!(p.has_tools, !tool_less, "{name}");
        // The compaction captures carry their markers (`dialect::compaction`).
        let headers: http::HeaderMap = meta["headers"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.as_str().unwrap().parse().unwrap(),
                )
            })
            .collect();
        let markers = compaction::recognize(&route, &headers, &body, Some(t));
        let (summary, continued) = (
            name.ends_with("-compaction.json") && !name.contains("after"),
            name.contains("after-compaction"),
        );
        assert_eq!(markers.summary.is_some(), summary, "{name}: {markers:?}");
        assert_eq!(
            markers.continuation.is_some(),
            continued,
            "{name}: {markers:?}"
        );
        if side || name.contains("resumed") || name.contains("compaction") {
            seen += 1;
            continue;
        }
        // main fixtures: the whole loop run
        assert!(!t.system.is_empty(), "{name}: no system text");
        assert!(t.steps.len() >= 10, "{name}: {} steps", t.steps.len());
        let calls: Vec<_> = t.steps.iter().flat_map(|s| &s.calls).collect();
        if name.contains("textbased") {
            assert!(calls.is_empty());
        } else {
            assert!(calls.len() >= 10, "{name}: {} calls", calls.len());
            let answered = calls.iter().filter(|c| c.result.is_some()).count();
            assert_eq!(answered, calls.len(), "{name}: every call has its result");
            assert!(calls.iter().all(|c| !c.call.name.is_empty()), "{name}");
            // the loop ran the same failing command several times: equal hashes
            let mut hashes: Vec<_> = calls.iter().map(|c| c.call.hash()).collect();
            hashes.sort();
            hashes.dedup();
            assert!(
                hashes.len() < calls.len(),
                "{name}: repeated calls must hash equal"
            );
            if dialect == Dialect::Anthropic || dialect == Dialect::Gemini {
                assert!(
                    calls
                        .iter()
                        .any(|c| c.result.as_ref().unwrap().is_error == Some(true)),
                    "{name}"
                );
            }
            if name.starts_with("codex") {
                assert!(calls
                    .iter()
                    .any(|c| c.call.name == "apply_patch" && c.call.args.is_string()));
            }
        }
        seen += 1;
    }
    assert!(seen >= 9, "only {seen} fixtures");
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "(\\PC|[\"\\\\/\\n\\t{}\\[\\],:])*".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z\"\\\\]{0,6}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// The scanner cuts the history exactly where serde_json does, pretty or compact.
    #[test]
    fn view_splits_messages_like_serde(values in proptest::collection::vec(json_value(), 0..8), pretty in any::<bool>()) {
        let body = json!({"model": "m", "stream": true, "messages": values});
        let bytes = if pretty { serde_json::to_vec_pretty(&body).unwrap() } else { serde_json::to_vec(&body).unwrap() };
        let view = Dialect::OpenAiChat.view(&bytes, false).unwrap();
        let top: std::collections::HashMap<String, &serde_json::value::RawValue> = serde_json::from_slice(&bytes).unwrap();
        let serde: Vec<&serde_json::value::RawValue> = serde_json::from_str(top["messages"].get()).unwrap();
        let ours: Vec<&str> = view.messages.iter().map(|m| m.get()).collect();
        prop_assert_eq!(ours, serde.iter().map(|r| r.get()).collect::<Vec<_>>());
        prop_assert!(view.stream);
        prop_assert_eq!(view.model.as_deref(), Some("m"));
    }

    #[test]
    fn view_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300), prefix in any::<bool>()) {
        let mut body = if prefix { b"{\"messages\":[".to_vec() } else { Vec::new() };
        body.extend(data);
        for d in [Dialect::OpenAiChat, Dialect::OpenAiResponses, Dialect::Anthropic, Dialect::Gemini] {
            if let Ok(p) = d.parse_request(&body, false) {
                let _ = p.transcript.goal();
            }
            let _ = d.append_reminder(&body, "x");
        }
    }
}
