//! The analysis of one request: the one sequence the proxy ([`super::handler`]) and the
//! benchmarks (`benches/support`) run, so that what is measured is what serves. In order:
//!
//! 1. bytes → dialect: the body's top level is read, resumed after the conversation's last
//!    request ([`BodyComparison`] found it while the body arrived: [`crate::proxy::memory`] holds
//!    everything that makes a request cost work for its new messages only);
//! 2. dialect → transcript: each message parsed once ([`crate::proxy::memory::MessageCache`]), the last
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

use super::record::ParseStatus;
use crate::detect::{Decision, EngineState};
use crate::dialect::compaction::{self, Markers};
use crate::dialect::Dialect;
use crate::interventions::ConversationState;
use crate::policy::Policy;
use crate::proxy::identity::{self, Identity};
use crate::proxy::memory::{
    BodyComparison, History, Joined, LastRequest, Memory, NewSteps, Predecessor, Recall, Recalled,
    Sender, Stamp,
};
use crate::proxy::serve::route::Route;
use crate::request_bytes::RequestBytes;
use crate::store::redact::summary;
use crate::transcript::Transcript;

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

impl Analysis {
    /// A request whose history was not read (not a conversation, or not readable).
    fn unread(
        policy: Arc<Policy>,
        identity: Identity,
        dialect: Option<Dialect>,
        stream: bool,
        parse: ParseStatus,
        parse_error: Option<crate::store::Masked>,
    ) -> Analysis {
        Analysis {
            policy,
            identity,
            dialect,
            model: None,
            stream,
            parse,
            parse_error,
            parsed: None,
        }
    }
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
    /// The compaction markers the request carries: a summary request is forwarded as it
    /// came (a stop there would corrupt the summary the run goes on from), in a run that is
    /// stopped too when it is its client's real one ([`Parsed::summary_passes`]).
    pub compaction: Markers,
    /// A summary request that comes right after a request of its run, repeating its
    /// history ([`Stamp::admits`]), the first of its compaction (or a retry of it, byte for
    /// byte): what a real one is, besides its shape.
    pub repeats_run: bool,
    /// A summary request's run and sender, to keep the run as compacted once the request
    /// is forwarded; taken away when the request is stopped (it compacts nothing).
    pub compacted: Option<Compacted>,
    /// The id the request stated (or its head named), when it is logged under the run it
    /// continues, under another id.
    pub stated_id: Option<String>,
    /// This request, to keep as its conversation's last one.
    last: ThisRequest,
}

/// A summary request's run, and who sent it ([`super::memory::lineage`]).
pub struct Compacted {
    run: String,
    sender: Sender,
}

/// A request to keep as its conversation's last one, in its slot, once the transcript is
/// no longer needed by the request.
struct ThisRequest {
    recall: Recall,
    request: LastRequest,
    /// The identity the transcript's head names, when it was worked out.
    head: Option<Identity>,
    /// What it shows of the run, kept for the run's next summary request.
    stamp: Stamp,
}

/// What the log needs of a parsed request, once the request is done with its transcript.
pub struct Logged {
    /// Steps in the history: the index the response's assistant turn gets.
    pub next_step: usize,
    /// The history steps not yet logged (with their results).
    pub history: NewSteps,
}

impl Analyser {
    /// Before a request is read: when its conversation is new to this process (`earlier`
    /// found no last request of it) and its `body` may continue a run from a compaction
    /// ([`compaction::may_continue`]: a conversation without any such marker inherits
    /// nothing, and is spared the read), or it may continue a run from a summary under an id
    /// the lineage does not know (its headers say so, as Codex's window id does, or its
    /// body rewrites the history: the summary request of a run that keeps its id may have
    /// gone to another replica), what the store keeps of the run it may continue is
    /// brought into memory ([`crate::proxy::memory::Lineage::recall_stored`]): another
    /// replica, or this process before a restart, may have seen the run. `stated`: the id
    /// the request states. The request's policy is not known yet: the runs of every
    /// policy are brought in, and the lineage compares the policy when it joins.
    pub async fn recall_stored(
        &self,
        earlier: &BodyComparison<'_>,
        body: &RequestBytes,
        stated: Option<&str>,
        route: &Route<'_>,
        headers: &HeaderMap,
        team: Option<&str>,
    ) {
        let lineage = &self.memory.lineage;
        let new_continuing =
            || earlier.is_new() && compaction::may_continue(headers, [body.head(), body.tail()]);
        let continues = || {
            let said = compaction::recognize(route.path, headers, &[], None).continuation;
            (said.is_some() || earlier.rewrites_history())
                && stated.is_some_and(|id| !lineage.knows(id))
        };
        if new_continuing() || continues() {
            let sender = Sender::of(headers, route.query, team, "");
            lineage.recall_stored(stated, &sender).await;
        }
    }

    /// Reads the conversation in a request and decides on it. `policy` chooses the policy
    /// from the model the request asks for (`None`: it names none, or was not read);
    /// `standing` says what the conversation is subject to (sticky halts, resumes): the
    /// interventions' state; its flag says that the request continues its run from a
    /// summary (a compaction rewrote the history its halt was bound to).
    pub fn analyse(
        &self,
        arrival: Arrival<'_>,
        policy: impl FnOnce(Option<&str>) -> Arc<Policy>,
        standing: impl FnOnce(&Policy, &str, &Transcript, bool) -> ConversationState,
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
        // Worked out only when wanted: a body that names its model (every API's but
        // Gemini's) never needs it.
        let path_model = || Dialect::model_from_path(route.path);
        let stream = route.dialect.is_some_and(|(_, stream_path)| stream_path);
        let unread = |policy, stated: Option<Identity>, dialect, parse, error| {
            let identity = stated.unwrap_or_else(fallback);
            Analysis::unread(policy, identity, dialect, stream, parse, error)
        };
        let (Some((dialect, stream_path)), Some(found)) = (route.dialect, earlier.finish(body))
        else {
            let policy = policy(path_model());
            let mut not_conversation =
                unread(policy, stated, None, ParseStatus::NotConversation, None);
            not_conversation.stream = false;
            return not_conversation;
        };
        let Predecessor {
            recall,
            recalled:
                Recalled {
                    last,
                    fold,
                    stamp: kept_stamp,
                    same_body,
                },
            compared,
        } = found;
        // Its unchanged messages are recognised without hashing, and the scan resumes
        // after the bytes it shares with the conversation's last request.
        let messages = &self.memory.messages;
        let read = messages.read_history(dialect, body, stream_path, last, compared.as_ref());
        let history = match read {
            Ok(history) => history,
            Err(e) => {
                // Forwarded untouched all the same; the log says why it was not read.
                let reason = unparsed(route.path, dialect, &e.to_string());
                let policy = policy(path_model());
                let dialect = Some(dialect);
                return unread(policy, stated, dialect, ParseStatus::Unparsed, Some(reason));
            }
        };
        let History {
            transcript,
            head,
            folded,
            tools,
            tools_fingerprint,
            request,
            model,
            stream,
        } = history;
        let (head, mut identity) = identify(stated, head, &transcript, fallback, team);
        let model = model.or_else(|| path_model().map(str::to_string));
        let policy = policy(model.as_deref());
        let sent = Sent::of(route, headers, body, team, &policy.name);
        let Followed {
            compaction,
            run,
            stated_id,
        } = self.follow(&mut identity, &sent, &transcript, fold.as_ref());
        let stamp = Stamp::of(&transcript, tools_fingerprint);
        // Looked at before this request is kept as the run's summary request.
        let repeats_run = compaction.summary.is_some()
            && kept_stamp.is_some_and(|kept| kept.admits(&stamp))
            && (same_body || !self.memory.lineage.awaiting(&identity.id));
        // A summary request is read as the history it summarizes, without the client's
        // instruction (which would read as a human speaking, to the engine and to a halt).
        // Its standing is what the run's fold must know (an operator's resume); nothing
        // stops it all the same (`super::handler`).
        let history = compaction
            .summary
            .and_then(|m| compaction::without_instruction(&transcript, m));
        let history = history.as_ref().unwrap_or(&transcript);
        let conversation = standing(&policy, &identity.id, history, run.is_some());
        // An operator's resume changes the store facts: the cached fold is stale.
        let cached = fold.filter(|_| !conversation.refold);
        let carry = run.as_ref().map(|r| &*r.carry);
        let (mut decision, state, _) = policy.engine.decide_carried(
            history,
            &conversation.facts,
            cached,
            folded,
            tools.as_ref(),
            carry,
        );
        // The run's state here is what the conversation that continues it carries, once
        // the request is forwarded ([`Analyser::keep`]).
        let compacted = compaction.summary.map(|_| Compacted {
            run: identity.id.clone(),
            sender: sender(&sent),
        });
        if compacted.is_some() {
            // Never acted on: no decision to log either.
            decision = Decision::observe();
        }
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
                compaction,
                repeats_run,
                compacted,
                stated_id,
                last: ThisRequest {
                    recall,
                    request,
                    head,
                    stamp,
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
            compaction,
            compacted,
            ..
        } = parsed;
        if let Some(Compacted { run, sender }) = compacted {
            let now = crate::store::now_ms();
            self.memory
                .lineage
                .compacted(&run, state.clone(), sender, now);
        }
        // The run's steps before the compaction this history continues from, if any: the
        // log numbers the run's steps.
        let carried = state.steps().saturating_sub(transcript.steps.len());
        // A summary request's fold saw its history without the instruction: it is not kept
        // as the fold of the transcript kept (the next request folds afresh, once).
        let state = compaction.summary.is_none().then_some(state);
        let run_steps = carried + transcript.steps.len();
        let ThisRequest {
            recall,
            mut request,
            head,
            stamp,
        } = last;
        // A request of the run's own (with its tools; not a side request, not a summary
        // request) is what the next summary request must repeat.
        if compaction.summary.is_none() && stamp.offers_tools() {
            recall.stamp(stamp);
        }
        request.keep_transcript(transcript, head, state.as_ref().map(|s| s.folded()));
        // Only the steps new to the log are copied; the transcript is kept for the
        // conversation's next request.
        let mut history = self.memory.put(recall, request, state, carried);
        if let Some(marker) = compaction.summary {
            // The instruction after the last step is the client's, not the run's.
            if let Some(last) = history
                .steps
                .last_mut()
                .filter(|s| s.index + 1 == run_steps)
            {
                compaction::strip_instruction(last, marker);
            }
        }
        let next_step = run_steps;
        (Logged { next_step, history }, decision)
    }
}

/// What a request's compaction markers make of it ([`Analyser::follow`]).
struct Followed {
    compaction: Markers,
    /// The run it continues from a summary, and what it carries.
    run: Option<Joined>,
    /// The id it had, when it takes its run's.
    stated_id: Option<String>,
}

/// The parts of a request [`Analyser::follow`] reads.
struct Sent<'a> {
    path: &'a str,
    query: Option<&'a str>,
    headers: &'a HeaderMap,
    body: &'a RequestBytes,
    team: Option<&'a str>,
    policy: &'a str,
}

impl<'a> Sent<'a> {
    fn of(
        route: &'a Route<'_>,
        headers: &'a HeaderMap,
        body: &'a RequestBytes,
        team: Option<&'a str>,
        policy: &'a str,
    ) -> Sent<'a> {
        Sent {
            path: route.path,
            query: route.query,
            headers,
            body,
            team,
            policy,
        }
    }
}

impl Analyser {
    /// The run a request belongs to across compactions ([`crate::proxy::memory::lineage`]): its
    /// markers ([`compaction::recognize`]; the body's last bytes only), and for a request
    /// whose history continues from a summary, its run, whose id it takes; a conversation
    /// joined before goes on under the run's id. `fold`: the conversation's cached fold,
    /// for a summary the proxy did not see.
    fn follow(
        &self,
        identity: &mut Identity,
        sent: &Sent<'_>,
        transcript: &Transcript,
        fold: Option<&Arc<EngineState>>,
    ) -> Followed {
        let body = sent.body;
        let end = body.len().saturating_sub(512)..body.len();
        let body_end = body.get(end).unwrap_or(body.tail());
        let mut compaction =
            compaction::recognize(sent.path, sent.headers, body_end, Some(transcript));
        let mut server = None;
        if compaction.continuation.is_none() {
            let pieces = [&body.head()[..], &body.tail()[..]];
            server = compaction::server_compaction(sent.path, pieces);
            compaction.continuation = server.map(|c| c.marker);
        }
        let lineage = &self.memory.lineage;
        if compaction.continuation.is_none() {
            let run = lineage.run_of(&identity.id);
            let stated_id = run.and_then(|run| rename(identity, run));
            return Followed {
                compaction,
                run: None,
                stated_id,
            };
        }
        let sender = sender(sent);
        let now = crate::store::now_ms();
        let mut joined = lineage.join(&identity.id, &sender, now);
        if let (Some(j), Some(c), Some(fold)) = (&joined, server, fold) {
            // The API compacted the run again: what the run did since its last compaction
            // is gone from this history, and is in the conversation's last fold.
            if !j.linked_now && lineage.compacted_again(&j.run, c.fingerprint) {
                lineage.compacted(&j.run, fold.clone(), sender.clone(), now);
                joined = lineage.join(&identity.id, &sender, now);
            }
        }
        let joined =
            joined.or_else(|| self.unseen_summary(identity, fold, &sender, server.is_some()));
        if let (Some(j), Some(c)) = (&joined, server) {
            lineage.server_compacted(&j.run, c.fingerprint);
        }
        let stated_id = joined
            .as_ref()
            .and_then(|j| rename(identity, j.run.clone()));
        if let Some(j) = joined.as_ref().filter(|j| j.linked_now) {
            tracing::info!(conversation = ?stated_id, run = %j.run, "a conversation continues a compacted run");
        }
        Followed {
            compaction,
            run: joined,
            stated_id,
        }
    }

    /// A history that continues from a summary the proxy did not see (Codex's older
    /// `POST /responses/compact`, which is no conversation endpoint; a summary request
    /// sent before the proxy started), under an id the client states: the fold of the
    /// conversation's last request is the run's state before its compaction, and is kept
    /// as the run's from now on.
    /// A fold that continues a run already (its run was forgotten since) is not taken: its
    /// own steps would be carried twice. `server`: the API compacted the history
    /// ([`compaction::Marker::server_side`]); the head it keeps names the conversation as
    /// before, so a head's hash is as good as a stated id.
    fn unseen_summary(
        &self,
        identity: &Identity,
        fold: Option<&Arc<EngineState>>,
        sender: &Sender,
        server: bool,
    ) -> Option<Joined> {
        let stated = server
            || matches!(
                identity.source,
                identity::IdSource::Header(_) | identity::IdSource::Path
            );
        let fold = fold.filter(|f| stated && !f.is_carried())?.clone();
        let lineage = &self.memory.lineage;
        let now = crate::store::now_ms();
        lineage.compacted(&identity.id, fold, sender.clone(), now);
        lineage.join(&identity.id, sender, now)
    }
}

/// Gives a request its run's id; returns the id it had, when another.
fn rename(identity: &mut Identity, run: String) -> Option<String> {
    (run != identity.id).then(|| std::mem::replace(&mut identity.id, run))
}

/// Who a read request is: the id it states, else the one its transcript's head names (in
/// its team), else the fallback; with the head's identity, worked out only when no id
/// was stated (the last request kept it: it is hashed once per conversation head, not
/// per request).
fn identify(
    stated: Option<Identity>,
    head: Option<Identity>,
    transcript: &Transcript,
    fallback: impl FnOnce() -> Identity,
    team: Option<&str>,
) -> (Option<Identity>, Identity) {
    match stated {
        Some(stated) => (None, stated),
        None => {
            let head = head.or_else(|| identity::from_head(transcript));
            let identity = head.clone().map_or_else(fallback, |h| h.in_team(team));
            (head, identity)
        }
    }
}

/// Why a request's body was not read, as the log keeps it; said in the proxy's own log as
/// well, one line per 10 s at most.
fn unparsed(path: &str, dialect: Dialect, error: &str) -> crate::store::Masked {
    let reason = summary(error, 200);
    crate::warn_per_request!(path, dialect = dialect.as_str(), error = %reason, "request body not parsed; forwarded untouched (one line per 10 s at most; each is in the log)");
    reason
}

/// Who sent a request, as a run's lineage compares it ([`Sender::of`]).
fn sender(sent: &Sent<'_>) -> Sender {
    Sender::of(sent.headers, sent.query, sent.team, sent.policy)
}
