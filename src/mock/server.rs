//! The mock's HTTP server: routing by path suffix (any prefix allowed), the request log, and
//! delivery of a reply with the script's pacing and failure knobs.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::history;
use super::script::{Choice, ErrorBudgets, Script, Turn};
use super::wire::{self, Api, Ctx, Reply};

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct CapturedRequest {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// `openai_chat`, `openai_responses`, `anthropic`, `gemini`, `anthropic_count_tokens`,
    /// `gemini_count_tokens`, `models` or `other`.
    pub api: String,
    /// Assistant turns counted in the request's history (0 for non-conversation requests).
    pub turn_index: usize,
    /// What the mock answered: `turn`, `side`, `error`, `prewarm` (a WebSocket frame
    /// with `generate: false`), `upgrade` (a WebSocket opened) or `other`.
    pub answer: String,
    /// A `response.create` frame of the Responses WebSocket, as it arrived (method `WS`);
    /// `body` is then the HTTP request it stands for, its history rebuilt.
    pub frame: Option<Bytes>,
}

impl CapturedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

pub(super) struct Shared {
    pub(super) script: Mutex<Arc<Script>>,
    budgets: Mutex<ErrorBudgets>,
    requests: Mutex<Kept>,
    capture: Option<Mutex<std::fs::File>>,
}

/// The bodies of the requests kept for [`MockServer::requests`] stay under this many bytes,
/// the oldest dropped first: a mock serving a load test (`scripts/bench.sh` drives one with
/// thousands of 2 MB bodies) must not keep them all.
const KEPT_BYTES_MAX: usize = 64 << 20;

/// The most recent requests, and how many were received in all.
#[derive(Default)]
struct Kept {
    requests: std::collections::VecDeque<CapturedRequest>,
    bytes: usize,
    received: usize,
}

/// A running mock model server.
pub struct MockServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl MockServer {
    /// Starts a mock on 127.0.0.1 with a free port.
    pub async fn start(script: Script) -> anyhow::Result<MockServer> {
        Self::start_with(([127, 0, 0, 1], 0).into(), script, None).await
    }

    /// Starts a mock on `addr`, appending one JSON line per request to `capture` if given.
    pub async fn start_with(
        addr: SocketAddr,
        script: Script,
        capture: Option<&std::path::Path>,
    ) -> anyhow::Result<MockServer> {
        let capture = match capture {
            Some(path) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| anyhow::anyhow!("cannot open capture {}: {e}", path.display()))?,
            )),
            None => None,
        };
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            script: Mutex::new(Arc::new(script)),
            budgets: Mutex::new(ErrorBudgets::default()),
            requests: Mutex::new(Kept::default()),
            capture,
        });
        let accept = crate::spawn::task("mock accept", accept_loop(listener, shared.clone()));
        Ok(MockServer {
            addr,
            shared,
            accept,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests received so far, in order: all of them, unless their bodies came to
    /// more than [`KEPT_BYTES_MAX`] (then the most recent ones).
    pub fn requests(&self) -> Vec<CapturedRequest> {
        lock(&self.shared.requests)
            .requests
            .iter()
            .cloned()
            .collect()
    }

    /// Replaces the script and resets the error budgets.
    pub fn set_script(&self, script: Script) {
        *lock(&self.shared.script) = Arc::new(script);
        *lock(&self.shared.budgets) = ErrorBudgets::default();
    }

    /// Stops accepting and drops every open connection (including hanging ones).
    pub async fn shutdown(mut self) {
        self.accept.abort();
        let _ = (&mut self.accept).await;
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A poisoned lock only means another request panicked; the data is still usable.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Connections live in this set, so aborting the loop drops them all.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Why the mock refuses to answer at all: the connection is closed without a response.
#[derive(Debug, thiserror::Error)]
#[error("scripted connection drop")]
struct Dropped;

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Dropped> {
    if super::socket::asks_websocket(&req) {
        return Ok(super::socket::accept(shared, req));
    }
    let (parts, incoming) = req.into_parts();
    let body = match incoming.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(Dropped),
    };
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(str::to_string);
    let method = parts.method.as_str().to_string();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let script = lock(&shared.script).clone();

    let mut captured = CapturedRequest {
        method,
        path,
        query,
        headers,
        body,
        api: "other".to_string(),
        turn_index: 0,
        answer: "other".to_string(),
        frame: None,
    };
    let (reply, turn) = answer(&shared, &script, &mut captured);
    record(&shared, captured);

    let turn = paced(&script, turn).await;
    if turn.break_after_events == Some(0) {
        return Err(Dropped);
    }
    Ok(deliver(
        reply,
        script.chunk_delay_ms,
        turn.break_after_events,
    ))
}

/// Routes the request and builds the reply. Also returns the scripted turn whose delivery
/// knobs (hang, break) apply.
pub(super) fn answer(
    shared: &Shared,
    script: &Script,
    req: &mut CapturedRequest,
) -> (Reply, Option<Turn>) {
    let full_path = req.path.clone();
    let path = full_path.trim_end_matches('/');
    let post = req.method == "POST";
    let api = if !post {
        None
    } else if path.ends_with("/chat/completions") {
        Some(Api::Chat)
    } else if path.ends_with("/responses") {
        Some(Api::Responses)
    } else if path.ends_with("/messages") {
        Some(Api::Anthropic)
    } else if path.ends_with(":generateContent") && path.contains("/models/") {
        Some(Api::Gemini {
            stream: false,
            sse: false,
        })
    } else if path.ends_with(":streamGenerateContent") && path.contains("/models/") {
        let sse = req
            .query
            .as_deref()
            .is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
        Some(Api::Gemini { stream: true, sse })
    } else {
        None
    };

    let Some(api) = api else {
        return (side_endpoint(req, path, post), None);
    };
    answer_as(shared, script, req, api, path)
}

/// The reply to a conversation request of `api`.
pub(super) fn answer_as(
    shared: &Shared,
    script: &Script,
    req: &mut CapturedRequest,
    api: Api,
    path: &str,
) -> (Reply, Option<Turn>) {
    req.api = api.name().to_string();
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    req.turn_index = history::count_turns(api, &body);
    let choice = script.choose(
        req.turn_index,
        &req.body,
        history::has_tools(api, &body),
        &mut lock(&shared.budgets),
    );
    req.answer = choice.kind().to_string();
    let model = script
        .model
        .clone()
        .or_else(|| {
            body.get("model")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .or_else(|| gemini_model(path))
        .unwrap_or_else(|| "mock-model".to_string());
    let ctx = Ctx {
        api,
        body: &body,
        body_len: req.body.len(),
        turn_index: req.turn_index,
        model,
    };
    match choice {
        Choice::Side(text) => (wire::render_turn(&ctx, &Turn::text(&text)), None),
        Choice::Turn(turn) => (wire::render_turn(&ctx, &turn), Some(turn)),
        Choice::Error(error, turn) => (wire::render_error(api, &error), Some(turn)),
    }
}

fn gemini_model(path: &str) -> Option<String> {
    let after = path.rsplit_once("/models/")?.1;
    Some(after.split(':').next()?.to_string())
}

/// Token counting, model lists and anything else: a plausible 200 (404 for unknown POSTs).
fn side_endpoint(req: &mut CapturedRequest, path: &str, post: bool) -> Reply {
    let approx = (req.body.len() / 4).max(1);
    if post && path.ends_with("/messages/count_tokens") {
        req.api = "anthropic_count_tokens".to_string();
        return Reply::json(200, &json!({"input_tokens": approx}));
    }
    if post && path.ends_with(":countTokens") {
        req.api = "gemini_count_tokens".to_string();
        return Reply::json(200, &json!({"totalTokens": approx}));
    }
    if post {
        return Reply::json(
            404,
            &json!({"error": {"message": format!("mock: no such endpoint {path}"), "type": "invalid_request_error"}}),
        );
    }
    if path.ends_with("/models") {
        req.api = "models".to_string();
        let ids = [
            "mock-model",
            "gpt-5.5",
            "claude-opus-5-5",
            "gemini-3.8-flash",
        ];
        return Reply::json(
            200,
            &json!({
                "object": "list",
                "data": ids.iter().map(|id| json!({"id": id, "object": "model", "created": 0,
                    "owned_by": "mock", "type": "model", "display_name": id,
                    "created_at": "2026-01-01T00:00:00Z"})).collect::<Vec<_>>(),
                "has_more": false, "first_id": ids[0], "last_id": ids[ids.len() - 1],
                "models": ids.iter().map(|id| json!({"name": format!("models/{id}"),
                    "displayName": id, "supportedGenerationMethods": ["generateContent", "countTokens"]}))
                    .collect::<Vec<_>>(),
            }),
        );
    }
    if let Some((_, id)) = path.rsplit_once("/models/") {
        req.api = "models".to_string();
        return Reply::json(
            200,
            &json!({"id": id, "object": "model", "created": 0, "owned_by": "mock",
                    "type": "model", "display_name": id, "name": format!("models/{id}")}),
        );
    }
    Reply::json(200, &json!({"ok": true}))
}

/// Waits the script's latency before an answer, and for ever on a turn that hangs; then
/// the turn (a default one for an answer no turn scripted).
pub(super) async fn paced(script: &Script, turn: Option<Turn>) -> Turn {
    if script.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(script.latency_ms)).await;
    }
    let turn = turn.unwrap_or_default();
    if turn.hang {
        std::future::pending::<()>().await;
    }
    turn
}

pub(super) fn record(shared: &Shared, req: CapturedRequest) {
    let seq = {
        let mut kept = lock(&shared.requests);
        kept.received += 1;
        kept.received
    };
    if let Some(file) = &shared.capture {
        let line = capture_line(seq, &req);
        let mut f = lock(file);
        let _ = writeln!(f, "{line}");
        let _ = f.flush();
    }
    let mut kept = lock(&shared.requests);
    kept.bytes += req.body.len();
    kept.requests.push_back(req);
    while kept.bytes > KEPT_BYTES_MAX && kept.requests.len() > 1 {
        if let Some(old) = kept.requests.pop_front() {
            kept.bytes -= old.body.len();
        }
    }
}

/// Header names whose values are secrets; they never reach the capture file.
const SECRET_HEADERS: [&str; 5] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "x-goog-api-key",
    "cookie",
];

/// One line of the capture file. Secrets are redacted; `body_raw` (the body when it is
/// UTF-8) and `body_blake3` let a test compare it byte for byte with what a proxy received.
fn capture_line(seq: usize, req: &CapturedRequest) -> Value {
    let headers: serde_json::Map<String, Value> = req
        .headers
        .iter()
        .map(|(k, v)| {
            let v = if SECRET_HEADERS.contains(&k.as_str()) {
                "[redacted]"
            } else {
                v
            };
            (k.clone(), json!(v))
        })
        .collect();
    let query = req.query.as_deref().map(|q| {
        q.split('&')
            .map(|kv| {
                if kv.starts_with("key=") {
                    "key=[redacted]"
                } else {
                    kv
                }
            })
            .collect::<Vec<_>>()
            .join("&")
    });
    let body = serde_json::from_slice::<Value>(&req.body)
        .unwrap_or_else(|_| json!(String::from_utf8_lossy(&req.body)));
    // The exact bytes too, for readers without blake3 (the e2e runner compares sha256).
    let raw = std::str::from_utf8(&req.body).ok();
    json!({
        "seq": seq, "method": req.method, "path": req.path, "query": query,
        "headers": headers, "body": body, "body_raw": raw, "body_len": req.body.len(),
        "body_blake3": blake3::hash(&req.body).to_hex().as_str(),
        "api": req.api, "turn": req.turn_index, "answer": req.answer,
        "frame": req.frame.as_ref().map(|f| String::from_utf8_lossy(f).into_owned()),
    })
}

/// Sends the reply: JSON at once, a stream event by event with `delay_ms` between events,
/// cut after `break_after` events when asked (the body then ends with an error, which makes
/// hyper drop the connection without the final chunk).
fn deliver(reply: Reply, delay_ms: u64, break_after: Option<usize>) -> Response<Body> {
    let (status, content_type, headers, body) = match reply {
        Reply::Json {
            status,
            headers,
            body,
        } => {
            let body = Full::new(body)
                .map_err(|never: Infallible| match never {})
                .boxed_unsync();
            (status, "application/json", headers, body)
        }
        Reply::Stream {
            content_type,
            headers,
            events,
        } => {
            let state = (events.into_iter(), 0usize, false);
            let stream =
                futures_util::stream::unfold(state, move |(mut events, sent, cut)| async move {
                    if cut {
                        return None;
                    }
                    if break_after.is_some_and(|n| sent >= n) {
                        // Let hyper flush what was sent before the cut; otherwise the events
                        // buffered with the head would be lost with the connection.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let err = std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            "scripted break",
                        );
                        return Some((Err(err), (events, sent, true)));
                    }
                    let event = events.next()?;
                    if sent > 0 && delay_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    }
                    Some((Ok(Frame::data(event)), (events, sent + 1, false)))
                });
            let body = StreamBody::new(stream).boxed_unsync();
            (200, content_type, headers, body)
        }
    };
    let mut builder = Response::builder()
        .status(status)
        .header("content-type", content_type);
    if content_type.starts_with("text/event-stream") {
        builder = builder.header("cache-control", "no-cache");
    }
    for (k, v) in headers {
        builder = builder.header(k, v);
    }
    builder.body(body).unwrap_or_else(|_| {
        // Only a scripted header with an invalid name or value gets here.
        let msg = Full::new(Bytes::from_static(
            b"{\"error\":\"mock: invalid scripted header\"}",
        ));
        let mut resp = Response::new(
            msg.map_err(|never: Infallible| match never {})
                .boxed_unsync(),
        );
        *resp.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        resp
    })
}
