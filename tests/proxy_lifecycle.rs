//! The `loopwarden serve` binary: it prints where it listens, shuts down cleanly on SIGTERM
//! (finishing the stream in flight and writing the log), never writes an API key to its
//! logs or its database, and refuses a bad config naming the key.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod proxy_support;

use loopwarden::mock::{MockServer, Script, ToolCall, Turn};
use proxy_support::{client, closed_port, db_rows, query_json, Api, Backend, Served};
use serde_json::json;
use tokio::process::Command;

/// Starts `loopwarden serve` logging to `db` (at debug level).
async fn serve(db: &std::path::Path, env: &[(&str, String)]) -> Served {
    serve_url(&format!("sqlite://{}", db.display()), env).await
}

/// Starts `loopwarden serve` logging to the database at `url`.
async fn serve_url(url: &str, env: &[(&str, String)]) -> Served {
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "debug".into()));
    Served::start(&["--db", url], &env).await
}

async fn open_db(path: &std::path::Path) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=ro", path.display()))
        .await
        .unwrap()
}

on_both_backends!(sigterm_finishes_the_stream_in_flight_and_writes_the_log);

async fn sigterm_finishes_the_stream_in_flight_and_writes_the_log(backend: Backend) {
    let mut script = Script::with_turns(vec![Turn::text(&"A slow streamed answer. ".repeat(10))]);
    script.chunk_delay_ms = 60;
    let mock = MockServer::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = match backend {
        Backend::Sqlite => format!("sqlite://{}", dir.path().join("log.db").display()),
        Backend::Postgres => proxy_support::postgres_db().await,
    };
    let served = serve_url(
        &db,
        &[
            ("LOOPWARDEN_OPENAI_BASE_URL", mock.url()),
            ("LOOPWARDEN_ANTHROPIC_BASE_URL", mock.url()),
        ],
    )
    .await;
    let url = served.url.clone();
    let other = match backend {
        Backend::Postgres => Some(
            proxy_support::TestProxy::start_with(&mock.url(), |c| c.store.db = db.clone()).await,
        ),
        Backend::Sqlite => None,
    };

    let quick = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-loopwarden-conversation", "before-term")
        .body(Api::Chat.first_request("task", false).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(quick.status(), 200);
    quick.bytes().await.unwrap();

    let mut streaming = client()
        .post(format!("{url}{}", Api::Anthropic.path(true)))
        .header("x-loopwarden-conversation", "in-flight")
        .body(Api::Anthropic.first_request("task", true).to_string())
        .send()
        .await
        .unwrap();
    let mut received = streaming.chunk().await.unwrap().unwrap().to_vec();
    served.sigterm();
    while let Some(chunk) = streaming.chunk().await.unwrap() {
        received.extend_from_slice(&chunk);
    }
    assert!(
        String::from_utf8_lossy(&received).contains("message_stop"),
        "the stream in flight ran to its end"
    );
    let (status, stderr) = served.finish().await;
    assert!(status.success(), "exit status {status:?}");
    assert!(stderr.contains("log written"), "{stderr}");

    // On PostgreSQL it is one replica of two: the other, on the same database, sees every
    // entry the stopped one wrote.
    if let Some(other) = &other {
        let r = client()
            .get(other.url("/admin/api/conversations/in-flight"))
            .send()
            .await
            .unwrap();
        let timeline: serde_json::Value =
            serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(timeline["requests"][0]["outcome"], "complete", "{timeline}");
    }

    let rows = db_rows(
        &db,
        "SELECT conversation_id, outcome FROM requests ORDER BY conversation_id",
    )
    .await;
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["conversation_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["before-term", "in-flight"]);
    assert_eq!(rows[1]["outcome"], "complete");
}

#[tokio::test]
async fn api_keys_never_reach_the_logs_or_the_database() {
    let script = Script::with_turns(vec![
        Turn::calls(vec![ToolCall::function(
            "bash",
            json!({"command": "env | grep KEY"}),
        )]),
        Turn::text("Done."),
    ]);
    let mock = MockServer::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("log.db");
    let dead = format!("http://127.0.0.1:{}", closed_port().await);
    let served = serve(
        &db,
        &[
            ("LOOPWARDEN_OPENAI_BASE_URL", mock.url()),
            ("LOOPWARDEN_ANTHROPIC_BASE_URL", mock.url()),
            // Gemini unreachable: the error path must not leak the `?key=` either.
            ("LOOPWARDEN_GEMINI_BASE_URL", dead),
        ],
    )
    .await;
    let url = served.url.clone();
    let secrets = [
        "sk-FAKE-openai-0123456789abcdef",
        "sk-ant-FAKE-anthropic-0123456789",
        "FAKE-goog-header-key-0123456789",
        "FAKE-goog-query-key-0123456789",
    ];
    let c = client();
    for stream in [false, true] {
        let result = format!("OPENAI_API_KEY={}", secrets[0]);
        for body in [
            Api::Chat.first_request("task", stream),
            Api::Chat.request("task", stream, &[("env | grep KEY", &result)]),
        ] {
            c.post(format!("{url}/v1/chat/completions"))
                .header("authorization", format!("Bearer {}", secrets[0]))
                .body(body.to_string())
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
        }
        c.post(format!("{url}{}", Api::Anthropic.path(stream)))
            .header("x-api-key", secrets[1])
            .header("anthropic-version", "2023-06-01")
            .body(Api::Anthropic.first_request("task", stream).to_string())
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let r = c
            .post(format!(
                "{url}{}&key={}",
                Api::Gemini.path(true),
                secrets[3]
            ))
            .header("x-goog-api-key", secrets[2])
            .body(Api::Gemini.first_request("task", true).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        let error_body = r.bytes().await.unwrap();
        for secret in secrets {
            assert!(!String::from_utf8_lossy(&error_body).contains(secret));
        }
    }
    // A malformed body, with a key in an unparsed request.
    c.post(format!("{url}/v1/messages?key={}", secrets[3]))
        .header("x-api-key", secrets[1])
        .body("{not json")
        .send()
        .await
        .unwrap();
    let logs = served.stop().await;
    assert!(
        logs.contains("upstream unreachable"),
        "the logs were captured: {logs}"
    );

    // The mock did get the keys: they were forwarded, just never kept.
    assert!(mock
        .requests()
        .iter()
        .any(|r| r.header("authorization") == Some(&format!("Bearer {}", secrets[0]))));
    let pool = open_db(&db).await;
    let stored = query_json(&pool, "SELECT count(*) AS n FROM requests").await;
    assert_eq!(stored[0]["n"], 9, "every request was logged");
    pool.close().await;
    let mut haystacks = vec![("logs".to_string(), logs.into_bytes())];
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        haystacks.push((path.display().to_string(), std::fs::read(&path).unwrap()));
    }
    for (name, bytes) in &haystacks {
        for secret in secrets {
            let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!found, "{secret} found in {name}");
        }
    }
}

#[tokio::test]
async fn a_bad_config_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[upstream]\nanthropic = \"not a url\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upstream.anthropic"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_loopwarden"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("LOOPWARDEN_DB", "mysql://nope")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("store.db") && stderr.contains("LOOPWARDEN_DB"),
        "{stderr}"
    );
}

/// A supervisor may stop the proxy as soon as it says where it listens: the signal is
/// listened for before that line, so the proxy always exits cleanly, its log written.
#[tokio::test]
async fn a_sigterm_right_after_the_listening_line_is_a_clean_stop() {
    for _ in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let served = serve(&dir.path().join("log.db"), &[]).await;
        let stderr = served.stop().await;
        assert!(stderr.contains("log written"), "{stderr}");
    }
}

/// SIGHUP reloads the config file (it used to kill the process without writing out the
/// log): the proxy goes on serving under the file's policies, a broken file is reported
/// and changes nothing, and SIGTERM still stops it cleanly.
#[tokio::test]
async fn a_sighup_reloads_the_config_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("loopwarden.toml");
    std::fs::write(
        &config,
        "[[policy]]\nname = \"ci\"\nmatch = { team = \"ci\" }\n",
    )
    .unwrap();
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    let config_arg = config.display().to_string();
    let served = Served::start(&["--db", &db, "--config", &config_arg], &[]).await;
    let pid = served.pid().to_string();
    let policies = || async {
        let r = client()
            .get(format!("{}/admin/api/policies", served.url))
            .send()
            .await
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&r.bytes().await.unwrap()).unwrap()
    };
    let hup = || {
        let status = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    };
    assert!(policies().await["last_reload"].is_null());
    // The file as it is: a reload by the signal alone (the file watcher sees no change).
    hup();
    let mut last = serde_json::Value::Null;
    for _ in 0..100 {
        last = policies().await["last_reload"].clone();
        if !last.is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(last["trigger"], "signal", "{last}");
    assert_eq!(last["outcome"], "applied", "{last}");
    // The flags (`--db`, `--listen`) apply again: nothing reads as changed.
    assert_eq!(last["needs_restart"], serde_json::json!([]), "{last}");
    let names: Vec<String> = policies().await["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["ci", "default"]);
    let stderr = served.stop().await;
    assert!(stderr.contains("config reloaded"), "{stderr}");
    assert!(stderr.contains("log written"), "{stderr}");
}
