//! Credentials in a conversation never reach what loopwarden keeps or shows: the SQLite
//! file and its WAL, the proxy's stderr, every admin answer and the pause webhooks. The
//! real binary runs over sockets in front of the mock model; agents loop with a key of
//! every common shape in their commands, outputs, errors and messages until they are
//! nudged, held, halted and halted again, so findings, decisions, interventions and
//! sticky halts all quote them.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

mod intervene_support;
mod proxy_support;

use std::sync::{Arc, Mutex};

use intervene_support::{loop_body_with, path, LoopText, ALL};
use loopwarden::dialect::Dialect;
use loopwarden::mock::{AfterEnd, MockServer, Script, ToolCall, Turn};
use proxy_support::Served;
use serde_json::{json, Value};

/// A credential as an agent may come across it, and the part of it that must never be
/// kept (a mask may keep a name such as `password:`, never the value).
struct Secret {
    shape: &'static str,
    text: &'static str,
    value: &'static str,
}

const SECRETS: [Secret; 10] = [
    Secret {
        shape: "openai",
        text: "sk-proj-Q2x7VbN4kL9mT1rZ8wY3uH6pD0sF5g",
        value: "Q2x7VbN4kL9mT1rZ8wY3",
    },
    Secret {
        shape: "anthropic",
        text: "sk-ant-api03-Xq8Lm2Nv7Bc4Zt9Rw1Ys6Hd3Kf0",
        value: "Xq8Lm2Nv7Bc4Zt9Rw1Ys",
    },
    Secret {
        shape: "google",
        text: "AIzaSyD4m7Qx2Lk9Vb1Nw8Zr5Tc3Hy6Pf0Gj",
        value: "D4m7Qx2Lk9Vb1Nw8Zr5T",
    },
    Secret {
        shape: "aws access key id",
        text: "AKIAQ4X7M2L9V1N8Z5T3",
        value: "Q4X7M2L9V1N8Z5T3",
    },
    Secret {
        shape: "aws secret access key",
        text: "aws_secret_access_key=Wq7Lm2Nv9Bc4/Zt1Rw8Ys3Hd6+Kf0Pg5JjXa2Qe7U",
        value: "Wq7Lm2Nv9Bc4",
    },
    Secret {
        shape: "github",
        text: "ghp_Lm3Nv8Bc5Zt2Rw9Ys4Hd7Kf1Pg6JjXa3Qe8",
        value: "Lm3Nv8Bc5Zt2Rw9Ys4Hd",
    },
    Secret {
        shape: "slack",
        text: "xoxb-2048-4096-Nv4Bc6Zt3Rw0Ys5Hd8Kf2",
        value: "Nv4Bc6Zt3Rw0Ys5Hd8Kf",
    },
    Secret {
        shape: "pem",
        text: "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAq8Lm2Nv7/Bc4Zt9Rw1+Ys6Hd3Kf0Pg5JjXa2Qe7Uz9Wc4Vb1\nTn6Rm3Lk8Jh5Gf2Ds9Ap4Qo7Iu1Ye6Wt3Rr0Ee5Ww8Qq2Zz9Xx4Cc7Vv1Bb6Nn3\n-----END RSA PRIVATE KEY-----",
        value: "q8Lm2Nv7/Bc4Zt9Rw1+",
    },
    Secret {
        shape: "password",
        text: "password: Hunter2-Swordfish-77",
        value: "Hunter2-Swordfish",
    },
    Secret {
        shape: "jwt",
        text: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03In0.Tq9Vb2Nw5Zr8Lk1Xc4Hy7Pf0Gj3",
        value: "eyJzdWIiOiJhZ2VudC03In0",
    },
];

/// A conversation that loops with `secret` in each place a conversation can carry it.
fn loop_text(secret: &Secret) -> LoopText {
    LoopText {
        task: format!(
            "Fix the failing test in test_calc.py; the deploy uses {}",
            secret.text
        ),
        command: format!("python3 test_calc.py --with {}", secret.text),
        result: format!(
            "auth rejected {}\nFAILED test_calc.py::test_add - AssertionError",
            secret.text
        ),
        thought: format!("Running it again with {} to be sure.", secret.text),
    }
}

/// `loopwarden serve` in front of the mock with the config `config`, logging to `dir`.
async fn serve(dir: &std::path::Path, mock: &MockServer, config: &str) -> (Served, String) {
    let config_file = dir.join("loopwarden.toml");
    std::fs::write(&config_file, config).unwrap();
    let config_file = config_file.display().to_string();
    let db = format!("sqlite://{}", dir.join("log.db").display());
    let served = Served::start(
        &["--config", &config_file, "--db", &db],
        &[
            ("LOOPWARDEN_OPENAI_BASE_URL", mock.url()),
            ("LOOPWARDEN_ANTHROPIC_BASE_URL", mock.url()),
            ("LOOPWARDEN_GEMINI_BASE_URL", mock.url()),
            ("RUST_LOG", "debug".into()),
        ],
    )
    .await;
    let url = served.url.clone();
    (served, url)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// Everything a reader of loopwarden's output could see, by where it was seen.
#[derive(Default)]
struct Seen(Vec<(String, Vec<u8>)>);

impl Seen {
    fn add(&mut self, place: impl Into<String>, bytes: impl Into<Vec<u8>>) {
        self.0.push((place.into(), bytes.into()));
    }

    /// The database file, its WAL and anything else beside them, as they are now.
    fn add_files(&mut self, dir: &std::path::Path, when: &str) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            self.add(format!("{} ({when})", path.display()), bytes);
        }
    }

    /// An admin call's answer (GET, or POST with `body`), kept, and its JSON.
    async fn admin(&mut self, url: &str, call: &str, body: Option<Value>) -> (u16, Value) {
        let request = match body {
            Some(b) => client()
                .post(format!("{url}{call}"))
                .header("content-type", "application/json")
                .body(b.to_string()),
            None => client().get(format!("{url}{call}")),
        };
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap().to_vec();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.add(format!("admin {call}"), bytes);
        (status, value)
    }

    /// Every admin GET: the list, each conversation's timeline, the stats, the pending list.
    async fn admin_reads(&mut self, url: &str) {
        let (_, list) = self.admin(url, "/admin/api/conversations", None).await;
        for c in list["conversations"].as_array().unwrap() {
            let id = c["id"].as_str().unwrap();
            self.admin(url, &format!("/admin/api/conversations/{id}"), None)
                .await;
        }
        self.admin(url, "/admin/api/stats", None).await;
        self.admin(url, "/admin/api/pending", None).await;
    }

    fn assert_clean(&self) {
        let mut leaks = Vec::new();
        for (place, bytes) in &self.0 {
            for s in &SECRETS {
                let found = bytes
                    .windows(s.value.len())
                    .any(|w| w == s.value.as_bytes());
                if found {
                    leaks.push(format!("{} key in {place}", s.shape));
                }
            }
        }
        assert!(leaks.is_empty(), "{}", leaks.join("\n"));
    }

    fn text(&self, place: &str) -> String {
        self.0
            .iter()
            .filter(|(p, _)| p.starts_with(place))
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect()
    }
}

/// Sends the loop of `text` one request at a time, each carrying one more failed run, until
/// its answer is a halt, then once more (the sticky halt). Returns the decisions seen.
async fn loop_until_halted(url: &str, dialect: Dialect, id: &str, text: &LoopText) -> Vec<String> {
    let mut decisions = Vec::new();
    for k in 1..40 {
        let body = loop_body_with(dialect, k, false, None, text);
        let response = client()
            .post(format!("{url}{}", path(dialect, id, false)))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let decision = response
            .headers()
            .get("x-loopwarden-decision")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        response.bytes().await.unwrap();
        let halted = decisions.last().is_some_and(|d| d == "halt");
        decisions.push(decision);
        if halted {
            return decisions;
        }
    }
    panic!("{id} never halted: {decisions:?}");
}

/// A loopback webhook receiver that keeps every body it is sent.
async fn webhook() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(body.to_vec());
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

/// The mock answers every turn with the first loop's call again, so that conversation's
/// next call can also be blocked on the way back.
fn looping_mock_script() -> Script {
    let text = loop_text(&SECRETS[0]);
    let mut script = Script::with_turns(vec![Turn {
        text: Some(text.thought.clone()),
        tool_calls: vec![ToolCall::function("bash", json!({"command": text.command}))],
        ..Turn::default()
    }]);
    script.after_end = AfterEnd::RepeatLast;
    script
}

#[tokio::test]
async fn no_credential_reaches_the_log_its_wal_stderr_or_any_admin_answer() {
    let mock = MockServer::start(looping_mock_script()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Seen::default();

    // Halting policy: each key shape loops in its own conversation, over the four APIs.
    let (child, url) = serve(dir.path(), &mock, "").await;
    for (i, secret) in SECRETS.iter().enumerate() {
        let dialect = ALL[i % ALL.len()];
        let id = format!("leak-{i}");
        let decisions = loop_until_halted(&url, dialect, &id, &loop_text(secret)).await;
        assert!(
            decisions.iter().any(|d| d == "nudge"),
            "{id}: {decisions:?}"
        );
    }
    // An operator halts and resumes one by hand, quoting what they saw.
    let reason = format!("it printed {}", SECRETS[0].text);
    seen.admin(
        &url,
        "/admin/api/conversations/leak-1/halt",
        Some(json!({ "reason": reason })),
    )
    .await;
    seen.admin(
        &url,
        "/admin/api/conversations/leak-1/resume",
        Some(json!({})),
    )
    .await;
    // The log is written within its batch window; read it as an operator would.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    seen.admin_reads(&url).await;
    seen.add_files(dir.path(), "running");
    let stderr = child.stop().await;
    assert!(
        stderr.contains("intervention"),
        "stderr was captured: {stderr}"
    );
    seen.add("stderr (halting)", stderr);
    seen.add_files(dir.path(), "stopped");

    // Pausing policy, on the same log: a held request is listed, announced and decided.
    let (hook, hooks) = webhook().await;
    let pause = format!(
        "[intervene]\non_stop = \"pause\"\n[intervene.pause]\ntimeout_secs = 60\nwebhooks = [\"{hook}\"]\n"
    );
    let (child, url) = serve(dir.path(), &mock, &pause).await;
    let secret = &SECRETS[3];
    let text = loop_text(secret);
    let held_url = url.clone();
    let client_side = tokio::spawn(async move {
        loop_until_halted(&held_url, Dialect::OpenAiChat, "leak-held", &text).await
    });
    let mut held = None;
    for _ in 0..1000 {
        let (_, pending) = seen.admin(&url, "/admin/api/pending", None).await;
        if let Some(p) = pending["pending"].as_array().and_then(|p| p.first()) {
            held = p["id"].as_str().map(str::to_string);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let held = held.expect("a request was held");
    let (status, _) = seen
        .admin(
            &url,
            &format!("/admin/api/pending/{held}"),
            Some(json!({"decision": "halt"})),
        )
        .await;
    assert_eq!(status, 200);
    let decisions = client_side.await.unwrap();
    assert!(decisions.iter().any(|d| d == "pause"), "{decisions:?}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    seen.admin_reads(&url).await;
    seen.add_files(dir.path(), "running, paused");
    let stderr = child.stop().await;
    seen.add("stderr (pausing)", stderr);
    seen.add_files(dir.path(), "stopped, paused");
    let announced = hooks.lock().unwrap().clone();
    assert!(!announced.is_empty(), "the webhook was told");
    for body in announced {
        seen.add("webhook", body);
    }

    // The keys did travel (forwarded untouched) and the log did quote the loops: the
    // masks are there, not an empty log.
    let sent = mock.requests();
    for s in &SECRETS {
        assert!(
            sent.iter().any(|r| {
                let body = r.body.as_ref();
                let json = serde_json::to_string(s.text).unwrap();
                let needle = &json.as_bytes()[1..json.len() - 1];
                body.windows(needle.len()).any(|w| w == needle)
            }),
            "{} key was forwarded",
            s.shape
        );
    }
    let timelines = seen.text("admin /admin/api/conversations/leak-");
    for table in [
        "\"findings\":[{",
        "\"decisions\":[{",
        "\"interventions\":[{",
    ] {
        assert!(timelines.contains(table), "{table} in {timelines}");
    }
    assert!(timelines.contains("[redacted]"), "{timelines}");
    seen.assert_clean();
}
