//! error pile-up: errors accumulating since the last real change — typically an agent
//! fighting its environment (a missing toolchain, a broken command) with variations that
//! change nothing.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct ErrorPileup;

impl Detector for ErrorPileup {
    fn name(&self) -> &'static str {
        "error_pileup"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        if step.changed || !step.calls.iter().any(|c| c.is_error) {
            return None;
        }
        let errors = facts.errors_since_change;
        let calls = facts.calls_since_change.max(1);
        if errors < t.pileup_errors || (errors as f64) < t.pileup_share * calls as f64 {
            return None;
        }
        let keys = step
            .calls
            .iter()
            .filter(|c| c.is_error)
            .map(|c| c.action.key_hash)
            .collect();
        Some(
            Finding::new(
                self.name(),
                (0.6 + 0.05 * (errors - t.pileup_errors) as f64).min(1.0),
                vec![step.index],
                format!(
                    "{errors} errors out of {calls} calls since the last real change ({} different commands failing)",
                    facts.failing_keys_since_change.len()
                ),
                "Errors keep piling up without any change landing. Step back: find the root obstacle (missing tool, wrong path, wrong environment) or report it.",
            )
            .with_keys(keys),
        )
    }
}
