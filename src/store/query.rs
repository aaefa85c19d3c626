//! What the admin API reads from the log: the conversation list, one conversation's
//! timeline, the proxy's overhead. The reads themselves are the backend's
//! ([`super::Store::conversations`] and the others); they never run on the proxied request
//! path.

use serde::Serialize;

use super::{DecisionRow, FindingRow, InterventionRow, RequestRow, ToolCallRow};

/// One line of the conversation list.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ConversationSummary {
    pub id: String,
    pub id_source: String,
    pub client: Option<String>,
    pub dialect: Option<String>,
    pub model: Option<String>,
    pub first_seen_ms: i64,
    pub last_seen_ms: i64,
    pub requests: i64,
    pub tool_calls: i64,
    pub findings: i64,
    /// Decisions other than observe.
    pub interventions: i64,
    /// The latest request's decision (`observe`, `nudge`, `halt`...), or under a shadow
    /// policy what it would have done (`would_nudge`, `would_halt`...): never a halt that
    /// did not happen.
    pub last_decision: Option<String>,
    /// Mean proxy overhead of the conversation's requests, microseconds.
    pub mean_proxy_overhead_us: Option<f64>,
}

/// Everything the log holds about one conversation, each list in time order.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub conversation: ConversationSummary,
    pub requests: Vec<RequestRow>,
    pub tool_calls: Vec<ToolCallRow>,
    pub findings: Vec<FindingRow>,
    pub decisions: Vec<DecisionRow>,
    /// What loopwarden did (nudges, halts, blocks, pauses, resumes), with who decided.
    pub interventions: Vec<InterventionRow>,
}

/// One conversation's spend summed from its logged answers (`migrations/0008_spend.sql`),
/// to put back in the ledger at start (`crate::budget::Ledger::restore`).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct LoggedSpend {
    pub conversation_id: String,
    /// Answers that stated their usage.
    pub requests: i64,
    /// The largest history a request carried.
    pub steps: Option<i64>,
    pub input_tokens: i64,
    pub cached_input_tokens: i64,
    pub cache_write_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
    /// Answers whose model had no price.
    pub unpriced: i64,
    pub first_ms: i64,
    pub last_ms: i64,
    /// The policy of its last request.
    pub policy: Option<String>,
}

/// The proxy's own overhead over the latest requests, for the admin API (issue 5: users
/// must be able to see what the proxy costs them in production).
#[derive(Debug, Clone, Serialize)]
pub struct OverheadStats {
    pub requests: usize,
    /// Of `proxy_overhead_us` (total minus waiting for the upstream).
    #[serde(flatten)]
    pub overhead: Quantiles,
    /// The request body's arrival, which the overhead includes: the client sending, long
    /// for a large body from a slow client whatever the proxy does.
    pub body_read: Quantiles,
    /// The overhead without the body's arrival: the proxy's own work (over the requests
    /// logged with `body_read_us`).
    pub after_body_read: Quantiles,
}

#[derive(Debug, Clone, Serialize)]
pub struct Quantiles {
    pub p50_us: Option<i64>,
    pub p99_us: Option<i64>,
    pub max_us: Option<i64>,
}

impl Quantiles {
    fn of(mut values: Vec<i64>) -> Quantiles {
        values.sort_unstable();
        let pick = |q: f64| -> Option<i64> {
            let last = values.len().checked_sub(1)?;
            values.get(((last as f64) * q).round() as usize).copied()
        };
        Quantiles {
            p50_us: pick(0.5),
            p99_us: pick(0.99),
            max_us: values.last().copied(),
        }
    }
}

impl OverheadStats {
    /// The figures of the latest requests' `(proxy_overhead_us, body_read_us)`.
    pub fn of(rows: &[(i64, Option<i64>)]) -> OverheadStats {
        let read: Vec<(i64, i64)> = rows
            .iter()
            .filter_map(|&(overhead, read)| Some((overhead, read?)))
            .collect();
        OverheadStats {
            requests: rows.len(),
            overhead: Quantiles::of(rows.iter().map(|&(overhead, _)| overhead).collect()),
            body_read: Quantiles::of(read.iter().map(|&(_, read)| read).collect()),
            after_body_read: Quantiles::of(
                read.iter()
                    .map(|&(overhead, read)| overhead.saturating_sub(read))
                    .collect(),
            ),
        }
    }
}
