//! An agent loopwarden has no profile for, through the proxy: its tools (`exec`, `read`,
//! `edit {path, oldText, newText}`, `write`) are read from their calls, so an agent that
//! keeps changing its code is nudged but never stopped, and one that re-runs the same
//! failing command with nothing changed is stopped. A tool whose arguments say nothing
//! of what it does is read through the definitions the requests carry.

mod intervene_support;

use intervene_support::{header, looping_script, Setup};
use loopwarden::dialect::Dialect;
use serde_json::{json, Value};

const FAILURE: &str =
    "FAILED tests/test_calc.py::test_add - AssertionError: assert 0 == 4\n1 failed in 0.02s";

/// The tool definitions such an agent sends with every request.
fn tools() -> Value {
    let def = |name: &str, description: &str, props: Value| {
        json!({"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "properties": props}}})
    };
    json!([
        def(
            "exec",
            "Run a shell command.",
            json!({"command": {"type": "string"}})
        ),
        def("read", "Read a file.", json!({"path": {"type": "string"}})),
        def(
            "edit",
            "Replace text in a file.",
            json!({"path": {"type": "string"},
            "oldText": {"type": "string"}, "newText": {"type": "string"}})
        ),
        def(
            "write",
            "Write a file.",
            json!({"path": {"type": "string"}, "content": {"type": "string"}})
        ),
        // Its argument names say nothing; their descriptions do.
        def(
            "change",
            "Change a file.",
            json!({"target": {"type": "string", "description": "Path of the file to modify."},
            "before": {"type": "string", "description": "The exact text to replace."},
            "after": {"type": "string", "description": "The replacement text."}})
        ),
    ])
}

/// A conversation of `turns` assistant turns, each one call of `call(i)` answered by
/// `result(i)`, as an OpenAI Chat request.
fn body(
    turns: usize,
    call: impl Fn(usize) -> (&'static str, Value),
    result: impl Fn(usize) -> String,
) -> Value {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the failing test in tests/test_calc.py"}),
    ];
    for i in 0..turns {
        let (name, args) = call(i);
        m.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"),
            "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}),
        );
        m.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result(i)}));
    }
    json!({"model": "glm-test", "messages": m, "tools": tools()})
}

/// [`body`] of a client that sends no tool definitions.
fn body_without_tools(
    turns: usize,
    call: impl Fn(usize) -> (&'static str, Value),
    result: impl Fn(usize) -> String,
) -> Value {
    let mut b = body(turns, call, result);
    b.as_object_mut().unwrap().remove("tools");
    b
}

/// The decision the proxy states for each request of a growing conversation.
async fn decisions(
    setup: &Setup,
    id: &str,
    max: usize,
    body_at: impl Fn(usize) -> Value,
) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..=max {
        let resp = setup
            .post(&format!("/c/{id}/v1/chat/completions"), &body_at(k))
            .await;
        out.push(header(&resp, "x-loopwarden-decision"));
    }
    out
}

/// Edit, test, edit, test...: every edit new (made with `edit(i)`), the test failing the
/// same way.
fn edit_test_call(i: usize, edit: fn(usize) -> (&'static str, Value)) -> (&'static str, Value) {
    if i.is_multiple_of(2) {
        edit(i)
    } else {
        (
            "exec",
            json!({"command": "python -m pytest -q tests/test_calc.py"}),
        )
    }
}

fn edit_test_result(i: usize) -> String {
    if i.is_multiple_of(2) {
        "Successfully replaced text in src/calc.py.".to_string()
    } else {
        FAILURE.to_string()
    }
}

fn stops(decisions: &[String]) -> bool {
    decisions
        .iter()
        .any(|d| d == "halt" || d == "pause" || d == "block")
}

#[tokio::test]
async fn an_unknown_agent_changing_its_code_is_nudged_but_not_stopped() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |_| {}).await;
    let edit = |i: usize| {
        (
            "edit",
            json!({"path": "src/calc.py", "oldText": format!("return {}", i), "newText": format!("return {}", i + 2)}),
        )
    };
    let call = |i| edit_test_call(i, edit);
    let got = decisions(&setup, "forward", 24, |k| body(k, call, edit_test_result)).await;
    assert!(
        got.iter().any(|d| d == "nudge"),
        "the stagnation is reported: {got:?}"
    );
    assert!(!stops(&got), "every edit was new: {got:?}");
}

#[tokio::test]
async fn a_tool_is_read_through_the_definitions_the_requests_carry() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |_| {}).await;
    let change = |i: usize| {
        (
            "change",
            json!({"target": "src/calc.py", "before": format!("return {}", i), "after": format!("return {}", i + 2)}),
        )
    };
    let call = |i| edit_test_call(i, change);
    let with = decisions(&setup, "defined", 24, |k| body(k, call, edit_test_result)).await;
    assert!(
        !stops(&with),
        "the definitions say `change` edits, and every edit was new: {with:?}"
    );
    // The same calls from a client that sends no definitions: `change` is not known to
    // change anything, so the same failure after it is a loop.
    let without = decisions(&setup, "undefined", 24, |k| {
        body_without_tools(k, call, edit_test_result)
    })
    .await;
    assert!(stops(&without), "{without:?}");
}

#[tokio::test]
async fn an_unknown_agent_rerunning_a_failure_with_nothing_changed_is_stopped() {
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), |_| {}).await;
    let call = |_| {
        (
            "exec",
            json!({"command": "python -m pytest -q tests/test_calc.py"}),
        )
    };
    let got = decisions(&setup, "stuck", 16, |k| {
        body(k, call, |_| FAILURE.to_string())
    })
    .await;
    let nudge = got.iter().position(|d| d == "nudge").expect("nudged");
    let halt = got.iter().position(|d| d == "halt").expect("halted");
    assert!(nudge < halt, "{got:?}");
}
