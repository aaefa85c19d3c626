//! fail-loop: one command fails again and again with the very same (normalized) error.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct FailLoop;

impl Detector for FailLoop {
    fn name(&self) -> &'static str {
        "fail_loop"
    }

    /// Its occasions are failed commands: an editor call that found no match is not a
    /// command failing again, and counting it would dilute the pattern's EMA until a
    /// command failing the same way over and over never reads as chronic.
    fn applies(&self, step: &StepEvents) -> bool {
        step.calls
            .iter()
            .any(|c| c.is_error && c.action.command.is_some())
    }

    fn check(&self, _facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.fail_loop_runs;
        let call = step
            .calls
            .iter()
            .filter(|c| c.fail_run >= min)
            .max_by_key(|c| c.fail_run)?;
        let what = call.action.label();
        Some(
            Finding::new(
                self.name(),
                (0.7 + 0.1 * (call.fail_run - min) as f64).min(1.0),
                vec![step.index],
                format!(
                    "`{}` failed {} times in a row with the same error: {}",
                    super::short(&what),
                    call.fail_run,
                    super::short(&call.result_line)
                ),
                "The same command keeps failing the same way; change what causes the error before running it again.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
