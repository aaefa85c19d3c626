//! OpenAI Chat Completions (`POST /v1/chat/completions`).
//!
//! Request: `messages`, each `{role, content}` with content a string, null or a list of
//! parts. Assistant messages carry `tool_calls[{id, function{name, arguments}}]` (the
//! arguments a JSON *string*); results are `role:"tool"` messages with `tool_call_id`.
//! litellm echoes extra fields (`provider_specific_fields`...), which are skipped.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use serde_json::json;

use super::framing::{write_sse, Frame};
use super::stream::PartialCall;
use super::{
    answer_json, args_from_text, insert_after, offered_tools, random_id, unix_now, Content,
    ContentText, Dialect, HaltToolCall, InputDetails, ParseError, Reported, RequestView,
    ResponseTurn, StreamEventKind, TextPart, TopLevel, UpstreamFailure,
};
use crate::transcript::{Item, ToolCall, ToolResult};

pub(super) fn view<'a>(top: &TopLevel<'_, 'a>) -> Result<RequestView<'a>, ParseError> {
    Ok(RequestView {
        model: top.field("model")?,
        stream: top.field("stream")?.unwrap_or(false),
        // `functions`: the pre-tools function calling API
        tools: offered_tools(top.raw("tools")).or_else(|| offered_tools(top.raw("functions"))),
        preamble_source: None,
        messages: top.messages()?,
    })
}

/// A message, its `content` (`C`) read in the same pass ([`Content`]), or kept raw
/// (`&RawValue`) for a message with a part that does not read as one, whose odd parts
/// [`ContentText`] for `&RawValue` then skips.
#[derive(Deserialize)]
#[serde(bound(deserialize = "'de: 'a, C: Deserialize<'de>"))]
struct Message<'a, C = Content<'a, TextPart<'a>>> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default = "Option::default")]
    content: Option<C>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<WireCall<'a>>>,
    /// Legacy single call (`functions` API).
    #[serde(borrow, default)]
    function_call: Option<Function<'a>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct WireCall<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(borrow)]
    function: Function<'a>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

impl Function<'_> {
    fn into_call(self, id: String) -> ToolCall {
        ToolCall {
            id,
            name: self.name.unwrap_or_default(),
            args: args_from_text(self.arguments.as_deref().unwrap_or("")),
        }
    }
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    match serde_json::from_str::<Message>(raw) {
        Ok(msg) => message_items(msg),
        Err(_) => match serde_json::from_str::<Message<&RawValue>>(raw) {
            Ok(msg) => message_items(msg),
            Err(_) => Vec::new(),
        },
    }
}

fn message_items<C: ContentText>(msg: Message<'_, C>) -> Vec<Item> {
    let text = msg.content.map(ContentText::text).unwrap_or_default();
    match msg.role.as_ref() {
        "system" | "developer" => vec![Item::System { text }],
        "assistant" => {
            let mut calls: Vec<ToolCall> = msg
                .tool_calls
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.function.into_call(c.id.unwrap_or_default()))
                .collect();
            if let Some(f) = msg.function_call {
                calls.push(f.into_call(String::new()));
            }
            vec![Item::Assistant { text, calls }]
        }
        "tool" | "function" => vec![Item::ToolResult(ToolResult {
            call_id: msg.tool_call_id.unwrap_or_default(),
            name: msg.name.unwrap_or_default(),
            text,
            is_error: None,
        })],
        _ => vec![Item::User { text }],
    }
}

// ---------------------------------------------------------------------------------------
// Responses.

#[derive(Deserialize, Default)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<InputDetails>,
}

impl Usage {
    fn reported(self) -> Reported {
        Reported {
            input: self.prompt_tokens,
            output: self.completion_tokens,
            cached_input: self.prompt_tokens_details.and_then(|d| d.cached_tokens),
            ..Default::default()
        }
    }
}

/// `M`: the message read in place ([`Message`]), or kept raw ([`RawValue`]) for a
/// second reading when the first fails.
#[derive(Deserialize)]
struct Response<M> {
    #[serde(default = "Vec::new")]
    choices: Vec<Choice<M>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice<M> {
    #[serde(default = "Option::default")]
    message: Option<M>,
    #[serde(default)]
    finish_reason: Option<String>,
}

/// The log decodes every answer, so the message is read in place rather than kept raw and
/// parsed again (2,100 of 21,900 instructions for the benchmark's answer). An answer whose
/// message does not read as a [`Message`] (say, without a role, or with a content part
/// whose text is not a string) fails as a whole here, and is read again the other way: its
/// usage and stop reason are kept and its message gives what [`parse_message`] gives for it
/// (nothing without a role; the other parts' text around an odd part).
pub(super) fn parse_response(body: &[u8]) -> Result<ResponseTurn, ParseError> {
    if let Ok(resp) = answer_json::<Response<Message>>(body) {
        return Ok(response_turn(resp, message_items));
    }
    let resp: Response<&RawValue> =
        answer_json(body).map_err(|e| ParseError::json(Dialect::OpenAiChat, e))?;
    Ok(response_turn(resp, |m| parse_message(m.get())))
}

fn response_turn<M>(resp: Response<M>, items: impl FnOnce(M) -> Vec<Item>) -> ResponseTurn {
    let mut turn = ResponseTurn::default();
    turn.report_usage(resp.usage.unwrap_or_default().reported());
    // Clients ask for one choice; the first is the answer.
    if let Some(choice) = resp.choices.into_iter().next() {
        turn.stop_reason = choice.finish_reason;
        if let Some(Item::Assistant { text, calls }) = choice.message.and_then(|m| items(m).pop()) {
            turn.text = text;
            turn.calls = calls;
        }
    }
    turn
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow, default)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default)]
    index: u64,
    #[serde(borrow, default)]
    delta: Option<ChunkDelta<'a>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<CallDelta<'a>>>,
}

#[derive(Deserialize)]
struct CallDelta<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    id: Option<String>,
    #[serde(borrow, default)]
    function: Option<FunctionDelta<'a>>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

/// What a streamed answer said so far.
#[derive(Debug, Default)]
pub(super) struct Stream {
    turn: ResponseTurn,
    id: Option<String>,
    created: Option<u64>,
    model: Option<String>,
    /// Calls by their `index` in the deltas.
    calls: Vec<(u64, PartialCall)>,
    /// The calls were reported complete (at `finish_reason` or `[DONE]`).
    calls_completed: bool,
}

impl Stream {
    pub fn on_frame(&mut self, frame: &Frame) -> (StreamEventKind, Vec<ToolCall>) {
        if frame.data == "[DONE]" {
            return match self.complete_calls() {
                Some(calls) => (StreamEventKind::ToolCallComplete, calls),
                None => (StreamEventKind::MessageEnd, Vec::new()),
            };
        }
        let Ok(chunk) = serde_json::from_str::<Chunk>(&frame.data) else {
            return (StreamEventKind::Other, Vec::new());
        };
        self.id = self.id.take().or(chunk.id);
        self.created = self.created.or(chunk.created);
        self.model = self.model.take().or(chunk.model);
        // Only with `stream_options.include_usage`, in a last chunk without choices.
        if let Some(u) = chunk.usage {
            self.turn.report_usage(u.reported());
        }
        let mut kind = StreamEventKind::Other;
        let mut finished = false;
        // Only the first choice is the answer (clients ask for one).
        for choice in chunk.choices.into_iter().filter(|c| c.index == 0) {
            if let Some(delta) = choice.delta {
                if delta.role.is_some() || delta.content.as_deref().is_some_and(|c| !c.is_empty()) {
                    self.turn
                        .text
                        .push_str(delta.content.as_deref().unwrap_or(""));
                    kind = StreamEventKind::Text;
                }
                for d in delta.tool_calls.unwrap_or_default() {
                    let function = d.function.unwrap_or(FunctionDelta {
                        name: None,
                        arguments: None,
                    });
                    let pos = match self.calls.iter().position(|(i, _)| *i == d.index) {
                        Some(pos) => pos,
                        None => {
                            self.calls.push((d.index, PartialCall::default()));
                            kind = StreamEventKind::ToolCallStart;
                            self.calls.len() - 1
                        }
                    };
                    let call = &mut self.calls[pos].1;
                    if let Some(id) = d.id {
                        call.id = id;
                    }
                    if let Some(name) = function.name {
                        call.name.push_str(&name);
                    }
                    call.args
                        .push_str(function.arguments.as_deref().unwrap_or(""));
                    if kind != StreamEventKind::ToolCallStart {
                        kind = StreamEventKind::ToolCallDelta;
                    }
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.turn.stop_reason = Some(reason);
                finished = true;
            }
        }
        if finished {
            return match self.complete_calls() {
                Some(calls) => (StreamEventKind::ToolCallComplete, calls),
                None => (StreamEventKind::MessageEnd, Vec::new()),
            };
        }
        (kind, Vec::new())
    }

    /// All calls, the first time the answer ends with calls in it.
    fn complete_calls(&mut self) -> Option<Vec<ToolCall>> {
        if self.calls.is_empty() || self.calls_completed {
            return None;
        }
        self.calls_completed = true;
        Some(self.calls.iter().map(|(_, c)| c.to_call()).collect())
    }

    /// Chat chunks carry no positions: the tail is the same wherever it is cut in.
    pub fn mark_released(&mut self) {}

    pub fn turn(&self) -> ResponseTurn {
        let mut turn = self.turn.clone();
        turn.calls = self.calls.iter().map(|(_, c)| c.to_call()).collect();
        turn
    }

    pub fn halt_tail(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let id = self
            .id
            .clone()
            .unwrap_or_else(|| random_id("chatcmpl-", 29));
        let model = self.model.as_deref().unwrap_or("unknown");
        write_halt_chunks(
            &mut out,
            &id,
            self.created.unwrap_or_else(unix_now),
            model,
            text,
            None,
        );
        out
    }
}

/// The chunks of a halt answer: the text (with the role, harmless when repeated), an
/// optional tool call, the finish chunk with zero usage, and `[DONE]`.
fn write_halt_chunks(
    out: &mut Vec<u8>,
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    call: Option<&HaltToolCall>,
) {
    let mut chunk = |delta: serde_json::Value, finish: Option<&str>, usage: bool| {
        let mut c = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if usage {
            c["usage"] = zero_usage();
        }
        write_sse(out, None, &c.to_string(), "\n");
    };
    chunk(json!({"role": "assistant", "content": text}), None, false);
    if let Some(call) = call {
        chunk(
            json!({"tool_calls": [{"index": 0, "id": random_id("call_", 24), "type": "function",
                "function": {"name": call.name, "arguments": call.arguments.to_string()}}]}),
            None,
            false,
        );
    }
    let finish = if call.is_some() { "tool_calls" } else { "stop" };
    chunk(json!({}), Some(finish), true);
    write_sse(out, None, "[DONE]", "\n");
}

fn zero_usage() -> serde_json::Value {
    json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0})
}

// ---------------------------------------------------------------------------------------
// Answers loopwarden writes.

/// OpenAI's error shape (Chat Completions and Responses share it).
pub(super) fn error_body(message: &str, failure: UpstreamFailure) -> serde_json::Value {
    let code = match failure {
        UpstreamFailure::Unreachable => "upstream_unreachable",
        UpstreamFailure::Timeout => "upstream_timeout",
    };
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}})
}

/// A trailing `system` message: after the last message, whatever it is (a system
/// message may follow tool results).
pub(super) fn append_reminder(body: &[u8], text: &str) -> Result<Vec<u8>, ParseError> {
    let view = Dialect::OpenAiChat.view(body, false)?;
    let last = view
        .messages
        .last()
        .ok_or(ParseError::EmptyHistory("messages"))?;
    let message = json!({"role": "system", "content": text});
    insert_after(body, last.get(), &format!(",{message}"))
}

pub(super) fn halt_stream(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    let mut out = Vec::new();
    write_halt_chunks(
        &mut out,
        &random_id("chatcmpl-", 29),
        unix_now(),
        model,
        text,
        call,
    );
    out
}

pub(super) fn halt_json(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    let mut message = json!({"role": "assistant", "content": text, "refusal": null});
    if let Some(call) = call {
        message["tool_calls"] = json!([{"id": random_id("call_", 24), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments.to_string()}}]);
    }
    let finish = if call.is_some() { "tool_calls" } else { "stop" };
    json!({
        "id": random_id("chatcmpl-", 29),
        "object": "chat.completion",
        "created": unix_now(),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": zero_usage(),
    })
    .to_string()
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::dialect::generated;

    /// Messages of every role with content as a string, as parts (text, images) or null,
    /// calls on assistant turns, and odd parts the one-pass reading refuses (a text that
    /// is a number, a bare string).
    fn message() -> impl Strategy<Value = serde_json::Value> {
        let text = generated::TEXT;
        let content = prop_oneof![
            text.prop_map(serde_json::Value::from),
            text.prop_map(|t| json!([{"type": "text", "text": t},
                                     {"type": "image_url", "image_url": {"url": "x"}}])),
            Just(json!([{"type": "text", "text": 5}])),
            Just(json!(["a bare string"])),
            Just(serde_json::Value::Null),
            Just(json!({"unexpected": true})),
        ];
        let role = prop_oneof![
            Just("system"),
            Just("user"),
            Just("assistant"),
            Just("tool")
        ];
        (role, content, text).prop_map(|(role, content, t)| {
            let mut message = json!({"role": role, "content": content});
            if role == "assistant" {
                message["tool_calls"] = json!([{"id": "c1", "type": "function",
                    "function": {"name": "bash", "arguments": json!({"cmd": t}).to_string()}}]);
            } else if role == "tool" {
                message["tool_call_id"] = json!("c1");
            }
            message
        })
    }

    proptest! {
        /// A message read in one pass gives exactly the items the raw reading (content
        /// kept raw, then its parts read one by one) gives.
        #[test]
        fn a_message_reads_the_same_in_one_pass(message in message()) {
            let raw = message.to_string();
            let expected = message_items(serde_json::from_str::<Message<&RawValue>>(&raw).unwrap());
            prop_assert_eq!(parse_message(&raw), expected);
        }

        /// An answer gives the text and calls of its message read the raw way, whatever
        /// its content holds.
        #[test]
        fn an_answer_reads_as_its_message(message in message()) {
            let mut message = message;
            message["role"] = json!("assistant");
            let body = json!({"id": "x", "choices": [{"index": 0, "message": message,
                "finish_reason": "stop"}], "usage": {"prompt_tokens": 7}})
            .to_string();
            let turn = parse_response(body.as_bytes()).unwrap();
            let raw = message.to_string();
            let Some(Item::Assistant { text, calls }) =
                message_items(serde_json::from_str::<Message<&RawValue>>(&raw).unwrap()).pop()
            else {
                panic!("an assistant message gives an assistant item");
            };
            prop_assert_eq!(turn.text, text);
            prop_assert_eq!(turn.calls, calls);
            prop_assert_eq!(turn.input_tokens, Some(7));
            prop_assert_eq!(turn.stop_reason.as_deref(), Some("stop"));
        }
    }
}
