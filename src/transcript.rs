//! The normalized model of a conversation, shared by every wire format.
//!
//! A dialect (see `crate::dialect`) turns a request body into a flat list of
//! [`Item`]s in the order the client sent them; [`Transcript::from_items`] then groups
//! them into [`Step`]s, one per assistant turn, pairing each tool call with its result
//! by call id. Detection reads only this model, so it is the same in the proxy, in
//! `loopwarden replay` and in tests.

use serde::{Deserialize, Serialize};

/// One message-level element of a conversation, in wire order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Item {
    /// System or developer instructions (wherever they appear in the history).
    System { text: String },
    /// A user message that is not a tool result. `text` is its text content joined.
    User { text: String },
    /// One assistant turn: its text and the tool calls it made.
    Assistant { text: String, calls: Vec<ToolCall> },
    /// A piece of an assistant turn that the wire spreads over several items (OpenAI
    /// Responses: a turn is a run of `message`/`function_call`/`custom_tool_call` items).
    /// It joins the turn of the item just before it when that was assistant output,
    /// and starts a new turn otherwise.
    AssistantPart { text: String, calls: Vec<ToolCall> },
    /// The result of an earlier tool call.
    ToolResult(ToolResult),
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id the wire format uses to pair the call with its result (may be empty).
    pub id: String,
    pub name: String,
    /// Arguments in canonical form: a JSON value whose objects have sorted keys
    /// (serde_json's default map is ordered), so key order never matters.
    /// Freeform tools (Codex `apply_patch`) carry their input as a JSON string.
    pub args: serde_json::Value,
}

impl ToolCall {
    /// The canonical argument text: compact JSON with sorted keys.
    pub fn canonical_args(&self) -> String {
        // Written into a `Vec` directly: `Value`'s `Display` (`to_string`) writes the same
        // text through a formatter adapter at about twice the cost.
        serde_json::to_string(&self.args).unwrap_or_default()
    }

    /// blake3 hash of name + `\0` + canonical arguments: two calls are the same call exactly
    /// when their hashes are equal. The log stores it (`tool_calls.args_hash`), so its value
    /// must not change between versions.
    pub fn hash(&self) -> [u8; 32] {
        // One buffer and one call of blake3's one-shot hash (the same bytes, so the same
        // value as hashing the three pieces in turn, at a fraction of the cost).
        let mut input = Vec::with_capacity(self.name.len() + 128);
        input.extend_from_slice(self.name.as_bytes());
        input.push(0);
        // Writing a `Value` cannot fail: its keys are strings.
        let _ = serde_json::to_writer(&mut input, &self.args);
        *blake3::hash(&input).as_bytes()
    }
}

/// The result of a tool call, as the client reported it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers (may be empty when the wire has none; the
    /// result is then paired with the oldest unanswered call of the same name, or in order).
    pub call_id: String,
    /// Tool name when the wire carries it (Gemini `functionResponse.name`), else empty.
    pub name: String,
    /// The result's text content (blocks joined with newlines).
    pub text: String,
    /// `Some(true)` when the wire flags an error (`is_error`, Gemini `response.error`).
    pub is_error: Option<bool>,
}

/// One assistant turn with the results of its calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// 0-based index of the assistant turn in the conversation.
    pub index: usize,
    /// The assistant's text in this turn.
    pub text: String,
    /// Calls made in this turn, each with its result when the history has one.
    pub calls: Vec<CallWithResult>,
    /// User messages (not tool results) that came after this step and before the next
    /// assistant turn: a human (or the scaffold) spoke.
    pub user_after: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallWithResult {
    pub call: ToolCall,
    pub result: Option<ToolResult>,
}

/// A whole conversation as detection sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// System/developer text in order of appearance.
    pub system: Vec<String>,
    /// User messages before the first assistant turn (the task).
    pub task: Vec<String>,
    /// One step per assistant turn, in order.
    pub steps: Vec<Step>,
}

/// What a transcript holds before its first step: the instructions and the task. The log
/// keeps it beside the steps' content (`log.content`), so that `loopwarden replay` can
/// rebuild the transcript ([`Head::with_steps`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Head {
    pub system: Vec<String>,
    pub task: Vec<String>,
}

impl Head {
    /// The transcript of this head and these steps (in order, indexed from 0).
    pub fn with_steps(self, steps: Vec<Step>) -> Transcript {
        Transcript {
            system: self.system,
            task: self.task,
            steps,
        }
    }
}

impl Transcript {
    /// A copy of its head (everything but the steps).
    pub fn head(&self) -> Head {
        Head {
            system: self.system.clone(),
            task: self.task.clone(),
        }
    }

    /// Groups wire-ordered items into steps, pairing results with calls by id.
    pub fn from_items(items: impl IntoIterator<Item = Item>) -> Transcript {
        let mut t = Transcript::default();
        t.extend_items(items, false);
        t
    }

    /// Groups more items after the ones this transcript was built from, with the same
    /// result as [`Transcript::from_items`] over all of them (a later request of a
    /// conversation carries the earlier items unchanged, plus new ones). `after_assistant`:
    /// the last item grouped so far was assistant output, which an `AssistantPart` continues.
    ///
    /// Returns how many of the steps it started with it left as they were (the steps before
    /// the first one a new item changed: a result paired with an earlier call, a user
    /// message or an assistant part added to the last step). A caller that knows what was
    /// concluded from those steps can keep it without looking at them again.
    pub fn extend_items(
        &mut self,
        items: impl IntoIterator<Item = Item>,
        after_assistant: bool,
    ) -> usize {
        let t = self;
        let mut untouched = t.steps.len();
        // Whether the previous item was assistant output, so an `AssistantPart` continues it.
        let mut in_assistant_turn = after_assistant;
        for item in items {
            let is_assistant = matches!(item, Item::Assistant { .. } | Item::AssistantPart { .. });
            // The step a user message or an assistant part goes to, when there is one.
            let last = t.steps.len().saturating_sub(1);
            match item {
                Item::System { text } => t.system.push(text),
                Item::User { text } => match t.steps.last_mut() {
                    Some(step) => {
                        step.user_after.push(text);
                        untouched = untouched.min(last);
                    }
                    None => t.task.push(text),
                },
                Item::Assistant { text, calls } => t.push_step(text, calls),
                Item::AssistantPart { text, calls } => match t.steps.last_mut() {
                    Some(step) if in_assistant_turn => {
                        untouched = untouched.min(last);
                        if !text.is_empty() {
                            if !step.text.is_empty() {
                                step.text.push('\n');
                            }
                            step.text.push_str(&text);
                        }
                        step.calls.extend(
                            calls
                                .into_iter()
                                .map(|call| CallWithResult { call, result: None }),
                        );
                    }
                    _ => t.push_step(text, calls),
                },
                Item::ToolResult(result) => {
                    if let Some(step) = t.attach_result(result) {
                        untouched = untouched.min(step);
                    }
                }
            }
            in_assistant_turn = is_assistant;
        }
        untouched
    }

    fn push_step(&mut self, text: String, calls: Vec<ToolCall>) {
        let index = self.steps.len();
        self.steps.push(Step {
            index,
            text,
            calls: calls
                .into_iter()
                .map(|call| CallWithResult { call, result: None })
                .collect(),
            user_after: Vec::new(),
        });
    }

    /// Pairs a result with its call: by id first (searching backwards, since results
    /// follow their calls closely), else with the oldest unanswered call (same name if
    /// the result carries one). A result with no call to pair with is dropped: it tells
    /// detection nothing it could act on. Returns the index of the step it changed.
    fn attach_result(&mut self, result: ToolResult) -> Option<usize> {
        if !result.call_id.is_empty() {
            for (i, step) in self.steps.iter_mut().enumerate().rev() {
                if let Some(slot) = step
                    .calls
                    .iter_mut()
                    .find(|c| c.call.id == result.call_id && c.result.is_none())
                {
                    slot.result = Some(result);
                    return Some(i);
                }
            }
        }
        for (i, step) in self.steps.iter_mut().enumerate() {
            if let Some(slot) = step.calls.iter_mut().find(|c| {
                c.result.is_none() && (result.name.is_empty() || c.call.name == result.name)
            }) {
                slot.result = Some(result);
                return Some(i);
            }
        }
        None
    }

    /// The first user message: the task, used for goal drift and identity.
    pub fn goal(&self) -> &str {
        self.task.first().map(String::as_str).unwrap_or("")
    }
}

/// Turns a JSON value into canonical form. serde_json without `preserve_order` keeps
/// object keys sorted, so a parse/serialize round trip is enough; a string that itself
/// holds JSON (OpenAI `arguments`) is parsed first so that key order inside it never
/// matters either.
pub fn canonical_args_from_str(raw: &str) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(v) => v,
        Err(_) => serde_json::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extending_gives_what_building_from_all_items_gives() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "bash".into(),
            args: serde_json::json!({"command": id}),
        };
        let result = |id: &str| {
            Item::ToolResult(ToolResult {
                call_id: id.into(),
                name: String::new(),
                text: format!("out {id}"),
                is_error: None,
            })
        };
        let items = vec![
            Item::System { text: "sys".into() },
            Item::User {
                text: "task".into(),
            },
            Item::Assistant {
                text: "a".into(),
                calls: vec![call("1")],
            },
            Item::AssistantPart {
                text: "b".into(),
                calls: vec![call("2")],
            },
            result("1"),
            result("2"),
            Item::User {
                text: "more".into(),
            },
            Item::AssistantPart {
                text: "c".into(),
                calls: vec![call("3")],
            },
            Item::AssistantPart {
                text: "d".into(),
                calls: vec![],
            },
            result("3"),
            // A result that answers a call of a step before the last one.
            Item::Assistant {
                text: "e".into(),
                calls: vec![call("4")],
            },
            Item::Assistant {
                text: "f".into(),
                calls: vec![],
            },
            result("4"),
        ];
        let whole = Transcript::from_items(items.clone());
        for split in 0..=items.len() {
            let after_assistant = split > 0
                && matches!(
                    items[split - 1],
                    Item::Assistant { .. } | Item::AssistantPart { .. }
                );
            let mut t = Transcript::from_items(items[..split].to_vec());
            let before = t.steps.clone();
            let untouched = t.extend_items(items[split..].to_vec(), after_assistant);
            assert_eq!(t, whole, "split at {split}");
            // Every change an item makes to a step is a real change, so what it reports is
            // exactly how many leading steps are still what they were.
            let same = before
                .iter()
                .zip(&t.steps)
                .take_while(|(b, a)| b == a)
                .count();
            assert_eq!(untouched, same, "split at {split}");
        }
    }

    #[test]
    fn key_order_does_not_change_the_call_hash() {
        let a = ToolCall {
            id: "1".into(),
            name: "Read".into(),
            args: canonical_args_from_str(r#"{"file_path":"/a","limit":5}"#),
        };
        let b = ToolCall {
            id: "2".into(),
            name: "Read".into(),
            args: canonical_args_from_str(r#"{"limit":5, "file_path":"/a"}"#),
        };
        assert_eq!(a.hash(), b.hash());
        let c = ToolCall {
            args: canonical_args_from_str(r#"{"limit":6, "file_path":"/a"}"#),
            ..b
        };
        assert_ne!(a.hash(), c.hash());
    }

    #[test]
    fn the_call_hash_is_blake3_of_name_nul_and_compact_arguments() {
        // Logged hashes (`tool_calls.args_hash`) are compared across versions: pin the input.
        let call = ToolCall {
            id: "1".into(),
            name: "bash".into(),
            args: canonical_args_from_str(r#"{"z": [1, 2.5, null], "command": "ls \"a b\"\n"}"#),
        };
        assert_eq!(call.canonical_args(), call.args.to_string());
        assert_eq!(
            call.canonical_args(),
            r#"{"command":"ls \"a b\"\n","z":[1,2.5,null]}"#
        );
        let expected = blake3::hash(
            &[
                b"bash\0".as_slice(),
                br#"{"command":"ls \"a b\"\n","z":[1,2.5,null]}"#,
            ]
            .concat(),
        );
        assert_eq!(call.hash(), *expected.as_bytes());
    }

    #[test]
    fn results_pair_by_id_then_by_order() {
        let call = |id: &str, name: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            args: serde_json::json!({}),
        };
        let res = |id: &str, text: &str| {
            Item::ToolResult(ToolResult {
                call_id: id.into(),
                name: String::new(),
                text: text.into(),
                is_error: None,
            })
        };
        let t = Transcript::from_items(vec![
            Item::System { text: "sys".into() },
            Item::User {
                text: "fix it".into(),
            },
            Item::Assistant {
                text: "two at once".into(),
                calls: vec![call("a", "Read"), call("b", "Bash")],
            },
            res("b", "bash out"),
            res("a", "read out"),
            Item::Assistant {
                text: String::new(),
                calls: vec![call("", "bash")],
            },
            res("", "unpaired by id"),
            Item::User {
                text: "continue".into(),
            },
            Item::AssistantPart {
                text: "responses turn".into(),
                calls: vec![call("c", "exec_command")],
            },
            Item::AssistantPart {
                text: String::new(),
                calls: vec![call("d", "apply_patch")],
            },
            res("c", "out c"),
        ]);
        assert_eq!(t.goal(), "fix it");
        assert_eq!(
            t.steps[0].calls[0].result.as_ref().unwrap().text,
            "read out"
        );
        assert_eq!(
            t.steps[0].calls[1].result.as_ref().unwrap().text,
            "bash out"
        );
        assert_eq!(
            t.steps[1].calls[0].result.as_ref().unwrap().text,
            "unpaired by id"
        );
        assert_eq!(t.steps[1].user_after, vec!["continue".to_string()]);
        assert_eq!(t.steps.len(), 3, "consecutive parts form one turn");
        assert_eq!(t.steps[2].calls.len(), 2);
        assert_eq!(t.steps[2].calls[0].result.as_ref().unwrap().text, "out c");
    }
}
