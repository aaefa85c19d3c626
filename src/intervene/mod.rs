//! Interventions: from a detection decision to what happens to the request.
//!
//! Per parsed request, [`ruling`] says what happens (from the engine's decision, the
//! conversation's standing and the switches below) and [`Intervener::carry_out`] builds
//! it: forward the client's bytes, forward a rewritten body (a nudge or replan reminder
//! appended, or looping turns rolled back), answer with a halt reply without calling the
//! upstream, or hold the request for a human ([`pause`]). On the way back, a response
//! whose tool call would complete a loop the policy halts on is blocked (the engine's
//! `decide_response`, `crate::interventions::Interventions::check_response`; the HTTP side is
//! `crate::proxy::forward::block`). Nothing here speaks HTTP or SQL.
//! [`controls`] keeps halted conversations halted until a human speaks or an operator
//! resumes them, across restarts; `crate::interventions` holds that state and logs every
//! intervention, per policy.
//!
//! Protocol facts this relies on (see CLIENTS.md): a halt is an ordinary assistant reply in
//! the mode the client asked for (an SSE answer to a streaming request, never JSON, or some
//! clients spin), never an HTTP error (clients retry errors for minutes); agents that reject
//! a text-only reply get a tool-call halt from their [`profile`].

pub mod alerts;
pub mod controls;
pub mod pause;
pub mod profile;
pub mod rollback;
pub mod ruling;
pub mod text;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::detect::Decision;
use crate::dialect::{Dialect, HaltOptions, HaltReply};
use crate::request_bytes::RequestBytes;
use crate::transcript::Transcript;

pub use profile::AgentProfile;
pub use ruling::{rule, rule_verdict, Act, Mode, Reminder, Ruling, Source, Stop};

/// The `[intervene]` table of the config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InterveneConfig {
    /// Off: decisions are logged but every request is forwarded untouched.
    pub enabled: bool,
    /// Reminder appended for a nudge (placeholders: see `intervene::text`).
    pub nudge_text: String,
    /// Reminder appended for a replan (the stronger nudge after a nudge did not help).
    pub replan_text: String,
    /// Reminder appended once a conversation nears a budget cap (`[budget] warn_at`).
    pub wrap_up_text: String,
    /// The text of a halt reply when the run was going in circles.
    pub halt_text: String,
    /// The text of a halt reply when a hard budget (steps, tokens) was spent.
    pub budget_halt_text: String,
    /// The text of a halt reply when an operator halted the run (or a human decided `halt`
    /// on a held request).
    pub operator_halt_text: String,
    /// The note that replaces rolled-back turns.
    pub rollback_note: String,
    /// Opt-in: let a `rollback` decision cut the looping turns out of the history sent
    /// upstream. Off, a rollback decision is applied as a replan reminder: rewriting the
    /// history throws away the provider's prompt cache for the rest of the run.
    pub rollback: bool,
    /// Replace a response whose tool call completes a loop the policy halts on.
    pub block: bool,
    /// What a stop decision does: `halt` answers at once, `pause` holds the request for a
    /// human (see `[intervene.pause]`).
    pub on_stop: StopMode,
    pub pause: PauseConfig,
    /// Webhooks on halts, blocks, budget stops and held requests (`[intervene.alerts]`).
    pub alerts: alerts::AlertsConfig,
    /// How to halt each kind of agent; the first match wins, none means a text halt.
    pub profiles: Vec<AgentProfile>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopMode {
    Halt,
    Pause,
}

/// What a human (or the timeout) decides for a held request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Forward the request untouched, and let the run go on.
    Continue,
    /// Forward it with the nudge reminder appended.
    Nudge,
    /// Answer with the halt reply.
    Halt,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Continue => "continue",
            Verdict::Nudge => "nudge",
            Verdict::Halt => "halt",
        }
    }
}

/// The `[intervene.pause]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PauseConfig {
    /// How long a request is held for a human before `on_timeout` applies.
    pub timeout_secs: u64,
    /// What happens when nobody decides in time.
    pub on_timeout: Verdict,
    /// Interval of the `: keep-alive` comments sent to a held streaming request.
    pub keepalive_secs: u64,
    /// URLs that receive a JSON POST for each held request (the finding and how to decide).
    pub webhooks: Vec<String>,
    /// Per-webhook timeout; a slow or failing hook never delays anything else.
    pub webhook_timeout_ms: u64,
}

impl Default for PauseConfig {
    fn default() -> Self {
        PauseConfig {
            timeout_secs: 600,
            on_timeout: Verdict::Halt,
            keepalive_secs: 10,
            webhooks: Vec::new(),
            webhook_timeout_ms: 5_000,
        }
    }
}

impl Default for InterveneConfig {
    fn default() -> Self {
        InterveneConfig {
            enabled: true,
            nudge_text: text::NUDGE.into(),
            wrap_up_text: text::WRAP_UP.into(),
            replan_text: text::REPLAN.into(),
            halt_text: text::HALT.into(),
            budget_halt_text: text::BUDGET_HALT.into(),
            operator_halt_text: text::OPERATOR_HALT.into(),
            rollback_note: text::ROLLBACK.into(),
            rollback: false,
            block: true,
            on_stop: StopMode::Halt,
            pause: PauseConfig::default(),
            alerts: alerts::AlertsConfig::default(),
            profiles: profile::builtin(),
        }
    }
}

/// The request an intervention acts on. Borrowed from the request path while it is
/// ruled on; owned ([`RequestInfo::to_owned`]) by what outlives it (a held request, the
/// response-side block check).
#[derive(Debug, Clone)]
pub struct RequestInfo<'a> {
    pub conversation: Cow<'a, str>,
    pub dialect: Dialect,
    /// The path asks for a stream (Gemini `:streamGenerateContent`).
    pub stream_path: bool,
    /// The client asked for a streamed answer.
    pub stream: bool,
    /// The stream it asked for is one JSON array, not SSE (Gemini
    /// `:streamGenerateContent` without `alt=sse`).
    pub json_array: bool,
    pub model: Option<Cow<'a, str>>,
    pub user_agent: Cow<'a, str>,
    /// The team the request names (`/t/{team}`, `x-loopwarden-team`), as the log writes it.
    pub team: Option<Cow<'a, str>>,
    /// The body exactly as the client sent it.
    pub body: Cow<'a, RequestBytes>,
    pub transcript: Cow<'a, Transcript>,
    /// Steps of the run so far (assistant turns): the transcript's, and those of the run's
    /// history before a compaction rewrote it. What a step budget counts.
    pub run_steps: usize,
}

impl RequestInfo<'_> {
    /// The request, owned: its transcript is copied (O(the conversation)), its body shared.
    pub fn to_owned(&self) -> RequestInfo<'static> {
        RequestInfo {
            conversation: Cow::Owned(self.conversation.to_string()),
            dialect: self.dialect,
            stream_path: self.stream_path,
            stream: self.stream,
            json_array: self.json_array,
            model: self.model.as_deref().map(|m| Cow::Owned(m.to_string())),
            user_agent: Cow::Owned(self.user_agent.to_string()),
            team: self.team.as_deref().map(|t| Cow::Owned(t.to_string())),
            body: Cow::Owned(self.body.clone().into_owned()),
            transcript: Cow::Owned(self.transcript.clone().into_owned()),
            run_steps: self.run_steps,
        }
    }
}

/// A ruling carried out: what the proxy sends.
#[derive(Debug)]
pub enum Effect {
    /// Forward the client's bytes untouched.
    Forward,
    /// Forward these bytes instead.
    ForwardModified(Vec<u8>),
    /// Answer with this reply; the upstream is not called.
    Answer(HaltReply),
    /// Hold the request until a human decides (see [`pause`]).
    Hold,
}

/// What was done about a request (`requests.applied`, `decisions.applied`,
/// `interventions.applied`): one vocabulary for every row that says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Forwarded,
    Nudged,
    Replanned,
    RolledBack,
    Halted,
    Held,
    /// The response's tool call was replaced by the halt.
    Blocked,
    /// A halted conversation was let go (an operator, or a human who spoke).
    Resumed,
    /// The intervention could not be built: the request was forwarded untouched, never
    /// broken.
    FailedOpen,
    /// The proxy refused the request (`CONNECT`, a path that climbs out, a body too large
    /// or broken off); nothing was sent upstream. In `requests` only.
    Rejected,
    /// Under a shadow policy: what would have been done, had the policy enforced. The
    /// request was forwarded untouched.
    Would(Would),
}

/// What a shadow policy would have done (`applied` = `would_<act>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Would {
    Nudge,
    Replan,
    RollBack,
    Halt,
    Hold,
}

impl Applied {
    pub fn as_str(self) -> &'static str {
        match self {
            Applied::Forwarded => "forwarded",
            Applied::Nudged => "nudged",
            Applied::Replanned => "replanned",
            Applied::RolledBack => "rolled_back",
            Applied::Halted => "halted",
            Applied::Held => "held",
            Applied::Blocked => "blocked",
            Applied::Resumed => "resumed",
            Applied::FailedOpen => "failed_open",
            Applied::Rejected => "rejected",
            Applied::Would(Would::Nudge) => "would_nudge",
            Applied::Would(Would::Replan) => "would_replan",
            Applied::Would(Would::RollBack) => "would_roll_back",
            Applied::Would(Would::Halt) => "would_halt",
            Applied::Would(Would::Hold) => "would_hold",
        }
    }
}

/// A ruling carried out, and what that came to.
#[derive(Debug)]
pub struct Carried {
    pub effect: Effect,
    pub applied: Applied,
}

/// Builds the acts. Stateless apart from its config; the stateful parts (sticky halts,
/// held requests) are [`controls::Controls`] and [`pause::Pending`].
#[derive(Debug, Clone, Default)]
pub struct Intervener {
    pub config: InterveneConfig,
}

impl Intervener {
    pub fn new(config: InterveneConfig) -> Intervener {
        Intervener { config }
    }

    /// Builds what a ruling says. Never fails: when a rewrite cannot be built the request
    /// is forwarded as it is ([`Applied::FailedOpen`]); a rollback that cannot be cut is a
    /// replan.
    pub fn carry_out(&self, ruling: &Ruling, req: &RequestInfo<'_>) -> Carried {
        let decision = &ruling.decision;
        if ruling.shadow {
            return Carried {
                effect: Effect::Forward,
                applied: ruling.intended(),
            };
        }
        let (effect, applied) = match ruling.act {
            Act::Forward => (Effect::Forward, Applied::Forwarded),
            Act::Remind(reminder) => self.remind(reminder, decision, req),
            Act::RollBack => match self.roll_back(decision, req) {
                Some(body) => (Effect::ForwardModified(body), Applied::RolledBack),
                None => self.remind(Reminder::Replan, decision, req),
            },
            Act::Hold => (Effect::Hold, Applied::Held),
            Act::Halt(stop) => (
                Effect::Answer(self.halt_reply(decision, stop, req)),
                Applied::Halted,
            ),
        };
        Carried { effect, applied }
    }

    fn remind(
        &self,
        reminder: Reminder,
        decision: &Decision,
        req: &RequestInfo<'_>,
    ) -> (Effect, Applied) {
        let (template, applied) = match reminder {
            Reminder::Nudge => (&self.config.nudge_text, Applied::Nudged),
            Reminder::WrapUp => (&self.config.wrap_up_text, Applied::Nudged),
            Reminder::Replan => (&self.config.replan_text, Applied::Replanned),
        };
        let goal = text::goal_line(&req.transcript);
        let reminder = text::render(
            template,
            &text::Fill::of(decision, &goal, &req.conversation),
        );
        match req.dialect.append_reminder(&req.body.to_whole(), &reminder) {
            Ok(body) => (Effect::ForwardModified(body), applied),
            Err(e) => {
                // A parse error may quote the body (serde names the value it did not expect).
                let error = crate::store::Masked::from(e.to_string());
                crate::warn_per_request!(conversation = %req.conversation, %error, "cannot append the reminder; forwarded untouched");
                (Effect::Forward, Applied::FailedOpen)
            }
        }
    }

    /// The halt text for a decision about this request: it says what stopped the run.
    pub fn halt_text(&self, decision: &Decision, stop: Stop, req: &RequestInfo<'_>) -> String {
        let template = match stop {
            Stop::Loop => &self.config.halt_text,
            Stop::Budget => &self.config.budget_halt_text,
            Stop::Operator => &self.config.operator_halt_text,
        };
        let goal = text::goal_line(&req.transcript);
        let text = text::render(
            template,
            &text::Fill::of(decision, &goal, &req.conversation),
        );
        // The run's last word, read in a terminal or a CI log, and quoting the failing
        // command: masked like every halt reason served (the README's promise).
        crate::store::Masked::from(text).to_string()
    }

    /// A complete halt reply in the API's format and the mode the client asked for, with a
    /// tool call when the agent's profile needs one to stop.
    pub fn halt_reply(&self, decision: &Decision, stop: Stop, req: &RequestInfo<'_>) -> HaltReply {
        let text = self.halt_text(decision, stop, req);
        let body = req.body.to_whole();
        let seen = profile::Seen {
            user_agent: &req.user_agent,
            conversation: &req.conversation,
            dialect: req.dialect,
            body: &body,
        };
        let tool_call =
            profile::matching(&self.config.profiles, &seen).and_then(|p| p.halt_call(&text));
        let mut reply = req.dialect.halt_reply(
            &HaltOptions {
                model: req.model.as_deref().map(str::to_string),
                stream: req.stream && !req.json_array,
                tool_call,
            },
            &text,
        );
        if req.json_array {
            // A Gemini stream without `alt=sse` is a JSON array of response objects.
            let mut array = Vec::with_capacity(reply.body.len() + 2);
            array.push(b'[');
            array.append(&mut reply.body);
            array.push(b']');
            reply.body = array;
        }
        reply
    }

    /// The request with the turns of the leading finding rolled back, if that can be done.
    fn roll_back(&self, decision: &Decision, req: &RequestInfo<'_>) -> Option<Vec<u8>> {
        let lead = decision.lead()?;
        let first = *lead.steps.iter().min()?;
        let last = *lead.steps.iter().max()?;
        let goal = text::goal_line(&req.transcript);
        let tried = rollback::tried(&req.transcript, first, last, 8);
        let mut fill = text::Fill::of(decision, &goal, &req.conversation);
        fill.count = last + 1 - first;
        fill.tried = &tried;
        let note = text::render(&self.config.rollback_note, &fill);
        rollback::roll_back(
            req.dialect,
            &req.body.to_whole(),
            req.stream_path,
            first,
            last,
            &note,
        )
        .map(|rb| rb.body)
    }
}

impl InterveneConfig {
    /// Checks what serde cannot: `Err((key, problem))` names the key at fault.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let hooks = [
            ("intervene.pause.webhooks", &self.pause.webhooks),
            ("intervene.alerts.webhooks", &self.alerts.webhooks),
        ];
        for (key, urls) in hooks {
            for url in urls {
                let parsed = url.parse::<http::Uri>().ok();
                let web = parsed.as_ref().is_some_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
                });
                if !web {
                    return Err((key, format!("{url:?} is not an http(s) URL")));
                }
            }
        }
        for p in &self.profiles {
            if !p.halt_tool.is_empty() && !p.halt_arguments.is_object() {
                return Err((
                    "intervene.profiles.halt_arguments",
                    format!(
                        "profile {:?}: must be a table (the call's arguments)",
                        p.name
                    ),
                ));
            }
        }
        Ok(())
    }
}
