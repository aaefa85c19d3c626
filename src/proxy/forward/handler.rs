//! The request path: read the body once, let [`super::analysis`] read the conversation and
//! decide, let [`intervention::plan`] carry out the ruling on it, forward the original (or
//! rewritten) bytes to the configured upstream, and stream the answer back through the tee.
//!
//! Everything the log needs travels with the response body ([`super::tee::Pending`]) and is
//! handed to the log ([`super::record`]) when the body ends; nothing on this path waits for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};

use super::analysis::{Analysis, Arrival, Logged};
use super::app::App;
use super::body::read_body;
use super::errors;
use super::errors::Refusal;
use super::intervention::{self, Guard, Held, Planned};
use super::record::{Capture, Finished, Outcome, ParseStatus};
use super::tee::{Pending, TeeBody};
use crate::config::WebSocketMode;
use crate::detect::Decision;
use crate::dialect::{compaction, Dialect, HaltReply, UpstreamFailure};
use crate::intervene::{Applied, Effect, RequestInfo};
use crate::policy::select::{user_agent, Client};
use crate::policy::{Mode, Policy, Traffic};
use crate::proxy::identity;
use crate::proxy::memory::BodyComparison;
use crate::proxy::serve::route::{self, Route, Upstream};
use crate::proxy::upstream;
use crate::proxy::upstream::Outgoing;
use crate::proxy::upstream::{HttpRequest, ResponseChain};
use crate::request_bytes::RequestBytes;
use crate::store::{next_request_id, now_ms, ConversationSeen, Label, RequestRow};

pub const DECISION_HEADER: &str = "x-loopwarden-decision";
/// Every answer names the policy its request fell under.
pub const POLICY_HEADER: &str = "x-loopwarden-policy";

/// The proxy handler: every request for a path that is not the proxy's own
/// (`crate::proxy::operator`), but for a WebSocket upgrade that is proxied
/// (`super::websocket::open`).
pub async fn handle(State(app): State<Arc<App>>, request: Request) -> Response {
    let started = Instant::now();
    let started_ms = now_ms();
    let (parts, body) = request.into_parts();
    let resolved = route::resolve_dots(&parts.uri);
    let route = route::route(resolved.as_deref().unwrap_or(&parts.uri), &parts.headers);

    // Who is asking, and the policy each model would put them under.
    let stated = identity::stated(&parts.headers, route.conversation);
    let policies = app.policies.current();
    let dialect = route.dialect.map(|(dialect, _)| dialect);
    let key_id = policies.needs_key_id();
    let traffic = Traffic::of(&parts.headers, route.team, route.query, dialect, key_id);
    let select = |model: Option<&str>| policies.select(&traffic.with_model(model));

    // The body, read once; refused before it is read, or when reading it fails: answered
    // and logged under the policy the path's model (if any) selects.
    let stated_id = stated.as_ref().map(|s| &*s.id);
    let read = match refused_unread(&app, &parts, resolved.is_err(), &body) {
        Some(refusal) => Err(refusal),
        None => read_within_limits(&app, body, dialect, stated_id).await,
    };
    let (body, earlier) = match read {
        Ok(read) => read,
        Err(refusal) => {
            let policy = select(Dialect::model_from_path(route.path));
            return refuse(
                &app, &policy, &parts, &route, stated, refusal, started, started_ms,
            );
        }
    };
    // The client's sending, which the overhead includes: logged apart so that the proxy's
    // own work can be told from it.
    let body_read = started.elapsed();

    // Read and decided (a request that continues an earlier answer, with its history).
    let (continued, whole, earlier) = continuation(&app, dialect, &body, stated_id, earlier).await;
    // A conversation new to this process may continue a run another process saw.
    let team = traffic.team.as_deref();
    let analysed = whole.as_ref().unwrap_or(&body);
    (app.analyser)
        .recall_stored(&earlier, analysed, stated_id, &route, &parts.headers, team)
        .await;
    let arrival = Arrival {
        route: &route,
        headers: &parts.headers,
        body: analysed,
        stated,
        team: traffic.team.as_deref(),
        earlier,
    };
    let mut analysis = analyse(&app, arrival, select);
    drop(policies);

    // The ruling carried out: forwarded, rewritten, answered in the upstream's place, or
    // held for a human.
    let request_id = next_request_id();
    let stream = analysis.stream;
    // Gemini streams a JSON array unless asked for SSE.
    let json_array = stream && analysis.dialect == Some(Dialect::Gemini) && !asks_sse(&route);
    let mut planned = plan(
        &app,
        &mut analysis,
        &parts.headers,
        analysed,
        json_array,
        request_id,
        traffic.team.as_deref(),
    );
    // A rewrite of the whole history, carried over to the request the client sent.
    let continued_whole = continued.as_ref().filter(|_| whole.is_some());
    let effect = carry_over(planned.effect, continued_whole, &mut planned.applied);

    // The log entry that travels with the answer, and (below) the headers the answer carries.
    let policy = analysis.policy.clone();
    // Responses are decoded for the log only when the request itself was read.
    let capture_dialect = analysis.parsed.as_ref().map(|p| p.dialect);
    let applied = planned.applied;
    let team = traffic.team.as_deref();
    let mut finished = new_record(
        &app, &parts, &route, &body, analysis, applied, started_ms, team,
    );
    // The id the intervention log already used for this request.
    finished.row.id = request_id;
    finished.row.body_read_us = Some(body_read.as_micros() as i64);
    if let Some(c) = continued {
        note_continued(&mut finished, c, &app.responses);
    }

    // Sent: now, or once a held request is decided.
    let dispatch = Dispatch {
        app: app.clone(),
        upstream: route.upstream,
        // The URL to send to, worked out once from the route.
        target: app.client.target(route.upstream, route.path, route.query),
        parts,
        body,
        started,
        capture_dialect,
        stamp: Stamp::of(&finished.row, &policy),
    };
    match planned.held {
        Some(held) if stream && !json_array => dispatch.held_stream(&policy, *held, finished),
        // Rare, and its future is large: boxed, so that every request's future (which axum
        // boxes and moves) does not carry room for it.
        Some(held) => Box::pin(dispatch.send_when_decided(*held, finished)).await,
        // Boxed: axum boxes this handler's future and moves it (two copies of its size per
        // request); with the dispatch inline that was ~9 KB each time.
        None => Box::pin(dispatch.send(effect, finished, planned.guard)).await,
    }
}

/// A Gemini request's query asks for SSE (`alt=sse`) rather than a streamed JSON array.
fn asks_sse(route: &Route<'_>) -> bool {
    route
        .query
        .is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"))
}

/// What the log keeps of a request that continues an earlier answer (a Responses request
/// naming it by id): that the answer was not known, and the answer to remember for the
/// next request that continues this one.
fn note_continued(finished: &mut Finished, c: HttpRequest, responses: &Arc<ResponseChain>) {
    if let Some(id) = &c.missing {
        let note = upstream::missing(id);
        finished.row.parse_error.get_or_insert(note);
    }
    finished.chain = c.pending(responses);
}

/// A Responses request that continues an earlier answer by id (`crate::proxy::upstream::response_chain`):
/// the continuation, and its whole history (the earlier answer's and its own) read as a
/// request that sent it all would be, compared with what the conversation sent last (in
/// place of `earlier`; `None` when it cannot be read). The request's own bytes go as they
/// came.
async fn continuation<'a>(
    app: &'a App,
    dialect: Option<Dialect>,
    body: &RequestBytes,
    stated_id: Option<&str>,
    earlier: BodyComparison<'a>,
) -> (
    Option<HttpRequest>,
    Option<RequestBytes>,
    BodyComparison<'a>,
) {
    let continued = match dialect {
        Some(Dialect::OpenAiResponses) => upstream::read_http_or_stored(&app.responses, body).await,
        _ => None,
    };
    let Some(whole) = continued.as_ref().and_then(|c| c.whole.as_ref()) else {
        return (continued, None, earlier);
    };
    let max = app.config.server.max_body_bytes;
    let mut fresh = BodyComparison::new(&app.analyser.memory, dialect, stated_id);
    let read = read_body(Body::from(whole.to_whole()), max, &mut fresh).await;
    (continued, read.ok(), fresh)
}

/// A request's body, read within `server.max_body_bytes` and `server.body_timeout_secs`
/// and compared, as it arrives, with what its conversation sent last (`stated_id`: the
/// conversation its headers name); the refusal when it cannot be read.
async fn read_within_limits<'a>(
    app: &'a App,
    body: Body,
    dialect: Option<Dialect>,
    stated_id: Option<&str>,
) -> Result<(RequestBytes, BodyComparison<'a>), Refusal> {
    let max = app.config.server.max_body_bytes;
    let mut earlier = BodyComparison::new(&app.analyser.memory, dialect, stated_id);
    let idle_secs = app.config.server.body_timeout_secs;
    let body = super::body::with_idle_timeout(body, Duration::from_secs(idle_secs));
    match read_body(body, max, &mut earlier).await {
        Ok(body) => Ok((body, earlier)),
        Err(e) => Err(Refusal::of_body(&e, max, idle_secs)),
    }
}

/// Why a request is refused before a byte of its body is read, if it is: a `CONNECT`, a
/// path that climbs out of its prefix (`climbs_out`), a WebSocket upgrade the config
/// refuses, or a body announced larger than `server.max_body_bytes`.
fn refused_unread(
    app: &App,
    parts: &http::request::Parts,
    climbs_out: bool,
    body: &Body,
) -> Option<Refusal> {
    let max = app.config.server.max_body_bytes;
    if parts.method == http::Method::CONNECT {
        Some(Refusal::Connect)
    } else if climbs_out {
        Some(Refusal::ClimbsOut)
    } else if app.config.server.websocket == WebSocketMode::Refuse
        && route::asks_websocket(&parts.method, &parts.headers)
    {
        Some(Refusal::WebSocket)
    } else if http_body::Body::size_hint(body).lower() > max as u64 {
        // Announced (`Content-Length`): refused before a byte of it is asked for (a client
        // that waits for `100 Continue` never sends it).
        Some(Refusal::TooLarge { max })
    } else {
        None
    }
}

/// A rewrite of a continued request's whole history (`continued`: the request continues
/// an earlier answer and was read with its history), carried over to the request the
/// client sent; when it cannot be, the request goes as it came (`applied` says so).
fn carry_over(effect: Effect, continued: Option<&HttpRequest>, applied: &mut Applied) -> Effect {
    match (effect, continued) {
        (Effect::ForwardModified(rewritten), Some(c)) => match c.rewritten(&rewritten) {
            Some(body) => Effect::ForwardModified(body),
            None => {
                *applied = Applied::FailedOpen;
                Effect::Forward
            }
        },
        (effect, _) => effect,
    }
}

/// Answers a request the proxy refuses, and logs it: in `requests` only, under the id it
/// states or a fallback (it was not read, so it makes no conversation).
#[allow(clippy::too_many_arguments)]
fn refuse(
    app: &App,
    policy: &Policy,
    parts: &http::request::Parts,
    route: &Route<'_>,
    stated: Option<identity::Identity>,
    refusal: Refusal,
    started: Instant,
    started_ms: i64,
) -> Response {
    let response = errors::refused(route.upstream, refusal);
    let team = crate::policy::select::team_of(&parts.headers, route.team);
    let id = stated
        .unwrap_or_else(|| identity::fallback(&parts.headers, route.path).in_team(team.as_deref()));
    let parse = match route.dialect {
        Some(_) => ParseStatus::Unparsed,
        None => ParseStatus::NotConversation,
    };
    let row = RequestRow {
        id: next_request_id(),
        dialect: route.dialect.map(|(d, _)| d.as_str().into()),
        parse: parse.as_str().into(),
        parse_error: Some(refusal.message().into()),
        applied: Applied::Rejected.as_str().into(),
        status: i64::from(refusal.status().as_u16()),
        outcome: Outcome::Rejected.as_str().into(),
        proxy_overhead_us: started.elapsed().as_micros() as i64,
        ..request_row(parts, route, policy, id.id, started_ms)
    };
    Finished::row_only(row).hand_over(&app.store, &app.metrics, &app.traces);
    let mut response = response;
    Stamp {
        conversation: None,
        decision: None,
        policy: policy.header.clone(),
    }
    .apply(&mut response);
    response
}

/// The ruling on a request whose history was read, carried out (a request that was not
/// read is forwarded as it came). The analysis keeps the decision acted on, for the log.
pub(super) fn plan(
    app: &App,
    analysis: &mut Analysis,
    headers: &HeaderMap,
    body: &RequestBytes,
    json_array: bool,
    request_id: i64,
    team: Option<&str>,
) -> Planned {
    let untouched = || Planned {
        effect: Effect::Forward,
        applied: Applied::Forwarded,
        decision: Decision::observe(),
        held: None,
        guard: None,
    };
    // Nothing is done to a request that was not read.
    let Some(p) = analysis.parsed.as_mut() else {
        return untouched();
    };
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let req = RequestInfo {
        conversation: (&*analysis.identity.id).into(),
        dialect: p.dialect,
        stream_path: p.stream_path,
        stream: analysis.stream,
        json_array,
        model: analysis.model.as_deref().map(Into::into),
        user_agent: user_agent.into(),
        team: team.map(Into::into),
        body: std::borrow::Cow::Borrowed(body),
        transcript: std::borrow::Cow::Borrowed(&p.transcript),
        run_steps: p.state.steps(),
    };
    // Nor to a summary request (a stop there would corrupt the summary the run goes on
    // from), unless the run is stopped and the request is not its client's real one: a
    // marker alone is no way through a halt.
    if let Some(marker) = p.compaction.summary {
        let real = || {
            p.repeats_run
                && compaction::instruction_is_last(marker, &p.transcript, || body.to_whole())
        };
        if !app
            .interventions
            .stops(&analysis.policy, &p.conversation, &req)
            || real()
        {
            return untouched();
        }
        p.compacted = None;
    }
    let decision = std::mem::replace(&mut p.decision, Decision::observe());
    let mut planned = intervention::plan(
        app,
        &analysis.policy,
        decision,
        &p.conversation,
        &p.state,
        &req,
        request_id,
    );
    p.decision = std::mem::replace(&mut planned.decision, Decision::observe());
    planned
}

/// The log entry of a request while it is held: written by the drop when the client left
/// before the decision (its future dropped with the connection), so that the request has
/// its row (`held`, `client_disconnected`) like every other, not only its `held`
/// intervention.
struct HeldEntry {
    finished: Option<Box<Finished>>,
    app: Arc<App>,
    /// The held request's id and policy, to tell the pause webhooks it was abandoned.
    ticket: String,
    policy: Arc<Policy>,
    /// The proxy's own time on the request, before the hold.
    overhead: Duration,
}

/// The status logged for a request whose client left before any answer: nginx's "client
/// closed request", which log tools know.
const CLIENT_CLOSED: i64 = 499;

impl Drop for HeldEntry {
    fn drop(&mut self) {
        let Some(mut finished) = self.finished.take() else {
            return;
        };
        finished.row.status = CLIENT_CLOSED;
        finished.row.outcome = Outcome::ClientDisconnected.as_str().into();
        finished.row.proxy_overhead_us = self.overhead.as_micros() as i64;
        let app = &self.app;
        let client = upstream::thread_client(&app.client);
        let pause = &self.policy.intervene().pause;
        super::held::notify_abandoned(&client, pause, &self.ticket, &finished.row.conversation_id);
        finished.hand_over(&app.store, &app.metrics, &app.traces);
    }
}

/// Response headers every answer of a request carries.
#[derive(Clone)]
struct Stamp {
    conversation: Option<HeaderValue>,
    decision: Option<HeaderValue>,
    policy: Option<HeaderValue>,
}

impl Stamp {
    /// The headers of a request's answer, from its log row under `policy`.
    fn of(row: &RequestRow, policy: &Policy) -> Stamp {
        Stamp {
            conversation: HeaderValue::from_str(&row.conversation_id).ok(),
            // What was done to the request: under a shadow policy nothing (`observe`),
            // whatever it would have done (which the log keeps as `would_*`).
            decision: row.decision.as_ref().and_then(|d| match policy.mode {
                Mode::Shadow => Some(HeaderValue::from_static("observe")),
                _ => label_value(d),
            }),
            policy: policy.header.clone(),
        }
    }

    fn apply(&self, response: &mut Response) {
        // Names checked at compile time (`from_static` is const), not on every answer.
        static CONVERSATION: HeaderName = HeaderName::from_static(identity::HEADER);
        static DECISION: HeaderName = HeaderName::from_static(DECISION_HEADER);
        static POLICY: HeaderName = HeaderName::from_static(POLICY_HEADER);
        let headers = response.headers_mut();
        if let Some(v) = &self.conversation {
            headers.insert(CONVERSATION.clone(), v.clone());
        }
        if let Some(v) = &self.decision {
            headers.insert(DECISION.clone(), v.clone());
        }
        if let Some(v) = &self.policy {
            headers.insert(POLICY.clone(), v.clone());
        }
    }
}

/// A label as a header value: a static name (the decisions' vocabulary) without a copy.
fn label_value(label: &Label) -> Option<HeaderValue> {
    match label.as_static() {
        Some(name) => HeaderValue::from_maybe_shared(Bytes::from_static(name.as_bytes())).ok(),
        None => HeaderValue::from_str(label).ok(),
    }
}

/// What sending a request's answer needs: the request, and how to stamp and log the
/// answer.
struct Dispatch {
    app: Arc<App>,
    upstream: Upstream,
    /// Configured base + forwarded path + original query (`None`: not a valid URL).
    target: Option<http::Uri>,
    parts: http::request::Parts,
    body: RequestBytes,
    started: Instant,
    capture_dialect: Option<Dialect>,
    stamp: Stamp,
}

/// The upstream's answer head, as it arrived.
struct Answered {
    response: http::Response<upstream::ResponseBody>,
    sent: Instant,
    headers_at: Instant,
}

impl Dispatch {
    /// A held request whose client asked for a stream: the stream is kept alive with SSE
    /// comments while a human decides, and the answer then follows in it.
    fn held_stream(self, policy: &Policy, held: Held, finished: Box<Finished>) -> Response {
        let stamp = self.stamp.clone();
        let mut response = intervention::held_stream(policy, async move {
            self.send_when_decided(held, finished).await
        });
        stamp.apply(&mut response);
        response
    }

    /// Waits for the decision on a held request (a human's, or the timeout's), then sends
    /// what it came to. The wait is not the proxy's work: `started` moves on by it, so the
    /// request's proxy overhead (its row, `/admin/api/stats`, the latency histogram) counts
    /// the proxy's own time before and after the hold, never a person's minutes.
    async fn send_when_decided(mut self, held: Held, finished: Box<Finished>) -> Response {
        let waiting = Instant::now();
        let mut entry = HeldEntry {
            finished: Some(finished),
            app: self.app.clone(),
            ticket: held.ticket.id().to_string(),
            policy: held.policy.clone(),
            overhead: waiting - self.started,
        };
        let (effect, applied) = intervention::decide_held(&self.app, held).await;
        self.started += waiting.elapsed();
        // The entry is emptied only here and by its drop, so it holds the entry here.
        let Some(mut finished) = entry.finished.take() else {
            let message = "loopwarden: the held request's log entry is gone";
            return errors::upstream_failure(self.upstream, UpstreamFailure::Unreachable, message);
        };
        finished.row.applied = applied.as_str().into();
        self.send(effect, finished, None).await
    }

    /// Sends what a ruling came to: loopwarden's own answer, or the upstream's to the
    /// original or a rewritten body, streamed back through the tee (and the block check
    /// when `guard`).
    async fn send(
        mut self,
        effect: Effect,
        finished: Box<Finished>,
        guard: Option<Box<Guard>>,
    ) -> Response {
        let body = match effect {
            // A held request is sent only once decided: `Hold` does not reach here.
            Effect::Forward | Effect::Hold => std::mem::take(&mut self.body),
            Effect::ForwardModified(modified) => RequestBytes::from(Bytes::from(modified)),
            Effect::Answer(reply) => return self.answer(reply, finished),
        };
        match self.call_upstream(body).await {
            Ok(answered) => self.relay(answered, finished, guard).await,
            Err((failure, sent)) => self.fail(finished, failure, sent),
        }
    }

    /// Answers with loopwarden's own reply (a halt); the upstream is not called.
    fn answer(self, reply: HaltReply, mut finished: Box<Finished>) -> Response {
        let mut response = intervention::answer(reply);
        finished.row.status = response.status().as_u16() as i64;
        finished.row.outcome = Outcome::Answered.as_str().into();
        finished.row.proxy_overhead_us = self.started.elapsed().as_micros() as i64;
        finished.hand_over(&self.app.store, &self.app.metrics, &self.app.traces);
        self.stamp.apply(&mut response);
        response
    }

    /// Sends `body` upstream and waits for the answer's head (at most the configured
    /// response timeout); on failure, what to answer instead and when the request was sent.
    async fn call_upstream(
        &mut self,
        body: RequestBytes,
    ) -> Result<Answered, (Failure, Option<Instant>)> {
        let upstream = self.upstream;
        let client = upstream::thread_client(&self.app.client);
        // The client's headers are not needed past this point: moved, not copied.
        let headers = std::mem::take(&mut self.parts.headers);
        let Some(request) = upstream_request(self.target.take(), &self.parts.method, headers, body)
        else {
            // Unreachable in practice: the base URL was validated and the path came from a
            // valid URI. Answer like an unreachable upstream rather than panic.
            let message = "loopwarden: cannot build the upstream URL";
            return Err((Failure::unreachable(upstream, message), None));
        };
        let sent = Instant::now();
        let timeout = Duration::from_secs(self.app.config.upstream.response_timeout_secs);
        match tokio::time::timeout(timeout, client.send(upstream, request)).await {
            Ok(Ok(response)) => Ok(Answered {
                response,
                sent,
                headers_at: Instant::now(),
            }),
            Ok(Err(e)) => {
                crate::warn_per_request!(upstream = upstream.as_str(), error = %error_chain(&e), "upstream unreachable");
                let message = e.unreachable_message(upstream);
                Err((Failure::unreachable(upstream, &message), Some(sent)))
            }
            Err(_) => {
                crate::warn_per_request!(
                    upstream = upstream.as_str(),
                    timeout_secs = timeout.as_secs(),
                    "upstream timed out"
                );
                let message = format!(
                    "loopwarden: the {} upstream did not answer in time",
                    upstream.as_str()
                );
                let response =
                    errors::upstream_failure(upstream, UpstreamFailure::Timeout, &message);
                let failure = Failure {
                    response,
                    outcome: Outcome::UpstreamTimeout,
                };
                Err((failure, Some(sent)))
            }
        }
    }

    /// The upstream's answer to the client: its head at once, its body through the tee,
    /// which completes the log entry when the body ends.
    async fn relay(
        self,
        answered: Answered,
        mut finished: Box<Finished>,
        guard: Option<Box<Guard>>,
    ) -> Response {
        let Answered {
            response: upstream_response,
            sent,
            headers_at,
        } = answered;
        let (mut up_parts, up_body) = upstream_response.into_parts();
        let event_stream = is_event_stream(&up_parts.headers);
        // Decode only answers the dialect can read: successful and not content-encoded.
        let readable = up_parts.status.is_success()
            && !up_parts.headers.contains_key(header::CONTENT_ENCODING);
        let mut response = Response::new(Body::empty());
        *response.status_mut() = up_parts.status;
        *response.headers_mut() = end_to_end_headers(&mut up_parts.headers);
        self.stamp.apply(&mut response);

        finished.row.status = up_parts.status.as_u16() as i64;
        finished.row.stream |= event_stream;
        finished.row.upstream_latency_us = Some((headers_at - sent).as_micros() as i64);
        let capture = self
            .capture_dialect
            .filter(|_| readable)
            .map(|dialect| Capture {
                dialect,
                event_stream,
                chunks: Vec::new(),
            });
        finished.row.proxy_overhead_us =
            ((sent - self.started) + headers_at.elapsed()).as_micros() as i64;
        // The block check reads only answers it can decode, and only when a block is possible.
        let store = super::tee::Sinks::of(&self.app);
        let body = match guard.filter(|_| capture.is_some()) {
            None => Body::new(TeeBody::new(
                up_body,
                Pending::new(finished, store, sent, capture),
            )),
            Some(guard) if event_stream => {
                let mut pending = Pending::new(finished, store, sent, capture);
                let blocked = pending.blocked.insert(Default::default()).clone();
                Body::new(TeeBody::new(
                    guard.stream(&self.app, up_body, blocked),
                    pending,
                ))
            }
            Some(guard) => {
                let whole = match self.read_whole(up_body).await {
                    Ok(whole) => whole,
                    Err(failure) => return self.fail(finished, failure, Some(sent)),
                };
                let whole = match guard.json(&self.app, &whole) {
                    Some((decision, reply)) => {
                        finished.row.applied = Applied::Blocked.as_str().into();
                        finished.row.decision = Some(decision.action.as_str().into());
                        finished.decision = Some(decision);
                        replace_by_block(response.headers_mut(), reply.content_type);
                        Bytes::from(reply.body)
                    }
                    None => whole,
                };
                let full =
                    Full::new(whole).map_err(|never: std::convert::Infallible| match never {});
                Body::new(TeeBody::new(
                    full,
                    Pending::new(finished, store, sent, capture),
                ))
            }
        };
        *response.body_mut() = body;
        response
    }

    /// A whole JSON answer, read for the block check (the client waits for all of it
    /// anyway); the failure to answer when it broke off.
    async fn read_whole(&self, body: upstream::ResponseBody) -> Result<Bytes, Failure> {
        match Limited::new(body, self.app.config.server.max_body_bytes)
            .collect()
            .await
        {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) => {
                crate::warn_per_request!(error = %e, "upstream answer broke off while checked for a block");
                let outcome = e
                    .downcast_ref::<upstream::BodyError>()
                    .map_or(Outcome::UpstreamBroken, Outcome::of_body_error);
                Err(Failure {
                    outcome,
                    ..Failure::unreachable(
                        self.upstream,
                        "loopwarden: the upstream answer broke off",
                    )
                })
            }
        }
    }

    /// Answers with `failure` and logs the request, which ended before any upstream body.
    fn fail(
        self,
        mut finished: Box<Finished>,
        failure: Failure,
        sent: Option<Instant>,
    ) -> Response {
        let Failure {
            mut response,
            outcome,
        } = failure;
        let waited = sent.map(|s| s.elapsed()).unwrap_or_default();
        finished.row.status = i64::from(response.status().as_u16());
        finished.row.outcome = outcome.as_str().into();
        finished.row.upstream_latency_us = sent.map(|_| waited.as_micros() as i64);
        finished.row.proxy_overhead_us =
            self.started.elapsed().saturating_sub(waited).as_micros() as i64;
        finished.hand_over(&self.app.store, &self.app.metrics, &self.app.traces);
        self.stamp.apply(&mut response);
        response
    }
}

/// The headers of an answer replaced by the halt reply of a block.
fn replace_by_block(headers: &mut HeaderMap, content_type: &'static str) {
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::CONTENT_ENCODING);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        HeaderName::from_static(DECISION_HEADER),
        HeaderValue::from_static("block"),
    );
}

/// The proxy's analysis of an arrived request: the policy `select` picks, and the
/// conversation's standing as the interventions hold it (an HTTP request or a WebSocket
/// turn alike).
pub(super) fn analyse(
    app: &App,
    arrival: Arrival<'_>,
    select: impl FnOnce(Option<&str>) -> Arc<Policy>,
) -> Analysis {
    app.analyser.analyse(
        arrival,
        select,
        |policy, conversation, transcript, continued| {
            app.interventions
                .conversation_state(policy, conversation, transcript, continued)
        },
    )
}

/// The log entry of a request, before its response is known. `team`: the one the request
/// names (`crate::policy::select::team_of`, read once for its policy).
#[allow(clippy::too_many_arguments)]
pub(super) fn new_record(
    app: &App,
    parts: &http::request::Parts,
    route: &Route<'_>,
    body: &RequestBytes,
    analysis: Analysis,
    applied: Applied,
    started_ms: i64,
    team: Option<&str>,
) -> Box<Finished> {
    let Analysis {
        policy,
        identity,
        dialect,
        model,
        stream,
        parse,
        parse_error,
        parsed,
    } = analysis;
    let (compaction, stated_id) = match &parsed {
        // A history the API compacted is logged as continuing from that compaction: no
        // summary request of the client's marks it.
        Some(p) => (
            p.compaction
                .summary
                .or(p.compaction.continuation.filter(|m| m.server_side())),
            p.stated_id.clone(),
        ),
        // A summary request the proxy does not read (Codex's `POST /responses/compact`)
        // is forwarded as it came, and logged as what it is.
        None => {
            let markers =
                crate::dialect::compaction::recognize(route.path, &parts.headers, &[], None);
            (markers.summary, None)
        }
    };
    let (steps, decision, history, next_step) = match parsed {
        Some(p) => {
            let (logged, decision) = app.analyser.keep(p);
            let Logged { next_step, history } = logged;
            (Some(next_step as i64), Some(decision), history, next_step)
        }
        None => (None, None, Default::default(), 0),
    };
    let row = RequestRow {
        dialect: dialect.map(|d| d.as_str().into()),
        model: model.clone(),
        stream,
        parse: parse.as_str().into(),
        parse_error,
        steps,
        decision: decision.as_ref().map(|d| d.action.as_str().into()),
        applied: applied.as_str().into(),
        request_bytes: body.len() as i64,
        compaction: compaction.map(|m| m.as_str().into()),
        stated_id,
        ..request_row(parts, route, &policy, identity.id.clone(), started_ms)
    };
    let conversation = parse.is_conversation().then(|| ConversationSeen {
        id: identity.id,
        id_source: identity.source.as_str().into(),
        // The policies' name of the client (`match.client`), the one vocabulary of the
        // log, the admin API and the dashboard.
        client: Some(Client::of(user_agent(&parts.headers)).as_str().into()),
        dialect: dialect.map(|d| d.as_str().into()),
        model,
        at_ms: started_ms,
        // Known once the response has ended: `super::record`.
        overhead_us: 0,
        team: team.map(str::to_string),
    });
    Box::new(Finished {
        row,
        conversation,
        decision,
        history,
        next_step,
        log_content: policy.log.content,
        response: None,
        chain: None,
    })
}

/// A request's log row as far as its request line tells: what the request was, nothing yet
/// of what came of it.
pub(super) fn request_row(
    parts: &http::request::Parts,
    route: &Route<'_>,
    policy: &Policy,
    conversation_id: String,
    started_ms: i64,
) -> RequestRow {
    RequestRow {
        id: 0, // the caller's `next_request_id()`
        conversation_id,
        started_ms,
        method: method_label(&parts.method),
        path: route.path.to_string(),
        upstream: route.upstream.as_str().into(),
        dialect: None,
        model: None,
        stream: false,
        parse: ParseStatus::NotConversation.as_str().into(),
        parse_error: None,
        steps: None,
        decision: None,
        applied: Applied::Forwarded.as_str().into(),
        status: 0,
        outcome: "".into(),
        request_bytes: 0,
        response_bytes: 0,
        upstream_latency_us: None,
        upstream_total_us: None,
        proxy_overhead_us: 0,
        body_read_us: None,
        input_tokens: None,
        output_tokens: None,
        stop_reason: None,
        cached_input_tokens: None,
        cache_write_tokens: None,
        cost_usd: None,
        policy: Some(Label::from(policy.name.clone())),
        compaction: None,
        stated_id: None,
    }
}

/// The log's name of a request method: the methods a model API is called with need no
/// allocation.
fn method_label(method: &http::Method) -> Label {
    const KNOWN: [(http::Method, &str); 4] = [
        (http::Method::POST, "POST"),
        (http::Method::GET, "GET"),
        (http::Method::PUT, "PUT"),
        (http::Method::DELETE, "DELETE"),
    ];
    match KNOWN.iter().find(|(m, _)| m == method) {
        Some((_, name)) => Label::from(*name),
        None => Label::from(method.as_str().to_owned()),
    }
}

/// An answer the proxy gives in place of the upstream's, and how the log names it.
struct Failure {
    response: Response,
    outcome: Outcome,
}

impl Failure {
    /// The upstream could not be reached (or its answer could not be read): a 502.
    fn unreachable(upstream: Upstream, message: &str) -> Failure {
        Failure {
            response: errors::upstream_failure(upstream, UpstreamFailure::Unreachable, message),
            outcome: Outcome::UpstreamUnreachable,
        }
    }
}

/// The request to the upstream: `target` (configured base + forwarded path + original
/// query), the client's end-to-end `headers` (the proxy's own and the hop-by-hop ones taken
/// out), and `body`. `Host` is the upstream client's to set; `Content-Length` hyper's.
pub(super) fn upstream_request(
    target: Option<http::Uri>,
    method: &http::Method,
    mut headers: HeaderMap,
    body: RequestBytes,
) -> Option<http::Request<Outgoing>> {
    let target = target?;
    let listed = connection_listed(&headers);
    let unwanted: Vec<HeaderName> = headers
        .keys()
        .filter(|name| {
            is_hop_by_hop(name)
                || listed.contains(name)
                || *name == header::HOST
                || *name == header::CONTENT_LENGTH
                || *name == header::EXPECT
                || name.as_str().starts_with("x-loopwarden-")
        })
        .cloned()
        .collect();
    for name in &unwanted {
        headers.remove(name);
    }
    // A browser's dashboard session is the proxy's, never the upstream's.
    crate::own_cookie::strip(&mut headers);
    let mut request = http::Request::new(Outgoing::new(body));
    *request.method_mut() = method.clone();
    *request.uri_mut() = target;
    *request.headers_mut() = headers;
    Some(request)
}

/// The headers of an answer to pass on: the upstream's own map, taken whole when it holds
/// nothing to drop (no copy of each header), else its end-to-end headers copied in order.
/// Room is left for the stamp's three.
fn end_to_end_headers(from: &mut HeaderMap) -> HeaderMap {
    let drops_some = from.contains_key(header::CONNECTION) || from.keys().any(is_hop_by_hop);
    if !drops_some {
        let mut kept = std::mem::take(from);
        // Room only: a map that cannot grow takes the stamps as it can.
        let _ = kept.try_reserve(3);
        return kept;
    }
    let mut to = HeaderMap::try_with_capacity(from.len() + 3).unwrap_or_default();
    copy_end_to_end_headers(from, &mut to);
    to
}

pub(super) fn copy_end_to_end_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let dropped = connection_listed(from);
    for (name, value) in from {
        if !is_hop_by_hop(name) && !dropped.contains(name) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Headers that concern one connection only (RFC 9110 §7.6.1), never forwarded.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Headers the `Connection` header names as hop-by-hop.
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// An error and its causes on one line (connection errors hide the cause in the source).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_keeps_its_end_to_end_headers_in_order_taken_or_copied() {
        let pairs = |map: &HeaderMap| -> Vec<(String, String)> {
            map.iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
                .collect()
        };
        let map = |list: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (n, v) in list {
                m.append(*n, HeaderValue::from_static(v));
            }
            m
        };
        // Nothing to drop: the map itself, as it was.
        let plain = [
            ("date", "x"),
            ("x-b", "1"),
            ("content-type", "text/event-stream"),
            ("x-b", "2"),
            ("server", "s"),
        ];
        let mut from = map(&plain);
        assert_eq!(pairs(&end_to_end_headers(&mut from)), pairs(&map(&plain)));
        // Hop-by-hop headers and those `Connection` names: dropped, the rest in order.
        let mut from = map(&[
            ("connection", "keep-alive, x-hop"),
            ("x-a", "1"),
            ("keep-alive", "timeout=5"),
            ("x-hop", "h"),
            ("transfer-encoding", "chunked"),
            ("x-c", "3"),
        ]);
        assert_eq!(
            pairs(&end_to_end_headers(&mut from)),
            pairs(&map(&[("x-a", "1"), ("x-c", "3")]))
        );
    }

    #[test]
    fn a_method_is_logged_by_its_name_whether_known_or_not() {
        for m in ["POST", "GET", "PUT", "DELETE", "PATCH", "PROPFIND"] {
            let method = http::Method::from_bytes(m.as_bytes()).unwrap();
            assert_eq!(method_label(&method).as_str(), m);
        }
    }
}
