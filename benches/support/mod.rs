//! Synthetic coding-agent conversations for the benchmarks, in OpenAI Chat Completions and
//! Anthropic Messages shapes: a system prompt, a dozen tool definitions, a task, then
//! assistant turns that read files, grep, edit and run tests, with results that hold
//! source text, test logs and grep hits (the bulk of a real agent's history).
//!
//! Deterministic (seeded), so every run measures the same bytes.

#![allow(dead_code)] // each bench uses a different part

use std::hint::black_box;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Value};

use loopwarden::config::CacheConfig;
use loopwarden::detect::Decision;
use loopwarden::dialect::Dialect;
use loopwarden::interventions::ConversationState;
use loopwarden::policy::Policy;
use loopwarden::proxy::forward::{Analyser, Arrival};
use loopwarden::proxy::memory::{BodyComparison, Memory};
use loopwarden::proxy::{identity, serve::route};
use loopwarden::request_bytes::RequestBytes;

/// Which wire format to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    OpenAi,
    Anthropic,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::OpenAi => "openai",
            Shape::Anthropic => "anthropic",
        }
    }

    pub fn dialect(self) -> loopwarden::dialect::Dialect {
        match self {
            Shape::OpenAi => loopwarden::dialect::Dialect::OpenAiChat,
            Shape::Anthropic => loopwarden::dialect::Dialect::Anthropic,
        }
    }
}

/// The three sizes issue 5 measures (the same as the load harness's payloads).
pub const SIZES: [(&str, usize); 3] = [
    ("8.8KB", 8_800),
    ("209KB", 209 * 1024),
    ("2MB", 2 * 1024 * 1024),
];

const SYSTEM: &str = "You are an autonomous software engineering agent working inside a sandboxed \
repository. You can read and edit files, run shell commands and search the code base using the \
tools provided.\n\n# Operating rules\n- ConversationState editing a file, read the relevant region of it.\n- \
Prefer small, reviewable edits. After each edit, run the narrowest test that covers it.\n- When a \
command fails, read the error output and fix the root cause; do not retry the same command \
unchanged.\n- Do not touch files outside the repository root.\n\n# Conventions\n- Rust 2021, \
`cargo fmt` and `cargo clippy -- -D warnings` must pass.\n- Errors use thiserror in libraries and \
anyhow in binaries.\n";

const TASK: &str = "The proxy drops the last SSE event when the upstream closes the connection \
without a trailing blank line. Find the cause, fix it, and add a regression test.";

const WORDS: [&str; 24] = [
    "request", "body", "frame", "stream", "buffer", "parse", "event", "header", "state", "error",
    "client", "upstream", "chunk", "len", "offset", "config", "pool", "span", "retry", "timeout",
    "decode", "encode", "cache", "entry",
];

/// One assistant turn and the results of its calls, wire-neutral.
#[derive(Debug, Clone)]
pub struct Turn {
    pub text: String,
    /// (call id, tool name, arguments object, result text, is_error)
    pub calls: Vec<(String, &'static str, Value, String, bool)>,
}

/// A deterministic stream of agent turns.
pub struct Agent {
    rng: fastrand::Rng,
    n: usize,
}

impl Agent {
    pub fn new(seed: u64) -> Agent {
        Agent {
            rng: fastrand::Rng::with_seed(seed),
            n: 0,
        }
    }

    fn word(&mut self) -> &'static str {
        WORDS[self.rng.usize(..WORDS.len())]
    }

    fn ident(&mut self) -> String {
        format!("{}_{}", self.word(), self.word())
    }

    fn path(&mut self) -> String {
        format!("src/{}/{}.rs", self.word(), self.word())
    }

    fn source(&mut self, lines: usize) -> String {
        let mut out = String::new();
        for i in 1..=lines {
            let line = match self.rng.u8(..6) {
                0 => format!(
                    "pub fn {}(&mut self, {}: usize) -> Result<(), Error> {{",
                    self.ident(),
                    self.word()
                ),
                1 => format!(
                    "    let {} = self.{}.{}({})?;",
                    self.ident(),
                    self.word(),
                    self.ident(),
                    self.word()
                ),
                2 => format!(
                    "    // {} the {} before the {} is {}",
                    self.word(),
                    self.word(),
                    self.word(),
                    self.word()
                ),
                3 => format!(
                    "    if {}.len() > {} {{ return Err(Error::{}); }}",
                    self.word(),
                    self.rng.u32(..4096),
                    self.word()
                ),
                4 => "    }".to_string(),
                _ => format!(
                    "    tracing::debug!({} = ?{}, \"{} {}\");",
                    self.word(),
                    self.word(),
                    self.word(),
                    self.word()
                ),
            };
            out.push_str(&format!("{i:>5}\t{line}\n"));
        }
        out
    }

    fn test_log(&mut self, fail: bool) -> String {
        let mut out = String::from("   Compiling proxy v0.3.0 (/workspace/repo)\n    Finished `test` profile in 4.2s\n     Running unittests src/lib.rs\n\n");
        let n = 8 + self.rng.usize(..30);
        for _ in 0..n {
            out.push_str(&format!(
                "test {}::tests::{} ... ok\n",
                self.word(),
                self.ident()
            ));
        }
        if fail {
            let name = self.ident();
            out.push_str(&format!(
                "test stream::tests::{name} ... FAILED\n\nfailures:\n\n---- stream::tests::{name} stdout ----\nthread '{name}' panicked at src/stream.rs:{}:9:\nassertion `left == right` failed\n  left: 3\n right: 4\n\ntest result: FAILED. {n} passed; 1 failed\n",
                self.rng.u32(10..400)
            ));
        } else {
            out.push_str(&format!("\ntest result: ok. {n} passed; 0 failed\n"));
        }
        out
    }

    /// The next turn; `big` makes results larger (whole files rather than excerpts).
    pub fn turn(&mut self, big: bool) -> Turn {
        self.n += 1;
        let n = self.n;
        let id = |k: usize| format!("call_{n:04}_{k}");
        let text = format!(
            "Let me look at how the {} handles the {} next.",
            self.word(),
            self.word()
        );
        let lines = if big {
            40 + self.rng.usize(..120)
        } else {
            6 + self.rng.usize(..14)
        };
        let calls = match self.rng.u8(..5) {
            0 | 1 => {
                let path = self.path();
                let src = self.source(lines);
                vec![(
                    id(0),
                    "read_file",
                    json!({"path": path, "start_line": 1}),
                    src,
                    false,
                )]
            }
            2 => {
                let pattern = self.ident();
                let mut hits = String::new();
                for _ in 0..(lines / 3).max(2) {
                    hits.push_str(&format!(
                        "{}:{}:    let {pattern} = {};\n",
                        self.path(),
                        self.rng.u32(1..900),
                        self.word()
                    ));
                }
                let path = self.path();
                let src = self.source(lines / 2 + 2);
                vec![
                    (
                        id(0),
                        "grep",
                        json!({"pattern": pattern, "path": "src"}),
                        hits,
                        false,
                    ),
                    (id(1), "read_file", json!({"path": path}), src, false),
                ]
            }
            3 => {
                let path = self.path();
                let old = format!("let {} = {};", self.ident(), self.word());
                let new = format!("let {} = {}?;", self.ident(), self.word());
                vec![(
                    id(0),
                    "edit_file",
                    json!({"path": path, "old_string": old, "new_string": new}),
                    format!("Edited {path}: 1 replacement."),
                    false,
                )]
            }
            _ => {
                let fail = self.rng.bool();
                let log = self.test_log(fail);
                vec![(
                    id(0),
                    "run_shell",
                    json!({"command": format!("cargo test -p proxy {}", self.word()), "timeout_s": 120}),
                    log,
                    fail,
                )]
            }
        };
        Turn { text, calls }
    }

    /// Turns until the rendered body reaches `target` bytes.
    pub fn conversation(&mut self, shape: Shape, target: usize) -> Vec<Turn> {
        let big = target > 100_000;
        let mut turns = Vec::new();
        // Estimate as we go (rendering every time would be quadratic), then top up exactly.
        let mut estimate = render(shape, &turns, false).len();
        while estimate < target {
            let turn = self.turn(big);
            estimate += turn.text.len()
                + turn
                    .calls
                    .iter()
                    .map(|(_, _, args, result, _)| {
                        args.to_string().len() + result.len() * 11 / 10 + 120
                    })
                    .sum::<usize>();
            turns.push(turn);
        }
        while turns.len() > 1 && render(shape, &turns, false).len() > target + target / 20 {
            turns.pop();
        }
        while render(shape, &turns, false).len() < target {
            turns.push(self.turn(big));
        }
        turns
    }
}

fn tools() -> Vec<(&'static str, &'static str, Value)> {
    let s = |d: &str| json!({"type": "string", "description": d});
    let i = |d: &str| json!({"type": "integer", "description": d});
    let obj = |props: Value, req: &[&str]| json!({"type": "object", "properties": props, "required": req, "additionalProperties": false});
    vec![
        (
            "read_file",
            "Read a UTF-8 text file from the repository with line numbers.",
            obj(
                json!({"path": s("Path relative to the root."), "start_line": i("First line, 1-based."), "end_line": i("Last line.")}),
                &["path"],
            ),
        ),
        (
            "write_file",
            "Create or overwrite a file.",
            obj(
                json!({"path": s("Path."), "content": s("Full new content.")}),
                &["path", "content"],
            ),
        ),
        (
            "edit_file",
            "Replace an exact, unique occurrence of old_string with new_string.",
            obj(
                json!({"path": s("Path."), "old_string": s("Exact text to replace."), "new_string": s("Replacement.")}),
                &["path", "old_string", "new_string"],
            ),
        ),
        (
            "run_shell",
            "Run a bash command in the repository root; returns stdout, stderr and the exit code.",
            obj(
                json!({"command": s("The command line."), "timeout_s": i("Timeout in seconds.")}),
                &["command"],
            ),
        ),
        (
            "grep",
            "Search file contents with a regular expression.",
            obj(
                json!({"pattern": s("Regular expression."), "path": s("Directory or file.")}),
                &["pattern"],
            ),
        ),
        (
            "glob",
            "List files matching a glob pattern.",
            obj(json!({"pattern": s("Glob pattern.")}), &["pattern"]),
        ),
        (
            "list_dir",
            "List the entries of a directory.",
            obj(json!({"path": s("Directory path.")}), &["path"]),
        ),
        (
            "git_diff",
            "Show the working-tree diff.",
            obj(json!({"staged": {"type": "boolean"}}), &[]),
        ),
    ]
}

/// The request body that carries `turns` as history (every call answered).
pub fn render(shape: Shape, turns: &[Turn], stream: bool) -> Bytes {
    let body = match shape {
        Shape::OpenAi => {
            let mut messages = vec![
                json!({"role": "system", "content": SYSTEM}),
                json!({"role": "user", "content": TASK}),
            ];
            for t in turns {
                let calls: Vec<Value> = t
                    .calls
                    .iter()
                    .map(|(id, name, args, _, _)| {
                        json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}})
                    })
                    .collect();
                messages.push(json!({"role": "assistant", "content": t.text, "tool_calls": calls}));
                for (id, _, _, result, _) in &t.calls {
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
                }
            }
            let tools: Vec<Value> = tools()
                .into_iter()
                .map(|(name, description, parameters)| {
                    json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}})
                })
                .collect();
            json!({"model": "gpt-4.1", "stream": stream, "messages": messages, "tools": tools, "temperature": 0.2})
        }
        Shape::Anthropic => {
            let mut messages =
                vec![json!({"role": "user", "content": [{"type": "text", "text": TASK}]})];
            for t in turns {
                let mut content = vec![json!({"type": "text", "text": t.text})];
                content.extend(t.calls.iter().map(|(id, name, args, _, _)| {
                    json!({"type": "tool_use", "id": id, "name": name, "input": args})
                }));
                messages.push(json!({"role": "assistant", "content": content}));
                let results: Vec<Value> = t
                    .calls
                    .iter()
                    .map(|(id, _, _, result, is_error)| {
                        json!({"type": "tool_result", "tool_use_id": id, "content": result, "is_error": is_error})
                    })
                    .collect();
                messages.push(json!({"role": "user", "content": results}));
            }
            let tools: Vec<Value> = tools()
                .into_iter()
                .map(|(name, description, schema)| {
                    json!({"name": name, "description": description, "input_schema": schema})
                })
                .collect();
            json!({
                "model": "claude-sonnet-4-5",
                "max_tokens": 8192,
                "stream": stream,
                "system": [{"type": "text", "text": SYSTEM}],
                "tools": tools,
                "messages": messages,
            })
        }
    };
    Bytes::from(serde_json::to_vec(&body).expect("a JSON value always serializes"))
}

/// A conversation of about `target` bytes in `shape`, rendered.
pub fn payload(shape: Shape, target: usize) -> Bytes {
    let turns = Agent::new(target as u64).conversation(shape, target);
    render(shape, &turns, false)
}

/// The proxy's analysis ([`Analyser`]), as `proxy::forward` runs it for a body that
/// arrived in one frame, with no sticky halts or resumes.
pub struct Proxy {
    analyser: Analyser,
    policy: std::sync::Arc<Policy>,
}

impl Proxy {
    pub fn new() -> Proxy {
        Proxy {
            analyser: Analyser {
                memory: Memory::new(&CacheConfig {
                    max_bytes: 1 << 30,
                    conversation_max_bytes: 1 << 30,
                    idle_secs: 3600,
                    ..CacheConfig::default()
                }),
            },
            policy: std::sync::Arc::new(Policy::detecting(Default::default())),
        }
    }

    /// The per-request work of `proxy::forward` before the bytes go upstream and once
    /// the log entry is made: [`Analyser::analyse`] (identity, the conversation's last
    /// request, the view resumed after it, the cached parse, the transcript, the decision
    /// from the cached fold) and [`Analyser::keep`] (the steps new to the log, this request
    /// kept for the next one).
    pub fn analyse(&mut self, dialect: Dialect, headers: &HeaderMap, body: &Bytes) -> Decision {
        let uri = http::Uri::from_static(match dialect {
            Dialect::OpenAiChat => "/v1/chat/completions",
            Dialect::OpenAiResponses => "/v1/responses",
            Dialect::Anthropic => "/v1/messages",
            Dialect::Gemini => "/v1beta/models/gemini-2.5-pro:generateContent",
        });
        let route = route::route(&uri, headers);
        let stated = identity::stated(headers, None);
        let earlier = BodyComparison::new(
            &self.analyser.memory,
            Some(dialect),
            stated.as_ref().map(|s| &*s.id),
        );
        let body = RequestBytes::from(body.clone());
        let arrival = Arrival {
            route: &route,
            headers,
            body: &body,
            stated,
            team: None,
            earlier,
        };
        let analysis = self.analyser.analyse(
            arrival,
            |_| self.policy.clone(),
            |_, _, _, _| ConversationState::free(),
        );
        let parsed = analysis.parsed.expect("bench payloads parse");
        let (logged, decision) = self.analyser.keep(parsed);
        black_box(logged.history);
        decision
    }
}

/// Headers of an agent that names its conversation (Claude Code, Codex, opencode do).
pub fn stated_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-claude-code-session-id",
        http::HeaderValue::from_static("bench-session"),
    );
    headers
}

/// How long an upstream answer is: `small` is the load harness mock's (a line of text and
/// a `read_file` call, ~0.5 KB); `edit` an answer that explains a fix and makes it (an
/// `edit_file` call whose arguments carry ~3 KB of old and new source, with the newlines
/// and quotes a real edit escapes).
pub const ANSWERS: [&str; 2] = ["small", "edit"];

/// A non-streamed upstream answer of `kind` ([`ANSWERS`]) in `dialect`'s shape: text and
/// one tool call, with the usage, ids and stop reason the API sends.
pub fn answer(dialect: Dialect, kind: &str) -> Bytes {
    let (text, name, args) = if kind == "edit" {
        let mut old = String::new();
        let mut new = String::new();
        for i in 0..24 {
            let line = format!(
                "        let {w} = frame.{v}(\"{w}\", offset + {i})?; // {x}\n",
                w = WORDS[i % WORDS.len()],
                v = WORDS[(i * 7) % WORDS.len()],
                x = WORDS[(i * 5) % WORDS.len()],
            );
            old.push_str(&line);
            new.push_str(&line.replace("offset", "self.offset"));
        }
        (
            "The decoder keeps the last event in its buffer when the stream ends without a \
             blank line: `finish` returns what was framed, not what is pending. I will flush \
             the pending event in `finish`, then add a regression test."
                .to_string(),
            "edit_file",
            json!({"path": "src/proxy/tee.rs", "old_string": old, "new_string": new}),
        )
    } else {
        (
            "I will look at the request handler to find where the timeout is configured."
                .to_string(),
            "read_file",
            json!({"path": "src/server/handlers.rs", "start_line": 120, "end_line": 240}),
        )
    };
    let body = match dialect {
        Dialect::OpenAiChat => json!({
            "id": "chatcmpl-bench0001", "object": "chat.completion", "created": 1_760_000_000,
            "model": "bench-gpt",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                "tool_calls": [{"id": "call_bench_0001", "type": "function",
                    "function": {"name": name, "arguments": args.to_string()}}]},
                "logprobs": null, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 51234, "completion_tokens": 42, "total_tokens": 51276},
            "system_fingerprint": "fp_bench"
        }),
        Dialect::Anthropic => json!({
            "id": "msg_bench0001", "type": "message", "role": "assistant", "model": "bench-claude",
            "content": [{"type": "text", "text": text},
                {"type": "tool_use", "id": "toolu_bench0001", "name": name, "input": args}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 51234, "output_tokens": 42,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        }),
        Dialect::OpenAiResponses => json!({
            "id": "resp_bench0001", "object": "response", "created_at": 1_760_000_000,
            "status": "completed", "model": "bench-gpt",
            "output": [
                {"type": "message", "id": "msg_bench0001", "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]},
                {"type": "function_call", "id": "fc_bench0001", "call_id": "call_bench_0001",
                    "name": name, "arguments": args.to_string(), "status": "completed"}],
            "usage": {"input_tokens": 51234, "output_tokens": 42, "total_tokens": 51276}
        }),
        Dialect::Gemini => json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": text}, {"functionCall": {"name": name, "args": args}}]},
                "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 51234, "candidatesTokenCount": 42,
                "totalTokenCount": 51276},
            "modelVersion": "bench-gemini"
        }),
    };
    Bytes::from(serde_json::to_vec(&body).expect("a JSON value always serializes"))
}

/// A history message holding one tool result in `dialect`'s shape: ~8 KB of source text
/// (newlines and quotes escaped), as a file read returns it. Tool results are most of a
/// conversation's bytes, and each request reads the ones new to it.
pub fn tool_result(dialect: Dialect) -> String {
    let mut text = String::new();
    for i in 0..120 {
        text.push_str(&format!(
            "{i:>4}\t    let {w} = self.{v}.get(\"{w}\").map(|x| x.{x}()).unwrap_or_default();\n",
            w = WORDS[i % WORDS.len()],
            v = WORDS[(i * 7) % WORDS.len()],
            x = WORDS[(i * 5) % WORDS.len()],
        ));
    }
    let message = match dialect {
        Dialect::OpenAiChat => json!({"role": "tool", "tool_call_id": "call_1", "content": text}),
        Dialect::Anthropic => json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": text}]}),
        Dialect::OpenAiResponses => {
            json!({"type": "function_call_output", "call_id": "call_1", "output": text})
        }
        Dialect::Gemini => json!({"role": "user", "parts": [{"functionResponse": {
            "id": "call_1", "name": "read_file", "response": {"output": text}}}]}),
    };
    message.to_string()
}
