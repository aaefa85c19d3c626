//! The dashboard's reads and its one write (a verdict on an alert), the same SQL for both
//! backends (as `super::read`: `$n` parameters, `FILTER` on aggregates, `IS NOT DISTINCT
//! FROM`, a filter's parameter cast to text so PostgreSQL knows its type). Types and
//! meanings: `crate::store::dashboard`. Each backend's `dashboard` module instantiates
//! [`dashboard_reads`] for its pool type.

/// The dashboard's functions, for a backend whose pool type is `$pool`.
macro_rules! dashboard_reads {
    ($pool:ty) => {
        use $crate::store::dashboard::{
            Alerts, ConversationFilter, HaltedRun, InterventionCount, ListedConversation,
            Precision, Recorded, Target, Totals, Verdict,
        };
        use $crate::store::read::SUMMARY_SELECT;

        /// Conversations matching `filter`, most recently active first. A filter left out is
        /// `NULL` and holds for every row.
        pub(crate) async fn conversations(
            pool: &$pool,
            filter: &ConversationFilter,
            limit: i64,
        ) -> Result<Vec<ListedConversation>, sqlx::Error> {
            let sql = format!(
                "SELECT * FROM (
                   SELECT s.*, c2.team,
                          (SELECT r.policy FROM requests r WHERE r.conversation_id = s.id
                           ORDER BY r.started_ms DESC LIMIT 1) AS policy
                   FROM ({SUMMARY_SELECT}) s JOIN conversations c2 ON c2.id = s.id)
                 AS listed
                 WHERE (CAST($1 AS TEXT) IS NULL OR policy = $1)
                   AND (CAST($2 AS TEXT) IS NULL OR team = $2)
                   AND (CAST($3 AS TEXT) IS NULL OR client = $3)
                   AND (CAST($4 AS TEXT) IS NULL OR model = $4)
                   AND (CAST($5 AS TEXT) IS NULL OR last_decision = $5)
                 ORDER BY last_seen_ms DESC LIMIT $6"
            );
            sqlx::query_as(&sql)
                .bind(&filter.policy)
                .bind(&filter.team)
                .bind(&filter.client)
                .bind(&filter.model)
                .bind(&filter.decision)
                .bind(limit)
                .fetch_all(pool)
                .await
        }

        /// The latest verdict on each judged alert.
        const LATEST_FEEDBACK: &str = "
            latest AS (
              SELECT f.* FROM feedback f
              WHERE f.id = (SELECT max(g.id) FROM feedback g
                            WHERE g.finding_id IS NOT DISTINCT FROM f.finding_id
                              AND g.intervention_id IS NOT DISTINCT FROM f.intervention_id))";

        /// The halts a human may have lifted: a policy's halt or block for a loop (a spent budget
        /// is no detector's alarm), and the resumes (by a human writing or an operator) after it:
        /// each resume lifts the latest such halt of its conversation before it.
        const LIFTED_HALTS: &str = "
            halts AS (
              SELECT id, conversation_id, created_ms, detector FROM interventions
              WHERE action IN ('halt', 'block') AND applied IN ('halted', 'blocked')
                AND source = 'policy' AND detector NOT IN ('', 'budget_cap')),
            lifted AS (
              SELECT DISTINCT
                (SELECT h.id FROM halts h
                 WHERE h.conversation_id = r.conversation_id AND h.created_ms <= r.created_ms
                 ORDER BY h.created_ms DESC, h.id DESC LIMIT 1) AS halt_id
              FROM interventions r WHERE r.action = 'resume')";

        /// A conversation's findings and interventions with their ids and verdicts.
        pub(crate) async fn alerts(pool: &$pool, id: &str) -> Result<Alerts, sqlx::Error> {
            let findings = sqlx::query_as(&format!(
                "WITH {LATEST_FEEDBACK}
                 SELECT f.id, f.request_id, f.conversation_id, f.created_ms, f.detector, f.confidence,
                        f.step, f.steps, f.summary, f.suggestion, l.verdict, l.note
                 FROM findings f LEFT JOIN latest l ON l.finding_id = f.id
                 WHERE f.conversation_id = $1 ORDER BY f.created_ms, f.id"
            ))
            .bind(id)
            .fetch_all(pool)
            .await?;
            let interventions = sqlx::query_as(&format!(
                "WITH {LATEST_FEEDBACK}, {LIFTED_HALTS}
                 SELECT i.id, i.conversation_id, i.request_id, i.created_ms, i.action, i.applied,
                        i.source, i.detector, i.reason, i.finding, i.policy, l.verdict, l.note,
                        EXISTS (SELECT 1 FROM lifted WHERE lifted.halt_id = i.id) AS resumed
                 FROM interventions i LEFT JOIN latest l ON l.intervention_id = i.id
                 WHERE i.conversation_id = $1 ORDER BY i.created_ms, i.id"
            ))
            .bind(id)
            .fetch_all(pool)
            .await?;
            Ok(Alerts {
                findings,
                interventions,
            })
        }

        /// Stores a verdict; `None` when the finding or intervention does not exist.
        pub(crate) async fn give_feedback(
            pool: &$pool,
            target: Target,
            verdict: Verdict,
            note: &str,
            now_ms: i64,
        ) -> Result<Option<Recorded>, sqlx::Error> {
            let (table, finding_id, intervention_id, id) = match target {
                Target::Finding(id) => ("findings", Some(id), None, id),
                Target::Intervention(id) => ("interventions", None, Some(id), id),
            };
            let judged: Option<(String, String)> = sqlx::query_as(&format!(
                "SELECT conversation_id, detector FROM {table} WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?;
            let Some((conversation_id, detector)) = judged else {
                return Ok(None);
            };
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO feedback (finding_id, intervention_id, conversation_id, detector, verdict,
                   note, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            )
            .bind(finding_id)
            .bind(intervention_id)
            .bind(&conversation_id)
            .bind(&detector)
            .bind(verdict.as_str())
            .bind(note)
            .bind(now_ms)
            .fetch_one(pool)
            .await?;
            Ok(Some(Recorded {
                id,
                conversation_id,
                detector,
                verdict,
            }))
        }

        /// Each detector's verdicts: the latest said on each alert, and `wrong` for each lifted
        /// halt nobody judged.
        pub(crate) async fn precision(
            pool: &$pool,
            team: Option<&str>,
        ) -> Result<Vec<Precision>, sqlx::Error> {
            let latest_in_team = $crate::store::dashboard_sql::in_team("latest.conversation_id", 1);
            let halt_in_team = $crate::store::dashboard_sql::in_team("h.conversation_id", 1);
            sqlx::query_as(&format!(
                "WITH {LATEST_FEEDBACK}, {LIFTED_HALTS},
                 votes AS (
                   SELECT detector, verdict, 0 AS implied FROM latest WHERE {latest_in_team}
                   UNION ALL
                   SELECT h.detector, 'wrong', 1 FROM halts h JOIN lifted ON lifted.halt_id = h.id
                   WHERE NOT EXISTS (SELECT 1 FROM feedback f WHERE f.intervention_id = h.id)
                     AND {halt_in_team})
                 SELECT CASE detector WHEN '' THEN '(operator)' ELSE detector END AS detector,
                        count(*) FILTER (WHERE verdict = 'right') AS right,
                        count(*) FILTER (WHERE verdict = 'wrong') AS wrong,
                        count(*) FILTER (WHERE implied = 1) AS implied_wrong
                 FROM votes GROUP BY 1 ORDER BY 1"
            ))
            .bind(team)
            .fetch_all(pool)
            .await
        }

        /// The policies' own interventions (not an operator's or a human's) since `since_ms`;
        /// a shadow policy's counted as what they were (`would_halt`...), not as halts.
        pub(crate) async fn intervention_counts(
            pool: &$pool,
            since_ms: i64,
            bucket_ms: i64,
            team: Option<&str>,
        ) -> Result<Vec<InterventionCount>, sqlx::Error> {
            let in_team = $crate::store::dashboard_sql::in_team("conversation_id", 3);
            sqlx::query_as(&format!(
                "SELECT (created_ms / $2) * $2 AS bucket_ms,
                        CASE detector WHEN '' THEN '(none)' ELSE detector END AS detector,
                        coalesce(policy, '(none)') AS policy,
                        CASE WHEN applied LIKE 'would%' THEN applied ELSE action END AS action,
                        count(*) AS count
                 FROM interventions
                 WHERE created_ms >= $1 AND source IN ('policy', 'timeout') AND applied <> 'forwarded'
                   AND {in_team}
                 GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
            ))
            .bind(since_ms)
            .bind(bucket_ms)
            .bind(team)
            .fetch_all(pool)
            .await
        }

        /// Each policy halt or block since `since_ms` (a loop's or a spent budget's) with the
        /// requests of its conversation before it, and the first resume after it.
        pub(crate) async fn halted_runs(
            pool: &$pool,
            since_ms: i64,
            team: Option<&str>,
        ) -> Result<Vec<HaltedRun>, sqlx::Error> {
            let in_team = $crate::store::dashboard_sql::in_team("h.conversation_id", 2);
            sqlx::query_as(&format!(
                "SELECT h.conversation_id, h.detector, h.created_ms AS halted_ms,
                        coalesce(min(r.started_ms), h.created_ms) AS first_ms,
                        coalesce(max(r.steps), 0) AS steps,
                        coalesce(sum(r.cost_usd), 0.0) AS cost_usd,
                        (SELECT min(x.created_ms) FROM interventions x
                         WHERE x.conversation_id = h.conversation_id AND x.action = 'resume'
                           AND x.created_ms >= h.created_ms) AS resumed_ms
                 FROM interventions h
                 LEFT JOIN requests r ON r.conversation_id = h.conversation_id
                                     AND r.started_ms <= h.created_ms
                 WHERE h.created_ms >= $1 AND h.source = 'policy'
                   AND h.applied IN ('halted', 'blocked') AND {in_team}
                 GROUP BY h.id ORDER BY h.created_ms"
            ))
            .bind(since_ms)
            .bind(team)
            .fetch_all(pool)
            .await
        }

        /// Requests and conversations, in all and since `since_ms` (requests by id: the rowid
        /// starts with the start time, `crate::store::next_request_id`).
        pub(crate) async fn totals(
            pool: &$pool,
            since_ms: i64,
            team: Option<&str>,
        ) -> Result<Totals, sqlx::Error> {
            let request_in_team = $crate::store::dashboard_sql::in_team("conversation_id", 2);
            let in_team = "(CAST($2 AS TEXT) IS NULL OR team = $2)";
            sqlx::query_as(&format!(
                "SELECT (SELECT count(*) FROM requests WHERE {request_in_team}) AS requests,
                        (SELECT count(*) FROM requests WHERE id >= ($1 << 20) AND {request_in_team})
                          AS requests_in_window,
                        (SELECT count(*) FROM conversations WHERE {in_team}) AS conversations,
                        (SELECT count(*) FROM conversations WHERE last_seen_ms >= $1 AND {in_team})
                          AS conversations_in_window"
            ))
            .bind(since_ms)
            .bind(team)
            .fetch_one(pool)
            .await
        }

        /// The team a conversation's requests named (`Some(None)`: none did); `None` when the
        /// log holds no such conversation.
        pub(crate) async fn conversation_team(
            pool: &$pool,
            id: &str,
        ) -> Result<Option<Option<String>>, sqlx::Error> {
            sqlx::query_scalar("SELECT team FROM conversations WHERE id = $1")
                .bind(id)
                .fetch_optional(pool)
                .await
        }

        /// The conversation a finding or an intervention belongs to.
        pub(crate) async fn alert_conversation(
            pool: &$pool,
            target: Target,
        ) -> Result<Option<String>, sqlx::Error> {
            let (table, id) = match target {
                Target::Finding(id) => ("findings", id),
                Target::Intervention(id) => ("interventions", id),
            };
            sqlx::query_scalar(&format!("SELECT conversation_id FROM {table} WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await
        }

        /// The ids of `team`'s conversations active since `since_ms`.
        pub(crate) async fn team_conversations(
            pool: &$pool,
            team: &str,
            since_ms: i64,
        ) -> Result<Vec<String>, sqlx::Error> {
            sqlx::query_scalar("SELECT id FROM conversations WHERE team = $1 AND last_seen_ms >= $2")
                .bind(team)
                .bind(since_ms)
                .fetch_all(pool)
                .await
        }
    };
}
pub(crate) use dashboard_reads;

/// SQL that holds when `column` (a conversation id) is one of the team's named by
/// parameter `$param`, or when that parameter is `NULL` (every team: the global view).
pub(crate) fn in_team(column: &str, param: u8) -> String {
    format!(
        "(CAST(${param} AS TEXT) IS NULL OR {column} IN \
         (SELECT id FROM conversations WHERE team = ${param}))"
    )
}
