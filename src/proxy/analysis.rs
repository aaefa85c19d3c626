//! The analysis of one request: the one sequence the proxy ([`super::forward`]) and the
//! benchmarks (`benches/support`) run, so that what is measured is what serves. In order:
//!
//! 1. bytes → dialect: the body's top level is read, resumed after the conversation's last
//!    request ([`BodyComparison`] found it while the body arrived: [`super::memory`] holds
//!    everything that makes a request cost work for its new messages only);
//! 2. dialect → transcript: each message parsed once ([`super::memory::MessageCache`]), the last
//!    request's transcript continued with the new ones;
//! 3. transcript → identity: the one the request states, else its head's hash, else a
//!    fallback per client and endpoint;
//! 4. model → policy: the caller's choice (`crate::policy`), now that the model is known;
//! 5. identity → standing: sticky halts and operator resumes, as store facts for the engine;
//! 6. transcript → actions → detectors → the policy's engine: the conversation's cached fold
//!    continued with the new steps only, and its [`Decision`].
//!
//! Then the request is ruled on (`crate::intervene::ruling`) and forwarded; when its log
//! entry is made, [`Analyser::keep`] hands over the steps new to the log and keeps the
//! request as its conversation's last one. A body that is not read (not a conversation
//! endpoint, or not parseable) gets no decision and is forwarded untouched.

use std::sync::Arc;

use http::HeaderMap;

use super::identity::{self, Identity};
use super::memory::{
    BodyComparison, History, LastRequest, Memory, NewSteps, Predecessor, Recall, Recalled,
};
use super::record::ParseStatus;
use super::route::Route;
use crate::detect::{Decision, EngineState};
use crate::dialect::Dialect;
use crate::intervene::service::ConversationState;
use crate::policy::Policy;
use crate::request_bytes::RequestBytes;
use crate::store::redact::summary;
use crate::throttle::Throttle;
use crate::transcript::Transcript;

/// The warning for a body that cannot be read: a client can send one with each request,
/// so it is written once per 10 s at most (every such request has its row with its
/// `parse_error` all the same).
static UNPARSED_WARNING: Throttle = Throttle::new(10_000);

/// What the analysis keeps between requests, so that each costs work for its new messages
/// and steps only.
pub struct Analyser {
    pub memory: Memory,
}

/// A request as it reaches the analysis: its route, headers and body, the identity it
/// states, and what [`BodyComparison`] found while the body arrived.
pub struct Arrival<'a> {
    pub route: &'a Route<'a>,
    pub headers: &'a HeaderMap,
    pub body: &'a RequestBytes,
    pub stated: Option<Identity>,
    /// The team the request names (`/t/{team}`, `x-loopwarden-team`): the namespace of the
    /// identities the proxy derives ([`Identity::in_team`]).
    pub team: Option<&'a str>,
    pub earlier: BodyComparison<'a>,
}

/// What the analysis made of a request.
pub struct Analysis {
    /// The policy the request falls under.
    pub policy: Arc<Policy>,
    pub identity: Identity,
    pub dialect: Option<Dialect>,
    pub model: Option<String>,
    pub stream: bool,
    pub parse: ParseStatus,
    pub parse_error: Option<crate::store::Masked>,
    pub parsed: Option<Parsed>,
}

/// A request whose history was read.
pub struct Parsed {
    pub dialect: Dialect,
    pub stream_path: bool,
    pub transcript: Transcript,
    pub decision: Decision,
    /// The engine's state after the transcript, for the response-side block check.
    pub state: Arc<EngineState>,
    /// Sticky halts and operator resumes that apply to this request.
    pub conversation: ConversationState,
    /// This request, to keep as its conversation's last one.
    last: ThisRequest,
}

/// A request to keep as its conversation's last one, in its slot, once the transcript is
/// no longer needed by the request.
struct ThisRequest {
    recall: Recall,
    request: LastRequest,
    /// The identity the transcript's head names, when it was worked out.
    head: Option<Identity>,
}

/// What the log needs of a parsed request, once the request is done with its transcript.
pub struct Logged {
    /// Steps in the history: the index the response's assistant turn gets.
    pub next_step: usize,
    /// The history steps not yet logged (with their results).
    pub history: NewSteps,
}

impl Analyser {
    /// Reads the conversation in a request and decides on it. `policy` chooses the policy
    /// from the model the request asks for (`None`: it names none, or was not read);
    /// `standing` says what the conversation is subject to (sticky halts, resumes): the
    /// interventions' state.
    pub fn analyse(
        &self,
        arrival: Arrival<'_>,
        policy: impl FnOnce(Option<&str>) -> Arc<Policy>,
        standing: impl FnOnce(&Policy, &str, &Transcript) -> ConversationState,
    ) -> Analysis {
        let Arrival {
            route,
            headers,
            body,
            stated,
            team,
            earlier,
        } = arrival;
        let fallback = || identity::fallback(headers, route.path).in_team(team);
        let path_model = Dialect::model_from_path(route.path);
        let unread =
            |policy: Arc<Policy>, stated: Option<Identity>, dialect, parse, parse_error| Analysis {
                policy,
                identity: stated.unwrap_or_else(fallback),
                dialect,
                model: None,
                stream: route.dialect.is_some_and(|(_, stream_path)| stream_path),
                parse,
                parse_error,
                parsed: None,
            };
        let (Some((dialect, stream_path)), Some(found)) = (route.dialect, earlier.finish(body))
        else {
            return Analysis {
                stream: false,
                ..unread(
                    policy(path_model),
                    stated,
                    None,
                    ParseStatus::NotConversation,
                    None,
                )
            };
        };
        let Predecessor {
            recall,
            recalled: Recalled { last, fold },
            compared,
        } = found;
        // Its unchanged messages are recognised without hashing, and the scan resumes
        // after the bytes it shares with the conversation's last request.
        let history = match self.memory.messages.read_history(
            dialect,
            body,
            stream_path,
            last,
            compared.as_ref(),
        ) {
            Ok(history) => history,
            Err(e) => {
                // Forwarded untouched all the same; the log says why it was not read.
                let reason = summary(&e.to_string(), 200);
                if let Some(skipped) = UNPARSED_WARNING.admit(crate::store::now_ms()) {
                    tracing::warn!(path = route.path, dialect = dialect.as_str(), error = %reason, more_since_last = skipped, "request body not parsed; forwarded untouched (one line per 10 s at most; each is in the log)");
                }
                let policy = policy(path_model);
                return unread(
                    policy,
                    stated,
                    Some(dialect),
                    ParseStatus::Unparsed,
                    Some(reason),
                );
            }
        };
        let History {
            transcript,
            head,
            folded,
            tools,
            request,
            model,
            stream,
        } = history;
        // Hashed once per conversation head, not per request (the last request kept it).
        let head = match stated {
            Some(_) => None,
            None => head.or_else(|| identity::from_head(&transcript)),
        };
        let identity = match stated {
            Some(stated) => stated,
            None => head.clone().map_or_else(fallback, |h| h.in_team(team)),
        };
        let model = model.or_else(|| path_model.map(str::to_string));
        let policy = policy(model.as_deref());
        let conversation = standing(&policy, &identity.id, &transcript);
        // An operator's resume changes the store facts: the cached fold is stale.
        let cached = fold.filter(|_| !conversation.refold);
        let (decision, state, _) = policy.engine.decide_shared(
            &transcript,
            &conversation.facts,
            cached,
            folded,
            tools.as_ref(),
        );
        Analysis {
            policy,
            model,
            stream,
            dialect: Some(dialect),
            parse: ParseStatus::Parsed,
            parse_error: None,
            parsed: Some(Parsed {
                dialect,
                stream_path,
                transcript,
                decision,
                state,
                conversation,
                last: ThisRequest {
                    recall,
                    request,
                    head,
                },
            }),
            identity,
        }
    }

    /// Keeps a parsed request as its conversation's last one (with its transcript, which
    /// the next request continues, and the fold that decided it) and hands over what the
    /// log needs of it.
    pub fn keep(&self, parsed: Parsed) -> (Logged, Decision) {
        let Parsed {
            transcript,
            decision,
            state,
            last,
            ..
        } = parsed;
        let next_step = transcript.steps.len();
        let ThisRequest {
            recall,
            mut request,
            head,
        } = last;
        request.keep_transcript(transcript, head, Some(state.folded()));
        // Only the steps new to the log are copied; the transcript is kept for the
        // conversation's next request.
        let history = self.memory.put(recall, request, Some(state));
        (Logged { next_step, history }, decision)
    }
}
