//! obstacle stall: the run keeps meeting an obstacle it met before (the same error, the same
//! failing check, the same missing thing) and gets past none, however varied its commands
//! and however many new lines its results show ([`super::obstacles`]). Two shapes:
//! - one obstacle met again at step after step with no command getting past it between (a check
//!   that keeps returning the same verdict across edits, a launch that keeps dying on the
//!   same error whatever its flags);
//! - a stretch of steps with no progress in which obstacles met before keep coming back;
//! - one command started again after each failure with nothing changed in between (a long
//!   job restarted each time a timeout killed it: each start answers with another session).

use super::obstacles::Progress;
use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct ObstacleStall;

const SUGGESTION: &str = "You keep running into the same obstacle with variations of the same attempt. Stop and work out why it stands, or report it as the blocker.";

impl Detector for ObstacleStall {
    fn name(&self) -> &'static str {
        "obstacle_stall"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        let standing = step
            .calls
            .iter()
            .filter(|c| t.obstacle_meetings > 0 && c.obstacle.standing >= t.obstacle_meetings)
            .max_by_key(|c| c.obstacle.standing);
        if let Some(call) = standing {
            let n = call.obstacle.standing;
            return Some(
                Finding::new(
                    self.name(),
                    (0.6 + 0.1 * f64::from(n - t.obstacle_meetings)).min(1.0),
                    vec![step.index],
                    format!(
                        "the same obstacle, met again at {n} steps with nothing getting past it: {}",
                        super::short(&call.result_line)
                    ),
                    SUGGESTION,
                )
                .with_keys(vec![call.action.key_hash])
                .on_standstill(),
            );
        }
        let restarted = step
            .calls
            .iter()
            .filter(|c| t.obstacle_restarts > 0 && c.restarts >= t.obstacle_restarts)
            .max_by_key(|c| c.restarts);
        if let Some(call) = restarted {
            let n = call.restarts;
            return Some(
                Finding::new(
                    self.name(),
                    (0.6 + 0.1 * f64::from(n - t.obstacle_restarts)).min(1.0),
                    vec![step.index],
                    format!(
                        "`{}` started again {n} times after a failure, with nothing changed in between",
                        super::short(&call.action.label())
                    ),
                    SUGGESTION,
                )
                .with_keys(vec![call.action.key_hash])
                // A restart is no stand on an obstacle the facts can see (the kill came
                // through another call): it stops only where such a stand does.
                .on_standstill(),
            );
        }
        let o = &facts.obstacles;
        let min = t.obstacle_steps;
        if min == 0
            || step.progress != Progress::Stalled
            || o.stall_steps < min
            || o.stall_recurrences < t.obstacle_recurrences
        {
            return None;
        }
        let headline = o.standing.as_ref().map_or("", |(_, line)| line.as_str());
        Some(
            Finding::new(
                self.name(),
                (0.6 + 0.05 * f64::from(o.stall_steps - min)).min(1.0),
                (step.index + 1 - o.stall_steps as usize..=step.index).collect(),
                format!(
                    "{} steps without getting past an obstacle met before: {}",
                    o.stall_steps,
                    super::short(headline)
                ),
                SUGGESTION,
            )
            .with_keys(
                step.calls
                    .iter()
                    .filter(|c| c.obstacle.times > 1)
                    .map(|c| c.action.key_hash)
                    .collect(),
            )
            .on_standstill(),
        )
    }

    fn applies(&self, step: &StepEvents) -> bool {
        step.calls
            .iter()
            .any(|c| c.obstacle.obstacle != 0 || c.restarts > 0)
    }
}
