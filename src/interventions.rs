//! The stateful side of interventions, as the proxy holds it: sticky halts
//! ([`Controls`]), held requests ([`Pending`]) and the intervention log. The proxy calls,
//! per request: [`Interventions::conversation_state`] (what the engine must know from the
//! store), [`Interventions::plan`] (the ruling, carried out, logged), and for a held
//! request [`Interventions::hold`] then [`Interventions::after_verdict`]; per response,
//! [`Interventions::armed`] and [`Interventions::check_response`] (block). What happens
//! is ruled in one place, [`crate::intervene::ruling`]; this file keeps the state and the
//! log. It works under a policy ([`Policy`]: its mode, its `[intervene]` and budget
//! settings, its engine), so it sits above `crate::policy`, which builds on
//! `crate::intervene`'s settings.

use std::time::Duration;

use crate::budget::{BudgetStatus, Ledger};
use crate::detect::{Action, Decision, EngineState, StoreFacts};
use crate::dialect::ResponseTurn;
use crate::intervene::alerts::{Alert, AlertEvent, AlertSink};
use crate::intervene::controls::{human_messages, Control, Controls, Standing};
use crate::intervene::pause::{DecidedBy, FindingInfo, HeldInfo, Pending, Ticket};
use crate::intervene::ruling::{self, Act, Ruling, Source, Stop};
use crate::intervene::Mode;
use crate::intervene::{Applied, Carried, RequestInfo, Verdict};
use crate::policy::Policy;
use crate::store::{now_ms, InterventionRow, Record, Store};
use crate::transcript::Transcript;

/// Cheap to clone: every part is shared. What the settings say (texts, switches, the
/// pause, which user messages are a scaffold's) comes from the policy each call is given.
#[derive(Clone)]
pub struct Interventions {
    pub controls: Controls,
    pub pending: Pending,
    store: Store,
    /// What each conversation spent, for its policy's budget.
    ledger: Ledger,
    /// Counts each intervention logged (`/metrics`).
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Where alerts go (`crate::intervene::alerts`); none: not sent.
    alerts: Option<AlertSink>,
}

/// What a request is subject to before the engine decides.
#[derive(Debug, Clone)]
pub struct ConversationState {
    pub standing: Standing,
    /// Facts for [`Engine::decide_with`].
    pub facts: StoreFacts,
    /// The facts just changed (an operator's resume takes effect at this request): a
    /// cached engine fold of this conversation is stale and must not be continued.
    pub refold: bool,
}

impl ConversationState {
    /// A conversation with no halt and no resume: what most requests are subject to.
    pub fn free() -> ConversationState {
        ConversationState {
            standing: Standing::free(),
            facts: StoreFacts::default(),
            refold: false,
        }
    }
}

/// A request ruled on and carried out: the decision acted on, and what was sent.
#[derive(Debug)]
pub struct Acted {
    /// The decision acted on (a sticky halt replaces the engine's).
    pub decision: Decision,
    pub carried: Carried,
}

impl Interventions {
    /// Loads the sticky-halt state from the store's database.
    pub async fn open(
        store: Store,
        ledger: Ledger,
        metrics: std::sync::Arc<crate::metrics::Metrics>,
    ) -> anyhow::Result<Interventions> {
        let controls = Controls::load(store.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot read conversation_controls: {e}"))?;
        Ok(Interventions {
            controls,
            pending: Pending::default(),
            store,
            ledger,
            metrics,
            alerts: None,
        })
    }

    /// Sends the alerts of the policies' `[intervene.alerts]` to `sink`.
    pub fn with_alerts(self, sink: AlertSink) -> Interventions {
        Interventions {
            alerts: Some(sink),
            ..self
        }
    }

    /// Makes a halt on the request path sticky for the run `req` belongs to.
    fn make_sticky(&self, policy: &Policy, req: &RequestInfo<'_>, reason: &str, stop: Stop) {
        let humans = humans(policy, &req.transcript);
        self.controls
            .halt(&req.conversation, reason, stop, &req.transcript, humans);
    }

    /// Where a request stands (sticky halt, operator resumes) and what the engine needs.
    /// `continued`: the request continues its run from a summary, so a halt of the run
    /// holds for it (a compaction is no human speaking, and no new run).
    pub fn conversation_state(
        &self,
        policy: &Policy,
        conversation: &str,
        transcript: &Transcript,
        continued: bool,
    ) -> ConversationState {
        if !self.controls.contains(conversation) {
            return ConversationState::free();
        }
        let humans = humans(policy, transcript);
        if continued {
            self.controls
                .follow_compaction(conversation, humans, transcript);
        }
        let standing = self.controls.standing(conversation, humans, transcript);
        let facts = match &standing {
            Standing::Free { resumed_at, .. } | Standing::Awaiting { resumed_at, .. } => {
                StoreFacts {
                    resumed_at: resumed_at.clone(),
                    dismissed: Vec::new(),
                }
            }
            Standing::Halted { .. } => StoreFacts::default(),
        };
        if let Standing::Free {
            human_resumed: true,
            ..
        } = &standing
        {
            self.log(Logged {
                conversation,
                policy: Some(&policy.name),
                request_id: None,
                action: "resume",
                applied: Applied::Resumed,
                source: Source::Human,
                detector: "",
                reason: "a human wrote a new message after the halt",
                finding: "",
            });
        }
        let refold = matches!(
            standing,
            Standing::Free {
                resumed_now: true,
                ..
            }
        );
        ConversationState {
            standing,
            facts,
            refold,
        }
    }

    /// What happens to a request: the ruling on the engine's decision (the halt again for
    /// a conversation that is halted), carried out. Logs the intervention and makes a
    /// halt sticky.
    pub fn plan(
        &self,
        policy: &Policy,
        decision: Decision,
        state: &ConversationState,
        req: &RequestInfo<'_>,
        request_id: i64,
    ) -> Acted {
        let budget = self.budget(policy, req);
        let ruling = ruling::rule(
            decision,
            &state.standing,
            &budget,
            policy.intervene(),
            policy.mode,
        );
        let carried = policy.intervener.carry_out(&ruling, req);
        if carried.applied != Applied::Forwarded {
            self.log_ruling(policy, &ruling, req, Some(request_id), carried.applied);
        }
        if let (Act::Halt(stop), Applied::Halted, Source::Policy) =
            (ruling.act, carried.applied, ruling.source)
        {
            self.make_sticky(policy, req, &ruling.decision.reason, stop);
        }
        Acted {
            decision: ruling.decision,
            carried,
        }
    }

    /// Whether the ruling on a request would stop its run whatever the engine decided: the
    /// run is halted or waits for a human, or its budget is spent. A summary request passes
    /// such a run only when it is its client's real one (`crate::proxy::forward::plan`).
    pub fn stops(&self, policy: &Policy, state: &ConversationState, req: &RequestInfo<'_>) -> bool {
        !matches!(state.standing, Standing::Free { .. })
            || matches!(self.budget(policy, req), BudgetStatus::Spent { .. })
    }

    /// Where the conversation stands against its policy's budget. Once a human let it go
    /// on after a stop (it has a control), a spent cap reminds but no longer stops it.
    fn budget(&self, policy: &Policy, req: &RequestInfo<'_>) -> BudgetStatus {
        if policy.budget.is_unlimited() {
            return BudgetStatus::Within;
        }
        let steps = req.run_steps as u64;
        let model = req.model.as_deref();
        let next = crate::budget::NextCall {
            model,
            input_tokens: crate::budget::estimate::input_tokens(model, req.body.len()),
        };
        let status =
            self.ledger
                .status_before(&req.conversation, steps, &policy.budget, now_ms(), next);
        match self.controls.contains(&req.conversation) {
            true => status.lifted(),
            false => status,
        }
    }

    /// Holds a request for a human: lists it. What the admin API and the webhooks show of
    /// it comes back with its ticket.
    pub fn hold(
        &self,
        policy: &Policy,
        decision: &Decision,
        req: &RequestInfo<'_>,
    ) -> (Ticket, HeldInfo) {
        let pause = &policy.intervene().pause;
        let now = now_ms();
        let info = HeldInfo {
            id: String::new(),
            conversation_id: req.conversation.to_string(),
            team: req.team.as_deref().map(str::to_string),
            created_ms: now,
            deadline_ms: now + (pause.timeout_secs as i64) * 1000,
            on_timeout: pause.on_timeout,
            detector: decision.detector.clone(),
            reason: decision.reason.as_str().into(),
            findings: decision
                .findings
                .iter()
                .map(|f| FindingInfo {
                    detector: f.detector.clone(),
                    summary: f.summary.as_str().into(),
                    suggestion: f.suggestion.as_str().into(),
                })
                .collect(),
            stream: req.stream,
        };
        self.pending.hold(info)
    }

    /// Waits for the verdict on a held request (or the timeout's default).
    pub async fn verdict(&self, policy: &Policy, ticket: Ticket) -> (Verdict, DecidedBy) {
        let pause = &policy.intervene().pause;
        ticket
            .verdict(Duration::from_secs(pause.timeout_secs), pause.on_timeout)
            .await
    }

    /// What a verdict on a held request chooses, carried out and logged; a halt becomes
    /// sticky, a continue or nudge lets the next request restart escalation.
    pub fn after_verdict(
        &self,
        policy: &Policy,
        verdict: Verdict,
        by: DecidedBy,
        decision: &Decision,
        req: &RequestInfo<'_>,
        request_id: i64,
    ) -> Carried {
        let ruling = ruling::rule_verdict(verdict, by, decision);
        let carried = policy.intervener.carry_out(&ruling, req);
        self.log_ruling(policy, &ruling, req, Some(request_id), carried.applied);
        match ruling.act {
            Act::Halt(stop) => self.make_sticky(policy, req, &decision.reason, stop),
            Act::Forward | Act::Remind(_) | Act::RollBack | Act::Hold => {
                self.controls.release(&req.conversation)
            }
        }
        carried
    }

    /// Whether a response to this request could be blocked, so that only those responses
    /// are read on the way back.
    /// Never under a policy that does not enforce: nudge-only blocks nothing, and a shadow
    /// policy lets every byte through as it comes (the would-be halt shows on the next
    /// request's decision).
    pub fn armed(&self, policy: &Policy, state: &EngineState) -> bool {
        let config = policy.intervene();
        policy.mode == Mode::Enforce
            && config.enabled
            && config.block
            && state.may_block(policy.detect())
    }

    /// The response-side check: `Some((decision, why))` when the response's calls complete
    /// a loop the policy halts on and the ruling is to block them (the caller replaces
    /// them by the halt). Logs the block and halts the conversation.
    ///
    /// Under `on_stop = "pause"` the ruling is a hold, and a response cannot be held for a
    /// human mid-answer (the client is reading it; a verdict of `nudge` would have nothing
    /// to remind): the calls go through, and the conversation's next request, the one that
    /// carries their results, is held instead. The run never halts without a human.
    pub fn check_response(
        &self,
        policy: &Policy,
        state: &EngineState,
        turn: &ResponseTurn,
        req: &RequestInfo<'_>,
        request_id: i64,
    ) -> Option<(Decision, Stop)> {
        let decision = policy.engine.decide_response_with(state, turn);
        if decision.action != Action::Block {
            return None;
        }
        let ruling = ruling::rule(
            decision,
            &Standing::free(),
            &BudgetStatus::Within,
            policy.intervene(),
            policy.mode,
        );
        if ruling.shadow {
            // Not reached: a shadow policy is never armed. Were it, it would block nothing.
            return None;
        }
        match ruling.act {
            Act::Halt(stop) => {
                self.log_ruling(policy, &ruling, req, Some(request_id), Applied::Blocked);
                self.make_sticky(policy, req, &ruling.decision.reason, stop);
                Some((ruling.decision, stop))
            }
            Act::Hold => {
                self.log_ruling(policy, &ruling, req, Some(request_id), Applied::Forwarded);
                let d = &ruling.decision;
                self.controls
                    .hold_next(&req.conversation, &d.reason, &d.detector);
                None
            }
            Act::Forward | Act::Remind(_) | Act::RollBack => None,
        }
    }

    /// Whether the proxy knows the conversation: it has a stored control, a held request,
    /// or a request in the log. An operator's halt or resume of any other id is a mistake
    /// (a typo, a stale id) and must not create state for a conversation nobody runs.
    async fn knows(&self, conversation: &str) -> Result<bool, crate::store::Error> {
        if self.controls.contains(conversation)
            || self
                .pending
                .list()
                .iter()
                .any(|h| h.conversation_id == conversation)
        {
            return Ok(true);
        }
        self.store.has_conversation(conversation).await
    }

    /// An operator halts a conversation by hand; `None` when the conversation is unknown.
    pub async fn operator_halt(
        &self,
        conversation: &str,
        reason: &str,
    ) -> Result<Option<Control>, crate::store::Error> {
        if !self.knows(conversation).await? {
            return Ok(None);
        }
        let c = self.controls.halt_by_operator(conversation, reason).await?;
        self.log(Logged {
            conversation,
            policy: None,
            request_id: None,
            action: "halt",
            applied: Applied::Halted,
            source: Source::Operator,
            detector: "",
            reason,
            finding: "",
        });
        Ok(Some(c))
    }

    /// An operator resumes a conversation; `None` when the conversation is unknown.
    pub async fn operator_resume(
        &self,
        conversation: &str,
    ) -> Result<Option<Control>, crate::store::Error> {
        if !self.knows(conversation).await? {
            return Ok(None);
        }
        let c = self.controls.resume(conversation).await?;
        self.log(Logged {
            conversation,
            policy: None,
            request_id: None,
            action: "resume",
            applied: Applied::Resumed,
            source: Source::Operator,
            detector: "",
            reason: "resumed by an operator",
            finding: "",
        });
        Ok(Some(c))
    }

    fn log_ruling(
        &self,
        policy: &Policy,
        ruling: &Ruling,
        req: &RequestInfo<'_>,
        request_id: Option<i64>,
        applied: Applied,
    ) {
        let d = &ruling.decision;
        let finding = d.lead().map(|f| f.summary.as_str()).unwrap_or("");
        self.log(Logged {
            conversation: &req.conversation,
            policy: Some(&policy.name),
            request_id,
            action: d.action.as_str(),
            applied,
            source: ruling.source,
            detector: &d.detector,
            reason: &d.reason,
            finding,
        });
        let config = &policy.intervene().alerts;
        let (Some(sink), Some(event)) = (&self.alerts, AlertEvent::of(ruling, applied)) else {
            return;
        };
        if config.webhooks.is_empty() || !config.on.contains(&event) {
            return;
        }
        sink(
            config,
            Alert {
                event,
                policy: policy.name.to_string(),
                conversation: req.conversation.to_string(),
                detector: d.detector.to_string(),
                reason: crate::store::Masked::from(d.reason.as_str()).to_string(),
                finding: crate::store::Masked::from(finding).to_string(),
                at_ms: now_ms(),
            },
        );
    }

    fn log(&self, e: Logged<'_>) {
        let row = InterventionRow {
            conversation_id: e.conversation.to_string(),
            request_id: e.request_id,
            created_ms: now_ms(),
            action: e.action.to_string(),
            applied: e.applied.as_str().to_string(),
            source: e.source.as_str().to_string(),
            detector: e.detector.to_string(),
            reason: e.reason.into(),
            finding: e.finding.into(),
            policy: e.policy.map(str::to_string),
        };
        // The line on stderr says what the row says, masked as it is.
        tracing::info!(
            conversation = e.conversation,
            policy = e.policy.unwrap_or(""),
            action = e.action,
            applied = row.applied,
            source = row.source,
            detector = e.detector,
            reason = %row.reason,
            "intervention"
        );
        self.metrics
            .intervention(e.action, &row.applied, e.detector, e.policy);
        self.store.log(Record::Intervention(Box::new(row)));
    }
}

/// One row of the intervention log, as its parts are at hand. `policy`: the policy the
/// request was under (none for an operator's act, which concerns no request).
struct Logged<'a> {
    conversation: &'a str,
    policy: Option<&'a str>,
    request_id: Option<i64>,
    action: &'a str,
    applied: Applied,
    source: Source,
    detector: &'a str,
    reason: &'a str,
    finding: &'a str,
}

/// Human messages in a transcript (what tells a human speaking after a halt), under the
/// policy's list of what a scaffold sends on its own. O(the conversation), so computed only
/// for conversations that have a halt state.
fn humans(policy: &Policy, transcript: &Transcript) -> i64 {
    human_messages(transcript, &|t| policy.detect().is_scaffold_message(t))
}
