//! A scripted mock model server speaking the four APIs (OpenAI Chat Completions, OpenAI
//! Responses, Anthropic Messages, Gemini), JSON and SSE, for tests, the e2e suite and the demo.
//!
//! It is stateless like a real model API: each request's answer is the script's turn at the
//! index given by the number of assistant turns in the request's history ([`history`]).
//! A request without tools is a side request (title, router...) answered with `side_text`.
//!
//! A script (JSON, or [`Script`] built in Rust):
//!
//! ```json
//! {"turns": [
//!    {"text": "Let me look.", "tool_calls": [{"name": "Read", "arguments": {"file_path": "calc.py"}}]},
//!    {"tool_calls": [{"name": "apply_patch", "input": "*** Begin Patch\n..."}]},
//!    {"error": {"status": 429, "headers": {"retry-after": "1"}, "times": 2},
//!     "then": {"text": "served once two 429s were given"}},
//!    {"text": "cut short", "break_after_events": 3},
//!    {"hang": true},
//!    {"text": "JSON even to a stream request", "force_json": true},
//!    {"text": "billed so", "usage": {"input": 100, "cached_input": 900, "cache_write": 0, "output": 50}}
//!  ],
//!  "after_end": "end_text", "end_text": "Done.",
//!  "side_text": "OK", "side_rules": [{"match": "complexity_score", "text": "{...}"}],
//!  "chunk_delay_ms": 0, "latency_ms": 0, "model": null}
//! ```
//!
//! `input` makes a freeform call (a Responses `custom_tool_call`; `{"input": …}` arguments on
//! the other APIs). `usage` is the answer's usage in `crate::budget::Usage`'s terms, reported
//! in each API's own (cache reads inside OpenAI's and Gemini's prompt counts, a quarter of
//! Gemini's output as thoughts; `cache_write` is Anthropic's, ordinary input elsewhere);
//! without it the counts are estimated from the sizes, nothing cached. Tool-call ids carry the turn index (`call_t3_0_…`), which keeps the turn
//! count right when a client splits or trims its history.

mod history;
mod script;
mod server;
mod socket;
mod wire;

pub use script::{AfterEnd, ErrorReply, Script, SideRule, ToolCall, Turn, SCRIPT_HELP};
pub use server::{CapturedRequest, MockServer};

/// Options of `loopwarden mock`.
#[derive(Debug, Clone, clap::Args)]
pub struct MockArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Script file (JSON; its format: `loopwarden mock --help`). Without one, every request
    /// gets `end_text` ("Done.").
    #[arg(long)]
    pub script: Option<std::path::PathBuf>,
    /// Append one JSON line per request (method, path, query, headers with secrets
    /// redacted, body, body_blake3, api, turn, answer) to this file.
    #[arg(long)]
    pub capture: Option<std::path::PathBuf>,
}

/// Entry point of `loopwarden mock`: serves until Ctrl-C or SIGTERM.
pub fn run(args: MockArgs) -> anyhow::Result<()> {
    let script = match &args.script {
        Some(path) => Script::load(path)?,
        None => Script::default(),
    };
    let addr: std::net::SocketAddr = args
        .listen
        .parse()
        .map_err(|e| anyhow::anyhow!("--listen {:?}: {e}", args.listen))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let server = MockServer::start_with(addr, script, args.capture.as_deref()).await?;
        // The e2e runner reads this line to learn the port.
        println!("loopwarden mock listening on {}", server.url());
        use std::io::Write;
        std::io::stdout().flush()?;
        wait_for_stop().await;
        server.shutdown().await;
        Ok(())
    })
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
