//! verifier score drift: a configured verify command's score falls twice in a row. A
//! rising score is real progress; the engine then holds back the other detectors.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct VerifierDrift;

/// Whether this step's verifier score rose over the previous one.
pub fn rising(facts: &Facts, step: &StepEvents) -> bool {
    let s = &facts.verifier_scores;
    step.calls.iter().any(|c| c.verifier_score.is_some())
        && s.len() >= 2
        && s[s.len() - 1] > s[s.len() - 2]
}

impl Detector for VerifierDrift {
    fn name(&self) -> &'static str {
        "verifier_drift"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, _cfg: &DetectConfig) -> Option<Finding> {
        let s = &facts.verifier_scores;
        if !step.calls.iter().any(|c| c.verifier_score.is_some()) || s.len() < 3 {
            return None;
        }
        let n = s.len();
        if !(s[n - 1] < s[n - 2] && s[n - 2] < s[n - 3]) {
            return None;
        }
        Some(Finding::new(
            self.name(),
            0.8,
            vec![step.index],
            format!(
                "the verifier's score fell twice in a row: {} → {} → {}",
                s[n - 3],
                s[n - 2],
                s[n - 1]
            ),
            "Your recent changes make things worse; go back to the version that scored best.",
        ))
    }
}
