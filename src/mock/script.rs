//! The script a mock model plays: what to answer at each assistant turn, and how to deliver
//! it (delays, errors, broken connections). Loaded from JSON or built as a Rust value.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The script format, as `loopwarden mock --help` prints it (its example is checked to
/// parse, and every field to be named: the tests below).
pub const SCRIPT_HELP: &str = r#"Script file (--script, JSON; every key optional, unknown keys refused):

  turns               answers by turn: turn i answers a request whose history holds i
                      assistant turns. Each turn:
      text                the answer's text
      tool_calls          [{"name", "arguments": {...}}] function calls, or
                          [{"name", "input": "..."}] freeform (custom) calls; a JSON string
                          as "arguments" is sent verbatim (malformed arguments)
      error               {"status", "body", "headers", "times"}: answer an HTTP error
                          instead (the first `times` requests; for ever without it)
      then                the turn answered once the error's `times` are spent
      break_after_events  drop the connection after this many streamed events (0: before
                          the response head)
      hang                never answer
      force_json          answer JSON even when a stream was asked for
      usage               the token usage to report (estimated from sizes otherwise)
  after_end           past the last turn: "end_text" (default) or "repeat_last"
  end_text            the text answered past the script ("Done.")
  side_text           the answer to a side request (no tools: titles, summaries) ("OK")
  side_rules          [{"match": "substring of the body", "text": "..."}], checked first
  side_when_no_tools  treat requests without tool definitions as side requests (true)
  chunk_delay_ms      pause between two streamed events
  latency_ms          pause before the response head
  model               the model name to report (the request's by default)

Example (a loop: the same failing command, for ever):
{"turns": [{"text": "Running the tests.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "pytest -q"}}]}],
 "after_end": "repeat_last", "chunk_delay_ms": 20}
"#;

/// A whole script. Every field has a default, so `{}` is a valid (if dull) script.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Script {
    /// Turn `i` answers a request whose history holds `i` assistant turns.
    pub turns: Vec<Turn>,
    /// What to answer once the history is longer than `turns`.
    pub after_end: AfterEnd,
    /// The text answered after the script when `after_end` is `end_text`.
    pub end_text: String,
    /// The answer to a side request (a request without tools: title, router, summary...).
    pub side_text: String,
    /// Side answers picked by a substring of the request body, checked before everything else.
    pub side_rules: Vec<SideRule>,
    /// Treat requests without tool definitions as side requests (on by default).
    pub side_when_no_tools: bool,
    /// Pause between two streamed events, so a reader can see them arrive one by one.
    pub chunk_delay_ms: u64,
    /// Pause before the response head.
    pub latency_ms: u64,
    /// Model name to report; by default the request's model is echoed.
    pub model: Option<String>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            turns: Vec::new(),
            after_end: AfterEnd::EndText,
            end_text: "Done.".to_string(),
            side_text: "OK".to_string(),
            side_rules: Vec::new(),
            side_when_no_tools: true,
            chunk_delay_ms: 0,
            latency_ms: 0,
            model: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterEnd {
    RepeatLast,
    EndText,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SideRule {
    /// Substring of the raw request body.
    #[serde(rename = "match")]
    pub pattern: String,
    pub text: String,
}

/// One scripted assistant turn.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Turn {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// Answer with an HTTP error instead (possibly only the first `times` requests).
    pub error: Option<ErrorReply>,
    /// What to answer once the error budget is spent (default: this turn without its error).
    pub then: Option<Box<Turn>>,
    /// Send this many streamed events, then drop the connection without finishing the body.
    /// 0 drops the connection before any response head, for JSON answers too.
    pub break_after_events: Option<usize>,
    /// Never answer.
    pub hang: bool,
    /// Answer with a JSON body even when the request asked for a stream.
    pub force_json: bool,
    /// The usage to report (in each API's terms); by default estimated from the sizes.
    pub usage: Option<crate::budget::Usage>,
}

/// A tool call the model makes. `input` makes it a freeform (custom) tool call such as
/// Codex's `apply_patch`; otherwise `arguments` is the JSON arguments (a JSON string value is
/// sent verbatim as the arguments text, which lets a script send malformed arguments).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Option<Value>,
    pub input: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    pub status: u16,
    /// The error body; by default a message in the API's own error shape.
    #[serde(default)]
    pub body: Option<Value>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How many requests get the error; forever when absent.
    #[serde(default)]
    pub times: Option<u32>,
}

impl ToolCall {
    /// A function call with JSON arguments.
    pub fn function(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            name: name.to_string(),
            arguments: Some(arguments),
            input: None,
        }
    }

    /// A freeform (custom) tool call, e.g. Codex `apply_patch`.
    pub fn custom(name: &str, input: &str) -> ToolCall {
        ToolCall {
            name: name.to_string(),
            arguments: None,
            input: Some(input.to_string()),
        }
    }

    /// The arguments as JSON text, as the wire carries them.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Some(Value::String(raw)) => raw.clone(),
            Some(v) => v.to_string(),
            None => "{}".to_string(),
        }
    }
}

impl Turn {
    pub fn text(text: &str) -> Turn {
        Turn {
            text: Some(text.to_string()),
            ..Turn::default()
        }
    }

    pub fn calls(calls: Vec<ToolCall>) -> Turn {
        Turn {
            tool_calls: calls,
            ..Turn::default()
        }
    }
}

impl Script {
    pub fn from_json(text: &str) -> anyhow::Result<Script> {
        Ok(serde_json::from_str(text)?)
    }

    pub fn load(path: &std::path::Path) -> anyhow::Result<Script> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read script {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("bad script {}: {e}", path.display()))
    }

    pub fn with_turns(turns: Vec<Turn>) -> Script {
        Script {
            turns,
            ..Script::default()
        }
    }
}

/// What the mock decided to answer to one request.
#[derive(Debug, Clone)]
pub enum Choice {
    Side(String),
    Turn(Turn),
    Error(ErrorReply, Turn),
}

impl Choice {
    pub fn kind(&self) -> &'static str {
        match self {
            Choice::Side(_) => "side",
            Choice::Turn(_) => "turn",
            Choice::Error(..) => "error",
        }
    }
}

/// Counts the error answers already given, per turn index and `then` depth. This is the
/// mock's only state besides the request log.
#[derive(Debug, Default)]
pub struct ErrorBudgets(HashMap<(usize, usize), u32>);

impl Script {
    /// Picks the answer for a request with `turn_index` assistant turns in its history.
    pub fn choose(
        &self,
        turn_index: usize,
        body: &[u8],
        has_tools: bool,
        budgets: &mut ErrorBudgets,
    ) -> Choice {
        for rule in &self.side_rules {
            if !rule.pattern.is_empty() && contains(body, rule.pattern.as_bytes()) {
                return Choice::Side(rule.text.clone());
            }
        }
        if self.side_when_no_tools && !has_tools {
            return Choice::Side(self.side_text.clone());
        }
        let scripted = match self.turns.get(turn_index) {
            Some(turn) => Some(turn),
            None if self.after_end == AfterEnd::RepeatLast => self.turns.last(),
            None => None,
        };
        let Some(mut turn) = scripted.cloned() else {
            return Choice::Turn(Turn::text(&self.end_text));
        };
        let mut depth = 0;
        while let Some(error) = turn.error.take() {
            let used = budgets.0.entry((turn_index, depth)).or_insert(0);
            if error.times.is_none_or(|times| *used < times) {
                *used += 1;
                return Choice::Error(error, turn);
            }
            if let Some(next) = turn.then.take() {
                turn = *next;
            }
            depth += 1;
        }
        Choice::Turn(turn)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_budget_then_falls_through() {
        let script = Script::from_json(
            r#"{"turns":[{"text":"a"},{"error":{"status":429,"times":2},"then":{"text":"b"}}]}"#,
        )
        .unwrap();
        let mut budgets = ErrorBudgets::default();
        let kinds: Vec<_> = (0..4)
            .map(|_| match script.choose(1, b"", true, &mut budgets) {
                Choice::Turn(t) => t.text.unwrap_or_default(),
                other => other.kind().to_string(),
            })
            .collect();
        assert_eq!(kinds, ["error", "error", "b", "b"]);
    }

    #[test]
    fn side_and_after_end() {
        let mut script =
            Script::from_json(r#"{"turns":[{"text":"one"}],"end_text":"fin"}"#).unwrap();
        let mut b = ErrorBudgets::default();
        assert!(matches!(script.choose(0, b"", false, &mut b), Choice::Side(t) if t == "OK"));
        assert!(
            matches!(script.choose(5, b"", true, &mut b), Choice::Turn(t) if t.text.as_deref() == Some("fin"))
        );
        script.after_end = AfterEnd::RepeatLast;
        assert!(
            matches!(script.choose(5, b"", true, &mut b), Choice::Turn(t) if t.text.as_deref() == Some("one"))
        );
    }

    #[test]
    fn every_documented_field_parses() {
        let script = Script::from_json(
            r#"{"turns": [
                {"text": "t", "tool_calls": [{"name": "Read", "arguments": {"file_path": "x"}}]},
                {"tool_calls": [{"name": "apply_patch", "input": "*** Begin Patch"}]},
                {"error": {"status": 429, "body": {"e": 1}, "headers": {"retry-after": "1"}, "times": 2},
                 "then": {"text": "after"}},
                {"text": "cut", "break_after_events": 3},
                {"hang": true},
                {"text": "j", "force_json": true}],
              "after_end": "repeat_last", "end_text": "E", "side_text": "S",
              "side_rules": [{"match": "m", "text": "r"}], "side_when_no_tools": false,
              "chunk_delay_ms": 5, "latency_ms": 7, "model": "mm"}"#,
        )
        .unwrap();
        assert_eq!(script.turns.len(), 6);
        assert_eq!(
            script.turns[1].tool_calls[0].input.as_deref(),
            Some("*** Begin Patch")
        );
        assert_eq!(script.turns[2].error.as_ref().unwrap().times, Some(2));
        assert_eq!(script.turns[3].break_after_events, Some(3));
        assert!(script.turns[4].hang && script.turns[5].force_json);
        assert_eq!((script.chunk_delay_ms, script.latency_ms), (5, 7));
        assert_eq!(script.after_end, AfterEnd::RepeatLast);
    }

    #[test]
    fn unknown_field_is_rejected() {
        let err = Script::from_json(r#"{"turns":[{"txt":"typo"}]}"#).unwrap_err();
        assert!(err.to_string().contains("txt"), "{err}");
    }

    #[test]
    fn the_help_names_every_field_and_its_example_parses() {
        let example = SCRIPT_HELP
            .split_once("Example")
            .and_then(|(_, rest)| rest.split_once('\n'))
            .map(|(_, json)| json)
            .unwrap();
        let script = Script::from_json(example).unwrap();
        assert_eq!(script.after_end, AfterEnd::RepeatLast);
        assert_eq!(script.turns[0].tool_calls[0].name, "bash");
        let fields = |value: serde_json::Value| -> Vec<String> {
            value.as_object().unwrap().keys().cloned().collect()
        };
        let turn = Turn {
            error: Some(ErrorReply {
                status: 500,
                body: None,
                headers: BTreeMap::new(),
                times: None,
            }),
            ..Turn::default()
        };
        for field in fields(serde_json::to_value(Script::default()).unwrap())
            .into_iter()
            .chain(fields(serde_json::to_value(turn).unwrap()))
        {
            assert!(
                SCRIPT_HELP.contains(&format!("  {field} ")),
                "{field} undocumented"
            );
        }
    }
}
