//! The one place detectors are registered. To add a detector: implement [`Detector`] in
//! its own file, list it here (or pass it to `Engine::with_detectors`) and give it a
//! built-in policy (`config::default_policy`).
//!
//! Settings never reach back here: `config` names patterns by their names only, so the
//! detectors (which read the settings) and the list of them point one way.

use super::config::DetectConfig;
use super::Detector;

/// All built-in detectors, in reporting order.
pub fn builtin() -> Vec<Box<dyn Detector>> {
    vec![
        Box::new(super::stagnation::Stagnation),
        Box::new(super::fail_loop::FailLoop),
        Box::new(super::repeat::Repeat),
        Box::new(super::cycles::Cycles),
        Box::new(super::resend::Resend),
        Box::new(super::edit_revert::EditRevert),
        Box::new(super::dead_end::DeadEnd),
        Box::new(super::obstacle_stall::ObstacleStall),
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

/// Every `[detect.patterns.<name>]` names a registered detector; the error lists them.
pub fn check_patterns(cfg: &DetectConfig) -> Result<(), String> {
    let known = builtin();
    let known: Vec<&str> = known.iter().map(|d| d.name()).collect();
    match cfg.patterns.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(format!(
            "no detector is named {unknown:?}; the detectors: {}",
            known.join(", ")
        )),
        None => Ok(()),
    }
}
