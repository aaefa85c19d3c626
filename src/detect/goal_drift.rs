//! goal drift: the recent actions and text share almost no words with the task.

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
        let mut recent: Vec<u64> = Vec::new();
        for s in facts.recent_step_tokens.iter().rev().take(t.goal_window) {
            for x in s {
                if !recent.contains(x) {
                    recent.push(*x);
                }
            }
        }
        if recent.is_empty() {
            return None;
        }
        let shared = recent
            .iter()
            .filter(|x| facts.task_tokens.contains(x))
            .count();
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
