//! Sticky halts: what a transcript cannot hold about a conversation. Once a conversation is
//! halted (by the policy or by an operator), its later requests get the halt again without
//! reaching the upstream, until a human speaks (a new human message after the halt) or an
//! operator resumes it. The state lives in memory for the request path and in SQLite
//! (`conversation_controls`) so it survives a restart.
//!
//! An operator's resume is also a fact the detection engine needs (it restarts escalation
//! there): the request that follows a resume is recorded in `resumed_at`, which becomes
//! `StoreFacts::resumed_at`.
//!
//! A control holds for the run it was made for, not for every request under its id: an
//! agent that states no id is known by a hash of its system prompt and task, so the next
//! run of the same task has the same id. The control keeps the steps the run's history
//! carried when it was made and a digest of them ([`run_digest`]); a request whose history
//! does not start with those steps is another run, and free of it. An operator's halt or
//! resume, made between requests, is bound by the conversation's next request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::ruling::Stop;
use crate::store::{self, now_ms, Store};
use crate::transcript::{Step, Transcript};

pub use crate::store::Control;

/// What a request of a conversation is subject to.
#[derive(Debug, Clone, PartialEq)]
pub enum Standing {
    /// Halted: answer with the halt again. The reason and why it stopped are the original
    /// ones.
    Halted { reason: String, stop: Stop },
    /// Under `on_stop = "pause"`, the previous response carried a call the policy would
    /// have blocked; it went through (a response cannot wait for a human), so this request
    /// waits for one. `resumed_at` as for [`Standing::Free`].
    Awaiting {
        reason: String,
        detector: String,
        resumed_at: Vec<usize>,
    },
    /// Free to go; `resumed_at` are the operator resumes the engine must know about.
    /// `human_resumed` is true when this very request lifted a halt because a human spoke;
    /// `resumed_now` when this request is the first after an operator's resume (its
    /// index was just added to `resumed_at`).
    Free {
        resumed_at: Vec<usize>,
        human_resumed: bool,
        resumed_now: bool,
    },
}

impl Standing {
    /// A conversation with no halt, no resume and nothing awaited.
    pub fn free() -> Standing {
        Standing::Free {
            resumed_at: Vec::new(),
            human_resumed: false,
            resumed_now: false,
        }
    }
}

/// The sticky-halt state of every conversation that has one.
#[derive(Clone)]
pub struct Controls {
    map: Arc<Mutex<HashMap<String, Control>>>,
    /// Conversations whose next request waits for a human ([`Standing::Awaiting`]): the
    /// reason and the detector. Kept in memory only, as held requests are.
    awaiting: Arc<Mutex<HashMap<String, (String, String)>>>,
    /// Where the state is kept across restarts (none: in memory only).
    store: Option<Store>,
}

/// Who or what halted a conversation, as `conversation_controls.source` keeps it.
fn source_of(stop: Stop) -> &'static str {
    match stop {
        Stop::Loop => "policy",
        Stop::Budget => "budget",
        Stop::Operator => "operator",
    }
}

fn stop_of(source: &str) -> Stop {
    match source {
        "budget" => Stop::Budget,
        "operator" => Stop::Operator,
        _ => Stop::Loop,
    }
}

impl std::fmt::Debug for Controls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controls").finish_non_exhaustive()
    }
}

/// Human messages in a transcript: user messages that `is_scaffold` does not claim.
pub fn human_messages(transcript: &Transcript, is_scaffold: &dyn Fn(&str) -> bool) -> i64 {
    let count = |texts: &[String]| {
        texts
            .iter()
            .filter(|t| !t.trim().is_empty() && !is_scaffold(t))
            .count()
    };
    let after: usize = transcript.steps.iter().map(|s| count(&s.user_after)).sum();
    (count(&transcript.task) + after) as i64
}

impl Controls {
    /// Controls kept in memory only (tests, demo without a database).
    pub fn in_memory() -> Controls {
        Controls {
            map: Arc::default(),
            awaiting: Arc::default(),
            store: None,
        }
    }

    /// Loads the stored state (the table is small: one row per conversation ever halted).
    pub async fn load(store: Store) -> Result<Controls, store::Error> {
        let rows = store.controls().await?;
        let map = rows
            .into_iter()
            .map(|c| (c.conversation_id.clone(), c))
            .collect();
        Ok(Controls {
            map: Arc::new(Mutex::new(map)),
            awaiting: Arc::default(),
            store: Some(store),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Control>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state of one conversation, if it has any.
    pub fn get(&self, conversation: &str) -> Option<Control> {
        self.lock().get(conversation).cloned()
    }

    /// Whether a conversation has any state (most have none: one lookup, no copy).
    pub fn contains(&self, conversation: &str) -> bool {
        self.lock().contains_key(conversation) || self.awaited().contains_key(conversation)
    }

    fn awaited(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, String)>> {
        self.awaiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the conversation's next request wait for a human (see [`Standing::Awaiting`]).
    pub fn hold_next(&self, conversation: &str, reason: &str, detector: &str) {
        self.awaited().insert(
            conversation.to_string(),
            (reason.to_string(), detector.to_string()),
        );
    }

    /// Every conversation currently halted.
    pub fn halted(&self) -> Vec<Control> {
        let mut list: Vec<Control> = self.lock().values().filter(|c| c.halted).cloned().collect();
        list.sort_by_key(|c| std::cmp::Reverse(c.updated_ms));
        list
    }

    /// Where a request stands. `humans` is [`human_messages`] of its transcript. Lifts a
    /// halt when a human spoke since, records a pending resume; both are written through to
    /// the store off the request path. A request of another run than the control's is
    /// free. A request awaited by a human is so once: it takes the mark.
    pub fn standing(&self, conversation: &str, humans: i64, transcript: &Transcript) -> Standing {
        let awaited = self.awaited().remove(conversation);
        let standing = self.stored_standing(conversation, humans, transcript);
        match (standing, awaited) {
            (Standing::Free { resumed_at, .. }, Some((reason, detector))) => Standing::Awaiting {
                reason,
                detector,
                resumed_at,
            },
            (standing, _) => standing,
        }
    }

    /// [`Controls::standing`] from the stored state alone.
    fn stored_standing(
        &self,
        conversation: &str,
        humans: i64,
        transcript: &Transcript,
    ) -> Standing {
        let steps = transcript.steps.len();
        let mut map = self.lock();
        let Some(c) = map.get_mut(conversation) else {
            return Standing::free();
        };
        let mut changed = false;
        match (c.run_steps, c.run_digest.as_deref()) {
            (Some(run), Some(digest)) => {
                if !continues_run(transcript, run, digest) {
                    return Standing::free();
                }
            }
            _ => {
                bind_run(c, transcript);
                changed = true;
            }
        }
        let mut human_resumed = false;
        let mut resumed_now = false;
        if c.halted {
            match c.humans_at_halt {
                None => {
                    c.humans_at_halt = Some(humans);
                    changed = true;
                }
                Some(at) if humans > at => {
                    c.halted = false;
                    human_resumed = true;
                    changed = true;
                }
                _ => {}
            }
        }
        if !c.halted && c.resume_pending {
            c.resume_pending = false;
            let mut at = parse_steps(&c.resumed_at);
            if !at.contains(&steps) {
                at.push(steps);
            }
            c.resumed_at = serde_json::to_string(&at).unwrap_or_else(|_| "[]".into());
            changed = true;
            resumed_now = true;
        }
        let standing = if c.halted {
            Standing::Halted {
                reason: c.reason.to_string(),
                stop: stop_of(&c.source),
            }
        } else {
            Standing::Free {
                resumed_at: parse_steps(&c.resumed_at),
                human_resumed,
                resumed_now,
            }
        };
        if changed {
            // Binding the run (or counting the humans) is bookkeeping, not a new state: it
            // keeps the control's time, so that a replica binding a stale copy never
            // overwrites a newer halt or resume made on another (`Store::save_control`
            // keeps the newest).
            if human_resumed || resumed_now {
                c.updated_ms = now_ms();
            }
            self.write_behind(c.clone());
        }
        standing
    }

    /// A run whose history a compaction rewrote goes on under its control: the control is
    /// bound again, to the history that continues from the summary, and the human messages
    /// it holds now (the summary and what the client wrote around it) count as the ones
    /// at the halt. A later human message still lifts the halt.
    pub fn follow_compaction(&self, conversation: &str, humans: i64, transcript: &Transcript) {
        let mut map = self.lock();
        let Some(c) = map.get_mut(conversation) else {
            return;
        };
        let bound = match (c.run_steps, c.run_digest.as_deref()) {
            (Some(run), Some(digest)) => continues_run(transcript, run, digest),
            _ => false,
        };
        if bound {
            return;
        }
        bind_run(c, transcript);
        if c.halted {
            c.humans_at_halt = Some(humans);
        }
        let c = c.clone();
        drop(map);
        self.write_behind(c);
    }

    /// Marks a conversation halted on the request path, at the request whose history is
    /// `transcript`: by the policy (a loop, a budget) or a human's verdict on a held
    /// request. The halt holds for that run (written behind, off the request path).
    pub fn halt(
        &self,
        conversation: &str,
        reason: &str,
        stop: Stop,
        transcript: &Transcript,
        humans: i64,
    ) {
        let c = self.set_halted(
            conversation,
            reason,
            source_of(stop),
            Some((humans, transcript)),
        );
        self.write_behind(c);
    }

    /// An operator halts a conversation by hand; returns once it is stored.
    pub async fn halt_by_operator(
        &self,
        conversation: &str,
        reason: &str,
    ) -> Result<Control, store::Error> {
        let c = self.set_halted(conversation, reason, source_of(Stop::Operator), None);
        self.write(&c).await?;
        Ok(c)
    }

    /// `at`: the halted request's human messages and history, when a request was halted
    /// (the next request tells both for an operator's halt).
    fn set_halted(
        &self,
        conversation: &str,
        reason: &str,
        source: &str,
        at: Option<(i64, &Transcript)>,
    ) -> Control {
        let mut map = self.lock();
        let c = entry(&mut map, conversation);
        c.halted = true;
        c.reason = reason.into();
        c.source = source.to_string();
        c.humans_at_halt = at.map(|(humans, _)| humans);
        match at {
            Some((_, transcript)) => bind_run(c, transcript),
            None => (c.run_steps, c.run_digest) = (None, None),
        }
        c.resume_pending = false;
        c.updated_ms = now_ms();
        c.clone()
    }

    /// An operator releases a conversation (halted or paused); returns once it is stored.
    /// The next request records where, for the engine.
    pub async fn resume(&self, conversation: &str) -> Result<Control, store::Error> {
        let c = {
            let mut map = self.lock();
            let c = entry(&mut map, conversation);
            c.source = "operator".into();
            c.halted = false;
            c.resume_pending = true;
            c.updated_ms = now_ms();
            c.clone()
        };
        self.write(&c).await?;
        Ok(c)
    }

    /// Lets the next request of a conversation restart escalation (a human chose to
    /// continue a held request): the same as an operator's resume, written behind.
    pub fn release(&self, conversation: &str) {
        let mut map = self.lock();
        let c = entry(&mut map, conversation);
        c.source = "human".into();
        c.halted = false;
        c.resume_pending = true;
        c.updated_ms = now_ms();
        let c = c.clone();
        drop(map);
        self.write_behind(c);
    }

    /// Takes in controls stored by other replicas (`crate::replicas`): each replaces the
    /// one held unless that one is newer, the rule the store itself keeps
    /// (`Store::save_control`), so that every replica converges on the newest.
    pub fn merge(&self, stored: Vec<Control>) {
        let mut map = self.lock();
        for c in stored {
            match map.get_mut(&c.conversation_id) {
                Some(held) if held.updated_ms > c.updated_ms => {}
                Some(held) => *held = c,
                None => {
                    map.insert(c.conversation_id.clone(), c);
                }
            }
        }
    }

    fn write_behind(&self, c: Control) {
        if self.store.is_none() {
            return;
        }
        let this = self.clone();
        crate::spawn::task("halt state write", async move {
            if let Err(e) = this.write(&c).await {
                tracing::warn!(conversation = %c.conversation_id, error = %e, "cannot store the halt state");
            }
        });
    }

    async fn write(&self, c: &Control) -> Result<(), store::Error> {
        match &self.store {
            Some(store) => store.save_control(c).await,
            None => Ok(()),
        }
    }
}

/// The state of a conversation, created (free, nothing recorded) if it has none.
fn entry<'a>(map: &'a mut HashMap<String, Control>, conversation: &str) -> &'a mut Control {
    map.entry(conversation.to_string())
        .or_insert_with(|| Control {
            conversation_id: conversation.to_string(),
            halted: false,
            reason: Default::default(),
            source: String::new(),
            humans_at_halt: None,
            resume_pending: false,
            resumed_at: "[]".into(),
            updated_ms: 0,
            run_steps: None,
            run_digest: None,
        })
}

/// Binds a control to the run whose history is `transcript`.
fn bind_run(c: &mut Control, transcript: &Transcript) {
    let steps = transcript.steps.len();
    c.run_steps = Some(steps as i64);
    c.run_digest = Some(run_digest(transcript, steps));
}

/// Whether `transcript` continues the run a control was bound to: it starts with the `run`
/// steps whose digest is `digest`.
fn continues_run(transcript: &Transcript, run: i64, digest: &str) -> bool {
    usize::try_from(run)
        .is_ok_and(|run| transcript.steps.len() >= run && run_digest(transcript, run) == digest)
}

/// A digest of a run's task and first `steps` steps: what each step did and what it got
/// back, not the messages a human added after it (a human speaking lifts a halt; it does
/// not start another run). Stored with the control, so it must not change between
/// versions: blake3 over the fields, each with its length.
pub fn run_digest(transcript: &Transcript, steps: usize) -> String {
    let mut h = blake3::Hasher::new();
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(transcript.goal().as_bytes());
    for step in transcript.steps.iter().take(steps) {
        digest_step(&mut field, step);
    }
    h.finalize().to_hex()[..32].to_string()
}

fn digest_step(field: &mut impl FnMut(&[u8]), step: &Step) {
    field(step.text.as_bytes());
    for c in &step.calls {
        field(c.call.name.as_bytes());
        field(c.call.args.to_string().as_bytes());
        match &c.result {
            Some(r) => {
                field(r.text.as_bytes());
                field(&[r.is_error.map_or(2, u8::from)]);
            }
            None => field(b"\xff"),
        }
    }
}

fn parse_steps(json: &str) -> Vec<usize> {
    serde_json::from_str(json).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{CallWithResult, ToolCall, ToolResult};

    /// A run of `task` with `steps` steps, each running `command`.
    fn run(task: &str, command: &str, steps: usize) -> Transcript {
        Transcript {
            task: vec![task.into()],
            steps: (0..steps)
                .map(|index| Step {
                    index,
                    text: String::new(),
                    calls: vec![CallWithResult {
                        call: ToolCall {
                            id: format!("c{index}"),
                            name: "bash".into(),
                            args: serde_json::json!({ "command": command }),
                        },
                        result: Some(ToolResult {
                            call_id: format!("c{index}"),
                            name: String::new(),
                            text: "FAILED".into(),
                            is_error: None,
                        }),
                    }],
                    user_after: Vec::new(),
                })
                .collect(),
            ..Transcript::default()
        }
    }

    /// The run of the tests below at `steps` steps.
    fn at(steps: usize) -> Transcript {
        run("fix it", "pytest", steps)
    }

    #[tokio::test]
    async fn halted_until_a_human_speaks_or_an_operator_resumes() {
        let c = Controls::in_memory();
        let free = |s: &Standing| matches!(s, Standing::Free { .. });
        assert!(free(&c.standing("a", 1, &at(3))));
        c.halt("a", "same test failed 4 times", Stop::Loop, &at(4), 1);
        assert_eq!(
            c.standing("a", 1, &at(4)),
            Standing::Halted {
                reason: "same test failed 4 times".into(),
                stop: Stop::Loop,
            }
        );
        // a human message lifts it
        assert_eq!(
            c.standing("a", 2, &at(5)),
            Standing::Free {
                resumed_at: vec![],
                human_resumed: true,
                resumed_now: false
            }
        );
        // an operator's halt learns the human count at the next request, and says who
        c.halt_by_operator("a", "by hand").await.unwrap();
        assert_eq!(
            c.standing("a", 2, &at(5)),
            Standing::Halted {
                reason: "by hand".into(),
                stop: Stop::Operator,
            }
        );
        assert!(!free(&c.standing("a", 2, &at(6))));
        c.resume("a").await.unwrap();
        assert_eq!(
            c.standing("a", 2, &at(7)),
            Standing::Free {
                resumed_at: vec![7],
                human_resumed: false,
                resumed_now: true
            }
        );
        assert_eq!(
            c.standing("a", 2, &at(8)),
            Standing::Free {
                resumed_at: vec![7],
                human_resumed: false,
                resumed_now: false
            }
        );
    }

    #[test]
    fn a_budget_halt_stays_a_budget_halt_and_an_awaited_request_is_awaited_once() {
        let c = Controls::in_memory();
        c.halt(
            "b",
            "41 steps used of an adaptive budget of 40",
            Stop::Budget,
            &at(41),
            1,
        );
        for _ in 0..2 {
            assert!(matches!(
                c.standing("b", 1, &at(42)),
                Standing::Halted {
                    stop: Stop::Budget,
                    ..
                }
            ));
        }
        assert!(!c.contains("p"));
        c.hold_next("p", "`pytest` repeats the loop", "fail_loop");
        assert!(c.contains("p"));
        assert_eq!(
            c.standing("p", 1, &at(9)),
            Standing::Awaiting {
                reason: "`pytest` repeats the loop".into(),
                detector: "fail_loop".into(),
                resumed_at: vec![],
            }
        );
        assert_eq!(c.standing("p", 1, &at(10)), Standing::free());
        // A halted conversation stays halted, awaited or not.
        c.hold_next("b", "again", "fail_loop");
        assert!(matches!(
            c.standing("b", 1, &at(43)),
            Standing::Halted { .. }
        ));
    }

    #[test]
    fn a_control_holds_for_the_run_it_was_made_for_only() {
        let c = Controls::in_memory();
        let halted = at(6);
        c.halt("a", "looping", Stop::Loop, &halted, 1);
        let held = |t: &Transcript| matches!(c.standing("a", 1, t), Standing::Halted { .. });
        assert!(held(&halted), "the same request again");
        let mut next = at(7);
        next.steps[6].calls[0].call.args = serde_json::json!({"command": "ls"});
        assert!(held(&next), "the run going on after the halt");
        // The same task run again from the start, shorter or longer than the halted run,
        // or a run that went another way before the halt: other runs.
        assert!(!held(&at(0)));
        assert!(!held(&at(2)));
        assert!(!held(&run("fix it", "make test", 9)));
        assert!(!held(&run("another task", "pytest", 6)));
        assert!(held(&halted), "and the halted run is still halted");
    }
}
