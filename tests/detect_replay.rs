//! `loopwarden replay`: the binary over a JSONL file, its output format, determinism,
//! and bad input.

use std::process::Command;

use serde_json::json;

fn run_line(id: &str, agent: &str, resolved: bool, loops: bool) -> String {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "Fix the failing test in calc.py"}),
    ];
    for i in 0..14 {
        let (cmd, out) = if loops {
            (
                "pytest test_calc.py".to_string(),
                "FAILED test_add - assert -1 == 3".to_string(),
            )
        } else {
            (format!("cat part{i}.py"), format!("content {i}"))
        };
        messages.push(json!({"role": "assistant", "content": format!("THOUGHT: step {i}"), "tool_calls": [
            {"id": format!("call_{i:03}"), "type": "function", "function": {"name": "bash", "arguments": json!({"command": cmd}).to_string()}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i:03}"),
            "content": format!("<returncode>{}</returncode>\n<output>\n{out}\n</output>", u8::from(loops))}));
    }
    json!({"id": id, "agent": agent, "resolved": resolved, "messages": messages}).to_string()
}

/// A file with a looping run (`loop-1`) and a healthy one (`ok-1`), in its directory.
fn looping_and_healthy_runs() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("runs.jsonl");
    std::fs::write(
        &file,
        [
            run_line("loop-1", "mini-swe-agent", false, true),
            run_line("ok-1", "openhands", true, false),
        ]
        .join("\n")
            + "\n",
    )
    .unwrap();
    (dir, file)
}

fn replay(file: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .arg("replay")
        .arg(file)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn replay_prints_one_json_line_per_intervention_and_stops_at_a_halt() {
    let (_dir, file) = looping_and_healthy_runs();
    let out = replay(&file, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        let o = l.as_object().unwrap();
        let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["action", "detector", "id", "reason", "step"]);
        assert_eq!(o["id"], "loop-1", "the healthy run gets nothing");
        assert!(["nudge", "replan", "rollback", "pause", "halt", "block"]
            .contains(&o["action"].as_str().unwrap()));
        assert!(o["step"].as_u64().unwrap() < 14);
    }
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]));
    let last = lines.last().unwrap()["action"].as_str().unwrap();
    assert!(
        last == "halt" || last == "block",
        "the loop is stopped: {stdout}"
    );
    assert_eq!(lines[0]["action"], "nudge", "a nudge comes first");

    // Deterministic: the same input gives byte-identical output.
    let again = replay(&file, &[]);
    assert_eq!(stdout.as_bytes(), &again.stdout[..]);

    // --summary: figures on stderr, overall and per agent; stdout unchanged.
    let sum = replay(&file, &["--summary"]);
    assert_eq!(&sum.stdout[..], stdout.as_bytes());
    let table = String::from_utf8(sum.stderr).unwrap();
    assert!(
        table.contains("res-halted") && table.contains("steps-saved"),
        "{table}"
    );
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{table}"))
            .to_string()
    };
    assert!(
        row("all").contains("0.0%"),
        "the resolved run is not halted: {table}"
    );
    assert!(
        row("mini-swe-agent").contains("100.0%"),
        "the looping run is halted: {table}"
    );
    row("openhands");
}

#[test]
fn replay_uses_the_detect_table_of_a_config_file_and_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("runs.jsonl");
    std::fs::write(
        &file,
        run_line("loop-1", "mini-swe-agent", false, true) + "\n",
    )
    .unwrap();
    let cfg = dir.path().join("lw.toml");
    std::fs::write(&cfg, "[detect]\nenabled = false\n").unwrap();
    let out = replay(&file, &["--config", cfg.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty(), "detection off: no interventions");

    std::fs::write(&cfg, "[detect]\nno_such_key = 1\n").unwrap();
    let out = replay(&file, &["--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("detect"));

    std::fs::write(&file, "{\"id\": \"x\"}\n").unwrap();
    let out = replay(&file, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"));
}

#[test]
fn explain_writes_each_step_of_one_run_or_of_every_run() {
    let (_dir, file) = looping_and_healthy_runs();
    let one = String::from_utf8(replay(&file, &["--explain", "loop-1"]).stderr).unwrap();
    assert!(one.starts_with("# loop-1\n"), "{one}");
    assert!(!one.contains("# ok-1"), "only the named run: {one}");
    assert!(one.contains("  0 Exec sh:pytest test_calc.py"), "{one}");
    assert!(
        one.contains("==> request"),
        "the decisions are shown: {one}"
    );
    // The same failure again is the same obstacle, met again (the first meeting starts the
    // standing, however new its lines): the step is stalled, not progress.
    assert!(one.contains("obstacle=met#1/1"), "{one}");
    assert!(one.contains("obstacle=met#2/2"), "{one}");
    assert!(one.contains("restarts=0"), "{one}");
    assert!(one.contains("progress=stalled stall="), "{one}");

    let all = String::from_utf8(replay(&file, &["--explain", "*"]).stderr).unwrap();
    let headers: Vec<&str> = all.lines().filter(|l| l.starts_with("# ")).collect();
    assert_eq!(headers, ["# loop-1", "# ok-1"]);
    assert!(all.contains("Read sh:cat part13.py"), "{all}");
}
