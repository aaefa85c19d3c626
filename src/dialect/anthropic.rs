//! Anthropic Messages (`POST /v1/messages`).
//!
//! Request: `system` (string or text blocks) and `messages`, each `{role, content}` where
//! content is a string or a list of blocks: `text`, `tool_use {id, name, input}`,
//! `tool_result {tool_use_id, content, is_error?}`, `thinking` (ignored), images...
//! Claude Code also puts `role:"system"` entries inside `messages`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use serde_json::json;

use super::framing::{write_sse, Frame};
use super::stream::PartialCall;
use super::{
    answer_json, args_from_raw, content_text, insert_after, offered_tools, push_into_array,
    push_line, random_id, replace_span, span_of, Content, ContentText, Dialect, HaltToolCall,
    ParseError, Reported, RequestView, ResponseTurn, StreamEventKind, TextPart, TopLevel,
    UpstreamFailure,
};
use crate::transcript::{Item, ToolCall, ToolResult};

pub(super) fn view<'a>(top: &TopLevel<'_, 'a>) -> Result<RequestView<'a>, ParseError> {
    let system = top.raw("system");
    Ok(RequestView {
        model: top.field("model")?,
        stream: top.field("stream")?.unwrap_or(false),
        tools: offered_tools(top.raw("tools")),
        preamble_source: system,
        messages: top.messages()?,
    })
}

/// A message read in one pass, its blocks with it.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<Content<'a, Block<'a>>>,
}

/// A message whose content is kept raw, for a message [`Message`] does not read (a block
/// that is not a [`Block`]): its blocks are then read one by one, and odd ones skipped.
#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// One content block, with the fields of every block type we read. A `tool_result`'s
/// content (`C`) is read in the same pass ([`Content`]), or kept raw (`&RawValue`) in the
/// raw reading of a message, whose odd parts [`content_text`] then skips.
#[derive(Deserialize)]
#[serde(bound(deserialize = "'de: 'a, C: Deserialize<'de>"))]
struct Block<'a, C = Content<'a, TextPart<'a>>> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    // tool_use
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    // tool_result
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default = "Option::default")]
    content: Option<C>,
    #[serde(default)]
    is_error: Option<bool>,
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    match serde_json::from_str::<Message>(raw) {
        Ok(msg) => content_items(&msg.role, msg.content),
        Err(_) => parse_raw_message(raw),
    }
}

/// [`parse_message`] for a message the one-pass reading refused: blocks that are not
/// [`Block`]s are skipped, the others read.
fn parse_raw_message(raw: &str) -> Vec<Item> {
    let Ok(msg) = serde_json::from_str::<RawMessage>(raw) else {
        return Vec::new();
    };
    let content = msg.content.map(RawValue::get).unwrap_or("");
    // A plain string content is all text, whatever the role.
    let blocks: Vec<&RawValue> = if content.starts_with('[') {
        serde_json::from_str(content).unwrap_or_default()
    } else {
        Vec::new()
    };
    let text = if content.starts_with('"') {
        content_text(msg.content.map(RawValue::get))
    } else {
        String::new()
    };
    let blocks = blocks
        .into_iter()
        .filter_map(|raw| serde_json::from_str::<Block<&RawValue>>(raw.get()).ok());
    message_items(&msg.role, text, blocks)
}

/// The items of a message with `role` whose content was read in one pass.
fn content_items(role: &str, content: Option<Content<'_, Block<'_>>>) -> Vec<Item> {
    let (text, blocks) = match content {
        Some(Content::Text(text)) => (text.into_owned(), Vec::new()),
        Some(Content::Parts(blocks)) => (String::new(), blocks),
        Some(Content::Other) | None => (String::new(), Vec::new()),
    };
    message_items(role, text, blocks)
}

/// The items of a message with `role`: `text` (its content when a plain string) and the
/// text, calls and results of its blocks.
fn message_items<'a, C: ContentText>(
    role: &str,
    mut text: String,
    blocks: impl IntoIterator<Item = Block<'a, C>>,
) -> Vec<Item> {
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for block in blocks {
        match block.kind.as_ref() {
            "text" => push_line(&mut text, block.text.as_deref().unwrap_or("")),
            "tool_use" => calls.push(ToolCall {
                id: block.id.unwrap_or_default(),
                name: block.name.unwrap_or_default(),
                args: args_from_raw(block.input),
            }),
            "tool_result" => results.push(Item::ToolResult(ToolResult {
                call_id: block.tool_use_id.unwrap_or_default(),
                name: String::new(),
                text: block.content.map(ContentText::text).unwrap_or_default(),
                is_error: block.is_error,
            })),
            // thinking, redacted_thinking, images, documents, server tools: nothing
            // detection reads.
            _ => {}
        }
    }
    match role {
        "assistant" => vec![Item::Assistant { text, calls }],
        "system" => vec![Item::System { text }],
        _ => {
            // A user turn: results first (the API requires them to lead the message),
            // then any text the client added after them.
            if !text.is_empty() || results.is_empty() {
                results.push(Item::User { text });
            }
            results
        }
    }
}

// ---------------------------------------------------------------------------------------
// Responses.

#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl Usage {
    fn reported(self) -> Reported {
        Reported {
            input: self.input_tokens,
            output: self.output_tokens,
            cached_input: self.cache_read_input_tokens,
            cache_write: self.cache_creation_input_tokens,
            thoughts: None,
        }
    }
}

/// An answer, its content read in the same pass (`C`: [`Content`]), or kept raw for an
/// answer that does not read so (`&RawValue`), to be read as [`parse_raw_message`] does.
#[derive(Deserialize)]
struct Response<C> {
    #[serde(default = "Option::default")]
    content: Option<C>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
}

pub(super) fn parse_response(body: &[u8]) -> Result<ResponseTurn, ParseError> {
    let (mut items, stop_reason, usage) = match answer_json::<Response<Content<Block>>>(body) {
        Ok(resp) => (
            content_items("assistant", resp.content),
            resp.stop_reason,
            resp.usage,
        ),
        Err(_) => {
            let resp: Response<&RawValue> =
                answer_json(body).map_err(|e| ParseError::json(Dialect::Anthropic, e))?;
            let content = resp.content.map(RawValue::get).unwrap_or("[]");
            let message = format!(r#"{{"role":"assistant","content":{content}}}"#);
            (parse_raw_message(&message), resp.stop_reason, resp.usage)
        }
    };
    let (text, calls) = match items.pop() {
        Some(Item::Assistant { text, calls }) => (text, calls),
        _ => (String::new(), Vec::new()),
    };
    let mut turn = ResponseTurn {
        text,
        calls,
        stop_reason,
        ..Default::default()
    };
    turn.report_usage(usage.unwrap_or_default().reported());
    Ok(turn)
}

/// One streamed event, with the fields of every event type we read.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    message: Option<MessageStart>,
    #[serde(borrow, default)]
    content_block: Option<Block<'a, &'a RawValue>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct MessageStart {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Debug)]
enum BlockState {
    Text,
    /// `from_start`: the arguments so far are the start event's `input`, which the
    /// first `input_json_delta` replaces.
    Tool {
        call: PartialCall,
        from_start: bool,
    },
    Other,
}

/// What a streamed answer said so far.
#[derive(Debug, Default)]
pub(super) struct Stream {
    turn: ResponseTurn,
    /// Open content blocks by index.
    blocks: Vec<(u64, BlockState)>,
    started: bool,
    model: Option<String>,
    /// The index the next block would get.
    next_index: u64,
    /// Index of the first tool block not yet released to the client.
    hold_index: Option<u64>,
}

impl Stream {
    pub fn on_frame(&mut self, frame: &Frame) -> (StreamEventKind, Vec<ToolCall>) {
        let Ok(ev) = serde_json::from_str::<Event>(&frame.data) else {
            return (StreamEventKind::Other, Vec::new());
        };
        let index = ev.index.unwrap_or(0);
        match ev.kind.as_ref() {
            "message_start" => {
                self.started = true;
                if let Some(m) = ev.message {
                    self.model = m.model;
                    // The input's counts (cache reads and writes too); the output's so far.
                    if let Some(u) = m.usage {
                        self.turn.report_usage(u.reported());
                    }
                }
                (StreamEventKind::Other, Vec::new())
            }
            "content_block_start" => {
                self.next_index = self.next_index.max(index + 1);
                let Some(block) = ev.content_block else {
                    return (StreamEventKind::Other, Vec::new());
                };
                let (state, kind) = match block.kind.as_ref() {
                    "text" => {
                        self.turn.text.push_str(block.text.as_deref().unwrap_or(""));
                        (BlockState::Text, StreamEventKind::Text)
                    }
                    "tool_use" => {
                        // The input arrives as `input_json_delta`s; a start `input` other
                        // than `{}` only matters when no delta follows.
                        let start_input = match block.input.map(RawValue::get) {
                            Some("{}") | None => String::new(),
                            Some(raw) => raw.to_string(),
                        };
                        self.hold_index.get_or_insert(index);
                        let call = PartialCall {
                            id: block.id.unwrap_or_default(),
                            name: block.name.unwrap_or_default(),
                            args: start_input,
                            freeform: false,
                        };
                        let from_start = !call.args.is_empty();
                        (
                            BlockState::Tool { call, from_start },
                            StreamEventKind::ToolCallStart,
                        )
                    }
                    _ => (BlockState::Other, StreamEventKind::Other),
                };
                self.blocks.retain(|(i, _)| *i != index);
                self.blocks.push((index, state));
                (kind, Vec::new())
            }
            "content_block_delta" => {
                let Some(delta) = ev.delta else {
                    return (StreamEventKind::Other, Vec::new());
                };
                let block = self.blocks.iter_mut().find(|(i, _)| *i == index);
                match (delta.kind.as_deref(), block) {
                    (Some("text_delta"), _) => {
                        self.turn.text.push_str(delta.text.as_deref().unwrap_or(""));
                        (StreamEventKind::Text, Vec::new())
                    }
                    (
                        Some("input_json_delta"),
                        Some((_, BlockState::Tool { call, from_start })),
                    ) => {
                        if std::mem::take(from_start) {
                            call.args.clear();
                        }
                        call.args
                            .push_str(delta.partial_json.as_deref().unwrap_or(""));
                        (StreamEventKind::ToolCallDelta, Vec::new())
                    }
                    (Some("input_json_delta"), _) => (StreamEventKind::ToolCallDelta, Vec::new()),
                    _ => (StreamEventKind::Other, Vec::new()),
                }
            }
            "content_block_stop" => {
                let Some(pos) = self.blocks.iter().position(|(i, _)| *i == index) else {
                    return (StreamEventKind::Other, Vec::new());
                };
                match self.blocks.remove(pos).1 {
                    BlockState::Tool { call, .. } => {
                        let call = call.to_call();
                        self.turn.calls.push(call.clone());
                        (StreamEventKind::ToolCallComplete, vec![call])
                    }
                    BlockState::Text => (StreamEventKind::Text, Vec::new()),
                    BlockState::Other => (StreamEventKind::Other, Vec::new()),
                }
            }
            "message_delta" => {
                if let Some(reason) = ev.delta.and_then(|d| d.stop_reason) {
                    self.turn.stop_reason = Some(reason);
                }
                // The output's final count; the input's counts again, when it repeats them.
                if let Some(u) = ev.usage {
                    self.turn.report_usage(u.reported());
                }
                (StreamEventKind::MessageEnd, Vec::new())
            }
            "message_stop" => (StreamEventKind::MessageEnd, Vec::new()),
            _ => (StreamEventKind::Other, Vec::new()),
        }
    }

    pub fn mark_released(&mut self) {
        self.hold_index = None;
    }

    pub fn turn(&self) -> ResponseTurn {
        let mut turn = self.turn.clone();
        // calls the stream never closed, best effort
        for (_, block) in &self.blocks {
            if let BlockState::Tool { call, .. } = block {
                turn.calls.push(call.to_call());
            }
        }
        turn
    }

    pub fn halt_tail(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let index = match self.hold_index {
            Some(index) => index,
            None => {
                // Halting mid-text: close the blocks the client has open first.
                for (i, _) in &self.blocks {
                    let stop = json!({"type": "content_block_stop", "index": i});
                    write_sse(
                        &mut out,
                        Some("content_block_stop"),
                        &stop.to_string(),
                        "\n",
                    );
                }
                self.next_index
            }
        };
        let start = (!self.started).then(|| self.model.as_deref().unwrap_or("unknown"));
        write_halt_events(&mut out, start, index, text, None);
        out
    }
}

/// The events of a halt answer from content index `index` on: a text block, an
/// optional tool call, then the end of the message. With `start` (the model), the
/// answer begins with its own `message_start`.
fn write_halt_events(
    out: &mut Vec<u8>,
    start: Option<&str>,
    index: u64,
    text: &str,
    call: Option<&HaltToolCall>,
) {
    let mut event =
        |name: &str, data: serde_json::Value| write_sse(out, Some(name), &data.to_string(), "\n");
    if let Some(model) = start {
        let mut message = message_object(model, Vec::new(), None);
        message["usage"]["output_tokens"] = json!(0);
        event(
            "message_start",
            json!({"type": "message_start", "message": message}),
        );
    }
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    );
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
    );
    event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    );
    if let Some(call) = call {
        let i = index + 1;
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": random_id("toolu_", 24), "name": call.name, "input": {}}}),
        );
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": call.arguments.to_string()}}),
        );
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": i}),
        );
    }
    let stop_reason = if call.is_some() {
        "tool_use"
    } else {
        "end_turn"
    };
    event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": 0}}),
    );
    event("message_stop", json!({"type": "message_stop"}));
}

/// A Messages API message object with zero usage. `stop_reason` is null while streaming.
fn message_object(
    model: &str,
    content: Vec<serde_json::Value>,
    stop_reason: Option<&str>,
) -> serde_json::Value {
    json!({
        "id": random_id("msg_", 24),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0},
    })
}

// ---------------------------------------------------------------------------------------
// Answers loopwarden writes.

pub(super) fn error_body(message: &str, failure: UpstreamFailure) -> serde_json::Value {
    let kind = match failure {
        UpstreamFailure::Unreachable => "api_error",
        UpstreamFailure::Timeout => "timeout_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

pub(super) fn append_reminder(body: &[u8], text: &str) -> Result<Vec<u8>, ParseError> {
    let view = Dialect::Anthropic.view(body, false)?;
    let last = view
        .messages
        .last()
        .ok_or(ParseError::EmptyHistory("messages"))?;
    let msg: RawMessage =
        serde_json::from_str(last.get()).map_err(|e| ParseError::json(Dialect::Anthropic, e))?;
    let block = json!({"type": "text", "text": text}).to_string();
    match (msg.role.as_ref(), msg.content) {
        // After the results and text the user turn already has: tool_result blocks
        // must stay first in their message.
        ("user", Some(content)) if content.get().starts_with('[') => {
            push_into_array(body, content.get(), &block)
        }
        ("user", Some(content)) if content.get().starts_with('"') => {
            let as_blocks = format!(r#"[{{"type":"text","text":{}}},{block}]"#, content.get());
            Ok(replace_span(
                body,
                span_of(body, content.get())?,
                &as_blocks,
            ))
        }
        // The history ends with something else (a prefilled assistant turn, a
        // `role:"system"` entry): the reminder is a user turn of its own.
        _ => insert_after(
            body,
            last.get(),
            &format!(r#",{{"role":"user","content":[{block}]}}"#),
        ),
    }
}

pub(super) fn halt_stream(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    let mut out = Vec::new();
    write_halt_events(&mut out, Some(model), 0, text, call);
    out
}

pub(super) fn halt_json(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    let mut content = vec![json!({"type": "text", "text": text})];
    if let Some(call) = call {
        content.push(
            json!({"type": "tool_use", "id": random_id("toolu_", 24), "name": call.name,
                            "input": call.arguments}),
        );
    }
    let stop_reason = if call.is_some() {
        "tool_use"
    } else {
        "end_turn"
    };
    message_object(model, content, Some(stop_reason))
        .to_string()
        .into_bytes()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::dialect::generated;

    /// Content blocks of every kind detection reads, with the shapes clients send (text
    /// with escapes, inputs of any JSON, results as strings or parts, `null`s), and odd
    /// ones the one-pass reading refuses (no type, an id that is a number, a bare string).
    fn block() -> impl Strategy<Value = serde_json::Value> {
        let text = generated::TEXT;
        prop_oneof![
            text.prop_map(|t| json!({"type": "text", "text": t})),
            (text, generated::args()).prop_map(|(id, input)| {
                json!({"type": "tool_use", "id": id, "name": "read", "input": input})
            }),
            (text, text, any::<Option<bool>>()).prop_map(|(id, t, is_error)| {
                json!({"type": "tool_result", "tool_use_id": id, "content": t, "is_error": is_error})
            }),
            (text, text).prop_map(|(id, t)| {
                json!({"type": "tool_result", "tool_use_id": id,
                       "content": [{"type": "text", "text": t}, {"type": "image"}, {"text": ""}]})
            }),
            (text, text).prop_map(|(id, t)| {
                json!({"type": "tool_result", "tool_use_id": id,
                       "content": [{"type": "text", "text": t}, {"text": 5}]})
            }),
            Just(json!({"type": "thinking", "thinking": "hm", "signature": "s"})),
            Just(json!({"text": "no type"})),
            Just(json!({"type": "tool_use", "id": 7, "name": "read", "input": {}})),
            Just(json!("a bare string")),
        ]
    }

    fn content() -> impl Strategy<Value = serde_json::Value> {
        prop_oneof![
            proptest::collection::vec(block(), 0..5).prop_map(serde_json::Value::from),
            generated::TEXT.prop_map(serde_json::Value::from),
            Just(serde_json::Value::Null),
            Just(json!({"unexpected": [1, {"a": null}]})),
            Just(json!(3.5)),
        ]
    }

    fn role() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("user"), Just("assistant"), Just("system")]
    }

    proptest! {
        /// A message read in one pass gives exactly the items the raw reading (content
        /// kept raw, blocks read one by one) gives, whatever its blocks; and the one pass
        /// reads every message whose blocks all read as blocks.
        #[test]
        fn a_message_reads_the_same_in_one_pass(role in role(), content in content(), absent: bool) {
            let message = if absent {
                json!({"role": role})
            } else {
                json!({"role": role, "content": content})
            };
            let raw = message.to_string();
            prop_assert_eq!(parse_message(&raw), parse_raw_message(&raw));
            let odd = !absent && content.as_array().is_some_and(|blocks| {
                blocks.iter().any(|b| serde_json::from_str::<Block>(&b.to_string()).is_err())
            });
            prop_assert_eq!(serde_json::from_str::<Message>(&raw).is_ok(), !odd);
        }

        /// An answer read in one pass gives what reading its content raw and then as an
        /// assistant message gives: text, calls, usage and stop reason.
        #[test]
        fn an_answer_reads_the_same_in_one_pass(content in content(), tokens in 0u64..1000) {
            let body = json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": content, "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": tokens, "output_tokens": 3},
            })
            .to_string();
            let turn = parse_response(body.as_bytes()).unwrap();
            let message = json!({"role": "assistant", "content": content}).to_string();
            let Some(Item::Assistant { text, calls }) = parse_raw_message(&message).pop() else {
                panic!("an assistant message gives an assistant item");
            };
            prop_assert_eq!(turn.text, text);
            prop_assert_eq!(turn.calls, calls);
            prop_assert_eq!(turn.input_tokens, Some(tokens));
            prop_assert_eq!(turn.stop_reason.as_deref(), Some("tool_use"));
        }
    }

    #[test]
    fn an_answer_that_is_not_json_is_an_error() {
        assert!(parse_response(b"{\"content\": [").is_err());
        assert!(parse_response(b"<html>502</html>").is_err());
    }
}
