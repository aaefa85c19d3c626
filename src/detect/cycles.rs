//! cycles: A-B-A-B, or a longer sequence of steps, repeating verbatim (actions and results)
//! at the tail of the conversation.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct Cycles;

impl Detector for Cycles {
    fn name(&self) -> &'static str {
        "cycles"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let h = &facts.history;
        let n = h.len();
        if step.changed {
            return None;
        }
        for p in 2..=cfg.thresholds.cycle_max_period.max(2) {
            // Two full periods and the start of a third: the third occurrence is the onset.
            let len = 2 * p + 1;
            if n < len {
                break;
            }
            let tail = &h[n - len..];
            if !(p..len).all(|i| tail[i].sig == tail[i - p].sig) {
                continue;
            }
            let period = &tail[..p];
            let distinct = period.iter().any(|d| d.sig != period[0].sig);
            if !distinct || period.iter().all(|d| d.calls == 0) {
                continue; // a period of one step is a plain repeat
            }
            if tail.iter().any(|d| d.changed) {
                continue;
            }
            return Some(Finding::new(
                self.name(),
                0.8,
                (n - len..n).collect(),
                format!("the last {p} steps repeat the {p} before them, actions and results alike (since step {})", n - len),
                "You are going round in a circle. Break the cycle: do something you have not done in it.",
            ));
        }
        None
    }
}
