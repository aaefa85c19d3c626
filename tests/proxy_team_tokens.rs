//! Per-team admin tokens (`[[admin.team_tokens]]`; src/proxy/operator/admin.rs `Access`), over real
//! HTTP with live traffic of two teams: a team's token lists, shows, halts, resumes,
//! decides and judges its own team's conversations only (another team's are 404, as if
//! they did not exist), its overview and stats count its own, it reads its own policy,
//! the calls about the whole proxy are 403, and the dashboard's login takes it too.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;

use std::sync::Arc;

use intervene_support::{client, first_k, header, loop_body, looping_script, Setup};
use loopwarden::config::{Config, TeamToken};
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use serde_json::{json, Value};

const DIALECT: Dialect = Dialect::OpenAiChat;

/// Team `pay` waits for a human on a loop; team `ops` (the default policy) is halted.
const POLICIES: &str = r#"
[[policy]]
name = "pay"
match = { team = "pay" }
[policy.intervene]
on_stop = "pause"
[policy.intervene.pause]
timeout_secs = 600
"#;

const GLOBAL: &str = "global-token-0123";
const PAY: &str = "pay-token-4567";
const OPS: &str = "ops-token-89ab";

async fn start() -> Setup {
    let policies: Config = toml::from_str(POLICIES).unwrap();
    Setup::start(looping_script(DIALECT), |c| {
        c.policies = policies.policies;
        c.admin.token = GLOBAL.into();
        c.admin.team_tokens = vec![team_token("pay", PAY), team_token("ops", OPS)];
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

/// Sends the loop's request with `k` failing runs for `team`'s `conversation`; the
/// decision its answer carries.
async fn send(setup: &Setup, team: &str, conversation: &str, k: usize) -> String {
    let path = format!("/t/{team}/c/{conversation}/v1/chat/completions");
    let r = setup.post(&path, &loop_body(DIALECT, k, false, None)).await;
    let decision = header(&r, "x-loopwarden-decision");
    r.bytes().await.unwrap();
    decision
}

/// An admin call with `token`: GET without a body, POST (JSON) with one.
async fn call(setup: &Setup, token: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let request = match body {
        Some(body) => client()
            .post(setup.url(path))
            .header("content-type", "application/json")
            .body(body.to_string()),
        None => client().get(setup.url(path)),
    };
    let response = request.bearer_auth(token).send().await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn ids(list: &Value, key: &str, field: &str) -> Vec<String> {
    let mut ids: Vec<String> = list[key]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|c| c[field].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_team_token_sees_and_acts_on_its_team_only() {
    let setup = Arc::new(start().await);
    let halt_k = first_k(DIALECT, Action::Halt);
    let nudge_k = first_k(DIALECT, Action::Nudge);
    // Team ops loops until halted; team pay has a run that was nudged, and one held for
    // a human (on its first request: nothing of it is in the log yet).
    for k in 1..=halt_k {
        send(&setup, "ops", "ops-loop", k).await;
    }
    assert_eq!(send(&setup, "pay", "pay-run", nudge_k).await, "nudge");
    let held = {
        let s = setup.clone();
        tokio::spawn(async move { send(&s, "pay", "pay-held", halt_k).await })
    };
    let mut pending = Value::Null;
    for _ in 0..200 {
        pending = call(&setup, GLOBAL, "/admin/api/pending", None).await.1;
        if pending["pending"].as_array().is_some_and(|p| p.len() == 1) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let ticket = pending["pending"][0]["id"].as_str().unwrap().to_string();
    setup.proxy.flush_log().await;

    // The list: each team its own, whatever team the query asks for; the global all.
    let list = "/admin/api/conversations";
    assert_eq!(
        ids(
            &call(&setup, PAY, list, None).await.1,
            "conversations",
            "id"
        ),
        ["pay-run"]
    );
    let asks_other = format!("{list}?team=ops");
    assert_eq!(
        ids(
            &call(&setup, PAY, &asks_other, None).await.1,
            "conversations",
            "id"
        ),
        ["pay-run"]
    );
    assert_eq!(
        ids(
            &call(&setup, OPS, list, None).await.1,
            "conversations",
            "id"
        ),
        ["ops-loop"]
    );
    assert_eq!(
        ids(
            &call(&setup, GLOBAL, list, None).await.1,
            "conversations",
            "id"
        ),
        ["ops-loop", "pay-run"]
    );

    // Another team's conversation is one that does not exist: the same 404.
    let (status, missing) = call(&setup, PAY, "/admin/api/conversations/no-such", None).await;
    assert_eq!(status, 404);
    assert_eq!(
        call(&setup, PAY, "/admin/api/conversations/ops-loop", None).await,
        (404, missing.clone())
    );
    let (status, own) = call(&setup, PAY, "/admin/api/conversations/pay-run", None).await;
    assert_eq!(status, 200, "{own}");
    let (status, ops_loop) = call(&setup, OPS, "/admin/api/conversations/ops-loop", None).await;
    assert_eq!((status, &ops_loop["halted"]), (200, &json!(true)));

    // Halt and resume: not another team's (still halted after pay's try), its own yes.
    let resume_ops = "/admin/api/conversations/ops-loop/resume";
    assert_eq!(
        call(&setup, PAY, resume_ops, Some(json!({}))).await,
        (404, missing.clone())
    );
    assert_eq!(
        call(&setup, GLOBAL, "/admin/api/conversations/ops-loop", None)
            .await
            .1["halted"],
        true
    );
    let halt_pay = "/admin/api/conversations/pay-run/halt";
    assert_eq!(call(&setup, OPS, halt_pay, Some(json!({}))).await.0, 404);
    assert_eq!(
        call(&setup, PAY, halt_pay, Some(json!({"reason": "x"})))
            .await
            .0,
        200
    );
    assert_eq!(send(&setup, "pay", "pay-run", 1).await, "halt");
    let resume_pay = "/admin/api/conversations/pay-run/resume";
    assert_eq!(call(&setup, PAY, resume_pay, Some(json!({}))).await.0, 200);

    // Held requests: listed to their team only, decided by it only.
    let pending_of = |token| {
        let setup = setup.clone();
        async move { call(&setup, token, "/admin/api/pending", None).await.1 }
    };
    assert_eq!(
        ids(&pending_of(PAY).await, "pending", "conversation_id"),
        ["pay-held"]
    );
    assert!(ids(&pending_of(OPS).await, "pending", "id").is_empty());
    let decide = format!("/admin/api/pending/{ticket}");
    let (status, _) = call(&setup, OPS, &decide, Some(json!({"decision": "continue"}))).await;
    assert_eq!(status, 404);
    assert_eq!(
        ids(&pending_of(GLOBAL).await, "pending", "id"),
        vec![ticket.clone()]
    );
    let (status, decided) = call(&setup, PAY, &decide, Some(json!({"decision": "continue"}))).await;
    assert_eq!((status, &decided["decided"]), (200, &json!("continue")));
    assert_eq!(held.await.unwrap(), "pause");

    // Feedback on an alert: another team's is no such alert.
    let finding = ops_loop["alerts"]["findings"][0]["id"].as_i64().unwrap();
    let verdict = json!({"finding_id": finding, "verdict": "right"});
    let (status, body) = call(&setup, PAY, "/admin/api/feedback", Some(verdict.clone())).await;
    assert_eq!(
        (status, &body["error"]),
        (404, &json!("no such finding or intervention"))
    );
    assert_eq!(
        call(&setup, OPS, "/admin/api/feedback", Some(verdict))
            .await
            .0,
        200
    );

    // The overview and the stats: each team's own figures.
    setup.proxy.flush_log().await;
    let overview = |token| {
        let setup = setup.clone();
        async move { call(&setup, token, "/admin/api/overview", None).await.1 }
    };
    let (pay, ops, all) = (
        overview(PAY).await,
        overview(OPS).await,
        overview(GLOBAL).await,
    );
    assert_eq!(pay["team"], "pay");
    assert_eq!(
        pay["totals"]["conversations"], 2,
        "pay-run and pay-held: {pay}"
    );
    assert_eq!(ops["totals"]["conversations"], 1, "{ops}");
    assert_eq!(all["totals"]["conversations"], 3, "{all}");
    assert_eq!(ops["totals"]["requests"], halt_k as i64);
    assert_eq!(
        (&pay["halted_conversations"], &ops["halted_conversations"]),
        (&json!(0), &json!(1))
    );
    assert_eq!(pay["savings"]["halts"], 0);
    assert_eq!(ops["savings"]["halts"], 1);
    assert_eq!(
        pay["live_conversations"],
        Value::Null,
        "memory is every team's"
    );
    let detectors = |v: &Value| ids(v, "precision", "detector");
    assert!(
        detectors(&pay).is_empty(),
        "no alert of pay's was judged: {pay}"
    );
    assert_eq!(detectors(&ops), ["fail_loop"]);
    let (status, stats) = call(&setup, OPS, "/admin/api/stats", None).await;
    assert_eq!(status, 200);
    assert_eq!(stats["team"], "ops");
    assert_eq!(detectors(&stats), ["fail_loop"]);
    assert_eq!(stats["precision"][0]["right"], 1);
    assert_eq!(
        stats["proxy_overhead_us"],
        Value::Null,
        "the process's own figures are left out"
    );
    let (_, pay_stats) = call(&setup, PAY, "/admin/api/stats", None).await;
    assert!(detectors(&pay_stats).is_empty(), "{pay_stats}");

    // Spend: the team's conversations only.
    let (status, spend) = call(&setup, PAY, "/admin/api/spend", None).await;
    assert_eq!(status, 200);
    assert!(
        ids(&spend, "conversations", "id")
            .iter()
            .all(|id| id.starts_with("pay-")),
        "{spend}"
    );
    assert!(ids(
        &call(&setup, GLOBAL, "/admin/api/spend", None).await.1,
        "conversations",
        "id"
    )
    .contains(&"ops-loop".to_string()));

    // The policies: a team reads its own, read-only (mode, budget); the global token all.
    let (status, own) = call(&setup, PAY, "/admin/api/policies", None).await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own["team"], "pay", "{own}");
    assert_eq!(ids(&own, "policies", "name"), ["pay"], "{own}");
    assert_eq!(own["policies"][0]["mode"], "enforce", "{own}");
    assert!(own["policies"][0].get("budget").is_some(), "{own}");
    assert_eq!(own["config"], Value::Null, "not the file: {own}");
    let (_, ops) = call(&setup, OPS, "/admin/api/policies", None).await;
    assert_eq!(
        ids(&ops, "policies", "name"),
        ["default"],
        "no policy names ops: {ops}"
    );
    assert_eq!(ops["named"], false, "{ops}");
    let (_, all) = call(&setup, GLOBAL, "/admin/api/policies", None).await;
    assert_eq!(ids(&all, "policies", "name"), ["default", "pay"], "{all}");

    // The calls about the whole proxy: refused to a team, answered to the global token.
    for (path, body) in [("/admin/api/policies/reload", Some(json!({})))] {
        let (status, refused) = call(&setup, PAY, path, body.clone()).await;
        assert_eq!(status, 403, "{path}: {refused}");
        assert!(
            refused["error"].as_str().unwrap().contains("team"),
            "{refused}"
        );
        assert_ne!(call(&setup, GLOBAL, path, body).await.0, 403, "{path}");
    }
    let metrics = client()
        .get(setup.url("/metrics"))
        .bearer_auth(PAY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        metrics.status(),
        401,
        "no team token reads the process's metrics"
    );
    assert_eq!(call(&setup, "pay-token-wrong", list, None).await.0, 401);
}

/// The dashboard's login takes a team's token; its cookie then stands for that team.
#[tokio::test]
async fn the_dashboard_login_takes_a_team_token() {
    let setup = start().await;
    send(&setup, "ops", "ops-run", 1).await;
    send(&setup, "pay", "pay-run", 1).await;
    setup.proxy.flush_log().await;
    let no_redirects = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let login = no_redirects
        .post(setup.url("/ui/login"))
        .form(&[("token", PAY), ("view", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 303);
    let cookie = header(&login, "set-cookie");
    let session = cookie.split(';').next().unwrap().to_string();
    assert!(
        !session.contains(PAY),
        "the cookie is derived, not the token"
    );
    let with_cookie = |path: &str| {
        no_redirects
            .get(setup.url(path))
            .header("cookie", session.clone())
            .send()
    };
    assert_eq!(with_cookie("/ui/").await.unwrap().status(), 200);
    let list: Value = with_cookie("/admin/api/conversations")
        .await
        .unwrap()
        .json_value()
        .await;
    assert_eq!(ids(&list, "conversations", "id"), ["pay-run"]);
    let policies: Value = with_cookie("/admin/api/policies")
        .await
        .unwrap()
        .json_value()
        .await;
    assert_eq!(ids(&policies, "policies", "name"), ["pay"], "{policies}");
    assert_eq!(
        with_cookie("/admin/api/conversations/ops-run")
            .await
            .unwrap()
            .status(),
        404
    );
    let wrong = no_redirects
        .post(setup.url("/ui/login"))
        .form(&[("token", "nope"), ("view", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        serde_json::from_slice(&self.bytes().await.unwrap()).unwrap()
    }
}

#[test]
fn team_tokens_come_from_the_environment_and_open_one_door_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let file = |body: &str| {
        std::fs::write(&path, body).unwrap();
        path.clone()
    };
    let one = "[[admin.team_tokens]]\nteam = \"Pay\"\ntoken_env = \"LW_PAY_ADMIN\"\n";
    let env = |var: &str| (var == "LW_PAY_ADMIN").then(|| "pay-secret".to_string());
    let config = Config::load(Some(&file(one)), env).unwrap();
    let team = &config.admin.team_tokens[0];
    assert_eq!(
        (team.team.as_str(), team.token.as_str()),
        ("pay", "pay-secret")
    );
    assert!(
        !format!("{config:?}").contains("pay-secret"),
        "never in a debug print"
    );

    let e = Config::load(Some(&file(one)), |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("admin.team_tokens") && e.contains("LW_PAY_ADMIN is not set"),
        "{e}"
    );
    let same_as_global = |var: &str| match var {
        "LW_PAY_ADMIN" | "LOOPWARDEN_ADMIN_TOKEN" => Some("shared".to_string()),
        _ => None,
    };
    let e = Config::load(Some(&file(one)), same_as_global)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("admin.team_tokens") && e.contains("already in use"),
        "{e}"
    );
    let in_file = "[[admin.team_tokens]]\nteam = \"pay\"\ntoken = \"in-the-file\"\n";
    let e = Config::load(Some(&file(in_file)), env)
        .unwrap_err()
        .to_string();
    assert!(e.contains("token"), "a token in the file is refused: {e}");
}
