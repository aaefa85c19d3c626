//! Loop and drift detection: detectors (one file each) and the engine that turns their
//! findings into one decision per request. Everything here is a pure function of the
//! transcript and the config.

use serde::{Deserialize, Serialize};

use crate::transcript::Transcript;

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
}

/// The engine's decision for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub action: Action,
    /// The findings that led to the action (empty for a plain observe).
    pub findings: Vec<Finding>,
    pub reason: String,
}

impl Decision {
    pub fn observe() -> Decision {
        Decision {
            action: Action::Observe,
            findings: Vec::new(),
            reason: String::new(),
        }
    }
}

/// Detection settings (the `[detect]` table of the config file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DetectConfig {}

/// Runs the detectors over a transcript and decides.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    pub config: DetectConfig,
}

impl Engine {
    pub fn new(config: DetectConfig) -> Engine {
        Engine { config }
    }

    /// The decision for the request that carries `transcript` (before it is forwarded).
    pub fn decide(&self, transcript: &Transcript) -> Decision {
        let _ = transcript;
        Decision::observe()
    }
}
