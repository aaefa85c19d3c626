//! Detection cost (issue 5): the N-th request of a conversation continues the cached
//! engine state with only its new step, so request 300 costs about what request 30 does;
//! and the full replay of a 300-step transcript.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use loopwarden::detect::{Engine, StoreFacts};
use loopwarden::transcript::{CallWithResult, Step, ToolCall, ToolResult, Transcript};
use serde_json::json;

/// A realistic 300-step conversation: reads, edits and test runs with ~1 KB results.
fn conversation(n: usize) -> Transcript {
    let body: String = (0..30)
        .map(|i| format!("line {i}: some program output here\n"))
        .collect();
    let steps = (0..n)
        .map(|i| {
            let (name, args, out) = match i % 3 {
                0 => (
                    "Read",
                    json!({"file_path": format!("/r/src/m{}.py", i % 17)}),
                    body.clone(),
                ),
                1 => (
                    "Edit",
                    json!({"file_path": format!("/r/src/m{}.py", i % 17), "old_string": format!("a{i}"), "new_string": format!("b{i}")}),
                    "The file has been updated successfully.".to_string(),
                ),
                _ => (
                    "Bash",
                    json!({"command": "cd /r && pytest -x tests/test_m.py"}),
                    format!("Exit code 1\n{body}FAILED test_{} - AssertionError", i % 5),
                ),
            };
            Step {
                index: i,
                text: format!("Step {i}: let me look at the next part."),
                calls: vec![CallWithResult {
                    call: ToolCall {
                        id: format!("t{i}"),
                        name: name.into(),
                        args,
                    },
                    result: Some(ToolResult {
                        call_id: format!("t{i}"),
                        name: String::new(),
                        text: out,
                        is_error: None,
                    }),
                }],
                user_after: vec![],
            }
        })
        .collect();
    Transcript {
        system: vec!["sys".into()],
        task: vec!["fix the tests".into()],
        steps,
    }
}

fn bench(c: &mut Criterion) {
    let engine = Engine::default();
    let full = conversation(300);
    let store = StoreFacts::default();
    for k in [30usize, 300] {
        let prefix = Transcript {
            steps: full.steps[..k - 1].to_vec(),
            ..full.clone()
        };
        let request = Transcript {
            steps: full.steps[..k].to_vec(),
            ..full.clone()
        };
        let (_, cached) = engine.decide_with(&prefix, &store, None);
        c.bench_function(&format!("request {k} (cached state + 1 new step)"), |b| {
            b.iter(|| black_box(engine.decide_with(&request, &store, Some(cached.clone()))))
        });
    }
    c.bench_function("full replay of a 300-step transcript", |b| {
        b.iter(|| black_box(engine.decisions(&full, &store)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
