//! Tools no profile knows: what their calls mean is inferred from the calls' arguments and
//! from the tool definitions. The tool sets are those of agents loopwarden has no profile
//! for (Cline, Roo Code, Goose, Cursor, Continue, an exec/read/edit/write agent, SWE-agent
//! 1.x, mini-swe-agent 2.x, an Aider-style set), in `tests/fixtures/tool_sets.json`.

use std::collections::BTreeMap;

use loopwarden::actions::{classify, ActionKind, CallContext, ToolCatalog};
use loopwarden::transcript::ToolCall;
use serde_json::{json, Value};

fn tool_sets() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tool_sets.json"
    ))
    .expect("fixture");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn kind_of(name: &str) -> ActionKind {
    serde_json::from_value(json!(name)).expect("a kind")
}

/// Checks every call of every tool set, read with the given catalog (or none); returns
/// the failures, one line each.
fn check_all(with_definitions: bool) -> Vec<String> {
    let mut failures = Vec::new();
    for set in tool_sets() {
        let agent = set["agent"].as_str().unwrap_or("?");
        let catalog = ToolCatalog::from_definitions(&set["tools"]);
        let ctx = CallContext {
            tools: with_definitions.then_some(&catalog),
            ..CallContext::default()
        };
        for c in set["calls"].as_array().expect("calls") {
            let call = ToolCall {
                id: String::new(),
                name: c["name"].as_str().expect("name").to_string(),
                args: c["args"].clone(),
            };
            let action = classify(&call, &BTreeMap::new(), &ctx);
            let expect = &c["expect"];
            let want = kind_of(expect["kind"].as_str().expect("kind"));
            let what = format!("{agent} {} {}", call.name, call.args);
            match want {
                // A shell command is read by the shell reader: a `grep` is a search, a
                // `sed -i` an edit; the command itself is what must come through.
                ActionKind::Exec if action.command.as_deref() != expect["command"].as_str() => {
                    failures.push(format!("{what}: command {:?}", action.command));
                }
                ActionKind::Exec => {}
                _ if action.kind != want => {
                    failures.push(format!("{what}: {:?}, not {want:?}", action.kind))
                }
                _ => {}
            }
            if let Some(path) = expect["path"].as_str() {
                if action.path.as_deref() != Some(path) {
                    failures.push(format!("{what}: path {:?}", action.path));
                }
            }
            let changes = expect["changes"].as_bool().unwrap_or(false);
            // (A shell command's writes are the shell reader's: not checked here.)
            if want != ActionKind::Exec && changes == action.changes.is_empty() {
                failures.push(format!("{what}: changes {:?}", action.changes));
            }
        }
    }
    failures
}

#[test]
fn unknown_agents_tools_are_read_from_their_arguments() {
    let failures = check_all(false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_agents_tools_are_read_with_their_definitions_too() {
    let failures = check_all(true);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn call(name: &str, args: Value) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: name.to_string(),
        args,
    }
}

/// Argument names that say nothing: the definition's descriptions say which argument is
/// the command, and the tool's description what kind of tool it is.
#[test]
fn a_definition_gives_meaning_to_opaque_argument_names() {
    let tools = json!([
        {"type": "function", "function": {"name": "sh", "description": "Run a command in a terminal.",
          "parameters": {"type": "object", "properties": {
            "x": {"type": "string", "description": "The shell command to run."}}}}},
        {"name": "peek", "description": "Read a file of the workspace.",
          "input_schema": {"type": "object", "properties": {
            "target": {"type": "string", "description": "Path of the file to read."}}}},
        {"functionDeclarations": [{"name": "swap", "description": "Edit a file.",
          "parameters": {"type": "object", "properties": {
            "where": {"type": "string", "description": "The file path."},
            "a": {"type": "string", "description": "The exact text to replace."},
            "b": {"type": "string", "description": "The replacement text."}}}}]}
    ]);
    let catalog = ToolCatalog::from_definitions(&tools);
    let ctx = CallContext {
        tools: Some(&catalog),
        ..CallContext::default()
    };
    let none = BTreeMap::new();

    let sh = call("sh", json!({"x": "pytest -q tests/test_a.py"}));
    assert_eq!(
        classify(&sh, &none, &CallContext::default()).kind,
        ActionKind::Other
    );
    let a = classify(&sh, &none, &ctx);
    assert_eq!(a.kind, ActionKind::Exec);
    assert!(a.check.is_some(), "a test run is a check: {a:?}");

    let peek = call("peek", json!({"target": "src/a.py"}));
    let a = classify(&peek, &none, &ctx);
    assert_eq!(
        (a.kind, a.path.as_deref()),
        (ActionKind::Read, Some("src/a.py"))
    );

    let swap = call(
        "swap",
        json!({"where": "src/a.py", "a": "x = 1", "b": "x = 2"}),
    );
    let a = classify(&swap, &none, &ctx);
    assert_eq!(a.kind, ActionKind::Edit);
    assert_eq!(a.changes.len(), 1);
}

/// An agent that calls its tools by other names is read alike: the same command under
/// `bash` and `exec`, the same edit under `str_replace_editor` and `edit`, give the same
/// keys (detection compares keys, never tool names).
#[test]
fn renamed_tools_give_the_same_keys() {
    let none = BTreeMap::new();
    let ctx = CallContext::default();
    let pairs = [
        (
            call(
                "bash",
                json!({"command": "cd /repo && python reproduce.py"}),
            ),
            call(
                "exec",
                json!({"command": "cd /repo && python reproduce.py"}),
            ),
        ),
        (
            call(
                "str_replace_editor",
                json!({"command": "str_replace", "path": "/repo/a.py", "old_str": "x", "new_str": "y"}),
            ),
            call(
                "edit",
                json!({"path": "/repo/a.py", "oldText": "x", "newText": "y"}),
            ),
        ),
        (
            call(
                "str_replace_editor",
                json!({"command": "view", "path": "/repo/a.py"}),
            ),
            call("read", json!({"path": "/repo/a.py"})),
        ),
    ];
    for (known, renamed) in pairs {
        let (a, b) = (
            classify(&known, &none, &ctx),
            classify(&renamed, &none, &ctx),
        );
        assert_eq!(
            (a.kind, &a.key, &a.changes),
            (b.kind, &b.key, &b.changes),
            "{renamed:?}"
        );
    }
}

/// SEARCH/REPLACE blocks in Cline's, the older and Roo Code's spellings.
#[test]
fn search_replace_blocks_are_read_in_every_spelling() {
    use loopwarden::actions::search_replace_blocks;
    let cline = "------- SEARCH\na\n=======\nb\n+++++++ REPLACE\n";
    let old = "<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n";
    let roo = "<<<<<<< SEARCH\n:start_line:3\n-------\na\n=======\nb\n>>>>>>> REPLACE\n";
    for text in [cline, old, roo] {
        assert_eq!(
            search_replace_blocks(text),
            Some(("a\n".to_string(), "b\n".to_string())),
            "{text}"
        );
    }
    assert_eq!(search_replace_blocks("plain text\n=======\n"), None);
}
