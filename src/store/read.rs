//! The admin API's reads and the conversations' controls, the same SQL for both backends:
//! SQLite and PostgreSQL both take `$n` parameters (in the order they first appear), casts
//! they both know, and `FILTER` on aggregates. Each backend's `read` module instantiates
//! [`reads`] for its pool type.

pub(crate) const SUMMARY_SELECT: &str = "
    SELECT c.id, c.id_source, c.client, c.dialect, c.model, c.first_seen_ms, c.last_seen_ms,
           c.requests,
           (SELECT count(*) FROM tool_calls t WHERE t.conversation_id = c.id) AS tool_calls,
           (SELECT count(*) FROM findings f WHERE f.conversation_id = c.id) AS findings,
           (SELECT count(*) FROM decisions d WHERE d.conversation_id = c.id) AS interventions,
           (SELECT CASE WHEN r.applied LIKE 'would%' THEN r.applied ELSE r.decision END
            FROM requests r WHERE r.conversation_id = c.id
             ORDER BY r.started_ms DESC LIMIT 1) AS last_decision,
           CASE WHEN c.requests > 0
             THEN CAST(c.proxy_overhead_us_sum AS DOUBLE PRECISION) / c.requests END
             AS mean_proxy_overhead_us
    FROM conversations c";

/// The SQL of `overhead`. The latest requests by id, which increases in the order
/// requests start (`crate::store::next_request_id`): the id is the table's rowid, so SQLite
/// reads the last `$1` rows of its B-tree (PostgreSQL its primary key's index, backwards).
/// By `started_ms`, which has no index of its own, every call read and sorted the whole
/// table, and pulled it through the connection's page cache.
pub(crate) const OVERHEAD_SQL: &str =
    "SELECT proxy_overhead_us, body_read_us FROM requests ORDER BY id DESC LIMIT $1";

/// The SQL of `recent_spend`. The range is on the id, the table's rowid in SQLite (its
/// primary key in PostgreSQL), which starts with the request's start time
/// (`crate::store::next_request_id`): only the rows of the period are read, with no index on
/// `started_ms`.
pub(super) const RECENT_SPEND_SQL: &str = "SELECT conversation_id,
             count(*) AS requests,
             max(steps) AS steps,
             CAST(coalesce(sum(input_tokens), 0) AS BIGINT) AS input_tokens,
             CAST(coalesce(sum(cached_input_tokens), 0) AS BIGINT) AS cached_input_tokens,
             CAST(coalesce(sum(cache_write_tokens), 0) AS BIGINT) AS cache_write_tokens,
             CAST(coalesce(sum(output_tokens), 0) AS BIGINT) AS output_tokens,
             coalesce(sum(cost_usd), 0.0) AS cost_usd,
             count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced,
             min(started_ms) AS first_ms,
             max(started_ms) AS last_ms,
             (SELECT l.policy FROM requests l WHERE l.conversation_id = requests.conversation_id
              ORDER BY l.started_ms DESC, l.id DESC LIMIT 1) AS policy
      FROM requests
      WHERE id >= $1 AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL)
      GROUP BY conversation_id";

/// The read functions, for a backend whose pool type is `$pool`.
macro_rules! reads {
    ($pool:ty) => {
        use $crate::store::query::{ConversationSummary, LoggedSpend, OverheadStats, Timeline};
        use $crate::store::read::{RECENT_SPEND_SQL, SUMMARY_SELECT};

        /// Conversations, most recently active first.
        pub(crate) async fn conversations(
            pool: &$pool,
            limit: i64,
        ) -> Result<Vec<ConversationSummary>, sqlx::Error> {
            sqlx::query_as(&format!(
                "{SUMMARY_SELECT} ORDER BY c.last_seen_ms DESC LIMIT $1"
            ))
            .bind(limit)
            .fetch_all(pool)
            .await
        }

        /// Whether a conversation has a row.
        pub(crate) async fn has_conversation(pool: &$pool, id: &str) -> Result<bool, sqlx::Error> {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM conversations WHERE id = $1)")
                .bind(id)
                .fetch_one(pool)
                .await
        }

        /// One conversation's timeline, or `None` when the id is unknown.
        pub(crate) async fn timeline(pool: &$pool, id: &str) -> Result<Option<Timeline>, sqlx::Error> {
            let Some(conversation) =
                sqlx::query_as::<_, ConversationSummary>(&format!("{SUMMARY_SELECT} WHERE c.id = $1"))
                    .bind(id)
                    .fetch_optional(pool)
                    .await?
            else {
                return Ok(None);
            };
            let requests =
                sqlx::query_as("SELECT * FROM requests WHERE conversation_id = $1 ORDER BY started_ms, id")
                    .bind(id)
                    .fetch_all(pool)
                    .await?;
            let tool_calls = sqlx::query_as(
                "SELECT * FROM tool_calls WHERE conversation_id = $1 ORDER BY step, call_index",
            )
            .bind(id)
            .fetch_all(pool)
            .await?;
            let findings = sqlx::query_as(
                "SELECT request_id, conversation_id, created_ms, detector, confidence, step, steps,
                        summary, suggestion
                 FROM findings WHERE conversation_id = $1 ORDER BY created_ms, id",
            )
            .bind(id)
            .fetch_all(pool)
            .await?;
            let decisions = sqlx::query_as(
                "SELECT * FROM decisions WHERE conversation_id = $1 ORDER BY created_ms, request_id",
            )
            .bind(id)
            .fetch_all(pool)
            .await?;
            let interventions = sqlx::query_as(
                "SELECT conversation_id, request_id, created_ms, action, applied, source, detector,
                        reason, finding, policy
                 FROM interventions WHERE conversation_id = $1 ORDER BY created_ms, id",
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


        /// The proxy's own overhead over the `last` requests logged.
        pub(crate) async fn overhead(pool: &$pool, last: i64) -> Result<OverheadStats, sqlx::Error> {
            let rows: Vec<(i64, Option<i64>)> = sqlx::query_as($crate::store::read::OVERHEAD_SQL)
                .bind(last)
                .fetch_all(pool)
                .await?;
            Ok(OverheadStats::of(&rows))
        }

        /// The spend of each conversation answered since `since_ms`, summed from its requests'
        /// usage.
        pub(crate) async fn recent_spend(
            pool: &$pool,
            since_ms: i64,
        ) -> Result<Vec<LoggedSpend>, sqlx::Error> {
            sqlx::query_as(RECENT_SPEND_SQL)
            .bind(since_ms << 20)
            .fetch_all(pool)
            .await
        }

        /// Every conversation's stored control (one row per conversation ever halted).
        pub(crate) async fn controls(pool: &$pool) -> Result<Vec<$crate::store::Control>, sqlx::Error> {
            sqlx::query_as("SELECT * FROM conversation_controls")
                .fetch_all(pool)
                .await
        }

        /// The controls stored (or changed) since `since_ms`.
        pub(crate) async fn controls_since(
            pool: &$pool,
            since_ms: i64,
        ) -> Result<Vec<$crate::store::Control>, sqlx::Error> {
            sqlx::query_as("SELECT * FROM conversation_controls WHERE updated_ms >= $1")
                .bind(since_ms)
                .fetch_all(pool)
                .await
        }

        /// Stores a control, unless a newer one of the conversation is stored already: of
        /// two replicas' changes to one conversation, the newer stays.
        pub(crate) async fn save_control(
            pool: &$pool,
            c: &$crate::store::Control,
        ) -> Result<(), sqlx::Error> {
            sqlx::query(
                "INSERT INTO conversation_controls (conversation_id, halted, reason, source,
                   humans_at_halt, resume_pending, resumed_at, updated_ms, run_steps, run_digest)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT(conversation_id) DO UPDATE SET halted = excluded.halted,
                   reason = excluded.reason, source = excluded.source,
                   humans_at_halt = excluded.humans_at_halt,
                   resume_pending = excluded.resume_pending, resumed_at = excluded.resumed_at,
                   updated_ms = excluded.updated_ms, run_steps = excluded.run_steps,
                   run_digest = excluded.run_digest
                 WHERE excluded.updated_ms >= conversation_controls.updated_ms",
            )
            .bind(&c.conversation_id)
            .bind(c.halted)
            .bind(c.reason.as_str())
            .bind(&c.source)
            .bind(c.humans_at_halt)
            .bind(c.resume_pending)
            .bind(&c.resumed_at)
            .bind(c.updated_ms)
            .bind(c.run_steps)
            .bind(&c.run_digest)
            .execute(pool)
            .await?;
            Ok(())
        }
    };
}

pub(super) use reads;
