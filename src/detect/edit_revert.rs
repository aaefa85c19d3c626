//! edit-revert: a file brought back to a state it had before — a write of an earlier
//! content, an edit that undoes an earlier one, a patch that reverses an earlier patch —
//! and then moved away again. One diagnostic revert gains information and is allowed by
//! the default threshold (2 returns: undo, then redo).

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct EditRevert;

impl Detector for EditRevert {
    fn name(&self) -> &'static str {
        "edit_revert"
    }

    fn applies(&self, step: &StepEvents) -> bool {
        step.changed
    }

    fn check(&self, _facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.edit_revert_returns;
        let call = step.calls.iter().find(|c| c.file_returns >= min)?;
        let path = call.action.path.as_deref().unwrap_or("?");
        Some(
            Finding::new(
                self.name(),
                (0.7 + 0.1 * (call.file_returns - min) as f64).min(1.0),
                vec![step.index],
                format!(
                    "`{path}` went back to an earlier version {} times: edits are being undone and redone",
                    call.file_returns
                ),
                "Stop flipping between versions; decide which version is right from the evidence you have.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
