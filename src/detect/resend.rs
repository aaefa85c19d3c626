//! resend: one call returning one result again and again with nothing changed in between,
//! whatever else the run learned meanwhile. A command re-sent after it had worked, a poll
//! of a process that has exited or a screen that no longer moves, the same long job
//! restarted after each time a timeout killed it. Commands are compared as the action key
//! reads them (a shell comment or extra whitespace makes no new command).

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct Resend;

impl Detector for Resend {
    fn name(&self) -> &'static str {
        "resend"
    }

    fn check(&self, _facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let min = cfg.thresholds.resend_count;
        let call = step
            .calls
            .iter()
            .filter(|c| !c.changed && c.resent >= min)
            .max_by_key(|c| c.resent)?;
        Some(
            Finding::new(
                self.name(),
                (0.6 + 0.1 * f64::from(call.resent - min)).min(1.0),
                vec![step.index],
                format!(
                    "`{}` returned the same result {} times with nothing changed in between",
                    super::short(&call.action.label()),
                    call.resent
                ),
                "This call keeps giving the same answer. Act on the answer, or find out why nothing moves, instead of asking again.",
            )
            .with_keys(vec![call.action.key_hash]),
        )
    }
}
