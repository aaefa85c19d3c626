//! Runs that outlive their transcript: what the proxy remembers of a run across a context
//! compaction ([`crate::dialect::compaction`] recognizes the markers).
//!
//! When a run's client asks for the summary that replaces its history, the run's fold up to
//! that request is kept here ([`Lineage::compacted`]): what the run read, ran, edited and
//! saw, and the escalation it reached. A request whose history continues from a summary
//! then carries that fold ([`Lineage::join`]), under the run's id:
//!
//! - the same id as the summary request (Codex's thread, opencode's session, Claude Code's
//!   `/compact`, a `/c/{id}` path): the run goes on;
//! - a new id, or none (Claude Code's auto-compact starts a new session; Gemini CLI's new
//!   head hashes to a new identity): joined to the run whose summary request came from the
//!   same API key fingerprint and client within `cache.compaction_link_secs`, when exactly
//!   one run waits so (two runs compacting at once under one key are not guessed between:
//!   identity must never merge two runs). The new id is the run's from then on.
//!
//! A new conversation without a continuation marker inherits nothing, whatever its key.
//!
//! Bounded: a run is kept for a day after it was last used (a budget outlives a lunch
//! break, as the ledger's does), at most [`MAX_RUNS`] of them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::detect::EngineState;

/// Runs kept at most; the least recently used go first past it. Each holds a fold, whose
/// size grows with the run (files, results seen): this bounds what they hold together.
const MAX_RUNS: usize = 2_048;
/// How long a run that compacted is kept after its last use.
const KEEP_MS: i64 = 24 * 3600 * 1000;

/// Who sends a run's requests: what a conversation under a new id must share with the
/// run's summary request to be joined to it. A team is a boundary: two teams' runs under
/// one key and client are never joined (each team's budgets, halts and admin tokens are
/// its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sender {
    /// The API key's fingerprint (`crate::policy::key_id`), never the key.
    pub key: Option<String>,
    /// The client's product name (the `user-agent`'s first token).
    pub client: Option<String>,
    /// The team the request names (`/t/{team}`, `x-loopwarden-team`).
    pub team: Option<String>,
    /// The policy the request falls under.
    pub policy: String,
}

/// What a conversation that continues a run carries.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The run's id: the log's, the budget's and the halts' name for the conversation.
    pub run: String,
    /// The run's fold at its last summary request ([`crate::detect::Engine::decide_carried`]).
    pub carry: Arc<EngineState>,
    /// This request joined the run under a new id just now.
    pub linked_now: bool,
}

pub struct Lineage {
    state: Mutex<Runs>,
    /// Some conversation was ever joined under another id: until then, a request's
    /// [`Lineage::run_of`] takes no lock.
    aliased: AtomicBool,
    link_ms: i64,
}

#[derive(Default)]
struct Runs {
    /// By run id.
    runs: HashMap<String, Run>,
    /// Conversation ids joined to a run under another id.
    aliases: HashMap<String, String>,
}

struct Run {
    carry: Arc<EngineState>,
    sender: Sender,
    /// When its last summary request came.
    compacted_ms: i64,
    /// The summary came and no conversation continued from it yet.
    awaiting: bool,
    /// The API's compaction the carry was taken at, when the API compacted
    /// ([`crate::dialect::compaction::ServerCompaction::fingerprint`]).
    server: Option<u64>,
    last_ms: i64,
}

impl Lineage {
    pub fn new(link_secs: u64) -> Lineage {
        Lineage {
            state: Mutex::default(),
            aliased: AtomicBool::new(false),
            link_ms: i64::try_from(link_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Runs> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run a conversation id was joined to, if it was joined to one under another id.
    /// One map look-up (most requests: an empty map).
    pub fn run_of(&self, conversation: &str) -> Option<String> {
        if !self.aliased.load(Ordering::Relaxed) {
            return None;
        }
        let state = self.lock();
        if state.aliases.is_empty() {
            return None;
        }
        state.aliases.get(conversation).cloned()
    }

    /// Keeps `fold` as the run's state at its summary request: what the conversation that
    /// continues from the summary carries.
    pub fn compacted(&self, run: &str, fold: Arc<EngineState>, sender: Sender, now_ms: i64) {
        let mut state = self.lock();
        state.runs.insert(
            run.to_string(),
            Run {
                carry: fold,
                sender,
                compacted_ms: now_ms,
                awaiting: true,
                server: None,
                last_ms: now_ms,
            },
        );
        if state.runs.len() > MAX_RUNS {
            state.forget_oldest();
        }
    }

    /// The run a request whose history continues from a summary belongs to, and what it
    /// carries: its own (or its alias's) run, else the one run that waits for a
    /// continuation from the same sender within the link window. `None`: no run to join;
    /// the request starts afresh.
    pub fn join(&self, conversation: &str, sender: &Sender, now_ms: i64) -> Option<Joined> {
        let mut state = self.lock();
        let own = state
            .aliases
            .get(conversation)
            .cloned()
            .unwrap_or_else(|| conversation.to_string());
        if let Some(run) = state.runs.get_mut(&own) {
            run.awaiting = false;
            run.last_ms = now_ms;
            return Some(Joined {
                run: own,
                carry: run.carry.clone(),
                linked_now: false,
            });
        }
        let link_ms = self.link_ms;
        let mut waiting = state.runs.iter().filter(|(_, r)| {
            r.awaiting && r.sender == *sender && now_ms - r.compacted_ms <= link_ms
        });
        let (id, _) = waiting.next()?;
        if waiting.next().is_some() {
            tracing::info!(
                conversation,
                "a continued conversation matches several compacted runs: joined to none"
            );
            return None;
        }
        let id = id.clone();
        let run = state.runs.get_mut(&id)?;
        run.awaiting = false;
        run.last_ms = now_ms;
        let carry = run.carry.clone();
        state.aliases.insert(conversation.to_string(), id.clone());
        self.aliased.store(true, Ordering::Relaxed);
        Some(Joined {
            run: id,
            carry,
            linked_now: true,
        })
    }

    /// Whether the run's summary request came and no conversation continued from it yet:
    /// a second summary request then is no new compaction of the run.
    pub fn awaiting(&self, run: &str) -> bool {
        self.lock().runs.get(run).is_some_and(|r| r.awaiting)
    }

    /// Whether `fingerprint` names another compaction by the API than the one the run's
    /// carry was taken at (or the run has none): the run compacted again since.
    pub fn compacted_again(&self, run: &str, fingerprint: u64) -> bool {
        self.lock()
            .runs
            .get(run)
            .is_some_and(|r| r.server != Some(fingerprint))
    }

    /// Notes that the run's carry was taken at the API's compaction `fingerprint`.
    pub fn server_compacted(&self, run: &str, fingerprint: u64) {
        if let Some(r) = self.lock().runs.get_mut(run) {
            r.server = Some(fingerprint);
        }
    }

    /// Forgets runs not used for a day. Called periodically.
    pub fn sweep(&self, now_ms: i64) {
        let mut state = self.lock();
        state.runs.retain(|_, r| now_ms - r.last_ms < KEEP_MS);
        let Runs { runs, aliases } = &mut *state;
        aliases.retain(|_, run| runs.contains_key(run));
    }

    /// Runs held.
    pub fn len(&self) -> usize {
        self.lock().runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Runs {
    fn forget_oldest(&mut self) {
        let oldest = self
            .runs
            .iter()
            .min_by_key(|(_, r)| r.last_ms)
            .map(|(id, _)| id.clone());
        if let Some(id) = oldest {
            self.runs.remove(&id);
            self.aliases.retain(|_, run| *run != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(key: &str, client: &str) -> Sender {
        Sender {
            key: Some(key.into()),
            client: Some(client.into()),
            team: None,
            policy: "default".into(),
        }
    }

    fn fold() -> Arc<EngineState> {
        Arc::new(EngineState::default())
    }

    #[test]
    fn a_continuation_joins_its_own_run_or_the_one_run_waiting_from_its_sender() {
        let lineage = Lineage::new(120);
        let claude = sender("k1", "claude-cli");
        lineage.compacted("s1", fold(), claude.clone(), 1_000);
        // Another client, another key, or too late: nothing to join.
        assert!(lineage.join("s2", &sender("k1", "codex"), 2_000).is_none());
        assert!(lineage
            .join("s2", &sender("k2", "claude-cli"), 2_000)
            .is_none());
        assert!(lineage.join("s2", &claude, 1_000 + 121_000).is_none());
        // Another team, or another policy, under the same key and client: nothing either.
        let team = Sender {
            team: Some("beta".into()),
            ..claude.clone()
        };
        assert!(lineage.join("s2", &team, 2_000).is_none());
        let policy = Sender {
            policy: "other".into(),
            ..claude.clone()
        };
        assert!(lineage.join("s2", &policy, 2_000).is_none());
        assert!(lineage.awaiting("s1"));
        // The same sender in time: joined, and the new id is the run's from then on.
        let joined = lineage.join("s2", &claude, 2_000).unwrap();
        assert_eq!((joined.run.as_str(), joined.linked_now), ("s1", true));
        assert_eq!(lineage.run_of("s2").as_deref(), Some("s1"));
        assert!(!lineage.awaiting("s1"), "continued");
        let again = lineage.join("s2", &claude, 3_000).unwrap();
        assert_eq!((again.run.as_str(), again.linked_now), ("s1", false));
        // Joined once: a third conversation of the same sender starts afresh.
        assert!(lineage.join("s3", &claude, 3_000).is_none());
        // The same id as the summary request goes on without a link.
        lineage.compacted("t1", fold(), sender("k1", "codex"), 4_000);
        assert_eq!(lineage.join("t1", &claude, 4_000).unwrap().run, "t1");
    }

    #[test]
    fn two_runs_waiting_from_one_sender_are_not_guessed_between() {
        let lineage = Lineage::new(120);
        let claude = sender("k1", "claude-cli");
        lineage.compacted("a", fold(), claude.clone(), 1_000);
        lineage.compacted("b", fold(), claude.clone(), 1_500);
        assert!(lineage.join("c", &claude, 2_000).is_none());
        // Each run's own id still continues it.
        assert_eq!(lineage.join("a", &claude, 2_000).unwrap().run, "a");
        // Now only "b" waits.
        assert_eq!(lineage.join("c", &claude, 2_500).unwrap().run, "b");
        lineage.sweep(2_500 + KEEP_MS);
        assert!(lineage.is_empty() && lineage.run_of("c").is_none());
    }

    #[test]
    fn another_compaction_by_the_api_is_told_from_the_one_carried() {
        let lineage = Lineage::new(120);
        lineage.compacted("s1", fold(), sender("k1", "claude-cli"), 1_000);
        // Taken at no compaction of the API's: any block is another one.
        assert!(lineage.compacted_again("s1", 7));
        lineage.server_compacted("s1", 7);
        assert!(!lineage.compacted_again("s1", 7));
        assert!(lineage.compacted_again("s1", 8));
        // No run: nothing to compact again.
        assert!(!lineage.compacted_again("s2", 7));
    }
}
