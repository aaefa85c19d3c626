//! What a policy table would have done with each logged request, for `loopwarden replay
//! --db`: detection's decision (`super::log`) ruled on by the proxy's own ruling
//! (`crate::intervene::ruling::rule`) under the policy's mode and `[intervene]` switches,
//! against its budget as the run had used it by then (`crate::budget::BudgetStatus::of`).
//! So a candidate that turns a shadow policy to enforce shows its would-be halts become
//! halts, and one that lowers a budget shows the step at which the run would have stopped.
//!
//! The run is taken as the log holds it: each request's budget counts the answers to the
//! requests that carried fewer steps (their logged tokens and dollars), and the time from
//! the run's first request. The conversation's standing is free throughout (no operator
//! halted it), and the comparison ends at the first request either table stops the run at.

use std::sync::Arc;

use crate::budget::{BudgetStatus, Used};
use crate::detect::Decision;
use crate::intervene::controls::Standing;
use crate::intervene::ruling::rule;
use crate::intervene::Applied;
use crate::policy::Policy;

/// One answered request of a logged run, as its budget counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answered {
    /// The steps its history held; `None` when the log does not say (not counted).
    pub steps: Option<i64>,
    pub started_ms: i64,
    /// Its answer's tokens, every kind (0 when the usage was not logged).
    pub tokens: u64,
    /// Its answer's cost (0 when not known).
    pub dollars: f64,
}

/// A logged run's answered requests, in the order they started.
#[derive(Debug, Clone, Default)]
pub struct Spent {
    pub answered: Vec<Answered>,
}

impl Spent {
    /// What the run had used when it made the request carrying `k` steps: the answers to
    /// the requests with fewer steps, and the time from its first request to that one.
    fn used_at(&self, k: usize) -> Used {
        let k = k as i64;
        let before = self
            .answered
            .iter()
            .filter(|a| a.steps.is_some_and(|s| s < k));
        let (tokens, dollars) = before.fold((0, 0.0), |(t, d), a| (t + a.tokens, d + a.dollars));
        let first = self.answered.first().map(|a| a.started_ms);
        let at = self
            .answered
            .iter()
            .find(|a| a.steps.is_some_and(|s| s >= k))
            .or(self.answered.last())
            .map(|a| a.started_ms);
        let elapsed_ms = match (first, at) {
            (Some(first), Some(at)) => (at - first).max(0),
            _ => 0,
        };
        Used {
            steps: k.max(0) as u64,
            tokens,
            dollars,
            elapsed_secs: elapsed_ms as f64 / 1000.0,
        }
    }
}

/// What was done with a request, as the log says it: `halted(fail_loop)`,
/// `would_halt(budget_cap)`, `forwarded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub applied: Applied,
    /// The detector (or `budget_cap`) behind it; empty for a request forwarded untouched.
    pub detector: String,
}

impl Done {
    /// Whether it stops the run (a halt, or a hold for a human).
    fn stops(&self) -> bool {
        matches!(self.applied, Applied::Halted | Applied::Held)
    }
}

impl std::fmt::Display for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.detector.as_str() {
            "" => f.write_str(self.applied.as_str()),
            detector => write!(f, "{}({detector})", self.applied.as_str()),
        }
    }
}

/// A request the candidate's policy table would have done otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneChange {
    pub step: usize,
    pub current: Done,
    pub candidate: Done,
}

impl DoneChange {
    /// Whether the candidate stops the run here and the current table did not.
    pub fn adds_a_stop(&self) -> bool {
        self.candidate.stops() && !self.current.stops()
    }

    pub fn removes_a_stop(&self) -> bool {
        self.current.stops() && !self.candidate.stops()
    }
}

impl std::fmt::Display for DoneChange {
    /// `step 7 done: would_halt(fail_loop) -> halted(fail_loop)`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} done: {} -> {}",
            self.step, self.current, self.candidate
        )
    }
}

/// What `policy` does with the request carrying `k` steps, detection having decided
/// `decision`: the proxy's ruling under the policy's mode, switches and budget.
fn done(policy: &Policy, decision: &Decision, k: usize, spent: &Spent) -> Done {
    let budget = match policy.budget.is_unlimited() {
        true => BudgetStatus::Within,
        false => BudgetStatus::of(&policy.budget, &spent.used_at(k)),
    };
    let ruling = rule(
        decision.clone(),
        &Standing::free(),
        &budget,
        policy.intervene(),
        policy.mode,
    );
    let applied = ruling.intended();
    let detector = match applied {
        Applied::Forwarded => String::new(),
        _ => ruling.decision.detector,
    };
    Done { applied, detector }
}

/// Each request's outcome under both policies (from the decisions each one's detection
/// made: `(steps, decision)` per request), and where they differ, up to the first request
/// at which either stops the run.
pub fn compare(
    current: (&Arc<Policy>, &[(usize, Decision)]),
    candidate: (&Arc<Policy>, &[(usize, Decision)]),
    spent: &Spent,
) -> Vec<DoneChange> {
    let outcomes = |(policy, decisions): (&Arc<Policy>, &[(usize, Decision)])| {
        decisions
            .iter()
            .map(|(k, d)| (*k, done(policy, d, *k, spent)))
            .collect::<Vec<_>>()
    };
    let (before, after) = (outcomes(current), outcomes(candidate));
    let first_stop = |done: &[(usize, Done)]| {
        done.iter()
            .find(|(_, d)| d.stops())
            .map_or(usize::MAX, |(k, _)| *k)
    };
    // Past the first stop the runs part: under the table that stopped it the agent got the
    // halt (and would get it again), so the requests the log holds after it never were.
    let last = first_stop(&before).min(first_stop(&after));
    before
        .into_iter()
        .zip(after)
        .take_while(|((k, _), _)| *k <= last)
        .filter(|((_, b), (_, a))| b != a)
        .map(|((step, current), (_, candidate))| DoneChange {
            step,
            current,
            candidate,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(steps: i64, started_ms: i64, tokens: u64) -> Answered {
        Answered {
            steps: Some(steps),
            started_ms,
            tokens,
            dollars: tokens as f64 / 1000.0,
        }
    }

    #[test]
    fn a_request_counts_the_answers_before_it_and_the_time_since_the_first() {
        let spent = Spent {
            answered: vec![
                answered(0, 1_000, 100),
                answered(1, 3_000, 200),
                answered(2, 6_000, 400),
            ],
        };
        let used = spent.used_at(2);
        assert_eq!((used.steps, used.tokens), (2, 300));
        assert!((used.dollars - 0.3).abs() < 1e-9);
        assert_eq!(used.elapsed_secs, 5.0);
        assert_eq!(spent.used_at(0).tokens, 0);
        assert_eq!(Spent::default().used_at(3).steps, 3);
    }
}
