//! Anthropic Messages (`POST /v1/messages`).
//!
//! Request: `system` (string or text blocks) and `messages`, each `{role, content}` where
//! content is a string or a list of blocks: `text`, `tool_use {id, name, input}`,
//! `tool_result {tool_use_id, content, is_error?}`, `thinking` (ignored), images...
//! Claude Code also puts `role:"system"` entries inside `messages`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    args_from_raw, content_text, offers_tools, push_line, Dialect, ParseError, RequestView,
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
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

pub(super) fn view(body: &[u8]) -> Result<RequestView<'_>, ParseError> {
    let req: Request =
        serde_json::from_slice(body).map_err(|e| ParseError::json(Dialect::Anthropic, e))?;
    let system = content_text(req.system);
    Ok(RequestView {
        model: req.model,
        stream: req.stream.unwrap_or(false),
        has_tools: offers_tools(req.tools),
        preamble: if system.is_empty() {
            Vec::new()
        } else {
            vec![Item::System { text: system }]
        },
        messages: req.messages,
    })
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// One content block, with the fields of every block type we read.
#[derive(Deserialize)]
struct Block<'a> {
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
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    is_error: Option<bool>,
}

pub(super) fn parse_message(raw: &str) -> Vec<Item> {
    let Ok(msg) = serde_json::from_str::<Message>(raw) else {
        return Vec::new();
    };
    let content = msg.content.map(RawValue::get).unwrap_or("");
    // A plain string content is all text, whatever the role.
    let blocks: Vec<&RawValue> = if content.starts_with('[') {
        serde_json::from_str(content).unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut text = if content.starts_with('"') {
        content_text(msg.content)
    } else {
        String::new()
    };
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for raw_block in blocks {
        let Ok(block) = serde_json::from_str::<Block>(raw_block.get()) else {
            continue;
        };
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
                text: content_text(block.content),
                is_error: block.is_error,
            })),
            // thinking, redacted_thinking, images, documents, server tools: nothing
            // detection reads.
            _ => {}
        }
    }
    match msg.role.as_ref() {
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
