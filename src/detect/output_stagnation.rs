//! output stagnation: different calls returning the same (non-empty) result again and
//! again: reworded searches that all find nothing, different commands hitting one error.

use super::facts::Recent;
use super::{DetectConfig, Detector, Facts, Finding, StepEvents};
use crate::actions::ActionKind;

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
        // One result per step: calls sent together in one step (a burst of globs that all
        // find nothing) are one attempt, not several. Calls no profile or inference reads
        // (a plan or to-do tool's "updated" receipt) say nothing about the work.
        let mut tail: Vec<&Recent> = Vec::with_capacity(n);
        for r in facts.recent.iter().rev() {
            if r.changed || r.empty || r.kind == ActionKind::Other {
                continue;
            }
            if tail.last().is_some_and(|last| last.index == r.index) {
                continue;
            }
            tail.push(r);
            if tail.len() == n {
                break;
            }
        }
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
