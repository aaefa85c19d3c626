//! How many assistant turns a request's history holds: the mock's only way to know where it
//! is in its script, since it keeps no conversation state.
//!
//! A turn is a run of consecutive assistant entries (messages, Gemini `model` contents,
//! Responses output items). Clients do not always keep a turn in one piece (parallel calls
//! interleaved with their results) or keep the whole history, so the ids the mock mints carry
//! the turn index (`call_t3_0_…`); when an echoed entry carries such a tag it wins over the
//! run count.

use serde_json::Value;

use super::wire::Api;

/// Counts assistant turns in a parsed request body of the given API.
pub fn count_turns(api: Api, body: &Value) -> usize {
    match api {
        Api::Chat | Api::Anthropic => count_runs(body.get("messages"), "assistant", message_tag),
        Api::Gemini { .. } => count_runs(body.get("contents"), "model", gemini_tag),
        Api::Responses => count_runs(body.get("input"), "", responses_tag),
    }
}

/// Whether the request offers tools (a request without tools is a side request).
pub fn has_tools(api: Api, body: &Value) -> bool {
    let non_empty = |key: &str| {
        body.get(key)
            .is_some_and(|v| !v.is_null() && v != &Value::Array(vec![]))
    };
    match api {
        Api::Chat => non_empty("tools") || non_empty("functions"),
        _ => non_empty("tools"),
    }
}

fn count_runs(
    entries: Option<&Value>,
    assistant_role: &str,
    tag: fn(&Value) -> Option<usize>,
) -> usize {
    let Some(entries) = entries.and_then(Value::as_array) else {
        return 0;
    };
    let mut count = 0;
    let mut in_run = false;
    // Whether the current run has already been counted without a tag.
    let mut run_untagged_counted = false;
    for entry in entries {
        if !is_assistant(entry, assistant_role) {
            in_run = false;
            continue;
        }
        match tag(entry) {
            Some(t) => {
                if in_run && run_untagged_counted {
                    // The run's untagged head (e.g. a reasoning item) belongs to this turn.
                    count -= 1;
                    run_untagged_counted = false;
                }
                count = count.max(t + 1);
            }
            None if !in_run => {
                count += 1;
                run_untagged_counted = true;
            }
            None => {}
        }
        in_run = true;
    }
    count
}

fn is_assistant(entry: &Value, assistant_role: &str) -> bool {
    let role = entry.get("role").and_then(Value::as_str);
    if !assistant_role.is_empty() {
        return role == Some(assistant_role);
    }
    // Responses API items: assistant messages and everything the model emits.
    match entry.get("type").and_then(Value::as_str) {
        None | Some("message") => role == Some("assistant"),
        Some(t) => !t.ends_with("_output") && t != "item_reference",
    }
}

/// The turn index embedded in an id minted by the mock: `…_t<N>_<K>_…`.
pub fn tag_of(id: &str) -> Option<usize> {
    let mut rest = id;
    while let Some(pos) = rest.find("_t") {
        let after = &rest[pos + 2..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && after.as_bytes().get(digits) == Some(&b'_') {
            return after[..digits].parse().ok();
        }
        rest = after;
    }
    None
}

fn max_tag<'a>(ids: impl Iterator<Item = &'a str>) -> Option<usize> {
    ids.filter_map(tag_of).max()
}

fn message_tag(m: &Value) -> Option<usize> {
    let openai = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("id").and_then(Value::as_str));
    let anthropic = m
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b.get("id").and_then(Value::as_str));
    max_tag(openai.chain(anthropic))
}

fn gemini_tag(c: &Value) -> Option<usize> {
    let ids = c
        .get("parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("functionCall")?.get("id")?.as_str());
    max_tag(ids)
}

fn responses_tag(item: &Value) -> Option<usize> {
    let ids = ["call_id", "id"]
        .into_iter()
        .filter_map(|k| item.get(k).and_then(Value::as_str));
    max_tag(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tags() {
        assert_eq!(tag_of("call_t12_0_abc"), Some(12));
        assert_eq!(tag_of("toolu_01_tx"), None);
        assert_eq!(tag_of("fc_t_3"), None);
    }

    #[test]
    fn chat_runs_and_tags() {
        let body = json!({"messages":[
            {"role":"system","content":"s"},{"role":"user","content":"u"},
            {"role":"assistant","tool_calls":[{"id":"call_t0_0_x"}]},{"role":"tool","content":"r"},
            {"role":"assistant","tool_calls":[{"id":"call_t1_0_x"}]},{"role":"tool","content":"r"},
            {"role":"assistant","tool_calls":[{"id":"call_t1_1_x"}]},{"role":"tool","content":"r"},
            {"role":"assistant","content":"untagged text"},{"role":"user","content":"go on"}
        ]});
        assert_eq!(count_turns(Api::Chat, &body), 3);
    }

    #[test]
    fn dropped_history_keeps_the_count() {
        let body = json!({"messages":[{"role":"user","content":"u"},
            {"role":"assistant","content":[{"type":"tool_use","id":"toolu_t5_0_x"}]}]});
        assert_eq!(count_turns(Api::Anthropic, &body), 6);
    }

    #[test]
    fn responses_items() {
        let body = json!({"input":[
            {"type":"message","role":"developer","content":"d"},
            {"type":"message","role":"user","content":"u"},
            {"type":"reasoning","id":"rs_1"},
            {"type":"function_call","id":"fc_t0_0_a","call_id":"call_t0_0_a"},
            {"type":"function_call","id":"fc_t0_1_a","call_id":"call_t0_1_a"},
            {"type":"function_call_output","call_id":"call_t0_0_a"},
            {"type":"function_call_output","call_id":"call_t0_1_a"},
            {"type":"custom_tool_call","id":"ctc_t1_0_a","call_id":"call_t1_0_a"},
            {"type":"custom_tool_call_output","call_id":"call_t1_0_a"},
            {"type":"message","role":"assistant","content":[]}
        ]});
        assert_eq!(count_turns(Api::Responses, &body), 3);
    }

    #[test]
    fn gemini_contents() {
        let body = json!({"contents":[{"role":"user","parts":[{"text":"u"}]},
            {"role":"model","parts":[{"functionCall":{"name":"f","args":{}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"f","response":{}}}]},
            {"role":"model","parts":[{"text":"t"}]}]});
        assert_eq!(
            count_turns(
                Api::Gemini {
                    stream: false,
                    sse: false
                },
                &body
            ),
            2
        );
        assert!(!has_tools(
            Api::Gemini {
                stream: false,
                sse: false
            },
            &body
        ));
    }
}
