//! Pause for a human, through the real proxy: the request is held, listed, announced to a
//! webhook (a loopback server), and decided by `continue`, `nudge`, `halt` or the timeout;
//! a held streaming request is kept alive with SSE comments.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use intervene_support::*;
use loopwarden::detect::Action;
use loopwarden::dialect::Dialect;
use loopwarden::intervene::{StopMode, Verdict};
use serde_json::{json, Value};

/// A loopback webhook receiver that keeps every JSON body it is sent.
async fn webhook() -> (String, Arc<Mutex<Vec<Value>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let store = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                store
                    .lock()
                    .unwrap()
                    .push(serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

async fn pause_setup(hook: &str, timeout_secs: u64) -> Setup {
    let hook = hook.to_string();
    Setup::start(looping_script(Dialect::OpenAiChat), move |c| {
        c.intervene.on_stop = StopMode::Pause;
        c.intervene.pause.webhooks = vec![hook];
        c.intervene.pause.timeout_secs = timeout_secs;
        c.intervene.pause.keepalive_secs = 1;
    })
    .await
}

/// Waits until a request of `conversation` is held; returns its id.
async fn held_id(setup: &Setup, conversation: &str) -> String {
    for _ in 0..500 {
        let (_, v) = setup.admin("/admin/api/pending", None).await;
        if let Some(p) = v["pending"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["conversation_id"] == conversation)
        {
            return p["id"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{conversation} was never held");
}

#[tokio::test]
async fn a_held_request_is_listed_announced_and_decided_by_a_human() {
    let (hook, got) = webhook().await;
    let setup = Arc::new(pause_setup(&hook, 60).await);
    let dialect = Dialect::OpenAiChat;
    let body = loop_body(dialect, first_k(dialect, Action::Halt), false, None);
    for (verdict, conversation) in [
        (Verdict::Continue, "p-continue"),
        (Verdict::Nudge, "p-nudge"),
        (Verdict::Halt, "p-halt"),
    ] {
        let before = setup.mock.requests().len();
        let s = setup.clone();
        let p = path(dialect, conversation, false);
        let b = body.clone();
        let client = tokio::spawn(async move {
            let resp = s.post(&p, &b).await;
            let decision = header(&resp, "x-loopwarden-decision");
            (decision, resp.bytes().await.unwrap())
        });
        let id = held_id(&setup, conversation).await;
        assert_eq!(setup.mock.requests().len(), before, "held, not forwarded");
        // A wrong body is refused with a clear error and decides nothing.
        let (status, v) = setup
            .admin(
                &format!("/admin/api/pending/{id}"),
                Some(json!({"decision": "later"})),
            )
            .await;
        assert_eq!(status, 400, "{v}");
        let (status, _) = setup
            .admin(
                &format!("/admin/api/pending/{id}"),
                Some(json!({"decision": verdict.as_str()})),
            )
            .await;
        assert_eq!(status, 200);
        let (decision, answer) = client.await.unwrap();
        assert_eq!(decision, "pause");
        let (text, calls, _) = read_answer(dialect, false, &answer);
        match verdict {
            Verdict::Continue => {
                assert_eq!(setup.mock.requests().len(), before + 1);
                assert_eq!(calls, vec!["bash"], "the upstream's answer: {text}");
                let sent = setup.mock.requests().last().unwrap().body.clone();
                assert_eq!(
                    sent.as_ref(),
                    body.to_string().as_bytes(),
                    "forwarded untouched"
                );
                // The human let it go on: the next request is not held again at once.
                let k = first_k(dialect, Action::Halt);
                let next = setup
                    .post(
                        &path(dialect, conversation, false),
                        &loop_body(dialect, k + 1, false, None),
                    )
                    .await;
                assert_ne!(header(&next, "x-loopwarden-decision"), "pause");
                let _ = next.bytes().await;
                assert_eq!(setup.mock.requests().len(), before + 2);
            }
            Verdict::Nudge => {
                assert_eq!(setup.mock.requests().len(), before + 1);
                let got = setup.mock.requests().last().unwrap().json();
                let last = got["messages"].as_array().unwrap().last().unwrap().clone();
                assert_eq!(last["role"], "system");
                assert!(last["content"]
                    .as_str()
                    .unwrap()
                    .starts_with("[loopwarden]"));
            }
            Verdict::Halt => {
                assert_eq!(setup.mock.requests().len(), before, "not forwarded");
                // The human who decided stopped it, not the policy.
                assert!(
                    text.starts_with("[loopwarden] An operator stopped this run"),
                    "{text}"
                );
            }
        }
        // Decided once: the id is gone.
        let (status, _) = setup
            .admin(
                &format!("/admin/api/pending/{id}"),
                Some(json!({"decision": "halt"})),
            )
            .await;
        assert_eq!(status, 404);
        // The webhook was told, with the finding and how to decide.
        let hooks = got.lock().unwrap().clone();
        let hook = hooks
            .iter()
            .find(|h| h["pending"]["id"] == id.as_str())
            .unwrap_or_else(|| panic!("no webhook for {id}: {hooks:?}"));
        assert_eq!(hook["event"], "loopwarden.pause");
        assert_eq!(hook["pending"]["conversation_id"], conversation);
        assert!(!hook["pending"]["findings"].as_array().unwrap().is_empty());
        assert_eq!(hook["decide"]["path"], format!("/admin/api/pending/{id}"));
        assert_eq!(hook["decide"]["content_type"], "application/json");
    }
    setup.proxy.flush_log().await;
    let (_, timeline) = setup.admin("/admin/api/conversations/p-halt", None).await;
    let sources: Vec<(&str, &str)> = timeline["interventions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["action"].as_str().unwrap(), i["source"].as_str().unwrap()))
        .collect();
    assert!(sources.contains(&("pause", "policy")), "{sources:?}");
    assert!(sources.contains(&("halt", "human")), "{sources:?}");
}

#[tokio::test]
async fn nobody_decides_and_the_default_halts() {
    let (hook, _) = webhook().await;
    let setup = pause_setup(&hook, 1).await;
    let dialect = Dialect::OpenAiChat;
    let body = loop_body(dialect, first_k(dialect, Action::Halt), false, None);
    let resp = setup.post(&path(dialect, "p-timeout", false), &body).await;
    let (text, _, _) = read_answer(dialect, false, &resp.bytes().await.unwrap());
    assert!(
        text.starts_with("[loopwarden] I stopped this run"),
        "{text}"
    );
    assert!(setup.mock.requests().is_empty());
    let (_, v) = setup.admin("/admin/api/pending", None).await;
    assert_eq!(v["pending"], json!([]));
}

#[tokio::test]
async fn a_held_stream_is_kept_alive_then_carries_the_answer() {
    let (hook, _) = webhook().await;
    let dialect = Dialect::Anthropic;
    let hook2 = hook.clone();
    let setup = Arc::new(
        Setup::start(looping_script(dialect), move |c| {
            c.intervene.on_stop = StopMode::Pause;
            c.intervene.pause.webhooks = vec![hook2];
            c.intervene.pause.keepalive_secs = 1;
        })
        .await,
    );
    let body = loop_body(dialect, first_k(dialect, Action::Halt), true, None);
    let mut resp = setup.post(&path(dialect, "p-stream", true), &body).await;
    assert!(header(&resp, "content-type").starts_with("text/event-stream"));
    let first = resp.chunk().await.unwrap().unwrap();
    assert_eq!(
        first.as_ref(),
        b": keep-alive\n\n",
        "kept alive before any decision"
    );
    let id = held_id(&setup, "p-stream").await;
    let (status, _) = setup
        .admin(
            &format!("/admin/api/pending/{id}"),
            Some(json!({"decision": "continue"})),
        )
        .await;
    assert_eq!(status, 200);
    let mut rest = first.to_vec();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    let (text, calls, ended) = read_answer(dialect, true, &rest);
    assert!(ended, "a complete stream after the comments");
    assert_eq!(text, "Running the test again.");
    assert_eq!(calls, vec!["Bash"]);
    assert_eq!(setup.mock.requests().len(), 1);
}

#[tokio::test]
async fn a_client_that_goes_away_withdraws_its_held_request() {
    let (hook, _) = webhook().await;
    let dialect = Dialect::Anthropic;
    let setup = Setup::start(looping_script(dialect), move |c| {
        c.intervene.on_stop = StopMode::Pause;
        c.intervene.pause.webhooks = vec![hook];
        c.intervene.pause.keepalive_secs = 1;
    })
    .await;
    let body = loop_body(dialect, first_k(dialect, Action::Halt), true, None);
    let mut resp = setup.post(&path(dialect, "p-gone", true), &body).await;
    let _ = resp.chunk().await.unwrap();
    let _ = held_id(&setup, "p-gone").await;
    drop(resp);
    for _ in 0..500 {
        let (_, v) = setup.admin("/admin/api/pending", None).await;
        if v["pending"] == json!([]) {
            assert!(setup.mock.requests().is_empty());
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the held request stayed listed after its client left");
}

/// The time a request waits for a human is not the proxy's: a request held for a while,
/// then let go, shows the proxy's own time as its overhead (its row, `/admin/api/stats`,
/// the latency histogram of `/metrics`), not the hold, in both a plain and a streamed
/// answer.
#[tokio::test]
async fn the_time_a_request_is_held_is_not_counted_as_proxy_overhead() {
    let (hook, _) = webhook().await;
    let setup = Arc::new(pause_setup(&hook, 60).await);
    let dialect = Dialect::OpenAiChat;
    let k = first_k(dialect, Action::Halt);
    let mut held_for = Vec::new();
    for (conversation, stream) in [("slow-human", false), ("slow-human-stream", true)] {
        let s = setup.clone();
        let p = path(dialect, conversation, stream);
        let b = loop_body(dialect, k, stream, None);
        let client = tokio::spawn(async move {
            let resp = s.post(&p, &b).await;
            resp.bytes().await.unwrap();
        });
        let id = held_id(&setup, conversation).await;
        let listed = std::time::Instant::now();
        // The human reads the run before deciding.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (status, _) = setup
            .admin(
                &format!("/admin/api/pending/{id}"),
                Some(json!({"decision": "continue"})),
            )
            .await;
        assert_eq!(status, 200);
        held_for.push(listed.elapsed().as_micros() as i64);
        client.await.unwrap();
    }
    setup.proxy.flush_log().await;
    let held = *held_for.iter().min().unwrap();
    let db = rusqlite::Connection::open(setup.dir.path().join("log.db")).unwrap();
    let rows: Vec<(String, i64)> = db
        .prepare(
            "SELECT conversation_id, proxy_overhead_us FROM requests \
             WHERE applied = 'held' OR conversation_id LIKE 'slow-human%'",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (conversation, overhead) in &rows {
        assert!(
            *overhead < held,
            "{conversation}: {overhead} µs of overhead, held {held} µs"
        );
    }
    let (_, stats) = setup.admin("/admin/api/stats", None).await;
    let max = stats["proxy_overhead_us"]["max_us"].as_i64().unwrap();
    assert!(max < held, "{stats}");
    let metrics = client()
        .get(setup.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Every request's overhead falls in a bucket below the hold.
    let bucket = |le: &str| -> Option<u64> {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("loopwarden_proxy_overhead_seconds_bucket")
                    && l.contains(&format!("le=\"{le}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let below = (held as f64) / 1e6;
    let all = bucket("+Inf").unwrap();
    let le = metrics
        .lines()
        .filter(|l| l.starts_with("loopwarden_proxy_overhead_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            le.parse::<f64>()
                .ok()
                .filter(|v| *v <= below)
                .map(|_| le.to_string())
        })
        .next_back()
        .expect("a bucket below the hold");
    assert_eq!(bucket(&le), Some(all), "{metrics}");
}

/// A held request whose client leaves before anyone decides still has its row in the log
/// (`held`, `client_disconnected`), beside its `held` intervention; the pause webhooks are
/// told it was abandoned, and so is a human who comes to decide it (410): plain and
/// streamed.
#[tokio::test]
async fn a_held_request_whose_client_leaves_is_logged_as_such() {
    let (hook, got) = webhook().await;
    let setup = Arc::new(pause_setup(&hook, 60).await);
    let dialect = Dialect::OpenAiChat;
    let k = first_k(dialect, Action::Halt);
    for (conversation, stream) in [("left-plain", false), ("left-stream", true)] {
        let s = setup.clone();
        let p = path(dialect, conversation, stream);
        let b = loop_body(dialect, k, stream, None);
        let client = tokio::spawn(async move {
            let mut resp = s.post(&p, &b).await;
            // A streamed hold answers at once; hold on to it until aborted.
            while let Ok(Some(_)) = resp.chunk().await {}
        });
        let id = held_id(&setup, conversation).await;
        client.abort();
        let _ = client.await;
        let mut gone = false;
        for _ in 0..500 {
            let (_, v) = setup.admin("/admin/api/pending", None).await;
            if !v["pending"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["conversation_id"] == conversation)
            {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "{conversation} stayed listed after its client left");
        // The human who comes to decide it is told it was abandoned, not "not found".
        let (status, v) = setup
            .admin(
                &format!("/admin/api/pending/{id}"),
                Some(json!({"decision": "continue"})),
            )
            .await;
        assert_eq!(status, 410, "{v}");
        assert!(v["error"].as_str().unwrap().contains("abandoned"), "{v}");
        assert_eq!(v["pending"]["conversation_id"], conversation);
    }
    // The pause webhook heard of it too.
    let events = |event: &str| -> Vec<Value> {
        got.lock()
            .unwrap()
            .iter()
            .filter(|e| e["event"] == event)
            .cloned()
            .collect()
    };
    for _ in 0..500 {
        if events("loopwarden.pause.abandoned").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let abandoned = events("loopwarden.pause.abandoned");
    assert_eq!(abandoned.len(), 2, "{abandoned:?}");
    assert_eq!(abandoned[0]["pending"]["conversation_id"], "left-plain");
    setup.proxy.flush_log().await;
    let db = rusqlite::Connection::open(setup.dir.path().join("log.db")).unwrap();
    let rows: Vec<(String, String, String, i64)> = db
        .prepare(
            "SELECT conversation_id, applied, outcome, status FROM requests \
             WHERE conversation_id LIKE 'left-%' ORDER BY conversation_id",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let expected: Vec<(String, String, String, i64)> = ["left-plain", "left-stream"]
        .iter()
        .map(|c| {
            (
                c.to_string(),
                "held".into(),
                "client_disconnected".into(),
                499,
            )
        })
        .collect();
    assert_eq!(rows, expected);
    assert!(setup.mock.requests().is_empty(), "nothing was forwarded");
}

/// Under `on_stop = "pause"` a spent budget is not put to a human: the run is halted at
/// once (a human's `continue` would spend past the cap), as the README says.
#[tokio::test]
async fn a_spent_budget_halts_at_once_even_under_pause() {
    let (hook, got) = webhook().await;
    let setup = Setup::start(looping_script(Dialect::OpenAiChat), move |c| {
        c.intervene.on_stop = StopMode::Pause;
        c.intervene.pause.webhooks = vec![hook];
        c.budget.steps = 2;
    })
    .await;
    let dialect = Dialect::OpenAiChat;
    let body = loop_body(dialect, 3, false, None);
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        setup.post(&path(dialect, "over-budget", false), &body),
    )
    .await
    .expect("answered, not held");
    assert_eq!(header(&resp, "x-loopwarden-decision"), "halt");
    let (text, _, _) = read_answer(dialect, false, &resp.bytes().await.unwrap());
    assert!(text.contains("budget"), "{text}");
    let (_, pending) = setup.admin("/admin/api/pending", None).await;
    assert_eq!(pending["pending"], json!([]));
    assert!(setup.mock.requests().is_empty());
    assert!(got.lock().unwrap().is_empty(), "no pause webhook");
}
