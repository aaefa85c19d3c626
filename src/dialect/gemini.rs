//! Gemini generateContent (`POST …/models/{model}:generateContent` and
//! `:streamGenerateContent`).
//!
//! Request: `systemInstruction {parts}` and `contents`, each `{role: user|model, parts}`.
//! A part is `{text}` (with `thought: true` for thoughts, ignored), `{functionCall {id?,
//! name, args}}` or `{functionResponse {id?, name, response}}`; a failed tool answers
//! with `response.error`. Call ids are optional: without them results pair by name.
//! Streaming is chosen by the path, not the body.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use serde_json::json;

use super::framing::{write_sse, Frame};
use super::{
    args_from_raw, insert_after, offers_tools, preamble_of, push_into_array, random_id,
    system_preamble, value_text, Dialect, EarlierPreamble, HaltToolCall, ParseError, RequestView,
    ResponseTurn, StreamEventKind, TopLevel, UpstreamFailure,
};
use crate::transcript::{Item, ToolCall, ToolResult};

pub(super) fn view<'a>(
    top: &TopLevel<'a>,
    stream_path: bool,
    earlier: Option<EarlierPreamble<'_>>,
) -> Result<RequestView<'a>, ParseError> {
    let system = top
        .raw("systemInstruction")
        .or_else(|| top.raw("system_instruction"));
    Ok(RequestView {
        model: top.field("model")?,
        stream: stream_path,
        has_tools: offers_tools(top.raw("tools")),
        preamble: preamble_of(system, earlier, |raw| system_preamble(content_text(raw))),
        preamble_source: system,
        messages: top.messages()?,
    })
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parts: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    thought: Option<bool>,
    #[serde(borrow, default)]
    function_call: Option<FunctionCall<'a>>,
    #[serde(borrow, default)]
    function_response: Option<FunctionResponse<'a>>,
}

#[derive(Deserialize)]
struct FunctionCall<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    args: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct FunctionResponse<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

/// The two keys Gemini CLI puts in a function response.
#[derive(Deserialize)]
struct ResponseBody<'a> {
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// The text of a `{parts:[{text}]}` object (systemInstruction), or of a plain string.
fn content_text(raw: &str) -> String {
    if raw.starts_with('"') {
        return serde_json::from_str::<Cow<str>>(raw)
            .map(Cow::into_owned)
            .unwrap_or_default();
    }
    match serde_json::from_str::<Content>(raw) {
        Ok(content) => read_parts(&content.parts).texts.join("\n"),
        Err(_) => String::new(),
    }
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    let Ok(content) = serde_json::from_str::<Content>(raw) else {
        return Vec::new();
    };
    let read = read_parts(&content.parts);
    let text = read.texts.join("\n");
    match content.role.as_deref().unwrap_or("user") {
        "model" => vec![Item::Assistant {
            text,
            calls: read.calls,
        }],
        _ => {
            let mut items = read.results;
            if !text.is_empty() || items.is_empty() {
                items.push(Item::User { text });
            }
            items
        }
    }
}

/// What a list of parts holds. Texts stay separate: a request joins them as lines, a
/// stream glues its deltas.
#[derive(Default)]
struct ReadParts {
    texts: Vec<String>,
    calls: Vec<ToolCall>,
    results: Vec<Item>,
}

fn read_parts(parts: &[&RawValue]) -> ReadParts {
    let mut read = ReadParts::default();
    for raw_part in parts {
        let Ok(part) = serde_json::from_str::<Part>(raw_part.get()) else {
            continue;
        };
        if let Some(call) = part.function_call {
            read.calls.push(ToolCall {
                id: call.id.unwrap_or_default(),
                name: call.name.unwrap_or_default(),
                args: args_from_raw(call.args),
            });
        } else if let Some(resp) = part.function_response {
            read.results.push(Item::ToolResult(result_of(resp)));
        } else if part.thought != Some(true) {
            if let Some(text) = part.text.filter(|t| !t.is_empty()) {
                read.texts.push(text.into_owned());
            }
        }
    }
    read
}

fn result_of(resp: FunctionResponse) -> ToolResult {
    let (text, is_error) = match resp.response {
        Some(raw) if raw.get().starts_with('{') => {
            match serde_json::from_str::<ResponseBody>(raw.get()) {
                Ok(ResponseBody { error: Some(e), .. }) if e.get() != "null" => {
                    (value_text(e), Some(true))
                }
                Ok(ResponseBody {
                    output: Some(o), ..
                }) => (value_text(o), None),
                _ => (raw.get().to_string(), None),
            }
        }
        Some(raw) => (value_text(raw), None),
        None => (String::new(), None),
    };
    ToolResult {
        call_id: resp.id.unwrap_or_default(),
        name: resp.name.unwrap_or_default(),
        text,
        is_error,
    }
}

// ---------------------------------------------------------------------------------------
// Responses. A streamed answer is a series of whole response objects, each with the
// next parts; a function call always arrives whole in one of them.

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    #[serde(borrow, default)]
    candidates: Vec<Candidate<'a>>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    model_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    #[serde(borrow, default)]
    content: Option<Content<'a>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
}

/// What one response object held.
struct Added {
    text: bool,
    calls: Vec<ToolCall>,
    finished: bool,
}

/// Adds what one response object says to the turn: glued text, calls, usage, stop.
fn add_response(turn: &mut ResponseTurn, resp: Response) -> Added {
    let mut had_text = false;
    let mut calls = Vec::new();
    let mut finished = false;
    // Clients ask for one candidate; the first is the answer.
    if let Some(candidate) = resp.candidates.into_iter().next() {
        if let Some(content) = candidate.content {
            let read = read_parts(&content.parts);
            had_text = !read.texts.is_empty();
            for text in read.texts {
                turn.text.push_str(&text);
            }
            calls = read.calls;
            turn.calls.extend(calls.iter().cloned());
        }
        if candidate.finish_reason.is_some() {
            turn.stop_reason = candidate.finish_reason;
            finished = true;
        }
    }
    if let Some(usage) = resp.usage_metadata {
        turn.input_tokens = usage.prompt_token_count.or(turn.input_tokens);
        turn.output_tokens = usage.candidates_token_count.or(turn.output_tokens);
    }
    Added {
        text: had_text,
        calls,
        finished,
    }
}

/// A `generateContent` answer, or a whole `streamGenerateContent` JSON array.
pub(super) fn parse_response(body: &[u8]) -> Result<ResponseTurn, ParseError> {
    let err = |e| ParseError::json(Dialect::Gemini, e);
    let mut turn = ResponseTurn::default();
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let all: Vec<Response> = serde_json::from_slice(body).map_err(err)?;
        for resp in all {
            add_response(&mut turn, resp);
        }
    } else {
        add_response(&mut turn, serde_json::from_slice(body).map_err(err)?);
    }
    Ok(turn)
}

/// What a streamed answer said so far.
#[derive(Debug, Default)]
pub(super) struct Stream {
    turn: ResponseTurn,
    model: Option<String>,
    /// Response objects seen (array elements / SSE events with data).
    elements: usize,
    /// The first element holding a call not yet released to the client.
    hold_element: Option<usize>,
}

impl Stream {
    pub fn on_frame(
        &mut self,
        frame: &Frame,
        json_array: bool,
    ) -> (StreamEventKind, Vec<ToolCall>) {
        if frame.data.is_empty() {
            let end = json_array && frame.raw.contains(&b']');
            let kind = if end {
                StreamEventKind::MessageEnd
            } else {
                StreamEventKind::Other
            };
            return (kind, Vec::new());
        }
        let element = self.elements;
        self.elements += 1;
        let Ok(resp) = serde_json::from_str::<Response>(&frame.data) else {
            return (StreamEventKind::Other, Vec::new());
        };
        if resp.model_version.is_some() {
            self.model = resp.model_version.clone();
        }
        let added = add_response(&mut self.turn, resp);
        if !added.calls.is_empty() {
            self.hold_element.get_or_insert(element);
            return (StreamEventKind::ToolCallComplete, added.calls);
        }
        // The last object (finish reason, usage, maybe the last text) ends the answer.
        let kind = if added.finished {
            StreamEventKind::MessageEnd
        } else if added.text {
            StreamEventKind::Text
        } else {
            StreamEventKind::Other
        };
        (kind, Vec::new())
    }

    pub fn mark_released(&mut self) {
        self.hold_element = None;
    }

    pub fn turn(&self) -> ResponseTurn {
        self.turn.clone()
    }

    pub fn halt_tail(&self, text: &str, json_array: bool) -> Vec<u8> {
        let answer =
            answer_object(self.model.as_deref().unwrap_or("unknown"), text, None).to_string();
        let mut out = Vec::new();
        if json_array {
            // The client saw the array open unless the held element was the first.
            let opened = self.hold_element.unwrap_or(self.elements) > 0;
            out.extend_from_slice(if opened { b",\r\n" } else { b"[" });
            out.extend_from_slice(answer.as_bytes());
            out.extend_from_slice(b"]");
        } else {
            write_sse(&mut out, None, &answer, "\r\n");
        }
        out
    }
}

/// A complete response object: the text (and an optional call), finish reason STOP,
/// zero usage.
fn answer_object(model: &str, text: &str, call: Option<&HaltToolCall>) -> serde_json::Value {
    let mut parts = vec![json!({"text": text})];
    if let Some(call) = call {
        parts.push(json!({"functionCall": {"name": call.name, "args": call.arguments}}));
    }
    json!({
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0},
        "modelVersion": model,
        "responseId": random_id("", 22),
    })
}

// ---------------------------------------------------------------------------------------
// Answers loopwarden writes.

pub(super) fn error_body(message: &str, failure: UpstreamFailure) -> serde_json::Value {
    let status = match failure {
        UpstreamFailure::Unreachable => "UNAVAILABLE",
        UpstreamFailure::Timeout => "DEADLINE_EXCEEDED",
    };
    json!({"error": {"code": failure.status(), "message": message, "status": status}})
}

/// The role and raw parts of a content, to splice into its parts.
#[derive(Deserialize)]
struct ContentSpan<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parts: Option<&'a RawValue>,
}

/// A text part at the end of the last user content (next to its function responses,
/// which Gemini accepts); a new user content when the history ends otherwise.
pub(super) fn append_reminder(body: &[u8], text: &str) -> Result<Vec<u8>, ParseError> {
    let view = Dialect::Gemini.view(body, false)?;
    let last = view
        .messages
        .last()
        .ok_or_else(|| ParseError("no contents to append a reminder to".into()))?;
    let content: ContentSpan =
        serde_json::from_str(last.get()).map_err(|e| ParseError::json(Dialect::Gemini, e))?;
    let part = json!({"text": text}).to_string();
    match (content.role.as_deref().unwrap_or("user"), content.parts) {
        ("user", Some(parts)) if parts.get().starts_with('[') => {
            push_into_array(body, parts.get(), &part)
        }
        _ => insert_after(
            body,
            last.get(),
            &format!(r#",{{"role":"user","parts":[{part}]}}"#),
        ),
    }
}

/// Gemini clients stream with `?alt=sse`; one event holds the whole answer.
pub(super) fn halt_stream(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    let mut out = Vec::new();
    write_sse(
        &mut out,
        None,
        &answer_object(model, text, call).to_string(),
        "\r\n",
    );
    out
}

pub(super) fn halt_json(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    answer_object(model, text, call).to_string().into_bytes()
}
