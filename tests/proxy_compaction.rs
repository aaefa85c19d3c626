//! One run across context compactions, through the real proxy over loopback sockets in
//! front of the scripted mock: each client's summary request and the history that
//! continues from it (Claude Code with a new session id and with the same one, Codex,
//! Gemini CLI, opencode). A loop nudged before the compaction goes on being escalated
//! after it, a step budget counts the run's model calls, dollars carry over to a new id,
//! the summary request is forwarded untouched even in a halted run, and a new session of
//! the same key inherits nothing.

mod proxy_support;

use loopwarden::budget::{Price, Prices, Usage};
use loopwarden::mock::{AfterEnd, MockServer, Script, Turn};
use proxy_support::{client, TestProxy};
use serde_json::{json, Value};

const CONTENT: &str =
    "1\tdef add(a, b):\n2\t    return a - b  # bug\n3\t\n4\tdef mul(a, b):\n5\t    return a * b\n";
const CLAUDE_SUMMARY: &str = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Do NOT use Read, Bash, Grep, Glob, Edit, Write, or ANY other tool.";
const CLAUDE_CONTINUED: &str = "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\nSummary:\n1. Primary Request and Intent: fix the failing test in calc.py.\n2. Progress: read calc.py several times; no edit yet.";

/// A client's shape: the headers and bodies of its requests before and after a compaction.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Client {
    ClaudeCode,
    Codex,
    GeminiCli,
    Opencode,
}

/// What a request of a run is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    /// Before any compaction: the task and `n` reads of calc.py.
    Before(usize),
    /// The summary request after `n` reads.
    Summary(usize),
    /// After the compaction: the summary and `n` reads of calc.py since.
    After(usize),
}

impl Client {
    fn path(self) -> &'static str {
        match self {
            Client::ClaudeCode => "/v1/messages?beta=true",
            Client::Codex => "/v1/responses",
            Client::GeminiCli => "/v1beta/models/gemini-3.8-flash:generateContent",
            Client::Opencode => "/v1/chat/completions",
        }
    }

    /// The headers a request of session `id` carries (Gemini CLI states none).
    fn headers(self, id: &str, key: &str, part: Part) -> Vec<(&'static str, String)> {
        match self {
            Client::ClaudeCode => vec![
                (
                    "user-agent",
                    "claude-cli/2.1.332 (external, sdk-cli)".into(),
                ),
                ("x-claude-code-session-id", id.into()),
                ("x-api-key", key.into()),
            ],
            Client::Codex => {
                let window = match part {
                    Part::After(_) => 1,
                    _ => 0,
                };
                let kind = match part {
                    Part::Summary(_) => "compaction",
                    _ => "turn",
                };
                vec![
                    (
                        "user-agent",
                        "codex_exec/0.171.0 (Debian 12.0.0; x86_64)".into(),
                    ),
                    ("authorization", format!("Bearer {key}")),
                    ("session-id", id.into()),
                    ("thread-id", id.into()),
                    ("x-codex-window-id", format!("{id}:{window}")),
                    (
                        "x-codex-turn-metadata",
                        json!({"session_id": id, "thread_id": id, "request_kind": kind})
                            .to_string(),
                    ),
                ]
            }
            Client::GeminiCli => vec![
                (
                    "user-agent",
                    "GeminiCLI/0.61.0/gemini-3.8-flash (linux; x64)".into(),
                ),
                ("x-goog-api-key", key.into()),
            ],
            Client::Opencode => vec![
                ("user-agent", "opencode/1.18.33".into()),
                ("authorization", format!("Bearer {key}")),
                ("x-session-id", id.into()),
            ],
        }
    }

    /// The body of a request: `task` names the run (two runs of one client differ in it).
    fn body(self, task: &str, part: Part) -> Value {
        let (head, reads, tail): (Vec<&str>, usize, Option<&str>) = match (self, part) {
            (_, Part::Before(n)) => (vec![task], n, None),
            (Client::ClaudeCode, Part::Summary(n)) => (vec![task], n, Some(CLAUDE_SUMMARY)),
            (Client::GeminiCli, Part::Summary(n)) => (
                vec![task],
                n,
                Some("First, reason in your scratchpad. Then, generate the <state_snapshot>."),
            ),
            (Client::Opencode, Part::Summary(n)) => (vec![task], n, Some("What did we do so far?")),
            (Client::Codex, Part::Summary(n)) => (vec![task], n, None),
            (Client::ClaudeCode, Part::After(n)) => (
                vec![
                    "<system-reminder>\ngitStatus: clean\n</system-reminder>",
                    CLAUDE_CONTINUED,
                ],
                n,
                None,
            ),
            (Client::Codex, Part::After(n)) => (vec![task], n, None),
            (Client::GeminiCli, Part::After(n)) => (
                vec!["<state_snapshot><overall_goal>Fix calc.py</overall_goal></state_snapshot>"],
                n,
                None,
            ),
            (Client::Opencode, Part::After(n)) => (vec!["What did we do so far?"], n, None),
        };
        let after = matches!(part, Part::After(_));
        let summary = matches!(part, Part::Summary(_));
        match self {
            Client::ClaudeCode => claude_body(&head, reads, tail, after),
            Client::Codex => codex_body(head[0], reads, summary, after),
            Client::GeminiCli => gemini_body(head[0], reads, tail, after),
            Client::Opencode => opencode_body(head[0], reads, tail, after),
        }
    }
}

fn claude_body(head: &[&str], reads: usize, tail: Option<&str>, after: bool) -> Value {
    let texts: Vec<Value> = head
        .iter()
        .map(|t| json!({"type": "text", "text": t}))
        .collect();
    let mut messages = vec![json!({"role": "user", "content": texts})];
    let tag = if after { "b" } else { "a" };
    for i in 0..reads {
        let id = format!("toolu_{tag}{i}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": "/work/calc.py"}}]}));
        let mut content =
            vec![json!({"type": "tool_result", "tool_use_id": id, "content": CONTENT})];
        if i + 1 == reads {
            if let Some(t) = tail {
                content.push(json!({"type": "text", "text": t}));
            }
        }
        messages.push(json!({"role": "user", "content": content}));
    }
    json!({"model": "claude-opus-5-5", "max_tokens": 1000, "stream": false,
        "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}]})
}

fn codex_body(task: &str, reads: usize, summary: bool, after: bool) -> Value {
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}),
    ];
    if after {
        input.push(json!({"type": "compaction", "encrypted_content": "gAAAA-opaque-summary"}));
    }
    let tag = if after { "b" } else { "a" };
    for i in 0..reads {
        let id = format!("call_{tag}{i}");
        input.push(
            json!({"type": "function_call", "call_id": id, "name": "exec_command",
            "arguments": json!({"cmd": "cat calc.py"}).to_string()}),
        );
        input.push(json!({"type": "function_call_output", "call_id": id,
            "output": format!("Process exited with code 0\nOutput:\n{CONTENT}")}));
    }
    if summary {
        input.push(json!({"type": "compaction_trigger"}));
    }
    json!({"model": "gpt-5.5", "stream": false, "store": false, "input": input,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]})
}

fn gemini_body(first: &str, reads: usize, tail: Option<&str>, after: bool) -> Value {
    let mut contents = vec![json!({"role": "user", "parts": [{"text": first}]})];
    if after {
        contents.push(json!({"role": "model", "parts": [{"text": "Got it. Thanks for the additional context!"}]}));
    }
    for _ in 0..reads {
        contents.push(json!({"role": "model", "parts": [
            {"functionCall": {"name": "read_file", "args": {"absolute_path": "/work/calc.py"}}}]}));
        contents.push(json!({"role": "user", "parts": [
            {"functionResponse": {"name": "read_file", "response": {"output": CONTENT}}}]}));
    }
    if let Some(t) = tail {
        contents.push(json!({"role": "user", "parts": [{"text": t}]}));
    }
    // The summary request has its own system instruction (the compression prompt).
    let system = match tail {
        Some(_) => "You are the component that summarizes internal chat history.",
        None => "You are Gemini CLI.",
    };
    json!({"contents": contents, "systemInstruction": {"parts": [{"text": system}]},
        "tools": [{"functionDeclarations": [{"name": "read_file"}]}]})
}

fn opencode_body(first: &str, reads: usize, tail: Option<&str>, after: bool) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are opencode."}),
        json!({"role": "user", "content": first}),
    ];
    if after {
        messages.push(json!({"role": "assistant", "content": "We read calc.py; add() subtracts."}));
        messages.push(json!({"role": "user", "content": "Continue if you have next steps, or stop and ask for clarification if you are unsure how to proceed."}));
    }
    let tag = if after { "b" } else { "a" };
    for i in 0..reads {
        let id = format!("call_{tag}{i}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "read", "arguments": json!({"filePath": "/work/calc.py"}).to_string()}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": CONTENT}));
    }
    if let Some(t) = tail {
        messages.push(json!({"role": "user", "content": t}));
    }
    json!({"model": "gpt-5.5", "messages": messages,
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]})
}

/// What the proxy answered a request: its decision, the conversation it logged it under,
/// and whether the upstream got the request (and exactly the client's bytes).
#[derive(Debug)]
struct Answer {
    decision: String,
    conversation: String,
    forwarded: bool,
    untouched: bool,
}

struct Setup {
    mock: MockServer,
    proxy: TestProxy,
}

impl Setup {
    async fn start(adjust: impl FnOnce(&mut loopwarden::config::Config)) -> Setup {
        let script = Script {
            turns: vec![Turn {
                text: Some("Reading.".into()),
                usage: Some(Usage {
                    input: 100_000,
                    ..Usage::default()
                }),
                ..Turn::default()
            }],
            after_end: AfterEnd::RepeatLast,
            side_when_no_tools: false,
            ..Script::default()
        };
        let mock = MockServer::start(script).await.unwrap();
        let proxy = TestProxy::start_with(&mock.url(), adjust).await;
        Setup { mock, proxy }
    }

    async fn send(&self, c: Client, id: &str, task: &str, part: Part) -> Answer {
        self.send_as(c, id, "sk-test-key-1", task, part).await
    }

    async fn send_as(&self, c: Client, id: &str, key: &str, task: &str, part: Part) -> Answer {
        let headers = c.headers(id, key, part);
        self.post(c.path(), &headers, c.body(task, part)).await
    }

    /// Posts `body` to `path` with `headers`: what the proxy answered, and what the
    /// upstream got.
    async fn post(&self, path: &str, headers: &[(&str, String)], body: Value) -> Answer {
        let body = body.to_string();
        let before = self.mock.requests().len();
        let mut request = client().post(self.proxy.url(path)).body(body.clone());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request = request.header("content-type", "application/json");
        let resp = request.send().await.unwrap();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let decision = header("x-loopwarden-decision");
        let conversation = header("x-loopwarden-conversation");
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.bytes().await.unwrap();
        let seen = self.mock.requests();
        let forwarded = seen.len() > before;
        let untouched = forwarded && seen.last().is_some_and(|r| r.body == body.as_bytes());
        Answer {
            decision: if decision.is_empty() {
                "observe".into()
            } else {
                decision
            },
            conversation,
            forwarded,
            untouched,
        }
    }
}

const ESCALATED: [&str; 4] = ["replan", "rollback", "halt", "pause"];

/// A run that re-reads one file is nudged, compacts, and re-reads it again: the first
/// re-read after the summary is needed work (observed), and the loop that goes on is
/// escalated past the nudge, not observed, observed, observed as a new run would be. The
/// continuation is logged under the run's id. `new_id`: the continuation states a new
/// session id (Claude Code's interactive auto-compact); else the same one.
async fn a_loop_goes_on_being_escalated_across_a_compaction(c: Client, new_id: bool) {
    let setup = Setup::start(|_| {}).await;
    let task = "Fix the failing test in calc.py.";
    let mut before = Vec::new();
    for n in 0..=4 {
        before.push(setup.send(c, "run-1", task, Part::Before(n)).await);
    }
    let decisions: Vec<&str> = before.iter().map(|a| a.decision.as_str()).collect();
    assert!(decisions.contains(&"nudge"), "{c:?}: {decisions:?}");
    let run = before[0].conversation.clone();
    let summary = setup.send(c, "run-1", task, Part::Summary(5)).await;
    assert!(
        summary.untouched,
        "{c:?}: the summary request goes as it came"
    );
    assert_eq!(summary.decision, "observe", "{c:?}");
    let next = if new_id { "run-1-continued" } else { "run-1" };
    let mut after = Vec::new();
    for n in 0..=4 {
        after.push(setup.send(c, next, task, Part::After(n)).await);
    }
    let decisions: Vec<&str> = after.iter().map(|a| a.decision.as_str()).collect();
    assert_eq!(
        decisions[1], "observe",
        "{c:?}: the first re-read is needed: {decisions:?}"
    );
    assert!(
        decisions[2..].iter().any(|d| ESCALATED.contains(d)),
        "{c:?}: escalated past the nudge: {decisions:?}"
    );
    if c != Client::GeminiCli {
        // Gemini CLI states no id: its summary request (another system instruction) has
        // an identity of its own, which its continuation joins.
        assert!(
            after.iter().all(|a| a.conversation == run),
            "{c:?}: one run in the log: {run} vs {:?}",
            after.iter().map(|a| &a.conversation).collect::<Vec<_>>()
        );
    }
    if c == Client::ClaudeCode {
        the_log_holds_one_run(&setup, &run, new_id.then_some(next)).await;
    }
    // The same reads in a new session of the same key, without a summary: a new run,
    // which inherits nothing.
    let mut fresh = Vec::new();
    for n in 0..=4 {
        fresh.push(
            setup
                .send(c, "run-2", "Another task: fix calc.py.", Part::Before(n))
                .await,
        );
    }
    let decisions: Vec<&str> = fresh.iter().map(|a| a.decision.as_str()).collect();
    assert!(
        decisions.iter().all(|d| !ESCALATED.contains(d)),
        "{c:?}: a new session starts afresh: {decisions:?}"
    );
    assert!(fresh.iter().all(|a| a.conversation != run), "{c:?}");
}

#[tokio::test]
async fn claude_code_auto_compact_under_a_new_session_id_is_one_run() {
    a_loop_goes_on_being_escalated_across_a_compaction(Client::ClaudeCode, true).await;
}

#[tokio::test]
async fn claude_code_compact_under_the_same_session_id_is_one_run() {
    a_loop_goes_on_being_escalated_across_a_compaction(Client::ClaudeCode, false).await;
}

#[tokio::test]
async fn codex_remote_compaction_is_one_run() {
    a_loop_goes_on_being_escalated_across_a_compaction(Client::Codex, false).await;
}

#[tokio::test]
async fn gemini_cli_state_snapshot_is_one_run() {
    a_loop_goes_on_being_escalated_across_a_compaction(Client::GeminiCli, true).await;
}

#[tokio::test]
async fn opencode_summary_is_one_run() {
    a_loop_goes_on_being_escalated_across_a_compaction(Client::Opencode, false).await;
}

/// `[budget] steps = 6` stops the run at its 7th model call, a compaction between them
/// (its summary request is no step of the run, and is never stopped). Then, the run halted,
/// a summary request still goes to the upstream as it came.
#[tokio::test]
async fn a_step_budget_counts_the_runs_model_calls_across_a_compaction() {
    let setup = Setup::start(|config| {
        config.budget.steps = 6;
        // Loops are not what this test is about.
        config.detect.enabled = false;
    })
    .await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    for n in 0..4 {
        let a = setup.send(c, "budget-1", task, Part::Before(n)).await;
        assert!(a.forwarded, "call {}: {a:?}", n + 1);
    }
    assert!(
        setup
            .send(c, "budget-1", task, Part::Summary(4))
            .await
            .untouched
    );
    for (n, call) in [(0, 5), (1, 6)] {
        let a = setup.send(c, "budget-2", task, Part::After(n)).await;
        assert!(a.forwarded, "call {call}: {a:?}");
    }
    let seventh = setup.send(c, "budget-2", task, Part::After(2)).await;
    assert_eq!(seventh.decision, "halt", "{seventh:?}");
    assert!(!seventh.forwarded);
    // Halted: the next call gets the halt again; a summary request goes as it came.
    assert!(
        !setup
            .send(c, "budget-2", task, Part::After(3))
            .await
            .forwarded
    );
    let mut body = c.body(task, Part::After(3));
    let last = body["messages"].as_array_mut().unwrap().last_mut().unwrap();
    last["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "text", "text": CLAUDE_SUMMARY}));
    let body = body.to_string();
    let mut request = client().post(setup.proxy.url(c.path())).body(body.clone());
    for (name, value) in c.headers("budget-2", "sk-test-key-1", Part::After(3)) {
        request = request.header(name, value);
    }
    let resp = request.send().await.unwrap();
    assert!(resp.status().is_success());
    assert_eq!(
        resp.headers()["x-loopwarden-decision"],
        "observe",
        "the run is halted, its summary request is not"
    );
    resp.bytes().await.unwrap();
    let last = setup.mock.requests().pop().unwrap();
    assert_eq!(last.body, body.as_bytes(), "forwarded byte for byte");
}

/// A dollar budget covers the whole lineage: a continuation under a new session id goes
/// on spending the run's dollars, and a new session of the same key starts from zero.
#[tokio::test]
async fn dollars_carry_over_to_a_new_session_id() {
    let setup = Setup::start(|config| {
        // A test model at $1 per million input tokens: each answer (100k) costs $0.10.
        config.prices = Prices::new(vec![(
            "claude-opus-5-5".into(),
            Price {
                input: 1.0,
                cached_input: 1.0,
                cache_write: 1.0,
                output: 1.0,
            },
        )]);
        config.budget.dollars = 0.45;
        config.detect.enabled = false;
    })
    .await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    for n in 0..3 {
        assert!(
            setup
                .send(c, "spend-1", task, Part::Before(n))
                .await
                .forwarded
        );
    }
    // $0.30, and $0.40 with the summary.
    assert!(
        setup
            .send(c, "spend-1", task, Part::Summary(3))
            .await
            .forwarded
    );
    let first = setup.send(c, "spend-2", task, Part::After(0)).await;
    assert!(first.forwarded, "{first:?}");
    // $0.50 of $0.45: the run's budget is spent, under its new id too.
    let second = setup.send(c, "spend-2", task, Part::After(1)).await;
    assert_eq!(second.decision, "halt", "{second:?}");
    assert!(!second.forwarded);
    // Another session of the same key, no summary: its own budget.
    let other = setup
        .send(c, "spend-3", "Another task.", Part::Before(0))
        .await;
    assert!(other.forwarded, "{other:?}");
}

/// The captured Claude Code requests (`../shared/fixtures/requests`, reference data outside
/// the project: skipped when absent), or `None`.
fn captured(name: &str) -> Option<(Value, Value)> {
    let beside =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/requests");
    let dir = if beside.is_dir() {
        beside
    } else {
        std::path::PathBuf::from("/work/shared/fixtures/requests")
    };
    let read = |file: String| -> Option<Value> {
        serde_json::from_slice(&std::fs::read(dir.join(file)).ok()?).ok()
    };
    Some((
        read(format!("{name}.json"))?,
        read(format!("{name}.meta.json"))?,
    ))
}

/// Claude Code's real summary request and the request after it, as captured, replayed
/// through the proxy: under the captured session id (`-p` mode, `/compact`) and under a new
/// one (interactive auto-compact). The summary request's history already read calc.py three
/// times; the request after it re-attaches one more read, which is needed work; each
/// further read of the unchanged file is the loop going on, escalated past the nudge.
#[tokio::test]
async fn claude_code_captured_compaction_is_one_run() {
    let (Some((summary, summary_meta)), Some((after, after_meta))) = (
        captured("claude-code-anthropic-messages-compaction"),
        captured("claude-code-anthropic-messages-after-compaction"),
    ) else {
        eprintln!("no captured requests beside the checkout: skipped");
        return;
    };
    for new_id in [false, true] {
        let setup = Setup::start(|_| {}).await;
        let post = |body: &Value, meta: &Value, session: Option<&str>| {
            let mut request = client()
                .post(setup.proxy.url("/v1/messages?beta=true"))
                .body(body.to_string());
            for (name, value) in meta["headers"].as_object().unwrap() {
                let value = match (name.as_str(), session) {
                    ("x-claude-code-session-id", Some(id)) => id.to_string(),
                    ("connection" | "accept-encoding" | "content-length", _) => continue,
                    _ => value.as_str().unwrap().to_string(),
                };
                request = request.header(name.as_str(), value);
            }
            async move {
                let resp = request.send().await.unwrap();
                assert!(resp.status().is_success());
                let decision = resp.headers()["x-loopwarden-decision"]
                    .to_str()
                    .unwrap()
                    .to_string();
                let conversation = resp.headers()["x-loopwarden-conversation"]
                    .to_str()
                    .unwrap()
                    .to_string();
                resp.bytes().await.unwrap();
                (decision, conversation)
            }
        };
        let (decision, run) = post(&summary, &summary_meta, None).await;
        assert_eq!(decision, "observe");
        let sent = setup.mock.requests();
        assert_eq!(sent[0].body, summary.to_string().as_bytes(), "untouched");
        let session = new_id.then_some("0d9c5a1e-auto-compact-new-session");
        let mut decisions = Vec::new();
        let mut body = after.clone();
        for n in 0..4 {
            if n > 0 {
                // One more read of the unchanged file, as the model would make it.
                let id = format!("toolu_again_{n}");
                let messages = body["messages"].as_array_mut().unwrap();
                messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id,
                    "name": "Read", "input": {"file_path": "/tmp/claude-scratch-compact/calc.py"}}]}));
                let result = messages
                    .iter()
                    .find_map(|m| {
                        m["content"].as_array()?.iter().find_map(|b| {
                            (b["type"] == "tool_result").then(|| b["content"].clone())
                        })
                    })
                    .unwrap();
                messages.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": result}]}));
            }
            let (decision, conversation) = post(&body, &after_meta, session).await;
            assert_eq!(conversation, run, "new id {new_id}: one run");
            decisions.push(decision);
        }
        assert_eq!(decisions[0], "observe", "{decisions:?}");
        assert!(
            decisions[1..]
                .iter()
                .any(|d| ESCALATED.contains(&d.as_str())),
            "new id {new_id}: {decisions:?}"
        );
    }
}

/// The log of a Claude Code run compacted once (5 reads, the summary request, 4 reads
/// since): every request under the run's id, the summary request marked, the id the
/// continuation stated kept beside it, and the run's steps numbered on across the
/// compaction (none written over). The admin API's timeline says the same.
async fn the_log_holds_one_run(setup: &Setup, run: &str, stated: Option<&str>) {
    let requests = setup
        .proxy
        .rows(&format!(
            "SELECT conversation_id, compaction, stated_id, steps FROM requests
             WHERE conversation_id = '{run}' ORDER BY started_ms, id"
        ))
        .await;
    assert_eq!(requests.len(), 11, "{requests:?}");
    let summary: Vec<&Value> = requests
        .iter()
        .filter(|r| !r["compaction"].is_null())
        .collect();
    assert_eq!(summary.len(), 1, "{requests:?}");
    assert_eq!(summary[0]["compaction"], "claude_summary");
    assert_eq!(summary[0]["steps"], 5);
    for r in &requests[6..] {
        assert_eq!(r["stated_id"].as_str(), stated, "{r}");
    }
    // The last request carried 4 steps of its own after the run's 5.
    assert_eq!(requests[10]["steps"], 9);
    let steps = setup
        .proxy
        .rows(&format!(
            "SELECT step FROM tool_calls WHERE conversation_id = '{run}' ORDER BY step"
        ))
        .await;
    let steps: Vec<i64> = steps.iter().map(|r| r["step"].as_i64().unwrap()).collect();
    assert_eq!(
        steps,
        (0..9).collect::<Vec<_>>(),
        "numbered on, none written over"
    );
    let body = client()
        .get(setup.proxy.url(&format!("/admin/api/conversations/{run}")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let timeline: Value = serde_json::from_slice(&body).unwrap();
    let marked: Vec<&Value> = timeline["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["compaction"] == "claude_summary")
        .collect();
    assert_eq!(marked.len(), 1, "{timeline}");
}

/// A run halted for its loop compacts (its client's context is full all the same): the
/// summary request goes to the upstream as it came, and the run that goes on from the
/// summary, under a new session id, is still halted.
#[tokio::test]
async fn a_halted_run_stays_halted_across_a_compaction() {
    let setup = Setup::start(|_| {}).await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    let mut n = 0;
    loop {
        let a = setup.send(c, "halted-1", task, Part::Before(n)).await;
        if a.decision == "halt" {
            assert!(!a.forwarded);
            break;
        }
        n += 1;
        assert!(n < 30, "the loop is halted at some point");
    }
    let summary = setup.send(c, "halted-1", task, Part::Summary(n)).await;
    assert!(summary.untouched, "{summary:?}");
    for own in 0..3 {
        let a = setup.send(c, "halted-2", task, Part::After(own)).await;
        assert_eq!(
            (a.decision.as_str(), a.forwarded),
            ("halt", false),
            "{own}: {a:?}"
        );
        assert_eq!(a.conversation, "halted-1");
    }
}

/// Codex's older remote compaction, `POST /responses/compact`: no conversation endpoint, so
/// the proxy forwards it as it came (and logs it as a compaction); the thread's history
/// that continues from it carries the run's state all the same, from the thread's last
/// request before it.
#[tokio::test]
async fn codex_older_compact_endpoint_is_one_run() {
    let setup = Setup::start(|_| {}).await;
    let c = Client::Codex;
    let task = "Fix the failing test in calc.py.";
    let mut before = Vec::new();
    for n in 0..=4 {
        before.push(
            setup
                .send(c, "thread-9", task, Part::Before(n))
                .await
                .decision,
        );
    }
    assert!(before.contains(&"nudge".to_string()), "{before:?}");
    let body = c.body(task, Part::Before(5)).to_string();
    let mut request = client()
        .post(setup.proxy.url("/v1/responses/compact"))
        .body(body.clone());
    for (name, value) in c.headers("thread-9", "sk-test-key-1", Part::Before(5)) {
        request = request.header(name, value);
    }
    let resp = request.send().await.unwrap();
    assert!(resp.headers().get("x-loopwarden-decision").is_none());
    resp.bytes().await.unwrap();
    let last = setup.mock.requests().pop().unwrap();
    assert_eq!(
        (last.path.as_str(), &last.body[..]),
        ("/v1/responses/compact", body.as_bytes())
    );
    let mut after = Vec::new();
    for n in 0..=4 {
        after.push(
            setup
                .send(c, "thread-9", task, Part::After(n))
                .await
                .decision,
        );
    }
    assert_eq!(after[1], "observe", "{after:?}");
    assert!(
        after[2..].iter().any(|d| ESCALATED.contains(&d.as_str())),
        "{after:?}"
    );
    let marked = setup
        .proxy
        .rows("SELECT path FROM requests WHERE compaction = 'codex_compact_path'")
        .await;
    assert_eq!(marked.len(), 1, "{marked:?}");
}

/// Claude Code's summary request of a history `body`: the instruction appended to its last
/// user message as a text block of its own (after a reminder block, as on a compaction
/// after the first, when `reminder`), and a `system` message after it, as Claude Code
/// 2.1.332 sends them.
fn claude_summary_of(mut body: Value, reminder: bool) -> Value {
    let messages = body["messages"].as_array_mut().unwrap();
    let last = messages.last_mut().unwrap();
    let content = last["content"].as_array_mut().unwrap();
    if reminder {
        content.push(json!({"type": "text",
            "text": "<system-reminder>\nAttribution for git commits: none.\n</system-reminder>"}));
    }
    content.push(json!({"type": "text", "text": CLAUDE_SUMMARY}));
    messages.push(json!({"role": "system",
        "content": "The following deferred tools are now available via ToolSearch."}));
    body
}

/// A test model at $1 per million tokens of each kind: each of the mock's answers (100k
/// input tokens) costs $0.10.
fn dollar_a_million() -> Prices {
    Prices::new(vec![(
        "claude-opus-5-5".into(),
        Price {
            input: 1.0,
            cached_input: 1.0,
            cache_write: 1.0,
            output: 1.0,
        },
    )])
}

/// A policy that only watches Claude Code.
const SHADOW: &str = r#"
[[policy]]
name = "watch"
mode = "shadow"
match = { client = "claude-code" }
"#;

/// The summary requests of a Claude Code run whose dollar budget is spent (the client
/// compacts when its context is full, whatever the budget), each in a shape Claude Code
/// sends (the instruction followed by a `system` message; after a reminder block in the
/// same message): under an enforcing policy and a shadow one, each reaches the upstream
/// byte for byte, is logged as a compaction and forwarded, while the run's other requests
/// are halted (or would be).
#[tokio::test]
async fn every_summary_request_passes_a_spent_budget_byte_for_byte() {
    for shadow in [false, true] {
        let setup = Setup::start(|config| {
            config.prices = dollar_a_million();
            config.budget.dollars = 0.25;
            config.detect.enabled = false;
            if shadow {
                let policies: loopwarden::config::Config = toml::from_str(SHADOW).unwrap();
                config.policies = policies.policies;
            }
        })
        .await;
        let c = Client::ClaudeCode;
        let task = "Fix the failing test in calc.py.";
        let headers = c.headers("spent-1", "sk-test-key-1", Part::Before(0));
        for n in 0..3 {
            assert!(
                setup
                    .send(c, "spent-1", task, Part::Before(n))
                    .await
                    .forwarded
            );
        }
        // $0.30 of $0.25.
        let over = setup.send(c, "spent-1", task, Part::Before(3)).await;
        assert_eq!(over.forwarded, shadow, "{over:?}");
        for (part, reminder) in [(Part::Before(3), false), (Part::After(1), true)] {
            if let Part::After(n) = part {
                // The run went on from the first summary: halted, its budget spent.
                let after = setup.send(c, "spent-1", task, Part::After(n)).await;
                assert_eq!(after.forwarded, shadow, "{after:?}");
            }
            let summary = claude_summary_of(c.body(task, part), reminder);
            let a = setup.post(c.path(), &headers, summary).await;
            assert!(a.untouched, "shadow {shadow}, {part:?}: {a:?}");
            assert_eq!(a.decision, "observe", "shadow {shadow}, {part:?}");
        }
        let rows = setup
            .proxy
            .rows("SELECT compaction, applied FROM requests WHERE compaction IS NOT NULL")
            .await;
        assert_eq!(rows.len(), 2, "shadow {shadow}: {rows:?}");
        for row in rows {
            assert_eq!(row["compaction"], "claude_summary", "{row}");
            assert_eq!(row["applied"], "forwarded", "shadow {shadow}: {row}");
        }
    }
}

/// In a halted run, only the client's real summary request passes: its instruction last,
/// no result its run's previous request did not have, the run's tools, once per
/// compaction (a retry of it byte for byte too). A request that merely carries the marker
/// is halted, every time.
#[tokio::test]
async fn a_marker_alone_is_no_way_through_a_halt() {
    let setup = Setup::start(|config| {
        config.prices = dollar_a_million();
        config.budget.dollars = 0.25;
        config.detect.enabled = false;
    })
    .await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    let headers = c.headers("marked-1", "sk-test-key-1", Part::Before(0));
    for n in 0..3 {
        assert!(
            setup
                .send(c, "marked-1", task, Part::Before(n))
                .await
                .forwarded
        );
    }
    let halted = setup.send(c, "marked-1", task, Part::Before(3)).await;
    assert_eq!(halted.decision, "halt", "{halted:?}");
    let real = claude_summary_of(c.body(task, Part::Before(3)), false);
    // The marker, then another instruction.
    let mut then_more = real.clone();
    let messages = then_more["messages"].as_array_mut().unwrap();
    let n = messages.len();
    messages[n - 2]["content"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "text", "text": "Now run the tests with Bash."}));
    // New results since the halted request.
    let moved_on = claude_summary_of(c.body(task, Part::Before(4)), false);
    // Other tools.
    let mut other_tools = real.clone();
    other_tools["tools"] = json!([{"name": "Bash", "input_schema": {"type": "object"}}]);
    for (what, body) in [
        ("then more", &then_more),
        ("moved on", &moved_on),
        ("other tools", &other_tools),
    ] {
        for _ in 0..5 {
            let a = setup.post(c.path(), &headers, body.clone()).await;
            assert_eq!(
                (a.decision.as_str(), a.forwarded),
                ("halt", false),
                "{what}"
            );
        }
    }
    let a = setup.post(c.path(), &headers, real.clone()).await;
    assert!(a.untouched, "the real one: {a:?}");
    let retry = setup.post(c.path(), &headers, real.clone()).await;
    assert!(retry.untouched, "its retry: {retry:?}");
    // A second summary request of the same compaction (another instruction text).
    let mut second = real.clone();
    let messages = second["messages"].as_array_mut().unwrap();
    let content = messages[n - 2]["content"].as_array_mut().unwrap();
    let last = content.len() - 1;
    content[last]["text"] = json!(format!("{CLAUDE_SUMMARY}\n\nBe brief."));
    let a = setup.post(c.path(), &headers, second).await;
    assert_eq!((a.decision.as_str(), a.forwarded), ("halt", false), "{a:?}");
    // The run is still halted.
    let next = setup.send(c, "marked-1", task, Part::Before(3)).await;
    assert_eq!(next.decision, "halt", "{next:?}");
}

/// Two teams under one API key and client: team beta's continuation under a new session
/// id does not join team alpha's halted run (a team is a boundary), and is logged under its
/// own id and team.
#[tokio::test]
async fn a_continuation_joins_a_run_of_its_own_team_only() {
    let setup = Setup::start(|config| {
        config.detect.enabled = false;
        config.budget.steps = 3;
    })
    .await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    let in_team = |team: &str, id: &str, part: Part| {
        let mut headers = c.headers(id, "sk-shared-key", part);
        headers.push(("x-loopwarden-team", team.to_string()));
        headers
    };
    let mut n = 0;
    let halted = loop {
        let a = setup
            .post(
                c.path(),
                &in_team("alpha", "alpha-1", Part::Before(n)),
                c.body(task, Part::Before(n)),
            )
            .await;
        if a.decision == "halt" {
            break a;
        }
        n += 1;
        assert!(n < 10, "the step budget halts alpha's run");
    };
    assert_eq!(halted.conversation, "alpha-1");
    let summary = claude_summary_of(c.body(task, Part::Before(n)), false);
    let a = setup
        .post(
            c.path(),
            &in_team("alpha", "alpha-1", Part::Before(n)),
            summary,
        )
        .await;
    assert!(a.untouched, "{a:?}");
    // Beta's continuation, under a new id, of the same key and client, in time.
    let beta = setup
        .post(
            c.path(),
            &in_team("beta", "beta-2", Part::After(0)),
            c.body(task, Part::After(0)),
        )
        .await;
    assert_eq!(beta.conversation, "beta-2", "{beta:?}");
    assert!(beta.forwarded, "not alpha's halt: {beta:?}");
    // Alpha's own continuation joins alpha's run, halted.
    let alpha = setup
        .post(
            c.path(),
            &in_team("alpha", "alpha-2", Part::After(0)),
            c.body(task, Part::After(0)),
        )
        .await;
    assert_eq!(
        (alpha.conversation.as_str(), alpha.forwarded),
        ("alpha-1", false),
        "{alpha:?}"
    );
    let rows = setup
        .proxy
        .rows("SELECT team FROM conversations WHERE id = 'beta-2'")
        .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["team"], "beta");
}

/// Claude Code's history after a compaction re-attaches the last file read, under its old
/// id, before the reads the model makes again: that re-attached read is the one needed
/// re-read, and the very next repeat of the loop nudged before the compaction gets the
/// next rung.
#[tokio::test]
async fn the_ladder_goes_on_right_after_the_re_attached_read() {
    let setup = Setup::start(|_| {}).await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    let mut n = 0;
    loop {
        let a = setup.send(c, "ladder-1", task, Part::Before(n)).await;
        if a.decision == "nudge" {
            break;
        }
        n += 1;
        assert!(n < 10, "nudged at some point");
    }
    let summary = setup.send(c, "ladder-1", task, Part::Summary(n)).await;
    assert!(summary.untouched, "{summary:?}");
    let headers = c.headers("ladder-1", "sk-test-key-1", Part::After(0));
    let mut decisions = Vec::new();
    for reads in 0..3 {
        let mut body = c.body(task, Part::After(reads));
        let messages = body["messages"].as_array_mut().unwrap();
        let id = format!("toolu_a{}", n - 1);
        messages.splice(
            1..1,
            [
                json!({"role": "system", "content": "Today's date is 2026-12-07."}),
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": id,
                    "name": "Read", "input": {"file_path": "/work/calc.py"}}]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": CONTENT},
                    {"type": "text", "text": "<system-reminder>\nAttribution: none.\n</system-reminder>"}]}),
            ],
        );
        decisions.push(setup.post(c.path(), &headers, body).await.decision);
    }
    assert_eq!(
        decisions[0], "observe",
        "the re-attached read: {decisions:?}"
    );
    assert!(
        ESCALATED.contains(&decisions[1].as_str()),
        "the next repeat: {decisions:?}"
    );
}

/// A dollar cap holds before the call: a request whose input alone (estimated from its
/// body, 3.5 bytes a token for a Claude model) would take the run past the cap is halted
/// before it reaches the upstream; one that stays under it goes.
#[tokio::test]
async fn a_call_that_would_cross_the_dollar_cap_is_stopped_before_it_is_made() {
    let setup = Setup::start(|config| {
        config.prices = dollar_a_million();
        config.budget.dollars = 0.25;
        config.detect.enabled = false;
    })
    .await;
    let c = Client::ClaudeCode;
    let task = "Fix the failing test in calc.py.";
    // About 60k tokens of input ($0.06), and about 29k ($0.03).
    for (id, padding, crosses) in [("large-1", 210_000, true), ("medium-1", 100_000, false)] {
        let headers = c.headers(id, "sk-test-key-1", Part::Before(0));
        for n in 0..2 {
            assert!(setup.send(c, id, task, Part::Before(n)).await.forwarded);
        }
        // $0.20 spent.
        let mut body = c.body(task, Part::Before(2));
        body["system"][0]["text"] = json!(format!("You are Claude Code. {}", "x".repeat(padding)));
        let a = setup.post(c.path(), &headers, body).await;
        assert_eq!(a.forwarded, !crosses, "{id}: {a:?}");
        if crosses {
            assert_eq!(a.decision, "halt", "{id}: {a:?}");
        }
    }
}

/// What Anthropic's server-side compaction answered (`context_management` with the
/// `compact_20260112` edit): a `compaction` block whose content is the summary.
const SERVER_SUMMARY: &str =
    "Summary: fixing the failing test in calc.py; read calc.py five times, no edit yet.";

/// A request of a plain Anthropic API client with `context_management` compaction on:
/// before the compaction, the task and `reads` reads; after it, the history sent from the
/// answer that carried the `compaction` block (the blocks before it dropped, as the API
/// drops them itself) and `reads` reads since.
fn anthropic_server_body(task: &str, reads: usize, after: bool) -> Value {
    anthropic_compacted_body(task, reads, after.then_some(SERVER_SUMMARY))
}

/// [`anthropic_server_body`] after the compaction whose block holds `summary`, if any.
fn anthropic_compacted_body(task: &str, reads: usize, summary: Option<&str>) -> Value {
    let after = summary.is_some();
    let mut body = claude_body(&[task], reads, None, after);
    body["context_management"] = json!({"edits": [{"type": "compact_20260112"}]});
    if after {
        let messages = body["messages"].as_array_mut().unwrap();
        messages[0] = json!({"role": "assistant", "content": [
            {"type": "compaction", "content": summary},
            {"type": "text", "text": "Going on from the summary."}]});
        messages.insert(1, json!({"role": "user", "content": "Go on."}));
    }
    body
}

/// A request of a plain OpenAI Responses client (no id header: its identity is its head's
/// hash) with `context_management` compaction on: after the compaction, its input is the
/// window the API compacted (the messages, then a `compaction` item for the calls) and
/// `reads` reads since.
fn responses_server_body(task: &str, reads: usize, after: bool) -> Value {
    let mut body = codex_body(task, reads, false, after);
    body["context_management"] = json!([{"type": "compaction", "compact_threshold": 200000}]);
    body
}

/// A run that loops, nudged, then compacted by the API (no summary request): the history
/// that starts from the compaction block or item is the same run, under the same id, its
/// escalation going on past the nudge; forwarded as it came while observed; each such
/// request logged as continuing from the compaction; the block never read as a tool call.
async fn a_server_side_compaction_is_one_run(
    path: &str,
    headers: &[(&str, String)],
    body: fn(&str, usize, bool) -> Value,
    marker: &str,
) {
    let setup = Setup::start(|_| {}).await;
    let task = "Fix the failing test in calc.py.";
    let mut before = Vec::new();
    for n in 0..=4 {
        before.push(setup.post(path, headers, body(task, n, false)).await);
    }
    let decisions: Vec<&str> = before.iter().map(|a| a.decision.as_str()).collect();
    assert!(decisions.contains(&"nudge"), "{marker}: {decisions:?}");
    let run = before[0].conversation.clone();
    let mut after = Vec::new();
    for n in 0..=4 {
        after.push(setup.post(path, headers, body(task, n, true)).await);
    }
    let decisions: Vec<&str> = after.iter().map(|a| a.decision.as_str()).collect();
    assert!(
        after[..2]
            .iter()
            .all(|a| a.untouched && a.decision == "observe"),
        "{marker}: forwarded as it came: {decisions:?}"
    );
    assert!(
        decisions[2..].iter().any(|d| ESCALATED.contains(d)),
        "{marker}: escalated past the nudge: {decisions:?}"
    );
    assert!(
        after.iter().all(|a| a.conversation == run),
        "{marker}: one run: {run} vs {:?}",
        after.iter().map(|a| &a.conversation).collect::<Vec<_>>()
    );
    let rows = setup
        .proxy
        .rows(&format!(
            "SELECT compaction FROM requests WHERE conversation_id = '{run}' ORDER BY started_ms, id"
        ))
        .await;
    let logged: Vec<&Value> = rows.iter().map(|r| &r["compaction"]).collect();
    assert_eq!(logged.len(), 10, "{logged:?}");
    assert!(logged[..5].iter().all(|c| c.is_null()), "{logged:?}");
    assert!(logged[5..].iter().all(|c| *c == marker), "{logged:?}");
    let names = setup
        .proxy
        .rows(&format!(
            "SELECT DISTINCT name FROM tool_calls WHERE conversation_id = '{run}'"
        ))
        .await;
    assert_eq!(names.len(), 1, "only the reads are tool calls: {names:?}");
}

#[tokio::test]
async fn anthropic_server_side_compaction_is_one_run() {
    let headers = [
        (
            "user-agent",
            "claude-cli/2.1.332 (external, sdk-cli)".to_string(),
        ),
        ("x-claude-code-session-id", "server-1".to_string()),
        ("x-api-key", "sk-test-key-1".to_string()),
        ("anthropic-beta", "compact-2026-01-12".to_string()),
    ];
    a_server_side_compaction_is_one_run(
        "/v1/messages",
        &headers,
        anthropic_server_body,
        "anthropic_compaction",
    )
    .await;
}

#[tokio::test]
async fn responses_server_side_compaction_is_one_run() {
    let headers = [
        ("user-agent", "OpenAI/Python 2.31.0".to_string()),
        ("authorization", "Bearer sk-test-key-1".to_string()),
    ];
    a_server_side_compaction_is_one_run(
        "/v1/responses",
        &headers,
        responses_server_body,
        "responses_compaction",
    )
    .await;
}

/// `[budget] steps = 8` over a run the API compacts twice: every model call counts, those
/// between the two compactions too (each history holds only the calls since the last).
#[tokio::test]
async fn a_step_budget_holds_across_two_server_side_compactions() {
    let setup = Setup::start(|config| {
        config.budget.steps = 8;
        config.detect.enabled = false;
    })
    .await;
    let headers = [
        ("x-claude-code-session-id", "server-2".to_string()),
        ("x-api-key", "sk-test-key-1".to_string()),
    ];
    let task = "Fix the failing test in calc.py.";
    let second = "Summary: calc.py read eight times; the test still fails.";
    let mut calls = Vec::new();
    for summary in [None, Some(SERVER_SUMMARY), Some(second)] {
        for n in 0..3 {
            let body = anthropic_compacted_body(task, n, summary);
            calls.push(setup.post("/v1/messages", &headers, body).await);
        }
    }
    let forwarded: Vec<bool> = calls.iter().map(|a| a.forwarded).collect();
    assert_eq!(
        forwarded,
        [true, true, true, true, true, true, true, true, false],
        "the 9th call is stopped"
    );
    assert_eq!(calls[8].decision, "halt");
    assert!(calls.iter().all(|a| a.conversation == "server-2"));
}
