//! Codex's Responses WebSocket through the proxy, over real sockets: frames relayed byte
//! for byte both ways, either side's close reaching the other, a looping conversation
//! nudged inside a frame and then halted on the socket (against the mock, which speaks the
//! socket too), and the upgrade refused with 426 when `server.websocket = "refuse"`.

#![allow(
    clippy::disallowed_methods,
    reason = "the test's own upstream spawns its connections"
)]
#![allow(
    clippy::result_large_err,
    reason = "tungstenite's handshake callback returns its error response"
)]

mod intervene_support;
mod proxy_support;

use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use loopwarden::config::WebSocketMode;
use loopwarden::dialect::Dialect;
use loopwarden::mock::{MockServer, Script, Turn};
use proxy_support::{raw_request, TestProxy};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

type Client = WebSocketStream<TcpStream>;

/// Opens the Responses WebSocket through the proxy at `addr` as Codex does (its headers).
async fn connect(addr: std::net::SocketAddr, conversation: &str) -> Client {
    let request = http::Request::builder()
        .uri(format!("ws://{addr}/v1/responses"))
        .header("host", addr.to_string())
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", generate_key())
        .header("openai-beta", "responses_websockets=2026-02-06")
        .header("authorization", "Bearer sk-test-not-a-key")
        .header("session-id", conversation)
        .header("originator", "codex_exec")
        .body(())
        .unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (ws, response) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    assert_eq!(response.status(), 101);
    ws
}

/// What a WebSocket upstream of the test's own saw: the upgrade's headers and every
/// message, in order.
#[derive(Default)]
struct Seen {
    headers: Vec<(String, String)>,
    messages: Vec<Message>,
}

/// A WebSocket upstream that records what it gets; it answers a text `answer me` with a
/// text and a binary frame, and a text `close me` with a close (code 4000, `done`).
async fn echo_upstream() -> (String, Arc<Mutex<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let headers = record.clone();
                let callback = move |req: &http::Request<()>, resp| {
                    headers.lock().unwrap().headers = req
                        .headers()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
                        .collect();
                    Ok(resp)
                };
                let mut ws = tokio_tungstenite::accept_hdr_async(tcp, callback)
                    .await
                    .unwrap();
                while let Some(Ok(message)) = ws.next().await {
                    record.lock().unwrap().messages.push(message.clone());
                    match message {
                        Message::Text(t) if t.as_str() == "answer me" => {
                            let text = "{\"type\":\"codex.rate_limits\",  \"x\": 1 }  ";
                            ws.send(Message::text(text)).await.unwrap();
                            ws.send(Message::binary(vec![0u8, 1, 2, 255]))
                                .await
                                .unwrap();
                        }
                        Message::Text(t) if t.as_str() == "close me" => {
                            let frame = CloseFrame {
                                code: CloseCode::from(4000),
                                reason: "done".into(),
                            };
                            let _ = ws.send(Message::Close(Some(frame))).await;
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    (url, seen)
}

/// Waits (a bounded number of times) until `check` holds.
async fn until(mut check: impl FnMut() -> bool) -> bool {
    proxy_support::eventually(&mut check).await
}

#[tokio::test]
async fn frames_pass_both_ways_byte_for_byte() {
    let (upstream, seen) = echo_upstream().await;
    let proxy = TestProxy::start(&upstream).await;
    let mut ws = connect(proxy.running.addr(), "ws-relay").await;
    // Frames that are no `response.create` pass as they are, spacing and all.
    let odd = "{\"type\": \"response.processed\",   \"response_id\":\"resp_1\"}\n";
    ws.send(Message::text(odd)).await.unwrap();
    ws.send(Message::binary(vec![9u8, 8, 7])).await.unwrap();
    ws.send(Message::text("answer me")).await.unwrap();
    let first = ws.next().await.unwrap().unwrap();
    let second = ws.next().await.unwrap().unwrap();
    assert_eq!(
        first,
        Message::text("{\"type\":\"codex.rate_limits\",  \"x\": 1 }  ")
    );
    assert_eq!(second, Message::binary(vec![0u8, 1, 2, 255]));
    assert!(until(|| seen.lock().unwrap().messages.len() == 3).await);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(
        seen.messages,
        vec![
            Message::text(odd),
            Message::binary(vec![9u8, 8, 7]),
            Message::text("answer me")
        ]
    );
    let header = |name: &str| {
        seen.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    // The upgrade carried the client's headers, as an HTTP request would; the frames are
    // read here, so no compression was negotiated.
    assert_eq!(header("session-id").as_deref(), Some("ws-relay"));
    assert_eq!(
        header("openai-beta").as_deref(),
        Some("responses_websockets=2026-02-06")
    );
    assert_eq!(
        header("authorization").as_deref(),
        Some("Bearer sk-test-not-a-key")
    );
    assert_eq!(header("sec-websocket-extensions"), None);
    assert_eq!(header("upgrade").as_deref(), Some("websocket"));
    // The upgrade is in the log (its key never is).
    let rows = proxy
        .rows("SELECT method, path, status FROM requests WHERE method = 'GET'")
        .await;
    assert_eq!(
        rows,
        vec![json!({"method": "GET", "path": "/v1/responses", "status": 101})]
    );
    let everything = std::fs::read(proxy.db_path()).unwrap();
    let needle = b"sk-test-not-a-key";
    assert!(!everything.windows(needle.len()).any(|w| w == needle));
}

#[tokio::test]
async fn a_close_on_either_side_closes_the_other() {
    let (upstream, seen) = echo_upstream().await;
    let proxy = TestProxy::start(&upstream).await;
    // The client closes: the upstream gets its close frame.
    let mut ws = connect(proxy.running.addr(), "ws-close-1").await;
    let frame = CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    };
    ws.send(Message::Close(Some(frame.clone()))).await.unwrap();
    assert!(
        until(|| seen
            .lock()
            .unwrap()
            .messages
            .contains(&Message::Close(Some(frame.clone()))))
        .await
    );
    // The upstream closes: the client gets its close frame, then the end.
    let mut ws = connect(proxy.running.addr(), "ws-close-2").await;
    ws.send(Message::text("close me")).await.unwrap();
    let closed = ws.next().await.unwrap().unwrap();
    let Message::Close(Some(got)) = closed else {
        panic!("not a close: {closed:?}")
    };
    assert_eq!((u16::from(got.code), got.reason.as_str()), (4000, "done"));
    assert!(matches!(ws.next().await, None | Some(Err(_))));
}

/// Reads one answer's events off the socket: up to and including its
/// `response.completed` (or `error`).
async fn answer_events(ws: &mut Client) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let message = ws.next().await.unwrap().unwrap();
        let Message::Text(text) = message else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).unwrap();
        let kind = event["type"].as_str().unwrap_or("").to_string();
        events.push(event);
        if kind == "response.completed" || kind == "error" || kind == "response.failed" {
            return events;
        }
    }
}

/// An answer is a whole streamed Responses answer: created first, completed last, its
/// events numbered in order.
fn assert_well_formed(events: &[Value]) {
    assert_eq!(events[0]["type"], "response.created", "{events:#?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["status"], "completed");
    let numbers: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
}

/// The function calls an answer made.
fn calls_of(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| {
            e["type"] == "response.output_item.done" && e["item"]["type"] == "function_call"
        })
        .map(|e| e["item"].clone())
        .collect()
}

/// The text of an answer's messages.
fn text_of(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done" && e["item"]["type"] == "message")
        .filter_map(|e| e["item"]["content"][0]["text"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_loop_over_the_socket_is_nudged_in_a_frame_blocked_then_halted() {
    use intervene_support::{looping_script, FAILURE};
    let mock = MockServer::start(looping_script(Dialect::OpenAiResponses))
        .await
        .unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let mut ws = connect(proxy.running.addr(), "ws-loop").await;
    let fields = json!({"model": "gpt-test", "stream": true, "store": false,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]});
    let frame = |previous: Option<&str>, input: Vec<Value>| {
        let mut frame = fields.clone();
        frame["type"] = json!("response.create");
        frame["input"] = json!(input);
        if let Some(id) = previous {
            frame["previous_response_id"] = json!(id);
        }
        frame.to_string()
    };
    // A prewarm first, as Codex sends it: forwarded, answered empty, not a turn.
    let task = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing test in test_calc.py"}]}),
    ];
    let mut prewarm: Value = serde_json::from_str(&frame(None, task)).unwrap();
    prewarm["generate"] = json!(false);
    ws.send(Message::text(prewarm.to_string())).await.unwrap();
    let events = answer_events(&mut ws).await;
    let mut previous = events.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(calls_of(&events).is_empty());
    // Then the turns: each frame carries only the outputs of the last answer's calls.
    let mut input = Vec::new();
    let mut halt = None;
    for turn in 0..40 {
        ws.send(Message::text(frame(Some(&previous), input.clone())))
            .await
            .unwrap();
        let events = answer_events(&mut ws).await;
        let calls = calls_of(&events);
        if calls.is_empty() {
            halt = Some((turn, events));
            break;
        }
        previous = events.last().unwrap()["response"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        input = calls
            .iter()
            .map(|c| {
                json!({"type": "function_call_output", "call_id": c["call_id"],
                "output": format!("Process exited with code 1\nOutput:\n{FAILURE}\n1 failed")})
            })
            .collect();
    }
    // The loop ends in loopwarden's words: the answer's looping call blocked, replaced by
    // the halt's events.
    let (stopped_at, events) = halt.expect("the loop is stopped");
    assert_well_formed(&events);
    assert!(
        text_of(&events).contains("[loopwarden]"),
        "{}",
        text_of(&events)
    );
    let frames: Vec<_> = mock
        .requests()
        .into_iter()
        .filter(|r| r.method == "WS")
        .collect();
    // With the default engine this loop's looping call is blocked before a request is
    // halted: the blocked answer's request went upstream.
    assert_eq!(frames.len(), 2 + stopped_at, "{frames:#?}");
    assert_eq!(frames[0].answer, "prewarm");
    // Its history was rebuilt from the frames: each turn counted every earlier answer.
    let turns: Vec<usize> = frames[1..].iter().map(|r| r.turn_index).collect();
    assert_eq!(turns, (0..frames.len() - 1).collect::<Vec<_>>());
    // One frame carried the nudge at the end of its own input, continuing the same
    // response; the frame still held the client's items before it.
    let nudged: Vec<Value> = frames
        .iter()
        .map(|r| serde_json::from_slice::<Value>(r.frame.as_ref().unwrap()).unwrap())
        .filter(|f| {
            f["input"]
                .as_array()
                .and_then(|i| i.last())
                .is_some_and(|last| last["role"] == "developer")
        })
        .collect();
    assert!(!nudged.is_empty(), "no frame carried a reminder");
    let first = &nudged[0];
    assert!(first["previous_response_id"].is_string());
    let items = first["input"].as_array().unwrap();
    assert_eq!(items[0]["type"], "function_call_output");
    let reminder = items.last().unwrap()["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(reminder.starts_with("[loopwarden]"), "{reminder}");
    // The client goes on from the answer it got: the conversation is halted, and the halt
    // is answered on the socket, a whole streamed answer; the upstream is not asked.
    let previous = events.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    ws.send(Message::text(frame(Some(&previous), Vec::new())))
        .await
        .unwrap();
    let again = answer_events(&mut ws).await;
    assert_well_formed(&again);
    assert!(calls_of(&again).is_empty());
    assert!(
        text_of(&again).contains("[loopwarden]"),
        "{}",
        text_of(&again)
    );
    let after = mock
        .requests()
        .into_iter()
        .filter(|r| r.method == "WS")
        .count();
    assert_eq!(after, frames.len(), "the halted frame was not forwarded");
    // Each turn is in the log as a request of the conversation the upgrade named.
    let rows = proxy
        .rows(
            "SELECT applied, outcome FROM requests WHERE method = 'WS' \
             AND conversation_id = 'ws-loop' ORDER BY id",
        )
        .await;
    assert_eq!(rows.len(), frames.len(), "{rows:?}");
    assert!(
        rows.contains(&json!({"applied": "nudged", "outcome": "complete"})),
        "{rows:?}"
    );
    assert_eq!(
        rows[rows.len() - 2],
        json!({"applied": "blocked", "outcome": "complete"})
    );
    assert_eq!(
        rows.last().unwrap(),
        &json!({"applied": "halted", "outcome": "answered"})
    );
    let steps = proxy
        .rows("SELECT COUNT(*) AS n FROM tool_calls WHERE conversation_id = 'ws-loop'")
        .await;
    assert!(
        steps[0]["n"].as_i64().unwrap() >= stopped_at as i64 - 1,
        "{steps:?}"
    );
}

/// Sends `request` on a new connection and reads one answer (head, and a body of its
/// `content-length`), leaving the connection open: a refused upgrade need not close it.
async fn one_answer(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, Value) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while got.len() < head_end + length {
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed inside the body");
        got.extend_from_slice(&buf[..n]);
    }
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_slice(&got[head_end..]).unwrap_or(Value::Null);
    (status, head, body)
}

/// The upgrade request Codex opens the Responses API with (its headers, a fake key).
fn codex_upgrade(path: &str, conversation: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\n\
         host: 127.0.0.1\r\n\
         connection: Upgrade\r\n\
         upgrade: websocket\r\n\
         sec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         sec-websocket-extensions: permessage-deflate; client_max_window_bits\r\n\
         openai-beta: responses_websockets=2026-02-06\r\n\
         authorization: Bearer sk-test-not-a-key\r\n\
         session-id: {conversation}\r\n\
         originator: codex_exec\r\n\
         \r\n"
    )
    .into_bytes()
}

#[tokio::test]
async fn an_upgrade_is_refused_with_426_at_once_when_set_to_refuse() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("never asked")]))
        .await
        .unwrap();
    let proxy =
        TestProxy::start_with(&mock.url(), |c| c.server.websocket = WebSocketMode::Refuse).await;
    let (status, head, body) = one_answer(
        proxy.running.addr(),
        &codex_upgrade("/v1/responses", "ws-refused"),
    )
    .await;
    assert_eq!(status, 426, "{head}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("server.websocket"), "{message}");
    assert!(
        mock.requests().is_empty(),
        "nothing reaches the upstream: {:?}",
        mock.requests()
    );
    let rows = proxy
        .rows("SELECT method, path, status, outcome, applied FROM requests")
        .await;
    assert_eq!(
        rows,
        vec![
            json!({"method": "GET", "path": "/v1/responses", "status": 426,
                    "outcome": "rejected", "applied": "rejected"})
        ]
    );
    // A plain GET of the same path is no upgrade: forwarded as before.
    let plain = raw_request(
        proxy.running.addr(),
        b"GET /v1/responses HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_ne!(plain.status, 426, "{}", plain.head);
    assert_eq!(mock.requests().len(), 1);
}

/// The answer of a streamed Responses request over HTTP: its events.
fn sse_events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

#[tokio::test]
async fn previous_response_id_over_http_is_read_with_its_history() {
    use intervene_support::{looping_script, path, FAILURE};
    let mock = MockServer::start(looping_script(Dialect::OpenAiResponses))
        .await
        .unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let url = proxy.url(&path(Dialect::OpenAiResponses, "http-chain", true));
    let client = proxy_support::client();
    let tools =
        json!([{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]);
    // The first request states the task; each later one only the outputs of the last
    // answer's calls, continuing it by id, as a client that lets the API store responses.
    let mut body = json!({"model": "gpt-test", "stream": true, "tools": tools, "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing test in test_calc.py"}]},
    ]});
    let mut sent = Vec::new();
    let mut halted = None;
    for turn in 0..40 {
        let bytes = body.to_string();
        sent.push(bytes.clone());
        let resp = client.post(&url).body(bytes).send().await.unwrap();
        let decision = resp.headers()["x-loopwarden-decision"]
            .to_str()
            .unwrap()
            .to_string();
        let events = sse_events(&resp.bytes().await.unwrap());
        let calls = calls_of(&events);
        if calls.is_empty() {
            halted = Some((turn, decision, text_of(&events)));
            break;
        }
        let id = events.last().unwrap()["response"]["id"].clone();
        let outputs: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({"type": "function_call_output", "call_id": c["call_id"],
                "output": format!("Process exited with code 1\nOutput:\n{FAILURE}\n1 failed")})
            })
            .collect();
        body = json!({"model": "gpt-test", "stream": true, "tools": tools,
                      "previous_response_id": id, "input": outputs});
    }
    let (turn, decision, text) = halted.expect("the chained loop is halted");
    assert!(text.contains("[loopwarden]"), "{text}");
    // Only the answers' ids joined the requests into one history: the loop was seen. It
    // ended with a halt (the request not forwarded) or a block (the answer's looping call
    // replaced by the halt).
    let got = mock.requests();
    let forwarded = if decision == "halt" { turn } else { turn + 1 };
    assert_eq!(got.len(), forwarded, "{decision}");
    // Each request went upstream as the client sent it, but one: the nudge, after the
    // client's own items, the request still continuing the same answer.
    let mut nudges = 0;
    for (request, sent) in got.iter().zip(&sent) {
        if request.body == sent.as_bytes() {
            continue;
        }
        nudges += 1;
        let theirs: Value = serde_json::from_str(sent).unwrap();
        let ours = request.json();
        assert_eq!(ours["previous_response_id"], theirs["previous_response_id"]);
        let items = ours["input"].as_array().unwrap();
        let own = theirs["input"].as_array().unwrap();
        assert_eq!(&items[..own.len()], &own[..]);
        assert_eq!(items.len(), own.len() + 1);
        assert_eq!(items.last().unwrap()["role"], "developer");
    }
    assert!(nudges >= 1, "no request was nudged");
    let rows = proxy
        .rows("SELECT applied FROM requests WHERE conversation_id = 'http-chain' ORDER BY id")
        .await;
    assert!(rows.contains(&json!({"applied": "nudged"})), "{rows:?}");
    let last = rows.last().unwrap()["applied"].clone();
    assert!(last == "halted" || last == "blocked", "{rows:?}");

    // A request that continues an answer the proxy never relayed: forwarded as it came,
    // read from what it has, and the log says so.
    let orphan = json!({"model": "gpt-test", "stream": false, "tools": tools,
        "previous_response_id": "resp_never_relayed",
        "input": [{"type": "function_call_output", "call_id": "call_x", "output": "ok"}]});
    let url = proxy.url(&path(Dialect::OpenAiResponses, "http-orphan", false));
    let resp = client
        .post(&url)
        .body(orphan.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        mock.requests().last().unwrap().body,
        orphan.to_string().as_bytes()
    );
    let rows = proxy
        .rows("SELECT parse, parse_error FROM requests WHERE conversation_id = 'http-orphan'")
        .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["parse"], "parsed");
    let error = rows[0]["parse_error"].as_str().unwrap_or_default();
    assert!(error.contains("resp_never_relayed"), "{error}");
}

#[tokio::test]
async fn a_frame_continuing_an_unknown_answer_is_read_from_its_own_input() {
    let mock = MockServer::start(Script::with_turns(vec![Turn::text("fine")]))
        .await
        .unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let mut ws = connect(proxy.running.addr(), "ws-orphan").await;
    let frame = json!({"type": "response.create", "model": "gpt-test", "stream": true,
        "previous_response_id": "resp_from_another_socket",
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}]})
    .to_string();
    ws.send(Message::text(frame.clone())).await.unwrap();
    let events = answer_events(&mut ws).await;
    assert_eq!(text_of(&events), "fine");
    let got = mock.requests();
    let turn = got.iter().find(|r| r.method == "WS").unwrap();
    assert_eq!(
        turn.frame.as_deref(),
        Some(frame.as_bytes()),
        "sent as it came"
    );
    let rows = proxy
        .rows("SELECT parse, parse_error, outcome FROM requests WHERE method = 'WS'")
        .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["parse"], "parsed");
    assert_eq!(rows[0]["outcome"], "complete");
    let error = rows[0]["parse_error"].as_str().unwrap_or_default();
    assert!(error.contains("resp_from_another_socket"), "{error}");
}

#[tokio::test]
async fn a_stopping_proxy_closes_its_sockets_on_both_sides() {
    let (upstream, seen) = echo_upstream().await;
    let proxy = TestProxy::start(&upstream).await;
    let mut ws = connect(proxy.running.addr(), "ws-stop").await;
    ws.send(Message::text("answer me")).await.unwrap();
    assert!(matches!(ws.next().await, Some(Ok(Message::Text(_)))));
    assert!(matches!(ws.next().await, Some(Ok(Message::Binary(_)))));
    // Stopping closes the socket (once no answer is on its way), telling both sides why.
    proxy.running.shutdown().await.unwrap();
    let closed = ws.next().await.unwrap().unwrap();
    let Message::Close(Some(frame)) = closed else {
        panic!("not a close: {closed:?}")
    };
    assert_eq!(frame.code, CloseCode::Away);
    assert!(
        until(|| seen
            .lock()
            .unwrap()
            .messages
            .iter()
            .any(|m| matches!(m, Message::Close(Some(f)) if f.code == CloseCode::Away)))
        .await
    );
}

/// A turn the echo upstream never answers: sent, its answer stays on its way.
async fn start_unanswered_turn(ws: &mut Client, seen: &Arc<Mutex<Seen>>) {
    let before = seen.lock().unwrap().messages.len();
    let frame = json!({"type": "response.create", "model": "gpt-test", "stream": true,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    assert!(until(|| seen.lock().unwrap().messages.len() > before).await);
}

/// `GET /v1/models` on a new connection: its status.
async fn models_status(addr: std::net::SocketAddr) -> u16 {
    raw_request(
        addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .status
}

/// The next message on `ws` within a bound far above the limits the tests set: the proxy's
/// close, with its code and reason.
async fn close_of(ws: &mut Client) -> CloseFrame {
    let next = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
        .await
        .expect("the proxy did not close the socket");
    match next {
        Some(Ok(Message::Close(Some(frame)))) => frame,
        other => panic!("not a close: {other:?}"),
    }
}

#[tokio::test]
async fn a_socket_with_an_answer_on_its_way_counts_as_a_connection_at_the_cap() {
    let (upstream, seen) = echo_upstream().await;
    let proxy = TestProxy::start_with(&upstream, |c| c.server.max_connections = 1).await;
    let mut ws = connect(proxy.running.addr(), "ws-cap").await;
    start_unanswered_turn(&mut ws, &seen).await;
    // The socket is the one connection, and busy: a new one is refused for the APIs (the
    // places kept beyond the cap serve only the proxy's own paths, health among them).
    assert_eq!(models_status(proxy.running.addr()).await, 503);
    let health = raw_request(
        proxy.running.addr(),
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(health.status, 200, "{}", health.head);
    // Closed, its place is free again: an API request is let through (whatever the
    // upstream then answers a plain GET).
    ws.close(None).await.unwrap();
    let addr = proxy.running.addr();
    let mut status = 503;
    for _ in 0..100 {
        status = models_status(addr).await;
        if status != 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_ne!(status, 503);
}

/// At the cap a socket with no answer on its way is waiting, as an idle keep-alive
/// connection is: the new connection is served, and that socket closed (1001) to make
/// room on both sides, while the busy one stays.
#[tokio::test]
async fn at_the_cap_a_silent_socket_makes_room_and_a_busy_one_does_not() {
    let (upstream, seen) = echo_upstream().await;
    let proxy = TestProxy::start_with(&upstream, |c| c.server.max_connections = 2).await;
    let addr = proxy.running.addr();
    let mut busy = connect(addr, "ws-busy").await;
    start_unanswered_turn(&mut busy, &seen).await;
    let mut silent = connect(addr, "ws-silent").await;
    assert_ne!(
        models_status(addr).await,
        503,
        "the silent socket made room"
    );
    let frame = close_of(&mut silent).await;
    assert_eq!(frame.code, CloseCode::Away);
    assert_eq!(
        frame.reason.as_str(),
        "closed to make room at server.max_connections"
    );
    assert!(
        until(|| seen.lock().unwrap().messages.iter().any(
            |m| matches!(m, Message::Close(Some(f)) if f.reason.as_str().contains("make room"))
        ))
        .await
    );
    // The busy socket still relays.
    busy.send(Message::text("answer me")).await.unwrap();
    assert!(matches!(busy.next().await, Some(Ok(Message::Text(_)))));
}

/// Sockets that never speak are closed (1001) once no frame has gone either way for
/// `server.websocket_idle_secs`, on both sides, and their places are free again: real TCP,
/// the real binary, and the process log says so.
#[tokio::test]
async fn silent_sockets_are_closed_after_the_idle_time_and_free_their_places() {
    let (upstream, seen) = echo_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("loopwarden.toml");
    std::fs::write(
        &config,
        "[server]\nwebsocket_idle_secs = 1\nmax_connections = 3\n",
    )
    .unwrap();
    let db = format!("sqlite://{}", dir.path().join("log.db").display());
    let served = proxy_support::Served::start(
        &["--config", config.to_str().unwrap(), "--db", &db],
        &[("LOOPWARDEN_OPENAI_BASE_URL", upstream)],
    )
    .await;
    let addr: std::net::SocketAddr = served.url.trim_start_matches("http://").parse().unwrap();
    let mut sockets = Vec::new();
    for i in 0..3 {
        sockets.push(connect(addr, &format!("ws-silent-{i}")).await);
    }
    for ws in &mut sockets {
        let frame = close_of(ws).await;
        assert_eq!(frame.code, CloseCode::Away);
        assert_eq!(
            frame.reason.as_str(),
            "idle: no frame within server.websocket_idle_secs"
        );
    }
    assert!(
        until(|| seen
            .lock()
            .unwrap()
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Close(Some(f)) if f.code == CloseCode::Away))
            .count()
            == 3)
        .await
    );
    // Their places are free: three new sockets fit under the cap.
    for i in 0..3 {
        let mut ws = connect(addr, &format!("ws-next-{i}")).await;
        ws.send(Message::text("answer me")).await.unwrap();
        assert!(matches!(ws.next().await, Some(Ok(Message::Text(_)))));
    }
    let stderr = served.stop().await;
    let closed = stderr
        .lines()
        .filter(|l| l.contains("WebSocket closed (1001): no frame either way"))
        .count();
    assert!(closed >= 3, "{stderr}");
}

#[tokio::test]
async fn an_error_event_is_logged_with_the_status_it_reports() {
    use loopwarden::mock::ErrorReply;
    let script = Script::with_turns(vec![Turn {
        error: Some(ErrorReply {
            status: 429,
            body: None,
            headers: Default::default(),
            times: None,
        }),
        ..Turn::text("never")
    }]);
    let mock = MockServer::start(script).await.unwrap();
    let proxy = TestProxy::start(&mock.url()).await;
    let mut ws = connect(proxy.running.addr(), "ws-error").await;
    let frame = json!({"type": "response.create", "model": "gpt-test", "stream": true,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    let events = answer_events(&mut ws).await;
    assert_eq!(events.last().unwrap()["type"], "error");
    assert_eq!(events.last().unwrap()["status"], 429);
    let rows = proxy
        .rows("SELECT status, outcome FROM requests WHERE method = 'WS'")
        .await;
    assert_eq!(rows, vec![json!({"status": 429, "outcome": "complete"})]);
}

/// A turn whose answer never comes when the proxy stops: the socket is closed on both
/// sides at the end of the shutdown grace, and the turn logged `cut_at_shutdown`.
#[tokio::test]
async fn a_turn_still_unanswered_at_the_end_of_the_grace_is_cut_and_logged() {
    // The echo upstream never answers a `response.create`.
    let (upstream, seen) = echo_upstream().await;
    let proxy = TestProxy::start_with(&upstream, |c| c.server.shutdown_grace_secs = 1).await;
    let mut ws = connect(proxy.running.addr(), "ws-cut").await;
    let frame = json!({"type": "response.create", "model": "gpt-test", "stream": true,
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    assert!(until(|| !seen.lock().unwrap().messages.is_empty()).await);
    let db = proxy.db.clone();
    proxy.running.shutdown().await.unwrap();
    let closed = ws.next().await.unwrap().unwrap();
    let Message::Close(Some(frame)) = closed else {
        panic!("not a close: {closed:?}")
    };
    assert_eq!(frame.code, CloseCode::Away);
    assert_eq!(frame.reason.as_str(), "loopwarden stopped");
    let rows = proxy_support::db_rows(
        &db,
        "SELECT outcome FROM requests WHERE conversation_id = 'ws-cut' AND method = 'WS'",
    )
    .await;
    assert_eq!(rows, vec![json!({"outcome": "cut_at_shutdown"})]);
}
