//! file-size oscillation: a file's size swinging up and down across edits (content added,
//! removed, added again).

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};
use crate::actions::norm_path;

pub struct SizeOscillation;

impl Detector for SizeOscillation {
    fn name(&self) -> &'static str {
        "size_oscillation"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.size_reversals as usize;
        for call in step.calls.iter().filter(|c| c.changed) {
            let Some(path) = call.action.path.as_deref() else {
                continue;
            };
            let Some(f) = facts.files.get(&norm_path(path)) else {
                continue;
            };
            let sizes = &f.sizes[f.sizes.len().saturating_sub(min + 3)..];
            let dirs: Vec<i64> = sizes
                .windows(2)
                .map(|w| (w[1] - w[0]).signum())
                .filter(|d| *d != 0)
                .collect();
            let reversals = dirs.windows(2).filter(|w| w[0] != w[1]).count();
            if reversals >= min {
                return Some(Finding::new(
                    self.name(),
                    0.6,
                    vec![step.index],
                    format!("`{path}` keeps growing and shrinking ({reversals} reversals over its last edits)"),
                    "Edits keep adding and removing the same material; settle on one version.",
                ));
            }
        }
        None
    }
}
