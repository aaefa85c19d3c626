//! OpenAI Responses (`POST /v1/responses`).
//!
//! Request: `instructions` (optional) and `input`, either a plain string (one user
//! message) or a list of items. An assistant turn is spread over several items
//! (`message` role assistant, `function_call`, `custom_tool_call`, `reasoning`...), so
//! each becomes an [`Item::AssistantPart`] and the transcript joins consecutive parts.
//! Codex sends its system prompt as `developer` messages in `input`; its freeform
//! `apply_patch` is a `custom_tool_call` whose `input` is a plain string.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use serde_json::json;

use super::framing::{write_sse, Frame};
use super::stream::PartialCall;
use super::{
    answer_json, args_from_raw, args_from_text, offered_tools, push_into_array, random_id,
    replace_span, span_of, unix_now, Content, ContentText, Dialect, HaltToolCall, InputDetails,
    ParseError, RawMessage, Reported, RequestView, ResponseTurn, StreamEventKind, TextPart,
    TopLevel,
};
use crate::transcript::{Item, ToolCall, ToolResult};

pub(super) fn view<'a>(top: &TopLevel<'_, 'a>) -> Result<RequestView<'a>, ParseError> {
    let messages = match top.raw("input") {
        // A plain string input is one user message; parse_message reads it as such.
        Some(input) if input.starts_with('"') => vec![RawMessage(input)],
        _ => top.messages()?,
    };
    let instructions = top.raw("instructions");
    Ok(RequestView {
        model: top.field("model")?,
        stream: top.field("stream")?.unwrap_or(false),
        tools: offered_tools(top.raw("tools")),
        preamble_source: instructions,
        messages,
    })
}

/// One input item, with the fields of every item type we read. Its `content` and `output`
/// (`C`) are read in the same pass ([`Content`]), or kept raw (`&RawValue`): in streamed
/// items, and for an item the one pass does not read (an odd part, or an output that is
/// neither text nor parts, whose JSON is its text).
#[derive(Deserialize)]
#[serde(bound(deserialize = "'de: 'a, C: Deserialize<'de>"))]
struct InputItem<'a, C = Content<'a, TextPart<'a>>> {
    /// Absent on the short form `{role, content}` of a message.
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(default = "Option::default")]
    content: Option<C>,
    // function_call / custom_tool_call / their outputs
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Cow<'a, str>>,
    #[serde(default = "Option::default")]
    output: Option<C>,
    // local_shell_call
    #[serde(borrow, default)]
    action: Option<&'a RawValue>,
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    if raw.starts_with('"') {
        let text = serde_json::from_str::<Cow<str>>(raw)
            .map(Cow::into_owned)
            .unwrap_or_default();
        return vec![Item::User { text }];
    }
    match serde_json::from_str::<InputItem>(raw) {
        Ok(item) if !matches!(item.output, Some(Content::Other)) => item_items(item),
        _ => match serde_json::from_str::<InputItem<&RawValue>>(raw) {
            Ok(item) => item_items(item),
            Err(_) => Vec::new(),
        },
    }
}

/// The transcript items one input or output item gives.
fn item_items<C: ContentText>(item: InputItem<'_, C>) -> Vec<Item> {
    let part_call = |name: String, args| {
        vec![Item::AssistantPart {
            text: String::new(),
            calls: vec![ToolCall {
                id: item.call_id.clone().unwrap_or_default(),
                name,
                args,
            }],
        }]
    };
    match item.kind.as_deref().unwrap_or("message") {
        "message" => {
            let text = item.content.map(ContentText::text).unwrap_or_default();
            match item.role.as_deref().unwrap_or("user") {
                "system" | "developer" => vec![Item::System { text }],
                "assistant" => vec![Item::AssistantPart {
                    text,
                    calls: Vec::new(),
                }],
                _ => vec![Item::User { text }],
            }
        }
        "function_call" => part_call(
            item.name.clone().unwrap_or_default(),
            args_from_text(item.arguments.as_deref().unwrap_or("")),
        ),
        // Freeform tool: the input is not JSON, it stays one JSON string.
        "custom_tool_call" => part_call(
            item.name.clone().unwrap_or_default(),
            serde_json::Value::String(item.input.as_deref().unwrap_or("").to_string()),
        ),
        "local_shell_call" => part_call("local_shell".to_string(), args_from_raw(item.action)),
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
            vec![Item::ToolResult(ToolResult {
                call_id: item.call_id.unwrap_or_default(),
                name: String::new(),
                text: item
                    .output
                    .map(ContentText::output_text)
                    .unwrap_or_default(),
                is_error: None,
            })]
        }
        // reasoning, web_search_call, item_reference...: nothing detection reads. They
        // give no item, so the parts around them still join into one turn.
        _ => Vec::new(),
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
    input_tokens_details: Option<InputDetails>,
}

impl Usage {
    fn reported(self) -> Reported {
        Reported {
            input: self.input_tokens,
            output: self.output_tokens,
            cached_input: self.input_tokens_details.and_then(|d| d.cached_tokens),
            ..Default::default()
        }
    }
}

/// An answer, its `output` items read in the same pass (`I`: [`InputItem`]), or kept raw
/// (`&RawValue`) for an answer with an item that does not read as one: each is then read
/// on its own and odd ones give nothing, as [`parse_message`] does. Keeping every item raw
/// and parsing it again scanned the answer's bytes once more (BENCHMARKS.md, "What was tried").
#[derive(Deserialize)]
#[serde(bound(deserialize = "I: Deserialize<'de>"))]
struct Response<I> {
    #[serde(default = "Vec::new")]
    output: Vec<I>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

impl<I> Response<I> {
    /// The turn its `output` items make (text joined, calls in order), each item's
    /// transcript items by `items`.
    fn into_turn(self, items: impl Fn(I) -> Vec<Item>) -> ResponseTurn {
        let mut turn = ResponseTurn::default();
        for item in self.output {
            for part in items(item) {
                if let Item::AssistantPart { text, calls } = part {
                    super::push_line(&mut turn.text, &text);
                    turn.calls.extend(calls);
                }
            }
        }
        turn.report_usage(self.usage.unwrap_or_default().reported());
        // "incomplete" says little; its reason (max_output_tokens...) says why.
        turn.stop_reason = self
            .incomplete_details
            .and_then(|d| d.reason)
            .or(self.status);
        turn
    }
}

pub(super) fn parse_response(body: &[u8]) -> Result<ResponseTurn, ParseError> {
    if let Ok(resp) = answer_json::<Response<InputItem>>(body) {
        return Ok(resp.into_turn(item_items));
    }
    let resp: Response<&RawValue> =
        answer_json(body).map_err(|e| ParseError::json(Dialect::OpenAiResponses, e))?;
    Ok(resp.into_turn(|item| parse_message(item.get())))
}

/// One streamed event, with the fields of every event type we read.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(default)]
    sequence_number: Option<u64>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
}

/// Where the client's view of the stream stops when tool-call events are held.
#[derive(Debug, Clone, Copy)]
struct Hold {
    output_index: u64,
    /// The sequence number of the last event before the held ones.
    seq_before: Option<u64>,
    /// How many finished output items the client had seen.
    items_before: usize,
}

/// What a streamed answer said so far.
#[derive(Debug, Default)]
pub(super) struct Stream {
    turn: ResponseTurn,
    /// The `response` object of `response.created`: the base of a tail's final object.
    response: Option<serde_json::Value>,
    model: Option<String>,
    /// Calls being streamed, by output index.
    open_calls: Vec<(u64, PartialCall)>,
    /// Finished output items, in order, for a tail's `response.completed`.
    done_items: Vec<Box<RawValue>>,
    next_index: u64,
    last_seq: Option<u64>,
    hold: Option<Hold>,
}

impl Stream {
    pub fn on_frame(&mut self, frame: &Frame) -> (StreamEventKind, Vec<ToolCall>) {
        let Ok(ev) = serde_json::from_str::<Event>(&frame.data) else {
            return (StreamEventKind::Other, Vec::new());
        };
        let seq_before = self.last_seq;
        if ev.sequence_number.is_some() {
            self.last_seq = ev.sequence_number;
        }
        let index = ev.output_index.unwrap_or(0);
        let item = ev
            .item
            .and_then(|raw| serde_json::from_str::<InputItem<&RawValue>>(raw.get()).ok());
        let item_kind = item
            .as_ref()
            .and_then(|i| i.kind.as_deref())
            .unwrap_or("")
            .to_string();
        let none = Vec::new();
        match ev.kind.as_ref() {
            "response.created" | "response.in_progress" => {
                if let Some(raw) = ev.response {
                    self.response = serde_json::from_str(raw.get()).ok();
                }
                (StreamEventKind::Other, none)
            }
            "response.output_item.added" => {
                (self.item_added(index, &item_kind, item, seq_before), none)
            }
            "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
                if let Some((_, call)) = self.open_calls.iter_mut().find(|(i, _)| *i == index) {
                    call.args.push_str(ev.delta.as_deref().unwrap_or(""));
                }
                (StreamEventKind::ToolCallDelta, none)
            }
            "response.function_call_arguments.done" | "response.custom_tool_call_input.done" => {
                if let Some((_, call)) = self.open_calls.iter_mut().find(|(i, _)| *i == index) {
                    if let Some(full) = ev.arguments.or(ev.input) {
                        call.args = full.into_owned();
                    }
                }
                (StreamEventKind::ToolCallDelta, none)
            }
            "response.output_item.done" => {
                if let Some(raw) = ev.item {
                    self.done_items.push(raw.to_owned());
                }
                let Some(pos) = self.open_calls.iter().position(|(i, _)| *i == index) else {
                    let kind = if item_kind == "message" {
                        StreamEventKind::Text
                    } else {
                        StreamEventKind::Other
                    };
                    return (kind, none);
                };
                let (_, mut call) = self.open_calls.remove(pos);
                // The finished item is authoritative when it carries the arguments.
                if let Some(full) =
                    item.and_then(|i| if call.freeform { i.input } else { i.arguments })
                {
                    call.args = full.into_owned();
                }
                let call = call.to_call();
                self.turn.calls.push(call.clone());
                (StreamEventKind::ToolCallComplete, vec![call])
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                self.turn.text.push_str(ev.delta.as_deref().unwrap_or(""));
                (StreamEventKind::Text, none)
            }
            "response.output_text.done"
            | "response.refusal.done"
            | "response.content_part.added"
            | "response.content_part.done"
            | "response.output_text.annotation.added" => (StreamEventKind::Text, none),
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(raw) = ev.response {
                    self.completed(raw);
                }
                (StreamEventKind::MessageEnd, none)
            }
            _ => (StreamEventKind::Other, none),
        }
    }

    /// `response.output_item.added`: a tool call starts (and the client's view of the
    /// stream is held from here), or a message.
    fn item_added(
        &mut self,
        index: u64,
        item_kind: &str,
        item: Option<InputItem<'_, &RawValue>>,
        seq_before: Option<u64>,
    ) -> StreamEventKind {
        self.next_index = self.next_index.max(index + 1);
        match (item_kind, item) {
            ("function_call" | "custom_tool_call", Some(item)) => {
                let freeform = item_kind == "custom_tool_call";
                let args = if freeform { item.input } else { item.arguments };
                self.open_calls.push((
                    index,
                    PartialCall {
                        id: item.call_id.unwrap_or_default(),
                        name: item.name.unwrap_or_default(),
                        args: args.map(Cow::into_owned).unwrap_or_default(),
                        freeform,
                    },
                ));
                self.hold.get_or_insert(Hold {
                    output_index: index,
                    seq_before,
                    items_before: self.done_items.len(),
                });
                StreamEventKind::ToolCallStart
            }
            ("message", _) => StreamEventKind::Text,
            _ => StreamEventKind::Other,
        }
    }

    /// The final response object (`response.completed`, `.incomplete`, `.failed`): its
    /// usage and stop reason, and the whole turn when nothing was streamed before it.
    fn completed(&mut self, raw: &RawValue) {
        let Ok(resp) = serde_json::from_str::<Response<&RawValue>>(raw.get()) else {
            return;
        };
        // A stream that sent only the final object still gives its turn; one that
        // streamed its items has them already, and its final object's copies of them are
        // not read again.
        let streamed = !self.turn.text.is_empty() || !self.turn.calls.is_empty();
        let full = resp.into_turn(|item| {
            if streamed {
                Vec::new()
            } else {
                parse_message(item.get())
            }
        });
        if !streamed {
            self.turn.text = full.text;
            self.turn.calls = full.calls;
        }
        // Usage comes with the whole response, in `response.completed`.
        self.turn.input_tokens = full.input_tokens;
        self.turn.output_tokens = full.output_tokens;
        self.turn.cached_input_tokens = full.cached_input_tokens;
        self.turn.stop_reason = full.stop_reason;
    }

    pub fn mark_released(&mut self) {
        self.hold = None;
    }

    pub fn turn(&self) -> ResponseTurn {
        let mut turn = self.turn.clone();
        turn.calls
            .extend(self.open_calls.iter().map(|(_, c)| c.to_call()));
        turn
    }

    pub fn halt_tail(&self, text: &str) -> Vec<u8> {
        let hold = self.hold.unwrap_or(Hold {
            output_index: self.next_index,
            seq_before: self.last_seq,
            items_before: self.done_items.len(),
        });
        let items = self.done_items[..hold.items_before.min(self.done_items.len())]
            .iter()
            .filter_map(|raw| serde_json::from_str(raw.get()).ok())
            .collect();
        let mut writer = HaltWriter {
            out: Vec::new(),
            seq: hold.seq_before.map_or(0, |s| s + 1),
            completed: None,
        };
        let base = match &self.response {
            Some(response) => response.clone(),
            None => {
                let base = response_object(self.model.as_deref().unwrap_or("unknown"));
                writer.event("response.created", json!({"response": base}));
                writer.event("response.in_progress", json!({"response": base}));
                base
            }
        };
        writer.answer(base, items, hold.output_index, text, None);
        writer.out
    }
}

/// Writes the events of a halt answer, numbering them as it goes.
struct HaltWriter {
    out: Vec<u8>,
    seq: u64,
    /// The final response object, once written.
    completed: Option<serde_json::Value>,
}

impl HaltWriter {
    fn event(&mut self, kind: &str, mut data: serde_json::Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        write_sse(&mut self.out, Some(kind), &data.to_string(), "\n");
    }

    /// From output index `index` on: a message with `text`, an optional function call,
    /// and `response.completed` whose output is `items` plus what was added here.
    fn answer(
        &mut self,
        mut response: serde_json::Value,
        mut items: Vec<serde_json::Value>,
        index: u64,
        text: &str,
        call: Option<&HaltToolCall>,
    ) {
        let msg_id = random_id("msg_", 48);
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        let ids = json!({"item_id": msg_id, "output_index": index, "content_index": 0});
        let with = |mut v: serde_json::Value, extra: serde_json::Value| {
            if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                v.extend(extra.clone());
            }
            v
        };
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": {
                "id": msg_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        );
        let empty_part =
            json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
        self.event(
            "response.content_part.added",
            with(ids.clone(), json!({"part": empty_part})),
        );
        self.event(
            "response.output_text.delta",
            with(ids.clone(), json!({"delta": text, "logprobs": []})),
        );
        self.event(
            "response.output_text.done",
            with(ids.clone(), json!({"text": text, "logprobs": []})),
        );
        self.event(
            "response.content_part.done",
            with(ids, json!({"part": part})),
        );
        let message = json!({"id": msg_id, "type": "message", "status": "completed", "role": "assistant",
                             "content": [part]});
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": message}),
        );
        items.push(message);
        if let Some(call) = call {
            let i = index + 1;
            let item = json!({"id": random_id("fc_", 48), "type": "function_call", "status": "completed",
                              "call_id": random_id("call_", 24), "name": call.name,
                              "arguments": call.arguments.to_string()});
            let item_id = item["id"].clone();
            let mut added = item.clone();
            added["status"] = json!("in_progress");
            added["arguments"] = json!("");
            self.event(
                "response.output_item.added",
                json!({"output_index": i, "item": added}),
            );
            self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": i, "delta": item["arguments"]}),
            );
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": i, "arguments": item["arguments"]}),
            );
            self.event(
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            );
            items.push(item);
        }
        response["status"] = json!("completed");
        response["output"] = json!(items);
        response["usage"] = zero_usage();
        self.event("response.completed", json!({"response": response}));
        self.completed = Some(response);
    }
}

/// A Responses API response object, in progress, with no output yet.
fn response_object(model: &str) -> serde_json::Value {
    json!({
        "id": random_id("resp_", 48),
        "object": "response",
        "created_at": unix_now(),
        "status": "in_progress",
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": [],
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": null,
        "user": null,
        "metadata": {},
    })
}

fn zero_usage() -> serde_json::Value {
    json!({"input_tokens": 0, "input_tokens_details": {"cached_tokens": 0},
           "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0})
}

// ---------------------------------------------------------------------------------------
// Answers loopwarden writes.

/// A trailing `developer` message item; a plain string `input` becomes a list (the
/// user message it was, then the reminder).
pub(super) fn append_reminder(body: &[u8], text: &str) -> Result<Vec<u8>, ParseError> {
    let object = TopLevel::scan(Dialect::OpenAiResponses, body)?;
    let top = TopLevel {
        dialect: Dialect::OpenAiResponses,
        object: &object,
    };
    let input = top.raw("input").ok_or(ParseError::EmptyHistory("input"))?;
    let reminder = json!({"type": "message", "role": "developer",
                          "content": [{"type": "input_text", "text": text}]});
    if input.starts_with('"') {
        let list = format!(
            r#"[{{"type":"message","role":"user","content":[{{"type":"input_text","text":{input}}}]}},{reminder}]"#
        );
        return Ok(replace_span(body, span_of(body, input)?, &list));
    }
    push_into_array(body, input, &reminder.to_string())
}

pub(super) fn halt_stream(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    let mut writer = HaltWriter {
        out: Vec::new(),
        seq: 0,
        completed: None,
    };
    let base = response_object(model);
    writer.event("response.created", json!({"response": base}));
    writer.event("response.in_progress", json!({"response": base}));
    writer.answer(base, Vec::new(), 0, text, call);
    writer.out
}

pub(super) fn halt_json(model: &str, text: &str, call: Option<&HaltToolCall>) -> Vec<u8> {
    // The same answer as the stream's final `response.completed` object.
    let mut writer = HaltWriter {
        out: Vec::new(),
        seq: 0,
        completed: None,
    };
    writer.answer(response_object(model), Vec::new(), 0, text, call);
    writer
        .completed
        .take()
        .unwrap_or_default()
        .to_string()
        .into_bytes()
}

/// The Responses API over a WebSocket (`GET /v1/responses` upgraded; Codex's default
/// transport). The client sends `response.create` frames: a Responses request body with a
/// `type`, whose `input` holds only the items new since the response `previous_response_id`
/// names (that response's request and output being the rest of the history), and
/// `generate: false` for a prewarm that only loads the context. The server answers each
/// with the events a streamed Responses answer has, one JSON text frame each.
pub mod socket {
    use serde::Deserialize;
    use serde_json::value::RawValue;
    use serde_json::{json, Map, Value};

    use super::super::framing::{write_sse, SseFramer};

    /// A request that may continue an earlier response: a `response.create` frame, or a
    /// Responses request body over HTTP.
    #[derive(Debug)]
    pub struct Create {
        /// The request's fields but `type`, `previous_response_id`, `generate` and `input`.
        fields: Map<String, Value>,
        pub previous_response_id: Option<String>,
        /// `generate: false`: a prewarm, which asks for no answer.
        pub prewarm: bool,
        /// The request's own input items (a plain string input as the user message it is).
        pub input: Vec<Box<RawValue>>,
        /// A frame (which streams, and is typed), not an HTTP body.
        frame: bool,
    }

    /// The `response.create` frame `text` is, or `None` for any other frame (left to pass).
    pub fn read_create(text: &str) -> Option<Create> {
        let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(text) else {
            return None;
        };
        if fields.get("type").and_then(Value::as_str) != Some("response.create") {
            return None;
        }
        fields.remove("type");
        Some(read_fields(fields, true))
    }

    /// A Responses request body over HTTP, read as [`read_create`] reads a frame.
    pub fn read_request(body: &[u8]) -> Option<Create> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(fields)) => Some(read_fields(fields, false)),
            _ => None,
        }
    }

    fn read_fields(mut fields: Map<String, Value>, frame: bool) -> Create {
        let previous_response_id = match fields.remove("previous_response_id") {
            Some(Value::String(id)) => Some(id),
            _ => None,
        };
        let prewarm = fields.remove("generate") == Some(Value::Bool(false));
        let input = match fields.remove("input") {
            Some(Value::Array(items)) => items.iter().filter_map(raw).collect(),
            Some(Value::String(text)) => raw(&user_message(&text)).into_iter().collect(),
            _ => Vec::new(),
        };
        Create {
            fields,
            previous_response_id,
            prewarm,
            input,
            frame,
        }
    }

    fn raw(value: &Value) -> Option<Box<RawValue>> {
        RawValue::from_string(value.to_string()).ok()
    }

    fn user_message(text: &str) -> Value {
        json!({"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": text}]})
    }

    impl Create {
        /// Whether the API keeps its answer (`store`, true unless said otherwise), so that
        /// a later request may continue it by id.
        pub fn stored(&self) -> bool {
            self.fields.get("store") != Some(&Value::Bool(false))
        }

        /// The HTTP request body the request stands for: its fields (a frame's streamed),
        /// with `history` (the items of the response it continues) before its own input,
        /// and continuing no response.
        pub fn http_body(&self, history: &[&RawValue]) -> Vec<u8> {
            let mut body = self.fields.clone();
            if self.frame {
                body.insert("stream".into(), Value::Bool(true));
            }
            let mut input: Vec<Value> = Vec::with_capacity(history.len() + self.input.len());
            for item in history
                .iter()
                .copied()
                .chain(self.input.iter().map(|i| &**i))
            {
                input.push(serde_json::from_str(item.get()).unwrap_or(Value::Null));
            }
            body.insert("input".into(), Value::Array(input));
            Value::Object(body).to_string().into_bytes()
        }

        /// The request to send for a rewritten request body (`body`, from
        /// [`Create::http_body`] with `history` before this request's input): when the
        /// rewrite only added items after the history, this request with them after its own
        /// input, continuing the same response; otherwise (or when `whole`) the rewritten
        /// history whole, continuing none. `None`: `body` is not a request body.
        pub fn rewritten(&self, history_len: usize, body: &[u8], whole: bool) -> Option<String> {
            let Ok(Value::Object(mut rewritten)) = serde_json::from_slice::<Value>(body) else {
                return None;
            };
            let Some(Value::Array(items)) = rewritten.remove("input") else {
                return None;
            };
            let known = history_len + self.input.len();
            let own: Vec<Value> = self
                .input
                .iter()
                .map(|i| serde_json::from_str(i.get()).unwrap_or(Value::Null))
                .collect();
            let appended = !whole && items.len() >= known && items[history_len..known] == own[..];
            let mut frame = Map::new();
            if self.frame {
                frame.insert("type".into(), json!("response.create"));
            }
            if appended {
                frame.extend(self.fields.clone());
                if let Some(id) = &self.previous_response_id {
                    frame.insert("previous_response_id".into(), json!(id));
                }
                let mut input = own;
                input.extend(items.into_iter().skip(known));
                frame.insert("input".into(), Value::Array(input));
            } else {
                frame.extend(rewritten);
                frame.insert("input".into(), Value::Array(items));
            }
            Some(Value::Object(frame).to_string())
        }

        /// The frame resending `history` and its own input whole, continuing no response:
        /// for a frame that continues an answer the upstream never gave (a halt's).
        pub fn whole(&self, history: &[&RawValue]) -> String {
            let body = self.http_body(history);
            let mut frame = Map::new();
            frame.insert("type".into(), json!("response.create"));
            if let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&body) {
                frame.extend(fields);
            }
            Value::Object(frame).to_string()
        }
    }

    /// What an event frame from the server means for the history.
    #[derive(Debug)]
    pub enum Event {
        /// An output item finished (`response.output_item.done`).
        ItemDone(Box<RawValue>),
        /// The answer ended (`response.completed`, `.incomplete`, `.failed`, or `error`):
        /// its id, and the output items its final object lists.
        Ended {
            response_id: Option<String>,
            output: Vec<Box<RawValue>>,
        },
        Other,
    }

    #[derive(Deserialize)]
    struct Frame<'a> {
        #[serde(borrow, rename = "type")]
        kind: std::borrow::Cow<'a, str>,
        #[serde(borrow, default)]
        item: Option<&'a RawValue>,
        #[serde(default)]
        response: Option<Ended>,
    }

    #[derive(Deserialize)]
    struct Ended {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        output: Vec<Box<RawValue>>,
    }

    /// The event a server frame is, and its type (empty when it is not an event).
    pub fn read_event(text: &str) -> (String, Event) {
        let Ok(frame) = serde_json::from_str::<Frame>(text) else {
            return (String::new(), Event::Other);
        };
        let event = match frame.kind.as_ref() {
            "response.output_item.done" => match frame.item {
                Some(item) => Event::ItemDone(item.to_owned()),
                None => Event::Other,
            },
            "response.completed" | "response.incomplete" | "response.failed" | "error" => {
                let (response_id, output) =
                    frame.response.map(|r| (r.id, r.output)).unwrap_or_default();
                Event::Ended {
                    response_id,
                    output,
                }
            }
            _ => Event::Other,
        };
        (frame.kind.into_owned(), event)
    }

    /// The id and output items of a whole Responses answer over HTTP: an event stream (its
    /// `chunks` as they came) or one JSON object. `None`: it names no id.
    pub fn answer_of(
        event_stream: bool,
        chunks: &[bytes::Bytes],
    ) -> Option<(String, Vec<Box<RawValue>>)> {
        if !event_stream {
            let whole = chunks.concat();
            let ended: Ended = serde_json::from_slice(&whole).ok()?;
            return Some((ended.id?, ended.output));
        }
        let mut framer = SseFramer::default();
        let mut frames = Vec::new();
        for chunk in chunks {
            framer.feed(chunk, &mut frames);
        }
        framer.flush(&mut frames);
        let mut items = Vec::new();
        for frame in frames {
            match read_event(&frame.data).1 {
                Event::ItemDone(item) => items.push(item),
                Event::Ended {
                    response_id,
                    output,
                } => {
                    if items.is_empty() {
                        items = output;
                    }
                    return Some((response_id?, items));
                }
                Event::Other => {}
            }
        }
        None
    }

    /// The HTTP status an `error` frame reports (`status`, or `status_code`), as a server
    /// wraps an HTTP error on a socket.
    pub fn error_status(text: &str) -> Option<u16> {
        #[derive(Deserialize)]
        struct Error {
            #[serde(default, alias = "status_code")]
            status: Option<u16>,
        }
        serde_json::from_str::<Error>(text).ok()?.status
    }

    /// A server frame as the SSE event it would be over HTTP: what the stream decoder
    /// (and so the log) reads.
    pub fn as_sse(kind: &str, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len() + kind.len() + 16);
        write_sse(&mut out, Some(kind), text, "\n");
        out
    }

    /// The events of a streamed answer (a halt's) as the frames the socket carries: each
    /// event's data.
    pub fn frames_of_sse(body: &[u8]) -> Vec<String> {
        let mut framer = SseFramer::default();
        let mut frames = Vec::new();
        framer.feed(body, &mut frames);
        framer.flush(&mut frames);
        frames
            .into_iter()
            .map(|f| f.data)
            .filter(|d| !d.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::dialect::generated;

    /// Output items of every kind an answer holds (messages with text parts, function and
    /// custom tool calls, reasoning), and odd ones the one-pass reading refuses (a name
    /// that is a number, a bare string).
    fn item() -> impl Strategy<Value = serde_json::Value> {
        let text = generated::TEXT;
        prop_oneof![
            text.prop_map(|t| json!({"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": t, "annotations": []}]})),
            (text, text).prop_map(
                |(name, cmd)| json!({"type": "function_call", "call_id": "c1",
                "name": name, "arguments": json!({"cmd": cmd}).to_string()})
            ),
            text.prop_map(|t| json!({"type": "custom_tool_call", "call_id": "c2",
                "name": "apply_patch", "input": t})),
            Just(json!({"type": "reasoning", "summary": []})),
            Just(json!({"type": "function_call", "name": 5})),
            Just(json!("a bare string")),
        ]
    }

    /// Input items as Codex sends them: messages with text parts, calls, and their outputs
    /// as a string, as parts, or as other JSON (kept as its text); and odd ones (a part
    /// whose text is a number, a name that is a number).
    fn input_item() -> impl Strategy<Value = serde_json::Value> {
        let text = generated::TEXT;
        let output = prop_oneof![
            text.prop_map(serde_json::Value::from),
            text.prop_map(|t| json!([{"type": "input_text", "text": t}, {"type": "input_image"}])),
            Just(json!([{"type": "input_text", "text": 5}])),
            Just(json!({"exit_code": 1, "stdout": "x"})),
            Just(json!(42)),
            Just(serde_json::Value::Null),
        ];
        prop_oneof![
            (
                text,
                prop_oneof![Just("user"), Just("developer"), Just("assistant")]
            )
                .prop_map(|(t, role)| json!({"type": "message", "role": role,
                                   "content": [{"type": "input_text", "text": t}]})),
            text.prop_map(|t| json!({"role": "user", "content": t})),
            Just(json!({"role": "user", "content": [{"type": "input_text", "text": 5}]})),
            output.prop_map(
                |o| json!({"type": "function_call_output", "call_id": "c1", "output": o})
            ),
            // A bare string is a user message's short form, read before either reading.
            item().prop_filter("an object", |item| item.is_object()),
        ]
    }

    mod socket_frames {
        use super::super::socket::*;
        use serde_json::{json, Value};

        fn frame(input: Value) -> Create {
            let text = json!({"type": "response.create", "model": "m", "stream": true,
                "previous_response_id": "resp_1", "input": input})
            .to_string();
            read_create(&text).unwrap()
        }

        #[test]
        fn a_frame_reads_as_the_request_it_stands_for() {
            let create =
                frame(json!([{"type": "function_call_output", "call_id": "c", "output": "x"}]));
            assert_eq!(create.previous_response_id.as_deref(), Some("resp_1"));
            let earlier = serde_json::value::RawValue::from_string(
                r#"{"type":"message","role":"user","content":"task"}"#.into(),
            )
            .unwrap();
            let body: Value = serde_json::from_slice(&create.http_body(&[&earlier])).unwrap();
            assert_eq!(body["input"][0]["content"], "task");
            assert_eq!(body["input"][1]["call_id"], "c");
            assert_eq!(body["stream"], true);
            assert!(body.get("type").is_none() && body.get("previous_response_id").is_none());
            assert!(read_create(r#"{"type":"response.processed","response_id":"r"}"#).is_none());
            let prewarm =
                read_create(r#"{"type":"response.create","generate":false,"input":"hi"}"#).unwrap();
            assert!(prewarm.prewarm);
            assert_eq!(prewarm.input.len(), 1, "a string input is one user message");
        }

        #[test]
        fn a_rewrite_that_appends_stays_a_continuation_and_any_other_resends_the_whole() {
            let create =
                frame(json!([{"type": "function_call_output", "call_id": "c", "output": "x"}]));
            let earlier = serde_json::value::RawValue::from_string(
                r#"{"type":"message","role":"user","content":"task"}"#.into(),
            )
            .unwrap();
            let mut body: Value = serde_json::from_slice(&create.http_body(&[&earlier])).unwrap();
            body["input"]
                .as_array_mut()
                .unwrap()
                .push(json!({"role": "developer", "content": "note"}));
            let sent: Value = serde_json::from_str(
                &create
                    .rewritten(1, body.to_string().as_bytes(), false)
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(sent["type"], "response.create");
            assert_eq!(sent["previous_response_id"], "resp_1");
            assert_eq!(sent["input"].as_array().unwrap().len(), 2);
            assert_eq!(sent["input"][1]["content"], "note");
            // Told to resend whole (the answer it continues was never the upstream's).
            let whole: Value = serde_json::from_str(
                &create
                    .rewritten(1, body.to_string().as_bytes(), true)
                    .unwrap(),
            )
            .unwrap();
            assert!(whole.get("previous_response_id").is_none());
            assert_eq!(whole["input"].as_array().unwrap().len(), 3);
            // A rewrite that changed the history (a rollback) is sent whole.
            body["input"].as_array_mut().unwrap().remove(1);
            let changed: Value = serde_json::from_str(
                &create
                    .rewritten(1, body.to_string().as_bytes(), false)
                    .unwrap(),
            )
            .unwrap();
            assert!(changed.get("previous_response_id").is_none());
            assert_eq!(changed["input"].as_array().unwrap().len(), 2);
        }

        #[test]
        fn an_answer_gives_its_id_and_output_items_streamed_or_whole() {
            let json =
                br#"{"id":"resp_9","object":"response","output":[{"type":"message","id":"m"}]}"#;
            let (id, items) = answer_of(false, &[bytes::Bytes::from_static(json)]).unwrap();
            assert_eq!((id.as_str(), items.len()), ("resp_9", 1));
            let sse = "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"function_call\",\"call_id\":\"c\"}}\n\n\
                       event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_8\",\"output\":[]}}\n\n";
            let (half, rest) = sse.as_bytes().split_at(40);
            let chunks = [
                bytes::Bytes::copy_from_slice(half),
                bytes::Bytes::copy_from_slice(rest),
            ];
            let (id, items) = answer_of(true, &chunks).unwrap();
            assert_eq!(id, "resp_8");
            assert_eq!(items.len(), 1, "the streamed items, not the final object's");
            assert!(answer_of(false, &[bytes::Bytes::from_static(b"{}")]).is_none());
        }
    }

    proptest! {
        /// An input item read in one pass gives exactly the items the raw reading (content
        /// and output kept raw, then read) gives.
        #[test]
        fn an_item_reads_the_same_in_one_pass(item in input_item()) {
            let raw = item.to_string();
            let expected = serde_json::from_str::<InputItem<&RawValue>>(&raw)
                .map(item_items)
                .unwrap_or_default();
            prop_assert_eq!(parse_message(&raw), expected);
        }

        /// An answer read in one pass gives the text, calls and usage the raw reading (each
        /// item kept raw, then read on its own) gives.
        #[test]
        fn an_answer_reads_the_same_in_one_pass(
            items in proptest::collection::vec(item(), 0..5),
            tokens in 0u64..1000,
        ) {
            let body = json!({"id": "resp_1", "object": "response", "status": "completed",
                "output": items, "usage": {"input_tokens": tokens, "output_tokens": 3}})
            .to_string();
            let turn = parse_response(body.as_bytes()).unwrap();
            let raw: Response<&RawValue> = serde_json::from_str(&body).unwrap();
            let expected = raw.into_turn(|item| parse_message(item.get()));
            prop_assert_eq!(turn, expected);
        }
    }
}
