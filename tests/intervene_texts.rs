//! What a user and their agent are told, through the real proxy in front of the scripted
//! mock: reminders name calls as the agent made them and the finding the log names; a halt
//! says who or what stopped the run; the operator's calls on a conversation nobody has seen
//! are a 404; with `on_stop = "pause"` a call that would be blocked waits for a human
//! instead of halting the run; the proxy's stderr carries no colour codes when it is not a
//! terminal.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod proxy_support;

use std::sync::Arc;
use std::time::Duration;

use intervene_support::*;
use loopwarden::dialect::Dialect;
use loopwarden::intervene::StopMode;
use proxy_support::Served;
use serde_json::{json, Value};

/// A Chat Completions conversation whose assistant turns are `steps` (tool, arguments,
/// result), one call each.
fn chat(steps: &[(&str, Value, &str)]) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the failing test in test_calc.py"}),
    ];
    for (i, (name, args, result)) in steps.iter().enumerate() {
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{i}"), "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]}),
        );
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}));
    }
    json!({"model": "gpt-test", "messages": messages, "tools": [
        {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "edit", "parameters": {"type": "object"}}}]})
}

/// Sends the conversation one step longer each time (as an agent does) until a request is
/// decided `want`; returns the reminder the upstream received with it (the trailing system
/// message), if it was forwarded.
async fn until(setup: &Setup, id: &str, steps: &[(&str, Value, &str)], want: &str) -> String {
    for n in 1..=steps.len() {
        let before = setup.mock.requests().len();
        let resp = setup
            .post(&path(Dialect::OpenAiChat, id, false), &chat(&steps[..n]))
            .await;
        let decision = header(&resp, "x-loopwarden-decision");
        let _ = resp.bytes().await;
        if decision == want {
            let sent = setup.mock.requests();
            if sent.len() == before {
                return String::new();
            }
            let last = sent.last().unwrap().json();
            let last = last["messages"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(last["role"], "system", "{last}");
            return last["content"].as_str().unwrap().to_string();
        }
    }
    panic!("{id}: never decided {want}");
}

/// The same failing test after each new edit: the check's results never change.
fn failing_after_each_edit(n: usize) -> Vec<(&'static str, Value, &'static str)> {
    let failure = "FAILED test_calc.py::test_add - AssertionError: add(2, 2) returned 0\n1 failed";
    (0..n)
        .flat_map(|i| {
            [
                (
                    "bash",
                    json!({"command": "python -m pytest test_calc.py"}),
                    failure,
                ),
                (
                    "edit",
                    json!({"path": "calc.py", "old_string": format!("return a - {i}"),
                           "new_string": format!("return a - {}", i + 1)}),
                    "Edited calc.py",
                ),
            ]
        })
        .collect()
}

#[tokio::test]
async fn a_reminder_names_the_call_as_the_agent_made_it_never_an_internal_key() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |_| {}).await;
    let read = (
        "read_file",
        json!({"path": "calc.py"}),
        "def add(a, b):\n    return a - b\n",
    );
    let steps = vec![read; 12];
    let reminder = until(&setup, "reads", &steps, "nudge").await;
    assert!(reminder.contains("`read calc.py`"), "{reminder}");
    assert!(!reminder.contains("read:"), "{reminder}");

    // A check command is quoted as it was run, not as its normalized key.
    let steps = failing_after_each_edit(8);
    let _ = until(&setup, "checks", &steps, "replan").await;
    setup.proxy.flush_log().await;
    let (_, timeline) = setup.admin("/admin/api/conversations/checks", None).await;
    let summaries: Vec<&str> = timeline["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["summary"].as_str().unwrap())
        .collect();
    let stagnation: Vec<&&str> = summaries
        .iter()
        .filter(|s| s.starts_with("ran `"))
        .collect();
    assert!(!stagnation.is_empty(), "{summaries:?}");
    for s in stagnation {
        assert!(s.starts_with("ran `python -m pytest test_calc.py`"), "{s}");
    }
}

#[tokio::test]
async fn the_finding_a_reminder_names_is_the_one_the_log_names() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |_| {}).await;
    // Its replan comes at a step where two patterns fire: the outcome's stagnation (first
    // among the detectors) and the failing command, which leads.
    let steps = failing_after_each_edit(8);
    let reminder = until(&setup, "lead", &steps, "replan").await;
    setup.proxy.flush_log().await;
    let (_, timeline) = setup.admin("/admin/api/conversations/lead", None).await;
    let replan = timeline["interventions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["action"] == "replan")
        .unwrap_or_else(|| panic!("{timeline}"))
        .clone();
    let finding = replan["finding"].as_str().unwrap();
    let reason = replan["reason"].as_str().unwrap();
    assert!(!finding.is_empty(), "{replan}");
    assert_eq!(finding, reason, "the log names the finding that led");
    let quoted = finding.trim_end_matches('.');
    assert!(
        reminder.contains(quoted),
        "the reminder names the logged finding {quoted:?}:\n{reminder}"
    );
}

#[tokio::test]
async fn a_halt_says_whether_an_operator_or_the_budget_stopped_the_run() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |c| {
        c.detect.budget.steps = 3;
    })
    .await;
    let reads: Vec<(&str, Value, String)> = (0..8)
        .map(|i| {
            (
                "read_file",
                json!({"path": format!("part{i}.py")}),
                format!("x = {i}"),
            )
        })
        .collect();
    let steps: Vec<(&str, Value, &str)> = reads
        .iter()
        .map(|(n, a, r)| (*n, a.clone(), r.as_str()))
        .collect();
    let p = path(Dialect::OpenAiChat, "budget", false);
    // The budget's halt, then the same halt again (sticky).
    for n in [6, 7] {
        let resp = setup.post(&p, &chat(&steps[..n])).await;
        assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
        let (text, _, _) = read_answer(Dialect::OpenAiChat, false, &resp.bytes().await.unwrap());
        assert!(text.contains("budget"), "{text}");
        assert!(!text.contains("going in circles"), "{text}");
    }

    // An operator's halt, with and without a reason.
    for (id, reason) in [("by-hand", Some("checking the bill")), ("quietly", None)] {
        let p = path(Dialect::OpenAiChat, id, false);
        let _ = setup.post(&p, &chat(&steps[..1])).await.bytes().await;
        setup.proxy.flush_log().await;
        let body = reason.map(|r| json!({ "reason": r }));
        let (status, _) = setup
            .admin(&format!("/admin/api/conversations/{id}/halt"), body)
            .await;
        assert_eq!(status, 200);
        let resp = setup.post(&p, &chat(&steps[..2])).await;
        assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
        let (text, _, _) = read_answer(Dialect::OpenAiChat, false, &resp.bytes().await.unwrap());
        assert!(text.contains("An operator stopped this run"), "{text}");
        assert!(!text.contains("going in circles"), "{text}");
        if let Some(reason) = reason {
            assert!(text.contains(reason), "{text}");
        }
    }
}

/// The halt quotes the failing command; a credential in it is masked in the reply the
/// agent (and whoever reads its terminal or CI log) gets, in every API.
#[tokio::test]
async fn a_halt_reply_masks_a_credential_in_the_command_it_quotes() {
    let secret = "sk-proj-Q2x7VbN4kL9mT1rZ8wY3uH6pD0sF5g";
    let text = LoopText {
        command: format!("OPENAI_API_KEY={secret} python3 test_calc.py"),
        ..LoopText::default()
    };
    for dialect in ALL {
        let setup = Setup::start(looping_script(dialect), |c| c.intervene.block = false).await;
        let k = first_k(dialect, loopwarden::detect::Action::Halt);
        let mut answer = String::new();
        for i in 1..=k {
            let body = loop_body_with(dialect, i, false, None, &text);
            let resp = setup.post(&path(dialect, "keyed", false), &body).await;
            let decision = header(&resp, "x-loopwarden-decision");
            let (said, _, _) = read_answer(dialect, false, &resp.bytes().await.unwrap());
            if decision == "halt" {
                answer = said;
            }
        }
        assert!(
            answer.contains("python3 test_calc.py"),
            "{dialect:?}: {answer}"
        );
        assert!(
            !answer.contains("Q2x7VbN4kL9mT1rZ8wY3"),
            "{dialect:?}: {answer}"
        );
        assert!(answer.contains("[redacted]"), "{dialect:?}: {answer}");
    }
}

#[tokio::test]
async fn halting_or_resuming_a_conversation_nobody_has_seen_is_a_404() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |_| {}).await;
    for call in ["halt", "resume"] {
        let (status, v) = setup
            .admin(&format!("/admin/api/conversations/nobody/{call}"), None)
            .await;
        assert_eq!(status, 404, "{call}: {v}");
    }
    let (_, pending) = setup.admin("/admin/api/conversations", None).await;
    assert_eq!(pending["conversations"], json!([]), "nothing was created");
    // A conversation the proxy has seen is halted and resumed.
    let p = path(Dialect::OpenAiChat, "seen", false);
    let _ = setup
        .post(&p, &loop_body(Dialect::OpenAiChat, 1, false, None))
        .await
        .bytes()
        .await;
    setup.proxy.flush_log().await;
    for call in ["halt", "resume"] {
        let (status, v) = setup
            .admin(&format!("/admin/api/conversations/seen/{call}"), None)
            .await;
        assert_eq!(status, 200, "{call}: {v}");
    }
}

#[tokio::test]
async fn with_pause_a_call_that_would_be_blocked_goes_through_and_the_next_request_waits() {
    let dialect = Dialect::OpenAiChat;
    let k = block_k(dialect).expect("the default policy blocks this loop");
    let setup = Arc::new(
        Setup::start(looping_script(dialect), |c| {
            c.intervene.on_stop = StopMode::Pause;
            c.intervene.pause.timeout_secs = 60;
        })
        .await,
    );
    let p = path(dialect, "paused-block", false);
    // The answer that completes the loop reaches the agent: nothing halted it.
    let resp = setup.post(&p, &loop_body(dialect, k, false, None)).await;
    assert_ne!(header(&resp, "x-loopwarden-decision"), "block");
    let (_, calls, _) = read_answer(dialect, false, &resp.bytes().await.unwrap());
    assert_eq!(calls, vec!["bash"], "the call was not blocked");
    // The agent runs it and asks again: that request is held for a human.
    let s = setup.clone();
    let next = loop_body(dialect, k + 1, false, None);
    let p2 = p.clone();
    let client = tokio::spawn(async move {
        let resp = s.post(&p2, &next).await;
        let decision = header(&resp, "x-loopwarden-decision");
        (decision, resp.bytes().await.unwrap())
    });
    let mut held = None;
    for _ in 0..500 {
        let (_, v) = setup.admin("/admin/api/pending", None).await;
        if let Some(p) = v["pending"].as_array().unwrap().first() {
            held = Some(p.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = held.expect("the next request was held");
    assert_eq!(held["conversation_id"], "paused-block");
    assert!(
        held["reason"]
            .as_str()
            .unwrap()
            .contains("python3 test_calc.py"),
        "{held}"
    );
    let before = setup.mock.requests().len();
    let (status, _) = setup
        .admin(
            &format!("/admin/api/pending/{}", held["id"].as_str().unwrap()),
            Some(json!({"decision": "halt"})),
        )
        .await;
    assert_eq!(status, 200);
    let (decision, body) = client.await.unwrap();
    assert_eq!(decision, "pause");
    let (text, calls, _) = read_answer(dialect, false, &body);
    assert!(calls.is_empty(), "{text}");
    assert!(text.contains("An operator stopped this run"), "{text}");
    assert_eq!(setup.mock.requests().len(), before, "not forwarded");
}

#[tokio::test]
async fn stderr_that_is_not_a_terminal_gets_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    // An empty NO_COLOR counts as unset: only the pipe can turn the colours off.
    let env = [("RUST_LOG", "info".into()), ("NO_COLOR", String::new())];
    let served = Served::start(&["--db", &db], &env).await;
    let stderr = served.stop().await;
    assert!(stderr.contains("log written"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
}
