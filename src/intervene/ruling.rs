//! The one place where a decision becomes what happens to a request.
//!
//! The engine says what the conversation needs (observe, nudge, replan, rollback, pause,
//! halt, block; `pause` is its answer for a pattern whose policy is to ask a human). What
//! the proxy then does also depends on the conversation's standing (a halted conversation
//! stays halted: the halt is answered again) and on the `[intervene]` switches
//! (interventions off, `on_stop = "pause"`, rollback off); for a held request, on the
//! human's verdict or the timeout's. The response side's block is ruled here too: under
//! `on_stop = "pause"` it is a hold, which a response cannot wait in, so the call goes
//! through and the conversation's next request is held ([`Standing::Awaiting`]). [`rule`] and [`rule_verdict`] are that mapping, and
//! nothing else makes it: pure functions of their inputs, with no bytes, HTTP or store.
//! Carrying a ruling out (appending a reminder, building a halt reply) is
//! [`super::Intervener::carry_out`]'s; logging it and making a halt sticky,
//! `crate::interventions::Interventions`'.

use serde::{Deserialize, Serialize};

use crate::budget::BudgetStatus;
use crate::detect::{Action, Decision, Finding};

use super::controls::Standing;
use super::pause::DecidedBy;
use super::{Applied, InterveneConfig, StopMode, Verdict, Would};

/// How far a policy acts on what detection and budgets decide (a `[[policy]]`'s `mode`).
/// Kept where rulings are made, since that is where it bends them; `crate::policy`
/// re-exports it for its tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Act: remind, halt, hold, block, as the settings say.
    #[default]
    Enforce,
    /// Remind only: a stop becomes the stronger (replan) reminder and no response is
    /// blocked. For interactive sessions, where a person is there to stop the agent.
    NudgeOnly,
    /// Act on nothing: every byte passes both ways as if loopwarden were not there, and
    /// the log records what it would have done (`would_nudge`, `would_halt`, ...). For
    /// calibrating a policy on real traffic before enforcing it.
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::NudgeOnly => "nudge-only",
            Mode::Shadow => "shadow",
        }
    }
}

/// What happens to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Forward the client's bytes untouched.
    Forward,
    /// Forward the request with a reminder appended.
    Remind(Reminder),
    /// Forward the request with the looping turns cut out (a replan reminder instead when
    /// they cannot be cut).
    RollBack,
    /// Answer with a halt reply saying why the run stopped; the upstream is not called.
    Halt(Stop),
    /// Hold the request until a human (or the timeout) decides.
    Hold,
}

/// Why a halt stops a run: what its reply tells the agent, and what a sticky halt keeps
/// telling it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Detection: the run is going in circles.
    Loop,
    /// A hard budget (steps, tokens) is spent.
    Budget,
    /// A person: an operator's halt, or a human's verdict on a held request.
    Operator,
}

impl Stop {
    /// Why detection stops a run with this decision.
    fn of(decision: &Decision) -> Stop {
        if decision.spent_budget() {
            Stop::Budget
        } else {
            Stop::Loop
        }
    }
}

/// Which reminder a request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reminder {
    Nudge,
    /// The stronger reminder, after a nudge did not help.
    Replan,
    /// The run nears a cap of its budget: finish up.
    WrapUp,
}

/// Who made a ruling (`interventions.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Detection, under the configured policy.
    Policy,
    /// The conversation was halted before: the halt is answered again.
    Sticky,
    /// An operator, through the admin API.
    Operator,
    /// A human: a verdict on a held request, or a message after a halt.
    Human,
    /// Nobody decided on a held request in time: the configured default.
    Timeout,
    /// The proxy stopped while a request was held: the timeout's default, at once.
    Shutdown,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Policy => "policy",
            Source::Sticky => "sticky",
            Source::Operator => "operator",
            Source::Human => "human",
            Source::Timeout => "timeout",
            Source::Shutdown => "shutdown",
        }
    }
}

impl From<DecidedBy> for Source {
    fn from(by: DecidedBy) -> Source {
        match by {
            DecidedBy::Human => Source::Human,
            DecidedBy::Timeout => Source::Timeout,
            DecidedBy::Shutdown => Source::Shutdown,
        }
    }
}

/// A decision and what is done about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ruling {
    /// The decision acted on: the engine's, as the switches turned it (a pause where the
    /// policy stops by asking, a replan where rollback is off), or the sticky halt.
    pub decision: Decision,
    pub act: Act,
    pub source: Source,
    /// A shadow policy's ruling: logged as what would have been done (`would_<act>`), and
    /// the request forwarded untouched.
    pub shadow: bool,
}

impl Ruling {
    /// What carrying the ruling out comes to when nothing fails (a reminder that cannot be
    /// appended is forwarded as it is, `failed_open`; a rollback that cannot be cut is a
    /// replan): what `loopwarden replay --db` shows a candidate would have done. Under a
    /// shadow policy, what it would have done (`would_<act>`).
    pub fn intended(&self) -> Applied {
        if self.shadow {
            let would = match self.act {
                Act::Forward => None,
                Act::Remind(Reminder::Nudge | Reminder::WrapUp) => Some(Would::Nudge),
                Act::Remind(Reminder::Replan) => Some(Would::Replan),
                Act::RollBack => Some(Would::RollBack),
                Act::Halt(_) => Some(Would::Halt),
                Act::Hold => Some(Would::Hold),
            };
            return would.map_or(Applied::Forwarded, Applied::Would);
        }
        match self.act {
            Act::Forward => Applied::Forwarded,
            Act::Remind(Reminder::Nudge | Reminder::WrapUp) => Applied::Nudged,
            Act::Remind(Reminder::Replan) => Applied::Replanned,
            Act::RollBack => Applied::RolledBack,
            Act::Halt(_) => Applied::Halted,
            Act::Hold => Applied::Held,
        }
    }
}

/// What happens to a request, from the engine's decision, the conversation's standing, its
/// budget, the `[intervene]` switches and the policy's mode. The mode bends the policy's
/// own rulings only (detection's and the budget's): a conversation an operator (or a
/// human's verdict) halted stays halted in every mode, since a person asked for it.
pub fn rule(
    decision: Decision,
    standing: &Standing,
    budget: &BudgetStatus,
    config: &InterveneConfig,
    mode: Mode,
) -> Ruling {
    let mut ruling = rule_enforced(decision, standing, budget, config);
    if ruling.source != Source::Policy {
        return ruling;
    }
    match mode {
        Mode::Enforce => {}
        Mode::Shadow => ruling.shadow = ruling.act != Act::Forward,
        Mode::NudgeOnly => {
            if matches!(ruling.act, Act::Halt(_) | Act::Hold) {
                // The strongest reminder stands in for the stop.
                ruling.decision.action = Action::Replan;
                ruling.act = Act::Remind(Reminder::Replan);
            }
        }
    }
    ruling
}

/// [`rule`] under an enforcing policy.
fn rule_enforced(
    decision: Decision,
    standing: &Standing,
    budget: &BudgetStatus,
    config: &InterveneConfig,
) -> Ruling {
    let mut decision = decision;
    if !config.enabled {
        return Ruling {
            decision,
            act: Act::Forward,
            source: Source::Policy,
            shadow: false,
        };
    }
    match standing {
        Standing::Halted { reason, stop } => {
            // Halted already (perhaps by a human's verdict): answered again, for the same
            // reason, never held again.
            decision.action = Action::Halt;
            decision.reason = reason.clone();
            return Ruling {
                decision,
                act: Act::Halt(*stop),
                source: Source::Sticky,
                shadow: false,
            };
        }
        Standing::Awaiting {
            reason, detector, ..
        } => {
            // Under `on_stop = "pause"` the response side let a looping call through
            // rather than halt: the request that follows it waits for a human.
            decision.action = Action::Pause;
            decision.reason = reason.clone();
            decision.detector = detector.clone();
            return Ruling {
                decision,
                act: Act::Hold,
                source: Source::Policy,
                shadow: false,
            };
        }
        Standing::Free { .. } => {}
    }
    if let BudgetStatus::Spent { .. } = budget {
        // A hard cap: the run stops before the call that would spend more, whatever
        // detection says, and without waiting for a human (`on_stop` is for loops).
        return Ruling {
            decision: budget_decision(budget, Action::Halt),
            act: Act::Halt(Stop::Budget),
            source: Source::Policy,
            shadow: false,
        };
    }
    if config.on_stop == StopMode::Pause && matches!(decision.action, Action::Halt | Action::Block)
    {
        decision.action = Action::Pause;
    }
    if decision.action == Action::Rollback && !config.rollback {
        decision.action = Action::Replan;
    }
    let act = match decision.action {
        Action::Observe => Act::Forward,
        Action::Nudge => Act::Remind(Reminder::Nudge),
        Action::Replan => Act::Remind(Reminder::Replan),
        Action::Rollback => Act::RollBack,
        Action::Pause => Act::Hold,
        Action::Halt | Action::Block => Act::Halt(Stop::of(&decision)),
    };
    if act == Act::Forward && matches!(budget, BudgetStatus::Near { .. }) {
        // Detection has nothing stronger to say: the wrap-up reminder.
        return Ruling {
            decision: budget_decision(budget, Action::Nudge),
            act: Act::Remind(Reminder::WrapUp),
            source: Source::Policy,
            shadow: false,
        };
    }
    Ruling {
        decision,
        act,
        source: Source::Policy,
        shadow: false,
    }
}

/// The decision a budget makes: its finding says which cap and how far (`$4.12 of $5.00`),
/// and is hard (a spent budget, not a loop) when the cap is reached.
fn budget_decision(budget: &BudgetStatus, action: Action) -> Decision {
    let (cap, spent) = match budget {
        BudgetStatus::Spent { cap, .. } => (*cap, true),
        BudgetStatus::Near { cap, .. } => (*cap, false),
        BudgetStatus::Within => return Decision::observe(),
    };
    let amount = budget.text().unwrap_or_default();
    let summary = match spent {
        true => format!("the {} budget is spent ({amount})", cap.noun()),
        false => format!("{amount} of the {} budget used", cap.noun()),
    };
    let mut finding = Finding::new(
        BUDGET_DETECTOR,
        1.0,
        Vec::new(),
        summary.clone(),
        "finish the current step, summarize what is done and what is left, and stop",
    );
    finding.hard = spent;
    Decision {
        action,
        findings: vec![finding],
        reason: summary,
        detector: BUDGET_DETECTOR.into(),
    }
}

/// The name a budget's decisions are logged under (`interventions.detector`): not a
/// detector's, so that a team's budget stops are never counted as loops.
pub const BUDGET_DETECTOR: &str = "budget_cap";

/// What happens to a held request once `by` gave `verdict` on `decision` (the one it was
/// held for). The ruling's decision is the verdict's action, for the log. A human's halt
/// is a person stopping the run; the timeout's (given early at shutdown too) is the
/// policy's own stop.
pub fn rule_verdict(verdict: Verdict, by: DecidedBy, decision: &Decision) -> Ruling {
    let halt = match by {
        DecidedBy::Human => Stop::Operator,
        DecidedBy::Timeout | DecidedBy::Shutdown => Stop::of(decision),
    };
    let (action, act) = match verdict {
        Verdict::Continue => (Action::Observe, Act::Forward),
        Verdict::Nudge => (Action::Nudge, Act::Remind(Reminder::Nudge)),
        Verdict::Halt => (Action::Halt, Act::Halt(halt)),
    };
    let mut decision = decision.clone();
    decision.action = action;
    Ruling {
        decision,
        act,
        source: by.into(),
        shadow: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Cap;

    fn decided(action: Action) -> Decision {
        Decision {
            action,
            reason: "ran `pytest` 3 times with the same failure".into(),
            detector: "fail_loop".into(),
            findings: Vec::new(),
        }
    }

    fn config(enabled: bool, on_stop: StopMode, rollback: bool) -> InterveneConfig {
        InterveneConfig {
            enabled,
            on_stop,
            rollback,
            ..InterveneConfig::default()
        }
    }

    #[test]
    fn the_engines_decision_under_every_switch_and_standing() {
        use Action::*;
        use StopMode::{Halt as H, Pause as P};
        let on = |on_stop, rollback| config(true, on_stop, rollback);
        let free = Standing::free;
        let halted = || Standing::Halted {
            reason: "earlier".into(),
            stop: Stop::Loop,
        };
        let by_hand = || Standing::Halted {
            reason: "earlier".into(),
            stop: Stop::Operator,
        };
        let awaiting = || Standing::Awaiting {
            reason: "earlier".into(),
            detector: "fail_loop".into(),
            resumed_at: Vec::new(),
        };
        let nudge = Act::Remind(Reminder::Nudge);
        let replan = Act::Remind(Reminder::Replan);
        let halt = Act::Halt(Stop::Loop);
        // (engine's action, switches, standing) → (action acted on, act, source)
        #[rustfmt::skip]
        let table: Vec<(Action, InterveneConfig, Standing, Action, Act, Source)> = vec![
            (Observe,  on(H, false), free(), Observe, Act::Forward, Source::Policy),
            (Nudge,    on(H, false), free(), Nudge,   nudge,        Source::Policy),
            (Replan,   on(H, false), free(), Replan,  replan,       Source::Policy),
            (Rollback, on(H, false), free(), Replan,  replan,       Source::Policy),
            (Rollback, on(H, true),  free(), Rollback, Act::RollBack, Source::Policy),
            (Pause,    on(H, false), free(), Pause,   Act::Hold,    Source::Policy),
            (Halt,     on(H, false), free(), Halt,    halt,         Source::Policy),
            (Block,    on(H, false), free(), Block,   halt,         Source::Policy),
            (Halt,     on(P, false), free(), Pause,   Act::Hold,    Source::Policy),
            (Block,    on(P, false), free(), Pause,   Act::Hold,    Source::Policy),
            (Nudge,    on(P, false), free(), Nudge,   nudge,        Source::Policy),
            // A halted conversation is answered with its halt, whatever the engine says,
            // and never held again.
            (Observe,  on(H, false), halted(), Halt, halt, Source::Sticky),
            (Nudge,    on(P, false), halted(), Halt, halt, Source::Sticky),
            // ... and its halt says who stopped it.
            (Observe,  on(H, false), by_hand(), Halt, Act::Halt(Stop::Operator), Source::Sticky),
            // A block let through under pause: the next request waits for a human.
            (Observe,  on(P, false), awaiting(), Pause, Act::Hold, Source::Policy),
            // Interventions off: everything is forwarded, the decision logged as it was.
            (Halt,     config(false, H, true), free(), Halt, Act::Forward, Source::Policy),
            (Nudge,    config(false, H, true), halted(), Nudge, Act::Forward, Source::Policy),
        ];
        for (action, config, standing, acted, act, source) in table {
            let r = rule(
                decided(action),
                &standing,
                &BudgetStatus::Within,
                &config,
                Mode::Enforce,
            );
            assert_eq!(
                (r.decision.action, r.act, r.source),
                (acted, act, source),
                "{action:?} under {:?}/{:?}/rollback {} when {standing:?}",
                config.enabled,
                config.on_stop,
                config.rollback
            );
            let reason = match &standing {
                Standing::Halted { reason, .. } | Standing::Awaiting { reason, .. }
                    if config.enabled =>
                {
                    reason.as_str()
                }
                _ => "ran `pytest` 3 times with the same failure",
            };
            assert_eq!(r.decision.reason, reason);
            assert_eq!(r.decision.detector, "fail_loop");
        }
    }

    #[test]
    fn a_verdict_rules_a_held_request() {
        let held = decided(Action::Pause);
        let table = [
            (
                Verdict::Continue,
                DecidedBy::Human,
                Action::Observe,
                Act::Forward,
                Source::Human,
            ),
            (
                Verdict::Nudge,
                DecidedBy::Human,
                Action::Nudge,
                Act::Remind(Reminder::Nudge),
                Source::Human,
            ),
            (
                Verdict::Halt,
                DecidedBy::Timeout,
                Action::Halt,
                Act::Halt(Stop::Loop),
                Source::Timeout,
            ),
            // Released by a stop: the timeout's verdict, said to be the stop's.
            (
                Verdict::Halt,
                DecidedBy::Shutdown,
                Action::Halt,
                Act::Halt(Stop::Loop),
                Source::Shutdown,
            ),
            // A person who decides to halt stopped the run.
            (
                Verdict::Halt,
                DecidedBy::Human,
                Action::Halt,
                Act::Halt(Stop::Operator),
                Source::Human,
            ),
        ];
        for (verdict, by, action, act, source) in table {
            let r = rule_verdict(verdict, by, &held);
            assert_eq!((r.decision.action, r.act, r.source), (action, act, source));
            assert_eq!(r.decision.reason, held.reason);
        }
    }

    #[test]
    fn a_spent_budget_halts_as_a_budget_and_not_as_a_loop() {
        let mut budget = decided(Action::Halt);
        budget.detector = "budget".into();
        let mut spent = crate::detect::Finding::new(
            "budget",
            1.0,
            vec![40],
            "41 steps used of an adaptive budget of 40".into(),
            "The step budget is spent.",
        );
        spent.hard = true;
        budget.findings = vec![spent];
        let config = config(true, StopMode::Halt, false);
        let r = rule(
            budget.clone(),
            &Standing::free(),
            &BudgetStatus::Within,
            &config,
            Mode::Enforce,
        );
        assert_eq!(r.act, Act::Halt(Stop::Budget));
        let r = rule_verdict(Verdict::Halt, DecidedBy::Timeout, &budget);
        assert_eq!(r.act, Act::Halt(Stop::Budget));
        let r = rule(
            decided(Action::Halt),
            &Standing::free(),
            &BudgetStatus::Within,
            &config,
            Mode::Enforce,
        );
        assert_eq!(r.act, Act::Halt(Stop::Loop));
    }

    fn near() -> BudgetStatus {
        BudgetStatus::Near {
            cap: Cap::Dollars,
            share: 0.85,
            used: "$4.25".into(),
            limit: "$5.00".into(),
        }
    }

    fn spent() -> BudgetStatus {
        BudgetStatus::Spent {
            cap: Cap::Dollars,
            used: "$5.02".into(),
            limit: "$5.00".into(),
        }
    }

    #[test]
    fn a_budget_reminds_near_its_cap_and_halts_at_it() {
        let config = config(true, StopMode::Pause, false);
        let free = Standing::free();
        let r = rule(
            decided(Action::Observe),
            &free,
            &near(),
            &config,
            Mode::Enforce,
        );
        assert_eq!(r.act, Act::Remind(Reminder::WrapUp));
        assert_eq!(r.decision.detector, BUDGET_DETECTOR);
        assert!(
            r.decision.reason.contains("$4.25 of $5.00"),
            "{}",
            r.decision.reason
        );
        // Detection's stronger word wins over the wrap-up reminder.
        let r = rule(
            decided(Action::Replan),
            &free,
            &near(),
            &config,
            Mode::Enforce,
        );
        assert_eq!(r.act, Act::Remind(Reminder::Replan));
        // A spent cap halts, whatever detection says, and not through a human's pause.
        let r = rule(
            decided(Action::Nudge),
            &free,
            &spent(),
            &config,
            Mode::Enforce,
        );
        assert_eq!(r.act, Act::Halt(Stop::Budget));
        assert!(r.decision.spent_budget());
        assert!(r.decision.reason.contains("dollar budget is spent"));
        // A halted conversation stays halted for the reason it was halted.
        let halted = Standing::Halted {
            reason: "by hand".into(),
            stop: Stop::Operator,
        };
        let r = rule(
            decided(Action::Observe),
            &halted,
            &spent(),
            &config,
            Mode::Enforce,
        );
        assert_eq!(
            (r.act, r.source),
            (Act::Halt(Stop::Operator), Source::Sticky)
        );
    }

    #[test]
    fn modes_bend_the_policys_rulings_and_never_a_persons() {
        let config = config(true, StopMode::Halt, true);
        let free = Standing::free();
        let within = BudgetStatus::Within;
        for action in [Action::Halt, Action::Block, Action::Pause] {
            let r = rule(decided(action), &free, &within, &config, Mode::NudgeOnly);
            assert_eq!(r.act, Act::Remind(Reminder::Replan), "{action:?}");
            assert!(!r.shadow);
        }
        let r = rule(
            decided(Action::Nudge),
            &free,
            &spent(),
            &config,
            Mode::NudgeOnly,
        );
        assert_eq!(
            r.act,
            Act::Remind(Reminder::Replan),
            "a spent budget reminds only"
        );
        for (action, budget, act) in [
            (Action::Halt, &within, Act::Halt(Stop::Loop)),
            (Action::Nudge, &within, Act::Remind(Reminder::Nudge)),
            (Action::Rollback, &within, Act::RollBack),
            (Action::Observe, &spent(), Act::Halt(Stop::Budget)),
        ] {
            let r = rule(decided(action), &free, budget, &config, Mode::Shadow);
            assert_eq!((r.act, r.shadow), (act, true), "{action:?}");
        }
        let r = rule(
            decided(Action::Observe),
            &free,
            &within,
            &config,
            Mode::Shadow,
        );
        assert_eq!((r.act, r.shadow), (Act::Forward, false));
        // An operator's halt holds in every mode.
        let halted = Standing::Halted {
            reason: "by hand".into(),
            stop: Stop::Operator,
        };
        for mode in [Mode::Shadow, Mode::NudgeOnly] {
            let r = rule(decided(Action::Observe), &halted, &within, &config, mode);
            assert_eq!((r.act, r.shadow), (Act::Halt(Stop::Operator), false));
        }
    }
}
