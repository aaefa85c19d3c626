//! Alerts (`[intervene.alerts]`) through the real proxy in front of the scripted mock: a
//! webhook receiver on loopback gets the halt and the held request, with the policy, the
//! conversation, the finding and the link to the timeline; a policy's own format (Slack)
//! applies to its runs; a hook that cannot be reached fails no request and is counted.

mod intervene_support;
mod proxy_support;

use std::time::Duration;

use intervene_support::*;
use loopwarden::config::Config;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use serde_json::{json, Value};
use tokio::sync::mpsc;

async fn next(rx: &mut mpsc::UnboundedReceiver<Value>) -> Value {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an alert arrives")
        .unwrap()
}

fn alerting(hook: &str) -> impl FnOnce(&mut Config) + '_ {
    move |c| {
        c.intervene.alerts.webhooks = vec![hook.to_string()];
        c.server.public_url = "https://loopwarden.example.com/".into();
    }
}

#[tokio::test]
async fn a_halt_is_alerted_with_the_policy_the_conversation_the_finding_and_the_timeline() {
    let dialect = Dialect::Anthropic;
    let (hook, mut alerts) = receiver().await;
    // No block: the run's looping answer would be replaced by the halt (alerted as `block`)
    // before the request the halt answers.
    let setup = Setup::start(looping_script(dialect), |c| {
        alerting(&hook)(c);
        c.intervene.block = false;
    })
    .await;
    // The nudges before the halt alert nothing.
    for k in 1..=first_k(dialect, Action::Halt) {
        let resp = setup
            .post(
                &path(dialect, "alert-run", false),
                &loop_body(dialect, k, false, None),
            )
            .await;
        assert_eq!(resp.status().as_u16(), 200);
    }
    let alert = next(&mut alerts).await;
    assert_eq!(alert["event"], "loopwarden.alert");
    assert_eq!(alert["kind"], "halt");
    assert_eq!(alert["policy"], "default");
    assert_eq!(alert["conversation"], "alert-run");
    assert_eq!(alert["detector"], "fail_loop");
    assert!(
        alert["finding"]
            .as_str()
            .unwrap()
            .contains("python3 test_calc.py"),
        "{alert}"
    );
    assert_eq!(
        alert["timeline"],
        "https://loopwarden.example.com/ui/#/conversation/alert-run"
    );
    // The sticky halt answered again is not alerted again.
    let resp = setup
        .post(
            &path(dialect, "alert-run", false),
            &loop_body(dialect, first_k(dialect, Action::Halt), false, None),
        )
        .await;
    assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    setup.proxy.flush_log().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), alerts.recv())
            .await
            .is_err(),
        "one alert per halt"
    );
}

#[tokio::test]
async fn a_held_request_is_alerted_before_anyone_decides() {
    let dialect = Dialect::OpenAiChat;
    let (hook, mut alerts) = receiver().await;
    let setup = Setup::start(looping_script(dialect), |c| {
        alerting(&hook)(c);
        c.intervene.on_stop = loopwarden::intervene::StopMode::Pause;
    })
    .await;
    let k = first_k(dialect, Action::Halt);
    let held = {
        let url = setup.url(&path(dialect, "held-run", false));
        let body = loop_body(dialect, k, false, None).to_string();
        loopwarden::spawn::task("test", async move {
            client()
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
        })
    };
    let alert = next(&mut alerts).await;
    assert_eq!(alert["kind"], "held");
    assert_eq!(alert["conversation"], "held-run");
    assert_eq!(alert["policy"], "default");
    assert!(!alert["finding"].as_str().unwrap().is_empty(), "{alert}");
    assert_eq!(
        alert["timeline"],
        "https://loopwarden.example.com/ui/#/conversation/held-run"
    );
    // Still held: the alert came before the decision. A human lets it go on.
    let (_, pending) = setup.admin("/admin/api/pending", None).await;
    let id = pending["pending"][0]["id"].as_str().unwrap().to_string();
    let (status, _) = setup
        .admin(
            &format!("/admin/api/pending/{id}"),
            Some(json!({"decision": "continue"})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(held.await.unwrap().status().as_u16(), 200);
}

#[tokio::test]
async fn a_policy_can_post_slack_messages_and_a_dead_hook_fails_no_request() {
    let dialect = Dialect::Anthropic;
    let (hook, mut alerts) = receiver().await;
    let dead = format!(
        "http://127.0.0.1:{}/hook",
        proxy_support::closed_port().await
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loopwarden.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[intervene.alerts]
webhooks = ["{dead}"]

[[policy]]
name = "ci"
match = {{ team = "ci" }}
[policy.intervene.alerts]
webhooks = ["{hook}", "{dead}"]
format = "slack"
on = ["halt"]
"#
        ),
    )
    .unwrap();
    let setup = Setup::start(looping_script(dialect), |c| {
        let mut loaded = Config::load(Some(&file), |_| None).unwrap();
        loaded.server = c.server.clone();
        loaded.store = c.store.clone();
        loaded.upstream = c.upstream.clone();
        *c = loaded;
    })
    .await;
    let k = first_k(dialect, Action::Halt);
    for (run, prefix) in [("ci-run", "/t/ci"), ("other-run", "")] {
        let resp = setup
            .post(
                &format!("{prefix}{}", path(dialect, run, false)),
                &loop_body(dialect, k, false, None),
            )
            .await;
        assert_eq!(resp.status().as_u16(), 200, "a dead hook fails no request");
        assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    }
    let alert = next(&mut alerts).await;
    let text = alert["text"].as_str().unwrap();
    assert!(text.contains("`ci-run`") && text.contains("`ci`"), "{text}");
    assert!(
        text.contains("/ui/#/conversation/ci-run|Timeline>"),
        "{text}"
    );
    // Two deliveries failed: ci's dead hook, and the default policy's.
    let metrics = || async {
        client()
            .get(setup.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let mut seen = String::new();
    for _ in 0..100 {
        seen = metrics().await;
        if seen.contains("loopwarden_alerts_total{event=\"halt\",result=\"failed\"} 2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        seen.contains("loopwarden_alerts_total{event=\"halt\",result=\"failed\"} 2"),
        "{seen}"
    );
    assert!(seen.contains("loopwarden_alerts_total{event=\"halt\",result=\"sent\"} 1"));
}
