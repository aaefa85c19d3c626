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

use super::{args_from_raw, offers_tools, push_line, value_text, Dialect, ParseError, RequestView};
use crate::transcript::{Item, ToolCall, ToolResult};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default, alias = "system_instruction")]
    system_instruction: Option<&'a RawValue>,
    #[serde(borrow)]
    contents: Vec<&'a RawValue>,
}

pub(super) fn view(body: &[u8], stream_path: bool) -> Result<RequestView<'_>, ParseError> {
    let req: Request =
        serde_json::from_slice(body).map_err(|e| ParseError::json(Dialect::Gemini, e))?;
    let system = req
        .system_instruction
        .map(|raw| content_text(raw.get()))
        .unwrap_or_default();
    Ok(RequestView {
        model: req.model,
        stream: stream_path,
        has_tools: offers_tools(req.tools),
        preamble: if system.is_empty() {
            Vec::new()
        } else {
            vec![Item::System { text: system }]
        },
        messages: req.contents,
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
    let Ok(content) = serde_json::from_str::<Content>(raw) else {
        return String::new();
    };
    let mut text = String::new();
    for raw_part in content.parts {
        if let Ok(part) = serde_json::from_str::<Part>(raw_part.get()) {
            if part.thought != Some(true) {
                push_line(&mut text, part.text.as_deref().unwrap_or(""));
            }
        }
    }
    text
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    let Ok(content) = serde_json::from_str::<Content>(raw) else {
        return Vec::new();
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for raw_part in content.parts {
        let Ok(part) = serde_json::from_str::<Part>(raw_part.get()) else {
            continue;
        };
        if let Some(call) = part.function_call {
            calls.push(ToolCall {
                id: call.id.unwrap_or_default(),
                name: call.name.unwrap_or_default(),
                args: args_from_raw(call.args),
            });
        } else if let Some(resp) = part.function_response {
            results.push(Item::ToolResult(result_of(resp)));
        } else if part.thought != Some(true) {
            push_line(&mut text, part.text.as_deref().unwrap_or(""));
        }
    }
    match content.role.as_deref().unwrap_or("user") {
        "model" => vec![Item::Assistant { text, calls }],
        _ => {
            if !text.is_empty() || results.is_empty() {
                results.push(Item::User { text });
            }
            results
        }
    }
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
