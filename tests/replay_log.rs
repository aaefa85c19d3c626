//! Conversation content in the log (`[log] content`) and `loopwarden replay --db`: a looping
//! conversation goes through the real proxy in front of the scripted mock, its steps are
//! logged whole (and masked), and the replay from that SQLite file with a stricter
//! candidate prints the decisions that change; a candidate that changes a policy's mode or
//! budget prints what its policy would have done otherwise (from SQLite and PostgreSQL).

mod intervene_support;

use std::path::Path;
use std::process::Command;

use intervene_support::*;
use loopwarden::detect::{Action, DetectConfig, Engine};
use loopwarden::dialect::Dialect;
use loopwarden::replay::log::compare;
use loopwarden::transcript::{Head, Step, Transcript};

const DIALECT: Dialect = Dialect::OpenAiChat;
/// Requests of the conversation: the k-th carries k runs of the failing test.
const REQUESTS: usize = 12;

/// Runs the looping conversation `id` through a proxy logging content or not, with
/// detection off so that every request reaches the mock (and its history the log).
/// Returns the setup (its log is written out) and the last request's transcript.
async fn run_loop(id: &str, content: bool, text: &LoopText) -> (Setup, Transcript) {
    let setup = Setup::start(looping_script(DIALECT), |c| {
        c.log.content = content;
        c.detect.enabled = false;
    })
    .await;
    let mut last = None;
    for k in 0..REQUESTS {
        let body = loop_body_with(DIALECT, k, false, None, text);
        let resp = setup.post(&path(DIALECT, id, false), &body).await;
        assert!(resp.status().is_success(), "request {k}");
        last = Some(body);
    }
    setup.proxy.flush_log().await;
    let body = last.unwrap().to_string();
    let transcript = DIALECT
        .parse_request(body.as_bytes(), false)
        .unwrap()
        .transcript;
    (setup, transcript)
}

fn db(setup: &Setup) -> std::path::PathBuf {
    setup.dir.path().join("log.db")
}

/// The log's content rows: the head and the steps, as JSON text.
fn stored(db: &Path) -> (Vec<String>, Vec<(i64, String)>) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let heads = conn
        .prepare("SELECT content FROM conversation_content")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<Vec<String>, _>>()
        .unwrap();
    let steps = conn
        .prepare("SELECT step, content FROM step_content ORDER BY step")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<Vec<(i64, String)>, _>>()
        .unwrap();
    (heads, steps)
}

fn write(dir: &Path, name: &str, toml: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    path
}

fn replay(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    replay_with(args, &[])
}

/// [`replay`] with `env` set (`None`: removed).
fn replay_with(args: &[&std::ffi::OsStr], env: &[(&str, Option<&str>)]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_loopwarden"));
    command.arg("replay").args(args);
    for (var, value) in env {
        match value {
            Some(value) => command.env(var, value),
            None => command.env_remove(var),
        };
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The shipped config and [`STRICTER`] as files in `dir`, and the decisions the candidate
/// changes on `transcript` (some).
fn stricter_candidate(
    dir: &Path,
    transcript: &Transcript,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    Vec<loopwarden::replay::log::Change>,
) {
    let current = write(dir, "current.toml", "");
    let candidate = write(dir, "candidate.toml", STRICTER);
    let expected = compare(
        &Engine::new(DetectConfig::default()),
        &Engine::new(loopwarden::replay::load_config(&candidate).unwrap()),
        transcript,
    );
    assert!(!expected.is_empty(), "the candidate changes something");
    (current, candidate, expected)
}

/// `replay --db DB` of `current` and `candidate`, which must print conversation `id` first
/// with the `expected` changes; its stdout and stderr.
fn replay_changes(
    db: &str,
    current: &Path,
    candidate: &Path,
    id: &str,
    expected: &[loopwarden::replay::log::Change],
) -> (String, String) {
    let (ok, out, err) = replay(&[
        "--db".as_ref(),
        db.as_ref(),
        "--config".as_ref(),
        current.as_os_str(),
        "--candidate".as_ref(),
        candidate.as_os_str(),
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("conversation {id} (policy default, {} steps)", REQUESTS - 1)
    );
    let printed: Vec<String> = expected.iter().map(|c| format!("  {c}")).collect();
    assert_eq!(lines[1..=printed.len()], printed[..], "{out}");
    (out, err)
}

/// A candidate stricter than the shipped config: a failing command is a loop at its
/// second run, and the nudge-only patterns halt.
const STRICTER: &str = r#"
[detect.thresholds]
fail_loop_runs = 2

[detect.patterns.near_duplicate]
response = "halt"
"#;

#[tokio::test]
async fn a_logged_loop_replayed_with_a_stricter_candidate_shows_the_decisions_that_change() {
    let (setup, transcript) = run_loop("loop-1", true, &LoopText::default()).await;

    // The log holds the conversation whole: its head and every step, as the proxy read them.
    let (heads, steps) = stored(&db(&setup));
    assert_eq!(heads.len(), 1);
    let head: Head = serde_json::from_str(&heads[0]).unwrap();
    assert_eq!(head.task, transcript.task);
    assert_eq!(head.system, transcript.system);
    let steps: Vec<Step> = steps
        .iter()
        .enumerate()
        .map(|(i, (index, json))| {
            assert_eq!(*index, i as i64);
            serde_json::from_str(json).unwrap()
        })
        .collect();
    assert_eq!(steps, transcript.steps);
    assert_eq!(steps.len(), REQUESTS - 1);

    // What the replay must print: the decisions the candidate changes on that transcript.
    let (current, candidate, expected) = stricter_candidate(setup.dir.path(), &transcript);
    let url = format!("sqlite://{}", db(&setup).display());
    let (out, _) = replay_changes(&url, &current, &candidate, "loop-1", &expected);
    let lines: Vec<&str> = out.lines().collect();
    // The candidate stops the loop earlier than the shipped config: the first change
    // is an earlier intervention, and the summary counts what changed.
    assert!(expected[0].candidate.action.as_str() != "observe", "{out}");
    let summary = lines.last().unwrap();
    assert!(
        summary.starts_with(&format!(
            "replayed 1 conversations (0 skipped: their first steps are not in the log); 1 changed, {} decisions changed",
            expected.len()
        )),
        "{summary}"
    );

    // The same candidate as the current config: nothing changes.
    let (ok, out, err) = replay(&[
        "--db".as_ref(),
        url.as_ref(),
        "--config".as_ref(),
        candidate.as_ref(),
        "--candidate".as_ref(),
        candidate.as_ref(),
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        "replayed 1 conversations (0 skipped: their first steps are not in the log); 0 changed, 0 decisions changed; would-be halts: 0 added, 0 removed; 0 requests done otherwise (mode, budget); runs stopped: 0 added, 0 removed"
    );

    // A period or a conversation that selects nothing: nothing to replay.
    for args in [
        ["--until", "1970-01-02"],
        ["--since", "2999-01-01"],
        ["--conversation", "another"],
    ] {
        let (ok, out, err) = replay(&[
            "--db".as_ref(),
            url.as_ref(),
            "--candidate".as_ref(),
            candidate.as_ref(),
            args[0].as_ref(),
            args[1].as_ref(),
        ]);
        assert!(ok, "{err}");
        assert!(out.starts_with("nothing to replay"), "{args:?}: {out}");
    }
}

#[tokio::test]
async fn without_log_content_nothing_of_the_content_is_stored_and_there_is_nothing_to_replay() {
    let (setup, _) = run_loop("loop-2", false, &LoopText::default()).await;
    let (heads, steps) = stored(&db(&setup));
    assert!(heads.is_empty() && steps.is_empty());
    // The rest of the log is there as always.
    let conn = rusqlite::Connection::open(db(&setup)).unwrap();
    let calls: i64 = conn
        .query_row("SELECT count(*) FROM tool_calls", [], |r| r.get(0))
        .unwrap();
    assert!(calls >= (REQUESTS - 1) as i64);
    let candidate = write(setup.dir.path(), "candidate.toml", STRICTER);
    let (ok, out, err) = replay(&[
        "--db".as_ref(),
        db(&setup).as_os_str(),
        "--candidate".as_ref(),
        candidate.as_ref(),
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("nothing to replay"), "{out}");
    // A candidate naming a detector that does not exist is refused, with the names.
    let misspelt = write(
        setup.dir.path(),
        "misspelt.toml",
        "[detect.patterns.read-loop]\nresponse = \"halt\"\n",
    );
    let (ok, _, err) = replay(&[
        "--db".as_ref(),
        db(&setup).as_os_str(),
        "--candidate".as_ref(),
        misspelt.as_ref(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("\"read-loop\"") && err.contains("read_loop"),
        "{err}"
    );
}

#[tokio::test]
async fn credentials_in_tool_calls_and_results_are_masked_in_the_stored_content() {
    let text = LoopText {
        task: "Fix the deploy script; the key is sk-proj-Q2x7VbN4kL9mT1rZ8wY3uH6p".into(),
        command: "curl -H 'Authorization: Bearer tok-9f8e7d6c5b4a' https://api.example.com/x"
            .into(),
        result: "HTTP 401\nOPENAI_API_KEY=sk-proj-Z9y8X7w6V5u4T3s2R1q0\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq8Lm2Nv7\n-----END RSA PRIVATE KEY-----\ndone \"quoted\"".into(),
        thought: String::new(),
    };
    let (setup, transcript) = run_loop("loop-3", true, &text).await;
    let (heads, steps) = stored(&db(&setup));
    assert_eq!(steps.len(), REQUESTS - 1);
    for secret in ["Q2x7VbN4", "tok-9f8e7d6c5b4a", "Z9y8X7w6", "MIIEowIBAAKC"] {
        assert!(
            heads.iter().all(|h| !h.contains(secret)),
            "{secret} in the head"
        );
        assert!(
            steps.iter().all(|(_, s)| !s.contains(secret)),
            "{secret} in a step"
        );
    }
    // Masked string by string: each row still reads back as a step, with the rest kept.
    let step: Step = serde_json::from_str(&steps[0].1).unwrap();
    let result = step.calls[0].result.as_ref().unwrap();
    assert!(
        result
            .text
            .starts_with("HTTP 401\nOPENAI_API_KEY=[redacted]"),
        "{}",
        result.text
    );
    assert!(
        result
            .text
            .ends_with("-----BEGIN RSA PRIVATE KEY-----[redacted]\ndone \"quoted\""),
        "{}",
        result.text
    );
    assert_eq!(
        step.calls[0].call.name,
        transcript.steps[0].calls[0].call.name
    );
    let head: Head = serde_json::from_str(&heads[0]).unwrap();
    assert_eq!(
        head.task,
        vec!["Fix the deploy script; the key is [redacted]".to_string()]
    );
}

/// Policies of the replay below: `ci` for the team's traffic, the rest `default`.
const TEAMS: &str = r#"
[[policy]]
name = "ci"
match = { team = "ci" }
"#;

/// The team tokens of the file `serve` runs: a secret replay does not need.
const TEAM_TOKENS: &str = r#"
[[admin.team_tokens]]
team = "ci"
token_env = "LW_TEST_REPLAY_CI_TOKEN"
"#;

/// Each conversation is replayed under its own policy as each file resolves it: a
/// candidate that changes only `ci`'s thresholds changes only `ci`'s conversation, and
/// `--policy` picks conversations by the policy they were logged under.
#[tokio::test]
async fn each_conversation_is_replayed_under_the_policy_it_was_logged_under() {
    let setup = Setup::start(looping_script(DIALECT), |c| {
        let teams: loopwarden::config::Config = toml::from_str(TEAMS).unwrap();
        c.policies = teams.policies;
        c.log.content = true;
        c.detect.enabled = false;
    })
    .await;
    for (team, id) in [("ci", "ci-loop"), ("qa", "qa-loop")] {
        for k in 0..REQUESTS {
            let body = loop_body(DIALECT, k, false, None);
            let path = format!("/t/{team}{}", path(DIALECT, id, false));
            assert!(setup.post(&path, &body).await.status().is_success());
        }
    }
    setup.proxy.flush_log().await;
    let dir = setup.dir.path();
    // The files a team serves, with their team tokens: their variables unset here.
    let current = write(dir, "current.toml", &format!("{TEAM_TOKENS}{TEAMS}"));
    let candidate = write(
        dir,
        "candidate.toml",
        &format!("{TEAM_TOKENS}{TEAMS}[policy.detect.thresholds]\nfail_loop_runs = 2\n"),
    );
    let url = format!("sqlite://{}", db(&setup).display());
    let run_with = |extra: &[&str], token: Option<&str>| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "--db".as_ref(),
            url.as_ref(),
            "--config".as_ref(),
            current.as_ref(),
            "--candidate".as_ref(),
            candidate.as_ref(),
        ];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        replay_with(&args, &[("LW_TEST_REPLAY_CI_TOKEN", token)])
    };
    let run = |extra: &[&str]| {
        let (ok, out, err) = run_with(extra, None);
        assert!(ok, "{err}");
        out
    };
    let all = run(&[]);
    // The variable set: read as `serve` reads it, the same replay.
    let (ok, with_token, err) = run_with(&[], Some("ci-token-0123"));
    assert!(ok, "{err}");
    assert_eq!(with_token, all);
    // Both replayed; only ci's, whose thresholds the candidate changes, changed.
    assert!(all.contains("replayed 2 conversations"), "{all}");
    assert!(all.contains("; 1 changed"), "{all}");
    assert!(all.contains("conversation ci-loop (policy ci"), "{all}");
    assert!(all.contains("-> halt(fail_loop)"), "{all}");
    assert!(!all.contains("qa-loop"), "{all}");
    let default_only = run(&["--policy", "default"]);
    assert!(
        default_only.contains("replayed 1 conversation"),
        "{default_only}"
    );
    assert!(!default_only.contains(" -> "), "{default_only}");
    // A mistyped policy: said so, with the log's policies.
    let (ok, out, err) = run_with(&["--policy", "cii"], None);
    assert!(!ok, "{out}");
    assert!(
        err.contains(
            "--policy \"cii\": no request in the log is under that policy (the log's policies: ci, default)"
        ),
        "{err}"
    );
}

/// The same preview from the PostgreSQL database the replicas share: the store a team
/// runs in production.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_loop_logged_in_postgresql_is_replayed_from_it() {
    let pg = loopwarden::store::test_postgres().await.unwrap();
    let id = "pg-loop";
    let setup = Setup::start(looping_script(DIALECT), |c| {
        c.log.content = true;
        c.detect.enabled = false;
        c.store.db = pg.clone();
    })
    .await;
    let mut last = None;
    for k in 0..REQUESTS {
        let body = loop_body_with(DIALECT, k, false, None, &LoopText::default());
        let resp = setup.post(&path(DIALECT, id, false), &body).await;
        assert!(resp.status().is_success(), "request {k}");
        last = Some(body);
    }
    setup.proxy.flush_log().await;
    let transcript = DIALECT
        .parse_request(last.unwrap().to_string().as_bytes(), false)
        .unwrap()
        .transcript;
    let (current, candidate, expected) = stricter_candidate(setup.dir.path(), &transcript);
    let (_, err) =
        tokio::task::block_in_place(|| replay_changes(&pg, &current, &candidate, id, &expected));
    assert!(
        !err.contains(&pg),
        "the URL (and its password) is not echoed: {err}"
    );
}

/// A team's policy in shadow, keeping its conversations whole; `extra` is added to it
/// (`mode`, a `[policy.budget]`...).
fn rollout_policy(mode: &str, extra: &str) -> String {
    format!(
        "[[policy]]\nname = \"ci\"\nmode = \"{mode}\"\nmatch = {{ team = \"ci\" }}\n{extra}\
         [policy.log]\ncontent = true\n"
    )
}

/// Logs the looping conversation `ci-loop` of team `ci` under `config` (its policies) in
/// the log at `db` (`None`: a SQLite file in the setup's directory); the setup and the
/// log's URL.
async fn log_team_loop(config: &str, pg: Option<String>) -> (Setup, String) {
    let config: loopwarden::config::Config = toml::from_str(config).unwrap();
    let setup = Setup::start(looping_script(DIALECT), |c| {
        c.policies = config.policies;
        c.detect = config.detect;
        if let Some(pg) = &pg {
            c.store.db = pg.clone();
        }
    })
    .await;
    for k in 0..REQUESTS {
        let body = loop_body(DIALECT, k, false, None);
        let path = format!("/t/ci{}", path(DIALECT, "ci-loop", false));
        assert!(setup.post(&path, &body).await.status().is_success());
    }
    setup.proxy.flush_log().await;
    let url = pg.unwrap_or_else(|| format!("sqlite://{}", db(&setup).display()));
    (setup, url)
}

/// `replay --db URL --config CURRENT --candidate CANDIDATE` (both TOML texts): stdout.
fn replay_texts(setup: &Setup, url: &str, current: &str, candidate: &str) -> String {
    let dir = setup.dir.path();
    let current = write(dir, "current.toml", current);
    let candidate = write(dir, "candidate.toml", candidate);
    let (ok, out, err) = replay(&[
        "--db".as_ref(),
        url.as_ref(),
        "--config".as_ref(),
        current.as_os_str(),
        "--candidate".as_ref(),
        candidate.as_os_str(),
    ]);
    assert!(ok, "{err}");
    out
}

/// A shadow policy turned to enforce: the run it would have halted shows, at the request
/// detection halts it, and every would-be reminder before becomes a reminder; detection's
/// decisions do not change. The candidate unchanged changes nothing.
async fn shadow_to_enforce_shows_the_halts(pg: Option<String>) {
    let shadow = rollout_policy("shadow", "");
    let (setup, url) = log_team_loop(&shadow, pg).await;
    // The shadow run was forwarded whole: the log holds every request.
    let halt_at = first_k(DIALECT, Action::Halt);
    assert!(halt_at < REQUESTS - 1, "the loop halts within the run");

    let out = replay_texts(&setup, &url, &shadow, &rollout_policy("enforce", ""));
    let halted = format!("  step {halt_at} done: would_halt(fail_loop) -> halted(fail_loop)");
    assert!(out.lines().any(|l| l == halted), "{out}");
    assert!(out.contains("conversation ci-loop (policy ci"), "{out}");
    let summary = out.lines().last().unwrap();
    assert!(
        summary.contains("; 1 changed, 0 decisions changed;"),
        "{summary}"
    );
    assert!(
        summary.contains("runs stopped: 1 added, 0 removed"),
        "{summary}"
    );
    // Nothing is compared past the halt: the agent would have stopped there.
    let steps: Vec<usize> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("step "))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    assert!(
        !steps.is_empty() && steps.iter().all(|k| *k <= halt_at),
        "{out}"
    );

    let out = replay_texts(&setup, &url, &shadow, &shadow);
    let summary = out.lines().last().unwrap();
    assert!(
        summary.contains("; 0 changed, 0 decisions changed;"),
        "{out}"
    );
    assert!(summary.contains("0 requests done otherwise"), "{out}");
}

#[tokio::test]
async fn a_shadow_policy_turned_to_enforce_shows_the_runs_it_would_have_halted() {
    shadow_to_enforce_shows_the_halts(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_shadow_policy_turned_to_enforce_shows_the_halts_from_postgresql() {
    let pg = loopwarden::store::test_postgres().await.unwrap();
    // The replay is a blocking process run: off the runtime's workers.
    let run = shadow_to_enforce_shows_the_halts(Some(pg));
    run.await;
}

/// A budget lower than what the run spent stops it at the step it would have crossed (its
/// wrap-up reminder the step before, at `warn_at`), detection left out of it.
#[tokio::test]
async fn a_lowered_budget_shows_the_step_at_which_the_run_would_have_stopped() {
    let quiet = "[detect]\nenabled = false\n";
    let current = format!("{quiet}{}", rollout_policy("enforce", ""));
    let (setup, url) = log_team_loop(&current, None).await;
    let capped = format!(
        "{quiet}{}",
        rollout_policy("enforce", "[policy.budget]\nsteps = 5\nwarn_at = 0.8\n")
    );
    let out = replay_texts(&setup, &url, &current, &capped);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1..3],
        [
            "  step 4 done: forwarded -> nudged(budget_cap)",
            "  step 5 done: forwarded -> halted(budget_cap)",
        ],
        "{out}"
    );
    let summary = lines.last().unwrap();
    assert!(
        summary.contains("; 1 changed, 0 decisions changed;"),
        "{summary}"
    );
    assert!(summary.contains("2 requests done otherwise"), "{summary}");
    assert!(
        summary.contains("runs stopped: 1 added, 0 removed"),
        "{summary}"
    );
    // Under shadow the same cap is a would-be stop only.
    let shadow_capped = format!(
        "{quiet}{}",
        rollout_policy("shadow", "[policy.budget]\nsteps = 5\n")
    );
    let out = replay_texts(&setup, &url, &current, &shadow_capped);
    assert!(
        out.contains("  step 5 done: forwarded -> would_halt(budget_cap)"),
        "{out}"
    );
    assert!(out.contains("runs stopped: 0 added, 0 removed"), "{out}");
}

/// A team that ran under the shared default policy (in shadow), moved by the candidate to
/// an enforcing policy of its own: its conversations are replayed under that one (found by
/// the team the log kept), and show the halts.
#[tokio::test]
async fn a_team_moved_to_a_policy_of_its_own_is_previewed_under_it() {
    let shared =
        "[[policy]]\nname = \"default\"\nmode = \"shadow\"\n[policy.log]\ncontent = true\n";
    let (setup, url) = log_team_loop(shared, None).await;
    let own = format!("{}{shared}", rollout_policy("enforce", ""));
    let out = replay_texts(&setup, &url, shared, &own);
    assert!(
        out.contains("conversation ci-loop (policy default -> ci, "),
        "{out}"
    );
    let halt_at = first_k(DIALECT, Action::Halt);
    let halted = format!("  step {halt_at} done: would_halt(fail_loop) -> halted(fail_loop)");
    assert!(out.lines().any(|l| l == halted), "{out}");
    assert!(out.contains("runs stopped: 1 added, 0 removed"), "{out}");
}
