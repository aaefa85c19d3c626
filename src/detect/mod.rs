//! Loop and drift detection: detectors (one file each) and the engine that turns their
//! findings into one decision per request. Everything here is a pure function of the
//! transcript and the config (plus the few store facts a transcript cannot hold, passed
//! in explicitly as [`StoreFacts`]).
//!
//! Follow a request: [`Engine::decide`] folds the transcript's steps one at a time into
//! [`facts::Facts`] (what changed, which results are new, per-check streaks), runs every
//! registered [`Detector`] on each new step, and the engine's escalation
//! ([`engine`]) turns the findings into the decision for the request that follows that
//! step. The fold is incremental: an [`EngineState`] continues with only new steps.

pub mod config;
pub mod engine;
pub mod facts;
pub mod obstacles;
pub mod registry;
pub mod score;

mod budget;
mod cycles;
mod dead_end;
mod edit_revert;
mod error_pileup;
mod error_rate;
mod fail_loop;
mod goal_drift;
mod near_duplicate;
mod obstacle_stall;
mod output_stagnation;
mod read_loop;
mod repeat;
mod repeated_text;
mod resend;
mod self_diagnosed;
mod size_oscillation;
mod stagnation;
mod verifier;

use serde::{Deserialize, Serialize};

pub use config::{Decider, DetectConfig, PatternPolicy, Response};
pub use engine::{Engine, EngineState, Folded, StoreFacts};
pub use facts::{Facts, StepEvents};

/// What the engine decides for one request (or one response, for `Block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Observe,
    Nudge,
    Replan,
    Rollback,
    Pause,
    Halt,
    Block,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Observe => "observe",
            Action::Nudge => "nudge",
            Action::Replan => "replan",
            Action::Rollback => "rollback",
            Action::Pause => "pause",
            Action::Halt => "halt",
            Action::Block => "block",
        }
    }

    /// The run stops here (for now): halt, pause or block.
    pub fn stops(self) -> bool {
        matches!(self, Action::Halt | Action::Pause | Action::Block)
    }
}

/// One detector's observation about a transcript.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub detector: String,
    /// 0.0 ..= 1.0
    pub confidence: f64,
    /// Step indexes that are the evidence.
    pub steps: Vec<usize>,
    /// One line a human understands.
    pub summary: String,
    /// What the agent should do instead.
    pub suggestion: String,
    /// A spent hard budget: may halt without an earlier nudge.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hard: bool,
    /// The pattern is a run standing on an obstacle: a stop it leads waits until the run
    /// has stood on it since its first intervention, with no change since (the engine's
    /// `may_stop`), whatever else the run did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standstill: bool,
    /// Action keys (see `actions::ToolAction::key_hash`) of the calls that make up the
    /// pattern, so the response side can recognize the call that would repeat it.
    #[serde(skip)]
    pub action_keys: Vec<u64>,
}

impl Finding {
    pub fn new(
        detector: &str,
        confidence: f64,
        steps: Vec<usize>,
        summary: String,
        suggestion: &str,
    ) -> Finding {
        Finding {
            detector: detector.to_string(),
            confidence: confidence.clamp(0.0, 1.0),
            steps,
            summary,
            suggestion: suggestion.to_string(),
            hard: false,
            standstill: false,
            action_keys: Vec::new(),
        }
    }

    /// Marks the finding as a run standing on an obstacle ([`Finding::standstill`]).
    pub fn on_standstill(mut self) -> Finding {
        self.standstill = true;
        self
    }

    pub fn with_keys(mut self, keys: Vec<u64>) -> Finding {
        self.action_keys = keys;
        self
    }
}

/// The engine's decision for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub action: Action,
    /// The findings of the step(s) behind the decision (warn-only findings included).
    pub findings: Vec<Finding>,
    pub reason: String,
    /// The detector that led the decision (empty for a plain observe).
    #[serde(default)]
    pub detector: String,
}

impl Decision {
    pub fn observe() -> Decision {
        Decision {
            action: Action::Observe,
            findings: Vec::new(),
            reason: String::new(),
            detector: String::new(),
        }
    }

    /// The finding that led the decision (its detector's), when the decision's step has
    /// it: what a reminder names and the log records. Not simply the first finding: the
    /// findings are in the detectors' order, and the lead is the weightiest.
    pub fn lead(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.detector == self.detector)
    }

    /// A hard budget was spent: the lead finding is a budget's, not a loop's.
    pub fn spent_budget(&self) -> bool {
        self.lead().is_some_and(|f| f.hard)
    }
}

/// A detector: a pure function of the folded facts, the newest step's events and the
/// config. Register it in [`registry::builtin`].
pub trait Detector: Send + Sync {
    /// The pattern's name (policy key, log field).
    fn name(&self) -> &'static str;
    /// Looks at the newest step; returns a finding when the pattern is present now.
    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding>;
    /// Whether the newest step was an occasion for this pattern (a check ran, for
    /// stagnation). The pattern's EMA moves only on its occasions, so a pattern that fires
    /// every time it can is chronic even when its occasions are a few steps apart.
    fn applies(&self, _step: &StepEvents) -> bool {
        true
    }
}

/// A text cut to one short line for summaries. A line too long is cut before the word the
/// limit falls in, when it has a space before it: half a word (half a token, half a key)
/// would neither read well nor be recognized as a key by the log's masking.
pub fn short(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.chars().count() <= 80 {
        return line.to_string();
    }
    let cut: String = line.chars().take(77).collect();
    let next = line.chars().nth(77).unwrap_or(' ');
    let cut = match cut.rfind(char::is_whitespace) {
        Some(space) if !next.is_whitespace() => cut[..space].trim_end(),
        _ => cut.as_str(),
    };
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::short;

    #[test]
    fn a_long_line_is_cut_before_the_word_the_limit_falls_in() {
        let key = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC03In0.Tq9Vb2Nw5Zr8Lk1Xc4Hy7Pf0Gj3";
        let line = format!("python3 test_calc.py --with {key}");
        assert_eq!(short(&line), "python3 test_calc.py --with...");
        assert_eq!(short("short\nsecond line"), "short");
        let word = "x".repeat(100);
        assert_eq!(short(&word), format!("{}...", "x".repeat(77)));
        let spaced = format!("{} tail", "y ".repeat(38));
        assert!(short(&spaced).len() <= 80, "{}", short(&spaced));
    }
}
