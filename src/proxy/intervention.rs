//! The one place where a detection decision becomes what the proxy does with a request,
//! and where a response may be blocked on its way back. The logic lives in
//! [`crate::intervene`]; this file only translates its acts into HTTP.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::StatusCode;

use super::App;
use crate::detect::{Decision, EngineState};
use crate::dialect::{HaltReply, ResponseTurn};
use crate::intervene::block::{BlockBody, Check};
use crate::intervene::pause::Ticket;
use crate::intervene::service::{Before, OwnedRequest};
use crate::intervene::{Act, RequestInfo};

/// What the proxy does with one request.
pub enum Plan {
    /// Forward the client's bytes untouched.
    Forward,
    /// Forward these bytes instead (e.g. the request with a reminder appended).
    ForwardModified(Bytes),
    /// Do not call the upstream: answer the client with this response.
    Answer(Response),
    /// Hold the request until a human (or the timeout) decides.
    Hold(Box<Held>),
}

impl Plan {
    /// How the log names what the proxy did (`requests.applied`, `decisions.applied`);
    /// the intervention log (`interventions.applied`) says what the intervention was.
    pub fn applied(&self) -> &'static str {
        match self {
            Plan::Forward => "forwarded",
            Plan::ForwardModified(_) => "forwarded_modified",
            Plan::Answer(_) => "answered",
            Plan::Hold(_) => "held",
        }
    }
}

/// A request held for a human.
pub struct Held {
    pub ticket: Ticket,
    pub decision: Decision,
    pub request: OwnedRequest,
    pub request_id: i64,
}

/// The decision and plan for one request, and what the response side needs.
pub struct Planned {
    pub plan: Plan,
    /// The decision acted on (a sticky halt replaces the engine's).
    pub decision: Decision,
    /// Set when the response must be checked for a call to block.
    pub guard: Option<Guard>,
}

/// Turns a decision into a plan. Only called for requests whose history was parsed.
pub fn plan(
    app: &App,
    decision: Decision,
    before: &Before,
    state: &EngineState,
    req: &RequestInfo<'_>,
    request_id: i64,
) -> Planned {
    let planned = app.interventions.plan(decision, before, req, request_id);
    let plan = match planned.act {
        Act::Forward => Plan::Forward,
        Act::ForwardModified(bytes) => Plan::ForwardModified(Bytes::from(bytes)),
        Act::Answer(reply) => Plan::Answer(answer(reply)),
        Act::Hold => Plan::Hold(Box::new(Held {
            ticket: app.interventions.hold(&planned.decision, req),
            decision: planned.decision.clone(),
            request: OwnedRequest::of(req),
            request_id,
        })),
    };
    let forwards = matches!(plan, Plan::Forward | Plan::ForwardModified(_));
    // The state is copied only for the rare response that may complete a loop.
    let guard = (forwards && app.interventions.armed(&app.engine, state)).then(|| Guard {
        state: state.clone(),
        request: OwnedRequest::of(req),
        request_id,
    });
    Planned {
        plan,
        decision: planned.decision,
        guard,
    }
}

/// Waits for the verdict on a held request and returns the plan it chooses.
pub async fn decide_held(app: &App, held: Held) -> (Plan, &'static str) {
    let Held {
        ticket,
        decision,
        request,
        request_id,
    } = held;
    let (verdict, by) = app.interventions.verdict(ticket).await;
    let (act, _) =
        app.interventions
            .after_verdict(verdict, by, &decision, &request.info(), request_id);
    let plan = match act {
        Act::Forward | Act::Hold => Plan::Forward,
        Act::ForwardModified(bytes) => Plan::ForwardModified(Bytes::from(bytes)),
        Act::Answer(reply) => Plan::Answer(answer(reply)),
    };
    let applied = plan.applied();
    (plan, applied)
}

/// A held streaming request is answered at once with an SSE stream of `: keep-alive`
/// comments; `then` produces the real answer, whose body follows in the same stream.
pub fn held_stream<F>(app: &Arc<App>, then: F) -> Response
where
    F: std::future::Future<Output = Response> + Send + 'static,
{
    let interval = std::time::Duration::from_secs(app.interventions.config().pause.keepalive_secs);
    let body =
        crate::intervene::pause::keepalive_body(interval, async move { then.await.into_body() });
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::dialect::SSE_CONTENT_TYPE),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A halt reply as an HTTP response: 200, the reply's content type, no caching.
fn answer(reply: HaltReply) -> Response {
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(reply.content_type),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What the response side needs to block a call that completes a loop.
pub struct Guard {
    state: EngineState,
    request: OwnedRequest,
    request_id: i64,
}

impl Guard {
    /// The streamed answer, with tool calls held until complete and checked.
    pub fn stream<B>(
        self,
        app: &Arc<App>,
        upstream: B,
        blocked: super::tee::Blocked,
    ) -> BlockBody<B> {
        let decoder = self.request.dialect.stream_decoder();
        let app = app.clone();
        let check: Check = Box::new(move |calls| {
            let turn = ResponseTurn {
                calls: calls.to_vec(),
                ..ResponseTurn::default()
            };
            app.interventions
                .check_response(
                    &app.engine,
                    &self.state,
                    &turn,
                    &self.request.info(),
                    self.request_id,
                )
                .map(|(decision, text)| {
                    let _ = blocked.set(decision);
                    text
                })
        });
        BlockBody::new(upstream, decoder, check)
    }

    /// A whole JSON answer: `Some((block decision, halt reply))` replaces it when it
    /// carries a call to block.
    pub fn json(self, app: &App, body: &[u8]) -> Option<(Decision, HaltReply)> {
        let turn = self.request.dialect.parse_response(body).ok()?;
        if turn.calls.is_empty() {
            return None;
        }
        let req = self.request.info();
        let (decision, _) = app.interventions.check_response(
            &app.engine,
            &self.state,
            &turn,
            &req,
            self.request_id,
        )?;
        let reply = app.interventions.intervener.halt_reply(&decision, &req);
        Some((decision, reply))
    }
}
