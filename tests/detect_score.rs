//! The calibrated score as the decider (`[detect] decider = "score"`): a nudge where the
//! step's probability reaches the model's nudge threshold, a halt at its stop threshold
//! only after a reminder and the escalation gap, a stop that waits while the run works
//! forward when the model says so, and a human's word that starts it over.

use loopwarden::detect::score::ScoreModel;
use loopwarden::detect::{Action, Decider, DetectConfig, Engine, StoreFacts};
use loopwarden::transcript::{CallWithResult, Step, ToolCall, ToolResult, Transcript};
use serde_json::json;

fn call(name: &str, args: serde_json::Value, out: &str) -> CallWithResult {
    CallWithResult {
        call: ToolCall {
            id: String::new(),
            name: name.into(),
            args,
        },
        result: Some(ToolResult {
            call_id: String::new(),
            name: String::new(),
            text: out.into(),
            is_error: None,
        }),
    }
}

fn failing_check() -> CallWithResult {
    call(
        "bash",
        json!({"command": "pytest test_calc.py"}),
        "<returncode>1</returncode>\n<output>\nFAILED test_add\n</output>",
    )
}

fn transcript(steps: Vec<Vec<CallWithResult>>) -> Transcript {
    Transcript {
        system: vec![],
        task: vec!["fix calc".into()],
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(index, calls)| Step {
                index,
                text: String::new(),
                calls,
                user_after: vec![],
            })
            .collect(),
    }
}

/// The same failing check, `n` times: a stretch that grows by one each step.
fn looping(n: usize) -> Transcript {
    transcript((0..n).map(|_| vec![failing_check()]).collect())
}

/// Every step brings `src/calc.py` to a state it never had, then the same check fails.
fn editing(n: usize) -> Transcript {
    transcript(
        (0..n)
            .map(|i| {
                vec![
                    call(
                        "str_replace_editor",
                        json!({"command": "str_replace", "path": "src/calc.py",
                               "old_str": format!("v{i}"), "new_str": format!("v{}", i + 1)}),
                        "The file src/calc.py has been edited.",
                    ),
                    failing_check(),
                ]
            })
            .collect(),
    )
}

/// A logistic model on one feature: log-odds = intercept + weight × feature.
fn model(
    feature: &str,
    intercept: f64,
    weight: f64,
    nudge: f64,
    stop: f64,
    waits: bool,
) -> ScoreModel {
    let text = json!({
        "meaning": "test", "features": [feature],
        "form": {"kind": "logistic", "intercept": intercept, "weights": [weight]},
        "nudge_at": nudge, "stop_at": stop, "stop_waits": waits,
    });
    ScoreModel::from_json(&text.to_string()).expect("a valid model")
}

fn actions(engine: &Engine, t: &Transcript) -> Vec<Action> {
    engine
        .decisions(t, &StoreFacts::default())
        .into_iter()
        .map(|(_, d)| d.action)
        .collect()
}

#[test]
fn the_score_nudges_at_its_threshold_and_halts_only_after_a_reminder() {
    // p = σ(quiet − 3): 0.5 once the unchanged stretch is 3 steps long, 0.9 from 6 on.
    let engine = Engine::default().with_score_model(model("quiet", -3.0, 1.0, 0.5, 0.9, true));
    let a = actions(&engine, &looping(14));
    let first = a
        .iter()
        .position(|x| *x != Action::Observe)
        .expect("a nudge");
    assert_eq!(a[first], Action::Nudge, "{a:?}");
    let halt = a.iter().position(|x| *x == Action::Halt).expect("a halt");
    let gap = DetectConfig::default().escalation.escalation_gap;
    assert!(halt >= first + gap, "{a:?}");
    // The halt comes once the probability reaches the stop threshold, not before.
    let late = Engine::default().with_score_model(model("quiet", -3.0, 1.0, 0.5, 0.999, true));
    let b = actions(&late, &looping(14));
    let later = b
        .iter()
        .position(|x| *x == Action::Halt)
        .expect("a later halt");
    assert!(later > halt, "{a:?} / {b:?}");
    assert_eq!(a[..halt], b[..halt], "the same reminders before it");

    // Below the nudge threshold, nothing.
    let never = Engine::default().with_score_model(model("quiet", -3.0, 1.0, 1.1, 1.1, true));
    assert!(actions(&never, &looping(14))
        .iter()
        .all(|x| *x == Action::Observe));
}

#[test]
fn a_score_stop_waits_while_the_run_works_forward_if_the_model_says_so() {
    // p = σ(10 × changed): near 1 on every step that edits.
    let waits = Engine::default().with_score_model(model("changed", -5.0, 10.0, 0.5, 0.9, true));
    let a = actions(&waits, &editing(12));
    assert!(a.contains(&Action::Nudge), "{a:?}");
    assert!(!a.iter().any(|x| x.stops()), "every edit was new: {a:?}");
    let hasty = Engine::default().with_score_model(model("changed", -5.0, 10.0, 0.5, 0.9, false));
    assert!(actions(&hasty, &editing(12)).contains(&Action::Halt));
}

#[test]
fn a_human_message_starts_the_score_over() {
    let engine = Engine::default().with_score_model(model("quiet", -3.0, 1.0, 0.5, 2.0, true));
    let mut t = looping(14);
    let a = actions(&engine, &t);
    let first = a.iter().position(|x| *x == Action::Nudge).expect("a nudge");
    assert_eq!(
        a.iter().filter(|x| **x == Action::Nudge).count(),
        1,
        "{a:?}"
    );
    // A human speaks right after the nudged request: the next reminder is a first nudge again.
    t.steps[first].user_after = vec!["Try the other test file.".into()];
    let b = actions(&engine, &t);
    assert!(b[first + 1..].contains(&Action::Nudge), "{b:?}");
}

#[test]
fn decider_score_in_the_config_loads_the_shipped_model_and_the_ladder_needs_none() {
    let cfg = DetectConfig {
        decider: Decider::Score,
        ..DetectConfig::default()
    };
    let text = toml::to_string(&cfg).expect("serializes");
    assert!(text.contains("decider = \"score\""), "{text}");
    assert!(Engine::new(cfg).score_model().is_some());
    assert!(Engine::default().score_model().is_none());
}

/// `loopwarden replay --score-model`: a file of runs decided with a model from a file (what
/// leave-one-family-out replays), `--explain` printing each step's probability under it
/// and its features, and a model the proxy cannot read refused with the reason.
#[test]
fn replay_decides_with_a_model_file_and_explains_its_inputs() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test"})];
    for i in 0..14 {
        messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": "bash",
             "arguments": json!({"command": "pytest test_calc.py"}).to_string()}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"),
            "content": "<returncode>1</returncode>\n<output>\nFAILED test_add\n</output>"}));
    }
    let runs = dir.path().join("runs.jsonl");
    let run = json!({"id": "loop-1", "agent": "x", "resolved": false, "messages": messages});
    std::fs::write(&runs, format!("{run}\n")).expect("written");
    let write_model = |name: &str, feature: &str| {
        let path = dir.path().join(name);
        let text = json!({"meaning": "test", "features": [feature],
            "form": {"kind": "logistic", "intercept": -3.0, "weights": [1.0]},
            "nudge_at": 0.5, "stop_at": 0.9, "stop_waits": true});
        std::fs::write(&path, text.to_string()).expect("written");
        path
    };
    let replay = |model: &std::path::Path, explain: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"));
        cmd.arg("replay").arg(&runs).arg("--score-model").arg(model);
        if explain {
            cmd.args(["--explain", "*"]);
        }
        cmd.output().expect("runs")
    };

    let good = write_model("quiet.json", "quiet");
    let out = replay(&good, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actions: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON")["action"].to_string())
        .collect();
    assert_eq!(
        actions.first().map(String::as_str),
        Some("\"nudge\""),
        "{actions:?}"
    );
    assert_eq!(
        actions.last().map(String::as_str),
        Some("\"halt\""),
        "{actions:?}"
    );
    let explained = String::from_utf8_lossy(&out.stderr);
    assert!(
        explained.contains("## score features: steps,since_source,"),
        "{explained}"
    );
    let probabilities: Vec<f64> = explained
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("score p="))
        .map(|rest| {
            rest.split(' ')
                .next()
                .unwrap_or("")
                .parse()
                .expect("a probability")
        })
        .collect();
    assert_eq!(probabilities.len(), 14, "one per step");
    assert!(
        probabilities.windows(2).any(|w| w[1] > w[0]),
        "it rises as the stretch grows"
    );

    let bad = write_model("bad.json", "no_such_feature");
    let out = replay(&bad, false);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_feature"));
}
