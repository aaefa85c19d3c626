//! self-diagnosed trouble: the assistant itself says it is stuck ("this isn't working",
//! "let me restore") several times within a few turns. Phrases come from config.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct SelfDiagnosed;

impl Detector for SelfDiagnosed {
    fn name(&self) -> &'static str {
        "self_diagnosed"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        if facts.trouble_steps.back() != Some(&step.index) {
            return None;
        }
        let hits: Vec<usize> = facts
            .trouble_steps
            .iter()
            .copied()
            .filter(|s| s + t.self_diag_window > step.index)
            .collect();
        if hits.len() < t.self_diag_hits as usize {
            return None;
        }
        Some(Finding::new(
            self.name(),
            0.5,
            hits.clone(),
            format!("the assistant said it is in trouble {} times in {} turns", hits.len(), t.self_diag_window),
            "You have noticed yourself that this is not working; stop and re-plan before the next attempt.",
        ))
    }
}
