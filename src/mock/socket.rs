//! The Responses API over a WebSocket, as the mock speaks it: `GET …/responses` upgraded,
//! then each `response.create` frame answered with the events of a streamed Responses
//! answer, one text frame each, from the same script as HTTP.
//!
//! Like the OpenAI server, the mock keeps each connection's answers, so that a frame naming
//! `previous_response_id` (and sending only the items new since) is read with its whole
//! history: the turn is counted on that, as an HTTP request's is on its body. A prewarm
//! (`generate: false`) is answered with an empty completed response.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::server::{answer_as, lock, paced, record, CapturedRequest, Shared};
use super::wire::{self, Api, Reply};
use crate::dialect::responses_socket::{self as socket, Event};
use crate::proxy::upstream::{Found, ResponseChain};

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;
type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Answers a connection remembers.
const ANSWERS_KEPT: usize = 64;

/// A WebSocket upgrade of a Responses path.
pub(super) fn asks_websocket(req: &Request<Incoming>) -> bool {
    req.uri()
        .path()
        .trim_end_matches('/')
        .ends_with("/responses")
        && crate::proxy::serve::route::asks_websocket(req.method(), req.headers())
}

/// Agrees to the upgrade (101) and serves the socket in a task of its own.
pub(super) fn accept(shared: Arc<Shared>, mut req: Request<Incoming>) -> Response<Body> {
    let key = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    let upgrade = hyper::upgrade::on(&mut req);
    let (parts, _) = req.into_parts();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_string(), v)
        })
        .collect();
    let opened = CapturedRequest {
        method: "GET".into(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().map(str::to_string),
        headers,
        body: Bytes::new(),
        api: "openai_responses_websocket".into(),
        turn_index: 0,
        answer: "upgrade".into(),
        frame: None,
    };
    let template = opened.clone();
    record(&shared, opened);
    crate::spawn::task("mock websocket", async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        serve(shared, template, ws).await;
    });
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed_unsync());
    *response.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        "connection",
        hyper::header::HeaderValue::from_static("upgrade"),
    );
    headers.insert(
        "upgrade",
        hyper::header::HeaderValue::from_static("websocket"),
    );
    if let Ok(accept) = hyper::header::HeaderValue::from_str(&key) {
        headers.insert("sec-websocket-accept", accept);
    }
    response
}

/// Answers each `response.create` until the client closes, or a scripted break.
async fn serve(shared: Arc<Shared>, template: CapturedRequest, mut ws: Socket) {
    let chain = ResponseChain::new(ANSWERS_KEPT, 256 << 20);
    while let Some(Ok(message)) = ws.next().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Close(_) => {
                let _ = ws.flush().await;
                return;
            }
            _ => continue,
        };
        let Some(create) = socket::read_create(&text) else {
            continue;
        };
        let parent = match chain.find(create.previous_response_id.as_deref()) {
            Found::Known(link) => Some(link),
            Found::Start | Found::Missing => None,
        };
        let body = {
            let history = parent.as_ref().map(|p| p.history()).unwrap_or_default();
            create.http_body(&history)
        };
        let script = lock(&shared.script).clone();
        let mut captured = CapturedRequest {
            method: "WS".into(),
            body: Bytes::from(body),
            frame: Some(Bytes::copy_from_slice(text.as_bytes())),
            ..template.clone()
        };
        let (frames, turn) = if create.prewarm {
            captured.api = Api::Responses.name().to_string();
            captured.answer = "prewarm".into();
            (prewarm_frames(), None)
        } else {
            let path = template.path.clone();
            let (reply, turn) = answer_as(&shared, &script, &mut captured, Api::Responses, &path);
            (frames_of(reply), turn)
        };
        record(&shared, captured);
        let turn = paced(&script, turn).await;
        let mut output = Vec::new();
        let mut response_id = None;
        for (sent, frame) in frames.into_iter().enumerate() {
            if turn.break_after_events.is_some_and(|n| sent >= n) {
                // A broken answer: the socket ends without a close.
                return;
            }
            if sent > 0 && script.chunk_delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(script.chunk_delay_ms)).await;
            }
            match socket::read_event(&frame).1 {
                Event::ItemDone(item) => output.push(item),
                Event::Ended {
                    response_id: id, ..
                } => response_id = id,
                Event::Other => {}
            }
            if ws.send(Message::Text(frame.into())).await.is_err() {
                return;
            }
        }
        if let Some(id) = response_id {
            chain.remember(id, parent, create.input, output, false);
        }
    }
}

/// A prewarm's answer: created, then completed with no output.
fn prewarm_frames() -> Vec<String> {
    let response = json!({"id": format!("resp_{}", wire::rand_id(24)), "object": "response",
        "status": "completed", "output": [], "usage": {"input_tokens": 0, "output_tokens": 0}});
    let mut created = response.clone();
    created["status"] = json!("in_progress");
    vec![
        json!({"type": "response.created", "sequence_number": 0, "response": created}).to_string(),
        json!({"type": "response.completed", "sequence_number": 1, "response": response})
            .to_string(),
    ]
}

/// A rendered reply as socket frames: a stream's events, each its data; an error as the
/// `error` event the server sends on a socket; a JSON answer as its `response.completed`.
fn frames_of(reply: Reply) -> Vec<String> {
    match reply {
        Reply::Stream { events, .. } => socket::frames_of_sse(&events.concat()),
        Reply::Json { status, body, .. } => {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let frame = if status == 200 {
                json!({"type": "response.completed", "response": body})
            } else {
                json!({"type": "error", "status": status, "error": body.get("error").cloned().unwrap_or(body)})
            };
            vec![frame.to_string()]
        }
    }
}
