//! `loopwarden mock` as a process: it prints its address, answers from the script file and
//! writes the capture file with secrets redacted.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn cli_serves_the_script_and_captures_requests() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    let capture = dir.path().join("cap.jsonl");
    std::fs::write(
        &script,
        r#"{"turns":[{"tool_calls":[{"name":"bash","arguments":{"command":"ls"}}]}],"end_text":"bye"}"#,
    )
    .unwrap();
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_loopwarden"))
            .args(["mock", "--listen", "127.0.0.1:0", "--script"])
            .arg(&script)
            .arg("--capture")
            .arg(&capture)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");

    let body = json!({"model": "m", "tools": [{"type": "function"}],
        "messages": [{"role": "user", "content": "go"}]});
    let v = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{url}/v1/chat/completions?key=SECRETKEY"))
        .bearer_auth("sk-SECRET")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&v.bytes().await.unwrap()).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "bash"
    );

    let text = std::fs::read_to_string(&capture).unwrap();
    assert!(!text.contains("SECRET"), "secrets must be redacted: {text}");
    let rec: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(rec["method"], "POST");
    assert_eq!(rec["path"], "/v1/chat/completions");
    assert_eq!(rec["turn"], 0);
    assert_eq!(rec["api"], "openai_chat");
    assert_eq!(rec["body"], body);
    let raw = serde_json::to_vec(&body).unwrap();
    assert_eq!(rec["body_blake3"], blake3::hash(&raw).to_hex().as_str());
}

#[test]
fn cli_rejects_a_bad_script_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("bad.json");
    std::fs::write(&script, r#"{"turns":[{"text":1}]}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["mock", "--script"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.json"), "{err}");
}

/// The script format is in `loopwarden mock --help`, not only in the source.
#[test]
fn the_help_documents_the_script_format() {
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["mock", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for part in [
        "turns",
        "tool_calls",
        "after_end",
        "repeat_last",
        "side_rules",
        "Example",
    ] {
        assert!(help.contains(part), "{part} in:\n{help}");
    }
}
