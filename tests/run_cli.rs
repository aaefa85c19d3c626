//! `loopwarden run -- COMMAND` (the real binary) in front of a proxy and the scripted
//! mock, with small agents in Python posting the loop's requests: a run halted under its
//! own id exits 3 though the agent exits 0 (also when the agent is "Codex", pointed at the
//! proxy by `run`'s `-c` overrides alone); a run not halted exits with the command's own
//! status; one the proxy never saw exits 4; the preflight (proxy, token, team's policy)
//! stops a run before its command starts (125); a killed command gives 128 + the signal,
//! also when the signal was sent to `run`, and a missing one 127, as shells do.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;

use std::path::{Path, PathBuf};
use std::process::Output;

use intervene_support::{first_k, loop_body, looping_script, Setup};
use loopwarden::config::{Config, TeamToken};
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;

/// An agent: posts each body file named in `$BODIES` (`:`-separated) to
/// `$OPENAI_BASE_URL/chat/completions`, in order, and stops (exiting 0, as agents do) when
/// the answer is loopwarden's halt; then exits with `$EXIT` (0 by default).
const AGENT: &str = r#"
import os, sys, urllib.request
base = os.environ["OPENAI_BASE_URL"]
assert os.environ["LOOPWARDEN_CONVERSATION"] in base, base
for path in filter(None, os.environ.get("BODIES", "").split(":")):
    request = urllib.request.Request(base + "/chat/completions", data=open(path, "rb").read(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        answer.read()
        if answer.headers.get("x-loopwarden-decision") == "halt":
            break
sys.exit(int(os.environ.get("EXIT", "0")))
"#;

/// A stand-in for Codex's CLI, installed as a file named `codex`: like Codex it ignores
/// `OPENAI_BASE_URL` and sends its own `thread-id`. With `FAKE_CODEX=builtin` it talks to
/// the base URL a `-c openai_base_url=...` argument gives (Codex's built-in provider);
/// with `provider`, to `$PROVIDER_URL` (its config's provider), with the headers the
/// `-c model_providers.*.env_http_headers.*` arguments name, read from the environment as
/// Codex does. It writes its arguments to `$ARGS_FILE`.
const FAKE_CODEX: &str = r#"#!/usr/bin/env python3
import json, os, sys, urllib.request
args = sys.argv[1:]
open(os.environ["ARGS_FILE"], "w").write(json.dumps(args))
overrides = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-c"]
headers = {"content-type": "application/json", "thread-id": "thread-0001"}
if os.environ["FAKE_CODEX"] == "builtin":
    base = next(o.split("=", 1)[1].strip('"') for o in overrides if o.startswith("openai_base_url="))
else:
    base = os.environ["PROVIDER_URL"]
    for o in overrides:
        key, variable = o.split("=", 1)
        if ".env_http_headers." in key and os.environ.get(variable.strip('"')):
            headers[key.split(".env_http_headers.")[1]] = os.environ[variable.strip('"')]
for path in filter(None, os.environ.get("BODIES", "").split(":")):
    request = urllib.request.Request(base + "/chat/completions", data=open(path, "rb").read(),
                                     headers=headers)
    with urllib.request.urlopen(request) as answer:
        answer.read()
        if answer.headers.get("x-loopwarden-decision") == "halt":
            break
"#;

const POLICIES: &str = r#"
[[policy]]
name = "ci"
match = { team = ["ci", "ci-*"] }
"#;

const GLOBAL: &str = "global-token-0123";
const CI_TOKEN: &str = "ci-token-4567";
const PAY_TOKEN: &str = "pay-token-89ab";

/// A proxy with a `ci` policy, in front of a mock that loops; with admin tokens when
/// `tokens`.
async fn start(tokens: bool) -> Setup {
    let policies: Config = toml::from_str(POLICIES).unwrap();
    Setup::start(looping_script(Dialect::OpenAiChat), |c| {
        c.policies = policies.policies;
        if tokens {
            c.admin.token = GLOBAL.into();
            c.admin.team_tokens = vec![team_token("ci", CI_TOKEN), team_token("pay", PAY_TOKEN)];
        }
    })
    .await
}

fn team_token(team: &str, token: &str) -> TeamToken {
    TeamToken {
        team: team.into(),
        token_env: format!("LW_{}_ADMIN", team.to_uppercase()),
        token: token.into(),
    }
}

/// The loop's request bodies up to two past the halt, as files; `$BODIES` for the agents.
fn bodies(setup: &Setup) -> Vec<PathBuf> {
    let dialect = Dialect::OpenAiChat;
    (1..=first_k(dialect, Action::Halt) + 2)
        .map(|k| {
            let path = setup.dir.path().join(format!("body-{k}.json"));
            std::fs::write(&path, loop_body(dialect, k, false, None).to_string()).unwrap();
            path
        })
        .collect()
}

fn joined(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// `loopwarden run OPTIONS -- COMMAND` with `env` added (and no admin token inherited).
fn loopwarden_run(options: &[&str], command: &[&str], env: &[(&str, &str)]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .arg("run")
        .args(options)
        .arg("--")
        .args(command)
        .env_remove("LOOPWARDEN_ADMIN_TOKEN")
        .env_remove("LOOPWARDEN_TEAM")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// The agent in the test's directory.
fn agent(dir: &Path) -> String {
    let path = dir.join("agent.py");
    std::fs::write(&path, AGENT).unwrap();
    path.display().to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_run_exits_3_an_unseen_one_4_and_another_its_own_status() {
    let setup = start(false).await;
    let url = setup.proxy.url();
    let all = joined(&bodies(&setup));
    let agent = agent(setup.dir.path());
    let run = |id: &str, bodies: &str, exit: &str| {
        loopwarden_run(
            &["--proxy", &url, "--team", "ci", "--id", id],
            &["python3", &agent],
            &[("BODIES", bodies), ("EXIT", exit)],
        )
    };

    let looped = tokio::task::block_in_place(|| run("ci-loop", &all, "0"));
    assert_eq!(looped.status.code(), Some(3), "{}", stderr(&looped));
    assert!(
        stderr(&looped).contains("halted this run (conversation ci-loop)"),
        "{}",
        stderr(&looped)
    );

    // One request, no loop: the command's own status, whatever it is.
    let first = all.split(':').next().unwrap().to_string();
    for exit in ["0", "7"] {
        let ok = tokio::task::block_in_place(|| run(&format!("ci-ok-{exit}"), &first, exit));
        assert_eq!(
            ok.status.code(),
            Some(exit.parse().unwrap()),
            "{}",
            stderr(&ok)
        );
        assert!(!stderr(&ok).contains("halted"), "{}", stderr(&ok));
    }

    // A command that never calls the model through the proxy: 4 when it says success
    // (nothing watched it), its own status when it does not; a note either way.
    for (exit, code) in [("0", 4), ("7", 7)] {
        let silent = tokio::task::block_in_place(|| run(&format!("ci-silent-{exit}"), "", exit));
        assert_eq!(silent.status.code(), Some(code), "{}", stderr(&silent));
        assert!(
            stderr(&silent).contains("saw no model request"),
            "{}",
            stderr(&silent)
        );
    }
}

/// Nothing of the command runs when the proxy is down, the token wrong or the team has no
/// policy: 125 at once, and a message naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preflight_stops_a_run_before_its_command_starts() {
    let setup = start(true).await;
    let url = setup.proxy.url();
    let marker = setup.dir.path().join("started");
    let touch = ["touch", marker.to_str().unwrap()];
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let cases: [(&str, Vec<&str>, &str); 6] = [
        (
            "proxy down",
            vec!["--proxy", &down, "--admin-token", GLOBAL],
            "cannot reach the proxy",
        ),
        ("no token", vec!["--proxy", &url], "refused the admin token"),
        (
            "wrong token",
            vec!["--proxy", &url, "--admin-token", "nope"],
            "refused the admin token",
        ),
        (
            "a mistyped team",
            vec!["--proxy", &url, "--admin-token", GLOBAL, "--team", "ic"],
            "no policy matches team \"ic\" (the policies name ci, ci-*; policies: ci, default)",
        ),
        (
            "another team's token",
            vec!["--proxy", &url, "--admin-token", PAY_TOKEN, "--team", "ci"],
            "the admin token is team \"pay\"'s",
        ),
        (
            "a team's token without --team",
            vec!["--proxy", &url, "--admin-token", CI_TOKEN],
            "run with --team ci",
        ),
    ];
    for (case, options, says) in cases {
        let refused = tokio::task::block_in_place(|| loopwarden_run(&options, &touch, &[]));
        assert_eq!(
            refused.status.code(),
            Some(125),
            "{case}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains("preflight failed"),
            "{case}: {}",
            stderr(&refused)
        );
        assert!(
            stderr(&refused).contains(says),
            "{case}: {}",
            stderr(&refused)
        );
        assert!(!marker.exists(), "{case}: the command ran");
    }

    // The team's own token, a team its policy's pattern names (in any case): the run goes
    // ahead, and its halt is read with that token.
    let all = joined(&bodies(&setup));
    let agent = agent(setup.dir.path());
    for (token, team) in [(CI_TOKEN, "ci"), (GLOBAL, "CI-Nightly")] {
        let id = format!("pre-{}", team.to_lowercase());
        let halted = tokio::task::block_in_place(|| {
            loopwarden_run(
                &[
                    "--proxy",
                    &url,
                    "--admin-token",
                    token,
                    "--team",
                    team,
                    "--id",
                    &id,
                ],
                &["python3", &agent],
                &[("BODIES", &all)],
            )
        });
        assert_eq!(halted.status.code(), Some(3), "{team}: {}", stderr(&halted));
    }
}

/// As shells give them: 128 + the signal that killed the command (also one sent to `run`,
/// which passes it on), 127 for a command not found, 126 for a file that cannot run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_command_gives_128_plus_its_signal_a_missing_one_127() {
    let setup = start(false).await;
    let url = setup.proxy.url();
    let options = ["--proxy", url.as_str()];

    let killed = tokio::task::block_in_place(|| {
        loopwarden_run(&options, &["sh", "-c", "kill -TERM $$"], &[])
    });
    assert_eq!(killed.status.code(), Some(128 + 15), "{}", stderr(&killed));
    assert!(
        stderr(&killed).contains("killed by signal 15"),
        "{}",
        stderr(&killed)
    );

    let missing = tokio::task::block_in_place(|| {
        loopwarden_run(&options, &["loopwarden-no-such-command"], &[])
    });
    assert_eq!(missing.status.code(), Some(127), "{}", stderr(&missing));
    assert!(
        stderr(&missing).contains("command not found"),
        "{}",
        stderr(&missing)
    );

    let plain_file = setup.dir.path().join("not-executable");
    std::fs::write(&plain_file, "#!/bin/sh\n").unwrap();
    let refused = tokio::task::block_in_place(|| {
        loopwarden_run(&options, &[plain_file.to_str().unwrap()], &[])
    });
    assert_eq!(refused.status.code(), Some(126), "{}", stderr(&refused));

    // SIGINT to `run` itself (a CI job cancelled): the command gets it and ends, and so
    // does `run`, with 128 + 2.
    let pid_file = setup.dir.path().join("child.pid");
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let mut running = std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["run", "--proxy", &url, "--", "sh", "-c", &script])
        .env_remove("LOOPWARDEN_ADMIN_TOKEN")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child_pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            break pid;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let sent = std::process::Command::new("kill")
        .args(["-INT", &running.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::task::block_in_place(|| running.wait().unwrap());
    assert_eq!(status.code(), Some(128 + 2));
    assert!(
        !Path::new(&format!("/proc/{child_pid}")).exists(),
        "the command was stopped too"
    );
}

/// Codex ignores `OPENAI_BASE_URL`; `run` points it at the proxy under the run's id with
/// `-c` arguments: its built-in provider through `openai_base_url`, a provider of its
/// config through headers. Either way its halt is the run's (exit 3), not its thread's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_run_is_halted_under_the_runs_id_not_its_thread() {
    let setup = start(false).await;
    let url = setup.proxy.url();
    let dir = setup.dir.path();
    let all = joined(&bodies(&setup));
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let codex = bin.join("codex");
    std::fs::write(&codex, FAKE_CODEX).unwrap();
    std::fs::set_permissions(&codex, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let codex_home = dir.join("codex-home");
    std::fs::create_dir(&codex_home).unwrap();
    let args_file = dir.join("args.json");
    let provider_url = format!("{url}/v1");
    let run = |id: &str, mode: &str, config: &str| {
        std::fs::write(codex_home.join("config.toml"), config).unwrap();
        loopwarden_run(
            &["--proxy", &url, "--team", "ci", "--id", id],
            &[codex.to_str().unwrap(), "exec", "Fix the failing test."],
            &[
                ("BODIES", &all),
                ("FAKE_CODEX", mode),
                ("PROVIDER_URL", &provider_url),
                ("CODEX_HOME", codex_home.to_str().unwrap()),
                ("ARGS_FILE", args_file.to_str().unwrap()),
            ],
        )
    };

    let builtin = tokio::task::block_in_place(|| run("codex-builtin", "builtin", ""));
    assert_eq!(builtin.status.code(), Some(3), "{}", stderr(&builtin));
    let args: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(&args_file).unwrap()).unwrap();
    assert_eq!(
        args[..2],
        [
            "-c".to_string(),
            format!("openai_base_url=\"{url}/t/ci/c/codex-builtin/v1\"")
        ],
        "{args:?}"
    );
    assert_eq!(args[args.len() - 2..], ["exec", "Fix the failing test."]);

    // The README's provider, whose base URL is the bare proxy: its requests state the
    // run's id and team in headers, which win over Codex's thread id.
    let config = format!(
        "model_provider = \"loopwarden\"\n[model_providers.loopwarden]\nname = \"loopwarden\"\n\
         base_url = \"{provider_url}\"\nenv_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n"
    );
    let provider = tokio::task::block_in_place(|| run("codex-provider", "provider", &config));
    assert_eq!(provider.status.code(), Some(3), "{}", stderr(&provider));
    let (status, conversation) = setup
        .admin("/admin/api/conversations/codex-provider", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        conversation["conversation"]["id_source"],
        "x-loopwarden-conversation"
    );
    assert_eq!(
        conversation["requests"][0]["policy"], "ci",
        "the team came in a header too"
    );
    let (status, _) = setup
        .admin("/admin/api/conversations/thread-0001", None)
        .await;
    assert_eq!(status, 404, "nothing was logged under Codex's thread id");
}
