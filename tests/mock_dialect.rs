//! The mock's answers read back by loopwarden's own dialect decoders: each API, JSON and
//! streamed, yields the scripted text and calls, and the stream's events cover its bytes.

use loopwarden::dialect::{Dialect, StreamEventKind};
use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use serde_json::{json, Value};

const PATCH: &str = "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch\n";

fn script() -> Script {
    Script::with_turns(vec![Turn {
        text: Some("Reading and testing.".into()),
        tool_calls: vec![
            ToolCall::function("read", json!({"path": "calc.py", "limit": 20})),
            ToolCall::custom("apply_patch", PATCH),
        ],
        ..Turn::default()
    }])
}

/// (dialect, path, request body) for each API, `stream` asked for or not.
fn requests(stream: bool) -> Vec<(Dialect, String, Value)> {
    let gemini_path = if stream {
        "/v1beta/models/g:streamGenerateContent?alt=sse"
    } else {
        "/v1beta/models/g:generateContent"
    };
    vec![
        (
            Dialect::OpenAiChat,
            "/v1/chat/completions".into(),
            json!({"stream": stream, "tools": [{"type": "function"}], "messages": [{"role": "user", "content": "x"}]}),
        ),
        (
            Dialect::OpenAiResponses,
            "/v1/responses".into(),
            json!({"stream": stream, "tools": [{"type": "function"}], "input": "x"}),
        ),
        (
            Dialect::Anthropic,
            "/v1/messages".into(),
            json!({"stream": stream, "tools": [{"name": "read"}], "messages": [{"role": "user", "content": "x"}]}),
        ),
        (
            Dialect::Gemini,
            gemini_path.into(),
            json!({"tools": [{"functionDeclarations": []}], "contents": [{"role": "user", "parts": [{"text": "x"}]}]}),
        ),
    ]
}

async fn fetch(url: String, body: &Value) -> Vec<u8> {
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap().to_vec()
}

/// The freeform patch is a custom call on the Responses API and `{"input": …}` elsewhere.
fn expected_patch_args(dialect: Dialect) -> Value {
    if dialect == Dialect::OpenAiResponses {
        json!(PATCH)
    } else {
        json!({"input": PATCH})
    }
}

#[tokio::test]
async fn json_answers_decode_to_the_script() {
    let mock = MockServer::start(script()).await.unwrap();
    for (dialect, path, body) in requests(false) {
        let bytes = fetch(format!("{}{path}", mock.url()), &body).await;
        let turn = dialect.parse_response(&bytes).unwrap();
        assert_eq!(turn.text, "Reading and testing.", "{dialect:?}");
        let names: Vec<_> = turn.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["read", "apply_patch"], "{dialect:?}");
        assert_eq!(
            turn.calls[0].args,
            json!({"limit": 20, "path": "calc.py"}),
            "{dialect:?}"
        );
        assert_eq!(
            turn.calls[1].args,
            expected_patch_args(dialect),
            "{dialect:?}"
        );
    }
}

#[tokio::test]
async fn streamed_answers_decode_to_the_script() {
    let mock = MockServer::start(script()).await.unwrap();
    for (dialect, path, body) in requests(true) {
        let bytes = fetch(format!("{}{path}", mock.url()), &body).await;
        let mut decoder = dialect.stream_decoder();
        // Fed in small slices, as a network would cut it.
        let mut events = Vec::new();
        for piece in bytes.chunks(7) {
            events.extend(decoder.feed(piece));
        }
        events.extend(decoder.flush());
        let raw: Vec<u8> = events.iter().flat_map(|e| e.raw.clone()).collect();
        assert_eq!(
            raw, bytes,
            "{dialect:?}: events must cover the stream byte for byte"
        );
        let completed: Vec<_> = events
            .iter()
            .filter(|e| e.kind == StreamEventKind::ToolCallComplete)
            .flat_map(|e| e.calls.iter().map(|c| c.name.clone()))
            .collect();
        assert_eq!(completed, ["read", "apply_patch"], "{dialect:?}");
        // Gemini ends the message in the chunk that carries the calls, as the real API does.
        let last = events
            .iter()
            .rev()
            .find(|e| e.kind != StreamEventKind::Other)
            .unwrap();
        assert!(
            matches!(
                last.kind,
                StreamEventKind::MessageEnd | StreamEventKind::ToolCallComplete
            ),
            "{dialect:?}: ends with {:?}",
            last.kind
        );
        let turn = decoder.finish();
        assert_eq!(turn.text, "Reading and testing.", "{dialect:?}");
        assert_eq!(
            turn.calls[0].args,
            json!({"limit": 20, "path": "calc.py"}),
            "{dialect:?}"
        );
        assert_eq!(
            turn.calls[1].args,
            expected_patch_args(dialect),
            "{dialect:?}"
        );
    }
}
