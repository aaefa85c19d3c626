//! The one place where a detection decision becomes what the proxy does with a request.
//!
//! Today every decision is only recorded and the request is forwarded untouched. The
//! interventions work replaces the body of [`plan`] (and nothing else in the proxy): a
//! nudge becomes [`Plan::ForwardModified`] with a reminder appended by the dialect, a halt
//! becomes [`Plan::Answer`] with a reply built by the dialect in the mode the client asked
//! for. The proxy records `Plan::applied()` beside the decision.

use axum::response::Response;
use bytes::Bytes;

use crate::detect::Decision;
use crate::dialect::Dialect;
use crate::transcript::Transcript;

/// What the proxy does with one request.
pub enum Plan {
    /// Forward the client's bytes untouched.
    Forward,
    /// Forward these bytes instead (e.g. the request with a reminder appended).
    ForwardModified(Bytes),
    /// Do not call the upstream: answer the client with this response.
    Answer(Response),
}

impl Plan {
    /// How the log names what was done (`requests.applied`, `decisions.applied`).
    pub fn applied(&self) -> &'static str {
        match self {
            Plan::Forward => "forwarded",
            Plan::ForwardModified(_) => "forwarded_modified",
            Plan::Answer(_) => "answered",
        }
    }
}

/// What [`plan`] may look at besides the decision.
pub struct Context<'a> {
    pub conversation: &'a str,
    pub dialect: Dialect,
    /// The client asked for a streamed answer.
    pub stream: bool,
    /// The request body exactly as the client sent it.
    pub body: &'a Bytes,
    pub transcript: &'a Transcript,
}

/// Turns a decision into a plan. Only called for requests whose history was parsed.
pub fn plan(decision: &Decision, context: &Context<'_>) -> Plan {
    // Decisions are recorded, not yet acted on (issue 4 acts on them).
    let _ = (decision, context);
    Plan::Forward
}
