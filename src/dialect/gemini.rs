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
    answer_json, args_from_raw, insert_after, offered_tools, push_into_array, random_id,
    value_text, Dialect, HaltToolCall, ParseError, Reported, RequestView, ResponseTurn,
    StreamEventKind, TopLevel, UpstreamFailure,
};
use crate::transcript::{Item, ToolCall, ToolResult};

pub(super) fn view<'a>(
    top: &TopLevel<'_, 'a>,
    stream_path: bool,
) -> Result<RequestView<'a>, ParseError> {
    let system = top
        .raw("systemInstruction")
        .or_else(|| top.raw("system_instruction"));
    Ok(RequestView {
        model: top.field("model")?,
        stream: stream_path,
        tools: offered_tools(top.raw("tools")),
        preamble_source: system,
        messages: top.messages()?,
    })
}

/// A content object, its parts read in the same pass (`P`: [`Part`]), or kept raw
/// (`&RawValue`) for an object with a part that does not read as one: those are then read
/// one by one and odd ones skipped ([`Content::read_parts`]). Keeping every part raw and
/// parsing it again scanned an answer's bytes twice more (BENCHMARKS.md, "What was tried").
#[derive(Deserialize)]
#[serde(bound(deserialize = "'de: 'a, P: Deserialize<'de>"))]
struct Content<'a, P = Part<'a>> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(default = "Vec::new")]
    parts: Vec<P>,
}

impl<'a> Content<'a, &'a RawValue> {
    /// The parts that read as parts, the others skipped.
    fn read_parts(self) -> Content<'a> {
        Content {
            role: self.role,
            parts: self
                .parts
                .into_iter()
                .filter_map(|raw| serde_json::from_str(raw.get()).ok())
                .collect(),
        }
    }
}

/// A history content object's role, and what its parts hold: read in one pass when every
/// part reads as a part and every function response's result as text ([`TextResponse`],
/// Gemini CLI's); else with the results raw; else part by part, odd parts skipped.
fn read_content(raw: &str) -> Result<(Option<Cow<'_, str>>, ReadParts), serde_json::Error> {
    if let Ok(content) = serde_json::from_str::<Content<Part<TextResponse>>>(raw) {
        if content.parts.iter().all(Part::result_read) {
            return Ok((content.role, read_parts(content.parts)));
        }
    }
    let content = serde_json::from_str::<Content>(raw)
        .or_else(|_| serde_json::from_str::<Content<&RawValue>>(raw).map(Content::read_parts))?;
    Ok((content.role, read_parts(content.parts)))
}

/// One part. A function response's result (`R`) is kept raw, or read in the same pass as
/// text ([`TextResponse`]) when reading a history message ([`read_content`]).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "'de: 'a, R: Deserialize<'de>"))]
struct Part<'a, R = &'a RawValue> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    thought: Option<bool>,
    #[serde(borrow, default)]
    function_call: Option<FunctionCall<'a>>,
    #[serde(default = "Option::default")]
    function_response: Option<FunctionResponse<R>>,
}

impl<R: FunctionResult> Part<'_, R> {
    /// Whether its function response's result, if any, was read.
    fn result_read(&self) -> bool {
        self.function_response
            .as_ref()
            .and_then(|f| f.response.as_ref())
            .is_none_or(FunctionResult::is_read)
    }
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
#[serde(bound(deserialize = "R: Deserialize<'de>"))]
struct FunctionResponse<R> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default = "Option::default")]
    response: Option<R>,
}

/// A function response's result: its text, and whether it is an error.
trait FunctionResult {
    fn result(self) -> (String, Option<bool>);

    /// Whether [`FunctionResult::result`] says what the response says: a result read as
    /// text has nothing to say of one that holds neither `output` nor `error` (its JSON is
    /// its text), and the content is then read with its results raw.
    fn is_read(&self) -> bool {
        true
    }
}

/// A function response whose result is text, as Gemini CLI sends it: `output` or `error` a
/// string, read in one pass. Any other response is read raw ([`FunctionResult`] for
/// `&RawValue`).
#[derive(Deserialize)]
struct TextResponse<'a> {
    #[serde(borrow, default)]
    output: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    error: Option<Cow<'a, str>>,
}

impl FunctionResult for TextResponse<'_> {
    fn result(self) -> (String, Option<bool>) {
        match (self.error, self.output) {
            (Some(e), _) => (e.into_owned(), Some(true)),
            (None, Some(o)) => (o.into_owned(), None),
            (None, None) => (String::new(), None),
        }
    }

    fn is_read(&self) -> bool {
        self.error.is_some() || self.output.is_some()
    }
}

impl FunctionResult for &RawValue {
    fn result(self) -> (String, Option<bool>) {
        if !self.get().starts_with('{') {
            return (value_text(self), None);
        }
        match serde_json::from_str::<ResponseBody>(self.get()) {
            Ok(ResponseBody { error: Some(e), .. }) if e.get() != "null" => {
                (value_text(e), Some(true))
            }
            Ok(ResponseBody {
                output: Some(o), ..
            }) => (value_text(o), None),
            _ => (self.get().to_string(), None),
        }
    }
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
pub(super) fn content_text(raw: &str) -> String {
    if raw.starts_with('"') {
        return serde_json::from_str::<Cow<str>>(raw)
            .map(Cow::into_owned)
            .unwrap_or_default();
    }
    match read_content(raw) {
        Ok((_, read)) => read.texts.join("\n"),
        Err(_) => String::new(),
    }
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    match read_content(raw) {
        Ok((role, read)) => content_items(role.as_deref(), read),
        Err(_) => Vec::new(),
    }
}

/// The transcript items of a content object with `role`, whose parts held `read`.
fn content_items(role: Option<&str>, read: ReadParts) -> Vec<Item> {
    let text = read.texts.join("\n");
    match role.unwrap_or("user") {
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

fn read_parts<R: FunctionResult>(parts: Vec<Part<R>>) -> ReadParts {
    let mut read = ReadParts::default();
    for part in parts {
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

fn result_of<R: FunctionResult>(resp: FunctionResponse<R>) -> ToolResult {
    let (text, is_error) = resp
        .response
        .map_or((String::new(), None), FunctionResult::result);
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

/// One response object; `P` as in [`Content`].
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "'de: 'a, P: Deserialize<'de>"))]
struct Response<'a, P = Part<'a>> {
    #[serde(default = "Vec::new")]
    candidates: Vec<Candidate<'a, P>>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    model_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[serde(bound(deserialize = "'de: 'a, P: Deserialize<'de>"))]
struct Candidate<'a, P = Part<'a>> {
    #[serde(default = "Option::default")]
    content: Option<Content<'a, P>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

impl<'a> Response<'a, &'a RawValue> {
    /// The parts that read as parts, the others skipped ([`Content::read_parts`]).
    fn read_parts(self) -> Response<'a> {
        Response {
            candidates: self
                .candidates
                .into_iter()
                .map(|c| Candidate {
                    content: c.content.map(Content::read_parts),
                    finish_reason: c.finish_reason,
                })
                .collect(),
            usage_metadata: self.usage_metadata,
            model_version: self.model_version,
        }
    }
}

/// One response object ([`Response`]): in one pass when every part reads as a part.
fn read_response(json: &[u8]) -> Result<Response<'_>, serde_json::Error> {
    answer_json::<Response>(json)
        .or_else(|_| answer_json::<Response<&RawValue>>(json).map(Response::read_parts))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
}

impl UsageMetadata {
    fn reported(self) -> Reported {
        Reported {
            input: self.prompt_token_count,
            output: self.candidates_token_count,
            cached_input: self.cached_content_token_count,
            cache_write: None,
            thoughts: self.thoughts_token_count,
        }
    }
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
            let read = read_parts(content.parts);
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
    // Each streamed object repeats the counts so far; the last one's are the answer's.
    if let Some(usage) = resp.usage_metadata {
        turn.report_usage(usage.reported());
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
        let all = match answer_json::<Vec<Response>>(body) {
            Ok(all) => all,
            Err(_) => answer_json::<Vec<Response<&RawValue>>>(body)
                .map_err(err)?
                .into_iter()
                .map(Response::read_parts)
                .collect(),
        };
        for resp in all {
            add_response(&mut turn, resp);
        }
    } else {
        add_response(&mut turn, read_response(body).map_err(err)?);
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
        let Ok(resp) = read_response(frame.data.as_bytes()) else {
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
        .ok_or(ParseError::EmptyHistory("contents"))?;
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::dialect::generated;

    /// Parts of every kind detection reads (text with escapes, thoughts, calls with args of
    /// any JSON, responses with output or error), and odd ones the one-pass reading
    /// refuses (text that is a number, a call that is a string, a bare string).
    fn part() -> impl Strategy<Value = serde_json::Value> {
        let text = generated::TEXT;
        prop_oneof![
            text.prop_map(|t| json!({"text": t})),
            text.prop_map(|t| json!({"text": t, "thought": true})),
            (text, generated::args())
                .prop_map(|(name, args)| json!({"functionCall": {"name": name, "args": args}})),
            (text, text).prop_map(|(name, out)| {
                json!({"functionResponse": {"id": "c1", "name": name, "response": {"output": out}}})
            }),
            text.prop_map(|e| json!({"functionResponse": {"name": "x", "response": {"error": e}}})),
            Just(json!({"inlineData": {"mimeType": "image/png", "data": "AAAA"}})),
            Just(json!({"text": 5})),
            Just(json!({"functionCall": "read"})),
            Just(json!("a bare string")),
        ]
    }

    fn parts() -> impl Strategy<Value = serde_json::Value> {
        proptest::collection::vec(part(), 0..5).prop_map(serde_json::Value::from)
    }

    /// What a content object gives read the raw way: every part kept raw, then read one by
    /// one.
    fn raw_way(raw: &str) -> Vec<Item> {
        let content = serde_json::from_str::<Content<&RawValue>>(raw)
            .unwrap()
            .read_parts();
        content_items(content.role.as_deref(), read_parts(content.parts))
    }

    /// A function response's text and error flag, whichever way it is read: text results
    /// in one pass, any other JSON as its text.
    #[test]
    fn a_function_response_reads_as_its_output_or_error() {
        let cases: [(serde_json::Value, &str, Option<bool>); 10] = [
            (json!({"output": "a \"b\"\n"}), "a \"b\"\n", None),
            (json!({"error": "no such file"}), "no such file", Some(true)),
            (json!({"error": null, "output": "ok"}), "ok", None),
            (json!({"output": "ok", "error": "bad"}), "bad", Some(true)),
            (json!({"output": 5}), "5", None),
            (json!({"output": {"lines": 3}}), r#"{"lines":3}"#, None),
            (json!({"error": {"code": 1}}), r#"{"code":1}"#, Some(true)),
            (json!({"other": 1}), r#"{"other":1}"#, None),
            (json!("plain"), "plain", None),
            (json!(7), "7", None),
        ];
        for (response, text, is_error) in cases {
            let raw = json!({"role": "user", "parts": [
                {"functionResponse": {"id": "c1", "name": "read", "response": response}}]})
            .to_string();
            let expected = Item::ToolResult(ToolResult {
                call_id: "c1".into(),
                name: "read".into(),
                text: text.into(),
                is_error,
            });
            assert_eq!(parse_message(&raw), vec![expected], "{response}");
        }
    }

    proptest! {
        /// A content object read in one pass gives exactly the items the raw reading gives;
        /// and the one pass reads every object whose parts all read as parts.
        #[test]
        fn a_message_reads_the_same_in_one_pass(model: bool, parts in parts()) {
            let raw = json!({"role": if model { "model" } else { "user" }, "parts": parts})
                .to_string();
            prop_assert_eq!(parse_message(&raw), raw_way(&raw));
            let odd = parts.as_array().unwrap().iter().any(|p| {
                serde_json::from_str::<Part>(&p.to_string()).is_err()
            });
            prop_assert_eq!(serde_json::from_str::<Content>(&raw).is_ok(), !odd);
        }

        /// An answer read in one pass gives the text, calls and usage the raw reading gives,
        /// as one object and as a streamed array of them.
        #[test]
        fn an_answer_reads_the_same_in_one_pass(parts in parts(), tokens in 0u64..1000) {
            let object = json!({
                "candidates": [{"content": {"role": "model", "parts": parts},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": tokens, "candidatesTokenCount": 3},
            });
            let raw_turn = |body: &[u8], array: bool| {
                let mut turn = ResponseTurn::default();
                let all: Vec<Response<&RawValue>> = if array {
                    serde_json::from_slice(body).unwrap()
                } else {
                    vec![serde_json::from_slice(body).unwrap()]
                };
                for resp in all {
                    add_response(&mut turn, resp.read_parts());
                }
                turn
            };
            for (body, array) in [(object.to_string(), false), (json!([object, object]).to_string(), true)] {
                let turn = parse_response(body.as_bytes()).unwrap();
                let expected = raw_turn(body.as_bytes(), array);
                prop_assert_eq!(&turn.text, &expected.text);
                prop_assert_eq!(&turn.calls, &expected.calls);
                prop_assert_eq!(turn.input_tokens, Some(tokens));
                prop_assert_eq!(turn.stop_reason.as_deref(), Some("STOP"));
            }
        }
    }
}
