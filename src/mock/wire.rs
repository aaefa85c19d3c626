//! The four APIs' answers as the real services send them: JSON bodies, SSE event sequences
//! (text and tool-call arguments split over several deltas) and error bodies.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::budget::Usage;

use super::script::{ErrorReply, ToolCall, Turn};

/// The conversation APIs the mock answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Responses,
    Anthropic,
    /// `stream`: the path is `:streamGenerateContent`; `sse`: with `?alt=sse`.
    Gemini {
        stream: bool,
        sse: bool,
    },
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "openai_chat",
            Api::Responses => "openai_responses",
            Api::Anthropic => "anthropic",
            Api::Gemini { .. } => "gemini",
        }
    }

    /// Whether the client asked for a stream.
    pub fn wants_stream(self, body: &Value) -> bool {
        match self {
            Api::Gemini { stream, .. } => stream,
            _ => body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        }
    }
}

/// A response, before delivery. A stream is a list of events so that the server can pace
/// them or cut the connection after a given number.
#[derive(Debug)]
pub enum Reply {
    Json {
        status: u16,
        headers: Vec<(String, String)>,
        body: Bytes,
    },
    Stream {
        content_type: &'static str,
        headers: Vec<(String, String)>,
        events: Vec<Bytes>,
    },
}

impl Reply {
    pub fn json(status: u16, body: &Value) -> Reply {
        Reply::Json {
            status,
            headers: Vec::new(),
            body: Bytes::from(body.to_string()),
        }
    }
}

/// The context of one answer.
pub struct Ctx<'a> {
    pub api: Api,
    pub body: &'a Value,
    pub body_len: usize,
    pub turn_index: usize,
    pub model: String,
}

/// Renders a scripted turn (or a side answer, which is a text turn) in the API's format.
pub fn render_turn(ctx: &Ctx<'_>, turn: &Turn) -> Reply {
    let stream = ctx.api.wants_stream(ctx.body) && !turn.force_json;
    let calls = mint_calls(ctx, &turn.tool_calls);
    let text = turn.text.as_deref().unwrap_or("");
    let usage = turn.usage;
    match ctx.api {
        Api::Anthropic => anthropic(ctx, text, &calls, stream, usage),
        Api::Chat => chat(ctx, text, &calls, stream, usage),
        Api::Responses => responses(ctx, text, &calls, stream, usage),
        Api::Gemini { sse, .. } => gemini(ctx, text, &calls, stream, sse, usage),
    }
}

/// The usage an answer reports: the script's, or the sizes' estimate with nothing cached.
fn usage_or_estimate(ctx: &Ctx<'_>, scripted: Option<Usage>, output_len: usize) -> Usage {
    scripted.unwrap_or(Usage {
        input: approx_tokens(ctx.body_len),
        output: approx_tokens(output_len),
        ..Usage::default()
    })
}

/// The prompt count of the APIs whose count includes the cached input (OpenAI, Gemini):
/// they bill no cache writes, so a scripted write is ordinary input there.
fn prompt_with_cache(u: &Usage) -> u64 {
    u.input + u.cached_input + u.cache_write
}

/// An error answer in the API's own error shape, unless the script gives the body.
pub fn render_error(api: Api, error: &ErrorReply) -> Reply {
    let status = error.status;
    let message = format!("mock: scripted HTTP {status}");
    let body = error.body.clone().unwrap_or_else(|| match api {
        Api::Anthropic => {
            let kind = match status {
                400 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        Api::Gemini { .. } => {
            let kind = match status {
                400 => "INVALID_ARGUMENT",
                401 => "UNAUTHENTICATED",
                403 => "PERMISSION_DENIED",
                404 => "NOT_FOUND",
                429 => "RESOURCE_EXHAUSTED",
                503 => "UNAVAILABLE",
                _ => "INTERNAL",
            };
            json!({"error": {"code": status, "message": message, "status": kind}})
        }
        Api::Chat | Api::Responses => {
            let (kind, code) = match status {
                401 => ("invalid_request_error", json!("invalid_api_key")),
                429 => ("rate_limit_exceeded", json!("rate_limit_exceeded")),
                400..=499 => ("invalid_request_error", Value::Null),
                _ => ("server_error", Value::Null),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    });
    let mut headers: Vec<(String, String)> = error
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let id_header = if api == Api::Anthropic {
        "request-id"
    } else {
        "x-request-id"
    };
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case(id_header))
    {
        headers.push((id_header.to_string(), format!("req_mock_{}", rand_id(12))));
    }
    Reply::Json {
        status,
        headers,
        body: Bytes::from(body.to_string()),
    }
}

/// A tool call with the id the mock gives it; the id embeds the turn index.
struct Minted<'a> {
    call: &'a ToolCall,
    /// `t<turn>_<k>_<random>`, to be prefixed per API.
    tag: String,
}

impl Minted<'_> {
    fn id(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.tag)
    }

    /// Arguments as JSON text. A freeform call outside the Responses API becomes a function
    /// call with `{"input": …}`: the other APIs have no freeform tool calls.
    fn arguments_text(&self) -> String {
        match &self.call.input {
            Some(input) => json!({ "input": input }).to_string(),
            None => self.call.arguments_text(),
        }
    }

    /// Arguments as a JSON object (Anthropic `input`, Gemini `args`).
    fn arguments_value(&self) -> Value {
        let text = self.arguments_text();
        serde_json::from_str(&text).unwrap_or_else(|_| json!({ "raw": text }))
    }
}

fn mint_calls<'a>(ctx: &Ctx<'_>, calls: &'a [ToolCall]) -> Vec<Minted<'a>> {
    calls
        .iter()
        .enumerate()
        .map(|(k, call)| Minted {
            call,
            tag: format!("t{}_{k}_{}", ctx.turn_index, rand_id(16)),
        })
        .collect()
}

pub fn rand_id(n: usize) -> String {
    (0..n).map(|_| fastrand::alphanumeric()).collect()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn approx_tokens(len: usize) -> u64 {
    (len as u64 / 4).max(1)
}

/// Splits text into up to `n` pieces on char boundaries, so that streamed deltas must be
/// reassembled by the reader.
pub fn pieces(s: &str, n: usize) -> Vec<&str> {
    if s.is_empty() {
        return vec![s];
    }
    let size = s.len().div_ceil(n).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + size).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(&s[start..end]);
        start = end;
    }
    out
}

/// `event: NAME\ndata: JSON\n\n` (Anthropic, Responses).
fn named_event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// `data: JSON\n\n` (Chat Completions).
fn data_event(data: &Value) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

fn sse(events: Vec<Bytes>, headers: Vec<(String, String)>) -> Reply {
    Reply::Stream {
        content_type: "text/event-stream; charset=utf-8",
        headers,
        events,
    }
}

// ------------------------------------------------------------------------ Anthropic Messages

fn anthropic(
    ctx: &Ctx<'_>,
    text: &str,
    calls: &[Minted<'_>],
    stream: bool,
    scripted: Option<Usage>,
) -> Reply {
    let msg_id = format!("msg_mock_{}", rand_id(24));
    let stop = if calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    };
    let mut blocks = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for c in calls {
        blocks.push(
            json!({"type": "tool_use", "id": c.id("toolu"), "name": c.call.name,
                           "input": c.arguments_value()}),
        );
    }
    let u = usage_or_estimate(
        ctx,
        scripted,
        Value::Array(blocks.clone()).to_string().len(),
    );
    let output_tokens = u.output;
    // Anthropic's input excludes the cache reads and writes, counted apart.
    let usage = |out: u64| {
        json!({"input_tokens": u.input, "cache_creation_input_tokens": u.cache_write,
               "cache_read_input_tokens": u.cached_input, "output_tokens": out, "service_tier": "standard"})
    };
    let headers = vec![(
        "request-id".to_string(),
        format!("req_mock_{}", rand_id(12)),
    )];
    if !stream {
        let body = json!({"id": msg_id, "type": "message", "role": "assistant", "model": ctx.model,
            "content": blocks, "stop_reason": stop, "stop_sequence": null, "usage": usage(output_tokens)});
        return Reply::Json {
            status: 200,
            headers,
            body: Bytes::from(body.to_string()),
        };
    }
    let mut ev = vec![
        named_event(
            "message_start",
            &json!({"type": "message_start", "message": {"id": msg_id, "type": "message",
                "role": "assistant", "model": ctx.model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": usage(1)}}),
        ),
        named_event("ping", &json!({"type": "ping"})),
    ];
    let mut index = 0;
    if !text.is_empty() || calls.is_empty() {
        ev.push(named_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}}),
        ));
        for piece in pieces(text, 3) {
            ev.push(named_event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        ev.push(named_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for c in calls {
        ev.push(named_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block":
                    {"type": "tool_use", "id": c.id("toolu"), "name": c.call.name, "input": {}}}),
        ));
        let args = c.arguments_value().to_string();
        for piece in pieces(&args, 3) {
            ev.push(named_event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        ev.push(named_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    ev.push(named_event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                "usage": {"output_tokens": output_tokens}}),
    ));
    ev.push(named_event(
        "message_stop",
        &json!({"type": "message_stop"}),
    ));
    sse(ev, headers)
}

// ------------------------------------------------------------------ OpenAI Chat Completions

fn chat(
    ctx: &Ctx<'_>,
    text: &str,
    calls: &[Minted<'_>],
    stream: bool,
    scripted: Option<Usage>,
) -> Reply {
    let id = format!("chatcmpl-mock{}", rand_id(24));
    let created = now_secs();
    let finish = if calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let wire_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({"id": c.id("call"), "type": "function",
                        "function": {"name": c.call.name, "arguments": c.arguments_text()}})
        })
        .collect();
    let u = usage_or_estimate(
        ctx,
        scripted,
        text.len() + Value::Array(wire_calls.clone()).to_string().len(),
    );
    let (prompt_tokens, completion_tokens) = (prompt_with_cache(&u), u.output);
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_input},
        "completion_tokens_details": {"reasoning_tokens": 0}});
    if !stream {
        let content = if text.is_empty() && !calls.is_empty() {
            Value::Null
        } else {
            json!(text)
        };
        let mut message = json!({"role": "assistant", "content": content, "refusal": null});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(wire_calls);
        }
        let body = json!({"id": id, "object": "chat.completion", "created": created,
            "model": ctx.model, "choices": [{"index": 0, "message": message,
            "finish_reason": finish, "logprobs": null}], "usage": usage,
            "system_fingerprint": "fp_mock"});
        return Reply::json(200, &body);
    }
    let chunk = |delta: Value, finish: Option<&str>| {
        data_event(
            &json!({"id": id, "object": "chat.completion.chunk", "created": created,
            "model": ctx.model, "system_fingerprint": "fp_mock",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]}),
        )
    };
    let mut ev = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        None,
    )];
    if !text.is_empty() {
        for piece in pieces(text, 3) {
            ev.push(chunk(json!({"content": piece}), None));
        }
    }
    for (k, c) in calls.iter().enumerate() {
        ev.push(chunk(
            json!({"tool_calls": [{"index": k, "id": c.id("call"), "type": "function",
                   "function": {"name": c.call.name, "arguments": ""}}]}),
            None,
        ));
        for piece in pieces(&c.arguments_text(), 3) {
            ev.push(chunk(
                json!({"tool_calls": [{"index": k, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    ev.push(chunk(json!({}), Some(finish)));
    let include_usage = ctx
        .body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if include_usage {
        ev.push(data_event(
            &json!({"id": id, "object": "chat.completion.chunk",
            "created": created, "model": ctx.model, "system_fingerprint": "fp_mock",
            "choices": [], "usage": usage}),
        ));
    }
    ev.push(Bytes::from_static(b"data: [DONE]\n\n"));
    sse(ev, Vec::new())
}

// ------------------------------------------------------------------------ OpenAI Responses

fn responses(
    ctx: &Ctx<'_>,
    text: &str,
    calls: &[Minted<'_>],
    stream: bool,
    scripted: Option<Usage>,
) -> Reply {
    let resp_id = format!("resp_mock_{}", rand_id(24));
    let created = now_secs();
    let mut items = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        items.push(
            json!({"id": format!("msg_t{}_{}", ctx.turn_index, rand_id(16)),
            "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}),
        );
    }
    for c in calls {
        items.push(match &c.call.input {
            Some(input) => json!({"id": c.id("ctc"), "type": "custom_tool_call",
                "status": "completed", "call_id": c.id("call"), "name": c.call.name, "input": input}),
            None => json!({"id": c.id("fc"), "type": "function_call", "status": "completed",
                "call_id": c.id("call"), "name": c.call.name, "arguments": c.arguments_text()}),
        });
    }
    let u = usage_or_estimate(ctx, scripted, Value::Array(items.clone()).to_string().len());
    let (input_tokens, output_tokens) = (prompt_with_cache(&u), u.output);
    let usage = json!({"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": u.cached_input},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens});
    let response = |status: &str, output: Value, usage: Value| {
        json!({"id": resp_id, "object": "response", "created_at": created, "status": status,
            "background": false, "error": null, "incomplete_details": null, "instructions": null,
            "max_output_tokens": ctx.body.get("max_output_tokens"), "model": ctx.model,
            "output": output, "parallel_tool_calls": ctx.body.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
            "previous_response_id": ctx.body.get("previous_response_id"),
            "reasoning": {"effort": null, "summary": null},
            "store": ctx.body.get("store").cloned().unwrap_or(json!(false)),
            "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
            "tools": [], "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": null,
            "metadata": {}})
    };
    let headers = vec![(
        "x-request-id".to_string(),
        format!("req_mock_{}", rand_id(12)),
    )];
    if !stream {
        let body = response("completed", Value::Array(items), usage);
        return Reply::Json {
            status: 200,
            headers,
            body: Bytes::from(body.to_string()),
        };
    }
    let mut ev = Vec::new();
    let mut push = |kind: &str, mut fields: Value| {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(ev.len());
        ev.push(named_event(kind, &fields));
    };
    push(
        "response.created",
        json!({"response": response("in_progress", json!([]), Value::Null)}),
    );
    push(
        "response.in_progress",
        json!({"response": response("in_progress", json!([]), Value::Null)}),
    );
    for (idx, item) in items.iter().enumerate() {
        responses_item_events(&mut push, idx, item);
        push(
            "response.output_item.done",
            json!({"output_index": idx, "item": item}),
        );
    }
    push(
        "response.completed",
        json!({"response": response("completed", Value::Array(items), usage)}),
    );
    sse(ev, headers)
}

/// The stream events that build one output item of a Responses answer: from
/// `response.output_item.added` through its content's `done` (the caller sends
/// `response.output_item.done`).
fn responses_item_events(push: &mut dyn FnMut(&str, Value), idx: usize, item: &Value) {
    let item_id = item["id"].clone();
    match item["type"].as_str() {
        Some("message") => {
            let text = item["content"][0]["text"].as_str().unwrap_or("");
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            added["content"] = json!([]);
            push(
                "response.output_item.added",
                json!({"output_index": idx, "item": added}),
            );
            push(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": idx,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            );
            for piece in pieces(text, 3) {
                push(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": idx,
                    "content_index": 0, "delta": piece, "logprobs": []}),
                );
            }
            push(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": idx,
                "content_index": 0, "text": text, "logprobs": []}),
            );
            push(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": idx,
                "content_index": 0, "part": item["content"][0]}),
            );
        }
        Some("function_call") => {
            let args = item["arguments"].as_str().unwrap_or("");
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            added["arguments"] = json!("");
            push(
                "response.output_item.added",
                json!({"output_index": idx, "item": added}),
            );
            for piece in pieces(args, 3) {
                push(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": idx, "delta": piece}),
                );
            }
            push(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": idx, "arguments": args}),
            );
        }
        _ => {
            let input = item["input"].as_str().unwrap_or("");
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            added["input"] = json!("");
            push(
                "response.output_item.added",
                json!({"output_index": idx, "item": added}),
            );
            for piece in pieces(input, 3) {
                push(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": item_id, "output_index": idx, "delta": piece}),
                );
            }
            push(
                "response.custom_tool_call_input.done",
                json!({"item_id": item_id, "output_index": idx, "input": input}),
            );
        }
    }
}

// ------------------------------------------------------------------------------- Gemini

fn gemini(
    ctx: &Ctx<'_>,
    text: &str,
    calls: &[Minted<'_>],
    stream: bool,
    sse_mode: bool,
    scripted: Option<Usage>,
) -> Reply {
    let response_id = rand_id(16);
    let call_parts: Vec<Value> = calls
        .iter()
        .map(|c| json!({"functionCall": {"name": c.call.name, "args": c.arguments_value(), "id": c.id("gc")}}))
        .collect();
    let u = usage_or_estimate(
        ctx,
        scripted,
        text.len() + Value::Array(call_parts.clone()).to_string().len(),
    );
    // The prompt count includes the cached input; the thoughts (a quarter of a scripted
    // output) are counted apart from the candidates', and billed as output.
    let prompt_tokens = prompt_with_cache(&u);
    let thoughts = if scripted.is_some() { u.output / 4 } else { 0 };
    let candidates_tokens = u.output - thoughts;
    let chunk = |parts: Vec<Value>, last: bool| {
        let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
        if last {
            candidate["finishReason"] = json!("STOP");
        }
        let out = if last { candidates_tokens } else { 0 };
        let mut usage = json!({"promptTokenCount": prompt_tokens, "candidatesTokenCount": out,
                               "totalTokenCount": prompt_tokens + out + thoughts});
        // Gemini leaves out the counts that are zero.
        if u.cached_input > 0 {
            usage["cachedContentTokenCount"] = json!(u.cached_input);
        }
        if thoughts > 0 {
            usage["thoughtsTokenCount"] = json!(thoughts);
        }
        json!({"candidates": [candidate], "usageMetadata": usage,
            "modelVersion": ctx.model, "responseId": response_id})
    };
    let text_parts = if text.is_empty() && !calls.is_empty() {
        Vec::new()
    } else {
        vec![json!({"text": text})]
    };
    if !stream {
        let parts = text_parts.into_iter().chain(call_parts).collect();
        return Reply::json(200, &chunk(parts, true));
    }
    // Text arrives in several chunks; function calls arrive whole, in the last chunk.
    let mut chunks: Vec<Value> = Vec::new();
    if !text.is_empty() {
        let split = pieces(text, 3);
        let n = split.len();
        for (i, piece) in split.into_iter().enumerate() {
            chunks.push(chunk(
                vec![json!({"text": piece})],
                i + 1 == n && calls.is_empty(),
            ));
        }
    }
    if !call_parts.is_empty() || chunks.is_empty() {
        let parts = if call_parts.is_empty() {
            vec![json!({"text": ""})]
        } else {
            call_parts
        };
        chunks.push(chunk(parts, true));
    }
    if sse_mode {
        let events = chunks
            .iter()
            .map(|c| Bytes::from(format!("data: {c}\r\n\r\n")))
            .collect();
        return sse(events, Vec::new());
    }
    // Without `alt=sse` the stream is one JSON array delivered element by element.
    let n = chunks.len();
    let events = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let open = if i == 0 { "[" } else { ",\r\n" };
            let close = if i + 1 == n { "]" } else { "" };
            Bytes::from(format!("{open}{c}{close}"))
        })
        .collect();
    Reply::Stream {
        content_type: "application/json; charset=UTF-8",
        headers: Vec::new(),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_respect_char_boundaries() {
        let s = "héllo wörld ✓";
        let p = pieces(s, 3);
        assert!(p.len() >= 2);
        assert_eq!(p.concat(), s);
    }
}
