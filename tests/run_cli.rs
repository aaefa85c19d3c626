//! `loopwarden run -- COMMAND` (the real binary) in front of a proxy and the scripted
//! mock: a small agent (Python, posting the loop's requests to the base URL it is given)
//! that loops until halted makes `run` exit 3 though the agent itself exits 0; a run that
//! is not halted exits with the command's own status; a command that never reaches the
//! proxy is said so.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;

use intervene_support::{first_k, loop_body, looping_script, Setup};
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;

/// An agent: posts each body file to `$OPENAI_BASE_URL/chat/completions`, in order, and
/// stops (exiting 0, as agents do) when the answer is loopwarden's halt; then exits with
/// `$EXIT` (0 by default).
const AGENT: &str = r#"
import os, sys, urllib.request
base = os.environ["OPENAI_BASE_URL"]
assert os.environ["LOOPWARDEN_CONVERSATION"] in base, base
for path in sys.argv[1:]:
    request = urllib.request.Request(base + "/chat/completions", data=open(path, "rb").read(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        answer.read()
        if answer.headers.get("x-loopwarden-decision") == "halt":
            break
sys.exit(int(os.environ.get("EXIT", "0")))
"#;

fn run(setup: &Setup, id: &str, bodies: &[std::path::PathBuf], exit: &str) -> std::process::Output {
    let agent = setup.dir.path().join("agent.py");
    std::fs::write(&agent, AGENT).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args([
            "run",
            "--proxy",
            &setup.proxy.url(),
            "--team",
            "ci",
            "--id",
            id,
            "--",
        ])
        .arg("python3")
        .arg(&agent)
        .args(bodies)
        .env("EXIT", exit)
        .env_remove("LOOPWARDEN_ADMIN_TOKEN")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_run_exits_3_and_another_its_own_status() {
    let dialect = Dialect::OpenAiChat;
    let setup = Setup::start(looping_script(dialect), |_| {}).await;
    let halt_k = first_k(dialect, Action::Halt);
    let bodies: Vec<std::path::PathBuf> = (1..=halt_k + 2)
        .map(|k| {
            let path = setup.dir.path().join(format!("body-{k}.json"));
            std::fs::write(&path, loop_body(dialect, k, false, None).to_string()).unwrap();
            path
        })
        .collect();

    let looped = tokio::task::block_in_place(|| run(&setup, "ci-loop", &bodies, "0"));
    let stderr = String::from_utf8_lossy(&looped.stderr);
    assert_eq!(looped.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("halted this run (conversation ci-loop)"),
        "{stderr}"
    );

    // One request, no loop: the command's own status, whatever it is.
    for exit in ["0", "7"] {
        let id = format!("ci-ok-{exit}");
        let ok = tokio::task::block_in_place(|| run(&setup, &id, &bodies[..1], exit));
        let stderr = String::from_utf8_lossy(&ok.stderr);
        assert_eq!(ok.status.code(), Some(exit.parse().unwrap()), "{stderr}");
        assert!(!stderr.contains("halted"), "{stderr}");
    }

    // A command that never calls the model: its status, and a note.
    let silent = tokio::task::block_in_place(|| run(&setup, "ci-silent", &[], "0"));
    let stderr = String::from_utf8_lossy(&silent.stderr);
    assert_eq!(silent.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("saw no model request"), "{stderr}");
}
