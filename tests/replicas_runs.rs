//! Runs that outlive a process (issue 52): what a run needs to go on is in the store, so a
//! continuation or a chained request served by another replica, or after a restart, joins
//! its run. Through the real proxy over loopback sockets in front of the scripted mock:
//!
//! - one process on one SQLite file, restarted between a Claude Code run's summary request
//!   and its continuation under a new session id;
//! - two replicas on one PostgreSQL behind the shipped `docker/nginx.conf` (no
//!   stickiness), both restarted at the same point;
//! - a Responses `previous_response_id` chain over HTTP (the client lets the API store
//!   its answers and sends only its new input) alternating between two replicas.
//!
//! The PostgreSQL tests are `#[ignore]`d (`cargo test -- --include-ignored`, as `.ci/run`
//! runs them); the nginx one needs nginx too.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod nginx_support;
mod proxy_support;

use std::time::Duration;

use loopwarden::budget::{Price, Prices, Usage};
use loopwarden::config::Config;
use loopwarden::mock::{AfterEnd, MockServer, Script, ToolCall, Turn};
use nginx_support::Nginx;
use proxy_support::{client, db_rows, TestProxy};
use serde_json::{json, Value};

const CONTENT: &str =
    "1\tdef add(a, b):\n2\t    return a - b  # bug\n3\t\n4\tdef mul(a, b):\n5\t    return a * b\n";
const TASK: &str = "Fix the failing test in calc.py.";
const SUMMARY: &str = "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.";
const CONTINUED: &str = "This session is being continued from a previous conversation that ran out of context. The summary below covers the earlier portion of the conversation.\n\nSummary:\n1. Fix the failing test in calc.py.\n2. Read calc.py several times; no edit yet.";
/// Decisions past the nudge: the ladder went on.
const ESCALATED: [&str; 4] = ["replan", "rollback", "halt", "pause"];

/// What a request of a run is.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Before the compaction: the task and `n` reads of calc.py.
    Before(usize),
    /// The summary request after `n` reads.
    Summary(usize),
    /// The continuation: the summary and `n` reads since.
    After(usize),
}

/// The client whose requests a test sends: Claude Code (auto-compact states a new session
/// id) or Codex (the thread keeps its id; its window id counts the compactions).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Agent {
    ClaudeCode,
    Codex,
}

impl Agent {
    fn path(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "/v1/messages?beta=true",
            Agent::Codex => "/v1/responses",
        }
    }

    fn headers(self, session: &str, part: Part) -> Vec<(&'static str, String)> {
        match self {
            Agent::ClaudeCode => vec![
                (
                    "user-agent",
                    "claude-cli/2.1.332 (external, sdk-cli)".into(),
                ),
                ("x-claude-code-session-id", session.into()),
                ("x-api-key", "sk-test-key-1".into()),
            ],
            Agent::Codex => {
                let (window, kind) = match part {
                    Part::Before(_) => (0, "turn"),
                    Part::Summary(_) => (0, "compaction"),
                    Part::After(_) => (1, "turn"),
                };
                vec![
                    (
                        "user-agent",
                        "codex_exec/0.171.0 (Debian 12.0.0; x86_64)".into(),
                    ),
                    ("authorization", "Bearer sk-test-key-1".into()),
                    ("thread-id", session.into()),
                    ("x-codex-window-id", format!("{session}:{window}")),
                    (
                        "x-codex-turn-metadata",
                        json!({"thread_id": session, "request_kind": kind}).to_string(),
                    ),
                ]
            }
        }
    }

    fn body(self, part: Part) -> Value {
        match self {
            Agent::ClaudeCode => claude_body(part),
            Agent::Codex => codex_body(part),
        }
    }
}

/// A Claude Code request body.
fn claude_body(part: Part) -> Value {
    let (head, reads, tail, tag) = match part {
        Part::Before(n) => (TASK, n, None, "a"),
        Part::Summary(n) => (TASK, n, Some(SUMMARY), "a"),
        Part::After(n) => (CONTINUED, n, None, "b"),
    };
    let mut messages = vec![json!({"role": "user", "content": [{"type": "text", "text": head}]})];
    for i in 0..reads {
        let id = format!("toolu_{tag}{i}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": "/work/calc.py"}}]}));
        let mut content =
            vec![json!({"type": "tool_result", "tool_use_id": id, "content": CONTENT})];
        if let (true, Some(t)) = (i + 1 == reads, tail) {
            content.push(json!({"type": "text", "text": t}));
        }
        messages.push(json!({"role": "user", "content": content}));
    }
    json!({"model": "claude-opus-5-5", "max_tokens": 1000, "stream": false,
        "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages,
        "tools": [{"name": "Read", "input_schema": {"type": "object"}}]})
}

/// A Codex request body (its remote compaction: the summary request ends with a
/// `compaction_trigger`, the history after it starts from the API's `compaction` item).
fn codex_body(part: Part) -> Value {
    let (reads, after, summary) = match part {
        Part::Before(n) => (n, false, false),
        Part::Summary(n) => (n, false, true),
        Part::After(n) => (n, true, false),
    };
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]}),
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

/// What the proxy answered a request.
#[derive(Debug)]
struct Answer {
    decision: String,
    conversation: String,
}

/// Sends `agent`'s request of session `session` to `base` (a proxy, or nginx).
async fn send(base: &str, agent: Agent, session: &str, part: Part) -> Answer {
    let mut request = client()
        .post(format!("{base}{}", agent.path()))
        .header("content-type", "application/json")
        .body(agent.body(part).to_string());
    for (name, value) in agent.headers(session, part) {
        request = request.header(name, value);
    }
    let r = request.send().await.unwrap();
    assert!(r.status().is_success(), "{part:?}: {}", r.status());
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let decision = header("x-loopwarden-decision");
    let conversation = header("x-loopwarden-conversation");
    r.bytes().await.unwrap();
    Answer {
        decision: if decision.is_empty() {
            "observe".into()
        } else {
            decision
        },
        conversation,
    }
}

/// The mock's one answer, again and again: a text and 100k input tokens (at the test
/// price, $0.10).
async fn mock() -> MockServer {
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
    MockServer::start(script).await.unwrap()
}

/// $1 per million tokens of the test model, and a dollar budget no test run reaches.
fn priced(config: &mut Config) {
    config.prices = Prices::new(vec![(
        "claude-opus-5-5".into(),
        Price {
            input: 1.0,
            cached_input: 1.0,
            cache_write: 1.0,
            output: 1.0,
        },
    )]);
    config.budget.dollars = 100.0;
}

/// The run before its compaction: five requests re-reading one file (nudged on the way),
/// then its summary request; the `i`th request sent to `bases[i % len]`. Returns the run's
/// id.
async fn before_the_compaction(bases: &[String], agent: Agent, session: &str) -> String {
    let mut decisions = Vec::new();
    let mut run = String::new();
    for n in 0..=4 {
        let a = send(&bases[n % bases.len()], agent, session, Part::Before(n)).await;
        run = a.conversation;
        decisions.push(a.decision);
    }
    assert!(decisions.iter().any(|d| d == "nudge"), "{decisions:?}");
    let summary = send(&bases[5 % bases.len()], agent, session, Part::Summary(5)).await;
    assert_eq!(summary.decision, "observe");
    run
}

/// The continuation under session `session` until the run is halted (and once more, once
/// every one of `replicas` says the run is halted: the halt sticks), the `i`th request
/// sent to `bases[i % len]`. The first re-read after the summary is needed work; the
/// loop that goes on is escalated past the nudge, as the run it continues was nudged.
/// Every request is the run's (`run`). Returns how many requests it made.
async fn the_continuation_goes_on(
    bases: &[String],
    replicas: &[String],
    agent: Agent,
    session: &str,
    run: &str,
) -> usize {
    let base = |i: usize| &bases[i % bases.len()];
    let mut decisions = Vec::new();
    for n in 0..12 {
        let a = send(base(n), agent, session, Part::After(n)).await;
        assert_eq!(
            a.conversation, run,
            "request {n} is the run's: {decisions:?}"
        );
        decisions.push(a.decision);
        if decisions.last().is_some_and(|d| d == "halt") {
            break;
        }
    }
    assert_eq!(decisions[1], "observe", "the needed re-read: {decisions:?}");
    assert!(
        ESCALATED.contains(&decisions[2].as_str()),
        "the next repeat gets the next rung: {decisions:?}"
    );
    assert_eq!(
        decisions.last().map(String::as_str),
        Some("halt"),
        "{decisions:?}"
    );
    // Halted for good: the next request, a fresh one of the same history, too.
    for replica in replicas {
        until_halted(replica, run).await;
    }
    let n = decisions.len();
    let again = send(base(n), agent, session, Part::After(n)).await;
    assert_eq!(
        (again.decision.as_str(), again.conversation.as_str()),
        ("halt", run)
    );
    n + 1
}

/// Polls (bounded, never asserted on) until the proxy at `base` says `run` is halted.
async fn until_halted(base: &str, run: &str) {
    for _ in 0..200 {
        let r = client()
            .get(format!("{base}/admin/api/conversations/{run}"))
            .send()
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or_default();
        if v["halted"] == true {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base} never says {run} is halted");
}

/// The log's requests of `run` that a conversation stated under `stated`, as `(steps,
/// stated_id)`, read from the log at `db`.
async fn continued_rows(db: &str, run: &str, stated: &str) -> Vec<Value> {
    db_rows(
        db,
        &format!(
            "SELECT steps, stated_id FROM requests
             WHERE conversation_id = '{run}' AND stated_id = '{stated}' ORDER BY id"
        ),
    )
    .await
}

#[tokio::test]
async fn a_continuation_after_a_restart_joins_its_run_on_sqlite() {
    let mock = mock().await;
    let proxy = TestProxy::start_with(&mock.url(), priced).await;
    let claude = Agent::ClaudeCode;
    let run = before_the_compaction(&[proxy.running.url()], claude, "sqlite-1").await;
    assert_eq!(run, "sqlite-1");
    // Stopped (its log written out), and started again on the same file.
    let TestProxy { running, dir, db } = proxy;
    running.flush_log().await;
    running.shutdown().await.unwrap();
    let proxy = TestProxy::start_in(&mock.url(), dir, |c| {
        c.store.db = db;
        priced(c)
    })
    .await;
    let url = [proxy.running.url()];
    let made = the_continuation_goes_on(&url, &url, claude, "sqlite-2", &run).await;
    proxy.running.flush_log().await;
    // Logged under the run, its steps numbered on after the run's 5.
    let rows = continued_rows(&proxy.db, &run, "sqlite-2").await;
    assert_eq!(rows.len(), made, "{rows:?}");
    assert_eq!(rows[0]["steps"], 5, "{rows:?}");
    // The run's spend goes on from what it spent before the restart: six answers then,
    // and each forwarded request of the continuation (not the halted ones).
    let spend = admin_spend(&proxy.running.url(), &run).await;
    let forwarded = mock.requests().len() as f64;
    assert!(
        (spend - 0.1 * forwarded).abs() < 1e-6,
        "{spend} for {forwarded}"
    );
    assert!(forwarded > 6.0);
}

/// The dollars the proxy at `base` says `run` has spent.
async fn admin_spend(base: &str, run: &str) -> f64 {
    let r = client()
        .get(format!("{base}/admin/api/conversations/{run}"))
        .send()
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    v["spend"]["dollars"].as_f64().unwrap_or(f64::NAN)
}

/// Two replicas on one PostgreSQL database.
async fn replicas(db: &str, upstream: &str) -> [TestProxy; 2] {
    let start = || {
        TestProxy::start_with(upstream, |c| {
            c.store.db = db.to_string();
            priced(c)
        })
    };
    [start().await, start().await]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nginx and PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_continuation_joins_its_run_across_replicas_restarted_behind_nginx() {
    let db = proxy_support::postgres_db().await;
    let mock = mock().await;
    let [a, b] = replicas(&db, &mock.url()).await;
    let nginx = Nginx::start([a.running.addr(), b.running.addr()]);
    nginx.ready().await;
    let claude = Agent::ClaudeCode;
    let run = before_the_compaction(&[nginx.url("")], claude, "pg-1").await;
    let spent_before = mock.requests().len();
    drop(nginx);
    // Both replicas restarted: neither process saw the run.
    for proxy in [a, b] {
        proxy.running.flush_log().await;
        proxy.running.shutdown().await.unwrap();
    }
    let [a, b] = replicas(&db, &mock.url()).await;
    let nginx = Nginx::start([a.running.addr(), b.running.addr()]);
    nginx.ready().await;
    let replicas = [a.running.url(), b.running.url()];
    let made = the_continuation_goes_on(&[nginx.url("")], &replicas, claude, "pg-2", &run).await;
    a.running.flush_log().await;
    b.running.flush_log().await;
    let rows = continued_rows(&db, &run, "pg-2").await;
    assert_eq!(rows.len(), made, "{rows:?}");
    assert_eq!(rows[0]["steps"], 5, "{rows:?}");
    // Both replicas served the continuation (nginx spreads it), and each counts the run's
    // whole spend once the sync has brought the other's.
    let forwarded = mock.requests().len();
    assert!(forwarded > spent_before);
    for proxy in [&a, &b] {
        assert!(served(proxy).await > 0, "nginx sent each replica a share");
        let base = proxy.running.url();
        let mut spend = 0.0;
        for _ in 0..200 {
            spend = admin_spend(&base, &run).await;
            if (spend - 0.1 * forwarded as f64).abs() < 1e-6 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            (spend - 0.1 * forwarded as f64).abs() < 1e-6,
            "{spend} for {forwarded}"
        );
    }
}

/// A Codex thread keeps its id across its compaction. The replica that serves its
/// continuation saw the thread's first request only; the other saw the rest and the summary
/// request. A continuation (its window id says so) under an id the first does not know as
/// a run: it looks the run up in the store, and carries the run's state rather than its own
/// fold of the first request, which would start the loop's count over.
#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_thread_that_keeps_its_id_goes_on_from_the_other_replica_s_summary() {
    let db = proxy_support::postgres_db().await;
    let mock = mock().await;
    let [a, b] = replicas(&db, &mock.url()).await;
    // `a` sees the thread's first request only, `b` the rest and its summary request.
    let (a_url, b_url) = (a.running.url(), b.running.url());
    let before = [&a_url, &b_url, &b_url, &b_url, &b_url, &b_url].map(String::clone);
    let run = before_the_compaction(&before, Agent::Codex, "thread-1").await;
    assert_eq!(run, "thread-1");
    // Its run reaches the store by the time the client has the summary and sends the
    // continuation, to `a` first.
    b.running.flush_log().await;
    let bases = [a_url, b_url];
    the_continuation_goes_on(&bases, &bases, Agent::Codex, "thread-1", &run).await;
}

/// The Anthropic requests a proxy answered, by its `/metrics`.
async fn served(proxy: &TestProxy) -> u64 {
    let r = client().get(proxy.url("/metrics")).send().await.unwrap();
    let text = r.text().await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("loopwarden_requests_total{api=\"anthropic\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The mock's answer to every Responses request: a call that prints calc.py.
fn chain_script() -> Script {
    Script {
        turns: vec![Turn {
            text: None,
            tool_calls: vec![ToolCall::function(
                "shell",
                json!({"command": ["cat", "calc.py"]}),
            )],
            ..Turn::default()
        }],
        after_end: AfterEnd::RepeatLast,
        side_when_no_tools: false,
        ..Script::default()
    }
}

/// A client that lets the API store its answers: each request names the last answer by
/// `previous_response_id` and sends only the output of that answer's call. Sends `turns`
/// requests, the `i`th to `proxies[i % len]`, flushing the log of the replica that served
/// it before the next (the client's tool runs in between). Returns each decision, and the
/// log's notes of an unknown answer.
async fn chain(proxies: &[&TestProxy], turns: usize) -> (Vec<String>, Vec<Value>) {
    let mut decisions = Vec::new();
    let mut previous: Option<(String, String)> = None;
    for i in 0..turns {
        let proxy = proxies[i % proxies.len()];
        let input = match &previous {
            None => json!([{"role": "user", "content": [{"type": "input_text", "text": TASK}]}]),
            Some((_, call)) => {
                json!([{"type": "function_call_output", "call_id": call, "output": CONTENT}])
            }
        };
        let mut body = json!({"model": "gpt-test", "stream": false, "store": true, "input": input,
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]});
        if let Some((id, _)) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let r = client()
            .post(proxy.url("/v1/responses"))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-test-key-1")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        let decision = r
            .headers()
            .get("x-loopwarden-decision")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("observe")
            .to_string();
        let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        decisions.push(decision);
        proxy.running.flush_log().await;
        let Some(call) = answer["output"]
            .as_array()
            .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        else {
            // Stopped: the answer is the proxy's, not the model's.
            break;
        };
        let id = answer["id"].as_str().unwrap().to_string();
        previous = Some((id, call["call_id"].as_str().unwrap().to_string()));
    }
    let unknown = db_rows(
        &proxies[0].db,
        "SELECT parse_error FROM requests WHERE parse_error LIKE '%previous_response_id%'",
    )
    .await;
    (decisions, unknown)
}

#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_stored_response_chain_is_read_whole_on_alternating_replicas() {
    let db = proxy_support::postgres_db().await;
    let mock = MockServer::start(chain_script()).await.unwrap();
    let [a, b] = replicas(&db, &mock.url()).await;
    let (alternating, unknown) = chain(&[&a, &b], 8).await;
    assert!(unknown.is_empty(), "every answer was found: {unknown:?}");
    // The same chain through one process: the decisions it reads the repeats into.
    let mock = MockServer::start(chain_script()).await.unwrap();
    let one = TestProxy::start(&mock.url()).await;
    let (alone, _) = chain(&[&one], 8).await;
    assert!(alone.iter().any(|d| d != "observe"), "{alone:?}");
    assert_eq!(
        alternating, alone,
        "read with its history on either replica"
    );
}
