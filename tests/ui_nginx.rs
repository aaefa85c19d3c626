//! The shipped compose stack's front, without Docker: `docker/nginx.conf` as it is, its
//! upstream names and port replaced by loopback addresses, in front of two replicas on one
//! PostgreSQL database; agents' requests and the dashboard in headless Chromium both go
//! through it. The dashboard's writes (a held request's decision, resume, feedback, halt)
//! must pass the admin API's origin check behind the proxy.
//!
//! Needs nginx (Debian's `nginx`), Chromium and PostgreSQL (`LW_TEST_POSTGRES`): the test
//! is `#[ignore]`d, run by `cargo test -- --include-ignored` (`.ci/run`, which installs
//! them), where a missing one fails it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod nginx_support;
mod ui_support;

use std::time::Duration;

use intervene_support::{client, first_k, header, loop_body, looping_script};
use loopwarden::config::Config;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use loopwarden::mock::MockServer;
use loopwarden::proxy::Running;
use nginx_support::Nginx;
use serde_json::Value;
use ui_support::Browser;

const DIALECT: Dialect = Dialect::OpenAiChat;
const TOKEN: &str = "t0ken-behind-nginx";

const POLICIES: &str = r#"
[[policy]]
name = "ask"
match = { team = "ask" }
[policy.intervene]
on_stop = "pause"
[policy.intervene.pause]
timeout_secs = 600

[[policy]]
name = "ci"
match = { team = "ci" }
"#;

async fn replica(mock: &MockServer, db: &str) -> Running {
    let mut config: Config = toml::from_str(POLICIES).unwrap();
    config.server.listen = "127.0.0.1:0".into();
    config.store.db = db.to_string();
    config.upstream.openai = mock.url();
    config.admin.token = TOKEN.into();
    loopwarden::proxy::start(config).await.unwrap()
}

/// Sends the loop's request with `k` failing runs through nginx; the answer's decision.
async fn send(nginx_url: &str, team: &str, conversation: &str, k: usize) -> String {
    let r = client()
        .post(format!(
            "{nginx_url}/t/{team}/c/{conversation}/v1/chat/completions"
        ))
        .header("content-type", "application/json")
        .body(loop_body(DIALECT, k, false, None).to_string())
        .send()
        .await
        .unwrap();
    let decision = header(&r, "x-loopwarden-decision");
    r.bytes().await.unwrap();
    decision
}

/// `GET` an admin call through nginx with the token.
async fn admin(nginx: &Nginx, path: &str) -> Value {
    let r = client()
        .get(nginx.url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// Polls (bounded) until the conversation's halted state, as either replica answers it
/// through nginx, is `halted`.
async fn until_halted(nginx: &Nginx, id: &str, halted: bool) {
    for _ in 0..200 {
        let v = admin(nginx, &format!("/admin/api/conversations/{id}")).await;
        if v["halted"] == halted {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never halted = {halted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium, chromedriver, nginx and PostgreSQL: cargo test -- --include-ignored"]
async fn the_dashboard_s_buttons_act_through_the_shipped_nginx_config_on_two_replicas() {
    let browser = Browser::start().await;
    let db = loopwarden::store::test_postgres().await.unwrap();
    let mock = MockServer::start(looping_script(DIALECT)).await.unwrap();
    let a = replica(&mock, &db).await;
    let b = replica(&mock, &db).await;
    let nginx = Nginx::start([a.addr(), b.addr()]);
    nginx.ready().await;
    let front = nginx.url("");

    // A CI run halted by its policy, and a request of team `ask` held for a human.
    let halt_k = first_k(DIALECT, Action::Halt);
    for k in 1..=halt_k {
        send(&front, "ci", "ci-loop", k).await;
    }
    until_halted(&nginx, "ci-loop", true).await;
    let held = {
        let front = front.clone();
        tokio::spawn(async move { send(&front, "ask", "ask-run", halt_k).await })
    };

    // The browser logs in through nginx and decides the held request from the list.
    browser.goto(&nginx.url("/ui/#/pending")).await;
    let field = browser.wait_for("#token", "").await;
    browser.type_into(&field, TOKEN).await;
    browser.click(&browser.wait_for("#login", "").await).await;
    browser.wait_for("tr.pending", "ask-run").await;
    let forwarded = mock.requests().len();
    browser.click_on("tr.pending button.continue", "").await;
    assert_eq!(held.await.unwrap(), "pause");
    assert_eq!(mock.requests().len(), forwarded + 1, "released upstream");

    // The halted run: resumed, a finding judged, halted again, each from its button.
    browser.goto(&nginx.url("/ui/#/conversation/ci-loop")).await;
    browser.wait_for("#halted", "halted").await;
    browser.click_on("#resume", "").await;
    browser.wait_for("#running", "").await;
    until_halted(&nginx, "ci-loop", false).await;
    browser.click_on(".finding button.wrong", "").await;
    browser.wait_for(".finding .verdict", "wrong").await;
    browser.click_on("#halt", "").await;
    browser.wait_for("#halted", "halted").await;
    until_halted(&nginx, "ci-loop", true).await;
    let errors = browser.body_text().await;
    assert!(!errors.contains("another origin"), "{errors}");

    a.flush_log().await;
    b.flush_log().await;
    let rows = proxy_rows(
        &db,
        "SELECT action, source FROM interventions WHERE conversation_id = 'ci-loop' \
         AND source = 'operator' ORDER BY id",
    )
    .await;
    assert_eq!(rows, vec!["resume/operator", "halt/operator"]);
    let feedback = proxy_rows(&db, "SELECT verdict, 'x' FROM feedback").await;
    assert_eq!(feedback, vec!["wrong/x"]);
}

/// The rows of a two-column query on the PostgreSQL log, each as `a/b`.
async fn proxy_rows(db: &str, sql: &str) -> Vec<String> {
    use sqlx::Row;
    let pool = sqlx::PgPool::connect(db).await.unwrap();
    let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| format!("{}/{}", r.get::<String, _>(0), r.get::<String, _>(1)))
        .collect()
}
