//! The one place detectors are registered, with each pattern's built-in policy.
//! To add a detector: implement [`Detector`] in its own file and list it here (or pass
//! it to `Engine::with_detectors`).

use super::config::{PatternPolicy, Response};
use super::Action;
use super::Detector;

/// All built-in detectors, in reporting order.
pub fn builtin() -> Vec<Box<dyn Detector>> {
    vec![
        Box::new(super::stagnation::Stagnation),
        Box::new(super::fail_loop::FailLoop),
        Box::new(super::repeat::Repeat),
        Box::new(super::cycles::Cycles),
        Box::new(super::edit_revert::EditRevert),
        Box::new(super::dead_end::DeadEnd),
        Box::new(super::error_pileup::ErrorPileup),
        Box::new(super::read_loop::ReadLoop),
        Box::new(super::near_duplicate::NearDuplicate),
        Box::new(super::output_stagnation::OutputStagnation),
        Box::new(super::size_oscillation::SizeOscillation),
        Box::new(super::error_rate::ErrorRate),
        Box::new(super::self_diagnosed::SelfDiagnosed),
        Box::new(super::verifier::VerifierDrift),
        Box::new(super::goal_drift::GoalDrift),
        Box::new(super::repeated_text::RepeatedText),
        Box::new(super::budget::Budget),
    ]
}

/// The shipped policy of each pattern: outcome-based signals may halt; the noisier
/// ones (counted on the recorded runs) warn or nudge only. read-loop warns: re-reading
/// a file while editing others is what good runs do (it nudged 11 of 151 successful
/// mini-swe-agent runs on the dev set and caught no labelled loop first).
pub fn default_policy(detector: &str) -> PatternPolicy {
    match detector {
        "stagnation" | "fail_loop" | "repeat" | "cycles" | "dead_end" | "error_pileup"
        | "budget" => PatternPolicy::new(Response::Halt, 1.0),
        "edit_revert" => PatternPolicy {
            response: Response::Halt,
            weight: 1.0,
            first_action: Action::Rollback,
        },
        "near_duplicate" | "output_stagnation" | "verifier_drift" => {
            PatternPolicy::new(Response::Nudge, 1.0)
        }
        _ => PatternPolicy::new(Response::Warn, 0.5),
    }
}
