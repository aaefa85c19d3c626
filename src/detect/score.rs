//! The calibrated score: one probability per step, read from the facts the fold already
//! keeps, that turns into the decision instead of the ladder when `[detect] decider =
//! "score"`.
//!
//! Its meaning: the chance that the request after this step comes inside a loop a reader
//! labelled (on the hand-labelled recorded runs: at or after the loop's onset, before its
//! end). The model is fitted outside the proxy (`scripts/fit_score.py`, scikit-learn) and
//! shipped as plain data (`score_model.json`): feature names, and either a logistic
//! regression's weights or a gradient-boosted ensemble of trees. Evaluating it costs a few
//! dozen multiplications (logistic) or a few hundred comparisons (150 trees of depth 3)
//! per step, with no dependency beyond serde.
//!
//! The decision: a nudge when the probability reaches `nudge_at` (again after the cooldown),
//! a halt when it reaches `stop_at` once an earlier reminder came at least the escalation
//! gap before. The script chooses both thresholds on training families only.

use serde::Deserialize;

use super::config::{DetectConfig, Response};
use super::facts::{Facts, StepEvents};
use super::obstacles::Progress;
use super::Finding;

/// Steps counted in the features that measure a distance; beyond it a run is simply far.
const CAP: f64 = 12.0;
/// The window of recent steps the `*5` features count over.
const WINDOW: usize = 5;

/// The detectors whose finding (its confidence, 0 when silent) is a feature of its own.
const DETECTORS: [&str; 17] = [
    "stagnation",
    "fail_loop",
    "repeat",
    "dead_end",
    "near_duplicate",
    "error_pileup",
    "output_stagnation",
    "edit_revert",
    "cycles",
    "obstacle_stall",
    "resend",
    "read_loop",
    "size_oscillation",
    "error_rate",
    "self_diagnosed",
    "goal_drift",
    "repeated_text",
];

/// The features a step has, in this order ([`features`]); the detectors' findings follow.
const FACTS: [&str; 25] = [
    "steps",
    "since_source",
    "since_change",
    "quiet",
    "stall_steps",
    "stall_recurrences",
    "changed",
    "new_info",
    "rejected",
    "fix_verified",
    "stalled",
    "cleared",
    "learned",
    "new5",
    "changed5",
    "stalled5",
    "novel_lines",
    "identical_run",
    "errors_since_change",
    "resent",
    "fail_run",
    "check_streak",
    "drift",
    "active",
    "chronic",
];

/// How many features a step has.
pub const N_FEATURES: usize = FACTS.len() + DETECTORS.len();

/// The name of every feature, in the order of [`features`].
pub fn feature_names() -> impl Iterator<Item = &'static str> {
    FACTS.iter().chain(DETECTORS.iter()).copied()
}

fn flag(b: bool) -> f64 {
    f64::from(u8::from(b))
}

/// Steps from `at` to `index`, capped; capped too when there is no such step.
fn since(index: usize, at: Option<usize>) -> f64 {
    at.map_or(CAP, |at| (index.saturating_sub(at) as f64).min(CAP))
}

/// The features of the step just folded into `facts` (`ev`), with the findings the
/// detectors reported on it and `chronic`, the highest of the patterns' smoothed firing
/// rates (the engine's EMA per pattern, this step included). Every value is a count, a
/// capped distance, a flag or a confidence read from what the fold keeps: O(1) per step
/// beyond the step's own calls.
pub fn features(
    facts: &Facts,
    ev: &StepEvents,
    findings: &[Finding],
    chronic: f64,
    config: &DetectConfig,
) -> [f64; N_FEATURES] {
    let index = ev.index;
    let recent = || facts.history.iter().rev().take(WINDOW);
    let count = |f: fn(&super::facts::StepDigest) -> bool| recent().filter(|d| f(d)).count() as f64;
    let max_call = |f: fn(&super::facts::CallEvent) -> u32| {
        f64::from(ev.calls.iter().map(f).max().unwrap_or(0)).min(CAP)
    };
    let novel: u32 = ev.calls.iter().map(|c| c.novel_lines).sum();
    let acting: Vec<f64> = findings
        .iter()
        .filter_map(|f| {
            let pol = config.policy(&f.detector);
            (pol.response >= Response::Nudge).then_some(pol.weight * f.confidence)
        })
        .collect();
    let drift = acting.iter().fold(0.0, |sum, w| sum + w);
    let facts_part = [
        (facts.steps as f64).ln_1p(),
        since(index, facts.last_new_source),
        since(index, facts.last_change),
        f64::from(facts.stretch.steps).min(CAP),
        f64::from(facts.obstacles.stall_steps).min(CAP),
        f64::from(facts.obstacles.stall_recurrences).min(CAP),
        flag(ev.changed),
        flag(ev.new_info),
        flag(ev.rejected),
        flag(facts.fix_verified),
        flag(ev.progress == Progress::Stalled),
        flag(ev.progress == Progress::Cleared),
        flag(ev.progress == Progress::Learned),
        count(|d| d.new_info),
        count(|d| d.changed),
        count(|d| d.progress == Progress::Stalled),
        f64::from(novel).ln_1p(),
        f64::from(ev.identical_run).min(CAP),
        f64::from(facts.errors_since_change).ln_1p(),
        max_call(|c| c.resent),
        max_call(|c| c.fail_run),
        max_call(|c| c.check_streak),
        drift,
        acting.len() as f64,
        chronic,
    ];
    let mut out = [0.0; N_FEATURES];
    out[..FACTS.len()].copy_from_slice(&facts_part);
    for (slot, name) in out[FACTS.len()..].iter_mut().zip(DETECTORS) {
        *slot = findings
            .iter()
            .filter(|f| f.detector == name)
            .map(|f| f.confidence)
            .fold(0.0, f64::max);
    }
    out
}

/// One regression tree of a boosted ensemble, as arrays indexed by node: an inner node
/// sends a step left when its feature is at most the threshold; a leaf (`left` < 0) holds
/// its contribution to the log-odds (the learning rate already applied).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tree {
    pub feature: Vec<i64>,
    pub threshold: Vec<f64>,
    pub left: Vec<i64>,
    pub right: Vec<i64>,
    pub value: Vec<f64>,
}

impl Tree {
    /// The leaf value a feature vector reaches. The fitting library compares features as
    /// 32-bit floats, so they are read as such here too (the thresholds are exact there).
    fn leaf(&self, x: &[f64]) -> Option<f64> {
        let mut node = 0usize;
        // A well-formed tree reaches a leaf in fewer steps than it has nodes.
        for _ in 0..=self.left.len() {
            let left = *self.left.get(node)?;
            if left < 0 {
                return self.value.get(node).copied();
            }
            let f = usize::try_from(*self.feature.get(node)?).ok()?;
            let v = f64::from(*x.get(f)? as f32);
            let next = if v <= *self.threshold.get(node)? {
                left
            } else {
                *self.right.get(node)?
            };
            node = usize::try_from(next).ok()?;
        }
        None
    }
}

/// How the features turn into log-odds.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Form {
    /// A logistic regression on the raw features: intercept + Σ weight × feature.
    Logistic { intercept: f64, weights: Vec<f64> },
    /// Gradient-boosted trees: base + Σ tree leaf.
    Trees { base: f64, trees: Vec<Tree> },
}

/// A fitted score with its decision thresholds, as `scripts/fit_score.py` writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreModel {
    /// What the probability means (for a reader of the file).
    pub meaning: String,
    /// The features the model reads, by name, in its order.
    pub features: Vec<String>,
    /// The model's form: weights per feature, or trees over the features' indexes.
    pub form: Form,
    /// A nudge at this probability or more.
    pub nudge_at: f64,
    /// A halt at this probability or more (after an earlier reminder).
    pub stop_at: f64,
    /// A halt also waits while the run works forward (the ladder's rule: a new source state
    /// lately, a new result at the last step: `engine::working_forward`).
    pub stop_waits: bool,
    /// Where each feature of [`features`] sits in the model's order (filled on load).
    #[serde(skip)]
    order: Vec<usize>,
}

/// The shipped model, fitted on every labelled run of the seven families.
const SHIPPED: &str = include_str!("score_model.json");

impl ScoreModel {
    /// Reads a model written by the script; fails on a feature the proxy does not compute
    /// or on weights that do not match the features.
    pub fn from_json(text: &str) -> anyhow::Result<ScoreModel> {
        let mut model: ScoreModel = serde_json::from_str(text)?;
        let names: Vec<&str> = feature_names().collect();
        model.order = model
            .features
            .iter()
            .map(|f| {
                names
                    .iter()
                    .position(|n| *n == f.as_str())
                    .ok_or_else(|| anyhow::anyhow!("unknown score feature `{f}`"))
            })
            .collect::<anyhow::Result<_>>()?;
        let n = model.features.len();
        match &model.form {
            Form::Logistic { weights, .. } if weights.len() != n => {
                anyhow::bail!("{} weights for {n} features", weights.len())
            }
            Form::Trees { trees, .. } => {
                for t in trees {
                    let len = t.left.len();
                    let fine = [
                        t.feature.len(),
                        t.threshold.len(),
                        t.right.len(),
                        t.value.len(),
                    ]
                    .iter()
                    .all(|l| *l == len)
                        && t.feature.iter().all(|f| *f < n as i64);
                    anyhow::ensure!(fine && len > 0, "a tree with inconsistent arrays");
                }
            }
            _ => {}
        }
        Ok(model)
    }

    /// The model that ships with the proxy.
    pub fn shipped() -> anyhow::Result<ScoreModel> {
        ScoreModel::from_json(SHIPPED)
    }

    /// The probability for a step's features (all of them, in [`features`]' order).
    pub fn probability(&self, all: &[f64; N_FEATURES]) -> f64 {
        let x: Vec<f64> = self.order.iter().map(|&i| all[i]).collect();
        self.probability_of(&x)
    }

    /// The probability for the model's own features, in its order.
    pub fn probability_of(&self, x: &[f64]) -> f64 {
        let z = match &self.form {
            Form::Logistic { intercept, weights } => {
                intercept + weights.iter().zip(x).map(|(w, v)| w * v).sum::<f64>()
            }
            Form::Trees { base, trees } => {
                base + trees.iter().map(|t| t.leaf(x).unwrap_or(0.0)).sum::<f64>()
            }
        };
        1.0 / (1.0 + (-z).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script writes, beside each model, a few feature vectors and the probabilities it
    /// computed for them: the proxy must compute the same.
    #[derive(Deserialize)]
    struct Check {
        x: Vec<f64>,
        p: f64,
    }

    #[derive(Deserialize)]
    struct Checks {
        checks: Vec<Check>,
    }

    fn agrees(model: &ScoreModel, checks: &str) {
        let checks: Checks = serde_json::from_str(checks).expect("the script's checks");
        assert!(checks.checks.len() >= 5, "a handful of vectors");
        for c in &checks.checks {
            let p = model.probability_of(&c.x);
            assert!((p - c.p).abs() <= 1e-9, "{p} != {} for {:?}", c.p, c.x);
        }
    }

    #[test]
    fn the_shipped_model_gives_the_scripts_probabilities() {
        let model = ScoreModel::shipped().expect("the shipped model loads");
        agrees(&model, include_str!("score_checks.json"));
        assert!(model.nudge_at <= model.stop_at);
    }

    #[test]
    fn the_shipped_model_reads_only_features_the_proxy_computes() {
        let model = ScoreModel::shipped().expect("loads");
        let names: Vec<&str> = feature_names().collect();
        assert_eq!(names.len(), N_FEATURES);
        assert!(model.features.iter().all(|f| names.contains(&f.as_str())));
    }

    #[test]
    fn a_model_naming_an_unknown_feature_is_refused() {
        let text = r#"{"meaning": "m", "features": ["nonsense"], "form": {"kind": "logistic",
            "intercept": 0.0, "weights": [1.0]}, "nudge_at": 0.5, "stop_at": 0.9,
            "stop_waits": true}"#;
        let err = ScoreModel::from_json(text).expect_err("refused");
        assert!(err.to_string().contains("nonsense"), "{err}");
    }

    #[test]
    fn trees_compare_features_as_the_library_does() {
        // One split on feature 0 at 0.1 (as a 32-bit float): 0.1 itself goes left.
        let t = 0.1f32 as f64;
        let text = format!(
            r#"{{"meaning": "m", "features": ["drift"], "form": {{"kind": "trees",
            "base": 0.0, "trees": [{{"feature": [0, -2, -2], "threshold": [{t}, 0, 0],
            "left": [1, -1, -1], "right": [2, -1, -1], "value": [0, -1.0, 1.0]}}]}},
            "nudge_at": 0.5, "stop_at": 0.9, "stop_waits": true}}"#
        );
        let model = ScoreModel::from_json(&text).expect("loads");
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        assert_eq!(model.probability_of(&[0.1]), sigmoid(-1.0));
        assert_eq!(model.probability_of(&[0.1000001]), sigmoid(1.0));
        assert_eq!(model.probability_of(&[0.0]), sigmoid(-1.0));
    }
}
