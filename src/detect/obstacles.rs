//! Progress judged by the obstacle, not the command. A run that is stuck keeps meeting the
//! same thing: the same error, the same failing result of a check, the same missing file,
//! tool or package, while its actions vary cosmetically (another flag, another guessed path,
//! another tool for the same edit, a reworded search). Each step of such a stall may show a
//! line never seen before, so "new information" alone calls it progress; the obstacle does
//! not move.
//!
//! [`Obstacles`] keeps the obstacles a run has met (digests, with how often each was met)
//! and judges each step: it is progress when it gets past an obstacle (a command that met
//! one no longer does, or meets one never met before: its situation changed), or when it
//! learns something new without meeting any obstacle again. A stall is the stretch of
//! steps since the last progress; it stands on an obstacle when obstacles met before keep
//! coming back in it. An edit is not progress by itself here: an edit that matters shows in
//! the next result (the obstacle goes or changes); one followed by the same failure did not
//! get past it. Folded once per step, O(calls of the step).

use crate::actions::ActionKind;
use crate::normalize::{self, hash64};

/// Keyed by digests, like the facts' maps (foldhash: a few instructions per key).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// How a step stands against the run's obstacles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Progress {
    /// The step met an obstacle it had met before and got past none.
    #[default]
    Stalled,
    /// A command that met an obstacle before did not meet it again (it passed, or met one
    /// never met before).
    Cleared,
    /// The step learned something new (a new result) and met no obstacle again.
    Learned,
    /// The step neither met an obstacle again nor learned anything (a quiet step: a stall
    /// goes on through it without standing on anything new).
    Idle,
}

impl Progress {
    pub fn as_str(self) -> &'static str {
        match self {
            Progress::Stalled => "stalled",
            Progress::Cleared => "cleared",
            Progress::Learned => "learned",
            Progress::Idle => "idle",
        }
    }

    /// The step ends a stall.
    pub fn moves(self) -> bool {
        matches!(self, Progress::Cleared | Progress::Learned)
    }
}

/// What the obstacles know of a run.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Obstacles {
    /// Obstacles met so far, by digest.
    pub met: HashMap<u64, Standing>,
    /// Per command (check key or action key): the obstacle its last run met (0: none).
    last_of_command: HashMap<u64, u64>,
    /// The last step that was progress ([`Progress::moves`]).
    pub progress_at: Option<usize>,
    /// Steps since then, the current one included.
    pub stall_steps: u32,
    /// Calls in the stall that met an obstacle met before.
    pub stall_recurrences: u32,
    /// The obstacle that came back last, and the headline of the result that showed it.
    pub standing: Option<(u64, String)>,
    /// The last step at which a command got past an obstacle.
    pub last_cleared: Option<usize>,
    /// The last obstacle met again (standing at two steps or more), and the step.
    pub last_standing: Option<(u64, usize)>,
    /// Source files brought to a state they never had, so far: each is an attempt at the
    /// obstacles standing (when `reset_on_source` is set, their standing starts over).
    pub attempts: u32,
}

/// How often one obstacle was met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Standing {
    /// Calls that met it.
    pub times: u32,
    /// Steps that met it since a command that had met it last got past it.
    pub steps: u32,
    /// The last step that met it.
    pub last_step: usize,
    /// The step its current standing began at (the first of `steps`).
    pub began: usize,
    /// [`Obstacles::attempts`] when it was last met.
    attempts: u32,
}

/// What [`Obstacles::meet`] is told about a meeting besides the obstacle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeetingKind {
    /// A source file brought to a new state since the obstacle was last met is an attempt
    /// at it: its standing starts over.
    pub reset_on_source: bool,
    /// The result shows mostly lines never seen before (more than half of its content lines
    /// and at least three, not counting lines that only name a place in a file): the same
    /// failure, but the run
    /// learned much around it. Such a meeting neither adds to the standing nor ends it;
    /// scraps (a line or two new) do add.
    pub news: bool,
}

/// One call's meeting with an obstacle, as [`Obstacles::meet`] reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Meeting {
    /// The obstacle the call met (0: none).
    pub obstacle: u64,
    /// How many calls have met it, this one included.
    pub times: u32,
    /// Steps that have met it since it was last got past, this one included.
    pub standing: u32,
    /// The command met an obstacle on its last run and got past it now.
    pub cleared: bool,
}

/// A result that found nothing stands for one obstacle per kind of call, whatever was
/// looked for: searches reworded around one missing thing meet the same obstacle.
const NOTHING_FOUND: u64 = 0x6e6f_7468_696e_6721;
const NO_SUCH_PATH: u64 = 0x6e6f_2d73_7563_6821;

/// The obstacle a result shows, if any: for a failing result, its failure lines (at most
/// the last three, digits dropped: a line number moves with every edit above it); for a
/// search or read that found nothing, the missing-thing obstacle of its kind.
pub fn obstacle_of(kind: ActionKind, found_nothing: bool, failing: bool, normalized: &str) -> u64 {
    if found_nothing {
        return if kind == ActionKind::Search {
            NOTHING_FOUND
        } else {
            NO_SUCH_PATH
        };
    }
    // A file's content that mentions errors is no obstacle: only what a command or an
    // edit returned is.
    if !failing || matches!(kind, ActionKind::Read | ActionKind::Search) {
        return 0;
    }
    let lines: Vec<&str> = normalized.lines().filter(|l| is_obstacle_line(l)).collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    let text: String = if tail.is_empty() {
        normalize::headline(normalized).to_string()
    } else {
        tail.join("\n")
    }
    .chars()
    .filter(|c| !c.is_ascii_digit())
    .collect();
    hash64(text.as_bytes()) | 1
}

/// A line that says what failed: a failure line ([`normalize::is_failure_line`]) other than
/// a traceback's header, or a raised exception's line (`TypeError: unhashable type`,
/// `django.core.exceptions.AppRegistryNotReady: ...`), which names no failure word. Every
/// Python traceback starts with the same header: were it the obstacle, every traceback
/// would be one obstacle, whatever was raised.
fn is_obstacle_line(line: &str) -> bool {
    (normalize::is_failure_line(line) && !TRACEBACK_HEADER.is_match(line)) || RAISED.is_match(line)
}

static TRACEBACK_HEADER: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    normalize::re(
        r"(?i)^\s*(traceback \(most recent call last\):|during handling of the above exception|the above exception was the direct cause)",
    )
});
/// A raised exception as Python (and Java, and others) print it: a dotted class name that
/// ends in Error or Exception, then a colon or the line's end.
static RAISED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    normalize::re(r"^\s*(E\s+)?[A-Za-z_][\w.$]*(Error|Exception|Exit|Interrupt)\b(:|\s*$)")
});

impl Obstacles {
    /// Records a call of `command` at step `index` whose result showed `obstacle` (0:
    /// none); says what the meeting was. A command that met an obstacle on its last run and
    /// does not now got past it: that obstacle's standing starts over.
    pub fn meet(&mut self, command: u64, obstacle: u64, index: usize, how: MeetingKind) -> Meeting {
        let before = self.last_of_command.insert(command, obstacle).unwrap_or(0);
        let past = before != 0 && before != obstacle;
        if past {
            if let Some(b) = self.met.get_mut(&before) {
                b.steps = 0;
            }
            self.last_cleared = Some(index);
        }
        if obstacle == 0 {
            return Meeting {
                cleared: past,
                ..Meeting::default()
            };
        }
        let attempts = self.attempts;
        let o = self.met.entry(obstacle).or_default();
        o.times += 1;
        if how.reset_on_source && o.attempts != attempts {
            o.steps = 0;
        }
        // A first meeting starts the standing whatever came with it; news holds it after.
        if o.steps == 0 || (!how.news && o.last_step != index) {
            if o.steps == 0 {
                o.began = index;
            }
            o.steps += 1;
        }
        if o.steps > 1 {
            self.last_standing = Some((obstacle, index));
        }
        o.last_step = index;
        o.attempts = attempts;
        Meeting {
            obstacle,
            times: o.times,
            standing: o.steps,
            cleared: past && o.times == 1,
        }
    }

    /// A search found something new, or a read showed a file: the "found nothing" obstacle
    /// of that kind of call no longer stands. Searches reworded around one missing thing
    /// meet it step after step; a run whose searches between find what they look for is
    /// exploring, and one empty search now and then is no stand.
    pub fn found(&mut self, kind: ActionKind) {
        let obstacle = match kind {
            ActionKind::Search => NOTHING_FOUND,
            ActionKind::Read => NO_SUCH_PATH,
            _ => return,
        };
        if let Some(o) = self.met.get_mut(&obstacle) {
            o.steps = 0;
        }
    }

    /// Judges a step from its calls' meetings and whether it learned anything new; moves
    /// the stall. `headline`: the headline of the result of each meeting.
    pub fn judge(&mut self, index: usize, meetings: &[(Meeting, &str)], learned: bool) -> Progress {
        let recurring = meetings.iter().filter(|(m, _)| m.times > 1).count() as u32;
        let progress = if meetings.iter().any(|(m, _)| m.cleared) {
            Progress::Cleared
        } else if recurring > 0 {
            Progress::Stalled
        } else if learned {
            Progress::Learned
        } else {
            Progress::Idle
        };
        if progress.moves() {
            self.progress_at = Some(index);
            self.stall_steps = 0;
            self.stall_recurrences = 0;
            self.standing = None;
        } else {
            self.stall_steps += 1;
            self.stall_recurrences += recurring;
            if let Some((m, line)) = meetings.iter().rev().find(|(m, _)| m.times > 1) {
                self.standing = Some((m.obstacle, (*line).to_string()));
            }
        }
        progress
    }

    /// The run has stood on one obstacle since step `since`, up to step `index`: the step
    /// `index` met an obstacle whose standing began before `since`, and no command got past
    /// an obstacle since. What else the run learned meanwhile did not get it past.
    pub fn stood_since(&self, since: usize, index: usize) -> bool {
        let Some((obstacle, at)) = self.last_standing else {
            return false;
        };
        at == index
            && self
                .met
                .get(&obstacle)
                .is_some_and(|o| o.steps > 1 && o.began < since)
            && self.last_cleared.is_none_or(|c| c < since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing(text: &str) -> u64 {
        obstacle_of(ActionKind::Exec, false, true, text)
    }

    #[test]
    fn the_same_failure_with_other_numbers_is_one_obstacle() {
        let a = failing("building...\nerror: cannot find -lssl (line 12)\n");
        let b = failing("other progress lines\nerror: cannot find -lssl (line 40)\n");
        assert_eq!(a, b);
        assert_ne!(a, failing("error: cannot find -lcrypto\n"));
        assert_eq!(obstacle_of(ActionKind::Exec, false, false, "error: x"), 0);
        assert_eq!(obstacle_of(ActionKind::Read, false, true, "error: x"), 0);
        assert_eq!(
            obstacle_of(ActionKind::Search, true, false, ""),
            obstacle_of(ActionKind::Search, true, false, "No matches for foo")
        );
    }

    #[test]
    fn a_stall_stands_until_an_obstacle_clears_or_something_new_comes_without_one() {
        let mut o = Obstacles::default();
        let err = failing("error: no module named numpy");
        // Step 0: met for the first time; step 1-3: met again by other commands, each
        // learning a line or two.
        let m = o.meet(1, err, 0, MeetingKind::default());
        assert_eq!(o.judge(0, &[(m, "e")], true), Progress::Learned);
        for (i, cmd) in [(1, 2), (2, 3), (3, 4)] {
            let m = o.meet(cmd, err, i, MeetingKind::default());
            assert_eq!(o.judge(i, &[(m, "e")], true), Progress::Stalled);
        }
        assert_eq!((o.stall_steps, o.stall_recurrences), (3, 3));
        assert_eq!(o.met[&err].steps, 4);
        assert!(o.stood_since(1, 3));
        assert!(!o.stood_since(1, 2), "only at the step that met it");
        assert!(
            !o.stood_since(0, 3),
            "its standing began at step 0, not before"
        );
        // The first command now passes: the obstacle is cleared.
        let m = o.meet(1, 0, 4, MeetingKind::default());
        assert_eq!(o.judge(4, &[(m, "")], false), Progress::Cleared);
        assert_eq!((o.stall_steps, o.progress_at), (0, Some(4)));
        assert!(!o.stood_since(1, 4));
        assert_eq!(o.met[&err].steps, 0, "its standing starts over");
    }
}
