//! exact and category repeat: the same call (equal after normalization of argument key
//! order, whitespace, flag order and trivial shell spellings) getting the same result
//! again within one unchanged stretch — nothing changed and nothing new was learned.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct Repeat;

impl Detector for Repeat {
    fn name(&self) -> &'static str {
        "repeat"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.repeat_count;
        let call = step.calls.iter().find(|c| c.stretch_repeat)?;
        if facts.stretch.repeats < min {
            return None;
        }
        let what = call
            .action
            .command
            .as_deref()
            .unwrap_or(call.action.key.as_str());
        Some(
            Finding::new(
                self.name(),
                (0.6 + 0.1 * (facts.stretch.repeats - min) as f64).min(1.0),
                facts.stretch.repeat_steps.clone(),
                format!(
                    "repeated `{}` with the same result; {} repeats since step {} with no change and nothing new",
                    super::short(what),
                    facts.stretch.repeats,
                    facts.stretch.start
                ),
                "You already ran this and got this answer. Use the result you have, or do something different.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
