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
//!
//! Runs outlive the process too ([`crate::store::runs`]): each summary request's run and
//! each link is also queued for the store (off the request path, by the log's writer), and
//! a conversation new to a process (another replica saw the run, or this one before a
//! restart) is looked up there once before it is read ([`Lineage::recall_stored`]), which
//! brings its run, its link and the runs its sender left awaiting a continuation into
//! memory. A store that fails or is slow is not asked for a while ([`QUIET_MS`]): the
//! request goes on with what memory holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use http::HeaderMap;

use crate::detect::EngineState;
use crate::store::runs::{RunLink, RunRecord, RunRow, SentBy, StoredLineage};
use crate::store::{Deferred, Record, Store};

/// Runs kept at most; the least recently used go first past it. Each holds a fold, whose
/// size grows with the run (files, results seen): this bounds what they hold together.
const MAX_RUNS: usize = 2_048;
/// How long a run that compacted is kept after its last use: as long as the store keeps it.
const KEEP_MS: i64 = crate::store::runs::KEEP_MS;
/// How long a request waits for the store's answer on a miss, at most (an indexed read of
/// a few rows: a millisecond or two when the store is well).
const STORE_WAIT: Duration = Duration::from_millis(250);
/// After a failed or slow read, the store is not asked for this long: a database down
/// costs one request [`STORE_WAIT`] now and then, not every new conversation.
const QUIET_MS: i64 = 30_000;

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

impl Sender {
    /// Who sent a request, from its headers and query (the API key's fingerprint, never the
    /// key; the client, as the product token of its `user-agent`, finer than the policies'
    /// client names, which put every unknown client under one), its team and policy.
    pub fn of(
        headers: &HeaderMap,
        query: Option<&str>,
        team: Option<&str>,
        policy: &str,
    ) -> Sender {
        let product = crate::policy::select::user_agent(headers)
            .split(|c: char| c == '/' || c.is_whitespace())
            .next()
            .filter(|p| !p.is_empty());
        Sender {
            key: crate::policy::key_id::key_of(headers, query).map(crate::policy::key_id::of),
            client: product.map(|p| p.chars().take(40).collect()),
            team: team.filter(|t| !t.is_empty()).map(str::to_string),
            policy: policy.to_string(),
        }
    }

    fn sent_by(&self) -> SentBy<'_> {
        SentBy {
            key_id: self.key.as_deref(),
            client: self.client.as_deref(),
            team: self.team.as_deref(),
        }
    }
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
    /// Where runs are kept for other processes ([`Lineage::keep_in`]); none: memory only.
    store: OnceLock<Store>,
    /// The store is not asked before this (ms since the epoch): it failed or was slow.
    quiet_until: AtomicI64,
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
            store: OnceLock::new(),
            quiet_until: AtomicI64::new(0),
        }
    }

    /// Keeps runs in `store` too, from now on, and looks them up there on a miss.
    pub fn keep_in(&self, store: Store) {
        let _ = self.store.set(store);
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

    /// Whether `conversation` is a run this process holds, or was joined to one.
    pub fn knows(&self, conversation: &str) -> bool {
        let state = self.lock();
        state.runs.contains_key(conversation) || state.aliases.contains_key(conversation)
    }

    /// Keeps `fold` as the run's state at its summary request: what the conversation that
    /// continues from the summary carries.
    pub fn compacted(&self, run: &str, fold: Arc<EngineState>, sender: Sender, now_ms: i64) {
        if let Some(store) = self.store.get() {
            // Serialized by the log's writer, off the request path.
            store.log_deferred(Box::new(CompactedRun {
                run: run.to_string(),
                fold: fold.clone(),
                sender: sender.clone(),
                at_ms: now_ms,
            }));
        }
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
        if let Some(store) = self.store.get() {
            store.log_run(RunRecord::Linked(RunLink {
                conversation_id: conversation.to_string(),
                run_id: id.clone(),
                linked_ms: now_ms,
            }));
        }
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
        let noted = match self.lock().runs.get_mut(run) {
            Some(r) => r.server.replace(fingerprint) != Some(fingerprint),
            None => false,
        };
        if let (true, Some(store)) = (noted, self.store.get()) {
            store.log_run(RunRecord::ServerCompacted {
                run: run.to_string(),
                // The fingerprint's bits, as the store's 64-bit integer holds them.
                fingerprint: fingerprint as i64,
            });
        }
    }

    /// For a conversation new to this process (`conversation`: the id its request states,
    /// if any), brings what the store keeps into memory: the run it was linked to, its own
    /// run, and the runs `sender` left awaiting a continuation within the link window.
    /// One read, waited for [`STORE_WAIT`] at most; nothing when the store is quiet.
    pub async fn recall_stored(&self, conversation: Option<&str>, sender: &Sender) {
        let Some(store) = self.store.get() else {
            return;
        };
        let now = crate::store::now_ms();
        if now < self.quiet_until.load(Ordering::Relaxed) {
            return;
        }
        let read = store.stored_lineage(conversation, sender.sent_by(), now - self.link_ms);
        let failure = match tokio::time::timeout(STORE_WAIT, read).await {
            Ok(Ok(found)) => return self.take_in(conversation, found),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", STORE_WAIT.as_millis()),
        };
        self.quiet_until.store(now + QUIET_MS, Ordering::Relaxed);
        tracing::warn!(error = %failure, quiet_secs = QUIET_MS / 1000, "cannot read runs from the store: continuations served by another process start afresh meanwhile");
    }

    /// Takes in what the store keeps of `conversation`: its runs (unless memory holds the
    /// same compaction or a later one), and its link.
    fn take_in(&self, conversation: Option<&str>, found: StoredLineage) {
        let mut state = self.lock();
        for row in found.runs {
            let known = state.runs.get(&row.id).map(|r| r.compacted_ms);
            if known.is_some_and(|at| at > row.compacted_ms) {
                continue;
            }
            if let Some(run) = state
                .runs
                .get_mut(&row.id)
                .filter(|_| known == Some(row.compacted_ms))
            {
                // The same compaction: another process may have continued it since.
                run.awaiting &= row.awaiting;
                continue;
            }
            let id = row.id.clone();
            match Run::of_stored(row) {
                Some(run) => {
                    state.runs.insert(id, run);
                }
                None => {
                    tracing::warn!(run = %id, "a stored run's state is unreadable: not taken in")
                }
            }
        }
        if state.runs.len() > MAX_RUNS {
            state.forget_oldest();
        }
        let link = found.link.filter(|l| state.runs.contains_key(&l.run_id));
        if let (Some(id), Some(link)) = (conversation, link) {
            state.aliases.insert(id.to_string(), link.run_id);
            self.aliased.store(true, Ordering::Relaxed);
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

impl Run {
    /// A run as the store kept it; `None` when its state cannot be read.
    fn of_stored(row: RunRow) -> Option<Run> {
        let carry = EngineState::from_stored(&row.carry)?;
        Some(Run {
            carry: Arc::new(carry),
            sender: Sender {
                key: row.key_id,
                client: row.client,
                team: row.team,
                policy: row.policy,
            },
            compacted_ms: row.compacted_ms,
            awaiting: row.awaiting,
            server: row.server_compaction.map(|f| f as u64),
            last_ms: row.last_ms,
        })
    }
}

/// A run's summary request, for the store: its fold is serialized on the log's thread.
struct CompactedRun {
    run: String,
    fold: Arc<EngineState>,
    sender: Sender,
    at_ms: i64,
}

impl Deferred for CompactedRun {
    fn records(self: Box<Self>, out: &mut Vec<Record>) {
        let carry = self.fold.to_stored();
        if carry.is_empty() {
            return;
        }
        let Sender {
            key,
            client,
            team,
            policy,
        } = self.sender;
        out.push(Record::Run(Box::new(RunRecord::Compacted(RunRow {
            id: self.run,
            key_id: key,
            client,
            team,
            policy,
            compacted_ms: self.at_ms,
            awaiting: true,
            server_compaction: None,
            carry,
            last_ms: self.at_ms,
        }))));
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
    fn runs_read_from_the_store_join_as_the_process_s_own_and_never_replace_a_later_one() {
        let lineage = Lineage::new(120);
        let claude = sender("k1", "claude-cli");
        let row = |id: &str, at: i64, awaiting: bool| RunRow {
            id: id.into(),
            key_id: claude.key.clone(),
            client: claude.client.clone(),
            team: None,
            policy: "default".into(),
            compacted_ms: at,
            awaiting,
            server_compaction: Some(-1),
            carry: EngineState::default().to_stored(),
            last_ms: at,
        };
        // Another process's summary request: a new id of the same sender joins it.
        let found = StoredLineage {
            link: None,
            runs: vec![row("r1", 1_000, true)],
        };
        lineage.take_in(Some("s2"), found);
        assert!(lineage.knows("r1") && !lineage.knows("s2"));
        assert!(
            !lineage.compacted_again("r1", u64::MAX),
            "its API compaction too"
        );
        let joined = lineage.join("s2", &claude, 2_000).unwrap();
        assert_eq!((joined.run.as_str(), joined.linked_now), ("r1", true));
        // A conversation another process linked: its id is the run's here too.
        let linked = StoredLineage {
            link: Some(RunLink {
                conversation_id: "s3".into(),
                run_id: "r1".into(),
                linked_ms: 2_500,
            }),
            runs: vec![],
        };
        lineage.take_in(Some("s3"), linked);
        assert_eq!(lineage.run_of("s3").as_deref(), Some("r1"));
        // This process compacted r1 again since: an older stored row does not replace it,
        // and one that says another process continued the same compaction is taken at
        // its word.
        lineage.compacted("r1", fold(), claude.clone(), 3_000);
        lineage.take_in(
            None,
            StoredLineage {
                link: None,
                runs: vec![row("r1", 1_000, true)],
            },
        );
        assert!(lineage.awaiting("r1"));
        lineage.take_in(
            None,
            StoredLineage {
                link: None,
                runs: vec![row("r1", 3_000, false)],
            },
        );
        assert!(!lineage.awaiting("r1"));
        // A state that is no fold is not taken in.
        let broken = RunRow {
            carry: b"no fold".to_vec(),
            ..row("r9", 4_000, true)
        };
        lineage.take_in(
            None,
            StoredLineage {
                link: None,
                runs: vec![broken],
            },
        );
        assert!(!lineage.knows("r9"));
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
