//! `loopwarden demo`: loopwarden between a scripted looping model and a tiny agent, all
//! in-process on loopback, with no key and no setup. The agent fixes nothing: the model
//! keeps running the same failing test, edits the bug into another bug and back, and
//! loopwarden nudges it, then halts it. The demo prints what a user would see, step by
//! step, then the timeline from loopwarden's log.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::Config;
use crate::dialect::Dialect;
use crate::mock::{AfterEnd, MockServer, Script, ToolCall, Turn};

/// Options of `loopwarden demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Pause between two agent steps, so the timeline can be read as it happens.
    #[arg(long, default_value_t = 250)]
    pub step_delay_ms: u64,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut out = std::io::stdout();
    runtime.block_on(demo(&mut out, Duration::from_millis(args.step_delay_ms)))?;
    Ok(())
}

/// What the demo saw, for callers that check it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DemoOutcome {
    /// Agent steps (model requests) made.
    pub requests: usize,
    /// The `x-loopwarden-decision` of each request.
    pub decisions: Vec<String>,
    /// The reminders the model received, as loopwarden appended them.
    pub reminders: Vec<String>,
    /// The halt text the agent received, if it was halted.
    pub halt: Option<String>,
}

const BUGGY: &str = "    return a - b\n";
const OTHER_BUG: &str = "    return b - a\n";
const FIXED: &str = "    return a + b\n";
const TASK: &str = "Fix the failing test in test_calc.py (add() returns the wrong result).";
/// The model's turns before it gives up on its own; the demo shows loopwarden stops it first.
const SCRIPT_END: &str = "I could not fix it.";

/// The looping model: read, test, edit the bug into another bug, test, edit it back,
/// test... the same failure every time.
fn looping_script() -> Script {
    let read = || ToolCall::function("read_file", json!({"file_path": "calc.py"}));
    let test = || {
        ToolCall::function(
            "run_shell_command",
            json!({"command": "python -m pytest test_calc.py"}),
        )
    };
    let edit = |old: &str, new: &str| {
        ToolCall::function(
            "replace",
            json!({"file_path": "calc.py", "old_string": old, "new_string": new}),
        )
    };
    let mut turns = vec![Turn {
        text: Some("Let me look at the code first.".into()),
        tool_calls: vec![read()],
        ..Turn::default()
    }];
    for _ in 0..5 {
        turns.push(Turn::calls(vec![test()]));
        turns.push(Turn {
            text: Some("The subtraction looks wrong; swapping the operands.".into()),
            tool_calls: vec![edit(BUGGY, OTHER_BUG)],
            ..Turn::default()
        });
        turns.push(Turn::calls(vec![test()]));
        turns.push(Turn {
            text: Some("That did not help; restoring the original.".into()),
            tool_calls: vec![edit(OTHER_BUG, BUGGY)],
            ..Turn::default()
        });
    }
    let mut script = Script::with_turns(turns);
    script.after_end = AfterEnd::EndText;
    script.end_text = SCRIPT_END.into();
    script.model = Some("demo-model".into());
    script
}

/// The agent's fake workspace: a buggy calc.py and a test runner.
struct Workspace {
    files: BTreeMap<String, String>,
}

impl Workspace {
    fn new() -> Workspace {
        let mut files = BTreeMap::new();
        files.insert("calc.py".to_string(), format!("def add(a, b):\n{BUGGY}"));
        Workspace { files }
    }

    /// Runs one tool call; returns its output.
    fn run(&mut self, name: &str, args: &Value) -> String {
        let path = args["file_path"].as_str().unwrap_or("");
        match name {
            "read_file" => match self.files.get(path) {
                Some(text) => text.clone(),
                None => format!("No such file: {path}"),
            },
            "replace" => {
                let old = args["old_string"].as_str().unwrap_or("");
                let new = args["new_string"].as_str().unwrap_or("");
                match self.files.get_mut(path) {
                    Some(text) if !old.is_empty() && text.contains(old) => {
                        *text = text.replacen(old, new, 1);
                        format!("Edited {path}")
                    }
                    Some(_) => format!("Edit failed: text not found in {path}"),
                    None => format!("No such file: {path}"),
                }
            }
            "run_shell_command" => {
                let calc = self.files.get("calc.py").map(String::as_str).unwrap_or("");
                if calc.contains(FIXED) {
                    "test_calc.py::test_add PASSED\n1 passed".into()
                } else {
                    "FAILED test_calc.py::test_add - AssertionError: add(2, 2) returned 0\n1 failed"
                        .into()
                }
            }
            other => format!("unknown tool {other}"),
        }
    }
}

fn tools() -> Value {
    let tool = |name: &str, description: &str, properties: Value| {
        json!({"type": "function", "function": {"name": name, "description": description,
               "parameters": {"type": "object", "properties": properties}}})
    };
    json!([
        tool(
            "read_file",
            "Read a file",
            json!({"file_path": {"type": "string"}})
        ),
        tool(
            "replace",
            "Replace text in a file",
            json!({"file_path": {"type": "string"}, "old_string": {"type": "string"},
                   "new_string": {"type": "string"}})
        ),
        tool(
            "run_shell_command",
            "Run a shell command",
            json!({"command": {"type": "string"}})
        ),
    ])
}

/// First line of `text`, cut for one terminal line.
fn line(text: &str, max: usize) -> String {
    crate::intervene::text::cut(text.lines().next().unwrap_or("").trim(), max)
}

/// Prints `text` indented and wrapped at about 100 columns.
fn print_box(out: &mut dyn Write, text: &str) -> std::io::Result<()> {
    for paragraph in text.lines() {
        let mut current = String::new();
        for word in paragraph.split_whitespace() {
            if !current.is_empty() && current.len() + word.len() > 100 {
                writeln!(out, "           | {current}")?;
                current.clear();
            }
            if !current.is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        writeln!(out, "           | {current}")?;
    }
    Ok(())
}

/// Runs the demo, printing to `out`. `step_delay` paces the agent.
pub async fn demo(out: &mut dyn Write, step_delay: Duration) -> anyhow::Result<DemoOutcome> {
    let mock = MockServer::start(looping_script()).await?;
    let dir = tempfile_dir()?;
    let db = dir.join("demo.db");
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".into();
    config.store.db = format!("sqlite://{}", db.display());
    config.upstream.openai = mock.url();
    let proxy = crate::proxy::start(config).await?;

    writeln!(
        out,
        "loopwarden demo: a model that loops, a tiny agent, and loopwarden between them"
    )?;
    writeln!(
        out,
        "  model       scripted mock at {} (no API key)",
        mock.url()
    )?;
    writeln!(out, "  loopwarden  {} (log: {})", proxy.url(), db.display())?;
    writeln!(out, "  task        {TASK}")?;
    writeln!(out)?;

    let conversation = format!("demo-{}", fastrand::u32(1000..10000));
    let http = reqwest::Client::builder().no_proxy().build()?;
    let agent = Agent {
        http: &http,
        mock: &mock,
        url: format!("{}/c/{conversation}/v1/chat/completions", proxy.url()),
        step_delay,
    };
    let outcome = agent.run(out).await?;

    proxy.flush_log().await;
    writeln!(out)?;
    print_timeline(out, &http, &proxy.url(), &conversation).await?;
    writeln!(out)?;
    match &outcome.halt {
        Some(_) => writeln!(
            out,
            "The agent stopped after {} model requests; without loopwarden the model would have looped through all {} scripted turns.",
            outcome.requests,
            looping_script().turns.len()
        )?,
        None => writeln!(out, "The run ended without a halt.")?,
    }
    proxy.shutdown().await?;
    mock.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(outcome)
}

/// The tiny agent: sends the conversation through the proxy, runs the model's tool calls
/// in its [`Workspace`], and says what happened at each step.
struct Agent<'a> {
    http: &'a reqwest::Client,
    mock: &'a MockServer,
    /// The proxy's chat completions URL under the demo's conversation id.
    url: String,
    step_delay: Duration,
}

impl Agent<'_> {
    /// Runs until the model stops calling tools, loopwarden halts the run, or 40 requests.
    async fn run(&self, out: &mut dyn Write) -> anyhow::Result<DemoOutcome> {
        let mut workspace = Workspace::new();
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coding agent. Use the tools to fix the task."}),
            json!({"role": "user", "content": TASK}),
        ];
        let mut outcome = DemoOutcome::default();
        let mut step = 0usize;
        loop {
            if outcome.requests >= 40 {
                writeln!(out, "(the demo stops here: 40 requests)")?;
                break;
            }
            let body = json!({"model": "demo-model", "messages": messages, "tools": tools()});
            let sent = body.to_string();
            let resp = self
                .http
                .post(&self.url)
                .header("content-type", "application/json")
                .header("authorization", "Bearer demo-no-key")
                .body(sent.clone())
                .send()
                .await?;
            outcome.requests += 1;
            let decision = resp
                .headers()
                .get("x-loopwarden-decision")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("observe")
                .to_string();
            outcome.decisions.push(decision.clone());
            let status = resp.status();
            let bytes = resp.bytes().await?;
            anyhow::ensure!(
                status.is_success(),
                "the proxy answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
            self.show_reminder(out, &sent, messages.len(), &decision, &mut outcome)?;

            let turn = Dialect::OpenAiChat.parse_response(&bytes)?;
            let reply: Value = serde_json::from_slice(&bytes)?;
            let message = reply["choices"][0]["message"].clone();
            if decision == "halt" || decision == "block" || turn.text.starts_with("[loopwarden]") {
                writeln!(out, "      -> loopwarden {decision}: the agent received this answer instead of the model's:")?;
                print_box(out, &turn.text)?;
                outcome.halt = Some(turn.text.clone());
                break;
            }
            if turn.calls.is_empty() {
                writeln!(out, "      the model answered: {}", line(&turn.text, 100))?;
                break;
            }
            messages.push(message);
            for call in &turn.calls {
                step += 1;
                let output = workspace.run(&call.name, &call.args);
                print_step(out, step, call, &output)?;
                messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": output}));
            }
            out.flush()?;
            tokio::time::sleep(self.step_delay).await;
        }
        Ok(outcome)
    }

    /// Prints what the model received beyond what the agent `sent` (its first `ours`
    /// messages): loopwarden's reminder, once per new text.
    fn show_reminder(
        &self,
        out: &mut dyn Write,
        sent: &str,
        ours: usize,
        decision: &str,
        outcome: &mut DemoOutcome,
    ) -> std::io::Result<()> {
        let Some(upstream) = self
            .mock
            .requests()
            .last()
            .filter(|r| r.body.as_ref() != sent.as_bytes())
            .map(|r| r.json())
        else {
            return Ok(());
        };
        for added in upstream["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .skip(ours)
        {
            if let Some(text) = added["content"].as_str() {
                if outcome.reminders.last().map(String::as_str) != Some(text) {
                    outcome.reminders.push(text.to_string());
                    writeln!(out, "      -> loopwarden {decision}: the model received this reminder with the request:")?;
                    print_box(out, text)?;
                }
            }
        }
        Ok(())
    }
}

/// One agent step: the tool call, its main argument, and the first line of its output.
fn print_step(
    out: &mut dyn Write,
    step: usize,
    call: &crate::transcript::ToolCall,
    output: &str,
) -> std::io::Result<()> {
    let args = match call.name.as_str() {
        "read_file" => call.args["file_path"].as_str().unwrap_or("").to_string(),
        "replace" => format!(
            "{} {:?} -> {:?}",
            call.args["file_path"].as_str().unwrap_or(""),
            call.args["old_string"].as_str().unwrap_or("").trim(),
            call.args["new_string"].as_str().unwrap_or("").trim()
        ),
        "run_shell_command" => call.args["command"].as_str().unwrap_or("").to_string(),
        _ => String::new(),
    };
    writeln!(
        out,
        "  {step:>2}  {:<48} {}",
        line(&format!("{} {args}", call.name), 48),
        line(output, 70)
    )
}

/// The conversation's timeline as loopwarden's admin API reads it from the log: one line
/// per detector (its first finding, and how often it fired), then each decision.
async fn print_timeline(
    out: &mut dyn Write,
    http: &reqwest::Client,
    proxy_url: &str,
    conversation: &str,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "timeline from loopwarden's log (GET /admin/api/conversations/{conversation}):"
    )?;
    let timeline_bytes = http
        .get(format!(
            "{proxy_url}/admin/api/conversations/{conversation}"
        ))
        .send()
        .await?
        .bytes()
        .await?;
    let timeline: Value = serde_json::from_slice(&timeline_bytes).unwrap_or(Value::Null);
    let mut by_detector: Vec<(String, String, usize)> = Vec::new();
    for f in timeline["findings"].as_array().into_iter().flatten() {
        let detector = f["detector"].as_str().unwrap_or("").to_string();
        match by_detector.iter_mut().find(|(d, _, _)| *d == detector) {
            Some((_, _, n)) => *n += 1,
            None => {
                by_detector.push((detector, f["summary"].as_str().unwrap_or("").to_string(), 1))
            }
        }
    }
    for (detector, summary, n) in &by_detector {
        let times = if *n > 1 {
            format!(" (x{n})")
        } else {
            String::new()
        };
        writeln!(
            out,
            "  finding   {:<18} {}{times}",
            detector,
            line(summary, 80)
        )?;
    }
    for d in timeline["decisions"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "  decision  {:<18} at step {:<3} {}",
            d["action"].as_str().unwrap_or(""),
            d["step"].as_i64().unwrap_or(0),
            line(d["reason"].as_str().unwrap_or(""), 80)
        )?;
    }
    Ok(())
}

/// A private scratch directory for the demo's log.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "loopwarden-demo-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
