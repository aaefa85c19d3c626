//! How far each conversation's tool calls are in the log, so that each request logs only
//! the steps that are new or that gained results, not the whole history again.
//!
//! A few dozen bytes per conversation, dropped when the conversation is idle. After a
//! restart (or eviction) the next request logs its whole history once; the log's upserts
//! make that harmless.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::transcript::Transcript;

pub struct StepLog {
    inner: Mutex<HashMap<String, Progress>>,
    idle: Duration,
}

struct Progress {
    /// Steps before this index were logged with a result for every call.
    complete: usize,
    last_used: Instant,
}

impl StepLog {
    pub fn new(idle: Duration) -> StepLog {
        StepLog {
            inner: Mutex::new(HashMap::new()),
            idle,
        }
    }

    /// The first step of `transcript` that still needs logging, and records that
    /// everything up to the first step with an unanswered call will have been logged.
    pub fn steps_to_log(&self, conversation: &str, transcript: &Transcript) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let progress = inner.entry(conversation.to_string()).or_insert(Progress {
            complete: 0,
            last_used: now,
        });
        progress.last_used = now;
        let from = progress.complete.min(transcript.steps.len());
        let first_open = transcript.steps[from..]
            .iter()
            .position(|s| s.calls.iter().any(|c| c.result.is_none()))
            .map_or(transcript.steps.len(), |i| from + i);
        // Never move back: a shorter side request (a title request under the same session
        // id) must not make the next main request log its whole history again.
        progress.complete = progress.complete.max(first_open);
        from
    }

    /// Forgets idle conversations.
    pub fn sweep(&self) {
        let Some(cutoff) = Instant::now().checked_sub(self.idle) else {
            return;
        };
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.retain(|_, p| p.last_used >= cutoff);
    }
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
    fn each_request_logs_only_what_is_new() {
        let log = StepLog::new(Duration::from_secs(60));
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
