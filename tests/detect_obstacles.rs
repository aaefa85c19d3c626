//! Progress judged by the obstacle: a run that keeps meeting the same error with varied
//! commands (each result showing a line or two never seen) is stalled; one whose error
//! changes, or whose source edits come between the failures, is working. And the shapes
//! of frontier stalls: a check ritual whose commands differ only in comments, a poll of a
//! process that has exited, a stop for a run still standing on its obstacle.

use loopwarden::detect::{Action, Engine, StoreFacts};
use loopwarden::transcript::{CallWithResult, Step, ToolCall, ToolResult, Transcript};
use serde_json::{json, Value};

fn call(name: &str, args: Value, result: &str, is_error: bool) -> CallWithResult {
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
            is_error: Some(is_error),
        }),
    }
}

/// A shell call under a name no profile knows, read by its `command` argument.
fn exec(cmd: &str, out: &str, fail: bool) -> CallWithResult {
    call("exec", json!({"command": cmd}), out, fail)
}

fn write(path: &str, content: &str) -> CallWithResult {
    call(
        "write",
        json!({"path": path, "content": content}),
        &format!("wrote {} bytes to {path}", content.len()),
        false,
    )
}

fn transcript(steps: Vec<Vec<CallWithResult>>) -> Transcript {
    Transcript {
        system: vec![],
        task: vec!["Boot the VM and serve ssh on port 2222".into()],
        steps: steps
            .into_iter()
            .enumerate()
            .map(|(index, calls)| Step {
                index,
                text: format!("Trying again ({index})."),
                calls,
                user_after: Vec::new(),
            })
            .collect(),
    }
}

/// (request index, action, detector) of every decision other than observe, and every
/// detector that reported a finding at any step.
fn replay(t: &Transcript) -> (Vec<(usize, Action, String)>, Vec<String>) {
    let engine = Engine::default();
    let mut fired = Vec::new();
    let mut acted = Vec::new();
    for (request, d) in engine.decisions(t, &StoreFacts::default()) {
        for f in &d.findings {
            if !fired.contains(&f.detector) {
                fired.push(f.detector.clone());
            }
        }
        if d.action != Action::Observe {
            acted.push((request, d.action, d.detector));
        }
    }
    (acted, fired)
}

/// A launch that dies on the same error whatever its flags; each attempt prints a line
/// of its own first (the flags it was given), and a side probe between attempts learns
/// something new each time.
fn launches(n: usize, same_error: bool, edit_between: bool) -> Transcript {
    let flags = [
        "-accel tcg",
        "-cpu qemu64",
        "-M pc",
        "-display none",
        "-cpu 486",
        "-smp 2",
    ];
    let mut steps = Vec::new();
    for i in 0..n {
        let flag = flags[i % flags.len()];
        let error = if same_error {
            "rosetta error: Unimplemented syscall number 282".to_string()
        } else {
            format!(
                "error while loading shared libraries: lib{}.so",
                ["spice", "opus", "lz4", "ssl", "usb", "sasl"][i % 6]
            )
        };
        if edit_between {
            steps.push(vec![write(
                "/app/boot.py",
                &format!("ARGS = '{flag} -m {}'\n", 256 + i),
            )]);
        }
        steps.push(vec![exec(
            &format!("qemu-system-x86_64 {flag} -m 512 -hda alpine.qcow2"),
            &format!("starting with {flag} (attempt {i})\n{error}\nTrace/breakpoint trap"),
            true,
        )]);
        steps.push(vec![exec(
            &format!("uname -a && cat /proc/cpuinfo | head -{}", 3 + i),
            &format!("Linux box 6.{i}.0 aarch64\nprocessor {i}: virtual core {i}"),
            false,
        )]);
    }
    transcript(steps)
}

#[test]
fn a_launch_dying_on_the_same_error_whatever_its_flags_stands_on_one_obstacle() {
    let (acted, fired) = replay(&launches(6, true, false));
    assert!(fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
    let first = acted.first().expect("an intervention");
    assert_eq!(
        (first.1, first.2.as_str()),
        (Action::Nudge, "obstacle_stall"),
        "{acted:?}"
    );
}

#[test]
fn an_error_that_changes_each_time_is_no_obstacle_stall() {
    let (_, fired) = replay(&launches(6, false, false));
    assert!(!fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
}

#[test]
fn a_source_edit_before_each_failure_is_an_attempt_at_the_obstacle() {
    // The same error, but each launch follows an edit that brings the code to a new state:
    // the run is struggling, and its standing starts over at each attempt.
    let (_, fired) = replay(&launches(6, true, true));
    assert!(!fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
}

#[test]
fn a_run_still_standing_on_its_obstacle_after_the_reminders_is_stopped() {
    let (acted, _) = replay(&launches(14, true, false));
    let halt = acted
        .iter()
        .find(|(_, a, _)| a.stops())
        .expect("a stop once the run stood on its obstacle since the nudge");
    assert_eq!(halt.2, "obstacle_stall", "{acted:?}");
    let nudge = acted
        .iter()
        .position(|(_, a, _)| *a == Action::Nudge)
        .unwrap();
    let replan = acted
        .iter()
        .position(|(_, a, _)| *a == Action::Replan)
        .unwrap();
    assert!(
        acted[nudge].0 < acted[replan].0 && acted[replan].0 < halt.0,
        "{acted:?}"
    );
}

#[test]
fn a_run_that_changes_its_files_after_the_reminder_is_not_stopped_by_the_obstacle() {
    // The same stall, but after the reminder the run writes a new config before each
    // launch (a scratch file, so the obstacle's standing goes on): a change since the
    // reminder holds the stop, the fix it may be working towards is not lost.
    let mut t = launches(14, true, false);
    let (acted, _) = replay(&t);
    let nudge = acted
        .iter()
        .find(|(_, a, _)| *a == Action::Nudge)
        .unwrap()
        .0;
    for (i, step) in t.steps.iter_mut().enumerate().skip(nudge) {
        step.calls
            .push(write("/tmp/qemu.conf", &format!("attempt = {i}\n")));
    }
    let (acted, _) = replay(&t);
    assert!(
        !acted
            .iter()
            .any(|(_, a, d)| a.stops() && d == "obstacle_stall"),
        "{acted:?}"
    );
}

#[test]
fn a_check_ritual_whose_commands_differ_only_in_comments_is_a_cycle() {
    let ritual = |round: usize| -> Vec<Vec<CallWithResult>> {
        let note = |s: &str| format!("# round {round}: {s}\n");
        vec![
            vec![exec(
                &format!("{}ps aux | grep sshd", note("is it up")),
                "root 12 sshd: /usr/sbin/sshd -D",
                false,
            )],
            vec![exec(
                &format!("{}ss -tlnp | grep 2222  # port", note("listening")),
                "LISTEN 0 128 0.0.0.0:2222",
                false,
            )],
            vec![exec(
                &format!("{}  ssh -p 2222 root@localhost true", note("login")),
                "Connection closed by 127.0.0.1 port 2222",
                true,
            )],
        ]
    };
    let steps: Vec<Vec<CallWithResult>> = (0..3).flat_map(ritual).collect();
    let (_, fired) = replay(&transcript(steps));
    assert!(fired.contains(&"cycles".to_string()), "{fired:?}");
}

#[test]
fn polling_a_process_that_has_exited_is_a_resend() {
    // Between the polls the run looks at other things and learns a little each time, so no
    // stretch stays unchanged; the poll itself returns the same thing every time.
    let mut steps = Vec::new();
    for i in 0..4 {
        steps.push(vec![exec(
            "tail -3 /tmp/train.log",
            "epoch 3/10 loss 0.41\nKilled\n[process exited with code 137]",
            false,
        )]);
        steps.push(vec![exec(
            &format!("free -m | head -{}", 2 + i),
            &format!("Mem: 16000 {} used", 9000 + 500 * i),
            false,
        )]);
    }
    let (_, fired) = replay(&transcript(steps));
    assert!(fired.contains(&"resend".to_string()), "{fired:?}");
}

/// A reproduction script rewritten between runs (a scratch file: no attempt at the code),
/// each run raising another exception, with a read of the code between: the traceback's
/// header is the same every time, what was raised is not.
fn repro_runs(exceptions: &[&str]) -> Transcript {
    let mut steps = Vec::new();
    for (i, raised) in exceptions.iter().enumerate() {
        steps.push(vec![write(
            "reproduce_issue.py",
            &format!("import django\nsetup({i})\n"),
        )]);
        steps.push(vec![exec(
            "python reproduce_issue.py",
            &format!(
                "Traceback (most recent call last):\n  File \"reproduce_issue.py\", line {}, in <module>\n    setup({i})\n{raised}",
                3 + i
            ),
            true,
        )]);
        steps.push(vec![exec(
            &format!(
                "sed -n '{},{}p' django/db/models/base.py",
                100 + 20 * i,
                120 + 20 * i
            ),
            &format!("def check_{i}(self):\n    return self.model_{i}"),
            false,
        )]);
    }
    transcript(steps)
}

#[test]
fn tracebacks_raising_other_exceptions_are_other_obstacles() {
    let (_, fired) = replay(&repro_runs(&[
        "django.core.exceptions.AppRegistryNotReady: Apps aren't loaded yet.",
        "RuntimeError: Settings already configured.",
        "LookupError: No installed app with label 'repro_app'.",
        "TypeError: unhashable type: 'list'",
        "KeyError: 'through_fields'",
    ]));
    assert!(!fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
    // The same exception raised run after run is one obstacle, whatever the frames say.
    let (_, fired) = replay(&repro_runs(&["TypeError: unhashable type: 'list'"; 5]));
    assert!(fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
}

#[test]
fn an_empty_search_now_and_then_among_searches_that_find_things_is_no_stand() {
    // Each empty grep is followed by one that finds what the next question needs.
    let mut steps = Vec::new();
    for i in 0..6 {
        steps.push(vec![exec(
            &format!("grep -rn 'def _eval_join_{i}' sympy/matrices/dense.py"),
            "",
            true,
        )]);
        steps.push(vec![exec(
            &format!("grep -rn 'def row_join_{i}' sympy/matrices/"),
            &format!(
                "sympy/matrices/common.py:{}:    def row_join_{i}(self, other):\n\
                 sympy/matrices/sparse.py:{}:        return self._join(other, axis={i})",
                400 + i,
                90 + i
            ),
            false,
        )]);
    }
    let (_, fired) = replay(&transcript(steps.clone()));
    assert!(!fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
    // Searches reworded around one missing thing, nothing found between, do stand.
    let empty: Vec<_> = steps.into_iter().step_by(2).collect();
    let (_, fired) = replay(&transcript(empty));
    assert!(
        fired.contains(&"obstacle_stall".to_string()) || fired.contains(&"dead_end".to_string()),
        "{fired:?}"
    );
}

#[test]
fn a_short_answer_with_two_new_lines_is_the_same_failure_not_news() {
    // A launch's three-line answer: the same error between two lines that name its flags
    // (new every time), and a side probe between launches that learns a little. Most of
    // each answer is new, but two lines are scraps: the launch stands on its obstacle.
    let flags = [
        "-cpu qemu64",
        "-M pc",
        "-accel tcg",
        "-display none",
        "-smp 2",
        "-cpu 486",
    ];
    let mut steps = Vec::new();
    for (i, flag) in flags.iter().enumerate() {
        steps.push(vec![exec(
            &format!("qemu-system-x86_64 -m 512 -cdrom alpine.iso {flag} &"),
            &format!(
                "Checking {flag}\nrosetta error: Unimplemented syscall number 282\n\
                 [1] + Trace/breakpoint trap qemu-system-x86_64 {flag}"
            ),
            true,
        )]);
        steps.push(vec![exec(
            &format!("ls /usr/lib/qemu | head -{}", 3 + i),
            &format!("qemu-bridge-helper-{i}\nvhost-user-gpu-{i}"),
            false,
        )]);
    }
    let (_, fired) = replay(&transcript(steps));
    assert!(fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
}

#[test]
fn a_first_meeting_counts_however_much_came_with_it() {
    // The first launch prints its banner around the error (much that is new); three more
    // launches with other flags meet the same error with a scrap of news each, a side
    // probe between: four steps on one obstacle.
    let mut steps = vec![vec![exec(
        "qemu-system-x86_64 -m 512 -cdrom alpine.iso -nographic &",
        "Started QEMU with PID: 653\nSerial console on tcp port 6665\nBooting from DVD/CD\n\
         rosetta error: Unimplemented syscall number 282",
        true,
    )]];
    for (i, flag) in ["-cpu qemu64", "-accel tcg", "-display none"]
        .iter()
        .enumerate()
    {
        steps.push(vec![exec(
            &format!("ls /usr/lib/qemu | head -{}", 3 + i),
            &format!("qemu-bridge-helper-{i}\nvhost-user-gpu-{i}"),
            false,
        )]);
        steps.push(vec![exec(
            &format!("qemu-system-x86_64 -m 512 -cdrom alpine.iso {flag} &"),
            &format!("rosetta error: Unimplemented syscall number 282\nQEMU exited ({flag})"),
            true,
        )]);
    }
    let (_, fired) = replay(&transcript(steps));
    assert!(fired.contains(&"obstacle_stall".to_string()), "{fired:?}");
}

/// A long job started in the background, polled, and killed by the tool's timeout; started
/// again with nothing changed. Each start answers with another session name.
fn restarts(n: usize, edit_between: bool) -> Transcript {
    let mut steps = Vec::new();
    for (i, session) in ["wild-cedar", "faint-gulf", "tidy-ember", "mellow-fjord"]
        .iter()
        .take(n)
        .enumerate()
    {
        if edit_between {
            steps.push(vec![write(
                "/app/train.py",
                &format!("EPOCHS = {}\n", 5 + i),
            )]);
        }
        steps.push(vec![exec(
            "python3 /app/train.py",
            &format!("Command still running (session {session}). Use process to poll."),
            false,
        )]);
        for pct in [10, 30] {
            steps.push(vec![call(
                "process",
                json!({"action": "poll", "sessionId": session}),
                &format!("Progress: {}% loss {}", pct + i, 1.5 - 0.1 * i as f64),
                false,
            )]);
        }
        steps.push(vec![call(
            "process",
            json!({"action": "poll", "sessionId": session}),
            &format!("Progress: {}%\nProcess killed: SIGTERM (timeout)", 40 + i),
            true,
        )]);
    }
    transcript(steps)
}

#[test]
fn a_job_restarted_after_each_kill_with_nothing_changed_is_an_obstacle_stall() {
    let (acted, _) = replay(&restarts(3, false));
    assert!(
        acted.iter().any(|(_, _, d)| d == "obstacle_stall"),
        "{acted:?}"
    );
    // The same restarts after an edit each time: attempts, not a loop.
    let (acted, _) = replay(&restarts(4, true));
    assert!(
        !acted.iter().any(|(_, _, d)| d == "obstacle_stall"),
        "{acted:?}"
    );
}
