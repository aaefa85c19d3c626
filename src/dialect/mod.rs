//! Wire formats. One module per API; each turns a request body into transcript items,
//! a response (JSON or SSE) into the new assistant turn, appends a reminder to a request,
//! and builds a halt reply in the mode the client asked for.
//!
//! The request side is split in two so that callers can cache per message: [`Dialect::view`]
//! finds the top-level fields and the raw message slices (cheap: no message is parsed),
//! and [`Dialect::parse_message`] turns one raw message into items. A message's items depend
//! only on its bytes, so they can be cached under the hash of those bytes.

use crate::transcript::{Item, ToolCall, Transcript};

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
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::OpenAiChat => "openai_chat",
            Dialect::OpenAiResponses => "openai_responses",
            Dialect::Anthropic => "anthropic",
            Dialect::Gemini => "gemini",
        }
    }
}

/// Why a body could not be read as a conversation. The body is then forwarded untouched.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// The top-level facts of a request, with its messages left as raw JSON slices.
#[derive(Debug)]
pub struct RequestView<'a> {
    pub model: Option<String>,
    /// The client asked for a streamed answer (`"stream": true`, or Gemini's
    /// `:streamGenerateContent` path, which the caller signals to `view`).
    pub stream: bool,
    /// The request offers tools (a request without tools is a side call: title, router...).
    pub has_tools: bool,
    /// Items that come from top-level fields (`system`, `instructions`, `systemInstruction`).
    pub preamble: Vec<Item>,
    /// Each message of the history, raw, in order.
    pub messages: Vec<&'a serde_json::value::RawValue>,
}

/// What the model answered in one response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponseTurn {
    pub text: String,
    pub calls: Vec<ToolCall>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub stop_reason: Option<String>,
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
        let _ = (body, stream_path);
        Err(ParseError(format!(
            "{} parsing not implemented yet",
            self.as_str()
        )))
    }

    /// Turns one raw message of the history into items.
    pub fn parse_message(self, raw: &str) -> Vec<Item> {
        let _ = raw;
        Vec::new()
    }

    /// `view` + `parse_message` for every message, with no cache.
    pub fn parse_request(
        self,
        body: &[u8],
        stream_path: bool,
    ) -> Result<ParsedRequest, ParseError> {
        let view = self.view(body, stream_path)?;
        let mut items = view.preamble;
        for raw in &view.messages {
            items.extend(self.parse_message(raw.get()));
        }
        Ok(ParsedRequest {
            model: view.model,
            stream: view.stream,
            has_tools: view.has_tools,
            transcript: Transcript::from_items(items),
        })
    }
}
