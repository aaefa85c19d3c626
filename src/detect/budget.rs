//! budget: per-conversation step and token budgets that adapt to progress: each step that
//! changes the world earns steps, each stuck step costs some, and a long stuck run costs
//! double. A spent budget is hard: it may halt without an earlier nudge.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct Budget;

/// The step budget as it stands after the folded steps (None = no step budget).
pub fn step_budget(facts: &Facts, cfg: &DetectConfig) -> Option<f64> {
    let b = &cfg.budget;
    if b.steps == 0 {
        return None;
    }
    let mut budget = b.steps as f64 + b.expand_per_change * facts.changed_steps as f64
        - b.shrink_per_stuck * facts.stuck_steps as f64;
    if facts.stuck_run >= b.hard_stuck_run {
        budget -= b.shrink_per_stuck * facts.stuck_run as f64;
    }
    Some(budget)
}

impl Detector for Budget {
    fn name(&self) -> &'static str {
        "budget"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        if let Some(budget) = step_budget(facts, cfg) {
            if facts.steps as f64 > budget {
                let mut f = Finding::new(
                    self.name(),
                    1.0,
                    vec![step.index],
                    format!(
                        "{} steps used of an adaptive budget of {budget:.0}",
                        facts.steps
                    ),
                    "The step budget is spent.",
                );
                f.hard = true;
                return Some(f);
            }
        }
        let tokens = cfg.budget.tokens;
        if tokens > 0 && facts.tokens > tokens {
            let mut f = Finding::new(
                self.name(),
                1.0,
                vec![step.index],
                format!("about {} tokens used of a budget of {tokens}", facts.tokens),
                "The token budget is spent.",
            );
            f.hard = true;
            return Some(f);
        }
        None
    }
}
