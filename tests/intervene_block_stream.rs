//! The block filter over real streamed answers: the scripted mock streams text and a tool
//! call over a socket in every API; the filter releases the call unchanged when it is not a
//! loop, or replaces it by the halt so the stream still reads as one complete answer.

use bytes::Bytes;
use futures_util::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use loopwarden::dialect::{Dialect, StreamEventKind};
use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use loopwarden::proxy::forward::BlockBody;
use serde_json::{json, Value};

const TEXT: &str = "Running the tests again.";
const HALT: &str = "[loopwarden] stopped: same failing test";

/// One request per API that the mock answers with a stream, and its path.
fn requests() -> Vec<(Dialect, &'static str, Value)> {
    let tools_chat = json!([{"type": "function", "function": {"name": "bash", "parameters": {}}}]);
    vec![
        (
            Dialect::OpenAiChat,
            "/v1/chat/completions",
            json!({"model": "m", "stream": true, "tools": tools_chat,
                   "messages": [{"role": "user", "content": "fix it"}]}),
        ),
        (
            Dialect::OpenAiResponses,
            "/v1/responses",
            json!({"model": "m", "stream": true, "tools": [{"type": "function", "name": "bash"}],
                   "input": [{"type": "message", "role": "user", "content": "fix it"}]}),
        ),
        (
            Dialect::Anthropic,
            "/v1/messages",
            json!({"model": "m", "stream": true, "max_tokens": 100, "tools": [{"name": "bash", "input_schema": {}}],
                   "messages": [{"role": "user", "content": "fix it"}]}),
        ),
        (
            Dialect::Gemini,
            "/v1beta/models/g:streamGenerateContent?alt=sse",
            json!({"tools": [{"functionDeclarations": [{"name": "bash"}]}],
                   "contents": [{"role": "user", "parts": [{"text": "fix it"}]}]}),
        ),
    ]
}

fn script() -> Script {
    Script::with_turns(vec![Turn {
        text: Some(TEXT.into()),
        tool_calls: vec![ToolCall::function("bash", json!({"command": "pytest -q"}))],
        ..Turn::default()
    }])
}

/// The mock's streamed answer, re-cut into small chunks so events straddle chunk edges,
/// through a block filter whose check blocks (`block`) or lets everything pass.
async fn filtered(
    mock: &MockServer,
    dialect: Dialect,
    path: &str,
    body: &Value,
    block: bool,
) -> (Vec<u8>, Vec<u8>, Vec<Vec<String>>) {
    let resp = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{}{path}", mock.url()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let original = resp.bytes().await.unwrap().to_vec();
    let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = original
        .chunks(7)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    let inner = StreamBody::new(futures_util::stream::iter(chunks));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let check = Box::new(move |calls: &[loopwarden::transcript::ToolCall]| {
        seen2
            .lock()
            .unwrap()
            .push(calls.iter().map(|c| c.name.clone()).collect::<Vec<_>>());
        block.then(|| HALT.to_string())
    });
    let body = BlockBody::new(inner, dialect.stream_decoder(), check);
    // Read it the way a client does: frame by frame.
    let mut out = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    let seen = seen.lock().unwrap().clone();
    (original, out, seen)
}

#[tokio::test]
async fn a_released_call_passes_byte_for_byte() {
    let mock = MockServer::start(script()).await.unwrap();
    for (dialect, path, body) in requests() {
        let (original, out, seen) = filtered(&mock, dialect, path, &body, false).await;
        assert_eq!(
            out, original,
            "{dialect:?}: an unblocked stream is unchanged"
        );
        assert_eq!(
            seen,
            vec![vec!["bash".to_string()]],
            "{dialect:?}: checked once"
        );
    }
}

#[tokio::test]
async fn a_blocked_call_is_replaced_by_the_halt_and_the_stream_stays_whole() {
    let mock = MockServer::start(script()).await.unwrap();
    for (dialect, path, body) in requests() {
        let (original, out, _) = filtered(&mock, dialect, path, &body, true).await;
        // The client reads one complete answer: the text it was streamed, then the halt,
        // and no tool call.
        let mut decoder = dialect.stream_decoder();
        let events = decoder.feed(&out);
        let events: Vec<_> = events.into_iter().chain(decoder.flush()).collect();
        let turn = decoder.finish();
        assert!(turn.calls.is_empty(), "{dialect:?}: call removed: {turn:?}");
        assert!(
            turn.text.contains(TEXT),
            "{dialect:?}: text kept: {:?}",
            turn.text
        );
        assert!(
            turn.text.ends_with(HALT),
            "{dialect:?}: halt last: {:?}",
            turn.text
        );
        assert!(
            events
                .iter()
                .all(|e| e.kind != StreamEventKind::ToolCallStart),
            "{dialect:?}: no tool-call event reaches the client"
        );
        assert!(
            events.iter().any(|e| e.kind == StreamEventKind::MessageEnd),
            "{dialect:?}: the answer is closed"
        );
        // Everything before the call went through as the upstream sent it.
        let mut d = dialect.stream_decoder();
        let upstream = d.feed(&original);
        let before: Vec<u8> = upstream
            .iter()
            .take_while(|e| {
                !matches!(
                    e.kind,
                    StreamEventKind::ToolCallStart | StreamEventKind::ToolCallComplete
                )
            })
            .flat_map(|e| e.raw.clone())
            .collect();
        assert!(!before.is_empty());
        assert!(
            out.starts_with(&before),
            "{dialect:?}: text passed unchanged"
        );
    }
}
