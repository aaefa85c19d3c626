//! PostgreSQL's tables of state shared by replicas (`migrations/postgres/0010_*`): requests
//! held for a human and the replicas' heartbeats. Read and written by `crate::replicas`
//! and `crate::intervene::pause`, never on the proxied request path.

use sqlx::PgPool;

use crate::store::now_ms;

/// The channel a decision on another replica's held request is announced on.
pub(crate) const PENDING_CHANNEL: &str = "loopwarden_pending";

pub(crate) async fn hold(
    pool: &PgPool,
    replica: &str,
    id: &str,
    conversation: &str,
    info: &str,
) -> Result<(), sqlx::Error> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO pending_requests (id, replica, conversation_id, info, created_ms, state,
           updated_ms) VALUES ($1, $2, $3, $4, $5, 'held', $5)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(id)
    .bind(replica)
    .bind(conversation)
    .bind(info)
    .bind(now)
    .execute(pool)
    .await?;
    Ok(())
}

pub(crate) async fn release(pool: &PgPool, id: &str) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM pending_requests WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// The other replicas' held requests (their JSON), oldest first.
pub(crate) async fn held_elsewhere(
    pool: &PgPool,
    replica: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT info FROM pending_requests WHERE state = 'held' AND replica <> $1
         ORDER BY created_ms, id",
    )
    .bind(replica)
    .fetch_all(pool)
    .await
}

/// Records a verdict on a held request and wakes its replica; its JSON, or `None` when no
/// request is held under that id.
pub(crate) async fn decide(
    pool: &PgPool,
    id: &str,
    verdict: &str,
) -> Result<Option<String>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let info: Option<String> = sqlx::query_scalar(
        "UPDATE pending_requests SET state = 'decided', verdict = $2, updated_ms = $3
         WHERE id = $1 AND state = 'held' RETURNING info",
    )
    .bind(id)
    .bind(verdict)
    .bind(now_ms())
    .fetch_optional(&mut *tx)
    .await?;
    if info.is_some() {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(PENDING_CHANNEL)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(info)
}

/// The verdicts other replicas recorded on this replica's held requests, `(id, verdict)`;
/// each is taken once.
pub(crate) async fn take_verdicts(
    pool: &PgPool,
    replica: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    sqlx::query_as(
        "DELETE FROM pending_requests WHERE replica = $1 AND state = 'decided'
         RETURNING id, coalesce(verdict, '')",
    )
    .bind(replica)
    .fetch_all(pool)
    .await
}

/// Says this replica is alive, and marks abandoned the held requests of replicas silent
/// for `silent_ms`.
pub(crate) async fn heartbeat(
    pool: &PgPool,
    replica: &str,
    silent_ms: i64,
) -> Result<u64, sqlx::Error> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO replicas (id, seen_ms) VALUES ($1, $2)
         ON CONFLICT (id) DO UPDATE SET seen_ms = excluded.seen_ms",
    )
    .bind(replica)
    .bind(now)
    .execute(pool)
    .await?;
    let abandoned = sqlx::query(
        "UPDATE pending_requests p SET state = 'abandoned', updated_ms = $1
         WHERE state IN ('held', 'decided') AND NOT EXISTS
           (SELECT 1 FROM replicas r WHERE r.id = p.replica AND r.seen_ms >= $2)",
    )
    .bind(now)
    .bind(now - silent_ms)
    .execute(pool)
    .await?;
    Ok(abandoned.rows_affected())
}

/// Withdraws this replica's listed requests that it no longer holds (their client went
/// away while they were being listed, so the withdrawal came first).
pub(crate) async fn withdraw_gone(
    pool: &PgPool,
    replica: &str,
    held: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM pending_requests WHERE replica = $1 AND state = 'held' AND id <> ALL($2)",
    )
    .bind(replica)
    .bind(held)
    .execute(pool)
    .await?;
    Ok(())
}
