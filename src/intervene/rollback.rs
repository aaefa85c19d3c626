//! Rollback of context (opt-in): forward a history from which the looping turns are cut
//! out and replaced by one short note of what was tried there.
//!
//! Only whole turns go: an assistant turn with every result of its calls, so no call is
//! left without its result and no result without its call, whatever the API. The cut is
//! made on the request's bytes (the span from the first removed message to the last one is
//! replaced by the note message), so everything outside it is forwarded byte for byte.

use crate::dialect::Dialect;
use crate::transcript::{Item, Transcript};

/// A request body with some turns rolled back.
#[derive(Debug, Clone, PartialEq)]
pub struct RolledBack {
    pub body: Vec<u8>,
    /// Assistant turns removed.
    pub removed: usize,
}

/// What the removed turns did, one line each (at most `max_lines`), for the note.
pub fn tried(transcript: &Transcript, first: usize, last: usize, max_lines: usize) -> String {
    let mut lines = Vec::new();
    for step in transcript.steps.iter().skip(first).take(last + 1 - first) {
        for c in &step.calls {
            let what = describe_args(&c.call.args);
            let result = c
                .result
                .as_ref()
                .and_then(|r| r.text.lines().map(str::trim).find(|l| !l.is_empty()))
                .unwrap_or("(no output)");
            lines.push(format!(
                "- {}({}) -> {}",
                c.call.name,
                super::text::cut(&what, 100),
                super::text::cut(result, 100)
            ));
        }
    }
    lines.dedup();
    if lines.len() > max_lines {
        let more = lines.len() - max_lines;
        lines.truncate(max_lines);
        lines.push(format!("- ... and {more} more"));
    }
    lines.join("\n")
}

/// The arguments a human recognizes a call by: its command or path, else its JSON.
fn describe_args(args: &serde_json::Value) -> String {
    for key in ["command", "cmd", "file_path", "filePath", "path"] {
        match args.get(key) {
            Some(serde_json::Value::String(s)) => return s.clone(),
            Some(serde_json::Value::Array(a)) => {
                let parts: Vec<&str> = a.iter().filter_map(|v| v.as_str()).collect();
                return parts.join(" ");
            }
            _ => {}
        }
    }
    match args {
        serde_json::Value::String(s) => s.lines().next().unwrap_or("").to_string(),
        other => other.to_string(),
    }
}

/// The note as one message of the API, in the user's role (after the kept history it is
/// valid everywhere: a user turn may follow tool results, and precede the next assistant
/// turn).
fn note_message(dialect: Dialect, note: &str) -> String {
    let v = match dialect {
        Dialect::OpenAiChat => serde_json::json!({"role": "user", "content": note}),
        Dialect::OpenAiResponses => serde_json::json!({
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": note}]}),
        Dialect::Anthropic => {
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": note}]})
        }
        Dialect::Gemini => serde_json::json!({"role": "user", "parts": [{"text": note}]}),
    };
    v.to_string()
}

/// Removes assistant turns `first..=last` (and the results of their calls) from `body`,
/// putting `note` in their place. `None` when the turns cannot be found or the result
/// would not read back as a valid history (the caller then nudges instead).
pub fn roll_back(
    dialect: Dialect,
    body: &[u8],
    stream_path: bool,
    first: usize,
    last: usize,
    note: &str,
) -> Option<RolledBack> {
    if first > last {
        return None;
    }
    let view = dialect.view(body, stream_path).ok()?;
    // Which message begins which assistant turn, the way `Transcript::from_items` counts.
    let mut begins: Vec<Option<usize>> = Vec::with_capacity(view.messages.len());
    let mut empty: Vec<bool> = Vec::with_capacity(view.messages.len());
    let mut steps = 0usize;
    let mut in_assistant = false;
    for raw in &view.messages {
        let items = dialect.parse_message(raw.get());
        let mut begun = None;
        for item in &items {
            let starts = match item {
                Item::Assistant { .. } => true,
                Item::AssistantPart { .. } => !in_assistant,
                _ => false,
            };
            if starts {
                begun.get_or_insert(steps);
                steps += 1;
            }
            in_assistant = matches!(item, Item::Assistant { .. } | Item::AssistantPart { .. });
        }
        begins.push(begun);
        empty.push(items.is_empty());
    }
    if last >= steps {
        return None;
    }
    let mut start = begins.iter().position(|b| *b == Some(first))?;
    let mut end = begins
        .iter()
        .position(|b| *b == Some(last + 1))
        .unwrap_or(view.messages.len());
    if end <= start {
        return None;
    }
    // Items that say nothing (reasoning) belong with the turn they precede.
    while start > 0 && empty[start - 1] {
        start -= 1;
    }
    while end > start + 1 && empty[end - 1] {
        end -= 1;
    }
    let offset = |s: &str| (s.as_ptr() as usize).checked_sub(body.as_ptr() as usize);
    let from = offset(view.messages[start].get())?;
    let last_raw = view.messages[end - 1].get();
    let to = offset(last_raw)? + last_raw.len();
    if to > body.len() || from > to {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() - (to - from) + note.len() + 64);
    out.extend_from_slice(&body[..from]);
    out.extend_from_slice(note_message(dialect, note).as_bytes());
    out.extend_from_slice(&body[to..]);
    let removed = last + 1 - first;
    let check = dialect.parse_request(&out, stream_path).ok()?;
    (check.transcript.steps.len() + removed == steps).then_some(RolledBack { body: out, removed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_loop() -> serde_json::Value {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coder."}),
            json!({"role": "user", "content": "Fix calc.py"}),
        ];
        for i in 0..4 {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}a"), "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"pytest\"}"}},
                {"id": format!("c{i}b"), "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"cat calc.py\"}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}a"), "content": "FAILED test_add"}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}b"), "content": "def add(a, b): return a - b"}));
        }
        json!({"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}]})
    }

    #[test]
    fn chat_turns_go_with_all_their_results() {
        let body = serde_json::to_vec(&chat_loop()).unwrap();
        let rb = roll_back(Dialect::OpenAiChat, &body, false, 1, 2, "NOTE").unwrap();
        assert_eq!(rb.removed, 2);
        let v: serde_json::Value = serde_json::from_slice(&rb.body).unwrap();
        let msgs = v["messages"].as_array().unwrap();
        // system, user, turn 0 (+2 results), note, turn 3 (+2 results)
        assert_eq!(msgs.len(), 2 + 3 + 1 + 3);
        assert_eq!(msgs[5], json!({"role": "user", "content": "NOTE"}));
        assert_eq!(msgs[6]["tool_calls"][0]["id"], "c3a");
        assert_eq!(msgs[4]["tool_call_id"], "c0b");
        // Everything outside the cut is byte for byte what the client sent.
        let text = String::from_utf8(rb.body).unwrap();
        assert!(text.starts_with(r#"{"messages":[{"content":"You are a coder.","role":"system"}"#));
        assert!(text.ends_with(r#""tools":[{"function":{"name":"bash"},"type":"function"}]}"#));
    }

    #[test]
    fn the_tail_can_be_rolled_back_and_bad_ranges_refused() {
        let body = serde_json::to_vec(&chat_loop()).unwrap();
        let rb = roll_back(Dialect::OpenAiChat, &body, false, 2, 3, "NOTE").unwrap();
        let v: serde_json::Value = serde_json::from_slice(&rb.body).unwrap();
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(msgs.last().unwrap()["content"], "NOTE");
        assert_eq!(msgs.len(), 2 + 6 + 1);
        assert!(roll_back(Dialect::OpenAiChat, &body, false, 3, 4, "N").is_none());
        assert!(roll_back(Dialect::OpenAiChat, &body, false, 2, 1, "N").is_none());
        assert!(roll_back(Dialect::OpenAiChat, b"{oops", false, 0, 0, "N").is_none());
    }

    #[test]
    fn anthropic_tool_use_and_result_blocks_stay_paired() {
        let mut messages = vec![json!({"role": "user", "content": "Fix calc.py"})];
        for i in 0..3 {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "text", "text": "Running the tests."},
                {"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": {"command": "pytest"}}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": "Exit code 1\nFAILED", "is_error": true}]}));
        }
        let body =
            serde_json::to_vec(&json!({"model": "claude", "max_tokens": 5, "messages": messages}))
                .unwrap();
        let rb = roll_back(Dialect::Anthropic, &body, false, 0, 1, "NOTE").unwrap();
        let parsed = Dialect::Anthropic.parse_request(&rb.body, false).unwrap();
        assert_eq!(parsed.transcript.steps.len(), 1);
        let step = &parsed.transcript.steps[0];
        assert_eq!(step.calls[0].call.id, "toolu_2");
        assert!(
            step.calls[0].result.is_some(),
            "the kept call keeps its result"
        );
        let v: serde_json::Value = serde_json::from_slice(&rb.body).unwrap();
        assert_eq!(v["messages"][1]["content"][0]["text"], "NOTE");
    }

    #[test]
    fn tried_lists_commands_and_results() {
        let body = serde_json::to_vec(&chat_loop()).unwrap();
        let t = Dialect::OpenAiChat
            .parse_request(&body, false)
            .unwrap()
            .transcript;
        let text = tried(&t, 0, 3, 5);
        assert_eq!(
            text,
            "- bash(pytest) -> FAILED test_add\n- bash(cat calc.py) -> def add(a, b): return a - b\n- bash(pytest) -> FAILED test_add\n- bash(cat calc.py) -> def add(a, b): return a - b\n- bash(pytest) -> FAILED test_add\n- ... and 3 more"
        );
    }
}
