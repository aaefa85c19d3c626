//! goal drift: the recent actions and text share almost no words with the task.

use super::facts::HashSet;
use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct GoalDrift;

impl Detector for GoalDrift {
    fn name(&self) -> &'static str {
        "goal_drift"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        if facts.task_tokens.is_empty() || facts.recent_step_tokens.len() < t.goal_window {
            return None;
        }
        // The window's distinct words, and how many of them the task has. A set, not a
        // membership test per word in a list: that was quadratic in the window (up to 10
        // steps of 48 words each), a quarter of the engine's work on a step.
        let window = facts.recent_step_tokens.iter().rev().take(t.goal_window);
        let mut recent = HashSet::with_capacity_and_hasher(
            window.clone().map(Vec::len).sum(),
            Default::default(),
        );
        let mut shared = 0;
        for x in window.flatten() {
            if recent.insert(*x) && facts.task_tokens.contains(x) {
                shared += 1;
            }
        }
        if recent.is_empty() {
            return None;
        }
        let overlap = shared as f64 / recent.len() as f64;
        if overlap >= t.goal_overlap {
            return None;
        }
        Some(Finding::new(
            self.name(),
            0.4,
            vec![step.index],
            format!(
                "the last {} steps share {:.0}% of their words with the task",
                t.goal_window,
                overlap * 100.0
            ),
            "Re-read the task: recent work seems unrelated to it.",
        ))
    }
}
