//! Two replicas over loopback sharing one PostgreSQL database (issue 36): what one decides
//! about a conversation holds on the other. Each test starts two proxies in-process on
//! the same new database, and waits (polling, bounded) for the sync between them
//! (`loopwarden::replicas`) rather than for a fixed time.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod proxy_support;

use std::future::Future;
use std::time::Duration;

use loopwarden::budget::{Price, Prices, Usage};
use loopwarden::config::Config;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use loopwarden::intervene::StopMode;
use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, Api, TestProxy};
use serde_json::{json, Value};

/// Two proxies on one new database, with `adjust` applied to both.
async fn two_replicas(upstream: &str, adjust: impl Fn(&mut Config)) -> (TestProxy, TestProxy) {
    let db = proxy_support::postgres_db().await;
    let start = |db: String| {
        TestProxy::start_with(upstream, |c| {
            c.store.db = db;
            adjust(c)
        })
    };
    let a = start(db.clone()).await;
    let b = start(db).await;
    (a, b)
}

/// Polls `check` until it gives `Some`, at most 200 times 50 ms apart (a bound on waiting,
/// never asserted on); `what` names it in the failure.
async fn until<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    for _ in 0..200 {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

async fn admin_post(proxy: &TestProxy, path: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(proxy.url(path))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (
        status,
        serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null),
    )
}

/// The dollars a replica says conversation `spread` has spent.
async fn spent(proxy: &TestProxy) -> Option<f64> {
    admin_get(proxy, "/admin/api/conversations/spread").await["spend"]["dollars"].as_f64()
}

async fn admin_get(proxy: &TestProxy, path: &str) -> Value {
    let r = client().get(proxy.url(path)).send().await.unwrap();
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// A Chat request of conversation `id` with `done` tool results in its history; returns
/// the decision header and the answer's text.
async fn chat(proxy: &TestProxy, id: &str, done: &[(&str, &str)]) -> (String, String) {
    let body = Api::Chat.request("List the directories", false, done);
    let r = client()
        .post(proxy.url(&format!("/c/{id}{}", Api::Chat.path(false))))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let decision = r
        .headers()
        .get("x-loopwarden-decision")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (decision, text)
}

/// Answers that each list a directory, at `usage` each.
fn listing_script(usage: Option<Usage>) -> Script {
    let turns = (0..8)
        .map(|i| Turn {
            text: Some(format!("Step {i}.")),
            tool_calls: vec![ToolCall::function(
                "bash",
                json!({"command": format!("ls dir{i}")}),
            )],
            usage,
            ..Turn::default()
        })
        .collect();
    Script {
        turns,
        ..Script::default()
    }
}

const DONE: [(&str, &str); 6] = [
    ("ls dir0", "a"),
    ("ls dir1", "b"),
    ("ls dir2", "c"),
    ("ls dir3", "d"),
    ("ls dir4", "e"),
    ("ls dir5", "f"),
];

#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_halt_and_a_resume_through_one_replica_hold_on_the_other() {
    let mock = MockServer::start(listing_script(None)).await.unwrap();
    let (a, b) = two_replicas(&mock.url(), |_| {}).await;
    let (decision, _) = chat(&a, "shared", &DONE[..0]).await;
    assert_ne!(decision, "halt");
    a.running.flush_log().await;

    // Halted through B's admin API (B knows the conversation from the shared log) ...
    let (status, v) = admin_post(
        &b,
        "/admin/api/conversations/shared/halt",
        json!({"reason": "checking the workspace"}),
    )
    .await;
    assert_eq!((status, v["halted"]["halted"].as_bool()), (200, Some(true)));
    // ... it holds for the conversation's next request on A.
    let text = until("A halts the conversation B halted", || async {
        let (decision, text) = chat(&a, "shared", &DONE[..1]).await;
        (decision == "halt").then_some(text)
    })
    .await;
    assert!(text.contains("checking the workspace"), "{text}");

    // Resumed through A: B lets its next request go.
    let (status, _) = admin_post(&a, "/admin/api/conversations/shared/resume", json!({})).await;
    assert_eq!(status, 200);
    let upstream_before = mock.requests().len();
    until("B lets the resumed conversation go", || async {
        let (decision, _) = chat(&b, "shared", &DONE[..1]).await;
        (decision != "halt").then_some(())
    })
    .await;
    assert_eq!(mock.requests().len(), upstream_before + 1);
}

#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_dollar_budget_is_crossed_by_requests_spread_over_both_replicas() {
    // Each answer reports a million input tokens, at $1 a million: $1 an answer.
    let usage = Usage {
        input: 1_000_000,
        cached_input: 0,
        cache_write: 0,
        output: 0,
    };
    let mock = MockServer::start(listing_script(Some(usage)))
        .await
        .unwrap();
    let (a, b) = two_replicas(&mock.url(), |c| {
        c.budget.dollars = 2.5;
        c.prices = Prices::new(vec![(
            "*".into(),
            Price {
                input: 1.0,
                cached_input: 1.0,
                cache_write: 1.0,
                output: 1.0,
            },
        )]);
    })
    .await;
    // $1 on A, $1 on B, $1 on A: each replica alone has spent at most $2.
    for (k, replica) in [&a, &b, &a].into_iter().enumerate() {
        let (decision, _) = chat(replica, "spread", &DONE[..k]).await;
        assert_ne!(decision, "halt", "request {k}");
    }
    // B sees the sum over both replicas ...
    until("B sees $3 spent", || async {
        spent(&b).await.filter(|d| (d - 3.0).abs() < 1e-9)
    })
    .await;
    // ... and halts the conversation at its budget, without asking the upstream.
    let upstream_before = mock.requests().len();
    let (decision, text) = chat(&b, "spread", &DONE[..3]).await;
    assert_eq!(decision, "halt", "{text}");
    assert!(text.contains("$3.00 of $2.50"), "{text}");
    assert_eq!(mock.requests().len(), upstream_before);
    // A's own figure is the same sum.
    until("A sees $3 spent", || async {
        spent(&a).await.filter(|d| (d - 3.0).abs() < 1e-9)
    })
    .await;
}

/// The id of the held request of `conversation` a replica lists, if it lists one.
async fn listed(proxy: &TestProxy, conversation: &str) -> Option<String> {
    let v = admin_get(proxy, "/admin/api/pending").await;
    v["pending"]
        .as_array()?
        .iter()
        .find(|p| p["conversation_id"] == conversation)
        .and_then(|p| p["id"].as_str())
        .map(String::from)
}

#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn a_request_held_on_one_replica_is_listed_and_decided_through_the_other() {
    let dialect = Dialect::OpenAiChat;
    let mock = MockServer::start(intervene_support::looping_script(dialect))
        .await
        .unwrap();
    let (a, b) = two_replicas(&mock.url(), |c| {
        c.intervene.on_stop = StopMode::Pause;
        c.intervene.pause.timeout_secs = 120;
    })
    .await;
    let body = intervene_support::loop_body(
        dialect,
        intervene_support::first_k(dialect, Action::Halt),
        false,
        None,
    );
    let url = a.url(&intervene_support::path(dialect, "held-across", false));
    let held = tokio::spawn(async move {
        let r = client()
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let decision = r
            .headers()
            .get("x-loopwarden-decision")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        (decision, r.bytes().await.unwrap())
    });
    // Held on A, listed by B.
    let id = until("B lists the request A holds", || listed(&b, "held-across")).await;
    assert_eq!(
        listed(&a, "held-across").await.as_deref(),
        Some(id.as_str())
    );
    let before = mock.requests().len();
    // Decided through B: A forwards it (the verdict `continue`).
    let (status, v) = admin_post(
        &b,
        &format!("/admin/api/pending/{id}"),
        json!({"decision": "continue"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["pending"]["conversation_id"], "held-across");
    let (decision, _) = held.await.unwrap();
    assert_eq!(decision, "pause");
    assert_eq!(mock.requests().len(), before + 1, "forwarded once decided");
    // It is gone from both lists, and a second verdict finds nothing.
    until("B no longer lists it", || async {
        listed(&b, "held-across").await.is_none().then_some(())
    })
    .await;
    let (status, _) = admin_post(
        &b,
        &format!("/admin/api/pending/{id}"),
        json!({"decision": "halt"}),
    )
    .await;
    assert_eq!(status, 404);
}

/// A replica that stops syncing (it died) leaves no approval hanging: the others mark its
/// held requests abandoned and stop listing them. The dead replica is a row of the shared
/// table whose replica never syncs.
#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn the_held_requests_of_a_replica_that_died_are_marked_abandoned() {
    let mock = MockServer::start(listing_script(None)).await.unwrap();
    let (a, _b) = two_replicas(&mock.url(), |_| {}).await;
    let pool = sqlx::PgPool::connect(&a.db).await.unwrap();
    sqlx::query(
        "INSERT INTO pending_requests (id, replica, conversation_id, info, created_ms, state,
           updated_ms)
         VALUES ('p-dead', 'gone:1:1:0', 'orphan', '{\"id\": \"p-dead\", \"conversation_id\": \"orphan\"}',
           1, 'held', 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    until("the orphan is marked abandoned", || async {
        let state: String =
            sqlx::query_scalar("SELECT state FROM pending_requests WHERE id = 'p-dead'")
                .fetch_one(&pool)
                .await
                .unwrap();
        (state == "abandoned").then_some(())
    })
    .await;
    assert_eq!(listed(&a, "orphan").await, None);
    let (status, _) = admin_post(
        &a,
        "/admin/api/pending/p-dead",
        json!({"decision": "continue"}),
    )
    .await;
    assert_eq!(status, 404);
}
