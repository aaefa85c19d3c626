//! Instruction counts of the per-request path under callgrind: noise-free before/after
//! figures on a machine shared with others (wall-clock benches there swing by 2x).
//!
//! `scripts/callgrind.sh` builds this and runs each scenario under
//! `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=*measured*`, so only
//! the work inside [`measured`] is counted, never the payload generation or the priming.
//! Run alone (`cargo bench --bench instructions -- SCENARIO`), it just runs the scenario
//! once; `list` prints the scenario names.

mod support;

use std::hint::black_box;

use bytes::Bytes;
use http::HeaderMap;

use loopwarden::detect::Decision;
use loopwarden::dialect::Dialect;

use support::{Agent, Proxy, Shape, SIZES};

/// The only code callgrind counts.
#[inline(never)]
fn measured(proxy: &mut Proxy, dialect: Dialect, headers: &HeaderMap, body: &Bytes) -> Decision {
    proxy.analyse(dialect, headers, body)
}

/// Reading the bytes: the scan that finds the messages (it touches every byte).
#[inline(never)]
fn measured_read(dialect: Dialect, body: &[u8]) -> usize {
    let view = dialect.view(body, false).expect("bench payloads parse");
    view.messages.len()
}

/// Decoding an upstream answer, as the log thread does for every non-streamed answer.
#[inline(never)]
fn measured_answer(dialect: Dialect, body: &[u8]) -> usize {
    let turn = dialect.parse_response(body).expect("bench answers parse");
    turn.text.len() + turn.calls.len()
}

/// The four APIs by the names the `answer/` scenarios use.
const ANSWER_DIALECTS: [(&str, Dialect); 4] = [
    ("openai", Dialect::OpenAiChat),
    ("anthropic", Dialect::Anthropic),
    ("responses", Dialect::OpenAiResponses),
    ("gemini", Dialect::Gemini),
];

/// Reading one history message, as a request does for each message new to it.
#[inline(never)]
fn measured_message(dialect: Dialect, raw: &str) -> usize {
    dialect.parse_message(raw).len()
}

fn scenarios() -> Vec<String> {
    let mut out = Vec::new();
    for (name, _) in ANSWER_DIALECTS {
        for kind in support::ANSWERS {
            out.push(format!("answer/{name}/{kind}"));
        }
        out.push(format!("result/{name}/8KB"));
    }
    for shape in ["openai", "anthropic"] {
        for (size, _) in SIZES {
            out.push(format!("warm/{shape}/{size}"));
            out.push(format!("cold/{shape}/{size}"));
        }
        for k in [30, 300] {
            out.push(format!("growth/{shape}/{k}"));
            out.push(format!("steady/{shape}/{k}"));
            out.push(format!("read_bytes/{shape}/{k}"));
        }
    }
    out
}

fn main() {
    // `cargo bench` passes `--bench`; the scenario is the first other argument.
    let Some(name) = std::env::args().skip(1).find(|a| !a.starts_with("--")) else {
        eprintln!("usage: instructions SCENARIO | list");
        return;
    };
    if name == "list" {
        for s in scenarios() {
            println!("{s}");
        }
        return;
    }
    let parts: Vec<&str> = name.split('/').collect();
    let [kind, shape, arg] = parts[..] else {
        eprintln!("unknown scenario {name}; try `list`");
        std::process::exit(2);
    };
    if kind == "answer" || kind == "result" {
        let Some(&(_, dialect)) = ANSWER_DIALECTS.iter().find(|(n, _)| *n == shape) else {
            eprintln!("unknown API {shape}");
            std::process::exit(2);
        };
        if kind == "answer" {
            let body = support::answer(dialect, arg);
            black_box(measured_answer(dialect, &body));
        } else {
            let raw = support::tool_result(dialect);
            black_box(measured_message(dialect, &raw));
        }
        return;
    }
    let shape = match shape {
        "openai" => Shape::OpenAi,
        "anthropic" => Shape::Anthropic,
        _ => {
            eprintln!("unknown shape {shape}");
            std::process::exit(2);
        }
    };
    let dialect = shape.dialect();
    let headers = HeaderMap::new();
    match kind {
        "warm" | "cold" => {
            let Some(&(_, size)) = SIZES.iter().find(|(l, _)| *l == arg) else {
                eprintln!("unknown size {arg}");
                std::process::exit(2);
            };
            let body = support::payload(shape, size);
            let mut proxy = Proxy::new();
            if kind == "warm" {
                proxy.analyse(dialect, &headers, &body);
            }
            black_box(measured(&mut proxy, dialect, &headers, &body));
        }
        "growth" | "steady" | "read_bytes" => {
            // An agent that names its conversation, as Claude Code, Codex and opencode do.
            let headers = support::stated_headers();
            let k: usize = arg.parse().unwrap_or(30).max(1);
            let mut agent = Agent::new(7);
            let turns: Vec<_> = (0..k).map(|_| agent.turn(false)).collect();
            let before = support::render(shape, &turns[..k - 1], false);
            let body = support::render(shape, &turns, false);
            if kind != "read_bytes" {
                let mut proxy = Proxy::new();
                if kind == "steady" && k > 2 {
                    // The predecessor was itself read after its own predecessor, as every
                    // request of a live conversation is: what it freed is what a warm
                    // request frees, not the whole first reading of the history.
                    let earlier = support::render(shape, &turns[..k - 2], false);
                    proxy.analyse(dialect, &headers, &earlier);
                }
                proxy.analyse(dialect, &headers, &before);
                black_box(measured(&mut proxy, dialect, &headers, &body));
            } else {
                black_box(measured_read(dialect, &body));
            }
        }
        _ => {
            eprintln!("unknown scenario {name}; try `list`");
            std::process::exit(2);
        }
    }
}
