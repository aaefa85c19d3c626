//! The recorder: turns each finished request into log rows, off the request path.
//!
//! A request hands over a [`Finished`] when its response has ended (or failed): the request
//! row, the decision, the history steps that are new to the log, and the answer the tee
//! decoded ([`Finished::settle`], which also charges it to the conversation's spend). It goes
//! onto the store's queue as it is ([`crate::store::Store::log_deferred`]: a `try_push`; when
//! the log falls behind, requests are dropped and counted, and never wait), and the store's
//! writer thread works out the rows: it hashes and summarizes tool calls. One hand-off per
//! request, to a thread that wakes once per batch.

use std::borrow::Cow;

use bytes::Bytes;

use crate::budget::{Charge, Ledger, Usage};
use crate::detect::{Action, Decision};
use crate::dialect::{Dialect, ResponseTurn};
use crate::proxy::memory::NewSteps;
use crate::store::redact::{summary, summary_of};
use crate::store::{
    ContentRow, ConversationSeen, DecisionRow, Deferred, FindingRow, Masked, Record, RequestRow,
    ToolCallRow,
};
use crate::transcript::{ToolCall, ToolResult};

/// How a request ended (`requests.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream's answer reached the client whole.
    Complete,
    /// The client went away before the answer ended.
    ClientDisconnected,
    /// The upstream's answer broke off (the client saw the same break).
    UpstreamBroken,
    /// The upstream's answer went silent for `upstream.stream_idle_secs` and was cut (the
    /// client saw it break).
    UpstreamStalled,
    /// The stop's grace period ended before the answer did: the proxy cut it (the client
    /// saw it break, as a broken upstream's).
    CutAtShutdown,
    /// The upstream could not be reached (502).
    UpstreamUnreachable,
    /// The upstream did not answer in time (504).
    UpstreamTimeout,
    /// loopwarden answered (a halt); the upstream was not called.
    Answered,
    /// loopwarden refused the request (`super::errors::Refusal`); the upstream was not called.
    Rejected,
}

impl Outcome {
    /// How a response body that failed ended.
    pub fn of_body_error(e: &crate::proxy::upstream::BodyError) -> Outcome {
        match e {
            crate::proxy::upstream::BodyError::Broken(_) => Outcome::UpstreamBroken,
            crate::proxy::upstream::BodyError::Stalled(_) => Outcome::UpstreamStalled,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::ClientDisconnected => "client_disconnected",
            Outcome::UpstreamBroken => "upstream_broken",
            Outcome::UpstreamStalled => "upstream_stalled",
            Outcome::CutAtShutdown => "cut_at_shutdown",
            Outcome::UpstreamUnreachable => "upstream_unreachable",
            Outcome::UpstreamTimeout => "upstream_timeout",
            Outcome::Answered => "answered",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Whether a request's body was read as a conversation (`requests.parse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseStatus {
    Parsed,
    /// A conversation endpoint whose body could not be read: forwarded untouched.
    Unparsed,
    /// Not a conversation endpoint (models list, token counting...).
    NotConversation,
}

impl ParseStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ParseStatus::Parsed => "parsed",
            ParseStatus::Unparsed => "unparsed",
            ParseStatus::NotConversation => "not_conversation",
        }
    }

    /// Whether a forwarded request is a conversation's, and so a sighting of it in
    /// `conversations`: a request to a conversation endpoint, its body read or not. Others
    /// (a model list, a token count) are logged in `requests` only, under the id they state
    /// or a fallback, and make no conversation; nor does a request the proxy refused.
    pub fn is_conversation(self) -> bool {
        self != ParseStatus::NotConversation
    }
}

/// Longest call and result summaries kept in the log (characters).
const CALL_SUMMARY_CHARS: usize = 160;
const RESULT_SUMMARY_CHARS: usize = 120;

/// Everything the log needs about one finished request. Always boxed (about 1 KB): it is
/// made as the request is read and travels through the dispatch, the tee and the log's
/// queue, so it moves as a pointer instead of being copied at each step.
pub struct Finished {
    pub row: RequestRow,
    /// The conversation the request is a sighting of ([`ParseStatus::is_conversation`]).
    pub conversation: Option<ConversationSeen>,
    /// The engine's decision, for requests whose history was parsed.
    pub decision: Option<Decision>,
    /// History steps not yet logged (with their results), and the conversation's head when
    /// they start at its first step.
    pub history: NewSteps,
    /// Index the response's assistant turn gets: the number of steps in the history.
    pub next_step: usize,
    /// Keep the new steps' and the head's whole content (`log.content`), masked.
    pub log_content: bool,
    /// The answer, decoded when its body ended whole ([`Finished::settle`]).
    pub response: Option<ResponseTurn>,
    /// A Responses request whose answer the proxy remembers by id, for a later request
    /// that continues it (`crate::proxy::upstream::response_chain`).
    pub chain: Option<Box<crate::proxy::upstream::PendingAnswer>>,
}

/// A response as the tee captures it while it flows.
pub struct Capture {
    pub dialect: Dialect,
    /// `text/event-stream` (decoded event by event) rather than one JSON body.
    pub event_stream: bool,
    /// The chunks as they arrived: slices of the upstream connection's read buffers.
    pub chunks: Vec<Bytes>,
}

impl Capture {
    /// The answer it holds: an event stream goes through the dialect's stream decoder
    /// chunk by chunk, a JSON answer is parsed whole. `None`: the dialect cannot read it.
    pub fn decode(self) -> Option<ResponseTurn> {
        if self.event_stream {
            let chunks = self.chunks.iter().map(|chunk| &chunk[..]);
            return Some(self.dialect.stream_turn(chunks));
        }
        match self.chunks.as_slice() {
            [one] => self.dialect.parse_response(one),
            chunks => self.dialect.parse_response(&chunks.concat()),
        }
        .ok()
    }
}

impl Finished {
    /// A request that makes no conversation (refused, an upgrade): its row alone.
    pub fn row_only(row: RequestRow) -> Box<Finished> {
        Box::new(Finished {
            row,
            conversation: None,
            decision: None,
            history: Default::default(),
            next_step: 0,
            log_content: false,
            response: None,
            chain: None,
        })
    }

    /// Decodes an answer that arrived whole and charges it to its conversation in the
    /// ledger, under `policy`; its usage (in `crate::budget::Usage`'s terms) and cost go
    /// in the row. Called as the body ends (`super::tee`): the conversation's next request
    /// must see this answer's spend, and only a whole answer can be read. Decoding here,
    /// once, rather than on the log's thread also means the captured chunks (slices of the
    /// upstream connection's read buffers, which they keep alive) are let go at once.
    pub fn settle(&mut self, capture: Capture, ledger: &Ledger, now_ms: i64) {
        let dialect = capture.dialect;
        if let Some(chain) = self.chain.take() {
            chain.answered(capture.event_stream, &capture.chunks);
        }
        let Some(turn) = capture.decode() else {
            return;
        };
        let usage = Usage::of(dialect, &turn);
        let row = &mut self.row;
        let cost = ledger.charge(&Charge {
            conversation: &row.conversation_id,
            policy: row
                .policy
                .as_deref()
                .unwrap_or(crate::policy::config::DEFAULT),
            model: row.model.as_deref(),
            usage,
            history_steps: self.next_step as u64,
            started_ms: row.started_ms,
            now_ms,
        });
        if let Some(u) = usage {
            let count = |n: u64| Some(i64::try_from(n).unwrap_or(i64::MAX));
            row.input_tokens = count(u.input);
            row.cached_input_tokens = count(u.cached_input);
            row.cache_write_tokens = count(u.cache_write);
            row.output_tokens = count(u.output);
            row.cost_usd = cost.priced.then_some(cost.dollars);
        }
        // In the row now, not on the log's thread: the trace and the metrics read the row
        // before the log does.
        row.stop_reason = turn.stop_reason.clone();
        self.response = Some(turn);
    }
}

impl Finished {
    /// Counts the request in the metrics, traces it, and queues it for the log: how every
    /// finished request leaves the request path, so that `/metrics` and the traces count
    /// what the log holds.
    pub fn hand_over(
        self: Box<Self>,
        store: &crate::store::Store,
        metrics: &crate::metrics::Metrics,
        traces: &crate::telemetry::Traces,
    ) {
        let decision = self
            .decision
            .as_ref()
            .filter(|d| d.action != Action::Observe)
            .map(|d| d.action.as_str());
        metrics.request(&self.row, decision);
        traces.record(&crate::telemetry::Call {
            row: &self.row,
            decision: self.decision.as_ref(),
            log_content: self.log_content,
        });
        store.log_deferred(self);
    }
}

impl Deferred for Finished {
    fn records(self: Box<Self>, out: &mut Vec<Record>) {
        record(*self, out);
    }
}

fn record(finished: Finished, out: &mut Vec<Record>) {
    let Finished {
        row,
        conversation,
        decision,
        history,
        next_step,
        log_content,
        response,
        ..
    } = finished;
    let conversation_id = row.conversation_id.clone();
    let at = row.started_ms;
    // The history and the decoded response are ours: their strings move into the rows.
    let tool_call = |step: usize, index: usize, call: ToolCall, result: Option<ToolResult>| {
        Record::ToolCall(Box::new(ToolCallRow {
            conversation_id: conversation_id.clone(),
            step: step as i64,
            call_index: index as i64,
            // Worked out from the whole call before its strings move.
            args_hash: call_hash_hex(&call),
            summary: call_summary(&call),
            call_id: call.id.into(),
            name: call.name.into(),
            result_hash: result
                .as_ref()
                .map(|r| blake3::hash(r.text.as_bytes()).to_hex().as_str().to_owned()),
            result_summary: result
                .as_ref()
                .map(|r| summary(&r.text, RESULT_SUMMARY_CHARS)),
            is_error: result.and_then(|r| r.is_error),
            request_id: row.id,
            seen_ms: at,
        }))
    };

    if let Some(mut conversation) = conversation {
        conversation.overhead_us = row.proxy_overhead_us;
        out.push(Record::Conversation(conversation));
    }
    if log_content {
        contents(&history, &conversation_id, row.id, at, out);
    }
    for step in history.steps {
        for (i, c) in step.calls.into_iter().enumerate() {
            out.push(tool_call(step.index, i, c.call, c.result));
        }
    }
    if let Some(turn) = response {
        for (i, call) in turn.calls.into_iter().enumerate() {
            out.push(tool_call(next_step, i, call, None));
        }
    }
    if let Some(decision) = decision {
        for f in decision.findings {
            out.push(Record::Finding(Box::new(FindingRow {
                request_id: row.id,
                conversation_id: conversation_id.clone(),
                created_ms: at,
                step: f.steps.iter().max().map(|&s| s as i64),
                steps: serde_json::to_string(&f.steps).unwrap_or_else(|_| "[]".into()),
                detector: f.detector,
                confidence: f.confidence,
                summary: f.summary.into(),
                suggestion: f.suggestion.into(),
            })));
        }
        if decision.action != Action::Observe {
            out.push(Record::Decision(Box::new(DecisionRow {
                request_id: row.id,
                conversation_id: conversation_id.clone(),
                created_ms: at,
                action: decision.action.as_str().to_string(),
                applied: row.applied.to_string(),
                step: Some(next_step as i64),
                reason: decision.reason.into(),
                policy: row.policy.as_deref().map(str::to_string),
            })));
        }
    }
    out.push(Record::Request(Box::new(row)));
}

/// The content rows of a request's new steps (and of the head, when they start at the
/// first step), each masked string by string: the whole of what the history carried, so
/// that the conversation's transcript can be rebuilt from the log.
fn contents(
    new: &NewSteps,
    conversation_id: &str,
    request_id: i64,
    at: i64,
    out: &mut Vec<Record>,
) {
    let row = |step: Option<i64>, content: Masked| {
        Record::Content(Box::new(ContentRow {
            conversation_id: conversation_id.to_string(),
            step,
            content,
            request_id,
            seen_ms: at,
        }))
    };
    if let Some(head) = &new.head {
        out.push(row(None, Masked::json(head)));
    }
    for step in &new.steps {
        out.push(row(Some(step.index as i64), Masked::json(step)));
    }
}

fn call_hash_hex(call: &ToolCall) -> String {
    blake3::Hash::from(call.hash()).to_hex().as_str().to_owned()
}

/// `name: <the argument that says what the call does>`, short and redacted.
fn call_summary(call: &ToolCall) -> Masked {
    const TELLING: [&str; 8] = [
        "command",
        "cmd",
        "file_path",
        "filePath",
        "path",
        "pattern",
        "query",
        "url",
    ];
    let detail: Cow<'_, str> = match &call.args {
        serde_json::Value::String(s) => Cow::Borrowed(s),
        serde_json::Value::Object(map) => TELLING
            .iter()
            .find_map(|k| match map.get(*k) {
                Some(serde_json::Value::String(s)) => Some(Cow::Borrowed(s.as_str())),
                Some(serde_json::Value::Array(parts)) => Some(Cow::Owned(
                    parts
                        .iter()
                        .filter_map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                )),
                _ => None,
            })
            .unwrap_or_else(|| Cow::Owned(call.args.to_string())),
        other => Cow::Owned(other.to_string()),
    };
    summary_of(&[&call.name, ": ", &detail], CALL_SUMMARY_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_summaries_show_the_telling_argument_redacted() {
        let call = |name: &str, args: serde_json::Value| ToolCall {
            id: String::new(),
            name: name.into(),
            args,
        };
        let s = call_summary(&call(
            "Bash",
            serde_json::json!({"command": "OPENAI_API_KEY=sk-abcdefghijkl python x.py", "timeout": 5}),
        ));
        assert!(
            s.starts_with("Bash: OPENAI_API_KEY=[redacted] python x.py"),
            "{s}"
        );
        let s = call_summary(&call("Read", serde_json::json!({"file_path": "/a.rs"})));
        assert_eq!(s, "Read: /a.rs");
        let s = call_summary(&call(
            "shell",
            serde_json::json!({"cmd": ["bash", "-lc", "ls"]}),
        ));
        assert_eq!(s, "shell: bash -lc ls");
        let s = call_summary(&call("apply_patch", serde_json::json!("*** Begin Patch\n")));
        assert_eq!(s, "apply_patch: *** Begin Patch");
    }

    #[test]
    fn a_json_answer_gives_its_calls_usage_and_stop_reason_and_a_broken_message_only_the_last_two()
    {
        let answer = |message: &str| Capture {
            dialect: Dialect::OpenAiChat,
            event_stream: false,
            chunks: vec![Bytes::from(format!(
                r#"{{"id":"x","choices":[{{"index":0,"message":{message},"finish_reason":"tool_calls"}}],"usage":{{"prompt_tokens":12,"completion_tokens":3}}}}"#
            ))],
        };
        let turn = answer(
            r#"{"role":"assistant","content":"Reading.","tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a.rs\"}"}}]}"#,
        )
        .decode()
        .unwrap();
        assert_eq!(turn.text, "Reading.");
        assert_eq!(turn.calls.len(), 1);
        assert_eq!(
            (turn.calls[0].id.as_str(), turn.calls[0].name.as_str()),
            ("c1", "read_file")
        );
        assert_eq!(turn.calls[0].args, serde_json::json!({"path": "a.rs"}));
        assert_eq!((turn.input_tokens, turn.output_tokens), (Some(12), Some(3)));
        assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
        // No role: the message reads as nothing, the rest of the answer is kept.
        let turn = answer(r#"{"content":"Reading.","tool_calls":7}"#)
            .decode()
            .unwrap();
        assert!(turn.calls.is_empty() && turn.text.is_empty());
        assert_eq!((turn.input_tokens, turn.output_tokens), (Some(12), Some(3)));
        assert_eq!(turn.stop_reason.as_deref(), Some("tool_calls"));
        // Not JSON, even cut in two chunks: nothing.
        assert!(Capture {
            dialect: Dialect::OpenAiChat,
            event_stream: false,
            chunks: vec![
                Bytes::from_static(b"{\"choices\""),
                Bytes::from_static(b": [")
            ],
        }
        .decode()
        .is_none());
    }

    fn finished(model: &str) -> Finished {
        let mut row = crate::store::RequestRow::sample(1);
        row.conversation_id = "conv".into();
        row.started_ms = 100;
        row.model = Some(model.into());
        Finished {
            next_step: 2,
            ..*Finished::row_only(row)
        }
    }

    /// A settled answer is charged to its conversation, its usage and cost are in its row,
    /// and the read buffers its chunks were sliced from are let go.
    #[test]
    fn a_settled_answer_is_charged_and_keeps_no_read_buffer() {
        // Two pieces of one answer sliced out of one 64 KiB read buffer, as hyper hands
        // them over.
        let answer = br#"{"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1000,"cache_read_input_tokens":10000,"cache_creation_input_tokens":2000,"output_tokens":500}}"#;
        let mut buffer = vec![b' '; 64 * 1024];
        buffer[..40].copy_from_slice(&answer[..40]);
        buffer[100..100 + answer.len() - 40].copy_from_slice(&answer[40..]);
        let read = Bytes::from(buffer);
        let capture = Capture {
            dialect: Dialect::Anthropic,
            event_stream: false,
            chunks: vec![read.slice(..40), read.slice(100..100 + answer.len() - 40)],
        };
        let ledger = Ledger::new(crate::budget::Prices::default());
        let mut f = finished("claude-opus-5-5");
        f.row.policy = Some("ci".into());
        f.settle(capture, &ledger, 200);
        assert!(read.is_unique(), "the capture's chunks are dropped");
        let row = &f.row;
        assert_eq!(
            (
                row.input_tokens,
                row.cached_input_tokens,
                row.cache_write_tokens,
                row.output_tokens
            ),
            (Some(1000), Some(10000), Some(2000), Some(500))
        );
        // 1000×$4 + 10000×$0.20 + 2000×$5 + 500×$20 per million.
        assert!((row.cost_usd.unwrap() - 0.026).abs() < 1e-12);
        assert_eq!(f.response.as_ref().unwrap().text, "hi");
        let spend = ledger.spend("conv").unwrap();
        assert_eq!(
            (spend.requests, spend.steps, spend.first_ms, spend.last_ms),
            (1, 3, 100, 200)
        );
        assert_eq!(&*spend.policy, "ci");

        // A model without a price: the tokens are logged, the cost is unknown (NULL).
        let mut f = finished("mock-model");
        f.row.policy = Some("ci".into());
        f.settle(
            Capture {
                dialect: Dialect::Anthropic,
                event_stream: false,
                chunks: vec![Bytes::from_static(answer)],
            },
            &ledger,
            300,
        );
        assert_eq!((f.row.input_tokens, f.row.cost_usd), (Some(1000), None));
        assert_eq!(ledger.spend("conv").unwrap().unpriced, 1);
    }
}
