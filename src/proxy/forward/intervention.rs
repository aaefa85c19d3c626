//! Interventions in HTTP terms: a request's ruling carried out ([`plan`]), a held request
//! kept alive and decided ([`held_stream`], [`decide_held`]), a halt reply as a response,
//! and the response-side block check ([`Guard`]). What happens is ruled in
//! [`crate::intervene::ruling`]; this file only turns it into HTTP.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::header::{self, HeaderValue};
use http::StatusCode;

use super::app::App;
use super::block::{BlockBody, Check};
use crate::detect::{Decision, EngineState};
use crate::dialect::{HaltReply, ResponseTurn};
use crate::intervene::pause::Ticket;
use crate::intervene::{Applied, Effect, RequestInfo};
use crate::interventions::ConversationState;
use crate::policy::Policy;

/// A request held for a human.
pub struct Held {
    /// The policy it was held under: its pause settings, and its rulings after the verdict.
    pub policy: Arc<Policy>,
    pub ticket: Ticket,
    pub decision: Decision,
    pub request: RequestInfo<'static>,
    pub request_id: i64,
}

/// A request's ruling carried out, and what the proxy needs to send it.
pub struct Planned {
    /// What to send (never [`Effect::Hold`]: that is `held`).
    pub effect: Effect,
    pub applied: Applied,
    /// The decision acted on (a sticky halt replaces the engine's).
    pub decision: Decision,
    /// Set when the request is held for a human.
    pub held: Option<Box<Held>>,
    /// Set when the response must be checked for a call to block.
    pub guard: Option<Box<Guard>>,
}

/// A request's ruling, carried out. Only called for requests whose history was parsed.
pub fn plan(
    app: &App,
    policy: &Arc<Policy>,
    decision: Decision,
    conversation: &ConversationState,
    state: &EngineState,
    req: &RequestInfo<'_>,
    request_id: i64,
) -> Planned {
    let acted = app
        .interventions
        .plan(policy, decision, conversation, req, request_id);
    let effect = acted.carried.effect;
    let held = matches!(effect, Effect::Hold).then(|| {
        let (ticket, info) = app.interventions.hold(policy, &acted.decision, req);
        let client = crate::proxy::upstream::thread_client(&app.client);
        super::held::notify(&client, &policy.intervene().pause, &info);
        Box::new(Held {
            policy: policy.clone(),
            ticket,
            decision: acted.decision.clone(),
            request: req.to_owned(),
            request_id,
        })
    });
    let forwards = matches!(effect, Effect::Forward | Effect::ForwardModified(_));
    // The state is copied only for the rare response that may complete a loop; boxed (the
    // engine's state is most of its 1.2 KB), so that the futures every request moves carry
    // a pointer, not room for it.
    let guard = (forwards && app.interventions.armed(policy, state)).then(|| {
        Box::new(Guard {
            policy: policy.clone(),
            state: state.clone(),
            request: req.to_owned(),
            request_id,
        })
    });
    Planned {
        effect,
        applied: acted.carried.applied,
        decision: acted.decision,
        held,
        guard,
    }
}

/// Waits for the verdict on a held request; what it chooses, carried out.
pub async fn decide_held(app: &App, held: Held) -> (Effect, Applied) {
    let Held {
        policy,
        ticket,
        decision,
        request,
        request_id,
    } = held;
    let (verdict, by) = app.interventions.verdict(&policy, ticket).await;
    let carried = app
        .interventions
        .after_verdict(&policy, verdict, by, &decision, &request, request_id);
    (carried.effect, carried.applied)
}

/// A held streaming request is answered at once with an SSE stream of `: keep-alive`
/// comments (every `keepalive_secs` of the policy's pause settings); `then` produces the
/// real answer, whose body follows in the same stream.
pub fn held_stream<F>(policy: &Policy, then: F) -> Response
where
    F: std::future::Future<Output = Response> + Send + 'static,
{
    let interval = std::time::Duration::from_secs(policy.intervene().pause.keepalive_secs);
    let body = super::held::keepalive_body(interval, async move { then.await.into_body() });
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
pub fn answer(reply: HaltReply) -> Response {
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
    policy: Arc<Policy>,
    state: EngineState,
    request: RequestInfo<'static>,
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
                    &self.policy,
                    &self.state,
                    &turn,
                    &self.request,
                    self.request_id,
                )
                .map(|(decision, stop)| {
                    let text = self
                        .policy
                        .intervener
                        .halt_text(&decision, stop, &self.request);
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
        let (decision, stop) = app.interventions.check_response(
            &self.policy,
            &self.state,
            &turn,
            &self.request,
            self.request_id,
        )?;
        let reply = self
            .policy
            .intervener
            .halt_reply(&decision, stop, &self.request);
        Some((decision, reply))
    }
}
