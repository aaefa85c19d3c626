//! Prometheus metrics (`GET /metrics`, routed in `crate::proxy::operator::own`).
//!
//! What a request adds is counted once, when its log entry is handed over
//! ([`Metrics::request`], from the same `Finished` the log gets): its API and status, the
//! proxy's overhead, the upstream's time to first byte and total time, its decision, its
//! tokens and cost. Interventions are counted where their rows are made
//! ([`Metrics::intervention`]), alerts where they are sent. Every one of these is an atomic
//! add: counters behind a label set are found under a read lock (the `Family` map's, shared,
//! taken for write only the first time a label set appears), and the histograms here are
//! atomic buckets (prometheus-client's own histogram takes a mutex per observation). What
//! is a state rather than an event (live conversations, held requests, the log's queue,
//! the reloads) is read when scraped, at no cost to requests.
//!
//! Names follow Prometheus' conventions: `loopwarden_` prefix, base units (seconds,
//! dollars), `_total` for counters (added by the encoder), `_seconds` for durations.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use crate::store::{Label, RequestRow};

/// The content type of the exposition (OpenMetrics text, which Prometheus reads).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A request, by the API it spoke (`requests.dialect`, `other` for the rest) and the status
/// it was answered with.
///
/// The label sets a request adds to hold the row's own [`Label`]s (static names, or the
/// policy's shared name): a set is made for each look-up, several per request, and so
/// costs no allocation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    api: Label,
    status: u16,
}

/// A decision other than `observe` (a `decisions` row): what the engine decided, what was
/// done about it, under which policy.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    action: &'static str,
    applied: Label,
    policy: Label,
}

/// An `interventions` row.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InterventionLabels {
    action: String,
    applied: String,
    detector: String,
    policy: String,
}

/// Tokens by how they are billed (`crate::budget::Usage`'s four counts).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    policy: Label,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: Label,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AlertLabels {
    event: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The counters and histograms requests add to. Shared by every serving thread.
#[derive(Default)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    overhead: Histogram,
    upstream_first_byte: Histogram,
    upstream_total: Histogram,
    decisions: Family<DecisionLabels, Counter>,
    interventions: Family<InterventionLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    cost: Family<PolicyLabel, Counter<f64, AtomicU64>>,
    alerts: Family<AlertLabels, Counter>,
}

/// What is read when scraped: states, and counters kept elsewhere.
pub struct Snapshot {
    pub live_conversations: u64,
    pub held_requests: u64,
    pub log_queue_depth: u64,
    pub log: crate::store::StoreHealth,
    /// Config reloads by outcome (`applied`, `rejected`: `crate::reload`).
    pub reloads: [(&'static str, u64); 2],
}

impl Metrics {
    /// Counts a finished request (called as its log entry is handed over, so that the
    /// counters say what the log says). `decision`: the action of the `decisions` row it
    /// logs, if any.
    pub fn request(&self, row: &RequestRow, decision: Option<&'static str>) {
        let api = row.dialect.clone().unwrap_or_else(|| Label::from("other"));
        self.requests
            .get_or_create(&RequestLabels {
                api,
                status: u16::try_from(row.status).unwrap_or(0),
            })
            .inc();
        self.overhead.observe_us(row.proxy_overhead_us);
        if let Some(us) = row.upstream_latency_us {
            self.upstream_first_byte.observe_us(us);
        }
        if let Some(us) = row.upstream_total_us {
            self.upstream_total.observe_us(us);
        }
        let policy = row
            .policy
            .clone()
            .unwrap_or_else(|| Label::from(crate::names::DEFAULT_POLICY));
        if let Some(action) = decision {
            self.decisions
                .get_or_create(&DecisionLabels {
                    action,
                    applied: row.applied.clone(),
                    policy: policy.clone(),
                })
                .inc();
        }
        let counts = [
            ("input", row.input_tokens),
            ("cached_input", row.cached_input_tokens),
            ("cache_write", row.cache_write_tokens),
            ("output", row.output_tokens),
        ];
        for (kind, n) in counts {
            if let Some(n) = n.filter(|&n| n > 0) {
                self.tokens
                    .get_or_create(&TokenLabels {
                        policy: policy.clone(),
                        kind,
                    })
                    .inc_by(n as u64);
            }
        }
        if let Some(dollars) = row.cost_usd.filter(|d| *d > 0.0) {
            self.cost
                .get_or_create(&PolicyLabel { policy })
                .inc_by(dollars);
        }
    }

    /// Counts an intervention (an `interventions` row).
    pub fn intervention(&self, action: &str, applied: &str, detector: &str, policy: Option<&str>) {
        self.interventions
            .get_or_create(&InterventionLabels {
                action: action.to_string(),
                applied: applied.to_string(),
                detector: detector.to_string(),
                policy: policy.unwrap_or("").to_string(),
            })
            .inc();
    }

    /// Counts an alert webhook's delivery (`crate::alerts`).
    pub fn alert(&self, event: &'static str, delivered: bool) {
        let result = if delivered { "sent" } else { "failed" };
        self.alerts
            .get_or_create(&AlertLabels { event, result })
            .inc();
    }

    /// The exposition: these metrics and `now`'s states, in OpenMetrics text.
    pub fn encode(&self, now: Snapshot) -> String {
        let mut r = Registry::with_prefix("loopwarden");
        r.register(
            "requests",
            "Requests answered, by API (openai_chat, openai_responses, anthropic, gemini, other) and status",
            self.requests.clone(),
        );
        r.register_with_unit(
            "proxy_overhead",
            "Time the proxy itself added to a request (its work, not the upstream's)",
            Unit::Seconds,
            self.overhead.clone(),
        );
        r.register_with_unit(
            "upstream_time_to_first_byte",
            "From sending a request upstream to the upstream's answer head",
            Unit::Seconds,
            self.upstream_first_byte.clone(),
        );
        r.register_with_unit(
            "upstream_duration",
            "From sending a request upstream to the answer's last byte",
            Unit::Seconds,
            self.upstream_total.clone(),
        );
        r.register(
            "decisions",
            "Decisions other than observe (rows of `decisions`), by action, what was applied and policy",
            self.decisions.clone(),
        );
        r.register(
            "interventions",
            "Interventions (rows of `interventions`), by action, what was applied, detector and policy",
            self.interventions.clone(),
        );
        r.register(
            "tokens",
            "Tokens of the answers, by policy and how they are billed (input, cached_input, cache_write, output)",
            self.tokens.clone(),
        );
        r.register_with_unit(
            "cost",
            "Cost of the answers at the configured prices, by policy",
            Unit::Other("usd".into()),
            self.cost.clone(),
        );
        r.register(
            "alerts",
            "Alert webhooks, by event and result (sent, failed)",
            self.alerts.clone(),
        );
        self.register_states(&mut r, now);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }

    fn register_states(&self, r: &mut Registry, now: Snapshot) {
        let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        r.register(
            "live_conversations",
            "Conversations whose state is held in memory (idle ones are dropped)",
            gauge(now.live_conversations),
        );
        r.register(
            "held_requests",
            "Requests held for a human's decision",
            gauge(now.held_requests),
        );
        r.register(
            "log_queue_depth",
            "Entries waiting for the log writer",
            gauge(now.log_queue_depth),
        );
        let fixed = |n: u64| {
            let c: Counter = Counter::default();
            c.inc_by(n);
            c
        };
        r.register(
            "log_dropped",
            "Log entries dropped because the log's queue was full",
            fixed(now.log.dropped),
        );
        r.register(
            "log_failed",
            "Log records lost because writing them failed",
            fixed(now.log.failed),
        );
        let reloads: Family<OutcomeLabel, Counter> = Family::default();
        for (outcome, n) in now.reloads {
            reloads.get_or_create(&OutcomeLabel { outcome }).inc_by(n);
        }
        r.register(
            "config_reloads",
            "Config reloads, by outcome (applied, rejected)",
            reloads,
        );
    }
}

impl EncodeLabelValue for Label {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        self.as_str().encode(encoder)
    }
}

/// Upper bounds of the duration buckets, in seconds: from 50 µs (the proxy's own work on
/// a small request) to 5 minutes (a long answer streamed).
const BUCKETS: [f64; 20] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A histogram of durations made of atomics only: an observation is two adds and a bucket
/// increment, never a lock. Clones share the counts.
#[derive(Clone, Default, Debug)]
pub struct Histogram {
    inner: std::sync::Arc<HistogramInner>,
}

#[derive(Default, Debug)]
struct HistogramInner {
    /// Observations per bucket (not cumulative), the last one past every bound (`+Inf`).
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records a duration given in microseconds (negative ones are not durations: ignored).
    pub fn observe_us(&self, us: i64) {
        let Ok(us) = u64::try_from(us) else {
            return;
        };
        let seconds = us as f64 / 1e6;
        let i = BUCKETS.partition_point(|&bound| bound < seconds);
        let h = &self.inner;
        h.buckets[i].fetch_add(1, Ordering::Relaxed);
        h.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &self.inner;
        let buckets: Vec<(f64, u64)> = BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(h.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        // The count is the buckets' sum, so that the two always agree in one scrape.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = h.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_falls_in_the_first_bucket_that_holds_it() {
        let h = Histogram::default();
        h.observe_us(50); // exactly the first bound: le="5e-05"
        h.observe_us(51);
        h.observe_us(400_000_000); // past every bound
        h.observe_us(-1);
        let b: Vec<u64> = h
            .inner
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!((b[0], b[1], b[BUCKETS.len()]), (1, 1, 1));
        assert_eq!(b.iter().sum::<u64>(), 3);
    }

    #[test]
    fn the_exposition_names_follow_the_conventions() {
        let m = Metrics::default();
        let mut row = RequestRow::sample(1);
        row.policy = Some("ci".into());
        row.input_tokens = Some(7);
        row.cost_usd = Some(0.5);
        row.upstream_latency_us = Some(2000);
        m.request(&row, Some("nudge"));
        let text = m.encode(Snapshot {
            live_conversations: 2,
            held_requests: 0,
            log_queue_depth: 0,
            log: crate::store::StoreHealth {
                written: 0,
                dropped: 3,
                failed: 0,
                retried: 0,
                reopened: 0,
                spilled: 0,
                queued: 0,
            },
            reloads: [("applied", 1), ("rejected", 0)],
        });
        for line in [
            "loopwarden_requests_total{api=\"anthropic\",status=\"200\"} 1",
            "loopwarden_tokens_total{policy=\"ci\",kind=\"input\"} 7",
            "loopwarden_cost_usd_total{policy=\"ci\"} 0.5",
            "loopwarden_upstream_time_to_first_byte_seconds_bucket{le=\"0.0025\"} 1",
            "loopwarden_upstream_time_to_first_byte_seconds_count 1",
            "loopwarden_live_conversations 2",
            "loopwarden_log_dropped_total 3",
            "loopwarden_config_reloads_total{outcome=\"applied\"} 1",
            "# TYPE loopwarden_proxy_overhead_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
