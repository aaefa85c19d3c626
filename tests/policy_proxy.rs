//! Policies over real HTTP: which policy a request falls under (team in the base URL or a
//! header, API key, client, model, API; first match in file order; default), what each mode
//! does to a looping conversation, budgets crossed in each API, and reloads under load.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod proxy_support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intervene_support::{first_k, header, loop_body, looping_script, read_answer, ALL};
use loopwarden::budget::{Price, Prices, Usage};
use loopwarden::config::Config;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use loopwarden::policy::key_id;
use proxy_support::{client, eventually, Api, Tap, ALL_APIS};
use serde_json::{json, Value};

/// Policies as a team writes them: each of the selectors, and an overlap to test the order.
fn teams(key: &str) -> String {
    format!(
        r#"
        [[policy]]
        name = "ci"
        match = {{ team = "ci" }}

        [[policy]]
        name = "team-b"
        match = {{ key_id = "{}" }}

        [[policy]]
        name = "devs"
        mode = "nudge-only"
        match = {{ client = ["claude-code", "codex"] }}

        [[policy]]
        name = "cheap-models"
        match = {{ model = "*-mini*", api = ["openai_chat", "openai_responses"] }}

        [[policy]]
        name = "dev"
        mode = "shadow"
        match = {{ team = "dev" }}
        "#,
        key_id::of(key)
    )
}

/// The config of `toml`'s policies, in front of `upstream`, logging into `dir`.
fn config(toml: &str, upstream: &str, dir: &tempfile::TempDir) -> Config {
    let mut config: Config = toml::from_str(toml).unwrap();
    config.server.listen = "127.0.0.1:0".into();
    config.store.db = format!("sqlite://{}", dir.path().join("log.db").display());
    config.upstream.openai = upstream.to_string();
    config.upstream.anthropic = upstream.to_string();
    config.upstream.gemini = upstream.to_string();
    config
}

async fn start(toml: &str, upstream: &str) -> (loopwarden::proxy::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let running = loopwarden::proxy::start(config(toml, upstream, &dir))
        .await
        .unwrap();
    (running, dir)
}

async fn rows(
    running: &loopwarden::proxy::Running,
    dir: &tempfile::TempDir,
    sql: &str,
) -> Vec<Value> {
    running.flush_log().await;
    let url = format!("sqlite://{}", dir.path().join("log.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let rows = proxy_support::query_json(&pool, sql).await;
    pool.close().await;
    rows
}

#[tokio::test]
async fn each_request_falls_under_the_first_policy_that_matches_and_says_so() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let (proxy, dir) = start(&teams("sk-team-b-secret"), &mock.url()).await;
    let body = Api::Chat.first_request("Fix the bug", false);
    let send = |path: &str, headers: Vec<(&'static str, String)>, body: Value| {
        let mut request = client()
            .post(format!("{}{path}", proxy.url()))
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send()
    };
    let mini = {
        let mut b = body.clone();
        b["model"] = json!("gpt-5.5-mini");
        b
    };
    // (path, headers, body, the policy it falls under)
    type Case = (
        &'static str,
        Vec<(&'static str, String)>,
        Value,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        ("/t/ci/v1/chat/completions", vec![], body.clone(), "ci"),
        // The team prefix combines with the conversation and upstream prefixes.
        (
            "/c/run-7/t/ci/openai/v1/chat/completions",
            vec![],
            body.clone(),
            "ci",
        ),
        (
            "/v1/chat/completions",
            vec![("x-loopwarden-team", "ci".into())],
            body.clone(),
            "ci",
        ),
        (
            "/v1/chat/completions",
            vec![("authorization", "Bearer sk-team-b-secret".into())],
            body.clone(),
            "team-b",
        ),
        (
            "/v1/chat/completions",
            vec![(
                "user-agent",
                "claude-cli/2.1.330 (external, sdk-cli)".into(),
            )],
            body.clone(),
            "devs",
        ),
        // Matches `cheap-models` and `ci`: `ci` comes first in the file.
        ("/t/ci/v1/chat/completions", vec![], mini.clone(), "ci"),
        ("/v1/chat/completions", vec![], mini.clone(), "cheap-models"),
        (
            "/v1/chat/completions",
            vec![("authorization", "Bearer sk-other".into())],
            body.clone(),
            "default",
        ),
        ("/t/qa/v1/chat/completions", vec![], body.clone(), "default"),
    ];
    for (path, headers, body, policy) in &cases {
        let r = send(path, headers.clone(), body.clone()).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(
            header(&r, "x-loopwarden-policy"),
            *policy,
            "{path} {headers:?}"
        );
        r.bytes().await.unwrap();
    }
    // loopwarden's prefixes and headers never reach the upstream.
    let seen = mock.requests();
    assert_eq!(seen.len(), cases.len());
    for r in &seen {
        assert_eq!(r.path, "/v1/chat/completions");
        assert!(r.header("x-loopwarden-team").is_none());
    }
    // A refused request names its policy too.
    let head = raw_head(&proxy.url(), "POST /t/ci/../../../x HTTP/1.1").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert!(head.contains("x-loopwarden-policy: ci\r\n"), "{head}");

    let logged: Vec<String> = rows(&proxy, &dir, "SELECT policy FROM requests ORDER BY id")
        .await
        .iter()
        .map(|r| r["policy"].as_str().unwrap().to_string())
        .collect();
    let mut expected: Vec<String> = cases.iter().map(|c| c.3.to_string()).collect();
    expected.push("ci".into());
    assert_eq!(logged, expected);
    // The key is never stored, only matched on by its fingerprint.
    let db = std::fs::read(dir.path().join("log.db")).unwrap();
    assert!(!String::from_utf8_lossy(&db).contains("sk-team-b-secret"));

    let (_, listed) = admin(&proxy.url(), "/admin/api/policies").await;
    let counts: Vec<(String, u64)> = listed["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().into(),
                p["matched"].as_u64().unwrap(),
            )
        })
        .collect();
    let count = |name: &str| counts.iter().find(|(n, _)| n == name).unwrap().1;
    assert_eq!(
        counts.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["ci", "team-b", "devs", "cheap-models", "dev", "default"]
    );
    assert_eq!((count("ci"), count("team-b"), count("devs")), (5, 1, 1));
    assert_eq!(
        (count("cheap-models"), count("dev"), count("default")),
        (1, 0, 2)
    );
}

/// A team and a client are named one way from the base URL to the dashboard: `/t/` is
/// percent-decoded and matched in any case, a second `/t/` never reaches the upstream,
/// and the conversation's client is the policies' name for it (`claude-code`, not the
/// `claude-cli` of its user-agent), in the API and its filter.
#[tokio::test]
async fn a_team_and_a_client_are_named_one_way_everywhere() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let policies = r#"
        [[policy]]
        name = "spaced"
        match = { team = "my team" }

        [[policy]]
        name = "platform"
        match = { team = "Platform-*" }
    "#;
    let (proxy, _dir) = start(policies, &mock.url()).await;
    let body = Api::Chat.first_request("Fix the bug", false);
    let cases = [
        ("/t/my%20team/c/spaced-run/v1/chat/completions", "spaced"),
        ("/t/MY%20Team/v1/chat/completions", "spaced"),
        ("/t/platform-ai/v1/chat/completions", "platform"),
        ("/t/PLATFORM-AI/v1/chat/completions", "platform"),
        ("/t/my%20team/c/twice/t/other/v1/chat/completions", "spaced"),
    ];
    for (path, policy) in cases {
        let r = client()
            .post(format!("{}{path}", proxy.url()))
            .header("content-type", "application/json")
            .header("user-agent", "claude-cli/2.1.330 (external, sdk-cli)")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(header(&r, "x-loopwarden-policy"), policy, "{path}");
        r.bytes().await.unwrap();
    }
    for r in mock.requests() {
        assert_eq!(r.path, "/v1/chat/completions");
    }
    proxy.flush_log().await;
    let (_, listed) = admin(&proxy.url(), "/admin/api/conversations?client=claude-code").await;
    let run = listed["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "spaced-run")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(run["client"], "claude-code");
    assert_eq!(run["team"], "my team");
    let (_, other) = admin(&proxy.url(), "/admin/api/conversations?client=claude-cli").await;
    assert_eq!(other["conversations"], json!([]), "{other}");
    let (_, by_team) = admin(&proxy.url(), "/admin/api/conversations?team=My%20Team").await;
    assert_eq!(
        by_team["conversations"].as_array().unwrap().len(),
        3,
        "{by_team}"
    );

    // `loopwarden policies --team` places a team the same way.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, policies).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .arg("policies")
        .arg("--config")
        .arg(&file)
        .args(["--team", "MY TEAM"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(out.contains("falls under: spaced"), "{out}");
}

/// `loopwarden policies --config` checks the file `serve` runs, `[[admin.team_tokens]]`
/// included: a token's variable it does not need may be unset (a warning says `serve`
/// will need it), and a set one is read, not reported unset.
#[test]
fn policies_checks_the_served_file_without_its_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("served.toml");
    std::fs::write(
        &file,
        "[admin]\n[[admin.team_tokens]]\nteam = \"ci\"\ntoken_env = \"LW_TEST_POLICIES_CI_TOKEN\"\n\n\
         [[policy]]\nname = \"ci\"\nmatch = { team = \"ci\" }\n",
    )
    .unwrap();
    let policies = |token: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"));
        command
            .args(["policies", "--config"])
            .arg(&file)
            .args(["--team", "ci"])
            .env_remove("LW_TEST_POLICIES_CI_TOKEN");
        if let Some(token) = token {
            command.env("LW_TEST_POLICIES_CI_TOKEN", token);
        }
        command.output().unwrap()
    };
    let unset = policies(None);
    let (out, err) = (
        String::from_utf8_lossy(&unset.stdout),
        String::from_utf8_lossy(&unset.stderr),
    );
    assert!(unset.status.success(), "{err}");
    assert!(out.contains("falls under: ci"), "{out}");
    assert!(
        err.contains("warning: team \"ci\": LW_TEST_POLICIES_CI_TOKEN is not set"),
        "{err}"
    );
    let set = policies(Some("ci-token-0123"));
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    assert!(String::from_utf8_lossy(&set.stderr).is_empty());
}

/// The head of the answer to a request line sent as is (an HTTP client would resolve the
/// dot segments itself).
async fn raw_head(base: &str, line: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.strip_prefix("http://").unwrap();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request =
        format!("{line}\r\nhost: {addr}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).to_string();
    answer.split("\r\n\r\n").next().unwrap().to_string()
}

async fn admin(base: &str, path: &str) -> (u16, Value) {
    let r = client().get(format!("{base}{path}")).send().await.unwrap();
    let status = r.status().as_u16();
    (
        status,
        serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null),
    )
}

/// The same looping conversation under `/t/ci` (enforce) and `/t/dev` (shadow): the first
/// is halted; the second reaches the upstream byte for byte, its answer reaches the client
/// byte for byte, and the log says what would have been done, under which policy.
#[tokio::test]
async fn shadow_passes_every_byte_and_logs_what_enforce_would_do() {
    for dialect in ALL {
        for stream in [false, true] {
            let mock = MockServer::start(looping_script(dialect)).await.unwrap();
            let tap = Tap::start(mock.addr()).await;
            let (proxy, dir) = start(&teams("k"), &tap.url()).await;
            let k = first_k(dialect, Action::Halt);
            let body = loop_body(dialect, k, stream, None).to_string();
            let path = |team: &str| {
                format!(
                    "/t/{team}{}",
                    intervene_support::path(dialect, &format!("{team}-run"), stream)
                )
            };
            let post = |path: String| {
                client()
                    .post(format!("{}{path}", proxy.url()))
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
            };
            let what = format!("{dialect:?} stream={stream}");

            let halted = post(path("ci")).await.unwrap();
            assert_eq!(header(&halted, "x-loopwarden-decision"), "halt", "{what}");
            halted.bytes().await.unwrap();
            assert!(
                mock.requests().is_empty(),
                "{what}: a halt does not call the upstream"
            );

            for _ in 0..2 {
                let shadowed = post(path("dev")).await.unwrap();
                assert_eq!(shadowed.status(), 200, "{what}");
                assert_eq!(header(&shadowed, "x-loopwarden-policy"), "dev", "{what}");
                // Nothing was done: `observe`, whatever it would have done.
                assert_eq!(
                    header(&shadowed, "x-loopwarden-decision"),
                    "observe",
                    "{what}"
                );
                let got = shadowed.bytes().await.unwrap();
                let sent = tap.upstream_bodies();
                assert_eq!(
                    got.as_ref(),
                    sent.last().unwrap().as_slice(),
                    "{what}: answer"
                );
            }
            let seen = mock.requests();
            assert_eq!(seen.len(), 2, "{what}: not halted, not sticky");
            for r in &seen {
                assert_eq!(
                    r.body.as_ref(),
                    body.as_bytes(),
                    "{what}: the client's bytes"
                );
            }

            let logged = rows(
                &proxy,
                &dir,
                "SELECT conversation_id, action, applied, policy FROM interventions ORDER BY id",
            )
            .await;
            let of = |conversation: &str| -> Vec<(String, String)> {
                logged
                    .iter()
                    .filter(|r| r["conversation_id"] == conversation)
                    .map(|r| {
                        (
                            r["applied"].as_str().unwrap().to_string(),
                            r["policy"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            };
            assert_eq!(
                of("ci-run"),
                [("halted".to_string(), "ci".to_string())],
                "{what}"
            );
            assert_eq!(
                of("dev-run"),
                vec![("would_halt".to_string(), "dev".to_string()); 2],
                "{what}"
            );
            let requests = rows(
                &proxy,
                &dir,
                "SELECT applied, decision, policy FROM requests WHERE conversation_id = 'dev-run'",
            )
            .await;
            for r in requests {
                assert_eq!(
                    (r["applied"].as_str(), r["decision"].as_str()),
                    (Some("would_halt"), Some("halt"))
                );
            }
        }
    }
}

/// Two teams whose agents run the same task with the same system prompt (and state no
/// conversation id) are two conversations: a halt of one is not the other's.
#[tokio::test]
async fn two_teams_with_the_same_task_are_two_conversations() {
    let dialect = Dialect::Anthropic;
    let mock = MockServer::start(looping_script(dialect)).await.unwrap();
    let (proxy, _dir) = start(&teams("k"), &mock.url()).await;
    let body = loop_body(dialect, first_k(dialect, Action::Halt), false, None).to_string();
    let post = |team: &str| {
        client()
            .post(format!("{}/t/{team}/v1/messages", proxy.url()))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
    };
    let ci = post("ci").await.unwrap();
    assert_eq!(header(&ci, "x-loopwarden-decision"), "halt");
    let ci_id = header(&ci, "x-loopwarden-conversation");
    assert!(ci_id.starts_with("ci:h-"), "{ci_id}");
    let dev = post("dev").await.unwrap();
    let dev_id = header(&dev, "x-loopwarden-conversation");
    assert_eq!(dev_id, ci_id.replacen("ci:", "dev:", 1));
    let (_, calls, _) = read_answer(dialect, false, &dev.bytes().await.unwrap());
    assert!(
        !calls.is_empty(),
        "the dev team's run is not under ci's halt"
    );
    assert_eq!(mock.requests().len(), 1);
}

/// Under nudge-only the loop gets reminders, the strongest where enforce would stop, and
/// every request reaches the upstream however long the loop goes on.
#[tokio::test]
async fn nudge_only_reminds_and_never_stops() {
    for dialect in ALL {
        let mock = MockServer::start(looping_script(dialect)).await.unwrap();
        let (proxy, dir) = start(&teams("k"), &mock.url()).await;
        let last = first_k(dialect, Action::Halt) + 4;
        for k in 1..=last {
            let r = client()
                .post(format!(
                    "{}{}",
                    proxy.url(),
                    intervene_support::path(dialect, "interactive", false)
                ))
                .header("content-type", "application/json")
                .header("user-agent", "codex_exec/0.169.0 (Debian 12.0.0; x86_64)")
                .body(loop_body(dialect, k, false, None).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(header(&r, "x-loopwarden-policy"), "devs");
            let (_, calls, _) = read_answer(dialect, false, &r.bytes().await.unwrap());
            assert!(
                !calls.is_empty(),
                "{dialect:?} k={k}: the model's own answer"
            );
        }
        assert_eq!(
            mock.requests().len(),
            last,
            "{dialect:?}: every request went upstream"
        );
        let applied: Vec<String> = rows(&proxy, &dir, "SELECT applied FROM requests ORDER BY id")
            .await
            .iter()
            .map(|r| r["applied"].as_str().unwrap().to_string())
            .collect();
        assert!(
            applied
                .iter()
                .all(|a| ["forwarded", "nudged", "replanned"].contains(&a.as_str())),
            "{applied:?}"
        );
        assert!(
            applied.iter().any(|a| a == "replanned"),
            "{dialect:?}: {applied:?}"
        );
        let replanned = mock.requests().last().unwrap().body.clone();
        assert!(String::from_utf8_lossy(&replanned).contains("[loopwarden]"));
    }
}

/// A dollar budget, crossed by the usage of each API's answers, streamed and not: past
/// `warn_at` the request carries the wrap-up reminder, at the cap the conversation gets the
/// halt reply (and keeps getting it), and the admin API has the totals.
#[tokio::test]
async fn a_dollar_budget_reminds_then_halts_in_every_api() {
    // Each answer reports a million input tokens, at $1 a million: $1 an answer.
    let usage = Usage {
        input: 1_000_000,
        cached_input: 0,
        cache_write: 0,
        output: 0,
    };
    let turns = (0..6)
        .map(|i| Turn {
            text: Some(format!("Step {i}.")),
            tool_calls: vec![ToolCall::function(
                "bash",
                json!({"command": format!("ls dir{i}")}),
            )],
            usage: Some(usage),
            ..Turn::default()
        })
        .collect();
    let mock = MockServer::start(Script {
        turns,
        ..Script::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(
        r#"
        [[policy]]
        name = "ci"
        match = { team = "ci" }
        [policy.budget]
        dollars = 2.5
        warn_at = 0.6
        "#,
        &mock.url(),
        &dir,
    );
    config.prices = Prices::new(vec![(
        "*".into(),
        Price {
            input: 1.0,
            cached_input: 1.0,
            cache_write: 1.0,
            output: 1.0,
        },
    )]);
    let proxy = loopwarden::proxy::start(config).await.unwrap();
    let done = [
        ("ls dir0", "a"),
        ("ls dir1", "b"),
        ("ls dir2", "c"),
        ("ls dir3", "d"),
    ];
    for api in ALL_APIS {
        for stream in [false, true] {
            let conversation = format!("{api:?}-{stream}");
            let what = conversation.clone();
            let dialect = dialect(api);
            let before = mock.requests().len();
            let mut texts = Vec::new();
            for k in 0..5 {
                let body = api.request("List the directories", stream, &done[..k]);
                let r = client()
                    .post(format!(
                        "{}/t/ci/c/{conversation}{}",
                        proxy.url(),
                        api.path(stream)
                    ))
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{what} k={k}");
                let answer = r.bytes().await.unwrap();
                texts.push(read_answer(dialect, stream, &answer).0);
            }
            let seen = mock.requests();
            let upstream: Vec<String> = seen[before..]
                .iter()
                .map(|r| String::from_utf8_lossy(&r.body).to_string())
                .collect();
            // $0, $1: plain; $2 of $2.50 (80%): the reminder; $3: halted, and again.
            assert_eq!(
                upstream.len(),
                3,
                "{what}: the halted requests never went upstream"
            );
            assert!(!upstream[1].contains("[loopwarden]"), "{what}");
            assert!(
                upstream[2].contains("close to its budget"),
                "{what}: {}",
                upstream[2]
            );
            assert!(upstream[2].contains("$2.00 of $2.50"), "{what}");
            for text in &texts[3..] {
                assert!(text.contains("budget is spent"), "{what}: {text}");
                assert!(text.contains("$3.00 of $2.50"), "{what}: {text}");
            }
            proxy.flush_log().await;
            let (_, spend) = admin(
                &proxy.url(),
                &format!("/admin/api/conversations/{conversation}"),
            )
            .await;
            let dollars = spend["spend"]["dollars"]
                .as_f64()
                .unwrap_or_else(|| panic!("{spend}"));
            assert!((dollars - 3.0).abs() < 1e-9, "{what}: {spend}");
            assert_eq!(spend["spend"]["policy"], "ci", "{what}");
        }
    }
    let (_, totals) = admin(&proxy.url(), "/admin/api/spend").await;
    let ci = totals["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == "ci")
        .unwrap()
        .clone();
    assert!(
        (ci["dollars"].as_f64().unwrap() - 24.0).abs() < 1e-9,
        "{totals}"
    );
    assert_eq!(ci["conversations"], 8);
}

fn dialect(api: Api) -> Dialect {
    match api {
        Api::Chat => Dialect::OpenAiChat,
        Api::Responses => Dialect::OpenAiResponses,
        Api::Anthropic => Dialect::Anthropic,
        Api::Gemini => Dialect::Gemini,
    }
}

/// The config file changed under a steady load: no request fails or waits on it, the
/// requests after the reload are under the new policies, and a broken file changes nothing
/// but the reported error.
#[tokio::test]
async fn a_reload_under_load_fails_no_request_and_a_broken_file_changes_nothing() {
    let mock = MockServer::start(Script::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loopwarden.toml");
    let file = |policy: &str, extra: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\ndb = \"sqlite://{}\"\n\
             [upstream]\nopenai = \"{}\"\n\n[[policy]]\nname = \"{policy}\"\nmatch = {{ team = \"ci\" }}\n{extra}",
            dir.path().join("log.db").display(),
            mock.url(),
        )
    };
    std::fs::write(&path, file("alpha", "")).unwrap();
    let config = Config::load(Some(&path), |_| None).unwrap();
    let proxy = loopwarden::proxy::start(config).await.unwrap();
    let url = proxy.url();

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut load = Vec::new();
    for worker in 0..4 {
        let (stop, failures, seen, url) =
            (stop.clone(), failures.clone(), seen.clone(), url.clone());
        load.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let body = Api::Chat.first_request(&format!("task {worker}-{n}"), n % 2 == 0);
                match client()
                    .post(format!("{url}/t/ci/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => {
                        let policy = header(&r, "x-loopwarden-policy");
                        match r.bytes().await {
                            Ok(_) => seen.lock().unwrap().push(policy),
                            Err(_) => {
                                failures.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    _ => {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    let latest = || seen.lock().unwrap().last().cloned().unwrap_or_default();
    assert!(eventually(|| latest() == "alpha").await);

    // A new file: the watcher reads it within a poll, the requests after are under `beta`.
    std::fs::write(&path, file("beta", "")).unwrap();
    assert!(eventually(|| latest() == "beta").await, "{:?}", latest());
    let (_, listed) = admin(&url, "/admin/api/policies").await;
    assert_eq!(listed["last_reload"]["outcome"], "applied", "{listed}");
    assert_eq!(listed["last_reload"]["trigger"], "file", "{listed}");

    // A broken file: reported, naming the key; the policies in force stay.
    std::fs::write(
        &path,
        file("gamma", "[policy.detect.thresholds]\nread_loop_read = 2\n"),
    )
    .unwrap();
    let mut rejected = Value::Null;
    for _ in 0..100 {
        rejected = admin(&url, "/admin/api/policies").await.1;
        if rejected["last_reload"]["outcome"] == "rejected" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rejected["last_reload"]["outcome"], "rejected", "{rejected}");
    let error = rejected["last_reload"]["error"].as_str().unwrap();
    assert!(
        error.contains("read_loop_read") && error.contains("gamma"),
        "{error}"
    );
    let names: Vec<&str> = rejected["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["beta", "default"]);
    let before = seen.lock().unwrap().len();
    assert!(eventually(|| seen.lock().unwrap().len() > before + 20).await);
    // The admin API's reload says the same, with a 422.
    let r = client()
        .post(format!("{url}/admin/api/policies/reload"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);

    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "of {} requests",
        seen.len()
    );
    let first_beta = seen.iter().position(|p| p == "beta").unwrap();
    assert!(seen[..first_beta].iter().all(|p| p == "alpha"));
    // Each worker's requests after the switch are all beta; across workers one in flight
    // may still finish under alpha, so count from the last alpha.
    let last_alpha = seen.iter().rposition(|p| p == "alpha").unwrap();
    assert!(seen[last_alpha + 1..].iter().all(|p| p == "beta"));
    assert!(
        seen.len() - last_alpha > 20,
        "requests after the reload: {}",
        seen.len() - last_alpha
    );
    proxy.shutdown().await.unwrap();
}

/// `loopwarden policies` checks a config as `serve` would read it and says where a request
/// would go; a mistake is the same error `serve` gives, naming the key.
#[test]
fn the_policies_command_lists_the_order_and_places_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, teams("sk-team-b-secret")).unwrap();
    let run = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
            .arg("policies")
            .arg("--config")
            .arg(&path)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = run(&[], "");
    assert!(ok, "{err}");
    let names: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        ["ci", "team-b", "devs", "cheap-models", "dev", "default"]
    );
    let (_, out, _) = run(&["--key", "-"], "sk-team-b-secret\n");
    assert!(out.contains("falls under: team-b (enforce)"), "{out}");
    let (_, out, _) = run(&["--user-agent", "codex_exec/0.169.0", "--team", "qa"], "");
    assert!(out.contains("falls under: devs (nudge-only)"), "{out}");
    let (_, out, _) = run(&["--model", "gpt-5.5-mini", "--api", "openai_chat"], "");
    assert!(out.contains("falls under: cheap-models"), "{out}");
    std::fs::write(
        &path,
        "[[policy]]\nname = \"x\"\n[policy.detect.thresholds]\nread_loop_read = 2\n",
    )
    .unwrap();
    let (ok, _, err) = run(&[], "");
    assert!(!ok);
    assert!(
        err.contains("\"x\"") && err.contains("read_loop_read"),
        "{err}"
    );
}

/// `loopwarden policies` warns of a policy an earlier one shadows, and refuses
/// `match = {}`, which would match nothing.
#[test]
fn the_policies_command_warns_of_a_shadowed_policy_and_refuses_an_empty_match() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let policies = |toml: &str| {
        std::fs::write(&path, toml).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"))
            .arg("policies")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, err) = policies(
        "[[policy]]\nname = \"ci\"\nmatch = { team = \"ci*\" }\n\
         [[policy]]\nname = \"nightly\"\nmatch = { team = \"ci-nightly\" }\n",
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: policy \"nightly\" never applies: \"ci\""),
        "{err}"
    );
    let (ok, err) = policies("[[policy]]\nname = \"all\"\nmatch = {}\n");
    assert!(!ok);
    assert!(err.contains("matches no request"), "{err}");
}
