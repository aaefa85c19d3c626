//! Context compaction, as each client writes it on the wire: the one place that knows the
//! markers. A long run outgrows its model's context; the client then asks the model for a
//! summary of the history (the *summary request*) and goes on with a history that starts
//! from that summary (a *continuation*), sometimes under a new conversation id. The proxy
//! follows the run across it (`crate::proxy::memory::lineage`); this module only says which marker
//! a request carries.
//!
//! What each client sends (CLIENTS.md; Claude Code captured for real):
//! - Claude Code: the summary request is the whole history plus a text block "CRITICAL:
//!   Respond with TEXT ONLY. Do NOT call any tools." ending its last user message (after
//!   the tool results, and on a later compaction a `<system-reminder>` block, of that
//!   message; `system` messages may follow it); the continuation's
//!   first user message holds "This session is being continued from a previous
//!   conversation...". Auto-compact in interactive mode may start a new session id;
//!   `/compact` and `-p` mode keep it.
//! - Codex: `x-codex-turn-metadata` names `request_kind: "compaction"`, the input ends with
//!   a `compaction_trigger` item, or (older) the request goes to `POST /responses/compact`;
//!   the continuation's `x-codex-window-id` is `<thread>:<n>` with `n` the compactions so
//!   far (the thread id stays).
//! - Gemini CLI: the summary request ends with the user text "First, reason in your
//!   scratchpad. Then, generate the <state_snapshot>."; the continuation starts with the
//!   `<state_snapshot>` as the first user message, answered "Got it. Thanks for the
//!   additional context!". Gemini CLI states no id, so the new head is a new identity.
//! - opencode: the summary request's last user message is "What did we do so far?"; the
//!   continuation starts with that question and the summary as the answer (same
//!   `x-session-id`).
//!
//! Server-side compaction has no summary request: the API compacts within a turn and
//! answers with what stands for the history from then on, which the client sends back in
//! place of it. Anthropic's `context_management` answers with a `compaction` content
//! block (`{"type": "compaction", "content": "<summary>"}`, in the assistant's message);
//! OpenAI Responses (`context_management`, or `POST /responses/compact`) with a
//! `compaction` input item (`{"type": "compaction", "encrypted_content": "..."}`). A
//! history that starts from one (no tool call before it: the calls it stands for are gone)
//! continues its run.

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;

use crate::transcript::{Step, Transcript};

/// A compaction marker, per client: what a request carries that says it is a summary
/// request or a continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Claude Code's "CRITICAL: Respond with TEXT ONLY..." last user message.
    ClaudeSummary,
    /// Claude Code's "This session is being continued from a previous conversation".
    ClaudeContinued,
    /// Codex's `x-codex-turn-metadata` with `request_kind: "compaction"`.
    CodexCompactionKind,
    /// Codex's input ending with a `compaction_trigger` item.
    CodexTrigger,
    /// Codex's older `POST /responses/compact`.
    CodexCompactPath,
    /// Codex's `x-codex-window-id: <thread>:<n>` with `n` > 0.
    CodexWindow,
    /// Gemini CLI's "... generate the <state_snapshot>." last user message.
    GeminiSnapshotRequest,
    /// Gemini CLI's history starting with the `<state_snapshot>` and its acknowledgement.
    GeminiSnapshot,
    /// opencode's "What did we do so far?" as the last user message.
    OpencodeSummary,
    /// opencode's history starting with "What did we do so far?".
    OpencodeContinued,
    /// Anthropic's server-side compaction: the history starts from a `compaction` block.
    AnthropicCompaction,
    /// OpenAI Responses' server-side compaction: the input starts from a `compaction` item.
    ResponsesCompaction,
}

/// What a marker says of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The request asks for the summary that replaces the history.
    Summary,
    /// The request's history starts from such a summary: it continues a run.
    Continuation,
}

impl Marker {
    pub fn role(self) -> Role {
        match self {
            Marker::ClaudeSummary
            | Marker::CodexCompactionKind
            | Marker::CodexTrigger
            | Marker::CodexCompactPath
            | Marker::GeminiSnapshotRequest
            | Marker::OpencodeSummary => Role::Summary,
            Marker::ClaudeContinued
            | Marker::CodexWindow
            | Marker::GeminiSnapshot
            | Marker::OpencodeContinued
            | Marker::AnthropicCompaction
            | Marker::ResponsesCompaction => Role::Continuation,
        }
    }

    /// The log's name of the marker.
    pub fn as_str(self) -> &'static str {
        match self {
            Marker::ClaudeSummary => "claude_summary",
            Marker::ClaudeContinued => "claude_continued",
            Marker::CodexCompactionKind => "codex_request_kind",
            Marker::CodexTrigger => "codex_compaction_trigger",
            Marker::CodexCompactPath => "codex_compact_path",
            Marker::CodexWindow => "codex_window",
            Marker::GeminiSnapshotRequest => "gemini_snapshot_request",
            Marker::GeminiSnapshot => "gemini_snapshot",
            Marker::OpencodeSummary => "opencode_summary",
            Marker::OpencodeContinued => "opencode_continued",
            Marker::AnthropicCompaction => "anthropic_compaction",
            Marker::ResponsesCompaction => "responses_compaction",
        }
    }

    /// The API compacted the history, not the client: no summary request came before.
    pub fn server_side(self) -> bool {
        matches!(
            self,
            Marker::AnthropicCompaction | Marker::ResponsesCompaction
        )
    }
}

/// The markers one request carries: a summary request of a run that was compacted before
/// carries both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Markers {
    pub summary: Option<Marker>,
    pub continuation: Option<Marker>,
}

impl Markers {
    pub fn none(&self) -> bool {
        self.summary.is_none() && self.continuation.is_none()
    }
}

const CLAUDE_SUMMARY: &str = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.";
const CLAUDE_CONTINUED: &str = "This session is being continued from a previous conversation";
const GEMINI_SNAPSHOT_REQUEST: &str =
    "First, reason in your scratchpad. Then, generate the <state_snapshot>.";
const GEMINI_ACK: &str = "Got it. Thanks for the additional context!";
const OPENCODE_SUMMARY: &str = "What did we do so far?";

/// The markers of a request: its `path`, `headers`, raw `body` (only its end is looked at)
/// and, when it was read, its transcript. Cheap for a request without any: a few header
/// lookups and comparisons of the first and last user texts.
pub fn recognize(
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
    transcript: Option<&Transcript>,
) -> Markers {
    // Codex speaks only the Responses API: other requests are spared its header look-ups.
    let path = path.split(['?', '#']).next().unwrap_or("");
    let path = path.trim_end_matches('/');
    let responses = path.ends_with("/responses") || path.ends_with("/responses/compact");
    let mut found = match responses {
        true => Markers {
            summary: codex_summary(path, headers, body),
            continuation: codex_window(headers),
        },
        false => Markers::default(),
    };
    if let Some(t) = transcript {
        found.summary = found.summary.or_else(|| summary_text(t));
        found.continuation = found.continuation.or_else(|| continued_head(t));
    }
    found
}

/// Whether a request may continue a run from a compaction, from its headers and raw body
/// before anything is parsed: Codex's window id, or a continuation's text anywhere in the
/// body (Claude Code's, Gemini CLI's snapshot, opencode's question, an API's `compaction`
/// block or item). A superset of what [`recognize`] and [`server_compaction`] find where
/// each must stand: it spares a conversation new to a process the store's look-up when it
/// cannot continue any run (a false hit costs only that look-up). `pieces`: the body as it
/// came; a marker cut across the two is found too.
pub fn may_continue(headers: &HeaderMap, pieces: [&[u8]; 2]) -> bool {
    const NEEDLES: [&str; 4] = [
        CLAUDE_CONTINUED,
        "<state_snapshot>",
        OPENCODE_SUMMARY,
        "\"compaction\"",
    ];
    static FINDERS: std::sync::LazyLock<Vec<memchr::memmem::Finder<'static>>> =
        std::sync::LazyLock::new(|| NEEDLES.iter().map(memchr::memmem::Finder::new).collect());
    if codex_window(headers).is_some() {
        return true;
    }
    let [head, tail] = pieces;
    let found = |bytes: &[u8]| FINDERS.iter().any(|f| f.find(bytes).is_some());
    if found(head) || found(tail) {
        return true;
    }
    // The bytes around the cut: a marker across it lies within the longest one's length.
    let reach = NEEDLES.iter().map(|n| n.len()).max().unwrap_or(0);
    let seam = [
        &head[head.len().saturating_sub(reach)..],
        &tail[..tail.len().min(reach)],
    ]
    .concat();
    !tail.is_empty() && found(&seam)
}

/// The last user text of a transcript: after its last step, else its task's last.
fn last_user_text(t: &Transcript) -> Option<&str> {
    match t.steps.last() {
        Some(step) => step.user_after.last(),
        None => t.task.last(),
    }
    .map(|s| s.trim())
}

/// Where Claude Code's summary instruction starts in a user text, if it is in it: at its
/// start or at a line's. A message's text blocks are joined by newlines, and Claude Code
/// puts the instruction in a block of its own after those it adds to the message (a
/// `<system-reminder>` on a compaction after the first).
fn claude_instruction_at(text: &str) -> Option<usize> {
    static SUMMARY: std::sync::LazyLock<memchr::memmem::FinderRev<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::FinderRev::new(CLAUDE_SUMMARY));
    let at = SUMMARY.rfind(text.as_bytes())?;
    (at == 0 || text[..at].ends_with('\n')).then_some(at)
}

/// A summary request read from its last user message.
fn summary_text(t: &Transcript) -> Option<Marker> {
    let last = last_user_text(t)?;
    if claude_instruction_at(last).is_some() {
        Some(Marker::ClaudeSummary)
    } else if last.starts_with(GEMINI_SNAPSHOT_REQUEST) {
        Some(Marker::GeminiSnapshotRequest)
    } else if last == OPENCODE_SUMMARY && !t.steps.is_empty() {
        // With no step before it, the question is the head of a continuation.
        Some(Marker::OpencodeSummary)
    } else {
        None
    }
}

/// A continuation read from the head of its history.
fn continued_head(t: &Transcript) -> Option<Marker> {
    // The first user message's blocks are joined into one task text: the git status
    // reminder comes before the summary. Looked for in every request's task (a few KB for
    // Claude Code): with a SIMD search made once.
    static CONTINUED: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(CLAUDE_CONTINUED));
    if t.task
        .iter()
        .any(|text| CONTINUED.find(text.as_bytes()).is_some())
    {
        return Some(Marker::ClaudeContinued);
    }
    let first = t.task.first().map(|s| s.trim())?;
    if first == OPENCODE_SUMMARY {
        return Some(Marker::OpencodeContinued);
    }
    let acknowledged = t
        .steps
        .first()
        .is_some_and(|s| s.calls.is_empty() && s.text.trim() == GEMINI_ACK);
    (first.contains("<state_snapshot>") && acknowledged).then_some(Marker::GeminiSnapshot)
}

/// Codex's summary request: by its turn metadata, its path, or the trigger item its input
/// ends with (looked for in the body's last bytes only).
/// `path`: without its query, nor a trailing slash.
fn codex_summary(path: &str, headers: &HeaderMap, body: &[u8]) -> Option<Marker> {
    if path.ends_with("/responses/compact") {
        return Some(Marker::CodexCompactPath);
    }
    // Parsed only when it may say so: a turn's metadata is read on every Codex request.
    if let Some(meta) = headers
        .get(TURN_METADATA)
        .and_then(|v| v.to_str().ok())
        .filter(|m| m.contains("\"compaction\""))
    {
        let kind = serde_json::from_str::<serde_json::Value>(meta)
            .ok()
            .and_then(|v| v.get("request_kind")?.as_str().map(str::to_string));
        if kind.as_deref() == Some("compaction") {
            return Some(Marker::CodexCompactionKind);
        }
    }
    const TAIL: usize = 512;
    static TRIGGER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"compaction_trigger\""));
    let tail = &body[body.len().saturating_sub(TAIL)..];
    TRIGGER.find(tail).map(|_| Marker::CodexTrigger)
}

/// Codex's headers, named once (a name given as text is parsed on each look-up).
const TURN_METADATA: http::HeaderName = http::HeaderName::from_static("x-codex-turn-metadata");
const WINDOW_ID: http::HeaderName = http::HeaderName::from_static("x-codex-window-id");

/// Codex's continuation: a window id whose count of compactions is past 0.
fn codex_window(headers: &HeaderMap) -> Option<Marker> {
    let window = headers.get(WINDOW_ID)?.to_str().ok()?;
    let (_, n) = window.rsplit_once(':')?;
    let n: u32 = n.trim().parse().ok()?;
    (n > 0).then_some(Marker::CodexWindow)
}

/// A compaction the API made, as a history sent back starts from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerCompaction {
    pub marker: Marker,
    /// Names the block or item: another one is another compaction of the run.
    pub fingerprint: u64,
}

/// A history that starts from a compaction the API made ([`Marker::AnthropicCompaction`],
/// [`Marker::ResponsesCompaction`]): its `compaction` block or item, with no tool call
/// before it. A history that kept the calls before the block (the API drops them itself)
/// still holds the run, and is no continuation. `path`: the request's; `pieces`: the body,
/// in the pieces it came in (a block cut across two is not seen). One SIMD search over the
/// body; the bytes around a hit are read only for a hit.
pub fn server_compaction(path: &str, pieces: [&[u8]; 2]) -> Option<ServerCompaction> {
    let path = path
        .split(['?', '#'])
        .next()
        .unwrap_or("")
        .trim_end_matches('/');
    const ANTHROPIC_CALLS: &[&[u8]] = &[b"\"tool_use\""];
    const RESPONSES_CALLS: &[&[u8]] = &[
        b"\"function_call\"",
        b"\"custom_tool_call\"",
        b"\"local_shell_call\"",
    ];
    let (marker, calls) = if path.ends_with("/messages") {
        (Marker::AnthropicCompaction, ANTHROPIC_CALLS)
    } else if path.ends_with("/responses") {
        (Marker::ResponsesCompaction, RESPONSES_CALLS)
    } else {
        return None;
    };
    static COMPACTION: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"compaction\""));
    let mut before: Vec<&[u8]> = Vec::with_capacity(2);
    for piece in pieces {
        for at in COMPACTION.find_iter(piece) {
            let is_item = is_type_value(piece, at)
                && (marker == Marker::AnthropicCompaction || holds_encrypted_content(piece, at));
            if !is_item {
                continue;
            }
            before.push(&piece[..at]);
            let called = before.iter().any(|bytes| {
                calls
                    .iter()
                    .any(|call| type_values(bytes, call).next().is_some())
            });
            let object = enclosing_object(piece, at);
            let hash = blake3::hash(object);
            let mut first = [0u8; 8];
            first.copy_from_slice(&hash.as_bytes()[..8]);
            return (!called).then_some(ServerCompaction {
                marker,
                fingerprint: u64::from_le_bytes(first),
            });
        }
        before.push(piece);
    }
    None
}

/// Where `value` (a JSON string, quotes included) stands as the value of a `"type"` key.
fn type_values<'a>(bytes: &'a [u8], value: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    memchr::memmem::find_iter(bytes, value).filter(move |&at| is_type_value(bytes, at))
}

/// Whether the JSON string at `at` is the value of a `"type"` key: `"type"`, a colon and
/// white space before it. Inside a JSON string the quotes would be escaped: never a hit.
fn is_type_value(bytes: &[u8], at: usize) -> bool {
    let key = bytes[..at].trim_ascii_end();
    key.strip_suffix(b":")
        .is_some_and(|key| key.trim_ascii_end().ends_with(b"\"type\""))
}

/// Whether the object around the `"compaction"` at `at` has an `encrypted_content`: a
/// compaction item, not the `context_management` entry `{"type": "compaction", ...}` that
/// asks for compaction. The item holds no nested object (its strings are base64 and ids).
fn holds_encrypted_content(bytes: &[u8], at: usize) -> bool {
    memchr::memmem::find(enclosing_object(bytes, at), b"\"encrypted_content\"").is_some()
}

/// The bytes between the braces nearest the `"compaction"` at `at`: always inside its
/// block or item (a brace in its text only narrows them), so the same for every request
/// that sends that block back.
fn enclosing_object(bytes: &[u8], at: usize) -> &[u8] {
    let start = memchr::memrchr(b'{', &bytes[..at]).unwrap_or(0);
    let end = memchr::memchr(b'}', &bytes[at..]).map_or(bytes.len(), |e| at + e);
    &bytes[start..end]
}

/// The transcript of a summary request without the instruction that asks for the summary:
/// the run's history as it stood, which is what the run carries on with. The instruction
/// is the client's, not a human's: folded, it would read as a human speaking and start the
/// run's escalation over. `None` when the marker puts no text into the transcript.
pub fn without_instruction(t: &Transcript, marker: Marker) -> Option<Transcript> {
    if !in_transcript(marker) {
        return None;
    }
    let mut t = t.clone();
    match t.steps.last_mut() {
        Some(step) => cut_instruction(&mut step.user_after, marker),
        None => cut_instruction(&mut t.task, marker),
    }
    Some(t)
}

/// Takes the instruction out of the last step of a summary request's history, where the
/// log keeps it: the log holds the run as detection saw it.
pub fn strip_instruction(last: &mut Step, marker: Marker) {
    if in_transcript(marker) {
        cut_instruction(&mut last.user_after, marker);
    }
}

/// Takes the instruction out of the last of `texts`: the text from the instruction on.
/// What the client put before it in the same message (Claude Code's reminders) stays.
fn cut_instruction(texts: &mut Vec<String>, marker: Marker) {
    let Some(last) = texts.last_mut() else { return };
    let kept = match marker {
        Marker::ClaudeSummary => claude_instruction_at(last).map_or(0, |at| at),
        _ => 0,
    };
    last.truncate(kept);
    let len = last.trim_end().len();
    last.truncate(len);
    if last.is_empty() {
        texts.pop();
    }
}

/// Whether a summary request has its client's shape: the instruction is the request's last
/// one (Claude Code's the last text block of the last user message, whatever `system`
/// messages follow it; Gemini CLI's and opencode's the whole last user message; Codex's
/// `compaction_trigger` the input's last item). A request that only carries the marker
/// somewhere asks the model something else as well. `body`: the whole body, read again
/// for Claude Code's and Codex's shapes only (a summary request is rare).
pub fn instruction_is_last(marker: Marker, t: &Transcript, body: impl FnOnce() -> Bytes) -> bool {
    match marker {
        Marker::ClaudeSummary => last_item(&body(), "messages").is_some_and(|last| {
            last.get("role").and_then(Value::as_str) == Some("user")
                && last_text(&last).is_some_and(|t| t.trim_start().starts_with(CLAUDE_SUMMARY))
        }),
        Marker::GeminiSnapshotRequest => last_user_text(t) == Some(GEMINI_SNAPSHOT_REQUEST),
        Marker::OpencodeSummary => last_user_text(t) == Some(OPENCODE_SUMMARY),
        Marker::CodexCompactionKind | Marker::CodexTrigger => last_item(&body(), "input")
            .is_some_and(|last| {
                last.get("type").and_then(Value::as_str) == Some("compaction_trigger")
            }),
        // Not a conversation endpoint: answered with a compaction, never with a turn.
        Marker::CodexCompactPath => true,
        Marker::ClaudeContinued
        | Marker::CodexWindow
        | Marker::GeminiSnapshot
        | Marker::OpencodeContinued
        | Marker::AnthropicCompaction
        | Marker::ResponsesCompaction => false,
    }
}

/// The last item of the body's `list` (`messages`, `input`) that is not a `system` message
/// (Claude Code puts some after its instruction: they instruct no turn).
fn last_item(body: &[u8], list: &str) -> Option<Value> {
    let mut value = serde_json::from_slice::<Value>(body).ok()?;
    let items = value.get_mut(list)?.as_array_mut()?;
    let at = items
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) != Some("system"))?;
    Some(items.swap_remove(at))
}

/// The text of a message's last content block (or its content, when a text).
fn last_text(message: &Value) -> Option<&str> {
    match message.get("content")? {
        Value::String(text) => Some(text),
        Value::Array(blocks) => blocks
            .last()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))?
            .get("text")?
            .as_str(),
        _ => None,
    }
}

/// Whether the marker is a text of the history (the others are headers, a path, or an
/// item the transcript has no place for).
fn in_transcript(marker: Marker) -> bool {
    matches!(
        marker,
        Marker::ClaudeSummary | Marker::GeminiSnapshotRequest | Marker::OpencodeSummary
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{CallWithResult, ToolCall, ToolResult};

    fn step(text: &str, call: bool, user_after: &[&str]) -> Step {
        Step {
            index: 0,
            text: text.into(),
            calls: if call {
                vec![CallWithResult {
                    call: ToolCall {
                        id: "c".into(),
                        name: "read_file".into(),
                        args: serde_json::json!({"path": "a.py"}),
                    },
                    result: Some(ToolResult {
                        call_id: "c".into(),
                        name: String::new(),
                        text: "x".into(),
                        is_error: None,
                    }),
                }]
            } else {
                Vec::new()
            },
            user_after: user_after.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn transcript(task: &[&str], steps: Vec<Step>) -> Transcript {
        Transcript {
            system: vec!["sys".into()],
            task: task.iter().map(|s| s.to_string()).collect(),
            steps,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn of(t: &Transcript) -> Markers {
        recognize("/v1/messages", &HeaderMap::new(), b"{}", Some(t))
    }

    #[test]
    fn each_clients_summary_request_is_recognized_by_its_last_user_message() {
        let claude = transcript(
            &["fix it"],
            vec![step(
                "",
                true,
                &[&format!("{CLAUDE_SUMMARY}\n\n- Do NOT use Read")],
            )],
        );
        assert_eq!(of(&claude).summary, Some(Marker::ClaudeSummary));
        let gemini = transcript(
            &["fix it"],
            vec![step("", true, &[GEMINI_SNAPSHOT_REQUEST])],
        );
        assert_eq!(of(&gemini).summary, Some(Marker::GeminiSnapshotRequest));
        let opencode = transcript(&["fix it"], vec![step("", true, &[OPENCODE_SUMMARY])]);
        assert_eq!(of(&opencode).summary, Some(Marker::OpencodeSummary));
        // The same texts anywhere but last, or a human asking the question first, are no
        // summary request.
        let earlier = transcript(
            &["fix it"],
            vec![step("", true, &[CLAUDE_SUMMARY]), step("", true, &[])],
        );
        assert!(of(&earlier).none());
        assert!(of(&transcript(&[OPENCODE_SUMMARY], vec![]))
            .summary
            .is_none());
        // The instruction is taken out of the history the run goes on with.
        let history = without_instruction(&claude, Marker::ClaudeSummary).unwrap();
        assert!(history.steps[0].user_after.is_empty());
        assert!(of(&history).none());
    }

    #[test]
    fn claudes_instruction_after_a_reminder_block_is_recognized_and_only_it_is_cut() {
        // A compaction after the first: a reminder block before the instruction, in the
        // same user message (its blocks joined by newlines).
        let reminder = "<system-reminder>\nAttribution: none.\n</system-reminder>";
        let text = format!("{reminder}\n{CLAUDE_SUMMARY}\n\n- Do NOT use Read");
        let claude = transcript(&["fix it"], vec![step("", true, &[&text])]);
        assert_eq!(of(&claude).summary, Some(Marker::ClaudeSummary));
        let history = without_instruction(&claude, Marker::ClaudeSummary).unwrap();
        assert_eq!(history.steps[0].user_after, vec![reminder.to_string()]);
        // Mentioned inside a line, it is no instruction.
        let quoted = format!("the client said \"{CLAUDE_SUMMARY}\"");
        assert!(of(&transcript(&["fix it"], vec![step("", true, &[&quoted])])).none());
    }

    #[test]
    fn a_real_summary_request_has_its_instruction_last() {
        let claude = |messages: serde_json::Value| {
            let body = serde_json::json!({ "messages": messages }).to_string();
            let t = Transcript::default();
            instruction_is_last(Marker::ClaudeSummary, &t, || Bytes::from(body))
        };
        let instruction = serde_json::json!({"type": "text", "text": CLAUDE_SUMMARY});
        let result = serde_json::json!({"type": "tool_result", "tool_use_id": "t", "content": "x"});
        let system = serde_json::json!({"role": "system", "content": "tools are deferred"});
        assert!(claude(serde_json::json!([
            {"role": "user", "content": [result, instruction]}, system
        ])));
        let more = serde_json::json!({"type": "text", "text": "then run the tests"});
        assert!(!claude(serde_json::json!([
            {"role": "user", "content": [result, instruction, more]}
        ])));
        assert!(!claude(serde_json::json!([
            {"role": "user", "content": [instruction]}, {"role": "assistant", "content": "ok"}
        ])));
        assert!(!claude(serde_json::json!("not messages")));
        let codex = |input: serde_json::Value| {
            let body = serde_json::json!({ "input": input, "tools": [] }).to_string();
            let t = Transcript::default();
            instruction_is_last(Marker::CodexTrigger, &t, || Bytes::from(body))
        };
        assert!(codex(
            serde_json::json!([{"type": "message"}, {"type": "compaction_trigger"}])
        ));
        assert!(!codex(
            serde_json::json!([{"type": "compaction_trigger"}, {"type": "message"}])
        ));
        let opencode = transcript(
            &["fix it"],
            vec![step(
                "",
                true,
                &[&format!("{OPENCODE_SUMMARY} And delete it.")],
            )],
        );
        assert!(!instruction_is_last(
            Marker::OpencodeSummary,
            &opencode,
            Bytes::new
        ));
    }

    #[test]
    fn each_clients_continuation_is_recognized_by_its_head() {
        let claude = transcript(
            &[
                "<system-reminder>git status</system-reminder>",
                "This session is being continued from a previous conversation that ran out of context.",
            ],
            vec![step("", true, &[])],
        );
        assert_eq!(of(&claude).continuation, Some(Marker::ClaudeContinued));
        let gemini = transcript(
            &["<state_snapshot><overall_goal>fix</overall_goal></state_snapshot>"],
            vec![step(GEMINI_ACK, false, &[]), step("", true, &[])],
        );
        assert_eq!(of(&gemini).continuation, Some(Marker::GeminiSnapshot));
        let opencode = transcript(
            &[OPENCODE_SUMMARY],
            vec![step("summary", false, &["go on"])],
        );
        assert_eq!(of(&opencode).continuation, Some(Marker::OpencodeContinued));
        // A task that only mentions a snapshot, unacknowledged, is a task.
        let plain = transcript(
            &["write a <state_snapshot> parser"],
            vec![step("ok", true, &[])],
        );
        assert!(of(&plain).none());
    }

    #[test]
    fn codex_states_both_in_headers_path_and_body() {
        let meta = r#"{"session_id":"t","request_kind":"compaction","window_id":"t:0"}"#;
        let h = headers(&[("x-codex-turn-metadata", meta)]);
        assert_eq!(
            recognize("/v1/responses", &h, b"{}", None).summary,
            Some(Marker::CodexCompactionKind)
        );
        let turn = headers(&[("x-codex-turn-metadata", r#"{"request_kind":"turn"}"#)]);
        assert!(recognize("/v1/responses", &turn, b"{}", None).none());
        assert_eq!(
            recognize("/v1/responses/compact", &HeaderMap::new(), b"{}", None).summary,
            Some(Marker::CodexCompactPath)
        );
        let body = br#"{"input":[{"type":"message"},{"type":"compaction_trigger"}]}"#;
        assert_eq!(
            recognize("/v1/responses", &HeaderMap::new(), body, None).summary,
            Some(Marker::CodexTrigger)
        );
        let first = headers(&[("x-codex-window-id", "019a-thread:0")]);
        assert!(recognize("/v1/responses", &first, b"{}", None).none());
        let later = headers(&[("x-codex-window-id", "019a-thread:2")]);
        assert_eq!(
            recognize("/v1/responses", &later, b"{}", None).continuation,
            Some(Marker::CodexWindow)
        );
    }

    #[test]
    fn a_history_starting_from_the_apis_compaction_continues_a_run() {
        let found = |path: &str, body: serde_json::Value| {
            let body = body.to_string();
            server_compaction(path, [body.as_bytes(), b""]).map(|c| c.marker)
        };
        let block = serde_json::json!({"type": "compaction", "content": "summary"});
        let head = serde_json::json!({"role": "assistant", "content": [block]});
        let read = serde_json::json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "Read", "input": {}}]});
        let edits = serde_json::json!({"edits": [{"type": "compact_20260112"}]});
        assert_eq!(
            found(
                "/v1/messages?beta=true",
                serde_json::json!({
                "context_management": edits, "messages": [head, {"role": "user", "content": "go on"}]})
            ),
            Some(Marker::AnthropicCompaction)
        );
        // The calls before it kept: the history still holds the run.
        assert_eq!(
            found(
                "/v1/messages",
                serde_json::json!({"messages": [read, head]})
            ),
            None
        );
        // Only mentioned in a text, or asked for: no compaction.
        let text = serde_json::json!({"role": "user", "content": r#"{"type": "compaction"}"#});
        assert_eq!(
            found("/v1/messages", serde_json::json!({"messages": [text]})),
            None
        );
        let asked = serde_json::json!([{"type": "compaction", "compact_threshold": 1000}]);
        let user = serde_json::json!({"type": "message", "role": "user", "content": "fix it"});
        let item = serde_json::json!({"type": "compaction", "encrypted_content": "gAAA"});
        assert_eq!(
            found(
                "/v1/responses",
                serde_json::json!({"context_management": asked, "input": [user]})
            ),
            None
        );
        assert_eq!(
            found(
                "/v1/responses",
                serde_json::json!({"context_management": asked, "input": [user, item]})
            ),
            Some(Marker::ResponsesCompaction)
        );
        let call = serde_json::json!({"type": "function_call", "call_id": "c", "name": "x", "arguments": "{}"});
        assert_eq!(
            found("/v1/responses", serde_json::json!({"input": [call, item]})),
            None
        );
        // Another API's path: not looked for.
        assert_eq!(
            found(
                "/v1/chat/completions",
                serde_json::json!({"messages": [head]})
            ),
            None
        );
    }

    /// The pre-check before a store look-up: every continuation shape is a hit, wherever
    /// the body was cut; the real captured requests of every client, which continue
    /// nothing, are not.
    #[test]
    fn a_continuation_may_continue_and_a_plain_request_may_not() {
        let no_headers = HeaderMap::new();
        let continuations = [
            serde_json::json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>git status</system-reminder>"},
                {"type": "text", "text": format!("{CLAUDE_CONTINUED} that ran out of context.")}]}]}),
            serde_json::json!({"contents": [
                {"role": "user", "parts": [{"text": "<state_snapshot>goal</state_snapshot>"}]},
                {"role": "model", "parts": [{"text": GEMINI_ACK}]}]}),
            serde_json::json!({"messages": [{"role": "user", "content": OPENCODE_SUMMARY}]}),
            serde_json::json!({"input": [{"type": "compaction", "encrypted_content": "gAAA"}]}),
        ];
        for body in continuations {
            let bytes = serde_json::to_vec(&body).unwrap();
            for cut in 0..=bytes.len() {
                let (head, tail) = bytes.split_at(cut);
                assert!(
                    may_continue(&no_headers, [head, tail]),
                    "{body} cut at {cut}"
                );
            }
        }
        let mut window = HeaderMap::new();
        window.insert(WINDOW_ID, "thread-1:1".parse().unwrap());
        assert!(may_continue(&window, [b"{}", b""]));

        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut read = 0;
        for entry in std::fs::read_dir(fixtures).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !may_continue(&no_headers, [&bytes, b""]),
                    "{}",
                    path.display()
                );
                read += 1;
            }
        }
        assert!(read >= 9, "the captured requests are there");
    }
}
