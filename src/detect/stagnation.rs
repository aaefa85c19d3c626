//! outcome stagnation: a check command (test, script, build) returns a result it has
//! already returned, run after run, whatever was edited in between. Progress is a new
//! outcome, not a new action (DESIGN principle 3): this catches the commonest real loop,
//! edit → same test → same failure → edit again, which no repeat counter sees.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct Stagnation;

impl Detector for Stagnation {
    fn name(&self) -> &'static str {
        "stagnation"
    }

    fn applies(&self, step: &StepEvents) -> bool {
        step.calls
            .iter()
            .any(|c| c.action.check.is_some() && c.has_result)
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        let call = step
            .calls
            .iter()
            .filter(|c| c.check_streak >= t.stagnation_streak)
            .filter(|c| t.stagnation_counts_success || c.check_streak_failing)
            .max_by_key(|c| c.check_streak)?;
        // A failure reproduced run after run is firmer evidence than an output that does
        // not change: a check that prints the same values (or passes) after each edit may
        // be the agent re-verifying its fix. Such a streak starts one rung lower, so it
        // needs one more run to escalate.
        let base = if call.check_streak_failing { 0.7 } else { 0.6 };
        let since = match facts.last_change {
            Some(s) => format!("last file change at step {s}"),
            None => "no file changed".to_string(),
        };
        Some(
            Finding::new(
                self.name(),
                (base + 0.1 * (call.check_streak - t.stagnation_streak) as f64).min(1.0),
                vec![step.index],
                format!(
                    "ran `{}` {} more times with results it had already given ({}); {since}",
                    // As the agent ran it: the check's key is normalized (words sorted).
                    super::short(&call.action.label()),
                    call.check_streak,
                    super::short(&call.result_line)
                ),
                "Your changes are not changing the outcome. Re-read the failure, check that your edits reach the code that runs, and try a different approach.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
