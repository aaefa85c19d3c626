//! Agent profiles: how to stop a given agent. Most agents stop after one plain text reply;
//! some reject a reply without a tool call (mini-swe-agent treats it as a format error,
//! re-prompts, and never stops cleanly), so their halt is a tool call that ends the run.
//!
//! A profile matches on what the request shows: the user-agent, the exact set of tools
//! offered, or the conversation id. The first matching profile wins; none means a text halt.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::dialect::{Dialect, HaltToolCall};

/// How one kind of agent is halted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentProfile {
    /// A name for the log.
    pub name: String,
    /// Matches when the user-agent contains any of these (empty: any user-agent).
    pub user_agent: Vec<String>,
    /// Matches when the request offers exactly these tools, in any order (empty: any tools).
    pub tools: Vec<String>,
    /// Matches when the conversation id starts with this (e.g. a `/c/{id}` path prefix).
    pub conversation_prefix: String,
    /// The tool the halt calls; empty means a text-only halt.
    pub halt_tool: String,
    /// The arguments of that call. In their strings, `{text}` stands for the halt text and
    /// `{text_sh}` for the same text quoted for a POSIX shell.
    pub halt_arguments: serde_json::Value,
}

impl Default for AgentProfile {
    fn default() -> Self {
        AgentProfile {
            name: String::new(),
            user_agent: Vec::new(),
            tools: Vec::new(),
            conversation_prefix: String::new(),
            halt_tool: String::new(),
            halt_arguments: serde_json::Value::Object(Default::default()),
        }
    }
}

/// The built-in profiles: mini-swe-agent (openai-python or litellm, one `bash` tool), whose
/// clean stop is running its submit command.
pub fn builtin() -> Vec<AgentProfile> {
    vec![AgentProfile {
        name: "mini-swe-agent".into(),
        user_agent: vec!["OpenAI/Python".into(), "litellm".into()],
        tools: vec!["bash".into()],
        halt_tool: "bash".into(),
        // Its submit command; what it prints after the marker line is the run's final
        // output, so the halt text is echoed there for the human.
        halt_arguments: serde_json::json!({
            "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo {text_sh}"
        }),
        ..AgentProfile::default()
    }]
}

/// What a profile is matched against.
pub struct Seen<'a> {
    pub user_agent: &'a str,
    pub conversation: &'a str,
    pub dialect: Dialect,
    pub body: &'a [u8],
}

/// The first profile that matches, if any.
pub fn matching<'p>(profiles: &'p [AgentProfile], seen: &Seen<'_>) -> Option<&'p AgentProfile> {
    // The tool list is read only when a profile asks for it, and only once.
    let mut tools: Option<Vec<String>> = None;
    profiles.iter().find(|p| {
        if !p.user_agent.is_empty()
            && !p
                .user_agent
                .iter()
                .any(|u| seen.user_agent.contains(u.as_str()))
        {
            return false;
        }
        if !p.conversation_prefix.is_empty()
            && !seen.conversation.starts_with(&p.conversation_prefix)
        {
            return false;
        }
        if !p.tools.is_empty() {
            let offered = tools.get_or_insert_with(|| tool_names(seen.dialect, seen.body));
            let mut want: Vec<&str> = p.tools.iter().map(String::as_str).collect();
            let mut have: Vec<&str> = offered.iter().map(String::as_str).collect();
            want.sort_unstable();
            have.sort_unstable();
            if want != have {
                return false;
            }
        }
        true
    })
}

impl AgentProfile {
    /// The tool call of this profile's halt, if it halts with one, saying `text`.
    pub fn halt_call(&self, text: &str) -> Option<HaltToolCall> {
        if self.halt_tool.is_empty() {
            return None;
        }
        let quoted = shell_quote(text);
        let mut arguments = self.halt_arguments.clone();
        fill_strings(&mut arguments, &|s| {
            s.replace("{text_sh}", &quoted).replace("{text}", text)
        });
        Some(HaltToolCall {
            name: self.halt_tool.clone(),
            arguments,
        })
    }
}

/// Applies `f` to every string inside a JSON value.
fn fill_strings(v: &mut serde_json::Value, f: &dyn Fn(&str) -> String) {
    match v {
        serde_json::Value::String(s) => *s = f(s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(|v| fill_strings(v, f)),
        serde_json::Value::Object(o) => o.values_mut().for_each(|v| fill_strings(v, f)),
        _ => {}
    }
}

/// `s` as one single-quoted POSIX shell word (newlines become spaces: the text is echoed).
fn shell_quote(s: &str) -> String {
    let flat = s.replace(['\n', '\r'], " ");
    format!("'{}'", flat.replace('\'', "'\\''"))
}

impl AgentProfile {
    /// Whether this profile halts with a tool call.
    pub fn calls_a_tool(&self) -> bool {
        !self.halt_tool.is_empty()
    }
}

#[derive(Deserialize)]
struct Tools<'a> {
    #[serde(borrow, default)]
    tools: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct Tool<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<Named<'a>>,
    #[serde(borrow, default, rename = "functionDeclarations")]
    function_declarations: Option<Vec<Named<'a>>>,
}

#[derive(Deserialize)]
struct Named<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
}

/// The names of the tools a request offers, whatever the API's shape (`tools[].name`,
/// Chat's `tools[].function.name`, Gemini's `tools[].functionDeclarations[].name`).
pub fn tool_names(dialect: Dialect, body: &[u8]) -> Vec<String> {
    let _ = dialect; // the shapes do not overlap, so one reader serves all four
    let Ok(Tools { tools: Some(tools) }) = serde_json::from_slice::<Tools>(body) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for raw in tools {
        let Ok(tool) = serde_json::from_str::<Tool>(raw.get()) else {
            continue;
        };
        if let Some(decls) = tool.function_declarations {
            names.extend(
                decls
                    .into_iter()
                    .filter_map(|d| d.name.map(Cow::into_owned)),
            );
        } else if let Some(name) = tool.function.and_then(|f| f.name).or(tool.name) {
            names.push(name.into_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen<'a>(ua: &'a str, body: &'a [u8]) -> Seen<'a> {
        Seen {
            user_agent: ua,
            conversation: "abc",
            dialect: Dialect::OpenAiChat,
            body,
        }
    }

    #[test]
    fn mini_swe_agent_is_recognized_by_its_lone_bash_tool_and_client() {
        let profiles = builtin();
        let mini = br#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"bash","parameters":{}}}]}"#;
        let p = matching(&profiles, &seen("OpenAI/Python 2.54.0", mini)).unwrap();
        let call = p.halt_call("stuck: it's looping").unwrap();
        assert_eq!(call.name, "bash");
        assert_eq!(
            call.arguments["command"],
            r#"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo 'stuck: it'\''s looping'"#
        );
        assert!(matching(&profiles, &seen("litellm/1.106.2", mini)).is_some());
        // opencode also has a bash tool, but more of them and another client
        let opencode = br#"{"tools":[{"type":"function","function":{"name":"bash"}},{"type":"function","function":{"name":"read"}}]}"#;
        assert!(matching(&profiles, &seen("OpenAI/Python 2.54.0", opencode)).is_none());
        assert!(matching(&profiles, &seen("opencode/1.18.33", mini)).is_none());
    }

    #[test]
    fn tool_names_of_every_shape() {
        let gemini = br#"{"tools":[{"functionDeclarations":[{"name":"read_file"},{"name":"run_shell_command"}]}]}"#;
        assert_eq!(
            tool_names(Dialect::Gemini, gemini),
            vec!["read_file", "run_shell_command"]
        );
        let anthropic = br#"{"tools":[{"name":"Bash","input_schema":{}},{"type":"custom","name":"apply_patch"}]}"#;
        assert_eq!(
            tool_names(Dialect::Anthropic, anthropic),
            vec!["Bash", "apply_patch"]
        );
        assert!(tool_names(Dialect::Anthropic, b"not json").is_empty());
    }
}
