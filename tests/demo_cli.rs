//! `loopwarden demo`, run as a user runs it: one command, no key, no setup.

use std::process::Command;

#[test]
fn the_demo_shows_the_loop_the_finding_the_nudge_and_the_halt() {
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["demo", "--step-delay-ms", "0"])
        .env_remove("LOOPWARDEN_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The steps: the same failing test, again and again.
    assert!(
        stdout.matches("FAILED test_calc.py::test_add").count() >= 2,
        "{stdout}"
    );
    // The nudge as the model received it, then the halt as the agent received it.
    let nudge = stdout.find("-> loopwarden nudge").expect("a nudge");
    let halt = stdout
        .find("-> loopwarden halt")
        .or_else(|| stdout.find("-> loopwarden block"))
        .expect("a halt");
    assert!(nudge < halt, "{stdout}");
    assert!(
        stdout.contains("| [loopwarden] You seem to be going in circles"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| [loopwarden] I stopped this run"),
        "{stdout}"
    );
    // The timeline from the log names the findings and the interventions, quoting the
    // commands as the agent ran them (never a normalized key: `python pytest x -m`).
    assert!(stdout.contains("  finding   "), "{stdout}");
    assert!(
        stdout.contains("ran `python -m pytest test_calc.py` 3 more times"),
        "{stdout}"
    );
    for key in ["python pytest test_calc.py -m", "read:", "edit:", "sh:"] {
        assert!(!stdout.contains(key), "{key:?} in {stdout}");
    }
    assert!(stdout.contains("  decision  nudge"), "{stdout}");
    assert!(stdout.contains("The agent stopped after"), "{stdout}");
}
