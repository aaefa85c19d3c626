//! Shared pieces of the intervention tests: looping conversations in each API (built as
//! the clients send them), the request at which the engine nudges or halts them, and a
//! proxy in front of the scripted mock.
#![allow(dead_code)]

use loopwarden::config::Config;
use loopwarden::detect::{Action, Engine};
use loopwarden::dialect::Dialect;
use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use loopwarden::proxy::{self, Running};
use serde_json::{json, Value};

pub const FAILURE: &str = "FAILED test_calc.py::test_add - AssertionError: add(2, 2) returned 0";
pub const COMMAND: &str = "python3 test_calc.py";

pub const ALL: [Dialect; 4] = [
    Dialect::OpenAiChat,
    Dialect::OpenAiResponses,
    Dialect::Anthropic,
    Dialect::Gemini,
];

/// The path of a conversation endpoint, under a `/c/{id}` prefix.
pub fn path(dialect: Dialect, conversation: &str, stream: bool) -> String {
    let api = match dialect {
        Dialect::OpenAiChat => "/v1/chat/completions".to_string(),
        Dialect::OpenAiResponses => "/v1/responses".to_string(),
        Dialect::Anthropic => "/v1/messages".to_string(),
        Dialect::Gemini if stream => "/v1beta/models/g:streamGenerateContent?alt=sse".to_string(),
        Dialect::Gemini => "/v1beta/models/g:generateContent".to_string(),
    };
    format!("/c/{conversation}{api}")
}

/// What a looping conversation says: the task, the command run again and again, its
/// failing output, and what the agent writes before each run (nothing when empty).
#[derive(Debug, Clone)]
pub struct LoopText {
    pub task: String,
    pub command: String,
    pub result: String,
    pub thought: String,
}

impl Default for LoopText {
    fn default() -> LoopText {
        LoopText {
            task: "Fix the failing test in test_calc.py".into(),
            command: COMMAND.into(),
            result: format!("{FAILURE}\n1 failed"),
            thought: String::new(),
        }
    }
}

/// A conversation in which the agent ran the same failing test `k` times, as `dialect`
/// sends it; `human` adds a user message at the end (a human speaking).
pub fn loop_body(dialect: Dialect, k: usize, stream: bool, human: Option<&str>) -> Value {
    loop_body_with(dialect, k, stream, human, &LoopText::default())
}

/// [`loop_body`] saying `text`.
pub fn loop_body_with(
    dialect: Dialect,
    k: usize,
    stream: bool,
    human: Option<&str>,
    text: &LoopText,
) -> Value {
    let task = text.task.as_str();
    let args = json!({"command": text.command});
    let result = text.result.as_str();
    let thought = (!text.thought.is_empty()).then_some(text.thought.as_str());
    match dialect {
        Dialect::OpenAiChat => {
            let mut m = vec![
                json!({"role": "system", "content": "You are a coding agent."}),
                json!({"role": "user", "content": task}),
            ];
            for i in 0..k {
                m.push(json!({"role": "assistant", "content": thought, "tool_calls": [{"id": format!("call_{i}"), "type": "function",
                    "function": {"name": "bash", "arguments": args.to_string()}}]}));
                m.push(
                    json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}),
                );
            }
            if let Some(h) = human {
                m.push(json!({"role": "user", "content": h}));
            }
            json!({"model": "gpt-test", "stream": stream, "messages": m,
                   "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
                             {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]})
        }
        Dialect::OpenAiResponses => {
            let mut input = vec![
                json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]}),
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}),
            ];
            for i in 0..k {
                if let Some(t) = thought {
                    input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]}));
                }
                input.push(json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("call_{i}"),
                    "name": "exec_command", "arguments": json!({"cmd": text.command}).to_string(), "status": "completed"}));
                input.push(
                    json!({"type": "function_call_output", "call_id": format!("call_{i}"),
                    "output": format!("Process exited with code 1\nOutput:\n{result}")}),
                );
            }
            if let Some(h) = human {
                input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": h}]}));
            }
            json!({"model": "gpt-test", "stream": stream, "input": input,
                   "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]})
        }
        Dialect::Anthropic => {
            let mut m = vec![json!({"role": "user", "content": [{"type": "text", "text": task}]})];
            for i in 0..k {
                let mut said: Vec<Value> = thought
                    .map(|t| json!({"type": "text", "text": t}))
                    .into_iter()
                    .collect();
                said.push(json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": "Bash", "input": args}));
                m.push(json!({"role": "assistant", "content": said}));
                let mut content = vec![
                    json!({"type": "tool_result", "tool_use_id": format!("toolu_{i}"),
                    "content": format!("Exit code 1\n{result}"), "is_error": true}),
                ];
                if i + 1 == k {
                    if let Some(h) = human {
                        content.push(json!({"type": "text", "text": h}));
                    }
                }
                m.push(json!({"role": "user", "content": content}));
            }
            json!({"model": "claude-test", "max_tokens": 1000, "stream": stream, "messages": m,
                   "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]})
        }
        Dialect::Gemini => {
            let mut c = vec![json!({"role": "user", "parts": [{"text": task}]})];
            for i in 0..k {
                let mut parts: Vec<Value> =
                    thought.map(|t| json!({"text": t})).into_iter().collect();
                parts.push(json!({"functionCall": {"name": "run_shell_command", "args": args, "id": format!("fc{i}")}}));
                c.push(json!({"role": "model", "parts": parts}));
                c.push(json!({"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "id": format!("fc{i}"),
                    "response": {"output": format!("Output: {result}\nExit Code: 1")}}}]}));
            }
            if let Some(h) = human {
                c.push(json!({"role": "user", "parts": [{"text": h}]}));
            }
            let _ = stream; // Gemini streams by path
            json!({"contents": c, "tools": [{"functionDeclarations": [{"name": "run_shell_command"}, {"name": "read_file"}]}]})
        }
    }
}

/// The engine's decision for a body.
pub fn decide(dialect: Dialect, body: &Value) -> Action {
    let bytes = serde_json::to_vec(body).unwrap();
    let parsed = dialect
        .parse_request(&bytes, dialect == Dialect::Gemini)
        .unwrap();
    Engine::default().decide(&parsed.transcript).action
}

/// The smallest number of failing runs at which the default engine decides `action`.
pub fn first_k(dialect: Dialect, action: Action) -> usize {
    (1..40)
        .find(|&k| decide(dialect, &loop_body(dialect, k, false, None)) == action)
        .unwrap_or_else(|| panic!("{dialect:?}: the engine never decides {action:?} on the loop"))
}

/// The smallest k whose request is forwarded but whose answer (the looping call) is blocked.
pub fn block_k(dialect: Dialect) -> Option<usize> {
    use loopwarden::detect::{Engine, StoreFacts};
    let engine = Engine::default();
    let call = {
        let c = loop_call(dialect);
        loopwarden::transcript::ToolCall {
            id: "x".into(),
            name: c.name.clone(),
            args: c.arguments.clone().unwrap_or(json!({})),
        }
    };
    (1..40).find(|&k| {
        let bytes = loop_body(dialect, k, false, None).to_string();
        let t = dialect
            .parse_request(bytes.as_bytes(), dialect == Dialect::Gemini)
            .unwrap()
            .transcript;
        let (d, state) = engine.decide_with(&t, &StoreFacts::default(), None);
        let turn = loopwarden::dialect::ResponseTurn {
            calls: vec![call.clone()],
            ..Default::default()
        };
        !d.action.stops() && engine.decide_response_with(&state, &turn).action == Action::Block
    })
}

/// The mock's looping turn: the same test again.
pub fn loop_call(dialect: Dialect) -> ToolCall {
    match dialect {
        Dialect::OpenAiChat => ToolCall::function("bash", json!({"command": COMMAND})),
        Dialect::OpenAiResponses => ToolCall::function("exec_command", json!({"cmd": COMMAND})),
        Dialect::Anthropic => ToolCall::function("Bash", json!({"command": COMMAND})),
        Dialect::Gemini => ToolCall::function("run_shell_command", json!({"command": COMMAND})),
    }
}

/// A mock that answers every turn with text then the looping call.
pub fn looping_script(dialect: Dialect) -> Script {
    let mut script = Script::with_turns(vec![Turn {
        text: Some("Running the test again.".into()),
        tool_calls: vec![loop_call(dialect)],
        ..Turn::default()
    }]);
    script.after_end = loopwarden::mock::AfterEnd::RepeatLast;
    script
}

pub struct Setup {
    pub mock: MockServer,
    pub proxy: Running,
    pub dir: tempfile::TempDir,
}

impl Setup {
    pub async fn start(script: Script, adjust: impl FnOnce(&mut Config)) -> Setup {
        let mock = MockServer::start(script).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let proxy = proxy::start(config(&mock, &dir, adjust)).await.unwrap();
        Setup { mock, proxy, dir }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.proxy.url())
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        client()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    pub async fn admin(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        // Admin writes are JSON (`proxy::operator::admin::check`), an empty body included.
        let post = || {
            client()
                .post(self.url(path))
                .header("content-type", "application/json")
        };
        let request = match body {
            Some(b) => post().body(b.to_string()),
            None if path.ends_with("/resume") || path.ends_with("/halt") => post(),
            None => client().get(self.url(path)),
        };
        let resp = request.send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

pub fn config(
    mock: &MockServer,
    dir: &tempfile::TempDir,
    adjust: impl FnOnce(&mut Config),
) -> Config {
    let mut config = Config::default();
    config.server.listen = "127.0.0.1:0".into();
    config.store.db = format!("sqlite://{}", dir.path().join("log.db").display());
    // In the test's directory on PostgreSQL too (its default is the working directory).
    config.store.spill = dir.path().join("log.spill.jsonl").display().to_string();
    config.upstream.openai = mock.url();
    config.upstream.anthropic = mock.url();
    config.upstream.gemini = mock.url();
    adjust(&mut config);
    config
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The answer a client reads: (text, tool call names, saw the end of the message).
pub fn read_answer(dialect: Dialect, stream: bool, body: &[u8]) -> (String, Vec<String>, bool) {
    if stream {
        let mut d = dialect.stream_decoder();
        let mut events = d.feed(body);
        events.extend(d.flush());
        let ended = events
            .iter()
            .any(|e| e.kind == loopwarden::dialect::StreamEventKind::MessageEnd);
        let turn = d.finish();
        (
            turn.text,
            turn.calls.into_iter().map(|c| c.name).collect(),
            ended,
        )
    } else {
        let turn = dialect.parse_response(body).unwrap();
        (
            turn.text,
            turn.calls.into_iter().map(|c| c.name).collect(),
            true,
        )
    }
}

/// A webhook receiver: answers every POST with 204 and hands over its JSON body.
pub async fn receiver() -> (String, tokio::sync::mpsc::UnboundedReceiver<Value>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    loopwarden::spawn::task("test", async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            loopwarden::spawn::task("test", async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body = loop {
                    let n = tokio::io::AsyncReadExt::read(&mut socket, &mut chunk)
                        .await
                        .unwrap();
                    assert!(n > 0, "the request ended early");
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    assert!(head.starts_with("post /hook "), "{head}");
                    assert!(head.contains("content-type: application/json"), "{head}");
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .unwrap()
                        .trim()
                        .parse()
                        .unwrap();
                    if buf.len() >= end + 4 + length {
                        break buf[end + 4..end + 4 + length].to_vec();
                    }
                };
                tokio::io::AsyncWriteExt::write_all(
                    &mut socket,
                    b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
                )
                .await
                .unwrap();
                let _ = tx.send(serde_json::from_slice(&body).unwrap());
            });
        }
    });
    (url, rx)
}
