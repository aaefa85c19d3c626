//! Answers: non-streaming bodies and streams decoded as they arrive, fed whole, byte by
//! byte and in random splits, and read for their turn alone (the same turn); events keep
//! the exact bytes; garbage never panics.

use loopwarden::dialect::{Dialect, ResponseTurn, StreamEvent, StreamEventKind};
use proptest::prelude::*;
use serde_json::json;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/responses/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Feeds `stream` in the given chunk sizes (cycled); returns the events and the turn.
fn decode(dialect: Dialect, stream: &[u8], sizes: &[usize]) -> (Vec<StreamEvent>, ResponseTurn) {
    let mut d = dialect.stream_decoder();
    let mut events = Vec::new();
    let mut rest = stream;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        events.extend(d.feed(&rest[..n]));
        rest = &rest[n..];
        i += 1;
    }
    events.extend(d.flush());
    let turn = d.finish();
    (events, turn)
}

/// `stream` cut in the given chunk sizes (cycled).
fn chunks_of<'s>(stream: &'s [u8], sizes: &[usize]) -> Vec<&'s [u8]> {
    let mut chunks = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let n = sizes[chunks.len() % sizes.len()].clamp(1, rest.len());
        chunks.push(&rest[..n]);
        rest = &rest[n..];
    }
    chunks
}

fn kinds(events: &[StreamEvent]) -> Vec<StreamEventKind> {
    events.iter().map(|e| e.kind).collect()
}

/// The same events and turn whatever the chunking, and the bytes are kept exactly.
fn decode_all_ways(dialect: Dialect, name: &str) -> (Vec<StreamEvent>, ResponseTurn) {
    let stream = fixture(name);
    let whole = decode(dialect, &stream, &[usize::MAX]);
    for sizes in [&[1][..], &[2, 3], &[7, 1, 13], &[64]] {
        let split = decode(dialect, &stream, sizes);
        assert_eq!(split.0, whole.0, "{name} in chunks of {sizes:?}");
        assert_eq!(split.1, whole.1, "{name} in chunks of {sizes:?}");
        let turn = dialect.stream_turn(chunks_of(&stream, sizes));
        assert_eq!(
            turn, whole.1,
            "{name} read for its turn, in chunks of {sizes:?}"
        );
    }
    let joined: Vec<u8> = whole.0.iter().flat_map(|e| e.raw.iter().copied()).collect();
    assert_eq!(joined, stream, "{name}: events keep the stream's bytes");
    whole
}

use StreamEventKind::*;

#[test]
fn anthropic_stream() {
    let (events, turn) = decode_all_ways(Dialect::Anthropic, "anthropic.sse");
    assert_eq!(
        kinds(&events),
        vec![
            Other,
            Other, // message_start, ping
            Other,
            Other,
            Other,
            Other, // thinking block
            Text,
            Text,
            Text,
            Text,
            Text, // text block
            ToolCallStart,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallComplete,
            ToolCallStart,
            ToolCallDelta,
            ToolCallComplete,
            MessageEnd,
            MessageEnd,
        ]
    );
    assert_eq!(events[15].calls.len(), 1);
    assert_eq!(events[15].calls[0].name, "Read");
    assert_eq!(
        events[15].calls[0].args,
        json!({"file_path": "/p/calc.py", "limit": 5})
    );
    assert_eq!(turn.text, "Let me read it again.");
    assert_eq!(turn.calls.len(), 2);
    assert_eq!(turn.calls[1].id, "toolu_01B");
    assert_eq!(turn.calls[1].args, json!({"command": "pytest -q"}));
    assert_eq!(turn.input_tokens, Some(1200));
    assert_eq!(turn.output_tokens, Some(87));
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_use"));
}

#[test]
fn openai_chat_stream() {
    let (events, turn) = decode_all_ways(Dialect::OpenAiChat, "openai-chat.sse");
    assert_eq!(
        kinds(&events),
        vec![
            Text,
            Text,
            Text,
            ToolCallStart,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallStart,
            ToolCallDelta,
            ToolCallComplete, // finish_reason completes both calls
            Other,            // usage
            MessageEnd,       // [DONE]
        ]
    );
    assert_eq!(events[9].calls.len(), 2);
    assert_eq!(turn.text, "Running the tests.");
    assert_eq!(turn.calls[0].name, "bash");
    assert_eq!(turn.calls[0].id, "call_A");
    assert_eq!(turn.calls[0].args, json!({"command": "pytest -q"}));
    assert_eq!(turn.calls[1].args, json!({"filePath": "/p/a.py"}));
    assert_eq!(
        (turn.input_tokens, turn.output_tokens),
        (Some(900), Some(40))
    );
    assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
}

#[test]
fn openai_responses_stream() {
    let (events, turn) = decode_all_ways(Dialect::OpenAiResponses, "openai-responses.sse");
    let k = kinds(&events);
    assert_eq!(&k[..4], &[Other, Other, Other, Other]); // created, in_progress, reasoning
    assert_eq!(&k[4..11], &[Text; 7]);
    assert_eq!(
        &k[11..16],
        &[
            ToolCallStart,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallComplete
        ]
    );
    assert_eq!(
        &k[16..21],
        &[
            ToolCallStart,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallDelta,
            ToolCallComplete
        ]
    );
    assert_eq!(k[21], MessageEnd);
    assert_eq!(turn.text, "Patching now.");
    assert_eq!(turn.calls.len(), 2);
    assert_eq!(turn.calls[0].id, "call_X");
    assert_eq!(
        turn.calls[0].args,
        json!({"cmd": "cat calc.py", "workdir": "/p"})
    );
    assert_eq!(turn.calls[1].name, "apply_patch");
    assert_eq!(
        turn.calls[1].args,
        json!("*** Begin Patch\n*** Add File: NOTES.md\n+done\n*** End Patch\n")
    );
    assert_eq!(
        (turn.input_tokens, turn.output_tokens),
        (Some(3000), Some(120))
    );
    assert_eq!(turn.stop_reason.as_deref(), Some("completed"));
}

#[test]
fn gemini_sse_and_json_array_streams() {
    let (events, turn) = decode_all_ways(Dialect::Gemini, "gemini.sse");
    assert_eq!(
        kinds(&events),
        vec![Other, Text, Text, ToolCallComplete, MessageEnd]
    );
    assert_eq!(events[3].calls.len(), 2);
    assert_eq!(turn.text, "Reading the file.");
    assert_eq!(turn.calls[0].name, "read_file");
    assert_eq!(turn.calls[0].id, "");
    assert_eq!(turn.calls[1].id, "gc_2");
    assert_eq!(turn.calls[1].args, json!({"command": "pytest"}));
    assert_eq!(
        (turn.input_tokens, turn.output_tokens),
        (Some(500), Some(30))
    );
    assert_eq!(turn.stop_reason.as_deref(), Some("STOP"));

    let (array_events, array_turn) = decode_all_ways(Dialect::Gemini, "gemini-array.json");
    assert_eq!(array_turn, turn);
    assert_eq!(
        kinds(&array_events),
        vec![Other, Text, Text, ToolCallComplete, MessageEnd, MessageEnd]
    );
    // the whole array also reads as a non-streaming body
    assert_eq!(
        Dialect::Gemini
            .parse_response(&fixture("gemini-array.json"))
            .unwrap(),
        turn
    );
}

#[test]
fn non_streaming_answers() {
    let t = Dialect::Anthropic
        .parse_response(&fixture("anthropic.json"))
        .unwrap();
    assert_eq!(t.text, "Running it.");
    assert_eq!(
        t.calls[0].args,
        json!({"command": "pytest", "description": "Run"})
    );
    assert_eq!(
        (t.input_tokens, t.output_tokens, t.stop_reason.as_deref()),
        (Some(10), Some(5), Some("tool_use"))
    );

    let t = Dialect::OpenAiChat
        .parse_response(&fixture("openai-chat.json"))
        .unwrap();
    assert_eq!(t.text, "");
    assert_eq!(
        (t.calls[0].id.as_str(), t.calls[0].name.as_str()),
        ("call_1", "bash")
    );
    assert_eq!(t.calls[0].args, json!({"command": "echo hi"}));
    assert_eq!(
        (t.input_tokens, t.output_tokens, t.stop_reason.as_deref()),
        (Some(11), Some(6), Some("tool_calls"))
    );

    let t = Dialect::OpenAiResponses
        .parse_response(&fixture("openai-responses.json"))
        .unwrap();
    assert_eq!(t.text, "Patching now.");
    assert_eq!(t.calls.len(), 2);
    assert!(t.calls[1].args.is_string());
    assert_eq!(t.stop_reason.as_deref(), Some("completed"));

    let t = Dialect::Gemini
        .parse_response(&fixture("gemini.json"))
        .unwrap();
    assert_eq!(t.text, "Done.");
    assert_eq!(t.calls[0].name, "write_file");
    assert_eq!(t.stop_reason.as_deref(), Some("STOP"));

    for d in [
        Dialect::OpenAiChat,
        Dialect::OpenAiResponses,
        Dialect::Anthropic,
        Dialect::Gemini,
    ] {
        assert!(d.parse_response(b"<html>bad gateway</html>").is_err());
    }
}

#[test]
fn truncated_stream_still_gives_the_partial_call() {
    let stream = fixture("anthropic.sse");
    let cut = stream.windows(8).position(|w| w == b"limit\\\":").unwrap();
    let (events, turn) = decode(Dialect::Anthropic, &stream[..cut], &[usize::MAX]);
    assert!(!events.iter().any(|e| e.kind == ToolCallComplete));
    assert_eq!(turn.calls.len(), 1);
    assert_eq!(turn.calls[0].name, "Read");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn garbage_never_panics_and_keeps_bytes(
        data in proptest::collection::vec(any::<u8>(), 0..600),
        split in 1usize..50,
        which in 0usize..4,
    ) {
        let dialect = [Dialect::OpenAiChat, Dialect::OpenAiResponses, Dialect::Anthropic, Dialect::Gemini][which];
        let (events, turn) = decode(dialect, &data, &[split]);
        prop_assert_eq!(dialect.stream_turn(chunks_of(&data, &[split])), turn);
        let joined: Vec<u8> = events.iter().flat_map(|e| e.raw.iter().copied()).collect();
        prop_assert_eq!(joined, data);
        let d = dialect.stream_decoder();
        let _ = d.halt_tail("stop");
    }

    #[test]
    fn sse_shaped_garbage_never_panics(
        lines in proptest::collection::vec(
            prop_oneof![
                Just("data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\"}}".to_string()),
                Just("data: {\"type\":\"response.output_item.added\",\"output_index\":9,\"item\":{\"type\":\"function_call\"}}".to_string()),
                Just("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":3}]},\"finish_reason\":\"x\"}]}".to_string()),
                Just("data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{}}]}}]}".to_string()),
                Just("data: [DONE]".to_string()),
                Just(String::new()),
                "[ -~]{0,40}",
            ],
            0..40,
        ),
        which in 0usize..4,
    ) {
        let dialect = [Dialect::OpenAiChat, Dialect::OpenAiResponses, Dialect::Anthropic, Dialect::Gemini][which];
        let stream = lines.join("\n");
        let (events, turn) = decode(dialect, stream.as_bytes(), &[5]);
        prop_assert_eq!(dialect.stream_turn(chunks_of(stream.as_bytes(), &[5])), turn);
        let joined: Vec<u8> = events.iter().flat_map(|e| e.raw.iter().copied()).collect();
        prop_assert_eq!(joined, stream.as_bytes());
    }
}
