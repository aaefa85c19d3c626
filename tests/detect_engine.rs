//! The engine: EMA, cooldown, escalation ladder, human resets, scaffold messages that are
//! not a human, incremental folding, the response-side block, and property tests.

use loopwarden::detect::{Action, DetectConfig, Engine, StoreFacts};
use loopwarden::dialect::ResponseTurn;
use loopwarden::transcript::{CallWithResult, Step, ToolCall, ToolResult, Transcript};
use proptest::prelude::*;
use serde_json::json;

fn run_cmd(cmd: &str, out: &str) -> CallWithResult {
    run_code(cmd, out, 1)
}

fn run_code(cmd: &str, out: &str, code: i32) -> CallWithResult {
    CallWithResult {
        call: ToolCall {
            id: String::new(),
            name: "bash".into(),
            args: json!({"command": cmd}),
        },
        result: Some(ToolResult {
            call_id: String::new(),
            name: String::new(),
            text: format!("<returncode>{code}</returncode>\n<output>\n{out}\n</output>"),
            is_error: None,
        }),
    }
}

fn looping(n: usize) -> Transcript {
    Transcript {
        system: vec![],
        task: vec!["fix calc".into()],
        steps: (0..n)
            .map(|index| Step {
                index,
                text: String::new(),
                calls: vec![run_cmd("pytest test_calc.py", "FAILED test_add")],
                user_after: vec![],
            })
            .collect(),
    }
}

fn actions(engine: &Engine, t: &Transcript, store: &StoreFacts) -> Vec<Action> {
    engine
        .decisions(t, store)
        .into_iter()
        .map(|(_, d)| d.action)
        .collect()
}

#[test]
fn a_loop_is_nudged_then_escalates_and_halts_only_after_the_nudge() {
    let a = actions(&Engine::default(), &looping(12), &StoreFacts::default());
    let first = a.iter().position(|x| *x != Action::Observe).unwrap();
    assert_eq!(a[first], Action::Nudge, "{a:?}");
    let halt = a
        .iter()
        .position(|x| *x == Action::Halt)
        .expect("a chronic loop halts");
    assert!(halt > first);
    let replan = a.iter().position(|x| *x == Action::Replan).unwrap();
    assert!(first < replan && replan < halt, "{a:?}");
    // Escalation steps are at least the configured gap apart.
    let gap = DetectConfig::default().escalation.escalation_gap;
    assert!(replan - first >= gap && halt - replan >= gap, "{a:?}");
    // A halted run stays halted.
    assert!(a[halt..].iter().all(|x| *x == Action::Halt), "{a:?}");
}

#[test]
fn a_pattern_that_never_becomes_chronic_only_nudges_and_cools_down() {
    // EMA above 0.5 is required to escalate: with a high bar, the same loop only nudges,
    // and nudges repeat no more often than the cooldown.
    let mut cfg = DetectConfig::default();
    cfg.escalation.escalate_ema = 1.0;
    let a = actions(
        &Engine::new(cfg.clone()),
        &looping(20),
        &StoreFacts::default(),
    );
    assert!(!a.iter().any(|x| x.stops()), "{a:?}");
    let nudges: Vec<usize> = a
        .iter()
        .enumerate()
        .filter(|(_, x)| **x != Action::Observe)
        .map(|(i, _)| i)
        .collect();
    assert!(nudges.len() >= 2, "{a:?}");
    assert!(
        nudges
            .windows(2)
            .all(|w| w[1] - w[0] >= cfg.escalation.cooldown),
        "{nudges:?}"
    );
}

#[test]
fn ema_smooths_one_blip_into_a_single_nudge() {
    // One repeated failure pair, then varied work: a nudge at most, never an escalation.
    let mut t = looping(4);
    for i in 4..14 {
        t.steps.push(Step {
            index: i,
            text: String::new(),
            calls: vec![run_code(&format!("ls dir{i}"), &format!("file{i}"), 0)],
            user_after: vec![],
        });
    }
    let a = actions(&Engine::default(), &t, &StoreFacts::default());
    assert!(
        a.iter().filter(|x| **x != Action::Observe).count() <= 2,
        "{a:?}"
    );
    assert!(
        !a.iter().any(|x| x.stops() || *x == Action::Replan),
        "{a:?}"
    );
}

#[test]
fn a_human_message_resets_escalation_but_scaffold_messages_do_not() {
    let base = actions(&Engine::default(), &looping(12), &StoreFacts::default());
    let halt = base.iter().position(|x| *x == Action::Halt).unwrap();
    // A human speaks right before the request that would have halted.
    let mut t = looping(12);
    t.steps[halt - 1]
        .user_after
        .push("Try reading the stack trace instead.".into());
    let a = actions(&Engine::default(), &t, &StoreFacts::default());
    assert_eq!(a[halt], Action::Observe, "{a:?}");
    let next = a[halt + 1..]
        .iter()
        .find(|x| **x != Action::Observe)
        .unwrap();
    assert_eq!(*next, Action::Nudge, "escalation starts over: {a:?}");
    // mini-swe-agent's format complaint and OpenHands' "please continue" are not a human.
    for auto in [
        "Please always provide EXACTLY ONE action in triple backticks, found 2 actions.",
        "Please continue working on the task on whatever approach you think is suitable.",
    ] {
        let mut t = looping(12);
        t.steps[halt - 1].user_after.push(auto.into());
        assert_eq!(
            actions(&Engine::default(), &t, &StoreFacts::default())[halt],
            Action::Halt,
            "{auto}"
        );
    }
}

#[test]
fn an_operator_resume_and_a_dismissal_are_store_facts() {
    let base = actions(&Engine::default(), &looping(12), &StoreFacts::default());
    let halt = base.iter().position(|x| *x == Action::Halt).unwrap();
    let resumed = StoreFacts {
        resumed_at: vec![halt],
        dismissed: vec![],
    };
    let a = actions(&Engine::default(), &looping(12), &resumed);
    assert_ne!(a[halt], Action::Halt, "{a:?}");
    // A cached fold made without the resume is not continued with it.
    let engine = Engine::default();
    let t = looping(halt);
    let (d, state) = engine.decide_with(&t, &StoreFacts::default(), None);
    assert_eq!(d.action, Action::Halt);
    let (d, _) = engine.decide_with(&t, &resumed, Some(state));
    assert_ne!(d.action, Action::Halt);
    // Dismissing the leading pattern's alert quiets it for the configured turns.
    let first = base.iter().position(|x| *x != Action::Observe).unwrap();
    let lead = engine.decisions(&looping(12), &StoreFacts::default())[first]
        .1
        .detector
        .clone();
    let mut cfg = DetectConfig::default();
    for other in engine.detector_names().into_iter().filter(|n| *n != lead) {
        let mut p = cfg.policy(other);
        p.response = loopwarden::detect::Response::Off;
        cfg.patterns.insert(other.to_string(), p);
    }
    let only = Engine::new(cfg);
    let dismissed = StoreFacts {
        resumed_at: vec![],
        dismissed: vec![(first, lead.clone())],
    };
    let a = actions(&only, &looping(12), &dismissed);
    assert!(
        a[first + 1..(first + 10).min(a.len())]
            .iter()
            .all(|x| *x == Action::Observe),
        "{a:?}"
    );
}

#[test]
fn incremental_folding_gives_the_same_decisions_as_a_fresh_fold() {
    let engine = Engine::default();
    let full = looping(30);
    let mut cached = None;
    for k in 0..=30 {
        let t = Transcript {
            steps: full.steps[..k].to_vec(),
            ..full.clone()
        };
        let (fresh, _) = engine.decide_with(&t, &StoreFacts::default(), None);
        let (inc, state) = engine.decide_with(&t, &StoreFacts::default(), cached.take());
        assert_eq!(fresh, inc, "request {k}");
        assert_eq!(state.steps(), k);
        cached = Some(state);
    }
    // A different conversation under the same cache starts over.
    let other = Transcript {
        task: vec!["another task".into()],
        ..looping(3)
    };
    let (d, state) = engine.decide_with(&other, &StoreFacts::default(), cached);
    assert_eq!(state.steps(), 3);
    assert_eq!(d, engine.decide(&other));
}

#[test]
fn the_response_side_blocks_the_call_that_repeats_a_warned_loop() {
    let engine = Engine::default();
    let a = actions(&engine, &looping(12), &StoreFacts::default());
    let replan = a.iter().position(|x| *x == Action::Replan).unwrap();
    let t = looping(replan);
    let same = ResponseTurn {
        calls: vec![ToolCall {
            id: "x".into(),
            name: "bash".into(),
            args: json!({"command": "pytest  test_calc.py"}),
        }],
        ..ResponseTurn::default()
    };
    assert_eq!(engine.decide_response(&t, &same).action, Action::Block);
    let different = ResponseTurn {
        calls: vec![ToolCall {
            id: "y".into(),
            name: "bash".into(),
            args: json!({"command": "cat test_calc.py"}),
        }],
        ..ResponseTurn::default()
    };
    assert_eq!(
        engine.decide_response(&t, &different).action,
        Action::Observe
    );
    // Before any nudge there is nothing to block.
    assert_eq!(
        engine.decide_response(&looping(1), &same).action,
        Action::Observe
    );
}

#[test]
fn config_roundtrips_through_toml_with_defaults() {
    let cfg: DetectConfig =
        toml::from_str("[escalation]\ncooldown = 7\n[patterns.read_loop]\nresponse = \"off\"\n")
            .unwrap();
    assert_eq!(cfg.escalation.cooldown, 7);
    assert_eq!(cfg.escalation.ema_alpha, 0.3);
    assert_eq!(
        cfg.policy("read_loop").response,
        loopwarden::detect::Response::Off
    );
    assert_eq!(
        cfg.policy("stagnation").response,
        loopwarden::detect::Response::Halt
    );
    assert!(
        toml::from_str::<DetectConfig>("nonsense = 1").is_err(),
        "unknown keys are errors"
    );
}

fn shuffle_keys(v: &serde_json::Value) -> String {
    // Serialize objects with keys in reverse order: what a client with another key order sends.
    match v {
        serde_json::Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), shuffle_keys(v)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        other => other.to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Argument key order and volatile output parts (chunk ids, wall times, PGIDs,
    /// addresses, temp paths) never change a decision.
    #[test]
    fn key_order_and_volatile_output_never_change_a_decision(
        seq in proptest::collection::vec(0usize..3, 4..16),
        noise in proptest::collection::vec((0u32..1_000_000, 0u32..10_000), 16),
    ) {
        let cmds = ["pytest -x test_calc.py", "cat calc.py", "python repro.py"];
        let build = |volatile: bool| -> Transcript {
            let steps = seq.iter().enumerate().map(|(i, &c)| {
                let (n1, n2) = noise[i];
                let (chunk, wall, pgid) = if volatile { (format!("{n1:x}f{n2}"), format!("0.{n2}"), n1) } else { ("a1".into(), "0.0".into(), 7) };
                let out = format!("Chunk ID: {chunk}\nWall time: {wall} seconds\nProcess exited with code 1\nOutput:\nFAILED at 0x{:x} in /tmp/tmp{n2}x/t.py\nProcess Group PGID: {pgid}", n1 + 4096);
                let args: serde_json::Value = json!({"cmd": cmds[c], "workdir": "/r", "yield_time_ms": 1000});
                let args = if volatile { loopwarden::transcript::canonical_args_from_str(&shuffle_keys(&args)) } else { args };
                Step { index: i, text: String::new(), calls: vec![CallWithResult {
                    call: ToolCall { id: format!("c{i}"), name: "exec_command".into(), args },
                    result: Some(ToolResult { call_id: format!("c{i}"), name: String::new(), text: out, is_error: None }),
                }], user_after: vec![] }
            }).collect();
            Transcript { system: vec![], task: vec!["fix".into()], steps }
        };
        let engine = Engine::default();
        let a: Vec<(usize, Action, String)> = engine.decisions(&build(false), &StoreFacts::default()).into_iter().map(|(k, d)| (k, d.action, d.detector)).collect();
        let b: Vec<(usize, Action, String)> = engine.decisions(&build(true), &StoreFacts::default()).into_iter().map(|(k, d)| (k, d.action, d.detector)).collect();
        prop_assert_eq!(a, b);
    }
}

/// Three identical failing runs of `pytest` (a fail_loop nudge), varied work, then a
/// check that returns the same failure after every edit (stagnation: another pattern).
fn fail_loop_then_stagnation() -> Transcript {
    let mut steps: Vec<Vec<CallWithResult>> = (0..3)
        .map(|_| vec![run_cmd("pytest test_calc.py", "FAILED test_add")])
        .collect();
    for i in 0..3 {
        steps.push(vec![run_code(
            &format!("ls dir{i}"),
            &format!("file{i}"),
            0,
        )]);
    }
    for i in 0..5 {
        steps.push(vec![CallWithResult {
            call: ToolCall {
                id: String::new(),
                name: "str_replace_editor".into(),
                args: json!({"command": "str_replace", "path": "/w/calc.py",
                             "old_str": format!("v{i}"), "new_str": format!("v{}", i + 1)}),
            },
            result: Some(ToolResult {
                call_id: String::new(),
                name: String::new(),
                text: "The file /w/calc.py has been edited.".into(),
                is_error: None,
            }),
        }]);
        steps.push(vec![run_code(
            "python check.py",
            "Test failed: add(1, 2) returned -1",
            0,
        )]);
    }
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

#[test]
fn a_second_pattern_confirming_an_ignored_alert_escalates() {
    let t = fail_loop_then_stagnation();
    let interventions = |cfg: DetectConfig| -> Vec<(usize, Action, String)> {
        Engine::new(cfg)
            .decisions(&t, &StoreFacts::default())
            .into_iter()
            .filter(|(_, d)| d.action != Action::Observe)
            .map(|(i, d)| (i, d.action, d.detector))
            .collect()
    };
    let on = interventions(DetectConfig::default());
    assert_eq!(
        (on[0].1, on[0].2.as_str()),
        (Action::Nudge, "fail_loop"),
        "{on:?}"
    );
    // stagnation's first finding comes after fail_loop's nudge: two detectors agree.
    let second = on
        .iter()
        .find(|(_, _, d)| d == "stagnation")
        .expect("stagnation fires");
    assert_eq!(second.1, Action::Replan, "{on:?}");
    // Without corroboration the same finding is a fresh nudge of its own pattern.
    let mut cfg = DetectConfig::default();
    cfg.escalation.corroborate = false;
    let off = interventions(cfg);
    let second = off
        .iter()
        .find(|(_, _, d)| d == "stagnation")
        .expect("stagnation fires");
    assert_eq!(second.1, Action::Nudge, "{off:?}");
}

#[test]
fn a_shared_fold_is_read_without_a_copy_when_the_history_is_the_same_and_advanced_otherwise() {
    use std::sync::Arc;
    let engine = Engine::default();
    let store = StoreFacts::default();
    let t8 = looping(8);
    let (d8, s8) = engine.decide_with(&t8, &store, None);
    let shared = Arc::new(s8);
    // The same history again (a retry, many clients sending one conversation).
    let (again, state, moved) = engine.decide_shared(&t8, &store, Some(shared.clone()), None, None);
    assert!(!moved && Arc::ptr_eq(&state, &shared));
    assert_eq!(again.action, d8.action);
    // Two more steps: the fold advances, and decides what a fold from scratch decides.
    let t10 = looping(10);
    let (next, state, moved) = engine.decide_shared(&t10, &store, Some(shared.clone()), None, None);
    assert!(moved && !Arc::ptr_eq(&state, &shared));
    assert_eq!(state.steps(), 10);
    assert_eq!(next.action, engine.decide(&t10).action);
    // A different history under the same id is folded from scratch, not read from the cache.
    let other = Transcript {
        task: vec!["another task".into()],
        ..looping(8)
    };
    let (_, state, moved) = engine.decide_shared(&other, &store, Some(shared), None, None);
    assert!(moved);
    assert_eq!(state.steps(), 8);
}

#[test]
fn a_fold_its_caller_vouches_for_is_continued_without_checking_its_steps() {
    use loopwarden::detect::Folded;
    use std::sync::Arc;
    let engine = Engine::default();
    let store = StoreFacts::default();
    let full = looping(10);
    let t8 = Transcript {
        steps: full.steps[..8].to_vec(),
        ..full.clone()
    };
    let (_, s8, _) = engine.decide_shared(&t8, &store, None, None, None);
    let vouched = s8.folded();
    assert_eq!(vouched.steps, 8);
    // The chain hashes the folded steps: it tells a continued fold from one started over.
    let chain_of = |t: &Transcript| engine.decide_with(t, &store, None).1.chain();
    let advanced = |known: Option<Folded>, t: &Transcript| {
        let (decision, state, moved) =
            engine.decide_shared(t, &store, Some(s8.clone()), known, None);
        assert!(moved && state.steps() == 10);
        (decision, state)
    };

    // Vouched for, and true: continued, deciding what a fold from scratch decides.
    let (decision, state) = advanced(Some(vouched), &full);
    assert_eq!(decision, engine.decide(&full));
    assert_eq!(state.chain(), chain_of(&full));
    assert_ne!(
        state.folded().fold,
        vouched.fold,
        "an advanced fold is another fold"
    );

    // The last folded step edited: without a word from the caller it is checked, and the
    // fold starts over.
    let mut edited = full.clone();
    edited.steps[7].text = "edited".into();
    assert_ne!(chain_of(&edited), chain_of(&full));
    let (decision, state) = advanced(None, &edited);
    assert_eq!(decision, engine.decide(&edited));
    assert_eq!(state.chain(), chain_of(&edited));
    // The caller's word is taken without looking (so it must be true): continued.
    assert_eq!(advanced(Some(vouched), &edited).1.chain(), chain_of(&full));
    // A word about another fold, or about fewer steps than were folded, is no word.
    let other = Folded {
        fold: vouched.fold + 1,
        ..vouched
    };
    for known in [other, vouched.within(7)] {
        assert_eq!(
            advanced(Some(known), &edited).1.chain(),
            chain_of(&edited),
            "{known:?}"
        );
    }
    // The same history again is read from the shared fold either way.
    let (_, state, moved) =
        engine.decide_shared(&t8, &store, Some(s8.clone()), Some(vouched), None);
    assert!(!moved && Arc::ptr_eq(&state, &s8));
}

#[test]
fn a_step_fingerprint_changes_with_every_field_and_not_with_key_order() {
    use loopwarden::detect::engine::step_fingerprint;
    let base = Step {
        index: 0,
        text: "checking".into(),
        calls: vec![CallWithResult {
            call: ToolCall {
                id: "a".into(),
                name: "read".into(),
                args: json!({"path": "/p/a.py", "limit": 5, "opts": [true, null, -1, 2.5]}),
            },
            ..run_cmd("ls", "a.py")
        }],
        user_after: vec!["go on".into()],
    };
    let fp = step_fingerprint(&base);
    let mut same = base.clone();
    same.calls[0].call.args =
        serde_json::from_str(r#"{"opts": [true, null, -1, 2.5], "limit": 5, "path": "/p/a.py"}"#)
            .unwrap();
    same.calls[0].call.id = "another id".into();
    assert_eq!(step_fingerprint(&same), fp);

    type Change = (&'static str, fn(&mut Step));
    let changes: Vec<Change> = vec![
        ("text", |s| s.text.push('.')),
        ("name", |s| s.calls[0].call.name = "reads".into()),
        ("arg value", |s| s.calls[0].call.args["limit"] = json!(6)),
        ("arg type", |s| s.calls[0].call.args["limit"] = json!("5")),
        ("negative", |s| s.calls[0].call.args["opts"][2] = json!(1)),
        ("float", |s| s.calls[0].call.args["opts"][3] = json!(2.25)),
        ("null", |s| s.calls[0].call.args["opts"][1] = json!(false)),
        ("arg key", |s| {
            let v = s.calls[0].call.args["path"].take();
            s.calls[0].call.args = json!({"file": v, "limit": 5, "opts": [true, null, -1, 2.5]});
        }),
        ("result", |s| {
            if let Some(r) = &mut s.calls[0].result {
                r.text.push('!');
            }
        }),
        ("error flag", |s| {
            if let Some(r) = &mut s.calls[0].result {
                r.is_error = Some(true);
            }
        }),
        ("no result", |s| s.calls[0].result = None),
        ("user", |s| s.user_after.push(String::new())),
        // The same bytes split differently between two fields.
        ("boundary", |s| {
            s.text = "checkin".into();
            s.user_after = vec!["ggo on".into()];
        }),
    ];
    for (what, change) in changes {
        let mut s = base.clone();
        change(&mut s);
        assert_ne!(step_fingerprint(&s), fp, "{what}");
    }
}

fn edit_file(path: &str, old: &str, new: &str) -> CallWithResult {
    CallWithResult {
        call: ToolCall {
            id: String::new(),
            name: "str_replace_editor".into(),
            args: json!({"command": "str_replace", "path": path, "old_str": old, "new_str": new}),
        },
        result: Some(ToolResult {
            call_id: String::new(),
            name: String::new(),
            text: format!("The file {path} has been edited."),
            is_error: Some(false),
        }),
    }
}

/// The conversation of the task "fix calc" with these steps.
fn fix_calc(steps: Vec<Step>) -> Transcript {
    Transcript {
        system: vec![],
        task: vec!["fix calc".into()],
        steps,
    }
}

fn step(index: usize, calls: Vec<CallWithResult>) -> Step {
    Step {
        index,
        text: String::new(),
        calls,
        user_after: vec![],
    }
}

/// edit → same failing check, over and over: with every edit new (`fresh`), the agent is
/// still changing its code; with the same edit undone and redone, it is not.
fn edit_check_cycles(cycles: usize, fresh: bool) -> Transcript {
    let mut steps = Vec::new();
    for i in 0..cycles {
        let (old, new) = if fresh {
            (format!("v{i}"), format!("v{}", i + 1))
        } else if i.is_multiple_of(2) {
            ("a".to_string(), "b".to_string())
        } else {
            ("b".to_string(), "a".to_string())
        };
        steps.push(step(
            steps.len(),
            vec![edit_file("src/calc.py", &old, &new)],
        ));
        steps.push(step(
            steps.len(),
            vec![run_cmd("python reproduce.py", "AssertionError: 3 != 4")],
        ));
    }
    fix_calc(steps)
}

#[test]
fn an_agent_still_changing_its_code_is_nudged_but_not_stopped() {
    let engine = Engine::default();
    let a = actions(
        &engine,
        &edit_check_cycles(10, true),
        &StoreFacts::default(),
    );
    assert!(
        a.contains(&Action::Nudge),
        "the stagnation is reported: {a:?}"
    );
    assert!(!a.iter().any(|x| x.stops()), "every edit was new: {a:?}");

    // The same loop where the edits only go back and forth is stopped.
    let a = actions(
        &engine,
        &edit_check_cycles(10, false),
        &StoreFacts::default(),
    );
    assert!(a.iter().any(|x| x.stops()), "{a:?}");

    // Without the wait, the first loop is stopped too: the wait is what keeps it going.
    let mut cfg = DetectConfig::default();
    cfg.escalation.stop_after_quiet = 0;
    let a = actions(
        &Engine::new(cfg),
        &edit_check_cycles(10, true),
        &StoreFacts::default(),
    );
    assert!(a.iter().any(|x| x.stops()), "{a:?}");
}

/// Turns without a tool call that the scaffold rejects: before any fix, nudged only;
/// after a change that a check passed, left to the scaffold: the run is finishing, the
/// scaffold already answers each such turn, and a reminder would be noise.
#[test]
fn rejected_turns_are_nudged_before_a_fix_and_left_to_the_scaffold_after_it() {
    let rejected = |index| Step {
        index,
        text: "Done, the fix is in.".into(),
        calls: vec![],
        user_after: vec!["Please always provide EXACTLY ONE action in triple backticks.".into()],
    };
    let mut before_fix: Vec<Step> = vec![step(0, vec![run_code("ls", "calc.py", 0)])];
    before_fix.extend((1..16).map(rejected));
    let a = actions(
        &Engine::default(),
        &fix_calc(before_fix),
        &StoreFacts::default(),
    );
    assert!(a.contains(&Action::Nudge), "{a:?}");
    assert!(!a.iter().any(|x| x.stops()), "no fix to keep yet: {a:?}");

    let mut after_fix = vec![
        step(0, vec![edit_file("src/calc.py", "a - b", "a + b")]),
        step(
            1,
            vec![run_code("python -m pytest test_calc.py", "1 passed", 0)],
        ),
    ];
    after_fix.extend((2..24).map(rejected));
    let a = actions(
        &Engine::default(),
        &fix_calc(after_fix),
        &StoreFacts::default(),
    );
    assert!(
        a.iter().all(|x| *x == Action::Observe),
        "a finishing run is not nudged for its scaffold's rejections: {a:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Detection is a pure function of the transcript: a fold cached from one history and
    /// handed a request whose history changed anywhere (an extension, a step edited in the
    /// middle, the first or the last) decides what a fold from scratch decides.
    #[test]
    fn a_cached_fold_decides_as_a_cold_one_whatever_changed_in_the_history(
        seq in proptest::collection::vec(0usize..4, 2..24),
        edits in proptest::collection::vec((0usize..24, 0usize..4, any::<bool>()), 1..6),
    ) {
        let calls = [
            ("pytest test_calc.py", "FAILED test_add"),
            ("cat calc.py", "def add(a, b): return a - b"),
            ("python repro.py", "Traceback: AssertionError"),
            ("sed -i s/-/+/ calc.py", ""),
        ];
        let history = |seq: &[usize]| Transcript {
            system: vec![],
            task: vec!["fix calc".into()],
            steps: seq
                .iter()
                .enumerate()
                .map(|(index, &c)| Step {
                    index,
                    text: String::new(),
                    calls: vec![run_cmd(calls[c].0, calls[c].1)],
                    user_after: vec![],
                })
                .collect(),
        };
        let engine = Engine::default();
        let store = StoreFacts::default();
        let mut seen = seq.clone();
        let (_, mut cached) = engine.decide_with(&history(&seen), &store, None);
        for (at, call, grow) in edits {
            // Each request either edits one step (keeping the length) or grows by one.
            if grow {
                seen.push(call);
            } else {
                let at = at % seen.len();
                seen[at] = call;
            }
            let t = history(&seen);
            let (warm, state) = engine.decide_with(&t, &store, Some(cached));
            let cold = engine.decide(&t);
            prop_assert_eq!(&warm, &cold, "history {:?}", seen);
            cached = state;
        }
    }
}
