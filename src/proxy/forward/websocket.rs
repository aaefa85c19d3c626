//! Codex's Responses WebSocket (`GET /v1/responses` with `Upgrade: websocket`), proxied
//! when `server.websocket = "proxy"`.
//!
//! The upgrade goes to the same upstream, path and headers an HTTP request would (on a
//! connection of its own: [`crate::proxy::upstream::Client::upgrade`]); once the upstream agrees,
//! the client gets its 101 and the two sockets are joined frame by frame. A close (or an
//! error) on either side ends both.
//!
//! Each `response.create` frame is read as the HTTP request it stands for: its history is
//! the connection's own earlier frames and the answers relayed to them, found by
//! `previous_response_id` ([`crate::proxy::upstream::response_chain`]), so the frame's few new items are
//! analysed with everything before them, by the same analysis and rulings as HTTP. A
//! reminder goes at the end of the frame's input; a halt is answered on the socket with the
//! events of a streamed Responses halt, and the upstream is not asked. A prewarm frame
//! (`generate: false`) is forwarded and remembered, not analysed. An answer that may
//! complete a loop goes through the same block check as a streamed HTTP answer. Each turn
//! is logged as a request (method `WS`) when its answer ends.
//!
//! The socket holds its connection's place ([`Upgradable`]): it counts at the connection
//! cap while open. The proxy closes it itself (1001, [`Closing`]) when the server stops and
//! no answer is on its way; when no frame has gone either way for
//! `server.websocket_idle_secs` (`upstream.stream_idle_secs` while an answer is on its way);
//! and at the cap, where a socket with no answer on its way is waiting, as an idle
//! keep-alive connection is, and may be closed to make room.
//! Pings are answered by each side's own socket, not relayed.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderValue};
use http::StatusCode;
use http_body::Body as _;
use hyper_util::rt::TokioIo;
use serde_json::value::RawValue;
use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

use super::analysis::Arrival;
use super::app::{App, Place};
use super::block::BlockBody;
use super::body::read_body;
use super::errors::{self, Refusal};
use super::handler::{self as forward, error_chain};
use super::intervention::{self, Guard, Planned};
use super::record::{Capture, Finished, Outcome};
use super::tee::Blocked;
use crate::dialect::responses_socket::{self as socket, Create, Event};
use crate::dialect::{Dialect, UpstreamFailure};
use crate::intervene::{Applied, Effect};
use crate::policy::Traffic;
use crate::proxy::identity;
use crate::proxy::memory::BodyComparison;
use crate::proxy::serve::route::{self, Upstream};
use crate::proxy::serve::{Cut, Serving, Watch};
use crate::proxy::upstream::{Found, Link, ResponseChain};
use crate::request_bytes::RequestBytes;
use crate::store::{next_request_id, now_ms, Label};

/// Answers a connection keeps for `previous_response_id`: Codex continues its last one.
const ANSWERS_PER_CONNECTION: usize = 16;

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// What a socket keeps of the connection it was upgraded from (a request extension, set
/// by the server for upgrade requests): the connection stays open (and counted) while the
/// socket is, serving while an answer is on its way, and the server, stopping, tells the
/// socket and waits for it as for any connection.
#[derive(Clone)]
pub struct Upgradable {
    pub watch: Arc<Watch>,
    /// Turns `true` when the server stops.
    pub stop: tokio::sync::watch::Receiver<bool>,
    /// The end of the stop's grace: the socket is closed then, its turn in flight or not.
    pub cut: Cut,
    /// Held until the socket ends: the server's stop waits for every holder.
    pub open: tokio::sync::mpsc::Sender<()>,
    /// Held until the socket ends: the socket counts as an open connection until then.
    pub place: Arc<Place>,
}

/// The handler of an upgrade: asks the upstream for the same, and on its 101 answers the
/// client's and joins the two sockets (a task of their own). Any other answer of the
/// upstream is the client's answer.
pub async fn open(app: Arc<App>, request: Request) -> Response {
    let started = Instant::now();
    let started_ms = now_ms();
    let (mut parts, _) = request.into_parts();
    let uri = match route::resolve_dots(&parts.uri) {
        Ok(uri) => uri.into_owned(),
        Err(_) => return errors::refused(Upstream::OpenAi, Refusal::ClimbsOut),
    };
    let upstream = route::route(&uri, &parts.headers).upstream;
    let Some(client_key) = parts.headers.get("sec-websocket-key").cloned() else {
        return errors::refused(upstream, Refusal::Unreadable);
    };
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let upgradable = parts.extensions.remove::<Upgradable>();
    let route = route::route(&uri, &parts.headers);
    let target = app.client.target(upstream, route.path, route.query);
    let key = generate_key();
    let Some(outgoing) = upgrade_request(target, &parts.headers, &key) else {
        let message = "loopwarden: cannot build the upstream URL";
        return errors::upstream_failure(upstream, UpstreamFailure::Unreachable, message);
    };
    let client = crate::proxy::upstream::thread_client(&app.client);
    let timeout = Duration::from_secs(app.config.upstream.response_timeout_secs);
    let answer = match tokio::time::timeout(timeout, client.upgrade(upstream, outgoing)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            crate::warn_per_request!(upstream = upstream.as_str(), error = %error_chain(&e), "upstream unreachable for a WebSocket");
            let message = e.unreachable_message(upstream);
            return errors::upstream_failure(upstream, UpstreamFailure::Unreachable, &message);
        }
        Err(_) => {
            let message = "loopwarden: the upstream did not answer the WebSocket upgrade in time";
            return errors::upstream_failure(upstream, UpstreamFailure::Timeout, message);
        }
    };
    let status = answer.status();
    let agreed = status == StatusCode::SWITCHING_PROTOCOLS
        && answer
            .headers()
            .get(header::SEC_WEBSOCKET_ACCEPT)
            .is_some_and(|accept| {
                accept.as_bytes() == derive_accept_key(key.as_bytes()).as_bytes()
            });
    let mut response = Response::new(Body::empty());
    forward::copy_end_to_end_headers(answer.headers(), response.headers_mut());
    log_upgrade(&app, &parts, &uri, status, started, started_ms);
    if !agreed {
        // Refused (a 426 or 401 of its own), or not a WebSocket: the client's answer, and
        // the client's to decide what to do (Codex falls back to HTTP).
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let message = "loopwarden: the upstream's WebSocket handshake is not valid";
            return errors::upstream_failure(upstream, UpstreamFailure::Unreachable, message);
        }
        *response.status_mut() = status;
        *response.body_mut() = Body::new(answer.into_body());
        return response;
    }
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.remove(header::SEC_WEBSOCKET_ACCEPT);
    headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(client_key.as_bytes())) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    let upstream_upgrade = hyper::upgrade::on(answer);
    // From here the connection is the socket's: its reader no longer times it out as an
    // HTTP connection, and the session keeps the socket's own idle time.
    let watch = upgradable.as_ref().map(|u| u.watch.clone());
    if let Some(watch) = &watch {
        watch.become_socket();
    }
    let session = Session {
        app: app.clone(),
        parts,
        uri,
        chain: ResponseChain::new(ANSWERS_PER_CONNECTION, app.config.server.max_body_bytes),
        turn: None,
        watch,
        serving: None,
    };
    let idle = Idle {
        between_turns: Duration::from_secs(app.config.server.websocket_idle_secs),
        in_turn: Duration::from_secs(app.config.upstream.stream_idle_secs),
    };
    crate::spawn::task("websocket", async move {
        // Held while the socket is open: it counts as an open connection until it ends.
        let _held = upgradable
            .as_ref()
            .map(|u| (u.open.clone(), u.place.clone()));
        let (stop, cut) = upgradable.map(|u| (u.stop, u.cut)).unzip();
        let Some(client_upgrade) = client_upgrade else {
            return;
        };
        let (client, upstream) = match tokio::join!(client_upgrade, upstream_upgrade) {
            (Ok(client), Ok(upstream)) => (client, upstream),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "WebSocket upgrade not completed");
                return;
            }
        };
        let client =
            WebSocketStream::from_raw_socket(TokioIo::new(client), Role::Server, None).await;
        let upstream =
            WebSocketStream::from_raw_socket(TokioIo::new(upstream), Role::Client, None).await;
        session.run(client, upstream, stop, cut, idle).await;
    });
    response
}

/// How long a socket may go without a frame either way before it is closed (1001).
#[derive(Debug, Clone, Copy)]
struct Idle {
    /// No answer on its way: `server.websocket_idle_secs`.
    between_turns: Duration,
    /// An answer on its way, the upstream silent: `upstream.stream_idle_secs`, the limit of
    /// a stalled HTTP stream (a thinking model may say nothing for minutes).
    in_turn: Duration,
}

/// Why the proxy closes a socket itself (1001, "going away"); its close frame's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// The server is stopping and no answer is on its way.
    Stopping,
    /// The stop's grace is over.
    Stopped,
    /// No frame either way for [`Idle`]'s limit.
    Idle,
    /// The connection cap needed its place, no answer being on its way.
    Evicted,
}

impl Closing {
    fn reason(self) -> &'static str {
        match self {
            Closing::Stopping => "loopwarden is stopping",
            Closing::Stopped => "loopwarden stopped",
            Closing::Idle => "idle: no frame within server.websocket_idle_secs",
            Closing::Evicted => "closed to make room at server.max_connections",
        }
    }
}

/// Closes both sockets with 1001 and `why`.
async fn close_both(client: &mut Socket, upstream: &mut Socket, why: Closing) {
    let going = || {
        Some(CloseFrame {
            code: CloseCode::Away,
            reason: why.reason().into(),
        })
    };
    let _ = client.close(going()).await;
    let _ = upstream.close(going()).await;
}

/// Resolves when the connection cap evicts the socket (never without a watch).
async fn evicted(watch: Option<&Watch>) {
    match watch {
        Some(watch) => watch.evicted().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the server stops (never without a `stop`).
async fn stopped(stop: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match stop {
        // It only ever changes to `true`, or goes with the server: stopping either way.
        Some(stop) => {
            let _ = stop.changed().await;
        }
        None => std::future::pending().await,
    }
}

/// The upgrade to ask the upstream for: the client's headers as an HTTP request would
/// carry them (`forward::upstream_request`), its own key, and no extension (frames are read
/// here, so no compression is negotiated on either side). `None`: no valid target.
fn upgrade_request(
    target: Option<http::Uri>,
    client_headers: &http::HeaderMap,
    key: &str,
) -> Option<http::Request<crate::proxy::upstream::Outgoing>> {
    let mut headers = client_headers.clone();
    for name in [
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_ACCEPT,
        header::SEC_WEBSOCKET_EXTENSIONS,
    ] {
        headers.remove(name);
    }
    let mut outgoing =
        forward::upstream_request(target, &http::Method::GET, headers, Bytes::new().into())?;
    let headers = outgoing.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    headers.insert(header::SEC_WEBSOCKET_KEY, HeaderValue::from_str(key).ok()?);
    Some(outgoing)
}

/// The upgrade itself in the log: one `GET` row with the upstream's status (the turns
/// that follow get rows of their own).
fn log_upgrade(
    app: &App,
    parts: &http::request::Parts,
    uri: &http::Uri,
    status: StatusCode,
    started: Instant,
    started_ms: i64,
) {
    let route = route::route(uri, &parts.headers);
    let policy = app.policies.current().select(&Traffic::of(
        &parts.headers,
        route.team,
        route.query,
        None,
        false,
    ));
    let team = crate::policy::select::team_of(&parts.headers, route.team);
    let id = identity::stated(&parts.headers, route.conversation)
        .unwrap_or_else(|| identity::fallback(&parts.headers, route.path).in_team(team.as_deref()));
    let mut row = forward::request_row(parts, &route, &policy, id.id, started_ms);
    row.id = next_request_id();
    row.status = i64::from(status.as_u16());
    row.outcome = Outcome::Complete.as_str().into();
    row.proxy_overhead_us = started.elapsed().as_micros() as i64;
    Finished::row_only(row).hand_over(&app.store, &app.metrics, &app.traces);
}

/// One joined pair of sockets and what it remembers.
struct Session {
    app: Arc<App>,
    /// The upgrade request's head: its headers say whose conversation (and policy) each
    /// turn is, as an HTTP request's would.
    parts: http::request::Parts,
    uri: http::Uri,
    /// This connection's answers, by response id.
    chain: ResponseChain,
    /// The `response.create` whose answer is streaming.
    turn: Option<InFlight>,
    /// The connection's watch: the cap evicts the socket through it.
    watch: Option<Arc<Watch>>,
    /// Held while an answer is on its way: the connection is serving then, and between
    /// turns it is waiting, so that at the cap an idle socket makes room as an idle
    /// keep-alive connection does.
    serving: Option<Serving>,
}

/// A `response.create` sent upstream, its answer not yet ended.
struct InFlight {
    /// `None` for a prewarm, which is not a turn of the conversation.
    log: Option<TurnLog>,
    parent: Option<Arc<Link>>,
    /// The frame's own input items, and the answer's output items as the client got them.
    input: Vec<Box<RawValue>>,
    output: Vec<Box<RawValue>>,
    /// Set when the answer may complete a loop: its tool calls are checked before the
    /// client gets them.
    blocking: Option<Blocking>,
}

/// The response-side block check on a socket: the answer's events go through the same
/// [`BlockBody`] as a streamed HTTP answer's, fed frame by frame, and what it lets out is
/// what the client gets (a blocked call replaced by the events of the halt).
struct Blocking {
    feed: Option<tokio::sync::mpsc::UnboundedSender<Bytes>>,
    body: BlockBody<Fed>,
    blocked: Blocked,
}

/// The answer's events as a body, fed as the frames come.
struct Fed(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl http_body::Body for Fed {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|data| data.map(|d| Ok(http_body::Frame::data(d))))
    }
}

impl Blocking {
    fn new(app: &Arc<App>, guard: Guard) -> Blocking {
        let (feed, events) = tokio::sync::mpsc::unbounded_channel();
        let blocked = Blocked::default();
        Blocking {
            feed: Some(feed),
            body: guard.stream(app, Fed(events), blocked.clone()),
            blocked,
        }
    }

    /// The frames the client gets now, given one more from the upstream (`None`: the
    /// answer ended; a call it never completed is let out as it came).
    fn pass(&mut self, frame: Option<(&str, &str)>) -> Vec<String> {
        match frame {
            Some((kind, text)) => {
                if let Some(feed) = &self.feed {
                    let _ = feed.send(Bytes::from(socket::as_sse(kind, text)));
                }
            }
            None => self.feed = None,
        }
        // Everything it can let out is ready: the feed is its only input.
        let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
        let mut out = Vec::new();
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut self.body).poll_frame(&mut cx) {
            if let Ok(data) = frame.into_data() {
                out.extend_from_slice(&data);
            }
        }
        socket::frames_of_sse(&out)
    }
}

/// A turn's log entry, completed when its answer ends.
struct TurnLog {
    finished: Box<Finished>,
    /// The answer's status as HTTP would have it: 200, or what an `error` event reports.
    status: u16,
    sent: Instant,
    /// The answer's events as SSE (what the stream decoder reads); `None` past the cap.
    events: Option<Vec<u8>>,
    response_bytes: usize,
}

/// Where a message goes.
enum Out {
    Upstream(Message),
    Client(Message),
}

impl Session {
    /// Relays until either side closes or fails; then the other is closed too. When the
    /// server stops, both are closed once no answer is on its way.
    async fn run(
        mut self,
        mut client: Socket,
        mut upstream: Socket,
        mut stop: Option<tokio::sync::watch::Receiver<bool>>,
        cut: Option<Cut>,
        idle: Idle,
    ) {
        let mut stopping = false;
        let cut = async move {
            match cut {
                Some(cut) => cut.done().await,
                None => std::future::pending().await,
            }
        };
        let mut cut = std::pin::pin!(cut);
        let watch = self.watch.clone();
        let mut last_frame = tokio::time::Instant::now();
        let quiet = tokio::time::sleep_until(last_frame + idle.between_turns);
        let mut quiet = std::pin::pin!(quiet);
        loop {
            self.serve_while_answering();
            if stopping && self.turn.is_none() {
                close_both(&mut client, &mut upstream, Closing::Stopping).await;
                return;
            }
            let limit = match self.turn {
                Some(_) => idle.in_turn,
                None => idle.between_turns,
            };
            quiet.as_mut().reset(last_frame + limit);
            tokio::select! {
                _ = stopped(&mut stop), if !stopping => stopping = true,
                () = &mut cut => {
                    close_both(&mut client, &mut upstream, Closing::Stopped).await;
                    self.end(Outcome::CutAtShutdown);
                    return;
                }
                () = &mut quiet => {
                    tracing::info!(
                        idle_secs = limit.as_secs(),
                        answer_on_its_way = self.turn.is_some(),
                        "WebSocket closed (1001): no frame either way"
                    );
                    close_both(&mut client, &mut upstream, Closing::Idle).await;
                    self.end(Outcome::UpstreamStalled);
                    return;
                }
                () = evicted(watch.as_deref()) => {
                    tracing::info!("WebSocket closed (1001) to make room at server.max_connections");
                    close_both(&mut client, &mut upstream, Closing::Evicted).await;
                    self.end(Outcome::ClientDisconnected);
                    return;
                }
                message = client.next() => {
                    last_frame = tokio::time::Instant::now();
                    let message = match message {
                        Some(Ok(message)) => message,
                        _ => {
                            let _ = upstream.close(None).await;
                            self.end(Outcome::ClientDisconnected);
                            return;
                        }
                    };
                    let outs = match message {
                        Message::Text(text) => self.on_client_text(text).await,
                        Message::Binary(data) => vec![Out::Upstream(Message::Binary(data))],
                        Message::Close(frame) => {
                            let _ = upstream.send(Message::Close(frame)).await;
                            // Sends the reply to the client's close, queued as it was read.
                            let _ = client.flush().await;
                            self.end(Outcome::ClientDisconnected);
                            return;
                        }
                        // Each side's pings are answered by its own socket.
                        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => Vec::new(),
                    };
                    for out in outs {
                        let sent = match out {
                            Out::Upstream(m) => upstream.send(m).await,
                            Out::Client(m) => client.send(m).await,
                        };
                        if sent.is_err() {
                            let _ = client.close(None).await;
                            let _ = upstream.close(None).await;
                            self.end(Outcome::UpstreamBroken);
                            return;
                        }
                    }
                }
                message = upstream.next() => {
                    last_frame = tokio::time::Instant::now();
                    let message = match message {
                        Some(Ok(message)) => message,
                        _ => {
                            let _ = client.close(None).await;
                            self.end(Outcome::UpstreamBroken);
                            return;
                        }
                    };
                    let outs = match message {
                        Message::Text(text) => self.on_upstream_text(text),
                        Message::Binary(data) => vec![Message::Binary(data)],
                        Message::Close(frame) => {
                            let _ = client.send(Message::Close(frame)).await;
                            let _ = upstream.flush().await;
                            self.end(Outcome::UpstreamBroken);
                            return;
                        }
                        Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                    };
                    for out in outs {
                        if client.send(out).await.is_err() {
                            let _ = upstream.close(None).await;
                            self.end(Outcome::ClientDisconnected);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Holds the connection serving while an answer is on its way, and lets it wait
    /// between turns ([`Session::serving`]).
    fn serve_while_answering(&mut self) {
        match (&self.turn, &self.serving) {
            (Some(_), None) => self.serving = self.watch.as_ref().map(Serving::begin),
            (None, Some(_)) => self.serving = None,
            _ => {}
        }
    }

    /// A text frame from the client: what to send, and to whom.
    async fn on_client_text(&mut self, text: Utf8Bytes) -> Vec<Out> {
        let Some(create) = socket::read_create(&text) else {
            return vec![Out::Upstream(Message::Text(text))];
        };
        let (parent, missing) = match self.chain.find(create.previous_response_id.as_deref()) {
            Found::Start => (None, None),
            Found::Known(link) => (Some(link), None),
            Found::Missing => (None, create.previous_response_id.clone()),
        };
        // An answer the upstream never gave (a halt's) cannot be continued there.
        let resend_whole = parent.as_ref().is_some_and(|p| p.made_here);
        let (body, history_len, whole) = {
            let history = parent.as_ref().map(|p| p.history()).unwrap_or_default();
            let whole = resend_whole.then(|| create.whole(&history));
            (create.http_body(&history), history.len(), whole)
        };
        let original = match whole {
            Some(whole) => Message::Text(whole.into()),
            None => Message::Text(text),
        };
        // A client that sends a new request before the last answer ended has given up on
        // that answer (Codex never does).
        self.end(Outcome::ClientDisconnected);
        if create.prewarm {
            self.turn = Some(InFlight {
                log: None,
                parent,
                input: create.input,
                output: Vec::new(),
                blocking: None,
            });
            return vec![Out::Upstream(original)];
        }
        let started = Instant::now();
        let started_ms = now_ms();
        let body = RequestBytes::from(Bytes::from(body));
        let analysed = Self::analyse(&self.app, &self.parts, &self.uri, &body, started_ms).await;
        let Some((planned, mut finished)) = analysed else {
            return vec![Out::Upstream(original)];
        };
        if let Some(id) = missing {
            let note = crate::proxy::upstream::missing(&id);
            finished.row.parse_error.get_or_insert(note);
        }
        let Planned {
            mut effect,
            held,
            guard,
            ..
        } = planned;
        if let Some(held) = held {
            let (decided, applied) = intervention::decide_held(&self.app, *held).await;
            finished.row.applied = applied.as_str().into();
            effect = decided;
        }
        let message = match effect {
            Effect::Forward | Effect::Hold => original,
            Effect::ForwardModified(rewritten) => {
                match create.rewritten(history_len, &rewritten, resend_whole) {
                    Some(frame) => Message::Text(frame.into()),
                    None => {
                        finished.row.applied = Applied::FailedOpen.as_str().into();
                        original
                    }
                }
            }
            Effect::Answer(reply) => {
                return self.answer(&create, parent, reply.body, finished, started);
            }
        };
        finished.row.proxy_overhead_us = started.elapsed().as_micros() as i64;
        self.turn = Some(InFlight {
            log: Some(TurnLog {
                finished,
                status: 200,
                sent: Instant::now(),
                events: Some(Vec::new()),
                response_bytes: 0,
            }),
            parent,
            input: create.input,
            output: Vec::new(),
            blocking: guard.map(|guard| Blocking::new(&self.app, *guard)),
        });
        vec![Out::Upstream(message)]
    }

    /// Reads the request a frame stands for (`body`) as HTTP's analysis does, and rules on
    /// it: what to do, and its log entry so far. `None` when the body could not be read at
    /// all (it is then forwarded as it came).
    async fn analyse(
        app: &Arc<App>,
        parts: &http::request::Parts,
        uri: &http::Uri,
        body: &RequestBytes,
        started_ms: i64,
    ) -> Option<(Planned, Box<Finished>)> {
        let route = route::route(uri, &parts.headers);
        let headers = &parts.headers;
        let stated = identity::stated(headers, route.conversation);
        let dialect = Some(Dialect::OpenAiResponses);
        let mut earlier = BodyComparison::new(
            &app.analyser.memory,
            dialect,
            stated.as_ref().map(|s| &*s.id),
        );
        let max = app.config.server.max_body_bytes;
        let body = read_body(Body::from(body.to_whole()), max, &mut earlier)
            .await
            .ok()?;
        let policies = app.policies.current();
        let traffic = Traffic::of(
            headers,
            route.team,
            route.query,
            dialect,
            policies.needs_key_id(),
        );
        let select = |model: Option<&str>| {
            policies.select(&Traffic {
                model,
                ..traffic.clone()
            })
        };
        // A conversation new to this process may continue a run another process saw.
        let stated_id = stated.as_ref().map(|s| &*s.id);
        let team = traffic.team.as_deref();
        (app.analyser)
            .recall_stored(&earlier, &body, stated_id, &route, headers, team)
            .await;
        let arrival = Arrival {
            route: &route,
            headers,
            body: &body,
            stated,
            team: traffic.team.as_deref(),
            earlier,
        };
        let mut analysis = forward::analyse(app, arrival, select);
        let request_id = next_request_id();
        let planned = forward::plan(
            app,
            &mut analysis,
            headers,
            &body,
            false,
            request_id,
            traffic.team.as_deref(),
        );
        let mut finished = forward::new_record(
            app,
            parts,
            &route,
            &body,
            analysis,
            planned.applied,
            started_ms,
            traffic.team.as_deref(),
        );
        finished.row.id = request_id;
        finished.row.method = Label::from("WS");
        finished.row.stream = true;
        Some((planned, finished))
    }

    /// Answers a turn with loopwarden's halt (`sse`: the events of a streamed Responses
    /// halt), one frame per event; remembers the answer, so that a frame continuing it is
    /// read (and sent upstream) with it; and logs the turn.
    fn answer(
        &mut self,
        create: &Create,
        parent: Option<Arc<Link>>,
        sse: Vec<u8>,
        mut finished: Box<Finished>,
        started: Instant,
    ) -> Vec<Out> {
        let frames = socket::frames_of_sse(&sse);
        let mut output = Vec::new();
        let mut response_id = None;
        for frame in &frames {
            match socket::read_event(frame).1 {
                Event::ItemDone(item) => output.push(item),
                Event::Ended {
                    response_id: id, ..
                } => response_id = id,
                Event::Other => {}
            }
        }
        if let Some(id) = response_id {
            self.chain
                .remember(id, parent, create.input.clone(), output, true);
        }
        finished.row.status = 200;
        finished.row.outcome = Outcome::Answered.as_str().into();
        finished.row.response_bytes = frames.iter().map(String::len).sum::<usize>() as i64;
        finished.row.proxy_overhead_us = started.elapsed().as_micros() as i64;
        finished.hand_over(&self.app.store, &self.app.metrics, &self.app.traces);
        frames
            .into_iter()
            .map(|f| Out::Client(Message::Text(f.into())))
            .collect()
    }

    /// An event frame from the upstream: read for the history and the log, and what the
    /// client gets for it (the frame as it came, unless the block check holds or replaces
    /// it).
    fn on_upstream_text(&mut self, text: Utf8Bytes) -> Vec<Message> {
        let Some(turn) = self.turn.as_mut() else {
            return vec![Message::Text(text)];
        };
        let (kind, event) = socket::read_event(&text);
        if let Some(log) = turn.log.as_mut() {
            if kind == "error" {
                log.status = socket::error_status(&text).unwrap_or(500);
            }
            log.response_bytes += text.len();
            let cap = self.app.config.server.max_body_bytes;
            if let Some(events) = log.events.as_mut() {
                events.extend_from_slice(&socket::as_sse(&kind, &text));
                if events.len() > cap {
                    log.events = None;
                }
            }
        }
        let ended = match event {
            Event::Ended {
                response_id,
                output,
            } => Some((response_id, output)),
            Event::ItemDone(item) if turn.blocking.is_none() => {
                turn.output.push(item);
                None
            }
            _ => None,
        };
        // An event split over lines would not survive the SSE the check reads (no server
        // sends one): such a frame passes unchecked.
        let sent = match turn
            .blocking
            .as_mut()
            .filter(|_| !text.contains(['\n', '\r']))
        {
            None => vec![Message::Text(text)],
            Some(blocking) => {
                let mut frames = blocking.pass(Some((&kind, &text)));
                if ended.is_some() {
                    frames.extend(blocking.pass(None));
                }
                for frame in &frames {
                    if let Event::ItemDone(item) = socket::read_event(frame).1 {
                        turn.output.push(item);
                    }
                }
                frames
                    .into_iter()
                    .map(|f| Message::Text(f.into()))
                    .collect()
            }
        };
        if let Some((response_id, output)) = ended {
            self.finish_turn(response_id, output);
        }
        sent
    }

    /// The answer of the turn in flight has ended: it is remembered by its id, and the
    /// turn is logged.
    fn finish_turn(&mut self, response_id: Option<String>, output: Vec<Box<RawValue>>) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        let InFlight {
            log,
            parent,
            input,
            output: mut items,
            blocking,
        } = turn;
        let blocked = blocking.and_then(|b| b.blocked.get().cloned());
        // A stream that listed its items only in the final object.
        if items.is_empty() && blocked.is_none() {
            items = output;
        }
        if let Some(id) = response_id {
            // A blocked answer is not the one the upstream gave: a frame continuing it is
            // sent whole.
            let made_here = blocked.is_some();
            self.chain.remember(id, parent, input, items, made_here);
        }
        if let Some(mut log) = log {
            if let Some(decision) = blocked {
                let row = &mut log.finished.row;
                row.decision = Some(decision.action.as_str().into());
                row.applied = Applied::Blocked.as_str().into();
                log.finished.decision = Some(decision);
            }
            self.log_turn(log, Outcome::Complete);
        }
    }

    /// The turn in flight, if any, ends without its answer.
    fn end(&mut self, outcome: Outcome) {
        if let Some(log) = self.turn.take().and_then(|t| t.log) {
            self.log_turn(log, outcome);
        }
    }

    fn log_turn(&self, log: TurnLog, outcome: Outcome) {
        let TurnLog {
            mut finished,
            status,
            sent,
            events,
            response_bytes,
        } = log;
        finished.row.status = i64::from(status);
        finished.row.outcome = outcome.as_str().into();
        finished.row.response_bytes = response_bytes as i64;
        finished.row.upstream_total_us = Some(sent.elapsed().as_micros() as i64);
        if let Some(events) = events.filter(|_| outcome == Outcome::Complete) {
            let capture = Capture {
                dialect: Dialect::OpenAiResponses,
                event_stream: true,
                chunks: vec![Bytes::from(events)],
            };
            finished.settle(capture, &self.app.ledger, now_ms());
        }
        finished.hand_over(&self.app.store, &self.app.metrics, &self.app.traces);
    }
}
