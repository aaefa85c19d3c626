//! The stop of `loopwarden serve` is bounded by `server.shutdown_grace_secs` (issue 47,
//! item 11): on SIGTERM a held request is answered at once (its timeout's verdict), a stream
//! still open at the grace's end is cut and logged so, and the process exits; a log that
//! cannot be written then goes to the spill file (exit 75), which the next start writes in
//! before serving (a corrupt line skipped and reported), or, the spill failing too, is
//! counted lost (exit 74). Each test runs the real binary. The PostgreSQL variant stops the
//! test cluster's server (`scripts/pg_cluster.sh stop-server`): no other test here uses it,
//! and test binaries run one after another.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod proxy_support;

use std::time::Duration;

use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{client, db_rows, Api, Served};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest the tests wait for the process to exit: a bound on waiting, far above the
/// grace (2 s), and far below the 600 s a held request or a stalled stream used to take.
const EXIT_WAIT: Duration = Duration::from_secs(60);

/// An upstream that answers every request with the head of an event stream and one event,
/// then says nothing more (for `upstream.stream_idle_secs`, 600 s by default).
async fn stalled_upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let event = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                 transfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                event.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
            // Kept open, silent.
            open.push(socket);
        }
    });
    url
}

/// A config file in `dir` with `body` (TOML); its path.
fn config_file(dir: &std::path::Path, body: &str) -> String {
    let path = dir.join("loopwarden.toml");
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

/// Waits for the process to exit (within [`EXIT_WAIT`]); its exit code and stderr.
async fn exit_of(served: Served) -> (Option<i32>, String) {
    match tokio::time::timeout(EXIT_WAIT, served.finish()).await {
        Ok((status, stderr)) => (status.code(), stderr),
        Err(_) => panic!("loopwarden serve did not exit within {EXIT_WAIT:?} of SIGTERM"),
    }
}

/// Polls the admin API until a request of `conversation` is held.
async fn until_held(url: &str, conversation: &str) {
    for _ in 0..500 {
        let r = client()
            .get(format!("{url}/admin/api/pending"))
            .send()
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        let pending = v["pending"].as_array().cloned().unwrap_or_default();
        if pending.iter().any(|p| p["conversation_id"] == conversation) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{conversation} was never held");
}

#[tokio::test]
async fn sigterm_answers_a_held_request_cuts_a_stalled_stream_and_exits_within_the_grace() {
    let upstream = stalled_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("log.db");
    // A human has 600 s to decide a held request, and a silent stream 600 s to go on.
    let config = config_file(
        dir.path(),
        "[server]\nshutdown_grace_secs = 2\n\
         [intervene]\non_stop = \"pause\"\n\
         [intervene.pause]\ntimeout_secs = 600\non_timeout = \"halt\"\nkeepalive_secs = 1\n",
    );
    let served = Served::start(
        &[
            "--config",
            &config,
            "--db",
            &format!("sqlite://{}", db.display()),
        ],
        &[
            ("LOOPWARDEN_OPENAI_BASE_URL", upstream.clone()),
            ("LOOPWARDEN_ANTHROPIC_BASE_URL", upstream.clone()),
        ],
    )
    .await;
    let url = served.url.clone();

    // The stalled stream: its first event arrives, then nothing.
    let mut stream = client()
        .post(format!("{url}/c/stalled/v1/messages"))
        .body(Api::Anthropic.first_request("task", true).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("ping"));

    // The held request: a loop the policy stops by asking a human.
    let dialect = Dialect::OpenAiChat;
    let k = intervene_support::first_k(dialect, Action::Halt);
    let body = intervene_support::loop_body(dialect, k, false, None);
    let held = tokio::spawn({
        let url = format!(
            "{url}{}",
            intervene_support::path(dialect, "held-run", false)
        );
        async move {
            let r = client().post(url).body(body.to_string()).send().await?;
            let status = r.status();
            Ok::<_, reqwest::Error>((status, r.bytes().await?))
        }
    });
    until_held(&url, "held-run").await;

    served.sigterm();
    // The held client is answered at once, with what the timeout would have said: a halt
    // reply in the API's own shape.
    let (status, answer) = tokio::time::timeout(EXIT_WAIT, held)
        .await
        .expect("the held request is answered at the stop, not at its timeout")
        .unwrap()
        .expect("the held request was answered");
    assert_eq!(status, 200);
    let (text, calls, _) = intervene_support::read_answer(dialect, false, &answer);
    assert!(calls.is_empty(), "{calls:?}");
    assert!(text.contains("loopwarden"), "a halt reply: {text}");
    // The stream ends at the grace's end, broken: no end of message ever came.
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(EXIT_WAIT, async {
        loop {
            match stream.chunk().await {
                Ok(Some(chunk)) => rest.extend_from_slice(&chunk),
                Ok(None) => break "ended",
                Err(_) => break "broken",
            }
        }
    })
    .await
    .expect("the stalled stream is cut at the grace's end, not at stream_idle_secs");
    assert_eq!(ended, "broken", "{}", String::from_utf8_lossy(&rest));
    assert!(!String::from_utf8_lossy(&rest).contains("message_stop"));

    let (code, stderr) = exit_of(served).await;
    assert_eq!(code, Some(0), "the log was written whole: {stderr}");
    assert!(
        stderr.contains("held requests released by shutdown"),
        "{stderr}"
    );
    assert!(stderr.contains("shutdown grace over"), "{stderr}");

    let url = format!("sqlite://{}", db.display());
    let rows = db_rows(
        &url,
        "SELECT conversation_id, outcome FROM requests ORDER BY conversation_id",
    )
    .await;
    let outcome = |id: &str| {
        rows.iter()
            .find(|r| r["conversation_id"] == id)
            .map(|r| r["outcome"].as_str().unwrap().to_string())
    };
    assert_eq!(
        outcome("stalled").as_deref(),
        Some("cut_at_shutdown"),
        "{rows:?}"
    );
    assert_eq!(outcome("held-run").as_deref(), Some("answered"), "{rows:?}");
    let released = db_rows(
        &url,
        "SELECT applied, source FROM interventions WHERE conversation_id = 'held-run'
         ORDER BY id",
    )
    .await;
    let sources: Vec<(&str, &str)> = released
        .iter()
        .map(|r| {
            (
                r["applied"].as_str().unwrap(),
                r["source"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        sources,
        [("held", "policy"), ("halted", "shutdown")],
        "logged as released by the shutdown"
    );
}

/// A proxy logging to `db_dir/log.db`, spilling to `spill` (its default when `None`), in
/// front of a mock that answers every request at once.
async fn serve_logging(
    dir: &std::path::Path,
    db_dir: &std::path::Path,
    spill: Option<&std::path::Path>,
    mock: &MockServer,
) -> Served {
    let db = format!("sqlite://{}", db_dir.join("log.db").display());
    serve_logging_to(dir, &db, spill, mock).await
}

/// A proxy logging to the database at `db`, spilling to `spill`.
async fn serve_logging_to(
    dir: &std::path::Path,
    db: &str,
    spill: Option<&std::path::Path>,
    mock: &MockServer,
) -> Served {
    let mut toml = "[server]\nshutdown_grace_secs = 2\n".to_string();
    if let Some(spill) = spill {
        toml.push_str(&format!(
            "[store]\nspill = {:?}\n",
            spill.display().to_string()
        ));
    }
    let config = config_file(dir, &toml);
    Served::start(
        &["--config", &config, "--db", db],
        &[
            ("LOOPWARDEN_OPENAI_BASE_URL", mock.url()),
            ("RUST_LOG", "info".into()),
        ],
    )
    .await
}

/// The fake key every request carries: it must reach no file.
const KEY: &str = "sk-proj-shutdownspillkey0123456789abcdef";

/// One chat request of `conversation`, answered.
async fn chat(url: &str, conversation: &str) {
    let r = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-loopwarden-conversation", conversation)
        .header("authorization", format!("Bearer {KEY}"))
        .body(Api::Chat.first_request("task", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
}

/// The admin API's timeline of a conversation (`None`: unknown).
async fn timeline(url: &str, conversation: &str) -> Option<Value> {
    let r = client()
        .get(format!("{url}/admin/api/conversations/{conversation}"))
        .send()
        .await
        .unwrap();
    (r.status() == 200).then_some(())?;
    Some(serde_json::from_slice(&r.bytes().await.unwrap()).unwrap())
}

/// Serves, logs `before` whole, removes the database's directory, answers `after` (whose
/// rows cannot be written any more) and stops: the exit code and stderr.
async fn stop_with_the_log_gone(
    dir: &std::path::Path,
    db_dir: &std::path::Path,
    spill: Option<&std::path::Path>,
    mock: &MockServer,
) -> (Option<i32>, String) {
    let served = serve_logging(dir, db_dir, spill, mock).await;
    until_logged(&served).await;
    std::fs::remove_dir_all(db_dir).unwrap();
    answer_and_stop(served).await
}

/// Answers `after` three times, then SIGTERM: the exit code and stderr.
async fn answer_and_stop(served: Served) -> (Option<i32>, String) {
    for _ in 0..3 {
        chat(&served.url, "after").await;
    }
    served.sigterm();
    exit_of(served).await
}

/// Answers `before` and waits until the log shows it.
async fn until_logged(served: &Served) {
    chat(&served.url, "before").await;
    let mut logged = false;
    for _ in 0..200 {
        if timeline(&served.url, "before").await.is_some() {
            logged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(logged, "the first request was never logged");
}

/// A mock that answers every request at once, a temporary directory, and the directory in
/// it (`db/`) that holds the log.
async fn mock_and_db_dir() -> (MockServer, tempfile::TempDir, std::path::PathBuf) {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("Done.")]))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db_dir = dir.path().join("db");
    std::fs::create_dir(&db_dir).unwrap();
    (mock, dir, db_dir)
}

#[tokio::test]
async fn a_log_that_cannot_be_written_is_spilled_and_written_at_the_next_start() {
    let (mock, dir, db_dir) = mock_and_db_dir().await;
    let spill = dir.path().join("spill.jsonl");

    let (code, stderr) = stop_with_the_log_gone(dir.path(), &db_dir, Some(&spill), &mock).await;
    assert_eq!(code, Some(75), "spilled: {stderr}");
    assert!(stderr.contains("spilled"), "{stderr}");
    check_and_tear(&spill);

    // The next start (the directory is back, empty) writes the spill in before it serves.
    std::fs::create_dir(&db_dir).unwrap();
    let served = serve_logging(dir.path(), &db_dir, Some(&spill), &mock).await;
    let stderr = the_spill_is_in_the_log(served, dir.path(), &spill).await;
    assert!(
        stderr.contains("a line of the spill file is not a log record: skipped"),
        "{stderr}"
    );
}

/// The spill file's conversation (`after`) is in the log the proxy serves; then it stops
/// cleanly: its stderr.
async fn the_spill_is_in_the_log(
    served: Served,
    dir: &std::path::Path,
    spill: &std::path::Path,
) -> String {
    let after = timeline(&served.url, "after")
        .await
        .expect("the spilled conversation is in the log");
    let requests = after["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3, "{after}");
    assert!(
        requests.iter().all(|r| r["outcome"] == "complete"),
        "{after}"
    );
    assert!(!spill.exists(), "deleted once written");
    let rejected = std::fs::read_to_string(dir.join("spill.jsonl.rejected")).unwrap();
    assert_eq!(rejected, "{\"request\": {\"id\": 1\n");
    served.stop().await
}

/// Spills what it cannot write and tears a line of it by hand; checks the spill file.
fn check_and_tear(spill: &std::path::Path) {
    let text = std::fs::read_to_string(spill).unwrap();
    assert!(text.contains("\"after\""), "{text}");
    assert!(!text.contains(KEY), "no API key in the spill file");
    assert!(!text.to_lowercase().contains("authorization"), "{text}");
    // A line torn by hand: skipped and reported, not fatal.
    std::fs::write(spill, format!("{text}{{\"request\": {{\"id\": 1\n")).unwrap();
}

/// The cluster's directory (`LW_PG_DIR`, from `scripts/pg_cluster.sh start`).
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

#[tokio::test]
#[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
async fn postgres_stopped_at_shutdown_is_spilled_and_written_at_the_next_start() {
    let cluster = cluster_dir().expect(
        "LW_PG_DIR is unset: this test stops the server of scripts/pg_cluster.sh's cluster",
    );
    let db = proxy_support::postgres_db().await;
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("Done.")]))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill.jsonl");
    let served = serve_logging_to(dir.path(), &db, Some(&spill), &mock).await;
    until_logged(&served).await;
    pg_ctl("stop-server", &cluster).await;
    let (code, stderr) = answer_and_stop(served).await;
    pg_ctl("start-server", &cluster).await;
    assert_eq!(code, Some(75), "spilled: {stderr}");
    check_and_tear(&spill);
    let served = serve_logging_to(dir.path(), &db, Some(&spill), &mock).await;
    the_spill_is_in_the_log(served, dir.path(), &spill).await;
}

/// The spill file's default place is beside the database: the directory, removed with the
/// database, is made again for it, and the next start writes it in.
#[tokio::test]
async fn the_default_spill_file_survives_the_database_s_directory_removed() {
    let (mock, dir, db_dir) = mock_and_db_dir().await;
    let (code, stderr) = stop_with_the_log_gone(dir.path(), &db_dir, None, &mock).await;
    assert_eq!(code, Some(75), "spilled: {stderr}");
    let spill = db_dir.join("log.db.spill.jsonl");
    let text = std::fs::read_to_string(&spill).unwrap();
    assert!(text.contains("\"after\""), "{text}");
    let served = serve_logging(dir.path(), &db_dir, None, &mock).await;
    let after = timeline(&served.url, "after")
        .await
        .expect("the spilled conversation is in the log");
    assert_eq!(after["requests"].as_array().unwrap().len(), 3, "{after}");
    assert!(!spill.exists(), "deleted once written");
    served.stop().await;
}

#[tokio::test]
async fn a_spill_that_fails_too_says_how_many_records_were_lost() {
    let (mock, dir, db_dir) = mock_and_db_dir().await;
    let spill_dir = dir.path().join("spill");
    std::fs::create_dir(&spill_dir).unwrap();
    let served = serve_logging(dir.path(), &db_dir, Some(&spill_dir.join("s.jsonl")), &mock).await;
    until_logged(&served).await;
    std::fs::remove_dir_all(&db_dir).unwrap();
    // The spill file's directory replaced by a regular file: none can be made there.
    std::fs::remove_dir_all(&spill_dir).unwrap();
    std::fs::write(&spill_dir, "").unwrap();
    let (code, stderr) = answer_and_stop(served).await;
    assert_eq!(code, Some(74), "lost: {stderr}");
    let lost = stderr
        .lines()
        .find(|l| l.contains("spill file cannot be written"))
        .unwrap_or_else(|| panic!("{stderr}"));
    // At least each answered request's row and its conversation's sighting, and the line
    // says how many exactly.
    let n: u64 = lost
        .split("records_lost=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{lost}"));
    assert!(n >= 6, "{lost}");
    assert!(lost.contains(&format!("{n} records lost")), "{lost}");
}

/// A fresh connection's `GET` of `path` (no pooled connection: each is a new client, as a
/// load balancer's probe or a new client would be); its status and `Connection` header, or
/// `None` when nothing listens.
async fn fresh_get(url: &str, path: &str) -> Option<(u16, String)> {
    let r = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
        .get(format!("{url}{path}"))
        .send()
        .await
        .ok()?;
    let connection = r
        .headers()
        .get("connection")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    Some((r.status().as_u16(), connection))
}

/// From SIGTERM, `/readyz` answers 503 for `server.drain_secs` while the listener still
/// serves new connections (each answer closing its connection, so that clients reconnect
/// elsewhere); then the stop goes on as before and the process exits cleanly.
#[tokio::test]
async fn a_stop_drains_first_with_readyz_503_while_new_requests_are_served() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("Done.")]))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        "[server]\nshutdown_grace_secs = 8\ndrain_secs = 4\n",
    );
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    let served = Served::start(
        &["--config", &config, "--db", &db],
        &[("LOOPWARDEN_OPENAI_BASE_URL", mock.url())],
    )
    .await;
    let url = served.url.clone();
    assert_eq!(fresh_get(&url, "/readyz").await, Some((200, String::new())));
    served.sigterm();
    let mut draining = false;
    for _ in 0..200 {
        if fresh_get(&url, "/readyz")
            .await
            .is_some_and(|(s, _)| s == 503)
        {
            draining = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(draining, "/readyz never answered 503 after SIGTERM");
    // Alive, and still serving a new client's request on a new connection.
    assert_eq!(fresh_get(&url, "/healthz").await.map(|(s, _)| s), Some(200));
    let r = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-loopwarden-conversation", "drained")
        .body(Api::Chat.first_request("task", false).to_string())
        .send()
        .await
        .expect("a new request is served while draining");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["connection"], "close");
    r.bytes().await.unwrap();
    // Then the listener closes, and the stop ends as before.
    let mut closed = false;
    for _ in 0..400 {
        if fresh_get(&url, "/healthz").await.is_none() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(closed, "the listener never closed");
    let (code, stderr) = exit_of(served).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("draining"), "{stderr}");
}
