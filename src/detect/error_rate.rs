//! error rate: more than a set share of the recent results are errors.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct ErrorRate;

impl Detector for ErrorRate {
    fn name(&self) -> &'static str {
        "error_rate"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        let window: Vec<_> = facts
            .recent
            .iter()
            .rev()
            .take(t.error_rate_window)
            .collect();
        if window.len() < t.error_rate_window || !step.calls.iter().any(|c| c.is_error) {
            return None;
        }
        let errors = window.iter().filter(|r| r.is_error).count();
        let rate = errors as f64 / window.len() as f64;
        if rate <= t.error_rate {
            return None;
        }
        Some(Finding::new(
            self.name(),
            rate.min(1.0),
            vec![step.index],
            format!("{errors} of the last {} results were errors", window.len()),
            "Most recent actions fail; check your assumptions about the environment.",
        ))
    }
}
