//! near-duplicates: the same intent with small variations (a reworded search, another
//! guessed path) getting no new information, by token-set (Jaccard) similarity of the
//! action and its result.

use super::facts::jaccard;
use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct NearDuplicate;

impl Detector for NearDuplicate {
    fn name(&self) -> &'static str {
        "near_duplicate"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        if step.changed || step.new_info {
            return None;
        }
        for call in step
            .calls
            .iter()
            .filter(|c| c.has_result && !c.tokens.is_empty())
        {
            let mut similar_steps: Vec<usize> = facts
                .recent
                .iter()
                .filter(|r| r.index >= facts.stretch.start && r.index < step.index)
                .filter(|r| jaccard(&r.tokens, &call.tokens) >= t.near_dup_similarity)
                .map(|r| r.index)
                .collect();
            similar_steps.dedup();
            if similar_steps.len() + 1 >= t.near_dup_count as usize {
                similar_steps.push(step.index);
                return Some(
                    Finding::new(
                        self.name(),
                        0.6,
                        similar_steps.clone(),
                        format!(
                            "{} near-identical attempts with no new information: {}",
                            similar_steps.len(),
                            super::short(&call.action.label())
                        ),
                        "Small variations of the same attempt are not getting anywhere; try a substantially different approach.",
                    )
                    .with_keys(vec![call.action.key_hash]),
                );
            }
        }
        None
    }
}
