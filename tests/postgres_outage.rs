//! PostgreSQL stopped and started again under a proxy serving a steady load (issue 36): no
//! proxied request fails or waits for the database, the records that could not be kept
//! are counted, the held-request list says it is incomplete meanwhile, and the writer
//! reconnects on its own. The server is really stopped
//! (`scripts/pg_cluster.sh stop-server`), so this file holds this one test: test binaries
//! run one after another, and no other test's database goes away under it.
#![allow(
    clippy::disallowed_methods,
    reason = "the test's load clients are plain tasks"
)]

mod proxy_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{client, Api, Backend, TestProxy};
use serde_json::Value;

/// The cluster's directory (`LW_PG_DIR`, from `scripts/pg_cluster.sh start`), whose server
/// the test stops and starts.
fn cluster_dir() -> Option<String> {
    std::env::var("LW_PG_DIR").ok().filter(|d| !d.is_empty())
}

async fn pg_ctl(verb: &str, dir: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg_cluster.sh");
    let status = tokio::process::Command::new(script)
        .args([verb, dir])
        .status()
        .await
        .unwrap();
    assert!(status.success(), "pg_cluster.sh {verb} failed");
}

async fn stats(proxy: &TestProxy) -> Value {
    let r = client()
        .get(proxy.url("/admin/api/stats"))
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// Waits (polling) until the log's counters satisfy `done`; `what` names it in the failure.
async fn until_log(proxy: &TestProxy, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let log = stats(proxy).await["log"].clone();
        if done(&log) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the log never {what}: {}", stats(proxy).await["log"]);
}

/// `GET /admin/api/pending`: whether it says it is complete, and the whole answer.
async fn pending_listing(proxy: &TestProxy) -> (bool, Value) {
    let r = client()
        .get(proxy.url("/admin/api/pending"))
        .send()
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    (v["complete"] == true, v)
}

#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn postgres_stopped_and_started_under_load_fails_no_request_and_writing_resumes() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("Done.")]))
        .await
        .unwrap();
    // With a server given by URL alone there is nothing to stop.
    let dir = cluster_dir().expect(
        "LW_PG_DIR is unset: the outage test stops the server of scripts/pg_cluster.sh's cluster",
    );
    // Few records kept for a retry, so that the outage loses some (counted).
    let proxy = TestProxy::on_with(Backend::Postgres, &mock.url(), |c| {
        c.store.retry_rows = 20;
    })
    .await;
    let proxy = Arc::new(proxy);

    // The steady load: four clients, one request after another each, until told to stop;
    // every answer's status is checked.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (proxy, stop, sent) = (proxy.clone(), stop.clone(), sent.clone());
        clients.push(tokio::spawn(async move {
            let mut failed = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let n = sent.fetch_add(1, Ordering::Relaxed);
                let r = client()
                    .post(proxy.url(Api::Chat.path(true)))
                    .header("x-loopwarden-conversation", format!("load-{c}-{n}"))
                    .body(Api::Chat.first_request("task", true).to_string())
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 200 => drop(r.bytes().await),
                    Ok(r) => failed.push(format!("{n}: status {}", r.status())),
                    Err(e) => failed.push(format!("{n}: {e}")),
                }
            }
            failed
        }));
    }

    until_log(&proxy, "wrote", |log| log["written"].as_u64() > Some(0)).await;
    let (complete, listing) = pending_listing(&proxy).await;
    assert!(complete, "{listing}");
    pg_ctl("stop-server", &dir).await;
    // The writer notices (a failed write kept for retry), then the buffer overflows.
    until_log(
        &proxy,
        "counted a loss while the database was down",
        |log| log["failed"].as_u64() > Some(0) || log["dropped"].as_u64() > Some(0),
    )
    .await;
    // The held requests cannot all be listed: the list says so rather than look empty.
    let (complete, listing) = pending_listing(&proxy).await;
    assert!(!complete, "{listing}");
    assert!(
        listing["incomplete"]
            .as_str()
            .is_some_and(|e| e.contains("could not be read")),
        "{listing}"
    );
    let during = sent.load(Ordering::Relaxed);
    pg_ctl("start-server", &dir).await;
    let after = until_log(&proxy, "reconnected", |log| {
        log["reopened"].as_u64() >= Some(1)
    })
    .await;
    // A request served after the reconnection is written.
    let resumed = sent.load(Ordering::Relaxed) + 8;
    while sent.load(Ordering::Relaxed) < resumed {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let failed = client.await.unwrap();
        assert!(failed.is_empty(), "proxied requests failed: {failed:?}");
    }
    proxy.running.flush_log().await;
    let rows = proxy
        .rows("SELECT conversation_id FROM requests ORDER BY id DESC LIMIT 1")
        .await;
    let last: u64 = rows[0]["conversation_id"]
        .as_str()
        .and_then(|id| id.rsplit('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(
        last > during,
        "nothing written after the restart: {rows:?} {after}"
    );
    let log = stats(&proxy).await["log"].clone();
    eprintln!(
        "log counters after the outage, {} requests: {log}",
        sent.load(Ordering::Relaxed)
    );
    assert!(
        log["failed"].as_u64() > Some(0) && log["retried"].as_u64() > Some(0),
        "{log}"
    );
}
