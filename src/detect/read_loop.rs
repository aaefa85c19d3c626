//! read-loop: the same file (region) read again and again with no change to it in between:
//! the agent is looking for something it already has.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct ReadLoop;

impl Detector for ReadLoop {
    fn name(&self) -> &'static str {
        "read_loop"
    }

    fn applies(&self, step: &StepEvents) -> bool {
        step.calls
            .iter()
            .any(|c| c.action.kind == crate::actions::ActionKind::Read)
    }

    fn check(&self, _facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.read_loop_reads;
        let call = step
            .calls
            .iter()
            .filter(|c| c.reads_since_change >= min)
            .max_by_key(|c| c.reads_since_change)?;
        let path = call.action.path.as_deref().unwrap_or("?");
        Some(
            Finding::new(
                self.name(),
                (0.6 + 0.1 * (call.reads_since_change - min) as f64).min(1.0),
                vec![step.index],
                format!(
                    "read `{path}` {} times with no change to it in between",
                    call.reads_since_change
                ),
                "You already have this file's content; use it, or look somewhere else.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
