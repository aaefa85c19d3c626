//! repeated text: the assistant writing the same passage turn after turn.

use super::{DetectConfig, Detector, Facts, Finding, StepEvents};

pub struct RepeatedText;

impl Detector for RepeatedText {
    fn name(&self) -> &'static str {
        "repeated_text"
    }

    fn check(&self, facts: &Facts, step: &StepEvents, cfg: &DetectConfig) -> Option<Finding> {
        let t = &cfg.thresholds;
        let (hash, len) = *facts.texts.back()?;
        if len < t.repeated_text_chars {
            return None;
        }
        let earlier = facts
            .texts
            .iter()
            .rev()
            .skip(1)
            .filter(|(h, _)| *h == hash)
            .count() as u32;
        if earlier < t.repeated_text_count {
            return None;
        }
        Some(Finding::new(
            self.name(),
            0.6,
            vec![step.index],
            format!("the assistant wrote the same {len}-character passage {} times recently", earlier + 1),
            "You are repeating yourself word for word; say what is different this time, or change course.",
        ))
    }
}
