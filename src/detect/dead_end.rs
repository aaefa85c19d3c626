//! dead end: N steps in a row with no world change and no new information.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct DeadEnd;

impl Detector for DeadEnd {
    fn name(&self) -> &'static str {
        "dead_end"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.dead_end_steps;
        let n = facts.stretch.steps;
        if n < min || step.changed || step.new_info {
            return None;
        }
        Some(Finding::new(
            self.name(),
            (0.6 + 0.05 * (n - min) as f64).min(1.0),
            (step.index + 1 - n as usize..=step.index).collect(),
            format!("{n} steps in a row changed nothing and learned nothing new"),
            "This is a dead end. Summarize what you know, then choose a different route or report the blocker.",
        )
        .with_keys(step.calls.iter().map(|c| c.action.key_hash).collect()))
    }
}
