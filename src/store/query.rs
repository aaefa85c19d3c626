//! Reads for the admin API. These run on the pool's reader connections (WAL lets them run
//! beside the writer) and never on the proxied request path.

use serde::Serialize;
use sqlx::SqlitePool;

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
    /// The latest request's decision.
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

const SUMMARY_SELECT: &str = "
    SELECT c.id, c.id_source, c.client, c.dialect, c.model, c.first_seen_ms, c.last_seen_ms,
           c.requests,
           (SELECT count(*) FROM tool_calls t WHERE t.conversation_id = c.id) AS tool_calls,
           (SELECT count(*) FROM findings f WHERE f.conversation_id = c.id) AS findings,
           (SELECT count(*) FROM decisions d WHERE d.conversation_id = c.id) AS interventions,
           (SELECT r.decision FROM requests r WHERE r.conversation_id = c.id
             ORDER BY r.started_ms DESC LIMIT 1) AS last_decision,
           CASE WHEN c.requests > 0
             THEN CAST(c.proxy_overhead_us_sum AS REAL) / c.requests END
             AS mean_proxy_overhead_us
    FROM conversations c";

/// Conversations, most recently active first.
pub async fn conversations(
    pool: &SqlitePool,
    limit: i64,
) -> Result<Vec<ConversationSummary>, sqlx::Error> {
    sqlx::query_as(&format!(
        "{SUMMARY_SELECT} ORDER BY c.last_seen_ms DESC LIMIT ?1"
    ))
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// One conversation's timeline, or `None` when the id is unknown.
pub async fn timeline(pool: &SqlitePool, id: &str) -> Result<Option<Timeline>, sqlx::Error> {
    let Some(conversation) =
        sqlx::query_as::<_, ConversationSummary>(&format!("{SUMMARY_SELECT} WHERE c.id = ?1"))
            .bind(id)
            .fetch_optional(pool)
            .await?
    else {
        return Ok(None);
    };
    let requests =
        sqlx::query_as("SELECT * FROM requests WHERE conversation_id = ?1 ORDER BY started_ms, id")
            .bind(id)
            .fetch_all(pool)
            .await?;
    let tool_calls = sqlx::query_as(
        "SELECT * FROM tool_calls WHERE conversation_id = ?1 ORDER BY step, call_index",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let findings = sqlx::query_as(
        "SELECT request_id, conversation_id, created_ms, detector, confidence, step, steps,
                summary, suggestion
         FROM findings WHERE conversation_id = ?1 ORDER BY created_ms, id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let decisions = sqlx::query_as(
        "SELECT * FROM decisions WHERE conversation_id = ?1 ORDER BY created_ms, request_id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    let interventions = sqlx::query_as(
        "SELECT conversation_id, request_id, created_ms, action, applied, source, detector,
                reason, finding
         FROM interventions WHERE conversation_id = ?1 ORDER BY created_ms, id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(Some(Timeline {
        conversation,
        requests,
        tool_calls,
        findings,
        decisions,
        interventions,
    }))
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

/// The SQL of [`overhead`]. The latest requests by id, which increases in the order
/// requests start (`super::next_request_id`): the id is the table's rowid, so SQLite reads
/// the last `?1` rows of its B-tree. By `started_ms`, which has no index of its own, every
/// call read and sorted the whole table, and pulled it through the connection's page cache.
pub(super) const OVERHEAD_SQL: &str =
    "SELECT proxy_overhead_us, body_read_us FROM requests ORDER BY id DESC LIMIT ?1";

/// The proxy's own overhead over the `last` requests logged.
pub async fn overhead(pool: &SqlitePool, last: i64) -> Result<OverheadStats, sqlx::Error> {
    let rows: Vec<(i64, Option<i64>)> = sqlx::query_as(OVERHEAD_SQL)
        .bind(last)
        .fetch_all(pool)
        .await?;
    let read: Vec<(i64, i64)> = rows
        .iter()
        .filter_map(|&(overhead, read)| Some((overhead, read?)))
        .collect();
    Ok(OverheadStats {
        requests: rows.len(),
        overhead: Quantiles::of(rows.iter().map(|&(overhead, _)| overhead).collect()),
        body_read: Quantiles::of(read.iter().map(|&(_, read)| read).collect()),
        after_body_read: Quantiles::of(
            read.iter()
                .map(|&(overhead, read)| overhead.saturating_sub(read))
                .collect(),
        ),
    })
}
