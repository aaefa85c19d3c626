//! exact and category repeat: the same call (equal after normalization of argument key
//! order, whitespace, flag order and trivial shell spellings) getting the same result
//! again within one unchanged stretch — nothing changed and nothing new was learned; and
//! the same change issued verbatim more than `repeat_count` steps in a row.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct Repeat;

impl Detector for Repeat {
    fn name(&self) -> &'static str {
        "repeat"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.repeat_count;
        // A change issued verbatim again and again (SWE-agent inserting the same block at the
        // same line, each time believing it removes the duplicate): each run changes the
        // file, so no stretch stays unchanged, but the agent is repeating itself.
        if step.changed && step.identical_run > min {
            let call = step.calls.iter().find(|c| c.changed)?;
            let extra = step.identical_run - min - 1;
            return Some(
                Finding::new(
                    self.name(),
                    (0.7 + 0.1 * f64::from(extra)).min(1.0),
                    vec![step.index],
                    format!(
                        "issued the same change `{}` {} times in a row",
                        super::short(&call.action.label()),
                        step.identical_run
                    ),
                    "You are applying the very same change again. Look at the file as it is now before changing it further.",
                ),
                // No loop keys: a change is not blocked on the way back, the run gets its
                // reminders first (a repeated edit can still be the agent's way out).
            );
        }
        let call = step.calls.iter().find(|c| c.stretch_repeat)?;
        if facts.stretch.repeats < min {
            return None;
        }
        let what = call.action.label();
        Some(
            Finding::new(
                self.name(),
                (0.6 + 0.1 * (facts.stretch.repeats - min) as f64).min(1.0),
                facts.stretch.repeat_steps.clone(),
                format!(
                    "repeated `{}` with the same result; {} repeats since step {} with no change and nothing new",
                    super::short(&what),
                    facts.stretch.repeats,
                    facts.stretch.start
                ),
                "You already ran this and got this answer. Use the result you have, or do something different.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
