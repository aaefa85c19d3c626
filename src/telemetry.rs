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
//! Spans are built when a request's log record is handed over (`proxy::record`, off
//! the client's path: its answer has gone out) and queued; a task of its own sends them in
//! batches as OTLP/HTTP JSON to `{otlp_endpoint}/v1/traces`. A full queue drops spans
//! (counted), and an unreachable collector costs the proxy nothing but the counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
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

/// Where spans go: nowhere (off), or the exporter's queue.
pub struct Traces {
    queue: Option<mpsc::Sender<Value>>,
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
    /// `log_content`: the request's policy logs content, so the decision's reason may go
    /// out (masked).
    pub fn record(&self, row: &RequestRow, decision: Option<&Decision>, log_content: bool) {
        let Some(queue) = &self.queue else { return };
        for span in spans_of(row, decision, log_content) {
            if queue.try_send(span).is_err() {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The OTLP JSON spans of a finished request.
fn spans_of(row: &RequestRow, decision: Option<&Decision>, log_content: bool) -> Vec<Value> {
    let Some(dialect) = row.dialect.as_deref() else {
        return Vec::new();
    };
    let (operation, provider) = match dialect {
        "gemini" => ("generate_content", "gcp.gemini"),
        "anthropic" => ("chat", "anthropic"),
        _ => ("chat", "openai"),
    };
    let model = row.model.as_deref().unwrap_or("");
    let trace = hex_id(16);
    let call = hex_id(8);
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
        attributes.push(json!({"key": "gen_ai.response.finish_reasons",
            "value": {"arrayValue": {"values": [{"stringValue": reason}]}}}));
    }
    let failed = row.status >= 500
        || row.outcome.as_str() != "complete" && row.outcome.as_str() != "answered";
    let mut spans = vec![json!({
        "traceId": trace,
        "spanId": call,
        "name": format!("{operation} {model}").trim_end(),
        "kind": 3, // CLIENT
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": end.to_string(),
        "attributes": attributes,
        "status": {"code": if failed { 2 } else { 1 }},
    })];
    if let Some(decision) = decision.filter(|d| d.action != crate::detect::Action::Observe) {
        let result = row.applied.as_str();
        // A decision's reason quotes the agent's commands and files: content.
        let reason = match log_content {
            true => crate::store::Masked::from(decision.reason.as_str()).to_string(),
            false => decision.detector.clone(),
        };
        let at = start.to_string();
        spans.push(json!({
            "traceId": trace,
            "spanId": hex_id(8),
            "parentSpanId": call,
            "name": "apply_guardrail loopwarden",
            "kind": 1, // INTERNAL
            "startTimeUnixNano": at,
            "endTimeUnixNano": at,
            "attributes": [
                string("gen_ai.operation.name", "apply_guardrail"),
                string("gen_ai.guardian.name", "loopwarden"),
                string("gen_ai.security.target.type", "llm_input"),
                string("gen_ai.security.decision.type", decision_type(result)),
                string("gen_ai.security.decision.reason", &decision.detector),
                string("gen_ai.conversation.id", &row.conversation_id),
                string("loopwarden.policy", policy),
                string("loopwarden.action", decision.action.as_str()),
            ],
            "events": [{
                "timeUnixNano": at,
                "name": "gen_ai.guardrail.result",
                "attributes": [
                    string("gen_ai.guardrail.policy", policy),
                    string("gen_ai.guardrail.result", result),
                    string("gen_ai.guardrail.reason", &reason),
                ],
            }],
            "status": {"code": 1},
        }));
    }
    spans
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

fn string(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

fn int(key: &str, value: i64) -> Value {
    // OTLP JSON writes 64-bit integers as strings.
    json!({"key": key, "value": {"intValue": value.to_string()}})
}

/// A random id of `bytes` bytes, in the lowercase hex OTLP JSON writes ids in.
fn hex_id(bytes: usize) -> String {
    let mut id = String::with_capacity(bytes * 2);
    while id.len() < bytes * 2 {
        id.push_str(&format!("{:016x}", fastrand::u64(..)));
    }
    id.truncate(bytes * 2);
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
    async fn run(self, mut spans: mpsc::Receiver<Value>) {
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

    async fn send(&self, client: &reqwest::Client, spans: Vec<Value>) {
        if spans.is_empty() {
            return;
        }
        let n = spans.len() as u64;
        let body = json!({"resourceSpans": [{
            "resource": {"attributes": [string("service.name", &self.service)]},
            "scopeSpans": [{
                "scope": {"name": "loopwarden", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }]});
        let sent = client
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_string())
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
}
