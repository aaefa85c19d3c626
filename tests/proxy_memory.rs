//! What the proxy remembers between a conversation's requests (`proxy::memory`), through
//! the real proxy over loopback sockets: it never changes a decision, and it is bounded by
//! bytes.

mod intervene_support;

use intervene_support::*;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use serde_json::{json, Value};

/// `body` (a chat loop) with the tool calls of the steps in `middle` replaced by edits that
/// each change the file: the same number of steps, the same first and last step.
fn edited_in_the_middle(mut body: Value, middle: std::ops::Range<usize>) -> Value {
    let messages = body["messages"].as_array_mut().unwrap();
    for i in middle {
        let (call, result) = (2 + 2 * i, 3 + 2 * i);
        let command = format!("sed -i 's/a - b/a + b{i}/' calc.py");
        messages[call]["tool_calls"][0]["function"]["arguments"] =
            json!(json!({ "command": command }).to_string());
        messages[result]["content"] = json!(format!("edited line {i}"));
    }
    body
}

#[tokio::test]
async fn a_body_decides_the_same_in_a_remembered_conversation_and_a_new_one() {
    let dialect = Dialect::OpenAiChat;
    let setup = Setup::start(looping_script(dialect), |_| {}).await;
    // A loop the engine nudges (not yet halts: a halt would be sticky for the id).
    let k = first_k(dialect, Action::Nudge);
    for n in 1..=k {
        let resp = setup
            .post(
                &path(dialect, "warm", false),
                &loop_body(dialect, n, false, None),
            )
            .await;
        assert!(resp.status().is_success());
        resp.bytes().await.unwrap();
    }
    let looping = decide(dialect, &loop_body(dialect, k, false, None));
    assert_eq!(looping, Action::Nudge);

    // The same number of steps, the same first and last one, new work in between: not the
    // loop any more, whichever conversation it arrives in.
    let edited = edited_in_the_middle(loop_body(dialect, k, false, None), 1..k - 1);
    let cold = decide(dialect, &edited);
    assert_ne!(
        cold, looping,
        "the edit must change the decision for the test to tell"
    );
    for conversation in ["warm", "cold"] {
        let resp = setup
            .post(&path(dialect, conversation, false), &edited)
            .await;
        let decision = header(&resp, "x-loopwarden-decision");
        assert_eq!(
            decision,
            format!("{cold:?}").to_lowercase(),
            "{conversation}: the edited history decided as from scratch"
        );
    }
}

/// A chat request of its own task, with a tool output of about `size` bytes.
fn sized_request(task: &str, size: usize) -> Value {
    json!({"model": "gpt-test", "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_0", "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\":\"cat big.txt\"}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "x".repeat(size)},
    ]})
}

#[tokio::test]
async fn conversations_are_held_within_their_byte_bound_least_recently_used_first() {
    let dialect = Dialect::OpenAiChat;
    const BOUND: usize = 256 << 10;
    let setup = Setup::start(looping_script(dialect), |c| {
        c.cache.conversation_max_bytes = BOUND;
    })
    .await;
    // Twelve conversations of ~40 KB: each is charged about twice that, so the bound holds
    // about three.
    for i in 0..12 {
        let resp = setup
            .post(
                &path(dialect, &format!("c{i}"), false),
                &sized_request(&format!("task {i}"), 40_000),
            )
            .await;
        assert!(resp.status().is_success());
        resp.bytes().await.unwrap();
        let (_, stats) = setup.admin("/admin/api/stats", None).await;
        let held = stats["conversation_bytes"].as_u64().unwrap() as usize;
        assert!(held <= BOUND, "request {i}: {stats}");
    }
    let (_, stats) = setup.admin("/admin/api/stats", None).await;
    let live = stats["live_conversations"].as_u64().unwrap();
    assert!((1..12).contains(&live), "{stats}");
    assert!(stats["conversation_bytes"].as_u64().unwrap() > 0, "{stats}");

    // A forgotten conversation is read again from its whole history, and decided as from
    // scratch.
    let k = first_k(dialect, Action::Nudge);
    let resp = setup
        .post(
            &path(dialect, "c0", false),
            &loop_body(dialect, k, false, None),
        )
        .await;
    assert_eq!(header(&resp, "x-loopwarden-decision"), "nudge");
}
