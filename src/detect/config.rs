//! Detection settings: the `[detect]` table of the config file. Every field has a default,
//! so an empty table (or none) is the shipped behaviour; see `DetectConfig::default`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::actions::ToolMapping;

/// How far a pattern may push: `warn` records the finding only, `nudge` reminds the model
/// (and may escalate to a replan reminder), `ask` pauses for a human at the top of the
/// ladder, `halt` stops the run there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Off,
    Warn,
    Nudge,
    Ask,
    Halt,
}

/// What turns the findings into a decision: the hand-set ladder (each pattern's confidence
/// against the nudge and halt scores, with its smoothing, cooldown and rungs), or the
/// calibrated score fitted on the labelled runs ([`super::score`]): one probability per step
/// against two thresholds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    #[default]
    Ladder,
    Score,
}

/// The policy of one pattern (detector).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PatternPolicy {
    pub response: Response,
    /// Weight of the pattern's confidence in the drift score.
    pub weight: f64,
    /// The first intervention's action: `nudge`, `replan` or `rollback`.
    pub first_action: super::Action,
}

impl Default for PatternPolicy {
    fn default() -> Self {
        PatternPolicy {
            response: Response::Nudge,
            weight: 1.0,
            first_action: super::Action::Nudge,
        }
    }
}

impl PatternPolicy {
    pub fn new(response: Response, weight: f64) -> Self {
        PatternPolicy {
            response,
            weight,
            first_action: super::Action::Nudge,
        }
    }
}

/// The shipped policy of each pattern: outcome-based signals may halt; the noisier
/// ones (counted on the recorded runs) warn or nudge only. read-loop warns: re-reading
/// a file while editing others is what good runs do (it nudged 11 of 151 successful
/// mini-swe-agent runs on the dev set and caught no labelled loop first). An obstacle
/// stall stops only a run that stood on its obstacle since the first reminder, with no
/// change since ([`super::Finding::standstill`]). resend warns: it caught no labelled loop
/// that other patterns missed, and nudged re-searches in runs that succeed.
pub fn default_policy(detector: &str) -> PatternPolicy {
    match detector {
        "stagnation" | "fail_loop" | "repeat" | "cycles" | "dead_end" | "error_pileup"
        | "obstacle_stall" | "budget" => PatternPolicy::new(Response::Halt, 1.0),
        "edit_revert" => PatternPolicy {
            response: Response::Halt,
            weight: 1.0,
            first_action: super::Action::Rollback,
        },
        "near_duplicate" | "output_stagnation" | "verifier_drift" => {
            PatternPolicy::new(Response::Nudge, 1.0)
        }
        _ => PatternPolicy::new(Response::Warn, 0.5),
    }
}

/// Drift-score thresholds and the escalation ladder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EscalationConfig {
    /// EMA smoothing of each pattern's firing (1 = fired this step, 0 = did not).
    pub ema_alpha: f64,
    /// A pattern whose EMA is above this is chronic: its next intervention escalates.
    pub escalate_ema: f64,
    /// Drift score (sum of weight × confidence of the findings) that warrants a nudge.
    pub nudge_score: f64,
    /// Drift score that warrants going beyond a nudge (replan, then halt or pause).
    pub halt_score: f64,
    /// Steps between two interventions of one pattern at the same level.
    pub cooldown: usize,
    /// Minimum steps between two rungs of the ladder.
    pub escalation_gap: usize,
    /// Use a replan reminder between the nudge and the halt.
    pub replan_step: bool,
    /// A finding from a different pattern than the one that led the last intervention
    /// (since a human last spoke) escalates like a chronic one: two detectors agreeing.
    pub corroborate: bool,
    /// Steps of quiet for a pattern after a human dismissed its alert.
    pub dismiss_quiet: usize,
    /// A run is stopped (halt, pause, block) only once this many steps have passed since it
    /// last brought a source file to a new state: an agent still changing its code is
    /// struggling forward, and stopping it would lose the fix it is working towards.
    /// 0 = no such wait. A spent hard budget stops regardless.
    pub stop_after_quiet: usize,
    /// ...unless the run has stood on one obstacle since its first intervention: no
    /// progress against its obstacles ([`super::obstacles`]), no change to the world, and
    /// an obstacle met before came back at the last step. New lines in its results do not
    /// hold such a stop.
    pub stop_on_obstacle: bool,
}

impl Default for EscalationConfig {
    fn default() -> Self {
        EscalationConfig {
            ema_alpha: 0.3,
            escalate_ema: 0.5,
            nudge_score: 0.6,
            halt_score: 0.8,
            cooldown: 5,
            escalation_gap: 2,
            replan_step: true,
            corroborate: true,
            dismiss_quiet: 10,
            stop_after_quiet: 6,
            stop_on_obstacle: true,
        }
    }
}

/// Thresholds of the individual detectors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// read-loop: reads of one file region with no change to the file in between.
    pub read_loop_reads: u32,
    /// edit-revert: times a file returns to an earlier state (1 = a one-off diagnostic revert
    /// is allowed; 2 = undo and redo).
    pub edit_revert_returns: u32,
    /// fail-loop: consecutive failures of one command with the same error.
    pub fail_loop_runs: u32,
    /// stagnation: consecutive already-seen results of one check command.
    pub stagnation_streak: u32,
    /// stagnation: how many of the streak's results may be successes (a passing check
    /// re-run after cosmetic edits is not a spiral).
    pub stagnation_counts_success: bool,
    /// stagnation: a check run whose output shows lines no earlier result showed does not
    /// lengthen the streak. Its outcome signature is one already seen (the same verdict,
    /// the same headline), but the agent learned something from it: the rubric's fail-loop
    /// is the same output again, not the same kind of output.
    pub stagnation_new_output_holds: bool,
    /// error pile-up: error results since the last real change...
    pub pileup_errors: u32,
    /// ...among at least this share of the calls since that change.
    pub pileup_share: f64,
    /// repeat: repeated (action, result) pairs within one unchanged stretch.
    pub repeat_count: u32,
    /// output stagnation: consecutive identical non-empty results of different calls.
    pub output_same: u32,
    /// cycles: longest period looked for, and full periods required before the tail.
    pub cycle_max_period: usize,
    /// near-duplicates: token-set Jaccard similarity and how many similar steps.
    pub near_dup_similarity: f64,
    pub near_dup_count: u32,
    /// dead end: steps with no change and no new information.
    pub dead_end_steps: u32,
    /// resend: times in a row one call returns one result with no change in between.
    pub resend_count: u32,
    /// obstacle stall: steps since the last progress against the run's obstacles...
    pub obstacle_steps: u32,
    /// ...in which obstacles met before came back at least this often.
    pub obstacle_recurrences: u32,
    /// obstacle stall: steps that met one obstacle again with nothing getting past it
    /// between (a meeting whose result is mostly news, the first one always, does not
    /// count; 0: this rule off).
    pub obstacle_meetings: u32,
    /// obstacle stall: times in a row one command was started again after a failure with
    /// nothing changed since its last start (0: this rule off).
    pub obstacle_restarts: u32,
    /// obstacle stall: a source file brought to a new state starts every obstacle's count
    /// over (an attempt at it; its result is the next meeting).
    pub obstacle_source_resets: bool,
    /// file-size oscillation: direction reversals of one file's size.
    pub size_reversals: u32,
    /// error rate: share of errors among the last `error_rate_window` results.
    pub error_rate: f64,
    pub error_rate_window: usize,
    /// self-diagnosed trouble: phrase hits within `self_diag_window` turns.
    pub self_diag_hits: u32,
    pub self_diag_window: usize,
    /// goal drift: overlap of recent actions with the task's words, below which it fires.
    pub goal_overlap: f64,
    pub goal_window: usize,
    /// repeated text: assistant passages repeated (min length in chars, repeats).
    pub repeated_text_chars: usize,
    pub repeated_text_count: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            read_loop_reads: 3,
            edit_revert_returns: 2,
            fail_loop_runs: 3,
            stagnation_streak: 3,
            stagnation_counts_success: true,
            stagnation_new_output_holds: true,
            pileup_errors: 6,
            pileup_share: 0.6,
            repeat_count: 2,
            output_same: 4,
            cycle_max_period: 8,
            near_dup_similarity: 0.8,
            near_dup_count: 3,
            dead_end_steps: 5,
            resend_count: 3,
            obstacle_steps: 0,
            obstacle_recurrences: 3,
            obstacle_meetings: 4,
            obstacle_restarts: 2,
            obstacle_source_resets: true,
            size_reversals: 3,
            error_rate: 0.3,
            error_rate_window: 10,
            self_diag_hits: 2,
            self_diag_window: 3,
            goal_overlap: 0.05,
            goal_window: 10,
            repeated_text_chars: 40,
            repeated_text_count: 2,
        }
    }
}

/// Per-conversation budgets that adapt to progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Base step budget (0 = none).
    pub steps: usize,
    /// Extra steps granted per step that changed the world.
    pub expand_per_change: f64,
    /// Steps taken away per stuck step (no change, no new information)...
    pub shrink_per_stuck: f64,
    /// ...and taken away doubly once a stuck run is this long.
    pub hard_stuck_run: usize,
    /// Token budget (0 = none), counted as bytes/4 of the conversation's text.
    pub tokens: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            steps: 400,
            expand_per_change: 1.0,
            shrink_per_stuck: 0.5,
            hard_stuck_run: 10,
            tokens: 0,
        }
    }
}

/// A verify tool whose score tracks real progress (e.g. a test runner's pass count).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VerifierConfig {
    /// Substring of the check command (or tool name) that is the verifier.
    pub command: String,
    /// Regex with one capture group: the score in its output (higher is better).
    pub score_regex: String,
}

/// The `[detect]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectConfig {
    /// Master switch: off = every request is observed and nothing is computed.
    pub enabled: bool,
    /// The ladder (shipped) or the calibrated score.
    pub decider: Decider,
    pub escalation: EscalationConfig,
    pub thresholds: Thresholds,
    pub budget: BudgetConfig,
    /// Per-pattern policy (missing patterns keep their built-in policy).
    pub patterns: BTreeMap<String, PatternPolicy>,
    /// Phrases of self-diagnosed trouble (lowercase substrings).
    pub trouble_phrases: Vec<String>,
    /// Beginnings of user messages a scaffold sends on its own (format errors, "please
    /// continue"): they are not a human speaking and do not reset escalation.
    pub scaffold_messages: Vec<String>,
    /// The user's own tools.
    pub tools: BTreeMap<String, ToolMapping>,
    pub verifier: Option<VerifierConfig>,
}

impl Default for DetectConfig {
    fn default() -> Self {
        DetectConfig {
            enabled: true,
            decider: Decider::Ladder,
            escalation: EscalationConfig::default(),
            thresholds: Thresholds::default(),
            budget: BudgetConfig::default(),
            patterns: BTreeMap::new(),
            trouble_phrases: [
                "i broke",
                "let me restore",
                "let me revert",
                "this isn't working",
                "this is not working",
                "still not working",
                "still failing",
                "still getting the same",
                "same error",
                "didn't work",
                "did not work",
                "let me try a different approach",
                "let me try another approach",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            scaffold_messages: [
                "Please always provide EXACTLY ONE action",
                "Tool call error",
                "No tool calls found",
                "Please continue working on the task",
                "Your command ran successfully and did not produce any output",
                "Your last output did not use any tool calls",
                "<system-reminder>",
                "<environment_context>",
                "<returncode>",
                "[Error occurred in processing last action]",
                // opencode, after its summary of a compacted history.
                "Continue if you have next steps",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            tools: BTreeMap::new(),
            verifier: None,
        }
    }
}

impl DetectConfig {
    /// The policy of a pattern: the configured one, else the built-in default.
    pub fn policy(&self, detector: &str) -> PatternPolicy {
        if let Some(p) = self.patterns.get(detector) {
            return p.clone();
        }
        default_policy(detector)
    }

    /// Whether a user message came from the scaffold rather than a human.
    pub fn is_scaffold_message(&self, text: &str) -> bool {
        let t = text.trim_start();
        self.scaffold_messages
            .iter()
            .any(|p| t.starts_with(p.as_str()) || (p.len() > 20 && t.contains(p.as_str())))
            || t.contains("[Error occurred in processing last action]")
    }
}
