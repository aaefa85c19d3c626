//! Each detector fires on a realistic loop and stays quiet on the healthy version of the
//! same work, with the tool shapes of at least two clients (CLIENTS.md §4.3-4.4).

use loopwarden::detect::{Action, DetectConfig, Engine, StoreFacts};
use loopwarden::transcript::{CallWithResult, Step, ToolCall, ToolResult, Transcript};
use serde_json::{json, Value};

/// One call with its result.
fn call(name: &str, args: Value, result: &str, is_error: Option<bool>) -> CallWithResult {
    CallWithResult {
        call: ToolCall {
            id: String::new(),
            name: name.into(),
            args,
        },
        result: Some(ToolResult {
            call_id: String::new(),
            name: String::new(),
            text: result.into(),
            is_error,
        }),
    }
}

fn transcript(steps: Vec<Vec<CallWithResult>>) -> Transcript {
    Transcript {
        system: vec!["You are a coding agent.".into()],
        task: vec!["Fix the failing test in calc.py".into()],
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(index, calls)| Step {
                index,
                text: format!("Step {index}: working on it."),
                calls,
                user_after: Vec::new(),
            })
            .collect(),
    }
}

/// The detectors that fired at any step of the transcript.
fn fired(t: &Transcript) -> Vec<String> {
    let mut out = Vec::new();
    let engine = Engine::default();
    let mut state = engine.start(t);
    for step in &t.steps {
        engine.fold(&mut state, step, &StoreFacts::default());
        for f in state.decision().findings {
            if !out.contains(&f.detector) {
                out.push(f.detector);
            }
        }
    }
    out
}

// Client shapes: a failing shell run and a file edit, per client.
fn claude_bash(cmd: &str, out: &str, fail: bool) -> CallWithResult {
    let text = if fail {
        format!("Exit code 1\n{out}")
    } else {
        out.to_string()
    };
    call("Bash", json!({"command": cmd}), &text, Some(fail))
}
fn codex_exec(cmd: &str, out: &str, fail: bool, chunk: usize) -> CallWithResult {
    let text = format!(
        "Chunk ID: {chunk:x}a{chunk}f\nWall time: 0.{chunk}1 seconds\nProcess exited with code {}\nOriginal token count: 18\nOutput:\n{out}",
        u8::from(fail)
    );
    call("exec_command", json!({"cmd": cmd}), &text, None)
}
fn gemini_shell(cmd: &str, out: &str, fail: bool, pgid: usize) -> CallWithResult {
    let text = format!(
        "<untrusted_context>\nOutput: {out}\nExit Code: {}\nProcess Group PGID: {pgid}\n</untrusted_context>",
        u8::from(fail)
    );
    call("run_shell_command", json!({"command": cmd}), &text, None)
}
fn mini_bash(cmd: &str, out: &str, code: i32) -> CallWithResult {
    call(
        "bash",
        json!({"command": cmd}),
        &format!("<returncode>{code}</returncode>\n<output>\n{out}\n</output>"),
        None,
    )
}
fn openhands_edit(path: &str, old: &str, new: &str) -> CallWithResult {
    call(
        "str_replace_editor",
        json!({"command": "str_replace", "path": path, "old_str": old, "new_str": new}),
        &format!("The file {path} has been edited. Review the changes and make sure they are as expected."),
        None,
    )
}
fn claude_edit(path: &str, old: &str, new: &str) -> CallWithResult {
    call(
        "Edit",
        json!({"file_path": path, "old_string": old, "new_string": new, "replace_all": false}),
        &format!("The file {path} has been updated successfully."),
        None,
    )
}

const FAIL: &str = "FAILED test_calc.py::test_add - AssertionError: assert -1 == 3";

#[test]
fn fail_loop_fires_on_the_same_failure_and_not_on_changing_ones() {
    for mk in [
        |i: usize, out: &str| claude_bash("pytest test_calc.py", out, true).with_i(i),
        |i: usize, out: &str| codex_exec("pytest test_calc.py", out, true, i),
        |i: usize, out: &str| gemini_shell("pytest test_calc.py", out, true, 6000 + i),
    ] {
        let same = transcript((0..4).map(|i| vec![mk(i, FAIL)]).collect());
        assert!(
            fired(&same).contains(&"fail_loop".to_string()),
            "{:?}",
            fired(&same)
        );
        let changing = transcript(
            (0..4)
                .map(|i| {
                    vec![mk(
                        i,
                        &format!("FAILED test_calc.py::test_add - assert {i} == 3"),
                    )]
                })
                .collect(),
        );
        assert!(!fired(&changing).contains(&"fail_loop".to_string()));
    }
}

/// fail_loop's occasions are failed commands. Editor calls that found nothing to replace
/// (OpenHands' `ERROR: No replacement was performed`) between the runs are not occasions:
/// they must not dilute the pattern until the same command failing six times in a row
/// never gets past a nudge.
#[test]
fn fail_loop_escalates_through_failed_editor_calls_in_between() {
    let run = || {
        call(
            "execute_bash",
            json!({"command": "make -C build install"}),
            "make: *** No rule to make target 'install'.  Stop.\n[The command completed with exit code 2.]",
            None,
        )
    };
    let miss = |i: usize| {
        call(
            "str_replace_editor",
            json!({"command": "str_replace", "path": "/w/Makefile", "old_str": format!("x{i}"), "new_str": "y"}),
            &format!("ERROR:\nNo replacement was performed, old_str `x{i}` did not appear verbatim in /w/Makefile."),
            None,
        )
    };
    let mut steps = Vec::new();
    for i in 0..6 {
        steps.push(vec![run()]);
        steps.push(vec![miss(2 * i)]);
        steps.push(vec![miss(2 * i + 1)]);
        steps.push(vec![call(
            "str_replace_editor",
            json!({"command": "create", "path": format!("/w/notes{i}.md"), "file_text": "todo"}),
            &format!("File created successfully at: /w/notes{i}.md"),
            None,
        )]);
    }
    let t = transcript(steps);
    let engine = Engine::default();
    let mut state = engine.start(&t);
    let mut actions = Vec::new();
    for step in &t.steps {
        engine.fold(&mut state, step, &StoreFacts::default());
        let d = state.decision();
        if d.action != Action::Observe {
            actions.push((d.action, d.detector));
        }
    }
    assert!(
        actions
            .iter()
            .any(|(a, d)| *a != Action::Nudge && d == "fail_loop"),
        "{actions:?}"
    );
}

/// Summaries are read by people (reminders, halts, the admin timeline): they quote the
/// command as the agent wrote it, while the loop is still recognised through its normalized
/// key (the first run is spelled differently).
#[test]
fn fail_loop_summary_quotes_the_command_as_written() {
    let t = transcript(
        (0..4)
            .map(|i| {
                let cmd = if i == 0 {
                    "cd /repo &&  python3 -m pytest test_calc.py "
                } else {
                    "python -m pytest test_calc.py"
                };
                vec![claude_bash(cmd, FAIL, true)]
            })
            .collect(),
    );
    let engine = Engine::default();
    let mut state = engine.start(&t);
    let mut summaries = Vec::new();
    for step in &t.steps {
        engine.fold(&mut state, step, &StoreFacts::default());
        for f in state.decision().findings {
            if f.detector == "fail_loop" {
                summaries.push(f.summary);
            }
        }
    }
    assert!(!summaries.is_empty(), "fail_loop did not fire");
    for s in &summaries {
        assert!(s.contains("`python -m pytest test_calc.py`"), "{s}");
        assert!(!s.contains("pytest test_calc.py -m"), "{s}");
    }
}

trait WithI {
    fn with_i(self, i: usize) -> Self;
}
impl WithI for CallWithResult {
    fn with_i(self, _i: usize) -> Self {
        self
    }
}

/// edit → same check → same failure, with different edits each time.
fn edit_check_cycles(
    edit: fn(usize) -> CallWithResult,
    check: fn(&str) -> CallWithResult,
    outputs: &[&str],
) -> Transcript {
    let mut steps = vec![vec![check(outputs[0])]];
    for (i, out) in outputs.iter().enumerate().skip(1) {
        steps.push(vec![edit(i)]);
        steps.push(vec![check(out)]);
    }
    transcript(steps)
}

#[test]
fn stagnation_fires_across_edits_when_the_outcome_never_changes() {
    type Edit = fn(usize) -> CallWithResult;
    type Check = fn(&str) -> CallWithResult;
    let cases: [(Edit, Check); 2] = [
        (
            |i| openhands_edit("/w/calc.py", &format!("v{i}"), &format!("v{}", i + 1)),
            |out| {
                call("execute_bash", json!({"command": "cd /workspace && python reproduce.py"}),
                &format!("{out}\n[The command completed with exit code 1.]\n[Current working directory: /workspace]\n[Command finished with exit code 1]"), None)
            },
        ),
        (
            |i| claude_edit("/w/calc.py", &format!("v{i}"), &format!("v{}", i + 1)),
            |out| claude_bash("python /w/reproduce.py", out, true),
        ),
    ];
    for (edit, check) in cases {
        let stuck = edit_check_cycles(edit, check, &[FAIL; 5]);
        assert!(
            fired(&stuck).contains(&"stagnation".to_string()),
            "{:?}",
            fired(&stuck)
        );
        let progress = edit_check_cycles(
            edit,
            check,
            &[
                "assert 1 == 3",
                "assert 2 == 3",
                "assert 4 == 3",
                "assert 5 == 3",
                "ok",
            ],
        );
        assert!(
            !fired(&progress).contains(&"stagnation".to_string()),
            "{:?}",
            fired(&progress)
        );
    }
}

/// A check whose printed lines stay the same but whose verdict flips (it failed, now it
/// exits 0) has a new outcome: the edits reached the code that runs, so the stagnation
/// streak starts over (openhands/pytest-8399 was halted right after such a flip).
#[test]
fn stagnation_counts_a_changed_verdict_as_a_new_outcome() {
    let out = "Test output:\ncollected 1 item\nfixtures shown: cache, capsys";
    let runs = |codes: &[i32]| {
        let mut steps = Vec::new();
        for (i, code) in codes.iter().enumerate() {
            steps.push(vec![openhands_edit(
                "/w/src/unittest.py",
                &format!("v{i}"),
                &format!("v{}", i + 1),
            )]);
            steps.push(vec![mini_bash("python reproduce.py", out, *code)]);
        }
        transcript(steps)
    };
    let stuck = runs(&[1, 1, 1, 1, 1]);
    assert!(fired(&stuck).contains(&"stagnation".to_string()));
    let flipped = runs(&[1, 1, 1, 0, 0]);
    assert!(
        !fired(&flipped).contains(&"stagnation".to_string()),
        "{:?}",
        fired(&flipped)
    );
}

#[test]
fn repeat_fires_on_identical_calls_in_an_unchanged_stretch_only() {
    // mini-swe-agent and Codex: the same read-only command with the same answer.
    let mini = transcript(
        (0..4)
            .map(|_| {
                vec![mini_bash(
                    "grep -n 'def add' calc.py",
                    "3:def add(a, b):",
                    0,
                )]
            })
            .collect(),
    );
    assert!(fired(&mini).contains(&"repeat".to_string()));
    let codex = transcript(
        (0..4)
            .map(|i| {
                vec![codex_exec(
                    "cat calc.py",
                    "def add(a, b):\n    return a - b",
                    false,
                    i,
                )]
            })
            .collect(),
    );
    assert!(
        fired(&codex).contains(&"repeat".to_string()),
        "chunk ids and wall times are masked"
    );
    // Re-running after each real change is not a repeat.
    let mut steps = Vec::new();
    for i in 0..4 {
        steps.push(vec![mini_bash(
            &format!("sed -i 's/v{i}/v{}/' calc.py", i + 1),
            "",
            0,
        )]);
        steps.push(vec![mini_bash("python calc.py", &format!("result {i}"), 0)]);
    }
    assert!(!fired(&transcript(steps)).contains(&"repeat".to_string()));
}

#[test]
fn cycles_fire_on_a_b_a_b_with_the_same_results() {
    let a = || {
        call(
            "open",
            json!({"path": "gson/$Gson$Types.java"}),
            "File .java not found\n(Open file: n/a)\n(Current directory: /gson)\nbash-$",
            None,
        )
    };
    let b = || {
        call("find_file", json!({"file_name": "Types.java"}), "No matches found for \"Types.java\" in /gson\n(Open file: n/a)\n(Current directory: /gson)\nbash-$", None)
    };
    let t = transcript(vec![vec![a()], vec![b()], vec![a()], vec![b()], vec![a()]]);
    assert!(fired(&t).contains(&"cycles".to_string()));
    let c = |f: &str| gemini_shell(&format!("cat {f}"), f, false, 1);
    let t = transcript(vec![
        vec![c("a")],
        vec![c("b")],
        vec![c("c")],
        vec![c("d")],
        vec![c("e")],
    ]);
    assert!(!fired(&t).contains(&"cycles".to_string()));
}

#[test]
fn edit_revert_fires_on_undo_and_redo_not_on_one_diagnostic_revert() {
    for edit in [openhands_edit, claude_edit] {
        let flip = transcript(vec![
            vec![edit("/w/calc.py", "a - b", "a + b")],
            vec![edit("/w/calc.py", "a + b", "a - b")],
            vec![edit("/w/calc.py", "a - b", "a + b")],
        ]);
        assert!(fired(&flip).contains(&"edit_revert".to_string()));
        let diagnostic = transcript(vec![
            vec![edit("/w/calc.py", "a - b", "a + b")],
            vec![edit("/w/calc.py", "a + b", "a - b")],
        ]);
        assert!(!fired(&diagnostic).contains(&"edit_revert".to_string()));
    }
    // Codex patches: a patch that reverses an earlier patch, then redoes it.
    let p = |from: &str, to: &str| {
        call("apply_patch", json!(format!("*** Begin Patch\n*** Update File: calc.py\n@@\n-    return {from}\n+    return {to}\n*** End Patch")), "Exit code: 0\nWall time: 0 seconds\nOutput:\nSuccess. Updated the following files:\nM calc.py\n", None)
    };
    let t = transcript(vec![
        vec![p("a - b", "a + b")],
        vec![p("a + b", "a - b")],
        vec![p("a - b", "a + b")],
    ]);
    assert!(fired(&t).contains(&"edit_revert".to_string()));
}

#[test]
fn read_loop_fires_on_rereading_an_unchanged_file() {
    let claude = transcript(
        (0..3)
            .map(|_| {
                vec![call(
                    "Read",
                    json!({"file_path": "/w/calc.py"}),
                    "1\tdef add(a, b):",
                    None,
                )]
            })
            .collect(),
    );
    assert!(fired(&claude).contains(&"read_loop".to_string()));
    let opencode = transcript(vec![
        vec![call(
            "read",
            json!({"filePath": "/w/calc.py"}),
            "<content>1: def add</content>",
            None,
        )],
        vec![call(
            "edit",
            json!({"filePath": "/w/calc.py", "oldString": "-", "newString": "+"}),
            "Edit applied successfully.",
            None,
        )],
        vec![call(
            "read",
            json!({"filePath": "/w/calc.py"}),
            "<content>1: def add +</content>",
            None,
        )],
        vec![call(
            "read",
            json!({"filePath": "/w/other.py"}),
            "<content>1: x</content>",
            None,
        )],
    ]);
    assert!(!fired(&opencode).contains(&"read_loop".to_string()));
}

#[test]
fn error_pileup_and_dead_end_fire_when_fighting_the_environment() {
    let cmds = [
        "javac A.java",
        "mvn compile",
        "./mvnw test",
        "gradle build",
        "java -version",
        "javac -cp . A.java",
        "which javac",
    ];
    let swe = transcript(cmds.iter().map(|c| vec![call("bash", json!({"command": c}), &format!("/bin/bash: line 1{}: {}: command not found\n(Open file: n/a)\n(Current directory: /r)\nbash-$", c.len(), c.split(' ').next().unwrap()), None)]).collect());
    let f = fired(&swe);
    assert!(f.contains(&"error_pileup".to_string()), "{f:?}");
    let healthy = transcript(
        cmds.iter()
            .enumerate()
            .map(|(i, c)| vec![gemini_shell(c, &format!("built {i}"), false, i)])
            .collect(),
    );
    let f = fired(&healthy);
    assert!(
        !f.contains(&"error_pileup".to_string()) && !f.contains(&"dead_end".to_string()),
        "{f:?}"
    );
}

#[test]
fn near_duplicates_and_output_stagnation_fire_on_reworded_searches() {
    let search = |term: &str| {
        call("search_dir", json!({"search_term": term}), &format!("No matches found for \"{term}\" in /r\n(Open file: n/a)\n(Current directory: /r)\nbash-$"), None)
    };
    let t = transcript(vec![
        vec![search("jackson xml property")],
        vec![search("jackson xml mapping")],
        vec![search("jackson xml serialization")],
        vec![search("xml property")],
        vec![search("xml")],
    ]);
    let f = fired(&t);
    assert!(
        f.contains(&"output_stagnation".to_string()) || f.contains(&"near_duplicate".to_string()),
        "{f:?}"
    );
    let grep = |term: &str, hit: &str| mini_bash(&format!("grep -rn '{term}' src"), hit, 0);
    let t = transcript(vec![
        vec![grep("Foo", "a.py:1:Foo")],
        vec![grep("Bar", "b.py:2:Bar")],
        vec![grep("Baz", "c.py:3:Baz")],
        vec![grep("Qux", "d.py:4:Qux")],
    ]);
    let f = fired(&t);
    assert!(
        !f.contains(&"output_stagnation".to_string()) && !f.contains(&"near_duplicate".to_string()),
        "{f:?}"
    );
}

#[test]
fn self_diagnosed_and_repeated_text_read_the_assistant_text() {
    let mut t = transcript(
        (0..4)
            .map(|i| vec![claude_bash(&format!("ls {i}"), &format!("f{i}"), false)])
            .collect(),
    );
    for s in &mut t.steps {
        s.text = "This isn't working. Let me try a different approach to the parser fix.".into();
    }
    let f = fired(&t);
    assert!(
        f.contains(&"self_diagnosed".to_string()) && f.contains(&"repeated_text".to_string()),
        "{f:?}"
    );
    let quiet = transcript(
        (0..4)
            .map(|i| vec![codex_exec(&format!("ls {i}"), "x", false, i)])
            .collect(),
    );
    let f = fired(&quiet);
    assert!(
        !f.contains(&"self_diagnosed".to_string()) && !f.contains(&"repeated_text".to_string()),
        "{f:?}"
    );
}

#[test]
fn budget_is_hard_and_halts_without_a_nudge() {
    let mut cfg = loopwarden::detect::DetectConfig::default();
    cfg.budget.steps = 3;
    cfg.budget.expand_per_change = 0.0;
    let engine = Engine::new(cfg);
    let t = transcript(
        (0..5)
            .map(|i| vec![gemini_shell(&format!("ls {i}"), &format!("{i}"), false, i)])
            .collect(),
    );
    let d = engine.decisions(&t, &StoreFacts::default());
    let first = d.iter().find(|(_, d)| d.action != Action::Observe).unwrap();
    assert_eq!(first.1.action, Action::Halt);
    assert_eq!(first.1.detector, "budget");
    // The default budget never stops a short healthy run.
    assert!(Engine::default()
        .decisions(&t, &StoreFacts::default())
        .iter()
        .all(|(_, d)| d.action == Action::Observe));
}

#[test]
fn verifier_drift_fires_on_a_falling_score() {
    let cfg = loopwarden::detect::DetectConfig {
        verifier: Some(loopwarden::detect::config::VerifierConfig {
            command: "pytest".into(),
            score_regex: r"(\d+) passed".into(),
        }),
        ..Default::default()
    };
    let engine = Engine::new(cfg);
    let run = |scores: &[u32]| {
        let mut steps = Vec::new();
        for (i, s) in scores.iter().enumerate() {
            steps.push(vec![claude_edit(
                "/w/a.py",
                &format!("x{i}"),
                &format!("x{}", i + 1),
            )]);
            steps.push(vec![claude_bash(
                "pytest",
                &format!("{s} passed, 1 failed"),
                true,
            )]);
        }
        let t = transcript(steps);
        let mut state = engine.start(&t);
        let mut seen = Vec::new();
        for step in &t.steps {
            engine.fold(&mut state, step, &StoreFacts::default());
            seen.extend(state.decision().findings.into_iter().map(|f| f.detector));
        }
        seen
    };
    assert!(run(&[9, 7, 5]).contains(&"verifier_drift".to_string()));
    assert!(!run(&[5, 7, 9]).contains(&"verifier_drift".to_string()));
}

#[test]
fn goal_drift_fires_when_recent_work_shares_no_words_with_the_task() {
    let mut cfg = loopwarden::detect::DetectConfig::default();
    cfg.thresholds.goal_window = 3;
    let engine = Engine::new(cfg);
    let fired_with = |cmds: &[&str]| {
        let mut t = transcript(
            cmds.iter()
                .enumerate()
                .map(|(i, c)| vec![codex_exec(c, &format!("ok {i}"), false, i)])
                .collect(),
        );
        for s in &mut t.steps {
            s.text = String::new();
        }
        let mut state = engine.start(&t);
        let mut seen = Vec::new();
        for step in &t.steps {
            engine.fold(&mut state, step, &StoreFacts::default());
            seen.extend(state.decision().findings.into_iter().map(|f| f.detector));
        }
        seen
    };
    assert!(
        fired_with(&["curl weather", "npm view leftpad", "brew info ffmpeg"])
            .contains(&"goal_drift".to_string())
    );
    assert!(
        !fired_with(&["cat calc.py", "pytest test_calc.py", "sed -n 1,9p calc.py"])
            .contains(&"goal_drift".to_string())
    );
}

#[test]
fn size_oscillation_fires_on_a_file_growing_and_shrinking() {
    let w = |content: &str| {
        call(
            "Write",
            json!({"file_path": "/w/a.py", "content": content}),
            "File created successfully",
            None,
        )
    };
    let t = transcript(vec![
        vec![w("a")],
        vec![w("aaaaaa")],
        vec![w("aa")],
        vec![w("aaaaaaa")],
        vec![w("aaa")],
        vec![w("aaaaaaaa")],
    ]);
    assert!(fired(&t).contains(&"size_oscillation".to_string()));
    let g = |content: &str| {
        call(
            "write_file",
            json!({"file_path": "/w/a.py", "content": content}),
            "ok",
            None,
        )
    };
    let t = transcript(vec![
        vec![g("a")],
        vec![g("aa")],
        vec![g("aaa")],
        vec![g("aaaa")],
        vec![g("aaaaa")],
    ]);
    assert!(!fired(&t).contains(&"size_oscillation".to_string()));
}

#[test]
fn error_rate_fires_when_most_recent_results_fail() {
    let t = transcript(
        (0..10)
            .map(|i| {
                vec![claude_bash(
                    &format!("make t{i}"),
                    &format!("error {i}"),
                    i % 3 != 0,
                )]
            })
            .collect(),
    );
    assert!(fired(&t).contains(&"error_rate".to_string()));
    let t = transcript(
        (0..10)
            .map(|i| {
                vec![gemini_shell(
                    &format!("make t{i}"),
                    &format!("built {i}"),
                    i == 4,
                    i,
                )]
            })
            .collect(),
    );
    assert!(!fired(&t).contains(&"error_rate".to_string()));
}

/// opencode's failing shell run: the output and nothing else (no exit code, no error flag on
/// the Chat Completions and Responses wires; CLIENTS.md §4.4).
fn opencode_bash(cmd: &str, out: &str) -> CallWithResult {
    call(
        "bash",
        json!({"command": cmd, "description": "Run the tests"}),
        out,
        None,
    )
}
fn opencode_edit(path: &str, old: &str, new: &str) -> CallWithResult {
    call(
        "edit",
        json!({"filePath": path, "oldString": old, "newString": new}),
        "Edit applied successfully.",
        None,
    )
}

const PYTEST_FAILING: &str =
    "============================= test session starts ==============================
collected 1 item

test_calc.py F                                                           [100%]

=================================== FAILURES ===================================
___________________________________ test_add ___________________________________

    def test_add():
>       assert add(1, 2) == 3
E       assert -1 == 3

test_calc.py:4: AssertionError
=========================== short test summary info ============================
FAILED test_calc.py::test_add - assert -1 == 3
============================== 1 failed in 0.03s ===============================";

#[test]
fn opencode_failures_without_exit_code_are_read_from_the_text() {
    // The same failing run three times in a row: a fail-loop, known only from the text.
    let same = transcript(
        (0..3)
            .map(|_| {
                vec![opencode_bash(
                    "python3 -m pytest -q test_calc.py",
                    PYTEST_FAILING,
                )]
            })
            .collect(),
    );
    assert!(
        fired(&same).contains(&"fail_loop".to_string()),
        "{:?}",
        fired(&same)
    );
    // Edit, the same failure, revert, the same failure...: stagnation across the edits.
    let mut steps = vec![vec![opencode_bash(
        "python3 -m pytest -q test_calc.py",
        PYTEST_FAILING,
    )]];
    for i in 0..4 {
        let (old, new) = if i % 2 == 0 {
            ("a - b", "b - a")
        } else {
            ("b - a", "a - b")
        };
        steps.push(vec![opencode_edit("/w/calc.py", old, new)]);
        steps.push(vec![opencode_bash(
            "python3 -m pytest -q test_calc.py",
            PYTEST_FAILING,
        )]);
    }
    let cycling = fired(&transcript(steps));
    assert!(cycling.contains(&"stagnation".to_string()), "{cycling:?}");
    // The same command passing every time is no failure at all.
    let passing = transcript(
        (0..3)
            .map(|_| {
                vec![opencode_bash(
                    "python3 -m pytest -q test_calc.py",
                    "1 passed in 0.01s",
                )]
            })
            .collect(),
    );
    assert!(!fired(&passing).contains(&"fail_loop".to_string()));
}

#[test]
fn repeat_fires_on_the_same_change_issued_again_and_again() {
    // SWE-agent inserting the same block at the same line (the file grows every time), and
    // OpenHands inserting the same lines: each call changes the file, none makes progress.
    let swe = |i: usize| {
        call(
            "edit",
            json!({"start_line": 194, "end_line": 194, "replacement_text": "if (x == null) {\n  return;\n}"}),
            &format!(
                "[File: /w/Caller.java ({} lines total)]\n194:if (x == null) {{",
                234 + 3 * i
            ),
            None,
        )
    };
    let openhands = |i: usize| {
        call(
            "str_replace_editor",
            json!({"command": "insert", "path": "/w/calc.py", "insert_line": 10, "new_str": "    return a + b"}),
            &format!(
                "The file /w/calc.py has been edited. Lines 10-{} now read...",
                11 + i
            ),
            None,
        )
    };
    for mk in [swe, openhands] {
        let same = transcript((0..3).map(|i| vec![mk(i)]).collect());
        assert!(
            fired(&same).contains(&"repeat".to_string()),
            "{:?}",
            fired(&same)
        );
        // Two in a row, then something else: not yet a repeat.
        let mut two: Vec<Vec<CallWithResult>> = (0..2).map(|i| vec![mk(i)]).collect();
        two.push(vec![claude_bash("python3 test_calc.py", "ok", false)]);
        two.push(vec![mk(3)]);
        assert!(!fired(&transcript(two)).contains(&"repeat".to_string()));
    }
}

#[test]
fn a_reproduced_failure_escalates_one_run_before_an_output_that_merely_repeats() {
    // OpenHands repro scripts exit 0 whether they print a failure or plain values; the
    // same failure after every edit is firmer evidence than the same values (which may be
    // the agent re-verifying a fix), so its ladder starts one rung higher. (Every edit here
    // is new, so the shipped engine waits to stop while they come: the ladder is compared
    // without that wait, `an_agent_still_changing_its_code_is_nudged_but_not_stopped`.)
    let mut cfg = DetectConfig::default();
    cfg.escalation.stop_after_quiet = 0;
    let engine = Engine::new(cfg);
    let ladder = |out: &'static str| {
        let mut steps = vec![vec![mini_bash("python reproduce.py", out, 0)]];
        for i in 1..9 {
            steps.push(vec![openhands_edit(
                "/w/src/dates.py",
                &format!("v{i}"),
                &format!("v{}", i + 1),
            )]);
            steps.push(vec![mini_bash("python reproduce.py", out, 0)]);
        }
        engine
            .decisions(&transcript(steps), &StoreFacts::default())
            .into_iter()
            .map(|(_, d)| d.action)
            .collect::<Vec<Action>>()
    };
    let failing = ladder("Test failed: expected 2021-08-01, got 2021-02-01");
    let neutral = ladder("parsed: 2021-02-01");
    let first = |a: &[Action], x: Action| a.iter().position(|y| *y == x);
    // Both are stagnation and both are nudged at the third repeated outcome...
    assert_eq!(
        first(&failing, Action::Nudge),
        first(&neutral, Action::Nudge)
    );
    assert!(first(&failing, Action::Nudge).is_some(), "{failing:?}");
    // ...but the failure is replanned and halted one check run (two steps) sooner.
    let (fr, nr) = (
        first(&failing, Action::Replan).expect("failing streak replans"),
        first(&neutral, Action::Replan).expect("neutral streak replans"),
    );
    assert_eq!(nr, fr + 2, "failing {failing:?}\nneutral {neutral:?}");
    let (fh, nh) = (
        first(&failing, Action::Halt).expect("failing streak halts"),
        first(&neutral, Action::Halt).expect("neutral streak halts"),
    );
    assert!(fh < nh, "failing {failing:?}\nneutral {neutral:?}");
}

/// SWE-agent's shell: no exit code, the scaffold's trailer after the output.
fn swe_agent_bash(cmd: &str, out: &str) -> CallWithResult {
    call(
        "bash",
        json!({"command": cmd}),
        &format!("{out}\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"),
        None,
    )
}

#[test]
fn a_command_the_scaffold_timed_out_failed_and_changed_nothing() {
    // An installer that times out again and again, with other attempts in between: each
    // timeout is a failure (not a change of the environment), so the same command failing
    // the same way is a fail-loop. SWE-agent and OpenHands word the timeout differently.
    for timeout in [
        "EXECUTION TIMED OUT",
        "Command timed out after 120 seconds.",
    ] {
        let mut steps = Vec::new();
        for i in 0..3 {
            steps.push(vec![swe_agent_bash("apt-get install default-jdk", timeout)]);
            steps.push(vec![swe_agent_bash(
                &format!("ping -c {i} 8.8.8.8"),
                "/bin/bash: line 1: ping: command not found",
            )]);
        }
        let stuck = fired(&transcript(steps));
        assert!(
            stuck.contains(&"fail_loop".to_string()),
            "{timeout}: {stuck:?}"
        );
    }
    // The same installer finishing each time is a change, not a failure.
    let mut steps = Vec::new();
    for i in 0..3 {
        steps.push(vec![swe_agent_bash(
            "apt-get install default-jdk",
            "Reading package lists... Done\nSetting up default-jdk (2:1.11-72build2) ...",
        )]);
        steps.push(vec![swe_agent_bash(
            &format!("java -version {i}"),
            "openjdk 11.0.21",
        )]);
    }
    let fine = fired(&transcript(steps));
    assert!(!fine.contains(&"fail_loop".to_string()), "{fine:?}");
}

#[test]
fn a_sweep_of_searches_or_path_guesses_that_find_nothing_is_a_dead_end() {
    // SWE-agent looking for one file directory by directory, and Claude Code grepping for
    // one symbol with ever new spellings: each answer names another place or pattern, but
    // none found anything, so nothing was learned.
    let find = |dir: &str| {
        call(
            "find_file",
            json!({"file_name": "KeyDeserializer.java", "dir": dir}),
            &format!("No matches found for \"KeyDeserializer.java\" in /r/src/{dir}\n(Open file: n/a)\n(Current directory: /r)\nbash-$"),
            None,
        )
    };
    let dirs = ["deser", "ser", "cfg", "util", "type", "node", "jsontype"];
    let swe = transcript(dirs.iter().map(|d| vec![find(d)]).collect());
    let f = fired(&swe);
    assert!(f.contains(&"dead_end".to_string()), "{f:?}");
    let grep = |pattern: &str| {
        call(
            "Grep",
            json!({"pattern": pattern, "path": "src"}),
            "No matches found",
            None,
        )
    };
    let claude = transcript(
        [
            "keyDeser",
            "KeyDeser",
            "key_deser",
            "deserKey",
            "KeyDeserializers",
            "keyDeserializer",
        ]
        .iter()
        .map(|p| vec![grep(p)])
        .collect(),
    );
    let f = fired(&claude);
    assert!(f.contains(&"dead_end".to_string()), "{f:?}");
    // Guessing where a file is: every guess misses (SWE-agent's `open`, Claude Code's Read).
    let open = |path: &str| {
        call(
            "open",
            json!({"path": path}),
            &format!("File {path} not found\n(Open file: n/a)\n(Current directory: /r)\nbash-$"),
            None,
        )
    };
    let read = |path: &str| {
        call(
            "Read",
            json!({"file_path": path}),
            "<tool_use_error>File does not exist.</tool_use_error>",
            Some(true),
        )
    };
    for guess in [open, read] {
        let t = transcript(
            dirs.iter()
                .map(|d| vec![guess(&format!("src/{d}/KeyDeserializer.java"))])
                .collect(),
        );
        let f = fired(&t);
        assert!(f.contains(&"dead_end".to_string()), "{f:?}");
    }
    // The same sweep finding the file on the way is exploration that pays.
    let found = transcript(
        dirs.iter()
            .enumerate()
            .map(|(i, d)| {
                vec![call(
                    "find_file",
                    json!({"file_name": "KeyDeserializer.java", "dir": d}),
                    &format!("Found 1 matches for \"KeyDeserializer.java\" in /r/src/{d}:\n/r/src/{d}/K{i}.java"),
                    None,
                )]
            })
            .collect(),
    );
    let f = fired(&found);
    assert!(!f.contains(&"dead_end".to_string()), "{f:?}");
}

#[test]
fn the_same_window_printed_again_by_ever_different_commands_is_a_dead_end() {
    // One file of 40 lines: the agent (mini-swe-agent's shell, Claude Code's Bash and Read)
    // prints it, then prints it again through other commands with nothing edited.
    let lines: Vec<String> = (1..=40)
        .map(|i| format!("    value_{i} = compute_value({i}, factor={})", i * 7))
        .collect();
    let window = |from: usize, to: usize, numbered: &dyn Fn(usize, &str) -> String| {
        (from..to)
            .map(|i| numbered(i + 1, &lines[i]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let plain = |_: usize, l: &str| l.to_string();
    let cat_n = |n: usize, l: &str| format!("{n:>6}\t{l}");
    let grep_n = |n: usize, l: &str| format!("{n}:{l}");
    let arrow = |n: usize, l: &str| format!("{n:>6}→{l}");
    let mini = transcript(vec![
        vec![mini_bash("cat calc/config.py", &window(0, 40, &plain), 0)],
        vec![mini_bash(
            "sed -n '10,30p' calc/config.py",
            &window(9, 30, &plain),
            0,
        )],
        vec![mini_bash(
            "nl -ba calc/config.py | head -20",
            &window(0, 20, &cat_n),
            0,
        )],
        vec![mini_bash(
            "tail -n 15 calc/config.py | nl -v 26",
            &window(25, 40, &cat_n),
            0,
        )],
        vec![mini_bash(
            "python3 -c \"print(open('calc/config.py').read()[:600])\"",
            &window(0, 8, &plain),
            0,
        )],
        vec![mini_bash(
            "head -n 12 calc/config.py",
            &window(0, 12, &plain),
            0,
        )],
    ]);
    let f = fired(&mini);
    assert!(f.contains(&"dead_end".to_string()), "{f:?}");
    let claude = transcript(vec![
        vec![call(
            "Read",
            json!({"file_path": "/app/calc/config.py"}),
            &window(0, 40, &arrow),
            None,
        )],
        vec![claude_bash(
            "sed -n '5,25p' /app/calc/config.py",
            &window(4, 25, &plain),
            false,
        )],
        vec![claude_bash(
            "cat -n /app/calc/config.py | sed -n '30,40p'",
            &window(29, 40, &cat_n),
            false,
        )],
        vec![call(
            "Read",
            json!({"file_path": "/app/calc/config.py", "offset": 10, "limit": 10}),
            &window(9, 19, &arrow),
            None,
        )],
        vec![claude_bash(
            "grep -nE 'value_[34] =' /app/calc/config.py",
            &window(2, 4, &grep_n),
            false,
        )],
        vec![claude_bash(
            "awk 'NR>=20 && NR<=28' /app/calc/config.py",
            &window(19, 28, &plain),
            false,
        )],
    ]);
    let f = fired(&claude);
    assert!(f.contains(&"dead_end".to_string()), "{f:?}");
    // Paging through the file, each window new, learns something at every step.
    let paging = transcript(
        (0..6)
            .map(|p| {
                vec![mini_bash(
                    &format!("sed -n '{},{}p' calc/config.py", p * 6 + 1, p * 6 + 6),
                    &window(p * 6, p * 6 + 6, &plain),
                    0,
                )]
            })
            .collect(),
    );
    let f = fired(&paging);
    assert!(!f.contains(&"dead_end".to_string()), "{f:?}");
}

/// A check that fails with the same error lines after each edit, but whose output shows
/// lines never seen before (the debug prints the edits added appear, values change): the
/// outcome signature repeats, yet each run taught the agent something. Such a run neither
/// lengthens nor breaks the stagnation streak (the rubric's "transparent" cycle); the same
/// runs printing nothing new are a spiral.
#[test]
fn stagnation_holds_its_streak_on_a_run_that_shows_new_lines() {
    let run = |out: &str| {
        call(
            "execute_bash",
            json!({"command": "cd /workspace && python reproduce.py"}),
            &format!("{out}\n[The command completed with exit code 1.]"),
            None,
        )
    };
    let cycles = |outputs: Vec<String>| {
        let mut steps = vec![vec![run(&outputs[0])]];
        for (i, out) in outputs.iter().enumerate().skip(1) {
            steps.push(vec![openhands_edit(
                "/w/calc.py",
                &format!("v{i}"),
                &format!("v{}", i + 1),
            )]);
            steps.push(vec![run(out)]);
        }
        transcript(steps)
    };
    let stuck = cycles((0..6).map(|_| format!("computing sum\n{FAIL}")).collect());
    assert!(fired(&stuck).contains(&"stagnation".to_string()));
    let learning = cycles(
        (0..6)
            .map(|i| format!("debug: operand {i} resolved to {}\n{FAIL}", i * 7 + 3))
            .collect(),
    );
    assert!(
        !fired(&learning).contains(&"stagnation".to_string()),
        "{:?}",
        fired(&learning)
    );
    // The only line never seen is the traceback's frame, its line number moved by an edit
    // of the script above it: a place, not news.
    let moved = cycles(
        (0..6)
            .map(|i| {
                format!(
                    "Traceback (most recent call last):\n  File \"/w/reproduce.py\", line {}, in setUpClass\n{FAIL}",
                    30 + i
                )
            })
            .collect(),
    );
    assert!(
        fired(&moved).contains(&"stagnation".to_string()),
        "{:?}",
        fired(&moved)
    );
    let mut off = DetectConfig::default();
    off.thresholds.stagnation_new_output_holds = false;
    let engine = Engine::new(off);
    let fired_off = engine
        .decisions(&learning, &StoreFacts::default())
        .into_iter()
        .any(|(_, d)| d.findings.iter().any(|f| f.detector == "stagnation"));
    assert!(fired_off, "the setting off counts every repeated signature");
}
