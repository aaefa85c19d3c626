//! OpenTelemetry traces, off by default (`[telemetry] otlp_endpoint`): a span per proxied
//! model call with the GenAI semantic conventions' attributes (`gen_ai.*`: operation,
//! provider, request model, conversation id, token usage, finish reason), and for each
//! request loopwarden acted on an `apply_guardrail` child span carrying a
//! `gen_ai.guardrail.result` event (policy, result, reason). The GenAI conventions are at
//! "development" stability; the names here follow semantic conventions 1.37 for the model
//! call and the security-guardian proposal (`apply_guardrail`, `gen_ai.security.*`) for the
//! guardrail.
//!
//! What is exported never holds a prompt, a tool's arguments or its output: the reason of
//! a decision (which quotes the agent's commands) goes out only under a policy that logs
//! content (`log.content`); otherwise the event names the detector alone.
//!
//! Spans are built when a request's log record is handed over (`Finished::hand_over`, off
//! the client's path: its answer has gone out) and queued; a task of its own sends them in
//! batches as OTLP/HTTP JSON to `{otlp_endpoint}/v1/traces`. A full queue drops spans
//! (counted), and an unreachable collector costs the proxy nothing but the counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::detect::Decision;
use crate::store::RequestRow;

/// The `[telemetry]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP collector (`http://collector:4318`); spans go to its
    /// `/v1/traces`. Empty: no traces.
    pub otlp_endpoint: String,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Spans sent per export at most.
    pub batch_size: usize,
    /// Longest a span waits in the batch before it is sent (ms).
    pub flush_ms: u64,
    /// Spans waiting to be sent at most; past it new ones are dropped and counted.
    pub queue: usize,
    /// Longest an export may take (ms).
    pub timeout_ms: u64,
}

impl Default for TelemetryConfig {
    fn default() -> TelemetryConfig {
        TelemetryConfig {
            otlp_endpoint: String::new(),
            service_name: "loopwarden".into(),
            batch_size: 512,
            flush_ms: 1000,
            queue: 4096,
            timeout_ms: 5000,
        }
    }
}

/// Counts of what the exporter did, for `/admin/api/stats`.
#[derive(Debug, Default, Serialize)]
pub struct TraceCounts {
    pub exported: u64,
    pub dropped: u64,
    pub failed: u64,
}

#[derive(Default)]
struct Counts {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

/// Where spans go: nowhere (off), or the exporter's queue. A queued span is its OTLP JSON,
/// written once as the request is handed over: no tree of values is built, copied or kept.
pub struct Traces {
    queue: Option<mpsc::Sender<String>>,
    counts: Arc<Counts>,
}

impl Traces {
    /// Traces off: recording is a no-op.
    pub fn off() -> Traces {
        Traces {
            queue: None,
            counts: Arc::default(),
        }
    }

    /// Starts the exporter when the config names an endpoint (on the calling runtime).
    pub fn start(config: &TelemetryConfig) -> Traces {
        let endpoint = config.otlp_endpoint.trim_end_matches('/');
        if endpoint.is_empty() {
            return Traces::off();
        }
        let (queue, spans) = mpsc::channel(config.queue.max(1));
        let counts = Arc::new(Counts::default());
        let exporter = Exporter {
            url: format!("{endpoint}/v1/traces"),
            service: config.service_name.clone(),
            batch: config.batch_size.max(1),
            flush: Duration::from_millis(config.flush_ms.max(1)),
            timeout: Duration::from_millis(config.timeout_ms.max(1)),
            counts: counts.clone(),
        };
        crate::spawn::task("trace export", exporter.run(spans));
        Traces {
            queue: Some(queue),
            counts,
        }
    }

    pub fn counts(&self) -> TraceCounts {
        TraceCounts {
            exported: self.counts.exported.load(Ordering::Relaxed),
            dropped: self.counts.dropped.load(Ordering::Relaxed),
            failed: self.counts.failed.load(Ordering::Relaxed),
        }
    }

    /// Queues the spans of a finished request: the model call, and the guardrail's when
    /// loopwarden decided something about it. Requests that were not a model call (not a
    /// conversation endpoint) make no span.
    pub fn record(&self, call: &Call<'_>) {
        let Some(queue) = &self.queue else { return };
        for span in spans_of(call) {
            if queue.try_send(span.to_json()).is_err() {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What a span says of one finished request: its log row, the decision about it, and
/// whether its policy lets content (a decision's reason) leave the proxy.
pub struct Call<'a> {
    pub row: &'a RequestRow,
    pub decision: Option<&'a Decision>,
    pub log_content: bool,
}

/// An OTLP span, written as OTLP JSON by [`Span::to_json`].
struct Span<'a> {
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
    name: Cow<'a, str>,
    kind: SpanKind,
    start_ns: i64,
    end_ns: i64,
    attributes: Vec<Attribute<'a>>,
    events: Vec<Event<'a>>,
    failed: bool,
}

#[derive(Clone, Copy)]
enum SpanKind {
    Internal,
    Client,
}

impl SpanKind {
    /// OTLP's `SpanKind` number.
    fn code(self) -> u8 {
        match self {
            SpanKind::Internal => 1,
            SpanKind::Client => 3,
        }
    }
}

struct Event<'a> {
    name: &'static str,
    attributes: Vec<Attribute<'a>>,
}

struct Attribute<'a> {
    key: &'static str,
    value: AnyValue<'a>,
}

/// OTLP's `AnyValue`, the kinds written here.
enum AnyValue<'a> {
    String(Cow<'a, str>),
    Int(i64),
    Array(Vec<AnyValue<'a>>),
}

fn string<'a>(key: &'static str, value: &'a str) -> Attribute<'a> {
    Attribute {
        key,
        value: AnyValue::String(Cow::Borrowed(value)),
    }
}

fn int(key: &'static str, value: i64) -> Attribute<'static> {
    Attribute {
        key,
        value: AnyValue::Int(value),
    }
}

/// OTLP JSON, written straight into one string: a span leaves the request path several
/// times a second per connection, and a tree of JSON values (or a generic serializer
/// escaping every constant key) cost it more than the rest of the request's bookkeeping.
/// Names are `camelCase`, 64-bit integers strings, ids lowercase hex.
impl Span<'_> {
    fn to_json(&self) -> String {
        let mut out = String::with_capacity(1024);
        out.push_str(r#"{"traceId":""#);
        out.push_str(&self.trace_id);
        out.push_str(r#"","spanId":""#);
        out.push_str(&self.span_id);
        if let Some(parent) = &self.parent_span_id {
            out.push_str(r#"","parentSpanId":""#);
            out.push_str(parent);
        }
        out.push_str(r#"","name":"#);
        json_string(&mut out, &self.name);
        out.push_str(r#","kind":"#);
        push_int(&mut out, i64::from(self.kind.code()));
        out.push_str(r#","startTimeUnixNano":""#);
        push_int(&mut out, self.start_ns);
        out.push_str(r#"","endTimeUnixNano":""#);
        push_int(&mut out, self.end_ns);
        out.push_str(r#"","attributes":"#);
        json_attributes(&mut out, &self.attributes);
        if !self.events.is_empty() {
            out.push_str(r#","events":["#);
            for (i, event) in self.events.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"timeUnixNano":""#);
                push_int(&mut out, self.start_ns);
                out.push_str(r#"","name":""#);
                out.push_str(event.name);
                out.push_str(r#"","attributes":"#);
                json_attributes(&mut out, &event.attributes);
                out.push('}');
            }
            out.push(']');
        }
        out.push_str(match self.failed {
            true => r#","status":{"code":2}}"#,
            false => r#","status":{"code":1}}"#,
        });
        out
    }
}

fn json_attributes(out: &mut String, attributes: &[Attribute<'_>]) {
    out.push('[');
    for (i, attribute) in attributes.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Keys are this file's constants: nothing in them to escape.
        out.push_str(r#"{"key":""#);
        out.push_str(attribute.key);
        out.push_str(r#"","value":"#);
        json_value(out, &attribute.value);
        out.push('}');
    }
    out.push(']');
}

fn json_value(out: &mut String, value: &AnyValue<'_>) {
    match value {
        AnyValue::String(s) => {
            out.push_str(r#"{"stringValue":"#);
            json_string(out, s);
        }
        AnyValue::Int(n) => {
            out.push_str(r#"{"intValue":""#);
            push_int(out, *n);
            out.push('"');
        }
        AnyValue::Array(values) => {
            out.push_str(r#"{"arrayValue":{"values":["#);
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_value(out, v);
            }
            out.push_str("]}");
        }
    }
    out.push('}');
}

/// `n` in decimal, without the formatting machinery.
fn push_int(out: &mut String, n: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if n < 0 {
        out.push('-');
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
}

/// `s` as a JSON string: copied as it is when it holds nothing JSON escapes (every
/// attribute but a masked reason), else through serde_json.
fn json_string(out: &mut String, s: &str) {
    if s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    } else {
        out.push('"');
        out.push_str(s);
        out.push('"');
    }
}

/// The OTLP spans of a finished request.
fn spans_of<'a>(call: &Call<'a>) -> Vec<Span<'a>> {
    let row = call.row;
    let Some(dialect) = row.dialect.as_deref() else {
        return Vec::new();
    };
    let (operation, provider) = match dialect {
        "gemini" => ("generate_content", "gcp.gemini"),
        "anthropic" => ("chat", "anthropic"),
        _ => ("chat", "openai"),
    };
    let model = row.model.as_deref().unwrap_or("");
    let start = row.started_ms.saturating_mul(1_000_000);
    let took_us = row.proxy_overhead_us + row.upstream_total_us.unwrap_or(0);
    let end = start.saturating_add(took_us.saturating_mul(1000));
    let policy = row
        .policy
        .as_deref()
        .unwrap_or(crate::names::DEFAULT_POLICY);
    let input = [
        row.input_tokens,
        row.cached_input_tokens,
        row.cache_write_tokens,
    ]
    .iter()
    .flatten()
    .sum::<i64>();
    let mut attributes = vec![
        string("gen_ai.operation.name", operation),
        string("gen_ai.provider.name", provider),
        string("gen_ai.request.model", model),
        string("gen_ai.conversation.id", &row.conversation_id),
        int("http.response.status_code", row.status),
        string("loopwarden.policy", policy),
        string("loopwarden.applied", row.applied.as_str()),
    ];
    if row.input_tokens.is_some() {
        attributes.push(int("gen_ai.usage.input_tokens", input));
    }
    if let Some(output) = row.output_tokens {
        attributes.push(int("gen_ai.usage.output_tokens", output));
    }
    if let Some(reason) = &row.stop_reason {
        attributes.push(Attribute {
            key: "gen_ai.response.finish_reasons",
            value: AnyValue::Array(vec![AnyValue::String(Cow::Borrowed(reason))]),
        });
    }
    let failed = row.status >= 500
        || row.outcome.as_str() != "complete" && row.outcome.as_str() != "answered";
    let call_span = Span {
        trace_id: hex_id(16),
        span_id: hex_id(8),
        parent_span_id: None,
        name: match model {
            "" => Cow::Borrowed(operation),
            _ => Cow::Owned(format!("{operation} {model}")),
        },
        kind: SpanKind::Client,
        start_ns: start,
        end_ns: end,
        attributes,
        events: Vec::new(),
        failed,
    };
    if let Some(decision) = call
        .decision
        .filter(|d| d.action != crate::detect::Action::Observe)
    {
        let guardrail = guardrail_span(call, decision, &call_span, policy);
        return vec![call_span, guardrail];
    }
    vec![call_span]
}

/// The `apply_guardrail` child span of a model call loopwarden decided something about,
/// with its `gen_ai.guardrail.result` event.
fn guardrail_span<'a>(
    call: &Call<'a>,
    decision: &'a Decision,
    parent: &Span<'a>,
    policy: &'a str,
) -> Span<'a> {
    let result = call.row.applied.as_str();
    // A decision's reason quotes the agent's commands and files: content.
    let reason = match call.log_content {
        true => Cow::Owned(crate::store::Masked::from(decision.reason.as_str()).to_string()),
        false => Cow::Borrowed(decision.detector.as_str()),
    };
    Span {
        trace_id: parent.trace_id.clone(),
        span_id: hex_id(8),
        parent_span_id: Some(parent.span_id.clone()),
        name: Cow::Borrowed("apply_guardrail loopwarden"),
        kind: SpanKind::Internal,
        start_ns: parent.start_ns,
        end_ns: parent.start_ns,
        attributes: vec![
            string("gen_ai.operation.name", "apply_guardrail"),
            string("gen_ai.guardian.name", "loopwarden"),
            string("gen_ai.security.target.type", "llm_input"),
            string("gen_ai.security.decision.type", decision_type(result)),
            string("gen_ai.security.decision.reason", &decision.detector),
            string("gen_ai.conversation.id", &call.row.conversation_id),
            string("loopwarden.policy", policy),
            string("loopwarden.action", decision.action.as_str()),
        ],
        events: vec![Event {
            name: "gen_ai.guardrail.result",
            attributes: vec![
                string("gen_ai.guardrail.policy", policy),
                string("gen_ai.guardrail.result", result),
                Attribute {
                    key: "gen_ai.guardrail.reason",
                    value: AnyValue::String(reason),
                },
            ],
        }],
        failed: false,
    }
}

/// The security conventions' decision type of what loopwarden applied: a stop denies, a
/// reminder or rollback modifies the request, a shadow policy's or a held request's
/// ruling is an audit, a decision not acted on a warning.
fn decision_type(applied: &str) -> &'static str {
    match applied {
        "halted" | "blocked" => "deny",
        "nudged" | "replanned" | "rolled_back" => "modify",
        "held" => "audit",
        a if a.starts_with("would_") => "audit",
        _ => "warn",
    }
}

/// A random id of `bytes` bytes, in the lowercase hex OTLP JSON writes ids in.
fn hex_id(bytes: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(bytes * 2);
    for _ in 0..bytes {
        let b = fastrand::u8(..);
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 15)]));
    }
    id
}

/// Sends queued spans in batches.
struct Exporter {
    url: String,
    service: String,
    batch: usize,
    flush: Duration,
    timeout: Duration,
    counts: Arc<Counts>,
}

impl Exporter {
    async fn run(self, mut spans: mpsc::Receiver<String>) {
        let client = reqwest::Client::builder()
            .timeout(self.timeout)
            .build()
            .unwrap_or_default();
        let mut batch = Vec::new();
        loop {
            let next = tokio::time::timeout(self.flush, spans.recv()).await;
            match next {
                Ok(Some(span)) => {
                    batch.push(span);
                    if batch.len() < self.batch {
                        continue;
                    }
                }
                Ok(None) => {
                    self.send(&client, std::mem::take(&mut batch)).await;
                    return;
                }
                Err(_) => {}
            }
            if !batch.is_empty() {
                self.send(&client, std::mem::take(&mut batch)).await;
            }
        }
    }

    async fn send(&self, client: &reqwest::Client, spans: Vec<String>) {
        if spans.is_empty() {
            return;
        }
        let n = spans.len() as u64;
        let sent = client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(self.body(&spans))
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {
                self.counts.exported.fetch_add(n, Ordering::Relaxed);
            }
            Ok(r) => {
                tracing::warn!(status = %r.status(), spans = n, "trace export refused");
                self.counts.failed.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(error = %e, spans = n, "trace export failed");
                self.counts.failed.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The export request's body: one resource, one scope, the spans as they were written.
    fn body(&self, spans: &[String]) -> String {
        let service = serde_json::to_string(&self.service).unwrap_or_default();
        let mut body =
            String::with_capacity(256 + spans.iter().map(|s| s.len() + 1).sum::<usize>());
        body.push_str(r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"#);
        body.push_str(&service);
        body.push_str(r#"}}]},"scopeSpans":[{"scope":{"name":"loopwarden","version":""#);
        body.push_str(env!("CARGO_PKG_VERSION"));
        body.push_str(r#""},"spans":["#);
        for (i, span) in spans.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(span);
        }
        body.push_str("]}]}]}");
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written JSON parses, and every value reads back as it was, escapes,
    /// negative and extreme numbers included.
    #[test]
    fn a_span_is_json_whose_values_read_back() {
        let span = Span {
            trace_id: hex_id(16),
            span_id: hex_id(8),
            parent_span_id: Some(hex_id(8)),
            name: Cow::Borrowed("chat \"odd\" model\n\\"),
            kind: SpanKind::Internal,
            start_ns: i64::MAX,
            end_ns: 0,
            attributes: vec![
                string("a", "tab\there, quote \" and \u{1} and é ✓"),
                int("n", -1234567890123),
                int("m", i64::MIN),
                Attribute {
                    key: "list",
                    value: AnyValue::Array(vec![AnyValue::String(Cow::Borrowed("stop"))]),
                },
            ],
            events: vec![Event {
                name: "e",
                attributes: vec![string("r", "x")],
            }],
            failed: true,
        };
        let v: serde_json::Value = serde_json::from_str(&span.to_json()).unwrap();
        assert_eq!(v["traceId"].as_str().unwrap().len(), 32);
        assert_eq!(v["spanId"].as_str().unwrap().len(), 16);
        assert_eq!(v["parentSpanId"].as_str().unwrap().len(), 16);
        assert_eq!(v["name"], "chat \"odd\" model\n\\");
        assert_eq!(v["kind"], 1);
        assert_eq!(v["startTimeUnixNano"], i64::MAX.to_string());
        assert_eq!(v["endTimeUnixNano"], "0");
        let attrs = &v["attributes"];
        assert_eq!(attrs[0]["key"], "a");
        assert_eq!(
            attrs[0]["value"]["stringValue"],
            "tab\there, quote \" and \u{1} and é ✓"
        );
        assert_eq!(attrs[1]["value"]["intValue"], "-1234567890123");
        assert_eq!(attrs[2]["value"]["intValue"], i64::MIN.to_string());
        assert_eq!(
            attrs[3]["value"]["arrayValue"]["values"][0]["stringValue"],
            "stop"
        );
        assert_eq!(v["events"][0]["timeUnixNano"], i64::MAX.to_string());
        assert_eq!(v["events"][0]["attributes"][0]["value"]["stringValue"], "x");
        assert_eq!(v["status"]["code"], 2);
    }
}
