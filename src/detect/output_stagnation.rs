//! output stagnation: different calls returning the same (non-empty) result again and
//! again: reworded searches that all find nothing, different commands hitting one error.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct OutputStagnation;

impl Detector for OutputStagnation {
    fn name(&self) -> &'static str {
        "output_stagnation"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let n = cfg.thresholds.output_same as usize;
        if step.changed || n < 2 {
            return None;
        }
        let tail: Vec<_> = facts
            .recent
            .iter()
            .rev()
            .filter(|r| !r.changed && !r.empty)
            .take(n)
            .collect();
        if tail.len() < n || tail[0].index != step.index {
            return None;
        }
        let first = tail[0];
        if !tail.iter().all(|r| r.result == first.result) {
            return None;
        }
        let mut keys: Vec<u64> = tail.iter().map(|r| r.key).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() < 2 {
            return None; // one call repeated: the repeat detectors' business
        }
        let line = step
            .calls
            .iter()
            .find(|c| c.result == first.result)
            .map(|c| c.result_line.clone())
            .unwrap_or_default();
        Some(
            Finding::new(
                self.name(),
                0.6,
                tail.iter().map(|r| r.index).rev().collect(),
                format!(
                    "{n} different calls in a row returned the same result: {}",
                    super::short(&line)
                ),
                "Different attempts keep producing the same answer; the variations are not the issue. Rethink the approach.",
            )
            .with_keys(keys),
        )
    }
}
