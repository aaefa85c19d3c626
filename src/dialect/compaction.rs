//! Context compaction, as each client writes it on the wire: the one place that knows the
//! markers. A long run outgrows its model's context; the client then asks the model for a
//! summary of the history (the *summary request*) and goes on with a history that starts
//! from that summary (a *continuation*), sometimes under a new conversation id. The proxy
//! follows the run across it (`crate::proxy::memory::lineage`); this module only says which marker
//! a request carries.
//!
//! What each client sends (CLIENTS.md; Claude Code captured for real):
//! - Claude Code: the summary request is the whole history plus a last user message
//!   starting "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools."; the continuation's
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

use http::HeaderMap;

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
            | Marker::OpencodeContinued => Role::Continuation,
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
        }
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

/// The last user text of a transcript: after its last step, else its task's last.
fn last_user_text(t: &Transcript) -> Option<&str> {
    match t.steps.last() {
        Some(step) => step.user_after.last(),
        None => t.task.last(),
    }
    .map(|s| s.trim())
}

/// A summary request read from its last user message.
fn summary_text(t: &Transcript) -> Option<Marker> {
    let last = last_user_text(t)?;
    if last.starts_with(CLAUDE_SUMMARY) {
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
        Some(step) => {
            step.user_after.pop();
        }
        None => {
            t.task.pop();
        }
    }
    Some(t)
}

/// Takes the instruction out of the last step of a summary request's history, where the
/// log keeps it: the log holds the run as detection saw it.
pub fn strip_instruction(last: &mut Step, marker: Marker) {
    if in_transcript(marker) {
        last.user_after.pop();
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
}
