//! Wire formats. One module per API; each turns a request body into transcript items,
//! a response (JSON or SSE) into the new assistant turn, appends a reminder to a request,
//! and builds a halt reply in the mode the client asked for.
//!
//! The request side is split in two so that callers can cache per message: [`Dialect::view`]
//! finds the top-level fields and the raw message slices (cheap: no message is parsed),
//! and [`Dialect::parse_message`] turns one raw message into items. A message's items depend
//! only on its bytes, so they can be cached under the hash of those bytes.
//!
//! Everything here reads borrowed structs and [`RawValue`] slices: a body is scanned once,
//! fields we do not need are skipped, and nothing is re-serialized.

mod anthropic;
pub mod compaction;
mod framing;
mod gemini;
mod openai_chat;
mod openai_responses;
mod stream;

pub use openai_responses::socket as responses_socket;
pub use stream::{StreamDecoder, StreamEvent, StreamEventKind};

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::scan;
use crate::transcript::{canonical_args_from_str, Item, ToolCall, Transcript};

/// The four APIs loopwarden understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Gemini,
}

impl Dialect {
    pub const ALL: [Dialect; 4] = [
        Dialect::OpenAiChat,
        Dialect::OpenAiResponses,
        Dialect::Anthropic,
        Dialect::Gemini,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai_chat",
            Dialect::OpenAiResponses => "openai_responses",
            Dialect::Anthropic => "anthropic",
            Dialect::Gemini => "gemini",
        }
    }

    /// Which API a request path speaks, and whether the path itself asks for a stream
    /// (Gemini `:streamGenerateContent`). Any prefix before the API's own path is allowed
    /// (`/c/{id}/v1/messages`, `/openai/v1/responses`) and the query string is ignored.
    /// Paths that carry no conversation (`/v1/messages/count_tokens`, `:countTokens`,
    /// `/v1/models`) are `None`.
    pub fn from_path(path: &str) -> Option<(Dialect, bool)> {
        let path = path.split(['?', '#']).next().unwrap_or("");
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            return Some((Dialect::OpenAiChat, false));
        }
        if path.ends_with("/v1/responses") {
            return Some((Dialect::OpenAiResponses, false));
        }
        if path.ends_with("/v1/messages") {
            return Some((Dialect::Anthropic, false));
        }
        let (_, model_and_method) = path.rsplit_once("/models/")?;
        let (model, method) = model_and_method.rsplit_once(':')?;
        if model.is_empty() || model.contains('/') {
            return None;
        }
        match method {
            "generateContent" => Some((Dialect::Gemini, false)),
            "streamGenerateContent" => Some((Dialect::Gemini, true)),
            _ => None,
        }
    }

    /// The model named in a Gemini path (`…/models/{model}:generateContent`): Gemini
    /// bodies carry no model field.
    pub fn model_from_path(path: &str) -> Option<&str> {
        let path = path.split(['?', '#']).next().unwrap_or("");
        let (_, model_and_method) = path.rsplit_once("/models/")?;
        let (model, _) = model_and_method.rsplit_once(':')?;
        (!model.is_empty() && !model.contains('/')).then_some(model)
    }
}

/// Why a body could not be read as a conversation (the body is then forwarded untouched),
/// or rewritten (the request is then forwarded as it came).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON, or not of the dialect's shape.
    #[error("not a {} request body: {detail}", dialect.as_str())]
    Body { dialect: Dialect, detail: String },
    /// A top-level field of the wrong type.
    #[error("{} request: field {field}: {detail}", dialect.as_str())]
    Field {
        dialect: Dialect,
        field: String,
        detail: String,
    },
    /// The history (the dialect's `messages`, `input` or `contents`) is empty: there is
    /// no message to append a reminder to.
    #[error("no {0} to append a reminder to")]
    EmptyHistory(&'static str),
    /// A splice was asked at a place that is not what it should be (a bug, not the body).
    #[error("internal: {0}")]
    Splice(&'static str),
}

impl ParseError {
    fn json(dialect: Dialect, e: serde_json::Error) -> ParseError {
        ParseError::Body {
            dialect,
            detail: e.to_string(),
        }
    }
}

/// The top-level facts of a request, with its messages left as raw JSON slices.
#[derive(Debug)]
pub struct RequestView<'a> {
    pub model: Option<String>,
    /// The client asked for a streamed answer (`"stream": true`, or Gemini's
    /// `:streamGenerateContent` path, which the caller signals to `view`).
    pub stream: bool,
    /// The raw tool definitions the request offers, if it offers any (a request without
    /// tools is a side call: title, router...). A tool no profile knows is read through them.
    pub tools: Option<&'a str>,
    /// The raw top-level member a preamble is read from (`system`, `instructions`,
    /// `systemInstruction`), if the request has one ([`Dialect::read_preamble`]).
    pub preamble_source: Option<&'a str>,
    /// Each message of the history, raw, in order. Each slice points into the body that
    /// was viewed (OpenAI Responses `input` given as a plain string is one message: the
    /// raw JSON string).
    pub messages: Vec<RawMessage<'a>>,
}

/// One message of a request's history: its raw JSON text, a slice of the body. Only
/// its structure was checked; [`Dialect::parse_message`] reads (and validates) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMessage<'a>(&'a str);

impl<'a> RawMessage<'a> {
    /// A message from its raw JSON text (for callers that hold messages of their own).
    pub fn new(json: &'a str) -> RawMessage<'a> {
        RawMessage(json)
    }

    pub fn get(&self) -> &'a str {
        self.0
    }
}

/// What the model answered in one response.
///
/// The token counts are the answer's own, in its API's terms, `None` where it said nothing:
/// what `input_tokens` includes differs from API to API (cache reads are part of it in
/// OpenAI's and Gemini's, apart in Anthropic's). `crate::budget::Usage::of` is the one place
/// that reads them into common terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponseTurn {
    pub text: String,
    pub calls: Vec<ToolCall>,
    /// `prompt_tokens`, `input_tokens`, `promptTokenCount`.
    pub input_tokens: Option<u64>,
    /// `completion_tokens`, `output_tokens` (reasoning included), `candidatesTokenCount`
    /// (Gemini's thoughts not included: [`ResponseTurn::thought_tokens`]).
    pub output_tokens: Option<u64>,
    /// Input read from the provider's prompt cache: `prompt_tokens_details.cached_tokens`,
    /// `input_tokens_details.cached_tokens`, `cache_read_input_tokens`,
    /// `cachedContentTokenCount`.
    pub cached_input_tokens: Option<u64>,
    /// Input written to the prompt cache (Anthropic's `cache_creation_input_tokens`).
    pub cache_write_tokens: Option<u64>,
    /// Gemini's `thoughtsTokenCount`: billed as output, counted apart from it.
    pub thought_tokens: Option<u64>,
    pub stop_reason: Option<String>,
}

/// OpenAI's `prompt_tokens_details` (Chat) and `input_tokens_details` (Responses).
#[derive(Deserialize, Default)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// Token counts one answer (or one event of a stream) reports; `None`: not said here.
#[derive(Debug, Clone, Copy, Default)]
struct Reported {
    input: Option<u64>,
    output: Option<u64>,
    cached_input: Option<u64>,
    cache_write: Option<u64>,
    thoughts: Option<u64>,
}

impl ResponseTurn {
    /// Takes the counts an answer or a stream event reports; what it does not report keeps
    /// its earlier value (streams spread usage over events: Anthropic's input in
    /// `message_start`, its output in `message_delta`).
    fn report_usage(&mut self, r: Reported) {
        self.input_tokens = r.input.or(self.input_tokens);
        self.output_tokens = r.output.or(self.output_tokens);
        self.cached_input_tokens = r.cached_input.or(self.cached_input_tokens);
        self.cache_write_tokens = r.cache_write.or(self.cache_write_tokens);
        self.thought_tokens = r.thoughts.or(self.thought_tokens);
    }
}

/// How to answer a request loopwarden halts without calling the upstream.
#[derive(Debug, Clone, Default)]
pub struct HaltOptions {
    /// The model to name in the reply (the request's model).
    pub model: Option<String>,
    /// Answer as a stream (SSE). Must be true whenever the request streams: some
    /// clients spin forever on a JSON answer to a streaming request.
    pub stream: bool,
    /// A tool call to make after the text, for agents that reject a text-only reply
    /// (mini-swe-agent: `bash` running its submit command).
    pub tool_call: Option<HaltToolCall>,
}

/// The tool call a halt reply makes.
#[derive(Debug, Clone, PartialEq)]
pub struct HaltToolCall {
    pub name: String,
    /// The call's arguments, a JSON object.
    pub arguments: serde_json::Value,
}

/// A complete reply to send instead of the upstream's.
#[derive(Debug, Clone, PartialEq)]
pub struct HaltReply {
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// Why the proxy answers in place of an upstream it could not get an answer from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamFailure {
    /// Connection refused, DNS, TLS... (HTTP 502).
    Unreachable,
    /// No answer in time (HTTP 504).
    Timeout,
}

impl UpstreamFailure {
    pub fn status(self) -> u16 {
        match self {
            UpstreamFailure::Unreachable => 502,
            UpstreamFailure::Timeout => 504,
        }
    }
}

/// A fully parsed request.
#[derive(Debug)]
pub struct ParsedRequest {
    pub model: Option<String>,
    pub stream: bool,
    pub has_tools: bool,
    pub transcript: Transcript,
}

impl Dialect {
    /// Reads the top level of a request body. `stream_path` is true when the path itself
    /// asks for a stream (Gemini `:streamGenerateContent`).
    pub fn view(self, body: &[u8], stream_path: bool) -> Result<RequestView<'_>, ParseError> {
        self.view_scanned(&self.scan(body)?, stream_path)
    }

    /// The structure of a request body (its top-level members, its history's messages),
    /// found without parsing them, for [`Dialect::view_scanned`].
    pub fn scan(self, body: &[u8]) -> Result<scan::Object<'_>, ParseError> {
        TopLevel::scan(self, body)
    }

    /// [`Dialect::view`] of a body whose structure was already scanned (the proxy scans a
    /// conversation's request after its last one: `proxy::memory`). The view's slices are
    /// the body's, not the scan's.
    pub fn view_scanned<'a>(
        self,
        object: &scan::Object<'a>,
        stream_path: bool,
    ) -> Result<RequestView<'a>, ParseError> {
        let top = TopLevel {
            dialect: self,
            object,
        };
        match self {
            Dialect::OpenAiChat => openai_chat::view(&top),
            Dialect::OpenAiResponses => openai_responses::view(&top),
            Dialect::Anthropic => anthropic::view(&top),
            Dialect::Gemini => gemini::view(&top, stream_path),
        }
    }

    /// The items a request's top-level system member gives (`RequestView::preamble_source`:
    /// `system`, `instructions`, `systemInstruction`); none without one.
    pub fn read_preamble(self, source: Option<&str>) -> Vec<Item> {
        let Some(source) = source else {
            return Vec::new();
        };
        let text = match self {
            // Chat carries its system prompt as a message, never at the top level.
            Dialect::OpenAiChat => return Vec::new(),
            Dialect::OpenAiResponses | Dialect::Anthropic => content_text(Some(source)),
            Dialect::Gemini => gemini::content_text(source),
        };
        system_preamble(text)
    }

    /// The raw bytes of the first `n` messages of a request body, found without reading
    /// the rest of the history (nor checking it) or the members before it: what recognises
    /// a conversation that states no id. A guess ([`scan::first_elements_guessed`]): fine
    /// for finding an earlier request to compare with, not for reading the request. A body
    /// that is not a request of this API gives fewer or none.
    pub fn first_messages(self, body: &[u8], n: usize) -> Vec<&[u8]> {
        scan::first_elements_guessed(body, self.history_key(), n)
            .into_iter()
            .filter_map(|(a, b)| body.get(a..b))
            .collect()
    }

    /// The top-level member that holds the history.
    pub fn history_key(self) -> &'static str {
        match self {
            Dialect::OpenAiChat | Dialect::Anthropic => "messages",
            Dialect::OpenAiResponses => "input",
            Dialect::Gemini => "contents",
        }
    }

    /// Turns one raw message of the history into items. A message that cannot be read
    /// gives no items (the body is still forwarded as it is).
    pub fn parse_message(self, raw: &str) -> Vec<Item> {
        match self {
            Dialect::OpenAiChat => openai_chat::parse_message(raw),
            Dialect::OpenAiResponses => openai_responses::parse_message(raw),
            Dialect::Anthropic => anthropic::parse_message(raw),
            Dialect::Gemini => gemini::parse_message(raw),
        }
    }

    /// Reads a non-streaming answer (a JSON body; for Gemini also the JSON array that
    /// `:streamGenerateContent` without `alt=sse` returns).
    pub fn parse_response(self, body: &[u8]) -> Result<ResponseTurn, ParseError> {
        match self {
            Dialect::OpenAiChat => openai_chat::parse_response(body),
            Dialect::OpenAiResponses => openai_responses::parse_response(body),
            Dialect::Anthropic => anthropic::parse_response(body),
            Dialect::Gemini => gemini::parse_response(body),
        }
    }

    /// A JSON error body in this API's own error shape, so clients show `message`
    /// the way they show the API's errors. Send it with [`UpstreamFailure::status`].
    pub fn error_body(self, message: &str, failure: UpstreamFailure) -> Vec<u8> {
        let body = match self {
            Dialect::OpenAiChat | Dialect::OpenAiResponses => {
                openai_chat::error_body(message, failure)
            }
            Dialect::Anthropic => anthropic::error_body(message, failure),
            Dialect::Gemini => gemini::error_body(message, failure),
        };
        body.to_string().into_bytes()
    }

    /// The request body with `text` appended as a reminder after everything the client
    /// sent, by splicing bytes: the system prompt and earlier messages stay byte for
    /// byte the same, so the provider's prompt cache still matches. Anthropic: a text
    /// block at the end of the last user message; OpenAI Chat: a trailing `system`
    /// message; Responses: a trailing `developer` message; Gemini: a text part at the
    /// end of the last user content.
    pub fn append_reminder(self, body: &[u8], text: &str) -> Result<Vec<u8>, ParseError> {
        match self {
            Dialect::OpenAiChat => openai_chat::append_reminder(body, text),
            Dialect::OpenAiResponses => openai_responses::append_reminder(body, text),
            Dialect::Anthropic => anthropic::append_reminder(body, text),
            Dialect::Gemini => gemini::append_reminder(body, text),
        }
    }

    /// A complete answer saying `text` (and making `opts.tool_call` if any), in the
    /// mode the request asked for: SSE when `opts.stream` (Gemini: `?alt=sse` chunks),
    /// JSON otherwise. Ids look like the API's own; usage is zero.
    pub fn halt_reply(self, opts: &HaltOptions, text: &str) -> HaltReply {
        let model = opts.model.as_deref().unwrap_or("unknown");
        let call = opts.tool_call.as_ref();
        let body = match (self, opts.stream) {
            (Dialect::OpenAiChat, true) => openai_chat::halt_stream(model, text, call),
            (Dialect::OpenAiChat, false) => openai_chat::halt_json(model, text, call),
            (Dialect::OpenAiResponses, true) => openai_responses::halt_stream(model, text, call),
            (Dialect::OpenAiResponses, false) => openai_responses::halt_json(model, text, call),
            (Dialect::Anthropic, true) => anthropic::halt_stream(model, text, call),
            (Dialect::Anthropic, false) => anthropic::halt_json(model, text, call),
            (Dialect::Gemini, true) => gemini::halt_stream(model, text, call),
            (Dialect::Gemini, false) => gemini::halt_json(model, text, call),
        };
        HaltReply {
            content_type: if opts.stream {
                SSE_CONTENT_TYPE
            } else {
                "application/json"
            },
            body,
        }
    }

    /// `view` + `parse_message` for every message, with no cache.
    pub fn parse_request(
        self,
        body: &[u8],
        stream_path: bool,
    ) -> Result<ParsedRequest, ParseError> {
        let view = self.view(body, stream_path)?;
        let mut items = self.read_preamble(view.preamble_source);
        for raw in &view.messages {
            items.extend(self.parse_message(raw.get()));
        }
        Ok(ParsedRequest {
            model: view.model,
            stream: view.stream,
            has_tools: view.tools.is_some(),
            transcript: Transcript::from_items(items),
        })
    }
}

// ---------------------------------------------------------------------------------------
// Helpers shared by the wire modules: how text, arguments and tool lists are read.

/// The top level of a request body: its members found by the scanner, the few we read
/// parsed with serde.
struct TopLevel<'t, 'a> {
    dialect: Dialect,
    object: &'t scan::Object<'a>,
}

impl<'a> TopLevel<'_, 'a> {
    /// The structure of `body`, read from its start.
    fn scan(dialect: Dialect, body: &'a [u8]) -> Result<scan::Object<'a>, ParseError> {
        let body_error = |detail: String| ParseError::Body { dialect, detail };
        let text = scan::utf8(body).map_err(|e| body_error(e.to_string()))?;
        scan::Object::parse(text).map_err(|e| body_error(e.0.to_string()))
    }

    /// A member's raw JSON.
    fn raw(&self, key: &str) -> Option<&'a str> {
        self.object.get(key)
    }

    /// A small member parsed (`model`, `stream`); absent and `null` are `None`.
    fn field<T: Deserialize<'a>>(&self, key: &str) -> Result<Option<T>, ParseError> {
        match self.raw(key) {
            Some(raw) => serde_json::from_str(raw).map_err(|e| ParseError::Field {
                dialect: self.dialect,
                field: key.to_string(),
                detail: e.to_string(),
            }),
            None => Ok(None),
        }
    }

    /// The history: a required array member, split into raw messages.
    fn messages(&self) -> Result<Vec<RawMessage<'a>>, ParseError> {
        let key = self.dialect.history_key();
        let elements = self.object.elements(key).ok_or_else(|| ParseError::Body {
            dialect: self.dialect,
            detail: format!("no {key} array"),
        })?;
        Ok(elements.map(RawMessage).collect())
    }
}

/// A `content` member read in the same pass as the message that holds it: a string, a
/// list of parts or blocks (`P`), or anything else (nothing detection reads: `null`, an
/// object). Keeping the member raw and parsing it again scanned every byte of an answer
/// several times (BENCHMARKS.md, "What was tried"). A part that does not read as `P` fails the
/// whole reading; callers then read the message the raw way, which skips such parts one by
/// one ([`content_text`]).
enum Content<'a, P> {
    Text(Cow<'a, str>),
    Parts(Vec<P>),
    Other,
}

impl<'de: 'a, 'a, P: Deserialize<'de>> Deserialize<'de> for Content<'a, P> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};

        struct ContentVisitor<'a, P>(std::marker::PhantomData<(Cow<'a, str>, P)>);

        impl<'de: 'a, 'a, P: Deserialize<'de>> Visitor<'de> for ContentVisitor<'a, P> {
            type Value = Content<'a, P>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("message content")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(part) = seq.next_element()? {
                    parts.push(part);
                }
                Ok(Content::Parts(parts))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Other)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Content::Other)
            }
        }

        d.deserialize_any(ContentVisitor(std::marker::PhantomData))
    }
}

/// A content part of any of the APIs, reduced to what text extraction needs. Parts
/// without a string `text` (images, thinking, tool blocks) contribute nothing.
#[derive(Deserialize)]
struct TextPart<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

/// The text of a content member, however it was read: in one pass ([`Content`]) or kept
/// raw. Both give what [`content_text`] gives for the member's JSON.
trait ContentText: Sized {
    fn text(self) -> String;

    /// A tool call's output (OpenAI Responses): text or parts as [`ContentText::text`];
    /// anything else is its JSON, which only the raw reading has (a reading in one pass
    /// that meets such an output reads the item again raw).
    fn output_text(self) -> String {
        self.text()
    }
}

impl ContentText for &RawValue {
    fn text(self) -> String {
        content_text(Some(self.get()))
    }

    fn output_text(self) -> String {
        if self.get().starts_with(['"', '[']) {
            self.text()
        } else {
            value_text(self)
        }
    }
}

impl ContentText for Content<'_, TextPart<'_>> {
    fn text(self) -> String {
        match self {
            Content::Text(text) => text.into_owned(),
            Content::Parts(parts) => parts_text(parts),
            Content::Other => String::new(),
        }
    }
}

/// The text of a content field: a string, a list of parts (`text`, `input_text`,
/// `output_text` blocks) joined with newlines, or nothing. Parts that are not text are
/// skipped one by one, so one odd part does not lose the rest.
fn content_text(raw: Option<&str>) -> String {
    let Some(s) = raw else {
        return String::new();
    };
    match s.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<Cow<str>>(s)
            .map(Cow::into_owned)
            .unwrap_or_default(),
        Some(b'[') => {
            let parts: Vec<&RawValue> = serde_json::from_str(s).unwrap_or_default();
            parts_text(
                parts
                    .into_iter()
                    .filter_map(|part| serde_json::from_str::<TextPart>(part.get()).ok()),
            )
        }
        _ => String::new(),
    }
}

/// The texts of a list of content parts, one line each.
fn parts_text<'a>(parts: impl IntoIterator<Item = TextPart<'a>>) -> String {
    let mut out = String::new();
    for text in parts.into_iter().filter_map(|part| part.text) {
        push_line(&mut out, &text);
    }
    out
}

/// A JSON value read as result text: a string is its content, anything else its JSON.
fn value_text(raw: &RawValue) -> String {
    let s = raw.get();
    if s.starts_with('"') {
        if let Ok(text) = serde_json::from_str::<Cow<str>>(s) {
            return text.into_owned();
        }
    }
    s.to_string()
}

/// The preamble a top-level system text (`system`, `instructions`, `systemInstruction`)
/// gives: one system item, or none when it is empty.
fn system_preamble(text: String) -> Vec<Item> {
    if text.is_empty() {
        Vec::new()
    } else {
        vec![Item::System { text }]
    }
}

/// Appends `text` as a new line of `out` (no leading newline on the first one).
fn push_line(out: &mut String, text: &str) {
    if text.is_empty() {
        return;
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(text);
}

/// Canonical arguments from an OpenAI-style `arguments` string. An empty string means
/// no arguments, the same as `{}`.
fn args_from_text(text: &str) -> serde_json::Value {
    if text.trim().is_empty() {
        return serde_json::Value::Object(Default::default());
    }
    canonical_args_from_str(text)
}

/// Canonical arguments from an inline JSON value (Anthropic `input`, Gemini `args`).
fn args_from_raw(raw: Option<&RawValue>) -> serde_json::Value {
    match raw {
        Some(raw) if raw.get() != "null" => canonical_args_from_str(raw.get()),
        _ => serde_json::Value::Object(Default::default()),
    }
}

/// A `tools` field's raw JSON when it offers at least one tool (absent, `null` and `[]`
/// do not).
fn offered_tools(raw: Option<&str>) -> Option<&str> {
    raw.filter(|s| *s != "null" && s.trim_start_matches('[').trim_start() != "]")
}

/// A random id of the kind the APIs mint (`msg_…`, `chatcmpl-…`, `toolu_…`): letters and
/// digits after the prefix.
fn random_id(prefix: &str, len: usize) -> String {
    let mut id = String::with_capacity(prefix.len() + len);
    id.push_str(prefix);
    id.extend(std::iter::repeat_with(fastrand::alphanumeric).take(len));
    id
}

/// Seconds since the epoch, for the `created` fields of replies we make.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The content type of every stream we write.
pub const SSE_CONTENT_TYPE: &str = "text/event-stream; charset=utf-8";

// ---------------------------------------------------------------------------------------
// Splicing: edits at the positions of borrowed slices, so the rest of a body keeps its
// exact bytes.

/// Where `part` (a slice borrowed from `body`) lies in `body`.
fn span_of(body: &[u8], part: &str) -> Result<std::ops::Range<usize>, ParseError> {
    let start = (part.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
    let end = start.wrapping_add(part.len());
    if start <= body.len() && end <= body.len() && start <= end {
        Ok(start..end)
    } else {
        Err(ParseError::Splice("slice is not part of the body"))
    }
}

/// `body` with the bytes of `span` replaced by `with`.
fn replace_span(body: &[u8], span: std::ops::Range<usize>, with: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + with.len());
    out.extend_from_slice(&body[..span.start]);
    out.extend_from_slice(with.as_bytes());
    out.extend_from_slice(&body[span.end..]);
    out
}

/// `body` with `insert` right after `part` (a slice of it).
fn insert_after(body: &[u8], part: &str, insert: &str) -> Result<Vec<u8>, ParseError> {
    let end = span_of(body, part)?.end;
    Ok(replace_span(body, end..end, insert))
}

/// `body` with `element` added as the last element of `array` (a JSON array slice of it).
fn push_into_array(body: &[u8], array: &str, element: &str) -> Result<Vec<u8>, ParseError> {
    let span = span_of(body, array)?;
    let inner = array
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .ok_or(ParseError::Splice("expected a JSON array"))?;
    // Right after the last element (before any whitespace), so the bytes that follow
    // it stay as they were.
    let last_element_end = span.start + 1 + inner.trim_end().len();
    let insert = if inner.trim().is_empty() {
        element.to_string()
    } else {
        format!(",{element}")
    };
    Ok(replace_span(
        body,
        last_element_end..last_element_end,
        &insert,
    ))
}

/// An answer's JSON read as `T`. From bytes, serde_json checks the UTF-8 of each string it
/// reads, a byte at a time (~2.5 k of the 20 k instructions of the bench's 0.5 KB answer);
/// checked whole first ([`utf8`]) and read as text, the answer costs less. One that is not
/// all UTF-8 is read from its bytes as before: serde_json checks only the strings it reads.
fn answer_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> serde_json::Result<T> {
    match scan::utf8(body) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(body),
    }
}

/// What the dialects' proptests generate alike.
#[cfg(test)]
mod generated {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    /// Short text with what JSON escapes (quotes, backslashes, newlines) and text other
    /// than ASCII.
    pub const TEXT: &str = "[a-z \"\\\\\n\u{e9}]{0,12}";

    /// A call's arguments or a tool's input: `null`, empty, a string, or an object holding
    /// a string, a number and an array.
    pub fn args() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            Just(json!({})),
            TEXT.prop_map(Value::from),
            (TEXT, 0i64..99).prop_map(|(t, n)| json!({"path": t, "line": n, "flags": [n, null]})),
        ]
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    /// An answer is read as text when it is all UTF-8, and from its bytes otherwise: bytes
    /// that are not UTF-8 in a field detection does not read lose nothing, in any API.
    #[test]
    fn an_answer_with_bytes_that_are_not_utf8_where_nothing_is_read_still_reads() {
        let answers: [(Dialect, &str); 4] = [
            (
                Dialect::Anthropic,
                r#"{"id":"BAD","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn"}"#,
            ),
            (
                Dialect::OpenAiChat,
                r#"{"id":"BAD","choices":[{"message":{"role":"assistant","content":"hi"}}]}"#,
            ),
            (
                Dialect::OpenAiResponses,
                r#"{"id":"BAD","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]}"#,
            ),
            (
                Dialect::Gemini,
                r#"{"responseId":"BAD","candidates":[{"content":{"role":"model","parts":[{"text":"hi"}]}}]}"#,
            ),
        ];
        for (dialect, answer) in answers {
            let (head, tail) = answer.split_once("BAD").unwrap();
            let body = [head.as_bytes(), &[0xff, 0xfe], tail.as_bytes()].concat();
            assert!(std::str::from_utf8(&body).is_err());
            let turn = dialect.parse_response(&body).unwrap();
            assert_eq!(turn.text, "hi", "{dialect:?}");
            assert_eq!(dialect.parse_response(answer.as_bytes()).unwrap(), turn);
        }
    }

    proptest::proptest! {
        /// The UTF-8 check accepts exactly what std's does, with std's error: text of any
        /// script, cut anywhere (a character's bytes split), one byte overwritten, across
        /// the vector check's 16- and 32-byte blocks.
        #[test]
        fn the_utf8_check_is_std_s(
            text in "\\PC{0,200}",
            cut in 0usize..1000,
            at in 0usize..1000,
            byte in proptest::num::u8::ANY,
        ) {
            let mut bytes = text.into_bytes();
            bytes.truncate(cut % (bytes.len() + 1));
            if !bytes.is_empty() && at % 2 == 0 {
                let i = at % bytes.len();
                bytes[i] = byte;
            }
            proptest::prop_assert_eq!(scan::utf8(&bytes), std::str::from_utf8(&bytes));
        }
    }
}
