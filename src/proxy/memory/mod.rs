//! What the proxy remembers of each live conversation, so that a request costs work for
//! what is new in it and not for the whole history it resends. All of it is here:
//!
//! - [`history`]: parsed messages, cached by their bytes (shared by every conversation: a
//!   message's items depend on its bytes alone), and how a request is read after its
//!   conversation's last one: the scan resumes after the bytes both bodies share
//!   ([`crate::scan::Object::parse_after`]), unchanged messages are recognised by their
//!   bytes, the system prompt is not read again, and the last request's transcript is
//!   extended with the new messages rather than rebuilt.
//! - [`arrival`]: the body compared with the last request's while it arrives, before its
//!   last byte.
//! - here, the conversation's slot: its last request ([`LastRequest`]), the detection
//!   engine's fold of its steps ([`EngineState`]), and how far its steps are in the log.
//!
//! A request looks its conversation up once and puts once:
//! 1. [`Memory::recall`], as soon as the request says which conversation it is (the id its
//!    headers state, before the body; else its first two messages, as they arrive):
//!    a [`Recall`], the handle on the conversation's slot.
//! 2. [`Recall::take`], once the body is whole: the last request (its transcript lent to
//!    this request) and the fold.
//! 3. [`Memory::put`], once the request is decided: this request as the last one, the fold
//!    that decided it, and the steps new to the log.
//!
//! Nothing here changes a decision: a fold is continued only over a history it is vouched
//! for ([`crate::detect::Folded`]) or that hashes to what it folded
//! (`Engine::decide_shared`), and a forgotten conversation costs its next request a read
//! of the whole history, once (the log's upserts make logging it again harmless).
//!
//! Bounded by bytes (`cache.conversation_max_bytes`: the least recently used conversations
//! go first) and by idle time (`cache.idle_secs`); the parsed messages have their own
//! bound (`cache.max_bytes`).

pub mod arrival;
pub mod history;
pub mod lineage;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use arrival::{head_key, BodyComparison, Predecessor};
pub use history::{History, ItemList, LastRequest, MessageCache};
pub use lineage::{Joined, Lineage, Sender};

use crate::config::CacheConfig;
use crate::detect::EngineState;
use crate::transcript::{Head, Step, Transcript};

/// Keyed by conversation; foldhash costs a fraction of SipHash on keys this short (still
/// seeded per process).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// What a slot is charged beyond its bodies: the fold, the log's progress, the map entry.
const SLOT_OVERHEAD: usize = 4096;

pub struct Memory {
    /// Parsed messages, shared by every conversation.
    pub messages: MessageCache,
    /// Runs that compacted their context, and the conversations that continue them.
    pub lineage: Lineage,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Bytes charged to the slots in the map (see [`Remembered::bytes`]).
    held: AtomicUsize,
    max_bytes: usize,
    idle: Duration,
    /// The origin of [`Slot::last_used`].
    epoch: Instant,
}

/// One conversation's slot. A request keeps a handle on it ([`Recall`]) from its look-up
/// to its put, so that it locks the conversation map once.
struct Slot {
    state: Mutex<Remembered>,
    /// Milliseconds after [`Memory::epoch`] at the last look-up: the order of eviction.
    last_used: AtomicU64,
}

#[derive(Default)]
struct Remembered {
    /// The conversation's last request, to read the next one after.
    last: Option<LastRequest>,
    /// The engine's fold after the latest request that decided.
    fold: Option<Arc<EngineState>>,
    /// Steps before this index (the run's step numbers) were logged with a result for
    /// every call.
    logged: usize,
    /// What this slot is charged against `cache.conversation_max_bytes`: its last body
    /// twice (the bytes, and the transcript read from them), and [`SLOT_OVERHEAD`].
    bytes: usize,
    /// Evicted or swept: a request that still holds the slot puts nothing in it.
    forgotten: bool,
    /// What the conversation's latest request that offered tools showed.
    stamp: Option<Stamp>,
}

/// What a request of a run shows of where the run is: the results its history holds and
/// the tools it offers. A client's real summary request comes right after a request of
/// its run and repeats its history: no result the run's previous request did not have,
/// the same tools ([`Stamp::admits`]). A request that only carries the marker has moved
/// on (new results) or asks with other tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The last step with a result, and how many results it has (results come after
    /// their calls, in the last steps: a new one moves this on). `(0, 0)`: none yet.
    results: (usize, usize),
    /// A hash of the tool definitions ([`fingerprint`]); `None`: none offered.
    tools: Option<u64>,
}

impl Stamp {
    /// The stamp of a request's transcript `t` and tool definitions' hash. Looks at the
    /// last steps only, back to the last one with a result.
    pub fn of(t: &Transcript, tools: Option<u64>) -> Stamp {
        let results = t
            .steps
            .iter()
            .enumerate()
            .rev()
            .map(|(i, step)| {
                (
                    i + 1,
                    step.calls.iter().filter(|c| c.result.is_some()).count(),
                )
            })
            .find(|(_, n)| *n > 0)
            .unwrap_or((0, 0));
        Stamp { results, tools }
    }

    /// The request offered tools: a request of the run's own, not a side request (a title,
    /// a topic check) of its client's.
    pub fn offers_tools(&self) -> bool {
        self.tools.is_some()
    }

    /// Whether a summary request stamped `summary` repeats the request stamped `self`:
    /// no new result, the same tools.
    pub fn admits(&self, summary: &Stamp) -> bool {
        summary.results <= self.results && summary.tools == self.tools
    }
}

/// A hash of bytes, the same in every process (what [`Stamp`] keeps of tool definitions).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let hash = blake3::hash(bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// A request's handle on its conversation's slot ([`Memory::recall`]).
pub struct Recall {
    slot: Arc<Slot>,
}

/// What [`Recall::take`] hands a request whose body is whole.
#[derive(Default)]
pub struct Recalled {
    /// The conversation's last request, its transcript lent to this request.
    pub last: Option<LastRequest>,
    /// The engine's fold: shared when the request repeats the last body, taken otherwise
    /// (the request advances it and puts it back: a copy left in the slot would only be
    /// replaced, and copying a fold costs as much as the conversation is long).
    pub fold: Option<Arc<EngineState>>,
    /// What the conversation's latest request with tools showed.
    pub stamp: Option<Stamp>,
    /// The body repeats the last body byte for byte.
    pub same_body: bool,
}

/// How much the memory holds, for the admin API's stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Held {
    pub conversations: usize,
    pub conversation_bytes: usize,
    pub messages: usize,
    pub message_bytes: usize,
}

impl Memory {
    pub fn new(config: &CacheConfig) -> Memory {
        let idle = Duration::from_secs(config.idle_secs);
        Memory {
            messages: MessageCache::new(config.max_bytes, idle),
            lineage: Lineage::new(config.compaction_link_secs),
            slots: Mutex::new(HashMap::default()),
            held: AtomicUsize::new(0),
            max_bytes: config.conversation_max_bytes,
            idle,
            epoch: Instant::now(),
        }
    }

    /// The one look-up of a request: the slot of the conversation `key` names, made if new.
    /// The key is copied only for a new conversation.
    pub fn recall(&self, key: &str) -> Recall {
        let now = self.now_ms();
        let mut slots = self.lock();
        let slot = match slots.get(key) {
            Some(slot) => slot.clone(),
            None => {
                let slot = Arc::new(Slot {
                    state: Mutex::new(Remembered::default()),
                    last_used: AtomicU64::new(now),
                });
                slots.insert(key.to_owned(), slot.clone());
                slot
            }
        };
        slot.last_used.store(now, Ordering::Relaxed);
        Recall { slot }
    }

    /// The one put of a request: `last` (its transcript kept with it) becomes the
    /// conversation's last request and `fold` its fold. Returns the steps of that
    /// transcript the log does not have yet (new, or that gained results; with the head when
    /// they start at the first step), and records
    /// that everything up to the first step with an unanswered call will have been logged.
    ///
    /// `carried`: steps of the run before the compaction its history continues from (0 for
    /// a conversation that starts its run). The log numbers the run's steps: this
    /// transcript's step `i` is the run's `carried + i`.
    pub fn put(
        &self,
        recall: Recall,
        last: LastRequest,
        fold: Option<Arc<EngineState>>,
        carried: usize,
    ) -> NewSteps {
        let bytes = 2 * last.body_len() + SLOT_OVERHEAD;
        let (steps, over) = {
            let mut state = recall.slot.lock();
            let steps = state.steps_to_log(&last, carried);
            if state.forgotten {
                return steps;
            }
            let before = std::mem::replace(&mut state.bytes, bytes);
            state.last = Some(last);
            if fold.is_some() {
                state.fold = fold;
            }
            let held = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes - before;
            self.held.fetch_sub(before, Ordering::Relaxed);
            (steps, held > self.max_bytes)
        };
        if over {
            self.evict_to(self.max_bytes - self.max_bytes / 8);
        }
        steps
    }

    /// Forgets a conversation that has ended (a replayed run).
    pub fn forget(&self, key: &str) {
        let removed = self.lock().remove(key);
        if let Some(slot) = removed {
            self.release(&slot);
        }
    }

    /// Forgets conversations idle for longer than `cache.idle_secs`, and messages no
    /// request carried for as long. Called periodically.
    pub fn sweep(&self) {
        self.messages.sweep();
        self.lineage.sweep(crate::store::now_ms());
        let cutoff = self.now_ms().saturating_sub(self.idle.as_millis() as u64);
        let idle: Vec<Arc<Slot>> = {
            let mut slots = self.lock();
            let mut idle = Vec::new();
            slots.retain(|_, slot| {
                let keep = slot.last_used.load(Ordering::Relaxed) >= cutoff;
                if !keep {
                    idle.push(slot.clone());
                }
                keep
            });
            idle
        };
        for slot in idle {
            self.release(&slot);
        }
    }

    /// What is held: conversations and their bytes, parsed messages and theirs.
    pub fn held(&self) -> Held {
        let (messages, message_bytes) = self.messages.size();
        Held {
            conversations: self.lock().len(),
            conversation_bytes: self.held.load(Ordering::Relaxed),
            messages,
            message_bytes,
        }
    }

    /// Forgets the least recently used conversations until the slots hold at most
    /// `target` bytes. Rare (only over the bound), so a sort is fine; going down to 7/8 of
    /// the bound keeps it rare.
    fn evict_to(&self, target: usize) {
        let evicted: Vec<Arc<Slot>> = {
            let mut slots = self.lock();
            let mut by_age: Vec<(u64, String, usize)> = slots
                .iter()
                .map(|(key, slot)| {
                    let bytes = slot.lock().bytes;
                    (slot.last_used.load(Ordering::Relaxed), key.clone(), bytes)
                })
                .collect();
            by_age.sort_unstable();
            let mut held = self.held.load(Ordering::Relaxed);
            let mut evicted = Vec::new();
            for (_, key, bytes) in by_age {
                if held <= target {
                    break;
                }
                if let Some(slot) = slots.remove(&key) {
                    evicted.push(slot);
                    held = held.saturating_sub(bytes);
                }
            }
            evicted
        };
        for slot in evicted {
            self.release(&slot);
        }
    }

    /// Empties a slot taken out of the map and stops charging it: its memory is freed now,
    /// even while a request in flight still holds it.
    fn release(&self, slot: &Slot) {
        let mut state = slot.lock();
        self.held.fetch_sub(state.bytes, Ordering::Relaxed);
        *state = Remembered {
            forgotten: true,
            ..Remembered::default()
        };
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        // A panic elsewhere while holding the lock leaves consistent entries: keep going.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, Remembered> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Recall {
    /// Whether both handles are on one slot.
    #[cfg(test)]
    pub fn is_slot_of(&self, other: &Recall) -> bool {
        Arc::ptr_eq(&self.slot, &other.slot)
    }

    /// Whether the slot holds a request of the conversation (it was seen, and not forgotten).
    pub fn holds_request(&self) -> bool {
        self.slot.lock().last.is_some()
    }

    /// The conversation's last request as it is now, to compare a body with while it
    /// arrives ([`LastRequest::share`]: its transcript stays for whichever request of the
    /// conversation is read first).
    pub fn peek(&self) -> Option<LastRequest> {
        self.slot.lock().last.as_ref().map(LastRequest::share)
    }

    /// Once the body is whole: the last request, its transcript lent
    /// ([`LastRequest::lend`]), and the fold. `same_body`: the body repeats the last body
    /// byte for byte (a retry, or many clients sending one history), so its fold is read,
    /// not advanced, and stays for the others.
    pub fn take(&self, same_body: bool) -> Recalled {
        let mut state = self.slot.lock();
        let fold = if same_body {
            state.fold.clone()
        } else {
            state.fold.take()
        };
        Recalled {
            last: state.last.as_mut().map(LastRequest::lend),
            fold,
            stamp: state.stamp,
            same_body,
        }
    }

    /// Keeps `stamp` as what the conversation's latest request with tools showed.
    pub fn stamp(&self, stamp: Stamp) {
        let mut state = self.slot.lock();
        if !state.forgotten {
            state.stamp = Some(stamp);
        }
    }
}

/// What a request adds to the log: the steps of its history not logged yet, and, when they
/// start at the conversation's first step, the conversation's head (its instructions and
/// task), which the log keeps with the steps' content (`log.content`). The head is copied
/// once per conversation (and again if the conversation was forgotten and comes back).
#[derive(Debug, Default)]
pub struct NewSteps {
    pub steps: Vec<Step>,
    pub head: Option<Head>,
}

impl Remembered {
    /// The steps of `last`'s kept transcript that still need logging (numbered as the
    /// run's: `carried` on), and records how far the log will be once they are.
    fn steps_to_log(&mut self, last: &LastRequest, carried: usize) -> NewSteps {
        let Some(transcript) = last.transcript() else {
            return NewSteps::default();
        };
        let steps = &transcript.steps;
        let from = self.logged.saturating_sub(carried).min(steps.len());
        let first_open = steps[from..]
            .iter()
            .position(|s| s.calls.iter().any(|c| c.result.is_none()))
            .map_or(steps.len(), |i| from + i);
        // Never move back: a shorter side request (a title request under the same
        // session id) must not make the next main request log its whole history again.
        self.logged = self.logged.max(carried + first_open);
        let steps = steps[from..]
            .iter()
            .map(|s| Step {
                index: s.index + carried,
                ..s.clone()
            })
            .collect();
        NewSteps {
            steps,
            // A continued history's head is its summary: the run keeps its own.
            head: (from == 0 && carried == 0 && !transcript.steps.is_empty())
                .then(|| transcript.head()),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::dialect::Dialect;
    use crate::request_bytes::RequestBytes;
    use crate::transcript::Transcript;

    fn memory(max_bytes: usize) -> Memory {
        Memory::new(&CacheConfig {
            conversation_max_bytes: max_bytes,
            ..CacheConfig::default()
        })
    }

    /// A chat request whose history is `turns` tool calls, the last `open` ones unanswered.
    fn request(memory: &Memory, turns: usize, open: usize) -> LastRequest {
        let mut messages = vec![r#"{"role":"user","content":"fix it"}"#.to_string()];
        for i in 0..turns {
            messages.push(format!(
                r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":"c{i}","type":"function","function":{{"name":"bash","arguments":"{{}}"}}}}]}}"#
            ));
            if i + open < turns {
                messages.push(format!(
                    r#"{{"role":"tool","tool_call_id":"c{i}","content":"ok"}}"#
                ));
            }
        }
        let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
        let body = RequestBytes::from(Bytes::from(body));
        let history = memory
            .messages
            .read_history(Dialect::OpenAiChat, &body, false, None, None)
            .unwrap();
        let mut last = history.request;
        last.keep_transcript(history.transcript, None, None);
        last
    }

    fn fold() -> Arc<EngineState> {
        let engine = crate::detect::Engine::default();
        Arc::new(
            engine
                .decide_with(&Transcript::default(), &Default::default(), None)
                .1,
        )
    }

    #[test]
    fn a_request_takes_the_transcript_and_the_fold_and_a_repeated_body_shares_the_fold() {
        let memory = memory(1 << 30);
        let kept = fold();
        memory.put(
            memory.recall("a"),
            request(&memory, 1, 0),
            Some(kept.clone()),
            0,
        );
        // The same body again: the fold is read and stays for the others.
        let same = memory.recall("a").take(true);
        assert!(same.fold.as_ref().is_some_and(|f| Arc::ptr_eq(f, &kept)));
        assert!(same
            .last
            .as_ref()
            .and_then(LastRequest::transcript)
            .is_some());
        let again = memory.recall("a").take(true);
        assert!(again.fold.is_some(), "still there for a second request");
        assert!(
            again
                .last
                .as_ref()
                .and_then(LastRequest::transcript)
                .is_none(),
            "the transcript went to the first"
        );
        // Another body: the fold is taken, to be advanced without a copy.
        let other = memory.recall("a").take(false);
        assert!(other.fold.is_some());
        assert!(memory.recall("a").take(false).fold.is_none());
        assert!(
            memory.recall("b").take(false).last.is_none(),
            "conversations are apart"
        );
    }

    #[test]
    fn each_request_logs_only_what_is_new() {
        let memory = memory(1 << 30);
        let put = |turns, open| {
            let last = request(&memory, turns, open);
            memory.put(memory.recall("a"), last, None, 0)
        };
        let logged = |turns, open| put(turns, open).steps.len();
        // No step yet: nothing, not even the head.
        assert!(put(0, 0).head.is_none());
        // The head comes with the first step, once.
        let first = put(2, 0);
        assert_eq!(first.steps.len(), 2);
        assert_eq!(first.head.map(|h| h.task), Some(vec!["fix it".to_string()]));
        assert!(put(3, 0).head.is_none());
        // A step whose call has no result yet is logged again next time.
        assert_eq!(logged(4, 1), 1);
        assert_eq!(logged(4, 0), 1);
        // A shorter history (a side request under the same id) logs nothing.
        assert_eq!(logged(1, 0), 0);
        assert_eq!(logged(5, 0), 1);
    }

    #[test]
    fn the_least_recently_used_conversations_go_first_once_over_the_bound() {
        let one = 2 * request(&memory(1), 1, 0).body_len() + SLOT_OVERHEAD;
        let memory = memory(3 * one + one / 2);
        for key in ["a", "b", "c"] {
            memory.put(memory.recall(key), request(&memory, 1, 0), None, 0);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(memory.held().conversations, 3);
        assert_eq!(memory.held().conversation_bytes, 3 * one);
        // "a" is used again: "b" is now the least recently used.
        let a = memory.recall("a");
        std::thread::sleep(Duration::from_millis(2));
        memory.put(memory.recall("d"), request(&memory, 1, 0), None, 0);
        assert!(memory.held().conversation_bytes <= 3 * one + one / 2);
        assert!(memory.recall("b").peek().is_none(), "evicted");
        assert!(a.peek().is_some() && memory.recall("d").peek().is_some());
        // A request that still holds an evicted slot puts nothing in it and is not charged.
        let held = memory.held().conversation_bytes;
        let b = memory.recall("b");
        memory.forget("b");
        memory.put(b, request(&memory, 1, 0), None, 0);
        assert_eq!(memory.held().conversation_bytes, held);
        memory.sweep();
        assert_eq!(memory.held().conversations, 3, "none idle for long");
    }
}
