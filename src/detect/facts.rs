//! The world as detection knows it, folded one step at a time: which files changed and
//! to what, which results were already seen, what each check command returned, how long
//! the current stretch without change or new information is. Detectors read these facts;
//! the engine updates them once per step, so a request costs only its new steps.
//!
//! The state is compact (hashes and counters, no result texts) so that the proxy can keep
//! it per live conversation.

use std::collections::{BTreeMap, VecDeque};

use crate::actions::{self, ActionKind, CallContext, Change, ToolAction, ToolCatalog};
use crate::normalize::{self, hash64};
use crate::transcript::{CallWithResult, Step, ToolResult};

use super::config::DetectConfig;
use super::obstacles::{self, Meeting, MeetingKind, Obstacles, Progress};

/// The facts' sets and maps, keyed mostly by 64-bit digests this module computed: foldhash
/// mixes one in a few instructions, where std's default (SipHash) runs a few rounds per
/// key. Still seeded per process, like std's.
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// What one call of the newest step did.
#[derive(Debug, Clone)]
pub struct CallEvent {
    pub action: ToolAction,
    /// Hash of the normalized result (0 when the call has no result yet).
    pub result: u64,
    /// First line of the normalized result, for summaries.
    pub result_line: String,
    pub has_result: bool,
    pub empty_result: bool,
    pub is_error: bool,
    /// The call taught the agent something: no call in the conversation returned this
    /// result before, and it shows content lines no earlier result showed (a result with
    /// no content lines: its text is new). The same window of a file printed again by
    /// another command is no new result.
    pub new_result: bool,
    /// Content lines of the result ([`normalize::content_lines`]) no earlier result showed,
    /// and all its content lines.
    pub novel_lines: u32,
    pub content_lines: u32,
    /// The call changed a file (or the environment) for real.
    pub changed: bool,
    /// For check commands: consecutive runs that returned an already-seen result.
    pub check_streak: u32,
    /// For check commands: whether the streak's runs were all failures.
    pub check_streak_failing: bool,
    /// This (action, result) pair already occurred in the current unchanged stretch.
    pub stretch_repeat: bool,
    /// The result is one the run saw before its last compaction and not since: the model
    /// needed it back. No repeat, and no progress either (the run had it).
    pub recalled: bool,
    /// Token hashes of the action and its result, for near-duplicate similarity.
    pub tokens: Vec<u64>,
    /// For reads: reads of this (file, region) since the file last changed.
    pub reads_since_change: u32,
    /// For commands: consecutive failures of this command with this very error.
    pub fail_run: u32,
    /// When this call returned its file to an earlier state: how many times that file has
    /// now done so (0 when this call did not).
    pub file_returns: u32,
    /// The verifier's score, when this call is the verifier.
    pub verifier_score: Option<f64>,
    /// The raw call hash (name + canonical arguments).
    pub raw_hash: u64,
    /// The obstacle the result showed, if any ([`obstacles`]).
    pub obstacle: Meeting,
    /// Times this call (its action key) has returned this very result with no change to
    /// the world in between, this one included: a re-sent command, a poll of something
    /// that no longer moves, a job restarted after the same timeout.
    pub resent: u32,
    /// For commands: times in a row this command was started again after a failure came
    /// back (its own or a later call's: the job it started was killed) with no change to
    /// the world since its last start. A long job restarted after each time a timeout killed
    /// it, each start answered differently (another session, another pid).
    pub restarts: u32,
}

/// What the newest step did, as detectors see it.
#[derive(Debug, Clone, Default)]
pub struct StepEvents {
    pub index: usize,
    pub calls: Vec<CallEvent>,
    /// Some call changed the world.
    pub changed: bool,
    /// Some call returned a result never seen before.
    pub new_info: bool,
    /// The assistant's text, lowercased, for phrase checks.
    pub text_lower: String,
    /// A human (not the scaffold) wrote after this step.
    pub human_spoke: bool,
    /// The step had no tool call and the scaffold complained (format error).
    pub rejected: bool,
    /// Steps in a row, this one included, that issued exactly these calls (raw arguments).
    pub identical_run: u32,
    /// The step only brought back results the run saw before its last compaction
    /// ([`CallEvent::recalled`]): needed work, which no detector reads as a repeat.
    pub recalled: bool,
    /// How the step stands against the run's obstacles.
    pub progress: Progress,
}

/// Per-file knowledge.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct FileFacts {
    /// Contents the file is known to have had, in order (hashes of full contents).
    pub states: Vec<u64>,
    /// Edits applied: (old, new) hashes.
    pub edits: Vec<(u64, u64)>,
    /// How often the file came back to an earlier state (write of an earlier content,
    /// an edit undoing an earlier one, or redoing an undone one).
    pub returns: u32,
    /// Sizes after writes (bytes or lines, as known).
    pub sizes: Vec<i64>,
    /// Reads per region since the file last changed.
    pub reads: HashMap<String, u32>,
    /// Step of the last change.
    pub changed_at: Option<usize>,
    /// Changes the call did not spell out (`sed -i` expressions, line edits), by digest.
    pub opaque: Vec<u64>,
}

/// Per-check-command knowledge.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CheckFacts {
    /// Outcomes this check has returned: the outcome signature and whether the run failed.
    pub seen: Vec<(u64, bool)>,
    /// Consecutive runs returning an already-seen result.
    pub streak: u32,
    /// The streak's runs all failed.
    pub streak_failing: bool,
    pub runs: u32,
    /// The change counter at the last run: equal now = nothing changed since.
    pub changes_at_last_run: u64,
}

/// The stretch of steps since the world last changed or a new result arrived.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Stretch {
    pub start: usize,
    /// Steps in the stretch.
    pub steps: u32,
    /// (action key, result) pairs seen in the stretch, with counts.
    pub pairs: HashMap<(u64, u64), u32>,
    /// Repeats of pairs in the stretch.
    pub repeats: u32,
    /// Steps of the stretch that repeated a pair.
    pub repeat_steps: Vec<usize>,
}

/// A compact digest of one folded step.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepDigest {
    /// Hash of the step's (action key, result) pairs: equal digests = same step.
    pub sig: u64,
    pub calls: u8,
    pub errors: u8,
    pub changed: bool,
    pub new_info: bool,
    /// A turn without a call that the scaffold rejected.
    pub rejected: bool,
    /// How the step stood against the run's obstacles.
    pub progress: Progress,
    pub text_hash: u64,
    pub text_len: u32,
}

/// A window entry for near-duplicates and output stagnation.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Recent {
    pub index: usize,
    pub kind: ActionKind,
    pub tokens: Vec<u64>,
    pub result: u64,
    pub key: u64,
    pub empty: bool,
    pub changed: bool,
    pub is_error: bool,
}

/// Everything detection knows about a conversation after folding its steps.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Facts {
    /// Steps folded.
    pub steps: usize,
    pub world_version: u32,
    /// Calls that changed the world so far (finer than `world_version`, which counts steps).
    pub changes: u64,
    pub last_change: Option<usize>,
    pub files: BTreeMap<String, FileFacts>,
    pub checks: BTreeMap<String, CheckFacts>,
    pub seen_results: HashSet<u64>,
    /// Content lines that results have shown so far, hashed ([`normalize::content_lines`]):
    /// what the agent has already read, whichever command printed it.
    pub seen_lines: HashSet<u64>,
    pub stretch: Stretch,
    /// Errors and calls since the last real change.
    pub errors_since_change: u32,
    pub calls_since_change: u32,
    /// Distinct commands that failed since the last real change.
    pub failing_keys_since_change: HashSet<u64>,
    /// Per command key: (error result, consecutive failures with it).
    pub fail_runs: HashMap<u64, (u64, u32)>,
    /// SWE-agent's open file, from the last result trailer that named one.
    pub open_file: Option<String>,
    /// What the conversation's tool definitions say of its tools (a tool no profile knows
    /// is read through them).
    #[serde(skip)]
    pub tools: Option<std::sync::Arc<ToolCatalog>>,
    pub history: Vec<StepDigest>,
    /// The last results (one entry per call), bounded.
    pub recent: VecDeque<Recent>,
    /// Recent assistant texts: (hash, len), bounded.
    pub texts: VecDeque<(u64, usize)>,
    /// Recent trouble-phrase hits: step indexes.
    pub trouble_steps: VecDeque<usize>,
    /// Token hashes of the task (first user message).
    pub task_tokens: HashSet<u64>,
    /// Token hashes of recent steps' actions and text, bounded.
    pub recent_step_tokens: VecDeque<Vec<u64>>,
    /// Verifier scores in order.
    pub verifier_scores: Vec<f64>,
    /// Steps that changed the world, and the current run of stuck steps.
    pub changed_steps: usize,
    pub stuck_steps: usize,
    pub stuck_run: usize,
    /// Approximate tokens (bytes/4) of the conversation so far.
    pub tokens: u64,
    /// Raw hash of the last step's calls and how many steps in a row issued them.
    pub last_calls: (u64, u32),
    /// The last step that brought a source file (not a scratch script) to a state it never
    /// had: the agent is still working on the code, whatever its checks print.
    pub last_new_source: Option<usize>,
    /// The code holds a change that a check has passed since: the last check run after the
    /// last new source state did not fail.
    pub fix_verified: bool,
    /// Regions of files (`path\0region`) read before the run's last compaction and not
    /// since: the model lost their content, so its next read of each is needed work.
    pub forgotten_reads: HashSet<String>,
    /// Results the run saw before its last compaction and has not seen since
    /// ([`CallEvent::recalled`]).
    pub recalled_results: HashSet<u64>,
    /// The obstacles the run met, and the stall standing on them.
    pub obstacles: Obstacles,
    /// Per (action key, result): the change counter when the call last returned it, and
    /// how many times in a row (with no change between) it has.
    pub resends: HashMap<(u64, u64), (u64, u32)>,
    /// Results so far that failed or met an obstacle.
    pub failures: u64,
    /// Per command (action key): the change counter and the failures when it last ran, its
    /// restarts in a row ([`CallEvent::restarts`]), and whether its last run failed.
    pub restarts: HashMap<u64, (u64, u64, u32, bool)>,
}

/// Fewest lines never seen before (not counting moved places) that make a result news
/// around the obstacle it met ([`MeetingKind::news`]): a line or two are scraps.
const NEWS_LINES_MIN: u32 = 3;

/// Bounded windows: enough for every detector's look-back.
const RECENT_CALLS: usize = 24;
const RECENT_TEXTS: usize = 8;
const RECENT_STEP_TOKENS: usize = 16;
const MAX_TOKENS_PER_CALL: usize = 48;

/// Whether a call's result says it found nothing: a search with no hits, or a look at a
/// path that does not exist. Such a result taught the agent nothing, whichever place or
/// spelling it tried ("No matches found for X in dir/a", "... in dir/b", "File dir/c/X.java
/// not found"), so it is no new information. Only searches and reads pay for the check.
fn found_nothing(kind: ActionKind, normalized: &str, empty: bool, is_error: bool) -> bool {
    let searched = kind == ActionKind::Search;
    if searched && empty {
        return true;
    }
    if !searched && kind != ActionKind::Read {
        return false;
    }
    let headline = normalize::headline(normalized);
    (is_error && NO_SUCH_PATH.is_match(headline)) || (searched && NOTHING_FOUND.is_match(headline))
}

/// The headline of a search that found nothing (SWE-agent's `find_file`/`search_dir`, ripgrep
/// wrappers, Claude Code's Grep and Glob).
static NOTHING_FOUND: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    normalize::re(
        r"(?i)^(no (matches|results|files?) (found|for)|found 0 |did not find|nothing found)",
    )
});
/// An error saying that the path looked at does not exist.
static NO_SUCH_PATH: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    normalize::re(r"(?i)(not found|no such file or directory|does not exist)")
});
/// A line that names a place in a file: a traceback frame (`File "x.py", line 35, in f`,
/// `at f (x.js:12:3)`), a compiler's `--> src/x.rs:12:5`.
static PLACE_LINE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    normalize::re(
        r#"(?i)(^\s*File "[^"]+", line \d+|\.\w{1,6}:\d+(:\d+)?\)?\s*$|^\s*(at|-->)\s.*:\d+)"#,
    )
});
static OPEN_FILE: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| normalize::re(r"\(Open file: ([^)\n]+)\)"));
static LINES_TOTAL: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| normalize::re(r"^\[File: ([^\n]+) \((\d+) lines total\)\]"));

/// Word tokens of a text, hashed, deduplicated, capped.
pub fn tokens(text: &str, cap: usize) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for w in text
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.len() >= 2)
    {
        let h = hash64(w.to_ascii_lowercase().as_bytes());
        if !out.contains(&h) {
            out.push(h);
            if out.len() >= cap {
                break;
            }
        }
    }
    out
}

/// Jaccard similarity of two token sets.
pub fn jaccard(a: &[u64], b: &[u64]) -> f64 {
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let inter = a.iter().filter(|x| b.contains(x)).count();
    let union = a.len() + b.len() - inter;
    if union == 0 {
        0.0
    } else {
        inter as f64 / union as f64
    }
}

/// A call's result as the facts read it, normalized once for every fact that needs it.
struct ResultReading<'r> {
    /// Hash of the normalized result (0 when the call has no result yet).
    hash: u64,
    /// The normalized result's outcome signature, for check streaks.
    signature: u64,
    /// First line of the normalized result, for summaries.
    line: String,
    has_result: bool,
    empty: bool,
    is_error: bool,
    /// The result as the tool returned it, for the trailers and scores it carries.
    raw: &'r str,
    /// The normalized result, a search's own pattern masked.
    text: String,
}

/// The configured verifier: the command (or tool name) that scores the agent's work, and
/// the pattern of its score.
struct Verifier<'c> {
    command: &'c str,
    score: regex::Regex,
}

impl<'c> Verifier<'c> {
    /// The configuration's verifier; none when its score pattern does not compile.
    fn of(cfg: &'c DetectConfig) -> Option<Verifier<'c>> {
        let v = cfg.verifier.as_ref()?;
        let score = regex::Regex::new(&v.score_regex).ok()?;
        Some(Verifier {
            command: v.command.as_str(),
            score,
        })
    }

    /// The score a call's result reports, when the call is the verifier.
    fn score(&self, action: &ToolAction, name: &str, r: &ResultReading) -> Option<f64> {
        let is_verifier = action
            .check
            .as_deref()
            .is_some_and(|k| k.contains(self.command))
            || name == self.command;
        if !is_verifier || !r.has_result {
            return None;
        }
        self.score
            .captures(r.raw)
            .and_then(|m| m.get(1))
            .and_then(|m| m.as_str().parse::<f64>().ok())
    }
}

/// The first eight bytes of a digest, as a number.
fn first_u64(d: &[u8; 32]) -> u64 {
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// Token hashes of a call's action key and its result's first line, for near-duplicates.
fn call_tokens(key: &str, result_line: &str) -> Vec<u64> {
    let mut toks = tokens(key, MAX_TOKENS_PER_CALL / 2);
    for t in tokens(result_line, MAX_TOKENS_PER_CALL / 2) {
        if !toks.contains(&t) {
            toks.push(t);
        }
    }
    toks
}

impl Facts {
    /// Starts the facts of a conversation with its task.
    pub fn with_task(task: &str) -> Facts {
        Facts {
            task_tokens: tokens(task, 400).into_iter().collect(),
            tokens: task.len() as u64 / 4,
            ..Facts::default()
        }
    }

    /// The run's history was compacted: the model's context now holds a summary instead
    /// of the steps. What the run did (files changed, checks run, failures, the step
    /// count, the loop's stretch) stays; what the model saw goes: the first return of each
    /// result it had seen is needed, neither a repeat nor progress, and each region of a
    /// file it had read may be read once more before the read counts as a repeat. Every
    /// step so far is one fewer repeat in a row: the first step after the summary is no
    /// copy of the last before it.
    pub fn after_compaction(&mut self) {
        // What the model saw is gone from its context, not from the run: the first return
        // of each result is needed (no repeat), and no news (no progress that would start
        // the loop's count over: the ladder goes on where it stood).
        self.recalled_results
            .extend(self.seen_results.iter().copied());
        for (path, file) in &self.files {
            for (region, reads) in &file.reads {
                if *reads > 0 {
                    self.forgotten_reads.insert(format!("{path}\0{region}"));
                }
            }
        }
        self.last_calls = (0, 0);
    }

    /// Folds one step into the facts and returns what it did.
    pub fn fold(&mut self, step: &Step, cfg: &DetectConfig) -> StepEvents {
        let index = self.steps;
        let mut ev = StepEvents {
            index,
            text_lower: step.text.to_lowercase(),
            ..StepEvents::default()
        };
        self.tokens += step.text.len() as u64 / 4;
        let verifier = Verifier::of(cfg);
        for c in &step.calls {
            let call = self.fold_call(c, index, cfg, verifier.as_ref());
            ev.changed |= call.changed;
            ev.new_info |= call.new_result;
            ev.calls.push(call);
        }
        ev.recalled = !ev.changed
            && ev.calls.iter().any(|c| c.recalled)
            && ev.calls.iter().all(|c| c.recalled || !c.has_result);
        let meetings: Vec<(Meeting, &str)> = ev
            .calls
            .iter()
            .filter(|c| c.obstacle.obstacle != 0 || c.obstacle.cleared)
            .map(|c| (c.obstacle, c.result_line.as_str()))
            .collect();
        ev.progress = self.obstacles.judge(index, &meetings, ev.new_info);
        ev.identical_run = self.note_identical_calls(&ev.calls);
        self.note_replies(step, cfg, &mut ev);
        self.note_stretch(&mut ev);
        self.note_progress(&ev);
        let text = self.record_digest(step, &ev);
        self.record_windows(step, cfg, &ev, text);
        self.steps += 1;
        ev
    }

    /// Folds one call of the step `index`: classifies it, reads its result and updates the
    /// per-file, per-check and per-command facts it touches. The call is classified with
    /// the open file as it stood before the call (its own result may name another).
    fn fold_call(
        &mut self,
        c: &CallWithResult,
        index: usize,
        cfg: &DetectConfig,
        verifier: Option<&Verifier<'_>>,
    ) -> CallEvent {
        let ctx = CallContext {
            open_file: self.open_file.as_deref(),
            tools: self.tools.as_deref(),
        };
        let action = actions::classify(&c.call, &cfg.tools, &ctx);
        let raw_hash = first_u64(&c.call.hash());
        let r = self.read_result(c.result.as_ref(), &action);
        self.note_open_file(r.raw);
        let (changed, file_returns) = self.note_changes(&action, &r, index);
        let recalled = r.has_result
            && !self.recalled_results.is_empty()
            && self.recalled_results.remove(&r.hash);
        let (content_lines, novel_lines, novel_places) = self.note_lines(&r);
        let nothing = r.has_result && found_nothing(action.kind, &r.text, r.empty, r.is_error);
        let new_result = r.has_result
            && !nothing
            && self.seen_results.insert(r.hash)
            && (content_lines == 0 || novel_lines > 0);
        if new_result {
            self.obstacles.found(action.kind);
        }
        // News around an obstacle: more than half of the result's lines, and more than
        // scraps (a launch's two-line answer with its PID new is the same answer).
        let news_lines = novel_lines.saturating_sub(novel_places);
        let news = news_lines >= NEWS_LINES_MIN && 2 * news_lines > content_lines;
        let how = MeetingKind {
            reset_on_source: cfg.thresholds.obstacle_source_resets,
            news,
        };
        let obstacle = self.note_obstacle(&action, &r, nothing, how);
        let resent = self.note_resend(action.key_hash, &r);
        let fails = r.has_result && (r.is_error || obstacle.obstacle != 0);
        let restarts = self.note_restart(&action, &r, fails);
        self.failures += u64::from(fails);
        // A check's output that shows more than moved places is news about the code.
        let holds =
            new_result && novel_lines > novel_places && cfg.thresholds.stagnation_new_output_holds;
        let (check_streak, check_streak_failing) = self.note_check_run(&action, &r, holds);
        let fail_run = self.note_failure(action.key_hash, &r);
        let reads_since_change = self.note_read(&action, &r);
        let verifier_score = verifier.and_then(|v| v.score(&action, &c.call.name, &r));
        if let Some(s) = verifier_score {
            self.verifier_scores.push(s);
        }
        CallEvent {
            tokens: call_tokens(&action.key, &r.line),
            result: r.hash,
            result_line: r.line,
            has_result: r.has_result,
            empty_result: r.empty,
            is_error: r.is_error,
            new_result,
            novel_lines,
            content_lines,
            changed,
            check_streak,
            check_streak_failing,
            stretch_repeat: false,
            recalled,
            reads_since_change,
            fail_run,
            file_returns,
            verifier_score,
            raw_hash,
            obstacle,
            resent,
            restarts,
            action,
        }
    }

    /// Reads the obstacle a call's result shows and meets it ([`Obstacles::meet`]): a
    /// check is one command whatever its spelling (its check key), any other call is its
    /// action key.
    fn note_obstacle(
        &mut self,
        action: &ToolAction,
        r: &ResultReading,
        nothing: bool,
        how: MeetingKind,
    ) -> Meeting {
        if !r.has_result {
            return Meeting::default();
        }
        // A command's (or an unknown tool's) output may report a failure with exit code 0;
        // an edit's result shows the file it changed, whose content may say anything.
        let reports = matches!(action.kind, ActionKind::Exec | ActionKind::Other);
        let failing = r.is_error || (reports && !r.empty && normalize::shows_failure(&r.text));
        let obstacle = obstacles::obstacle_of(action.kind, nothing, failing, &r.text);
        let command = action
            .check
            .as_deref()
            .map_or(action.key_hash, |k| hash64(k.as_bytes()));
        self.obstacles.meet(command, obstacle, self.steps, how)
    }

    /// Counts the times in a row this call returned this result with the world unchanged
    /// in between (0 for a call with no result yet).
    fn note_resend(&mut self, key: u64, r: &ResultReading) -> u32 {
        if !r.has_result {
            return 0;
        }
        let changes = self.changes;
        let entry = self.resends.entry((key, r.hash)).or_insert((changes, 0));
        if entry.0 != changes {
            *entry = (changes, 0);
        }
        entry.1 += 1;
        entry.1
    }

    /// Counts the restarts in a row of a command ([`CallEvent::restarts`]): a run whose
    /// last run answered without failing (it started a job), after which another call's
    /// result failed (the job was killed), with nothing changed since, is one more. A
    /// command that fails itself and is re-run is the fail-loop's business; a change starts
    /// the count over; a run with nothing failed since (a job that goes on) leaves it.
    fn note_restart(&mut self, action: &ToolAction, r: &ResultReading, fails: bool) -> u32 {
        if action.kind != ActionKind::Exec || !r.has_result {
            return 0;
        }
        let changes = self.changes;
        // The failures counted once this result is: another call's failure comes after.
        let failures = self.failures + u64::from(fails);
        let Some(entry) = self.restarts.get_mut(&action.key_hash) else {
            self.restarts
                .insert(action.key_hash, (changes, failures, 0, fails));
            return 0;
        };
        let (last_changes, last_failures, count, last_failed) = *entry;
        let count = if last_changes != changes {
            0
        } else if failures > last_failures && !last_failed {
            count + 1
        } else {
            count
        };
        *entry = (changes, failures, count, fails);
        count
    }

    /// Reads a call's result (none yet: no result, empty, no error), counting it in the
    /// conversation's tokens.
    fn read_result<'r>(
        &mut self,
        result: Option<&'r ToolResult>,
        action: &ToolAction,
    ) -> ResultReading<'r> {
        let Some(r) = result else {
            return ResultReading {
                hash: 0,
                signature: 0,
                line: String::new(),
                has_result: false,
                empty: true,
                is_error: false,
                raw: "",
                text: String::new(),
            };
        };
        self.tokens += r.text.len() as u64 / 4;
        let mut n = normalize::normalize(r);
        // A search's result quotes its pattern; "no match for X" and "no match
        // for Y" are the same non-result.
        if let Some(term) = action.search.as_deref().filter(|t| t.len() >= 2) {
            if n.text.contains(term) {
                n.text = n.text.replace(term, "<term>");
                n.hash = hash64(n.text.as_bytes());
            }
        }
        let line: String = normalize::headline(&n.text).chars().take(120).collect();
        let empty = n.text.is_empty();
        let mut is_error = n.outcome.is_error;
        // grep and friends exit 1 when nothing matches: a non-result, not a failure.
        if action.kind == ActionKind::Search && empty {
            is_error = false;
        }
        ResultReading {
            hash: n.hash,
            signature: normalize::outcome_signature(&n.text),
            line,
            has_result: true,
            empty,
            is_error,
            raw: r.text.as_str(),
            text: n.text,
        }
    }

    /// Reads a result's content lines into the lines seen: (its content lines, those no
    /// earlier result showed, and how many of those are only a place in a file: a frame of
    /// a traceback, `file.rs:12:5`, whose line number moved because a file above it was
    /// edited).
    fn note_lines(&mut self, r: &ResultReading) -> (u32, u32, u32) {
        let (mut lines, mut novel, mut places) = (0u32, 0u32, 0u32);
        for text in r.text.lines().take(normalize::CONTENT_LINES_MAX) {
            // One line at a time, so the novel ones can be looked at; the same hash the
            // whole text's content lines would give.
            let Some(line) = normalize::content_lines(text).next() else {
                continue;
            };
            lines += 1;
            if self.seen_lines.insert(line) {
                novel += 1;
                places += u32::from(PLACE_LINE.is_match(text));
            }
        }
        (lines, novel, places)
    }

    /// Follows SWE-agent's open file, which a result names in its trailer ("n/a": none).
    fn note_open_file(&mut self, raw: &str) {
        if let Some(m) = OPEN_FILE.captures(raw) {
            let f = m[1].trim();
            self.open_file = (f != "n/a").then(|| f.to_string());
        }
    }

    /// Applies what a call changes to the files: the changes of a call that succeeded, or
    /// of one whose result has not come yet. Returns whether it changed anything for real
    /// and how often a file it returned to an earlier state has now done so. `changes`
    /// counts such calls, so a check re-run with the count unmoved ran on the same code.
    fn note_changes(
        &mut self,
        action: &ToolAction,
        r: &ResultReading,
        index: usize,
    ) -> (bool, u32) {
        let mut changed = false;
        let mut returns = 0;
        if !r.is_error && r.has_result || !r.has_result && !action.changes.is_empty() {
            for ch in &action.changes {
                let (ch_changed, ch_returns) = self.apply_change(ch, index);
                changed |= ch_changed;
                returns = returns.max(ch_returns);
            }
            if action.mutating && action.changes.is_empty() && !r.is_error {
                changed = true;
            }
        }
        // SWE-agent reports the size of the file it shows.
        if let Some(m) = LINES_TOTAL.captures(r.raw) {
            if changed {
                let f = self.files.entry(actions::norm_path(&m[1])).or_default();
                if let Ok(n) = m[2].parse::<i64>() {
                    f.sizes.push(n);
                }
            }
        }
        if changed {
            self.changes += 1;
        }
        (changed, returns)
    }

    /// Records a run of a check command and returns its streak of already-seen results
    /// and whether those runs all failed. The streak runs across edits; a re-run with no
    /// change since the last run neither extends nor breaks it (repeats within an
    /// unchanged stretch are the repeat detector's business).
    ///
    /// `holds`: the run showed something new (lines no earlier result showed) and the
    /// config says such a run does not lengthen the streak (it does not break it either:
    /// the verdict and headline are the ones already seen).
    fn note_check_run(
        &mut self,
        action: &ToolAction,
        r: &ResultReading,
        holds: bool,
    ) -> (u32, bool) {
        let (Some(key), true) = (&action.check, r.has_result) else {
            return (0, false);
        };
        let failing = r.is_error || normalize::shows_failure(&r.text);
        self.fix_verified = !failing && self.last_new_source.is_some();
        let changes = self.changes;
        let cf = self.checks.entry(key.clone()).or_default();
        let edited = cf.runs == 0 || cf.changes_at_last_run != changes;
        cf.runs += 1;
        cf.changes_at_last_run = changes;
        // The verdict is part of the outcome: the same lines once failing and
        // now passing (or the reverse) are a new result.
        let outcome = (r.signature, r.is_error);
        if !cf.seen.contains(&outcome) {
            cf.seen.push(outcome);
            cf.streak = 0;
            cf.streak_failing = false;
        } else if edited && !holds {
            cf.streak += 1;
            cf.streak_failing = if cf.streak == 1 {
                failing
            } else {
                cf.streak_failing && failing
            };
        }
        (cf.streak, cf.streak_failing)
    }

    /// Counts consecutive failures of the command `key` with this very error (0 when the
    /// call did not fail, which ends the run).
    fn note_failure(&mut self, key: u64, r: &ResultReading) -> u32 {
        if !r.has_result {
            return 0;
        }
        let entry = self.fail_runs.entry(key).or_insert((0, 0));
        if !r.is_error {
            *entry = (0, 0);
            return 0;
        }
        if entry.0 == r.hash {
            entry.1 += 1;
        } else {
            *entry = (r.hash, 1);
        }
        entry.1
    }

    /// Counts the reads of one region of a file since the file last changed (0 for a call
    /// that is no successful read).
    fn note_read(&mut self, action: &ToolAction, r: &ResultReading) -> u32 {
        if action.kind != ActionKind::Read || !r.has_result || r.is_error {
            return 0;
        }
        let Some(p) = &action.path else {
            return 0;
        };
        let path = actions::norm_path(p);
        let region = action.region.clone().unwrap_or_default();
        if !self.forgotten_reads.is_empty()
            && self.forgotten_reads.remove(&format!("{path}\0{region}"))
        {
            // The first read since a compaction took the content out of the model's
            // context: needed, and no repeat (the count goes on from the next read).
            return 0;
        }
        let f = self.files.entry(path).or_default();
        let reads = f.reads.entry(region).or_insert(0);
        *reads += 1;
        *reads
    }

    /// Counts the steps in a row, this one included, that issued exactly these calls. The
    /// same calls, verbatim, as the step before: whatever they changed, issuing them
    /// again is a repeat of the agent's own action.
    fn note_identical_calls(&mut self, calls: &[CallEvent]) -> u32 {
        if calls.is_empty() {
            self.last_calls = (0, 0);
            return 0;
        }
        let mut raw = blake3::Hasher::new();
        for c in calls {
            raw.update(&c.raw_hash.to_le_bytes());
        }
        let calls = first_u64(raw.finalize().as_bytes());
        self.last_calls = if self.last_calls.0 == calls {
            (calls, self.last_calls.1 + 1)
        } else {
            (calls, 1)
        };
        self.last_calls.1
    }

    /// Reads the messages that came after the step: whether a human (not the scaffold)
    /// spoke, and whether the scaffold rejected a turn that made no call.
    fn note_replies(&mut self, step: &Step, cfg: &DetectConfig, ev: &mut StepEvents) {
        // A turn without a call that the scaffold rejected is a failed action of its own.
        let mut human = false;
        for u in &step.user_after {
            if cfg.is_scaffold_message(u) {
                if step.calls.is_empty() {
                    ev.rejected = true;
                }
            } else {
                human = true;
            }
        }
        ev.human_spoke = human;
        if step.calls.is_empty() && ev.rejected {
            let call = self.rejected_turn(step);
            ev.calls.push(call);
        }
    }

    /// The failed action a rejected turn stands for: the scaffold's complaint (digits
    /// dropped, so a count or a line number in it does not make it new) is its result.
    fn rejected_turn(&mut self, step: &Step) -> CallEvent {
        let complaint: String = step
            .user_after
            .first()
            .map(|u| normalize::normalize_text(u))
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let result = hash64(complaint.as_bytes());
        CallEvent {
            action: ToolAction::plain(ActionKind::Other, "rejected-turn".to_string()),
            result,
            result_line: complaint
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(120)
                .collect(),
            has_result: true,
            empty_result: false,
            is_error: true,
            new_result: self.seen_results.insert(result),
            novel_lines: 0,
            content_lines: 0,
            changed: false,
            check_streak: 0,
            check_streak_failing: false,
            stretch_repeat: false,
            recalled: false,
            tokens: Vec::new(),
            reads_since_change: 0,
            fail_run: 0,
            file_returns: 0,
            verifier_score: None,
            raw_hash: 0,
            obstacle: Meeting::default(),
            resent: 0,
            restarts: 0,
        }
    }

    /// Stretches: a real change or a new result starts a new one; within one, any
    /// repeat of an (action, result) pair is being stuck. Marks the calls that repeat one.
    fn note_stretch(&mut self, ev: &mut StepEvents) {
        let index = ev.index;
        if ev.changed || ev.new_info {
            self.stretch = Stretch {
                start: index,
                ..Stretch::default()
            };
        } else if !ev.recalled {
            self.stretch.steps += 1;
        }
        let mut repeated = false;
        for call in ev.calls.iter_mut().filter(|c| c.has_result && !c.recalled) {
            let n = self
                .stretch
                .pairs
                .entry((call.action.key_hash, call.result))
                .or_insert(0);
            *n += 1;
            if *n > 1 && !call.changed {
                call.stretch_repeat = true;
                self.stretch.repeats += 1;
                repeated = true;
            }
        }
        if repeated {
            self.stretch.repeat_steps.push(index);
        }
    }

    /// Errors piling up since the last real change, and the runs of steps that neither
    /// changed anything nor learned anything.
    fn note_progress(&mut self, ev: &StepEvents) {
        if ev.changed {
            self.last_change = Some(ev.index);
            self.world_version += 1;
            self.errors_since_change = 0;
            self.calls_since_change = 0;
            self.failing_keys_since_change.clear();
            self.changed_steps += 1;
            self.stuck_run = 0;
        } else if ev.recalled {
            // Needed after a compaction: neither stuck nor progress.
        } else if !ev.new_info {
            self.stuck_steps += 1;
            self.stuck_run += 1;
        } else {
            self.stuck_run = 0;
        }
        for call in ev.calls.iter().filter(|c| c.has_result && !c.changed) {
            self.calls_since_change += 1;
            if call.is_error {
                self.errors_since_change += 1;
                self.failing_keys_since_change.insert(call.action.key_hash);
            }
        }
    }

    /// Appends the step's digest to the history. Returns the hash and length of the
    /// step's text with its whitespace collapsed, for the texts window.
    fn record_digest(&mut self, step: &Step, ev: &StepEvents) -> (u64, usize) {
        let mut sig = blake3::Hasher::new();
        for c in &ev.calls {
            sig.update(&c.action.key_hash.to_le_bytes());
            sig.update(&c.result.to_le_bytes());
        }
        let text_norm: String = step.text.split_whitespace().collect::<Vec<_>>().join(" ");
        let text_hash = hash64(text_norm.as_bytes());
        self.history.push(StepDigest {
            sig: first_u64(sig.finalize().as_bytes()),
            calls: ev.calls.len().min(255) as u8,
            errors: ev.calls.iter().filter(|c| c.is_error).count().min(255) as u8,
            changed: ev.changed,
            new_info: ev.new_info,
            rejected: ev.rejected,
            progress: ev.progress,
            text_hash,
            text_len: text_norm.len().min(u32::MAX as usize) as u32,
        });
        (text_hash, text_norm.len())
    }

    /// Pushes the step onto the bounded windows detectors look back through: its results,
    /// its text (`text`: hash and length), a trouble phrase in it, and its tokens.
    fn record_windows(
        &mut self,
        step: &Step,
        cfg: &DetectConfig,
        ev: &StepEvents,
        text: (u64, usize),
    ) {
        for c in ev.calls.iter().filter(|c| c.has_result) {
            self.recent.push_back(Recent {
                index: ev.index,
                kind: c.action.kind,
                tokens: c.tokens.clone(),
                result: c.result,
                key: c.action.key_hash,
                empty: c.empty_result,
                changed: c.changed,
                is_error: c.is_error,
            });
            if self.recent.len() > RECENT_CALLS {
                self.recent.pop_front();
            }
        }
        self.texts.push_back(text);
        if self.texts.len() > RECENT_TEXTS {
            self.texts.pop_front();
        }
        if cfg
            .trouble_phrases
            .iter()
            .any(|p| ev.text_lower.contains(p.as_str()))
        {
            self.trouble_steps.push_back(ev.index);
            if self.trouble_steps.len() > 8 {
                self.trouble_steps.pop_front();
            }
        }
        let mut step_tokens = tokens(&step.text, 64);
        for c in &ev.calls {
            for t in &c.tokens {
                if !step_tokens.contains(t) {
                    step_tokens.push(*t);
                }
            }
        }
        self.recent_step_tokens.push_back(step_tokens);
        if self.recent_step_tokens.len() > RECENT_STEP_TOKENS {
            self.recent_step_tokens.pop_front();
        }
    }

    /// Applies a change to a file's known state: whether it changed anything, and how many
    /// times the file has now returned to an earlier state.
    fn apply_change(&mut self, ch: &Change, index: usize) -> (bool, u32) {
        let key = actions::norm_path(ch.path());
        let f = self.files.entry(key).or_default();
        let before = f.returns;
        // Whether the file reaches a state it never had (an undo or a redo does not).
        let mut new_state = false;
        let changed = match ch {
            Change::Write { hash, size, .. } => {
                let current = f.states.last().copied();
                if current == Some(*hash) {
                    false
                } else {
                    if f.states.contains(hash) {
                        f.returns += 1;
                    } else {
                        new_state = true;
                    }
                    f.states.push(*hash);
                    f.sizes.push(*size as i64);
                    true
                }
            }
            Change::Edit { old, new, .. } => {
                if old == new {
                    false
                } else {
                    // Undo: the reverse of an earlier edit. Redo: an edit that was undone.
                    let undo = f.edits.contains(&(*new, *old));
                    if undo {
                        f.returns += 1;
                    }
                    new_state = !undo && !f.edits.contains(&(*old, *new));
                    f.edits.push((*old, *new));
                    true
                }
            }
            Change::Opaque { detail, .. } => {
                new_state = !f.opaque.contains(detail);
                if new_state {
                    f.opaque.push(*detail);
                }
                true
            }
        };
        if changed {
            f.reads.clear();
            f.changed_at = Some(index);
        }
        if changed && !self.forgotten_reads.is_empty() {
            // A changed file's next read is a first read anyway.
            let prefix = format!("{}\0", actions::norm_path(ch.path()));
            self.forgotten_reads.retain(|k| !k.starts_with(&prefix));
        }
        if new_state && !is_scratch(ch.path()) {
            self.last_new_source = Some(index);
            self.obstacles.attempts += 1;
            self.fix_verified = false;
        }
        (changed, if f.returns > before { f.returns } else { 0 })
    }
}

/// Files an agent writes to try things out rather than to fix anything: reproduction,
/// debug and check scripts, and anything under `/tmp`. Their edits are no progress on the
/// code.
pub fn is_scratch(path: &str) -> bool {
    let path = path.trim_matches(|c| c == '\'' || c == '"');
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    path.starts_with("/tmp/")
        || [
            "repro", "debug", "test_", "check_", "verify", "tmp", "temp", "scratch",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}
