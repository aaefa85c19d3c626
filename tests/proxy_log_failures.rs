//! When the log cannot be written, over real sockets and a real SQLite file: a write that
//! fails for a while (another process holding the database's lock) is retried from a
//! bounded buffer and nothing is lost; a database file deleted under the running proxy is
//! noticed and made again at its path, where the next requests land.

mod proxy_support;

use std::time::Duration;

use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{client, Api, TestProxy};
use serde_json::{json, Value};

/// One streamed Chat request of conversation `id` through the proxy, answered whole.
async fn request(proxy: &TestProxy, id: &str) {
    let r = client()
        .post(proxy.url(Api::Chat.path(true)))
        .header("x-loopwarden-conversation", id)
        .body(Api::Chat.first_request("task", true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// An admin API answer.
async fn admin(proxy: &TestProxy, path: &str) -> Value {
    let r = client().get(proxy.url(path)).send().await.unwrap();
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

async fn proxy() -> (MockServer, TestProxy) {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("Done.")]))
        .await
        .unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    (mock, proxy)
}

#[tokio::test]
async fn rows_written_while_another_process_holds_the_lock_are_kept_until_it_lets_go() {
    let (_mock, proxy) = proxy().await;
    request(&proxy, "before").await;
    proxy.running.flush_log().await;

    // Another connection takes the database's write lock and keeps it longer than the
    // writer's busy timeout (5 s), while requests flow through the proxy.
    let locker = rusqlite::Connection::open(proxy.db_path()).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let sent = 12;
    for i in 0..sent {
        request(&proxy, &format!("locked-{i}")).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    locker.execute_batch("COMMIT").unwrap();
    drop(locker);

    let rows = proxy
        .rows("SELECT count(*) AS n FROM requests WHERE conversation_id LIKE 'locked-%'")
        .await;
    assert_eq!(rows, vec![json!({"n": sent})], "rows were lost to the lock");
    let health = admin(&proxy, "/admin/api/stats").await;
    assert_eq!(health["log"]["failed"], 0, "{health}");
    assert!(health["log"]["retried"].as_u64().unwrap() > 0, "{health}");
}

#[tokio::test]
async fn a_database_deleted_under_the_proxy_is_made_again_and_the_next_requests_land_there() {
    let (_mock, proxy) = proxy().await;
    request(&proxy, "before").await;
    proxy.running.flush_log().await;
    let path = proxy.db_path();
    std::fs::remove_file(&path).unwrap();

    request(&proxy, "after-1").await;
    request(&proxy, "after-2").await;
    proxy.running.flush_log().await;
    assert!(path.exists(), "no database at the path");
    // Read straight from the file at the path, not through the proxy.
    let file = rusqlite::Connection::open(&path).unwrap();
    let ids: Vec<String> = file
        .prepare("SELECT conversation_id FROM requests ORDER BY id")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(ids, vec!["after-1", "after-2"]);
    // The admin API reads the new file too, and says the log was made again.
    let stats = admin(&proxy, "/admin/api/stats").await;
    assert_eq!(stats["log"]["reopened"], 1, "{stats}");
    let listed = admin(&proxy, "/admin/api/conversations").await;
    let listed: Vec<&str> = listed["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(!listed.contains(&"before"), "{listed:?}");
}
