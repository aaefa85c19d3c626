//! The words of an intervention: the reminder appended for a nudge or a replan, and the
//! text of a halt. Each is a configurable template with a few placeholders, filled from
//! the decision and the conversation, so users can change the tone without code.
//!
//! Placeholders: `{finding}` (the leading finding's one-line summary), `{suggestion}` (what
//! the detector says to do instead), `{goal}` (the task in one line), `{reason}` (the
//! decision's reason), `{conversation}` (the conversation id, for resume instructions).

use crate::detect::Decision;
use crate::transcript::Transcript;

/// Default reminder for a nudge.
pub const NUDGE: &str = "[loopwarden] You seem to be going in circles: {finding}.\n\
Your goal: {goal}\n\
Instead: {suggestion}";

/// Default reminder for a replan: the stronger nudge that comes after a nudge did not help.
pub const REPLAN: &str = "[loopwarden] You are still repeating yourself: {finding}.\n\
Your goal: {goal}\n\
Stop and replan before the next action: write a short summary of what you have tried so \
far and why it did not work, then pick a different approach from the ones you tried. {suggestion}";

/// Default reminder when a run nears one of its budget's caps (`budget.warn_at`).
pub const WRAP_UP: &str = "[loopwarden] This run is close to its budget: {reason}. \
Wrap up now: finish or drop the step you are on, then write a short summary of what is \
done, what is left and how to check it, and stop.";

/// Default text of a halt reply when the run was going in circles.
pub const HALT: &str = "[loopwarden] I stopped this run: {reason}. \
It was going in circles, so a human should look at it before it continues. To resume, send a new message in this \
conversation, or release it with POST /admin/api/conversations/{conversation}/resume on loopwarden.";

/// Default text of a halt reply when a hard budget was spent.
pub const BUDGET_HALT: &str = "[loopwarden] I stopped this run because its budget is spent: \
{reason}. A human should decide whether it goes on. To resume, send a new message in this \
conversation, or release it with POST /admin/api/conversations/{conversation}/resume on loopwarden.";

/// Default text of a halt reply when an operator stopped the run.
pub const OPERATOR_HALT: &str = "[loopwarden] An operator stopped this run: {reason}. \
To resume, send a new message in this conversation, or ask the operator to release it \
(POST /admin/api/conversations/{conversation}/resume on loopwarden).";

/// Default note that replaces the turns removed by a rollback.
pub const ROLLBACK: &str = "[loopwarden] {count} earlier turns were removed from this \
conversation because they repeated without progress ({finding}). What was tried there:\n\
{tried}\n\
Your goal: {goal}\n\
Do not repeat those steps; pick a different approach.";

/// The values the placeholders stand for.
#[derive(Debug, Clone, Default)]
pub struct Fill<'a> {
    pub finding: &'a str,
    pub suggestion: &'a str,
    pub goal: &'a str,
    pub reason: &'a str,
    pub conversation: &'a str,
    /// Rollback only: how many turns were removed and what they did.
    pub count: usize,
    pub tried: &'a str,
}

impl<'a> Fill<'a> {
    /// The values of a decision about a conversation whose task reads `goal`. The finding
    /// is the one that led the decision, which the log records with it.
    pub fn of(decision: &'a Decision, goal: &'a str, conversation: &'a str) -> Fill<'a> {
        let lead = decision.lead();
        let finding = lead
            .map(|f| f.summary.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(decision.reason.as_str());
        Fill {
            finding: trim_end_punct(finding),
            suggestion: lead.map(|f| f.suggestion.as_str()).unwrap_or(""),
            goal,
            reason: trim_end_punct(if decision.reason.is_empty() {
                finding
            } else {
                decision.reason.as_str()
            }),
            conversation,
            count: 0,
            tried: "",
        }
    }
}

/// Fills a template. Unknown `{names}` are left as they are, so a typo shows in the output
/// instead of failing a request.
pub fn render(template: &str, fill: &Fill<'_>) -> String {
    let suggestion = if fill.suggestion.is_empty() {
        "try a different approach than the one that keeps failing."
    } else {
        fill.suggestion
    };
    let goal = if fill.goal.is_empty() {
        "(the task you were given)"
    } else {
        fill.goal
    };
    let count = fill.count.to_string();
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let value = match &after[..close] {
            "finding" => Some(fill.finding),
            "suggestion" => Some(suggestion),
            "goal" => Some(goal),
            "reason" => Some(fill.reason),
            "conversation" => Some(fill.conversation),
            "count" => Some(count.as_str()),
            "tried" => Some(fill.tried),
            _ => None,
        };
        match value {
            Some(v) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn trim_end_punct(s: &str) -> &str {
    s.trim().trim_end_matches(['.', ' '])
}

/// The task in one line: the first user message before any assistant turn that is not a
/// scaffold's context block (`<environment_context>`, `<session_context>`,
/// `<system-reminder>`...), first non-empty line, quotes removed (opencode quotes the
/// prompt), cut to 200 characters.
pub fn goal_line(transcript: &Transcript) -> String {
    for message in &transcript.task {
        let text = strip_tag_blocks(message);
        if let Some(line) = text.lines().map(str::trim).find(|l| !l.is_empty()) {
            let line = line.trim_matches(|c| c == '"' || c == '\\').trim();
            if line.is_empty() {
                continue;
            }
            return cut(line, 200);
        }
    }
    String::new()
}

/// `text` without `<tag>…</tag>` blocks that start a line (the context blocks scaffolds put
/// around or before the real prompt).
fn strip_tag_blocks(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start();
        if let Some(after) = trimmed.strip_prefix('<') {
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                .collect();
            if !name.is_empty() {
                let close = format!("</{name}>");
                if let Some(end) = trimmed.find(&close) {
                    rest = &trimmed[end + close.len()..];
                    continue;
                }
            }
        }
        match trimmed.find('\n') {
            Some(nl) => {
                out.push_str(&trimmed[..=nl]);
                rest = &trimmed[nl + 1..];
            }
            None => {
                out.push_str(trimmed);
                return out;
            }
        }
    }
}

/// `s` cut to at most `max` characters, with `...` when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(3)).collect();
    out.push_str("...");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_and_unknown_ones_kept() {
        let fill = Fill {
            finding: "the same test failed 4 times",
            goal: "fix calc.py",
            conversation: "c1",
            ..Fill::default()
        };
        let text = render(
            "{finding} / {goal} / {suggestion} / {nope} / {conversation}",
            &fill,
        );
        assert_eq!(
            text,
            "the same test failed 4 times / fix calc.py / try a different approach than the one that keeps failing. / {nope} / c1"
        );
        assert_eq!(render("open { only", &fill), "open { only");
    }

    #[test]
    fn goal_skips_context_blocks_and_quotes() {
        let t = Transcript {
            task: vec![
                "<environment_context>\n  <cwd>/tmp</cwd>\n</environment_context>".into(),
                "<system-reminder>git status: clean</system-reminder>\n\"Fix the failing test in calc.py\"\nMore detail".into(),
            ],
            ..Transcript::default()
        };
        assert_eq!(goal_line(&t), "Fix the failing test in calc.py");
        assert_eq!(goal_line(&Transcript::default()), "");
    }
}
