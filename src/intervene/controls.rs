//! Sticky halts: what a transcript cannot hold about a conversation. Once a conversation is
//! halted (by the policy or by an operator), its later requests get the halt again without
//! reaching the upstream, until a human speaks (a new human message after the halt) or an
//! operator resumes it. The state lives in memory for the request path and in SQLite
//! (`conversation_controls`) so it survives a restart.
//!
//! An operator's resume is also a fact the detection engine needs (it restarts escalation
//! there): the request that follows a resume is recorded in `resumed_at`, which becomes
//! `StoreFacts::resumed_at`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::ruling::Stop;
use crate::store::{self, now_ms, Store};
use crate::transcript::Transcript;

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

    /// Where a request stands. `humans` is [`human_messages`] of its transcript, `steps`
    /// the assistant turns it carries. Lifts a halt when a human spoke since, records a
    /// pending resume; both are written through to the store off the request path. A
    /// request awaited by a human is so once: it takes the mark.
    pub fn standing(&self, conversation: &str, humans: i64, steps: usize) -> Standing {
        let awaited = self.awaited().remove(conversation);
        let standing = self.stored_standing(conversation, humans, steps);
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
    fn stored_standing(&self, conversation: &str, humans: i64, steps: usize) -> Standing {
        let mut map = self.lock();
        let Some(c) = map.get_mut(conversation) else {
            return Standing::free();
        };
        let mut changed = false;
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
            c.updated_ms = now_ms();
            self.write_behind(c.clone());
        }
        standing
    }

    /// Marks a conversation halted on the request path: by the policy (a loop, a budget)
    /// or a human's verdict on a held request (written behind, off the request path).
    pub fn halt(&self, conversation: &str, reason: &str, stop: Stop, humans: i64) {
        let c = self.set_halted(conversation, reason, source_of(stop), Some(humans));
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

    fn set_halted(
        &self,
        conversation: &str,
        reason: &str,
        source: &str,
        humans: Option<i64>,
    ) -> Control {
        let mut map = self.lock();
        let c = entry(&mut map, conversation);
        c.halted = true;
        c.reason = reason.into();
        c.source = source.to_string();
        c.humans_at_halt = humans;
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
        })
}

fn parse_steps(json: &str) -> Vec<usize> {
    serde_json::from_str(json).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn halted_until_a_human_speaks_or_an_operator_resumes() {
        let c = Controls::in_memory();
        let free = |s: &Standing| matches!(s, Standing::Free { .. });
        assert!(free(&c.standing("a", 1, 3)));
        c.halt("a", "same test failed 4 times", Stop::Loop, 1);
        assert_eq!(
            c.standing("a", 1, 4),
            Standing::Halted {
                reason: "same test failed 4 times".into(),
                stop: Stop::Loop,
            }
        );
        // a human message lifts it
        assert_eq!(
            c.standing("a", 2, 5),
            Standing::Free {
                resumed_at: vec![],
                human_resumed: true,
                resumed_now: false
            }
        );
        // an operator's halt learns the human count at the next request, and says who
        c.halt_by_operator("a", "by hand").await.unwrap();
        assert_eq!(
            c.standing("a", 2, 5),
            Standing::Halted {
                reason: "by hand".into(),
                stop: Stop::Operator,
            }
        );
        assert!(!free(&c.standing("a", 2, 6)));
        c.resume("a").await.unwrap();
        assert_eq!(
            c.standing("a", 2, 7),
            Standing::Free {
                resumed_at: vec![7],
                human_resumed: false,
                resumed_now: true
            }
        );
        assert_eq!(
            c.standing("a", 2, 8),
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
            1,
        );
        for _ in 0..2 {
            assert!(matches!(
                c.standing("b", 1, 42),
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
            c.standing("p", 1, 9),
            Standing::Awaiting {
                reason: "`pytest` repeats the loop".into(),
                detector: "fail_loop".into(),
                resumed_at: vec![],
            }
        );
        assert_eq!(c.standing("p", 1, 10), Standing::free());
        // A halted conversation stays halted, awaited or not.
        c.hold_next("b", "again", "fail_loop");
        assert!(matches!(c.standing("b", 1, 43), Standing::Halted { .. }));
    }
}
