//! What the proxy keeps per live conversation, so that each request costs work for its new
//! steps only:
//! - the detection engine's fold of the steps seen so far ([`EngineState`]), which
//!   `Engine::decide_with` continues with the new steps (and rebuilds, with the same
//!   result, when the history is not a continuation: the cache never changes a decision);
//! - the last request's body and parsed messages ([`LastRequest`]), so unchanged messages
//!   are recognised by comparing bytes;
//! - how far the conversation's tool calls are in the log, so each request logs only the
//!   steps that are new or that gained results.
//!
//! Dropped when the conversation is idle. After a restart (or eviction) the next request
//! folds and logs its whole history once; the log's upserts make that harmless.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cache::LastRequest;
use crate::detect::EngineState;
use crate::transcript::Transcript;

/// Keyed by conversation id; every request looks its conversation up four or five times,
/// and foldhash costs a fraction of SipHash on ids this short (still seeded per process).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub struct Conversations {
    inner: Mutex<HashMap<String, State>>,
    idle: Duration,
}

struct State {
    /// Steps before this index were logged with a result for every call.
    complete: usize,
    /// The engine's fold after the latest request that decided.
    engine: Option<Arc<EngineState>>,
    /// The last request's messages, to recognise the unchanged ones by their bytes.
    previous: Option<LastRequest>,
    last_used: Instant,
}

impl Conversations {
    pub fn new(idle: Duration) -> Conversations {
        Conversations {
            inner: Mutex::new(HashMap::default()),
            idle,
        }
    }

    /// The engine's cached fold of the conversation, for a request whose transcript has
    /// `steps` steps.
    /// - Shared when it folded that many (the same history again: a retry, or a load test
    ///   sending one history from many clients): every such request reads it, none copies
    ///   it (`Engine::decide_shared`).
    /// - Taken out otherwise: the request advances it and puts it back (`put_engine`). A
    ///   copy left here would only be replaced, and copying a fold costs as much as the
    ///   conversation is long (its files, its step digests): in a 300-request
    ///   conversation, copying and then dropping the old one was ~15 % of a request's
    ///   instructions. A concurrent request of the conversation with other steps, which
    ///   finds nothing, folds its history from the start, with the same decisions.
    pub fn engine(&self, conversation: &str, steps: usize) -> Option<Arc<EngineState>> {
        let mut map = self.lock();
        let slot = &mut map.get_mut(conversation)?.engine;
        if slot.as_ref()?.steps() == steps {
            slot.clone()
        } else {
            slot.take()
        }
    }

    /// Keeps the fold for the conversation's next request (the latest one wins).
    pub fn put_engine(&self, conversation: &str, state: Arc<EngineState>) {
        with_entry(&mut self.lock(), conversation, |s| s.engine = Some(state));
    }

    /// The conversation's last request, to read the next one after ([`LastRequest::lend`]:
    /// concurrent requests all get what it read; its transcript goes to the first).
    pub fn previous(&self, conversation: &str) -> Option<LastRequest> {
        self.lock()
            .get_mut(conversation)
            .and_then(|s| s.previous.as_mut())
            .map(LastRequest::lend)
    }

    /// The conversation's last request, leaving its transcript where it is
    /// ([`LastRequest::share`]).
    pub fn peek_previous(&self, conversation: &str) -> Option<LastRequest> {
        self.lock()
            .get(conversation)
            .and_then(|s| s.previous.as_ref())
            .map(LastRequest::share)
    }

    pub fn put_previous(&self, conversation: &str, previous: LastRequest) {
        with_entry(&mut self.lock(), conversation, |s| {
            s.previous = Some(previous)
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, State>> {
        // A panic elsewhere while holding the lock leaves consistent entries: keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first step of `transcript` that still needs logging, and records that
    /// everything up to the first step with an unanswered call will have been logged.
    pub fn steps_to_log(&self, conversation: &str, transcript: &Transcript) -> usize {
        with_entry(&mut self.lock(), conversation, |progress| {
            let from = progress.complete.min(transcript.steps.len());
            let first_open = transcript.steps[from..]
                .iter()
                .position(|s| s.calls.iter().any(|c| c.result.is_none()))
                .map_or(transcript.steps.len(), |i| from + i);
            // Never move back: a shorter side request (a title request under the same
            // session id) must not make the next main request log its whole history again.
            progress.complete = progress.complete.max(first_open);
            from
        })
    }

    /// Forgets a conversation that has ended (a replayed run).
    pub fn forget(&self, conversation: &str) {
        self.lock().remove(conversation);
    }

    /// Conversations held (the admin API shows it: idle ones must not stay).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets idle conversations.
    pub fn sweep(&self) {
        let Some(cutoff) = Instant::now().checked_sub(self.idle) else {
            return;
        };
        self.lock().retain(|_, p| p.last_used >= cutoff);
    }
}

/// Runs `f` on the state of a conversation, created if new, marked as used now. The id is
/// copied only for a new conversation (`HashMap::entry` takes an owned key: an allocation
/// and a free per call, two calls per request).
fn with_entry<R>(
    map: &mut HashMap<String, State>,
    conversation: &str,
    f: impl FnOnce(&mut State) -> R,
) -> R {
    let now = Instant::now();
    if let Some(state) = map.get_mut(conversation) {
        state.last_used = now;
        return f(state);
    }
    let mut state = State {
        complete: 0,
        engine: None,
        previous: None,
        last_used: now,
    };
    let result = f(&mut state);
    map.insert(conversation.to_owned(), state);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{CallWithResult, Step, ToolCall, ToolResult};

    fn step(index: usize, answered: bool) -> Step {
        Step {
            index,
            text: String::new(),
            calls: vec![CallWithResult {
                call: ToolCall {
                    id: format!("c{index}"),
                    name: "bash".into(),
                    args: serde_json::json!({}),
                },
                result: answered.then(|| ToolResult {
                    call_id: format!("c{index}"),
                    name: String::new(),
                    text: "ok".into(),
                    is_error: None,
                }),
            }],
            user_after: Vec::new(),
        }
    }

    #[test]
    fn requests_with_the_folded_history_share_the_fold_and_one_that_advances_takes_it() {
        let conversations = Conversations::new(Duration::from_secs(60));
        assert!(conversations.engine("a", 0).is_none());
        let engine = crate::detect::Engine::default();
        let t = Transcript {
            task: vec!["fix it".into()],
            steps: vec![step(0, true)],
            ..Transcript::default()
        };
        let (_, state) = engine.decide_with(&t, &Default::default(), None);
        conversations.put_engine("a", Arc::new(state));
        let first = conversations.engine("a", 1);
        let second = conversations.engine("a", 1);
        assert_eq!(first.as_ref().map(|s| s.steps()), Some(1));
        assert_eq!(
            second.as_ref().map(|s| s.steps()),
            Some(1),
            "a second request in flight is not left without it"
        );
        assert!(conversations.engine("b", 1).is_none());
        drop((first, second));
        // A request with more steps takes it: it is its only holder, so advancing it
        // copies nothing.
        let taken = conversations.engine("a", 2).expect("the fold");
        assert_eq!(Arc::strong_count(&taken), 1);
        assert!(conversations.engine("a", 2).is_none());
        conversations.put_engine("a", taken);
        assert!(conversations.engine("a", 1).is_some());
    }

    #[test]
    fn each_request_logs_only_what_is_new() {
        let log = Conversations::new(Duration::from_secs(60));
        let mut t = Transcript {
            steps: vec![step(0, true), step(1, true)],
            ..Transcript::default()
        };
        assert_eq!(log.steps_to_log("a", &t), 0);
        t.steps.push(step(2, true));
        assert_eq!(log.steps_to_log("a", &t), 2);
        // A step whose call has no result yet is logged again next time.
        t.steps.push(step(3, false));
        assert_eq!(log.steps_to_log("a", &t), 3);
        t.steps[3] = step(3, true);
        assert_eq!(log.steps_to_log("a", &t), 3);
        assert_eq!(log.steps_to_log("b", &t), 0, "conversations are separate");
        t.steps.truncate(1);
        assert_eq!(
            log.steps_to_log("a", &t),
            1,
            "a shorter history logs nothing"
        );
    }
}
