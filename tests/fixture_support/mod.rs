//! The captured requests every client sends (`tests/fixtures/`), for the tests that read
//! them all.
#![allow(
    dead_code,
    reason = "each test crate uses what it needs of this module"
)]

use loopwarden::dialect::Dialect;

/// One captured request per client and API, with its wire format.
pub const REQUESTS: [(Dialect, &str); 9] = [
    (Dialect::Anthropic, "claude-code-anthropic.json"),
    (Dialect::Anthropic, "opencode-anthropic.json"),
    (Dialect::OpenAiChat, "mini-swe-agent-chat.json"),
    (Dialect::OpenAiChat, "mini-swe-agent-textbased.json"),
    (Dialect::OpenAiChat, "opencode-chat.json"),
    (Dialect::OpenAiResponses, "codex-responses.json"),
    (Dialect::OpenAiResponses, "mini-swe-agent-responses.json"),
    (Dialect::OpenAiResponses, "opencode-responses.json"),
    (Dialect::Gemini, "gemini-cli.json"),
];

/// A file under `tests/fixtures/`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}
