//! Shared pieces of the proxy tests: a proxy started in-process against the project's mock
//! model server, a TCP tap that records the exact bytes between the proxy and the mock,
//! and request bodies for each API.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use loopwarden::config::Config;
use loopwarden::proxy::{self, Running};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A proxy whose three upstreams are `upstream`, logging to a fresh SQLite file (or, with
/// [`TestProxy::on`], a fresh PostgreSQL database).
pub struct TestProxy {
    pub running: Running,
    pub dir: tempfile::TempDir,
    /// The log's URL.
    pub db: String,
}

/// Which database a test's proxy logs to: the log tests run on both
/// ([`on_both_backends`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// For each `async fn name(backend: Backend)` of the test file, the tests `name::sqlite`
/// and `name::postgres`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name($crate::proxy_support::Backend::Sqlite).await
            }
            #[tokio::test]
            #[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
            async fn postgres() {
                super::$name($crate::proxy_support::Backend::Postgres).await
            }
        }
    )*};
}

/// A new PostgreSQL database for a test (which is `#[ignore]`d: `loopwarden::store::test_postgres`).
pub async fn postgres_db() -> String {
    loopwarden::store::test_postgres().await.unwrap()
}

impl TestProxy {
    pub async fn start(upstream: &str) -> TestProxy {
        TestProxy::start_with(upstream, |_| {}).await
    }

    /// A proxy logging to a new database of `backend`.
    pub async fn on(backend: Backend, upstream: &str) -> TestProxy {
        TestProxy::on_with(backend, upstream, |_| {}).await
    }

    pub async fn on_with(
        backend: Backend,
        upstream: &str,
        adjust: impl FnOnce(&mut Config),
    ) -> TestProxy {
        let db = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(postgres_db().await),
        };
        TestProxy::start_with(upstream, |config| {
            if let Some(db) = db {
                config.store.db = db;
            }
            adjust(config)
        })
        .await
    }

    pub async fn start_with(upstream: &str, adjust: impl FnOnce(&mut Config)) -> TestProxy {
        TestProxy::start_in(upstream, tempfile::tempdir().unwrap(), adjust).await
    }

    /// Stops this proxy (its log written out) and starts another on the same log.
    pub async fn restart(self, upstream: &str) -> TestProxy {
        let TestProxy { running, dir, db } = self;
        running.flush_log().await;
        running.shutdown().await.unwrap();
        TestProxy::start_in(upstream, dir, |config| config.store.db = db).await
    }

    /// A proxy on the log another one left in `dir` (a restart).
    pub async fn start_on(upstream: &str, dir: tempfile::TempDir) -> TestProxy {
        TestProxy::start_in(upstream, dir, |_| {}).await
    }

    pub async fn start_in(
        upstream: &str,
        dir: tempfile::TempDir,
        adjust: impl FnOnce(&mut Config),
    ) -> TestProxy {
        let mut config = Config::default();
        config.server.listen = "127.0.0.1:0".into();
        config.store.db = format!("sqlite://{}", dir.path().join("log.db").display());
        // In the test's directory on PostgreSQL too (its default is the working directory).
        config.store.spill = dir.path().join("log.spill.jsonl").display().to_string();
        config.upstream.openai = upstream.to_string();
        config.upstream.anthropic = upstream.to_string();
        config.upstream.gemini = upstream.to_string();
        adjust(&mut config);
        let db = config.store.db.clone();
        let running = proxy::start(config).await.unwrap();
        TestProxy { running, dir, db }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.running.url())
    }

    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("log.db")
    }

    /// Rows of a query, as JSON objects, once everything finished so far is written.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        self.running.flush_log().await;
        db_rows(&self.db, sql).await
    }
}

/// Rows of a query on the log at `url` (SQLite or PostgreSQL), as JSON objects with the
/// same values from either (a PostgreSQL boolean reads as SQLite's 0 or 1).
pub async fn db_rows(url: &str, sql: &str) -> Vec<Value> {
    if !loopwarden::store::postgres::is_url(url) {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        let rows = query_json(&pool, sql).await;
        pool.close().await;
        return rows;
    }
    use sqlx::{Column, Row, TypeInfo, ValueRef};
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
    pool.close().await;
    rows.iter()
        .map(|row| {
            let mut obj = serde_json::Map::new();
            for (i, col) in row.columns().iter().enumerate() {
                let raw = row.try_get_raw(i).unwrap();
                let value = if raw.is_null() {
                    Value::Null
                } else {
                    match raw.type_info().name() {
                        "INT8" => json!(row.get::<i64, _>(i)),
                        "INT4" => json!(row.get::<i32, _>(i)),
                        "BOOL" => json!(i64::from(row.get::<bool, _>(i))),
                        "FLOAT8" => json!(row.get::<f64, _>(i)),
                        _ => json!(row.get::<String, _>(i)),
                    }
                };
                obj.insert(col.name().to_string(), value);
            }
            Value::Object(obj)
        })
        .collect()
}

/// Runs a query and returns each row as a JSON object (integers, reals, text, null).
pub async fn query_json(pool: &sqlx::SqlitePool, sql: &str) -> Vec<Value> {
    use sqlx::{Column, Row, TypeInfo, ValueRef};
    let rows = sqlx::query(sql).fetch_all(pool).await.unwrap();
    rows.iter()
        .map(|row| {
            let mut obj = serde_json::Map::new();
            for (i, col) in row.columns().iter().enumerate() {
                let raw = row.try_get_raw(i).unwrap();
                let value = if raw.is_null() {
                    Value::Null
                } else {
                    match raw.type_info().name() {
                        "INTEGER" | "BOOLEAN" => json!(row.get::<i64, _>(i)),
                        "REAL" => json!(row.get::<f64, _>(i)),
                        _ => json!(row.get::<String, _>(i)),
                    }
                };
                obj.insert(col.name().to_string(), value);
            }
            Value::Object(obj)
        })
        .collect()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A response read off a connection of its own: the status, the head as text, the body as
/// sent (not de-chunked).
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Sends `request` exactly as given (it should say `connection: close`) on a new connection
/// to `addr` and reads the answer until the proxy closes it: for request lines and headers an
/// HTTP client would not send (`..` segments, a foreign `Host`, `CONNECT`).
pub async fn raw_request(addr: std::net::SocketAddr, request: &[u8]) -> RawResponse {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    // A reset after the answer (the proxy closing with request bytes unread) ends it too.
    let _ = tcp.read_to_end(&mut answer).await;
    let end = find(&answer, b"\r\n\r\n").map_or(answer.len(), |i| i + 4);
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    RawResponse {
        status,
        head,
        body: answer[end..].to_vec(),
    }
}

/// One TCP connection through the tap.
#[derive(Debug, Default, Clone)]
pub struct TapConn {
    /// Bytes the proxy sent to the mock.
    pub to_upstream: Vec<u8>,
    /// Bytes the mock sent to the proxy.
    pub from_upstream: Vec<u8>,
    /// Where each read from the mock starts in `from_upstream`, and its place among the
    /// reads of every connection (the proxy keeps an upstream pool per serving thread, so
    /// consecutive responses may come over different connections).
    pub upstream_reads: Vec<(usize, u64)>,
    /// The proxy closed (or reset) its side.
    pub closed_by_proxy: bool,
}

/// A TCP relay in front of the mock that records every byte both ways, so a test can
/// compare what the upstream really sent with what the client got, and see when the proxy
/// drops an upstream connection.
pub struct Tap {
    addr: std::net::SocketAddr,
    conns: Arc<Mutex<Vec<TapConn>>>,
}

impl Tap {
    pub async fn start(target: std::net::SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<TapConn>>> = Arc::default();
        let shared = conns.clone();
        let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(target).await else {
                    continue;
                };
                let index = {
                    let mut c = shared.lock().unwrap();
                    c.push(TapConn::default());
                    c.len() - 1
                };
                let (mut in_r, mut in_w) = inbound.into_split();
                let (mut out_r, mut out_w) = outbound.into_split();
                let up = shared.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match in_r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                up.lock().unwrap()[index]
                                    .to_upstream
                                    .extend_from_slice(&buf[..n]);
                                if out_w.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    up.lock().unwrap()[index].closed_by_proxy = true;
                    let _ = out_w.shutdown().await;
                });
                let down = shared.clone();
                let reads = reads.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match out_r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                {
                                    let mut c = down.lock().unwrap();
                                    let conn = &mut c[index];
                                    let order =
                                        reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    conn.upstream_reads.push((conn.from_upstream.len(), order));
                                    conn.from_upstream.extend_from_slice(&buf[..n]);
                                }
                                if in_w.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = in_w.shutdown().await;
                });
            }
        });
        Tap { addr, conns }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn conns(&self) -> Vec<TapConn> {
        self.conns.lock().unwrap().clone()
    }

    /// Every response body the upstream sent, in the order the responses began, over all
    /// connections.
    pub fn upstream_bodies(&self) -> Vec<Vec<u8>> {
        let mut bodies: Vec<(u64, Vec<u8>)> = Vec::new();
        for c in self.conns() {
            for (start, body) in response_bodies_at(&c.from_upstream) {
                let order = c
                    .upstream_reads
                    .iter()
                    .take_while(|(offset, _)| *offset <= start)
                    .last()
                    .map_or(0, |(_, order)| *order);
                bodies.push((order, body));
            }
        }
        bodies.sort_by_key(|(order, _)| *order);
        bodies.into_iter().map(|(_, body)| body).collect()
    }

    /// All bytes the proxy sent upstream so far, over every connection.
    pub fn all_to_upstream(&self) -> Vec<u8> {
        self.conns()
            .into_iter()
            .flat_map(|c| c.to_upstream)
            .collect()
    }

    /// All bytes the upstream sent so far, over every connection.
    pub fn all_from_upstream(&self) -> Vec<u8> {
        self.conns()
            .into_iter()
            .flat_map(|c| c.from_upstream)
            .collect()
    }
}

/// Splits raw HTTP/1.1 response bytes into the bodies of the responses (content-length or
/// chunked), as sent, de-chunked, each with the offset in `whole` where its response begins.
fn response_bodies_at(whole: &[u8]) -> Vec<(usize, Vec<u8>)> {
    let mut raw = whole;
    let mut bodies = Vec::new();
    while let Some(end) = find(raw, b"\r\n\r\n") {
        let start = whole.len() - raw.len();
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        raw = &raw[end + 4..];
        let header = |name: &str| {
            head.lines().find_map(|l| {
                l.strip_prefix(&format!("{name}:"))
                    .map(|v| v.trim().to_string())
            })
        };
        let mut body = Vec::new();
        if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            while let Some(line_end) = find(raw, b"\r\n") {
                let size_text = String::from_utf8_lossy(&raw[..line_end]).to_string();
                let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                    .unwrap_or(0);
                raw = &raw[line_end + 2..];
                if size == 0 {
                    raw = raw.get(2..).unwrap_or(&[]);
                    break;
                }
                let take = size.min(raw.len());
                body.extend_from_slice(&raw[..take]);
                raw = raw.get(take + 2..).unwrap_or(&[]);
            }
        } else {
            let len: usize = header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let take = len.min(raw.len());
            body.extend_from_slice(&raw[..take]);
            raw = &raw[take..];
        }
        bodies.push((start, body));
    }
    bodies
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `loopwarden serve` as a user runs it: the real binary, the URL from the line it prints,
/// and its stderr read as it comes (a full pipe would stop the proxy).
pub struct Served {
    pub child: tokio::process::Child,
    pub url: String,
    stderr: tokio::task::JoinHandle<String>,
}

impl Served {
    /// Starts `loopwarden serve --listen 127.0.0.1:0` with `args` and `env` added.
    pub async fn start(args: &[&str], env: &[(&str, String)]) -> Served {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_loopwarden"));
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = lines.next_line().await.unwrap().unwrap();
        let url = line
            .strip_prefix("loopwarden listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let mut pipe = child.stderr.take().unwrap();
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text).await;
            text
        });
        Served { child, url, stderr }
    }

    /// The proxy's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    pub fn sigterm(&self) {
        let pid = self.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the proxy to exit; how it exited and what it wrote on stderr.
    pub async fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = self.child.wait().await.unwrap();
        (status, self.stderr.await.unwrap())
    }

    /// SIGTERM, then a clean exit (the log written out); what it wrote on stderr.
    pub async fn stop(self) -> String {
        self.sigterm();
        let (status, stderr) = self.finish().await;
        assert!(status.success(), "exit status {status:?}: {stderr}");
        stderr
    }
}

/// A port nothing listens on.
pub async fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().port()
}

/// Polls `check` until it holds, for at most 10 s (a bound on waiting, never asserted).
pub async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check()
}

// ---- request bodies, one per API, shaped like the real clients' ----

/// The API a test speaks, with its path and a body builder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Api {
    Chat,
    Responses,
    Anthropic,
    Gemini,
}

pub const ALL_APIS: [Api; 4] = [Api::Chat, Api::Responses, Api::Anthropic, Api::Gemini];

impl Api {
    /// Path (with query) of a conversation request.
    pub fn path(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Api::Chat, _) => "/v1/chat/completions",
            (Api::Responses, _) => "/v1/responses",
            (Api::Anthropic, _) => "/v1/messages?beta=true",
            (Api::Gemini, true) => "/v1beta/models/gemini-3.8-flash:streamGenerateContent?alt=sse",
            (Api::Gemini, false) => "/v1beta/models/gemini-3.8-flash:generateContent",
        }
    }

    /// Auth header of the API (fake key).
    pub fn auth(self, key: &str) -> (&'static str, String) {
        match self {
            Api::Chat | Api::Responses => ("authorization", format!("Bearer {key}")),
            Api::Anthropic => ("x-api-key", key.to_string()),
            Api::Gemini => ("x-goog-api-key", key.to_string()),
        }
    }

    /// A first request: system prompt, the task, a `bash` tool.
    pub fn first_request(self, task: &str, stream: bool) -> Value {
        self.request(task, stream, &[])
    }

    /// A request whose history holds `done` assistant turns, each a `bash` call with
    /// `command` and its result `output`.
    pub fn request(self, task: &str, stream: bool, done: &[(&str, &str)]) -> Value {
        let system = "You are a careful coding agent.";
        match self {
            Api::Chat => {
                let mut messages = vec![
                    json!({"role": "system", "content": system}),
                    json!({"role": "user", "content": task}),
                ];
                for (i, (command, output)) in done.iter().enumerate() {
                    let id = format!("call_{i}");
                    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": id, "type": "function", "function": {"name": "bash",
                         "arguments": json!({"command": command}).to_string()}}]}));
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
                }
                let mut body = json!({"model": "gpt-5.5", "messages": messages,
                    "tools": [{"type": "function", "function": {"name": "bash",
                        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]});
                if stream {
                    body["stream"] = json!(true);
                    body["stream_options"] = json!({"include_usage": true});
                }
                body
            }
            Api::Responses => {
                let mut input = vec![
                    json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": system}]}),
                    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}),
                ];
                for (i, (command, output)) in done.iter().enumerate() {
                    let id = format!("call_{i}");
                    input.push(
                        json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": id,
                        "name": "bash", "arguments": json!({"command": command}).to_string()}),
                    );
                    input.push(
                        json!({"type": "function_call_output", "call_id": id, "output": output}),
                    );
                }
                json!({"model": "gpt-5.5", "stream": stream, "store": false, "input": input,
                    "tools": [{"type": "function", "name": "bash",
                        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]})
            }
            Api::Anthropic => {
                let mut messages =
                    vec![json!({"role": "user", "content": [{"type": "text", "text": task}]})];
                for (i, (command, output)) in done.iter().enumerate() {
                    let id = format!("toolu_{i}");
                    messages.push(json!({"role": "assistant", "content": [
                        {"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}]}));
                    messages.push(json!({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": id, "content": output, "is_error": false}]}));
                }
                json!({"model": "claude-opus-5-5", "max_tokens": 1024, "stream": stream,
                    "system": [{"type": "text", "text": system}], "messages": messages,
                    "tools": [{"name": "bash", "input_schema": {"type": "object"}}]})
            }
            Api::Gemini => {
                let mut contents = vec![json!({"role": "user", "parts": [{"text": task}]})];
                for (command, output) in done {
                    contents.push(json!({"role": "model", "parts": [
                        {"functionCall": {"name": "bash", "args": {"command": command}}}]}));
                    contents.push(json!({"role": "user", "parts": [
                        {"functionResponse": {"name": "bash", "response": {"output": output}}}]}));
                }
                json!({"contents": contents, "systemInstruction": {"parts": [{"text": system}]},
                    "tools": [{"functionDeclarations": [{"name": "bash"}]}]})
            }
        }
    }
}

/// A self-signed certificate for 127.0.0.1 and localhost (P-256, valid until 2126), and its
/// key: test material only, for TLS upstreams and listeners in tests.
pub const TEST_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBmTCCAT6gAwIBAgIUdbVsc6L5NpN/ixob3s4Ffb0CWpYwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyMjE0NDgxOFoYDzIxMjYxMDI5
MTQ0ODE4WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAASnW9u7/Q7E8J2Yb7k/ANEPZHKjJZuJTw/RrJeJY0FyGDKLz1TehCyX
IGxr0dN6IO91hKnPnKZaI1RF07o6rc1Lo2wwajAdBgNVHQ4EFgQUi9wH/O7aOa7x
F7f4603OdXK1yhMwHwYDVR0jBBgwFoAUi9wH/O7aOa7xF7f4603OdXK1yhMwGgYD
VR0RBBMwEYcEfwAAAYIJbG9jYWxob3N0MAwGA1UdEwEB/wQCMAAwCgYIKoZIzj0E
AwIDSQAwRgIhAKHPk/H664HUKOK2DF8DPfYg6b5USkk4J2JPLIRe5NEXAiEA31xA
W/WGTxC7scRKrjCz170ghnAEvDqqS64ehG1MDI4=
-----END CERTIFICATE-----
";

pub const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSyEKH2+xRKdwY9pu
tt/T8btEOSjmfsEPP7amBtiLJSihRANCAASnW9u7/Q7E8J2Yb7k/ANEPZHKjJZuJ
Tw/RrJeJY0FyGDKLz1TehCyXIGxr0dN6IO91hKnPnKZaI1RF07o6rc1L
-----END PRIVATE KEY-----
";
