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

use super::{
    args_from_raw, args_from_text, content_text, offers_tools, Dialect, ParseError, RequestView,
};
use crate::transcript::{Item, ToolCall, ToolResult};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow)]
    input: &'a RawValue,
}

pub(super) fn view(body: &[u8]) -> Result<RequestView<'_>, ParseError> {
    let req: Request =
        serde_json::from_slice(body).map_err(|e| ParseError::json(Dialect::OpenAiResponses, e))?;
    let messages = match req.input.get().as_bytes().first() {
        // A plain string input is one user message; parse_message reads it as such.
        Some(b'"') => vec![req.input],
        _ => serde_json::from_str(req.input.get())
            .map_err(|e| ParseError::json(Dialect::OpenAiResponses, e))?,
    };
    let instructions = content_text(req.instructions);
    Ok(RequestView {
        model: req.model,
        stream: req.stream.unwrap_or(false),
        has_tools: offers_tools(req.tools),
        preamble: if instructions.is_empty() {
            Vec::new()
        } else {
            vec![Item::System { text: instructions }]
        },
        messages,
    })
}

/// One input item, with the fields of every item type we read.
#[derive(Deserialize)]
struct InputItem<'a> {
    /// Absent on the short form `{role, content}` of a message.
    #[serde(borrow, rename = "type", default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    // function_call / custom_tool_call / their outputs
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
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
    let Ok(item) = serde_json::from_str::<InputItem>(raw) else {
        return Vec::new();
    };
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
            let text = content_text(item.content);
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
                text: output_text(item.output),
                is_error: None,
            })]
        }
        // reasoning, web_search_call, item_reference...: nothing detection reads. They
        // give no item, so the parts around them still join into one turn.
        _ => Vec::new(),
    }
}

/// A call output is a string, or a list of content parts (`input_text`...).
fn output_text(raw: Option<&RawValue>) -> String {
    match raw {
        Some(raw) if raw.get().starts_with(['"', '[']) => content_text(Some(raw)),
        Some(raw) => super::value_text(raw),
        None => String::new(),
    }
}
