//! OpenAI Chat Completions (`POST /v1/chat/completions`).
//!
//! Request: `messages`, each `{role, content}` with content a string, null or a list of
//! parts. Assistant messages carry `tool_calls[{id, function{name, arguments}}]` (the
//! arguments a JSON *string*); results are `role:"tool"` messages with `tool_call_id`.
//! litellm echoes extra fields (`provider_specific_fields`...), which are skipped.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{args_from_text, content_text, offers_tools, Dialect, ParseError, RequestView};
use crate::transcript::{Item, ToolCall, ToolResult};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    /// The pre-tools function calling API.
    #[serde(borrow, default)]
    functions: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

pub(super) fn view(body: &[u8]) -> Result<RequestView<'_>, ParseError> {
    let req: Request =
        serde_json::from_slice(body).map_err(|e| ParseError::json(Dialect::OpenAiChat, e))?;
    Ok(RequestView {
        model: req.model,
        stream: req.stream.unwrap_or(false),
        has_tools: offers_tools(req.tools) || offers_tools(req.functions),
        preamble: Vec::new(),
        messages: req.messages,
    })
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
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
    let Ok(msg) = serde_json::from_str::<Message>(raw) else {
        return Vec::new();
    };
    let text = content_text(msg.content);
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
