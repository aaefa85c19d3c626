//! The PostgreSQL batch writer: runs on the log's writer thread (`crate::store::writer`),
//! which owns the queue, the batching, the counters and the retry policy; this file only
//! writes a batch, as one transaction of multi-row INSERTs (upserts where SQLite upserts),
//! on a connection of its own.
//!
//! The thread drives sqlx on a small runtime of its own, so that the log never takes a
//! worker of the proxy's runtime, and keeps writing (or giving up) while that runtime
//! shuts down. A database that is slow, full or unreachable fails the write within
//! [`WRITE_TIMEOUT`]: its records are kept and retried by the writer's policy
//! (`store.retry_rows`), while the request path keeps queueing or, the queue full,
//! dropping and counting. The connection is then made again on the next attempt
//! (counted as `reopened`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::query_builder::Separated;
use sqlx::{Connection, PgConnection, Postgres, QueryBuilder};

use crate::store::batch::{Batch, CallUpdates, Sightings};
use crate::store::runs::{self as store_runs, RunRecord};
use crate::store::writer::{self, Failure, Queue, Unwritten};
use crate::store::{
    ContentRow, Counters, DecisionRow, FindingRow, InterventionRow, Record, RequestRow,
};

/// A write (connecting included) that takes longer fails, and is retried.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows per INSERT: PostgreSQL binds at most 65,535 parameters per statement (the
/// requests' 29 columns allow 2,259 rows).
const ROWS_PER_INSERT: usize = 1000;

/// The writer thread's body.
pub(in crate::store) fn run(connect: PgConnectOptions, queue: &Queue) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            // The thread ends; the queue closes behind it, and entries are dropped, counted.
            tracing::error!(error = %e, "cannot start the log writer's runtime: nothing will be logged");
            return;
        }
    };
    let mut link = Link {
        connect,
        conn: None,
        lost: false,
    };
    let counters = &queue.counters;
    let mut unwritten = Unwritten::default();
    // PostgreSQL has no file to replace: `Failure::Reopen` never comes, so this returns
    // only once the queue is closed and written (or given up on).
    writer::run(queue, &mut unwritten, &mut |records| {
        runtime.block_on(link.write(records, counters))
    });
    if let Some(conn) = link.conn.take() {
        let _ = runtime.block_on(conn.close());
    }
}

/// The writer's connection, made when needed.
struct Link {
    connect: PgConnectOptions,
    conn: Option<PgConnection>,
    /// A connection was lost: the next one made is a reconnection.
    lost: bool,
}

impl Link {
    async fn write(&mut self, records: &[Record], counters: &Counters) -> Result<(), Failure> {
        let result = tokio::time::timeout(WRITE_TIMEOUT, self.try_write(records, counters))
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Transient(anyhow::anyhow!(
                    "PostgreSQL did not answer within {WRITE_TIMEOUT:?}"
                )))
            });
        if let Err(Failure::Transient(_)) = result {
            // Whatever went wrong, a new connection is the surest way on.
            self.conn = None;
            self.lost = true;
        }
        result
    }

    async fn try_write(&mut self, records: &[Record], counters: &Counters) -> Result<(), Failure> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => {
                let conn = PgConnection::connect_with(&self.connect)
                    .await
                    .map_err(failure)?;
                if std::mem::take(&mut self.lost) {
                    counters.reopened.fetch_add(1, Ordering::Relaxed);
                    tracing::info!("log writer connected to PostgreSQL again");
                }
                self.conn.insert(conn)
            }
        };
        write_batch(conn, records).await.map_err(failure)
    }
}

/// Whether a failed write may succeed if tried again: the server unreachable, restarting,
/// out of resources (a full disk), or the transaction rolled back by a conflict. Anything
/// else (a missing table, a bad value) would fail the same way.
fn failure(e: sqlx::Error) -> Failure {
    let transient = match &e {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            ["08", "40", "53", "57", "58"]
                .iter()
                .any(|class| code.starts_with(class))
                || code == "55P03"
        }),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    if transient {
        Failure::Transient(e.into())
    } else {
        Failure::Permanent(e.into())
    }
}

async fn write_batch(conn: &mut PgConnection, records: &[Record]) -> Result<(), sqlx::Error> {
    let batch = Batch::of(records);
    let mut decisions = Vec::new();
    let mut interventions = Vec::new();
    let mut heads = Vec::new();
    let mut steps = Vec::new();
    let mut runs = Vec::new();
    for record in &batch.others {
        match record {
            Record::Decision(d) => decisions.push(&**d),
            Record::Intervention(i) => interventions.push(&**i),
            Record::Content(c) if c.step.is_none() => heads.push(&**c),
            Record::Content(c) => steps.push(&**c),
            Record::Run(r) => runs.push(&**r),
            _ => {}
        }
    }
    let mut tx = conn.begin().await?;
    insert(&mut tx, &REQUESTS, &batch.requests, bind_request).await?;
    insert(&mut tx, &FINDINGS, &batch.findings, bind_finding).await?;
    insert(&mut tx, &CONVERSATIONS, &batch.sightings, bind_sightings).await?;
    insert(&mut tx, &TOOL_CALLS, &batch.calls, bind_call).await?;
    insert(&mut tx, &DECISIONS, &decisions, bind_decision).await?;
    insert(&mut tx, &INTERVENTIONS, &interventions, bind_intervention).await?;
    insert(&mut tx, &HEAD_CONTENT, &heads, bind_head).await?;
    insert(&mut tx, &STEP_CONTENT, &steps, bind_step).await?;
    for run in &runs {
        write_run(&mut tx, run).await?;
    }
    if !runs.is_empty() {
        let cutoff = crate::store::now_ms() - store_runs::KEEP_MS;
        for sql in store_runs::EXPIRE {
            sqlx::query(sql).bind(cutoff).execute(&mut *tx).await?;
        }
    }
    tx.commit().await
}

/// A table's multi-row insert: `INSERT INTO table (columns) VALUES ... conflict`.
struct Insert {
    table: &'static str,
    columns: &'static str,
    /// What a row whose key is in already does (empty: a plain insert).
    conflict: &'static str,
}

type Values<'q, 'r> = Separated<'q, 'r, Postgres, &'static str>;

/// Inserts `rows` in statements of up to [`ROWS_PER_INSERT`] rows. No two rows of one
/// statement share a key ([`Batch`]): PostgreSQL refuses to upsert a row twice in one.
async fn insert<'r, T>(
    conn: &mut PgConnection,
    sql: &Insert,
    rows: &'r [T],
    mut bind: impl FnMut(&mut Values<'_, 'r>, &'r T),
) -> Result<(), sqlx::Error> {
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut q =
            QueryBuilder::<Postgres>::new(format!("INSERT INTO {} ({}) ", sql.table, sql.columns));
        q.push_values(chunk, |mut values, row| bind(&mut values, row));
        q.push(" ");
        q.push(sql.conflict);
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// A row whose id is in replaces it, as SQLite's `INSERT OR REPLACE`.
const REQUESTS: Insert = Insert {
    table: "requests",
    columns: "id, conversation_id, started_ms, method, path, upstream, dialect, model,
        stream, parse, parse_error, steps, decision, applied, status, outcome,
        request_bytes, response_bytes, upstream_latency_us, upstream_total_us,
        proxy_overhead_us, body_read_us, input_tokens, output_tokens, stop_reason,
        cached_input_tokens, cache_write_tokens, cost_usd, policy, compaction, stated_id",
    conflict: "ON CONFLICT (id) DO UPDATE SET conversation_id = excluded.conversation_id,
        started_ms = excluded.started_ms, method = excluded.method, path = excluded.path,
        upstream = excluded.upstream, dialect = excluded.dialect, model = excluded.model,
        stream = excluded.stream, parse = excluded.parse, parse_error = excluded.parse_error,
        steps = excluded.steps, decision = excluded.decision, applied = excluded.applied,
        status = excluded.status, outcome = excluded.outcome,
        request_bytes = excluded.request_bytes, response_bytes = excluded.response_bytes,
        upstream_latency_us = excluded.upstream_latency_us,
        upstream_total_us = excluded.upstream_total_us,
        proxy_overhead_us = excluded.proxy_overhead_us, body_read_us = excluded.body_read_us,
        input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
        stop_reason = excluded.stop_reason, cached_input_tokens = excluded.cached_input_tokens,
        cache_write_tokens = excluded.cache_write_tokens, cost_usd = excluded.cost_usd,
        policy = excluded.policy, compaction = excluded.compaction,
        stated_id = excluded.stated_id",
};

fn bind_request<'r>(v: &mut Values<'_, 'r>, r: &'r &RequestRow) {
    v.push_bind(r.id)
        .push_bind(r.conversation_id.as_str())
        .push_bind(r.started_ms)
        .push_bind(r.method.as_str())
        .push_bind(r.path.as_str())
        .push_bind(r.upstream.as_str())
        .push_bind(r.dialect.as_deref())
        .push_bind(r.model.as_deref())
        .push_bind(r.stream)
        .push_bind(r.parse.as_str())
        .push_bind(r.parse_error.as_deref())
        .push_bind(r.steps)
        .push_bind(r.decision.as_deref())
        .push_bind(r.applied.as_str())
        .push_bind(r.status)
        .push_bind(r.outcome.as_str())
        .push_bind(r.request_bytes)
        .push_bind(r.response_bytes)
        .push_bind(r.upstream_latency_us)
        .push_bind(r.upstream_total_us)
        .push_bind(r.proxy_overhead_us)
        .push_bind(r.body_read_us)
        .push_bind(r.input_tokens)
        .push_bind(r.output_tokens)
        .push_bind(r.stop_reason.as_deref())
        .push_bind(r.cached_input_tokens)
        .push_bind(r.cache_write_tokens)
        .push_bind(r.cost_usd)
        .push_bind(r.policy.as_deref())
        .push_bind(r.compaction.as_deref())
        .push_bind(r.stated_id.as_deref());
}

/// Ids (an identity column) follow the rows' order.
const FINDINGS: Insert = Insert {
    table: "findings",
    columns: "request_id, conversation_id, created_ms, detector, confidence, step, steps,
        summary, suggestion",
    conflict: "",
};

fn bind_finding<'r>(v: &mut Values<'_, 'r>, f: &'r &FindingRow) {
    v.push_bind(f.request_id)
        .push_bind(f.conversation_id.as_str())
        .push_bind(f.created_ms)
        .push_bind(f.detector.as_str())
        .push_bind(f.confidence)
        .push_bind(f.step)
        .push_bind(f.steps.as_str())
        .push_bind(f.summary.as_str())
        .push_bind(f.suggestion.as_str());
}

/// As SQLite's upsert (`super::super::sqlite::write`): counts and sums add up, the first
/// client stays, the latest dialect and model win.
const CONVERSATIONS: Insert = Insert {
    table: "conversations",
    columns: "id, id_source, client, dialect, model, first_seen_ms, last_seen_ms, requests,
        proxy_overhead_us_sum, team",
    conflict: "ON CONFLICT (id) DO UPDATE SET
        last_seen_ms = greatest(conversations.last_seen_ms, excluded.last_seen_ms),
        requests = conversations.requests + excluded.requests,
        proxy_overhead_us_sum = conversations.proxy_overhead_us_sum + excluded.proxy_overhead_us_sum,
        client = coalesce(conversations.client, excluded.client),
        dialect = coalesce(excluded.dialect, conversations.dialect),
        model = coalesce(excluded.model, conversations.model),
        team = coalesce(conversations.team, excluded.team)",
};

fn bind_sightings<'r>(v: &mut Values<'_, 'r>, s: &'r Sightings<'_>) {
    v.push_bind(s.first.id.as_str())
        .push_bind(s.first.id_source.as_str())
        .push_bind(s.client)
        .push_bind(s.dialect)
        .push_bind(s.model)
        .push_bind(s.first.at_ms)
        .push_bind(s.last_ms)
        .push_bind(s.requests)
        .push_bind(s.overhead_us)
        .push_bind(s.team);
}

/// A result, once known, is never erased by a later sighting without one.
const TOOL_CALLS: Insert = Insert {
    table: "tool_calls",
    columns: "conversation_id, step, call_index, call_id, name, args_hash, summary,
        result_hash, result_summary, is_error, request_id, seen_ms",
    conflict: "ON CONFLICT (conversation_id, step, call_index) DO UPDATE SET
        call_id = excluded.call_id, name = excluded.name, args_hash = excluded.args_hash,
        summary = excluded.summary,
        result_hash = coalesce(excluded.result_hash, tool_calls.result_hash),
        result_summary = coalesce(excluded.result_summary, tool_calls.result_summary),
        is_error = coalesce(excluded.is_error, tool_calls.is_error),
        request_id = excluded.request_id, seen_ms = excluded.seen_ms",
};

fn bind_call<'r>(v: &mut Values<'_, 'r>, c: &'r CallUpdates<'_>) {
    let t = c.last;
    v.push_bind(t.conversation_id.as_str())
        .push_bind(t.step)
        .push_bind(t.call_index)
        .push_bind(t.call_id.as_str())
        .push_bind(t.name.as_str())
        .push_bind(t.args_hash.as_str())
        .push_bind(t.summary.as_str())
        .push_bind(c.result_hash)
        .push_bind(c.result_summary)
        .push_bind(c.is_error)
        .push_bind(t.request_id)
        .push_bind(t.seen_ms);
}

const DECISIONS: Insert = Insert {
    table: "decisions",
    columns: "request_id, conversation_id, created_ms, action, applied, step, reason, policy",
    conflict: "ON CONFLICT (request_id) DO UPDATE SET conversation_id = excluded.conversation_id,
        created_ms = excluded.created_ms, action = excluded.action, applied = excluded.applied,
        step = excluded.step, reason = excluded.reason, policy = excluded.policy",
};

fn bind_decision<'r>(v: &mut Values<'_, 'r>, d: &'r &DecisionRow) {
    v.push_bind(d.request_id)
        .push_bind(d.conversation_id.as_str())
        .push_bind(d.created_ms)
        .push_bind(d.action.as_str())
        .push_bind(d.applied.as_str())
        .push_bind(d.step)
        .push_bind(d.reason.as_str())
        .push_bind(d.policy.as_deref());
}

const INTERVENTIONS: Insert = Insert {
    table: "interventions",
    columns: "conversation_id, request_id, created_ms, action, applied, source, detector,
        reason, finding, policy",
    conflict: "",
};

fn bind_intervention<'r>(v: &mut Values<'_, 'r>, i: &'r &InterventionRow) {
    v.push_bind(i.conversation_id.as_str())
        .push_bind(i.request_id)
        .push_bind(i.created_ms)
        .push_bind(i.action.as_str())
        .push_bind(i.applied.as_str())
        .push_bind(i.source.as_str())
        .push_bind(i.detector.as_str())
        .push_bind(i.reason.as_str())
        .push_bind(i.finding.as_str())
        .push_bind(i.policy.as_deref());
}

/// The latest sighting wins: a step's later copy carries more of its results.
const HEAD_CONTENT: Insert = Insert {
    table: "conversation_content",
    columns: "conversation_id, content, request_id, seen_ms",
    conflict: "ON CONFLICT (conversation_id) DO UPDATE SET content = excluded.content,
        request_id = excluded.request_id, seen_ms = excluded.seen_ms",
};

fn bind_head<'r>(v: &mut Values<'_, 'r>, c: &'r &ContentRow) {
    v.push_bind(c.conversation_id.as_str())
        .push_bind(c.content.as_str())
        .push_bind(c.request_id)
        .push_bind(c.seen_ms);
}

const STEP_CONTENT: Insert = Insert {
    table: "step_content",
    columns: "conversation_id, step, content, request_id, seen_ms",
    conflict: "ON CONFLICT (conversation_id, step) DO UPDATE SET content = excluded.content,
        request_id = excluded.request_id, seen_ms = excluded.seen_ms",
};

fn bind_step<'r>(v: &mut Values<'_, 'r>, c: &'r &ContentRow) {
    v.push_bind(c.conversation_id.as_str())
        .push_bind(c.step)
        .push_bind(c.content.as_str())
        .push_bind(c.request_id)
        .push_bind(c.seen_ms);
}

/// A run's row ([`store_runs`]): rare, so each is one statement.
async fn write_run(conn: &mut PgConnection, record: &RunRecord) -> Result<(), sqlx::Error> {
    match record {
        RunRecord::Compacted(r) => {
            sqlx::query(store_runs::UPSERT_RUN)
                .bind(&r.id)
                .bind(&r.key_id)
                .bind(&r.client)
                .bind(&r.team)
                .bind(&r.policy)
                .bind(r.compacted_ms)
                .bind(r.awaiting)
                .bind(r.server_compaction)
                .bind(&r.carry)
                .bind(r.last_ms)
                .execute(&mut *conn)
                .await?;
        }
        RunRecord::Linked(l) => {
            sqlx::query(store_runs::UPSERT_LINK)
                .bind(&l.conversation_id)
                .bind(&l.run_id)
                .bind(l.linked_ms)
                .execute(&mut *conn)
                .await?;
            sqlx::query(store_runs::CONTINUED)
                .bind(&l.run_id)
                .bind(l.linked_ms)
                .execute(&mut *conn)
                .await?;
        }
        RunRecord::ServerCompacted { run, fingerprint } => {
            sqlx::query(store_runs::SERVER_COMPACTED)
                .bind(run)
                .bind(fingerprint)
                .execute(&mut *conn)
                .await?;
        }
        RunRecord::Answer(a) => {
            sqlx::query(store_runs::UPSERT_ANSWER)
                .bind(&a.id)
                .bind(&a.parent_id)
                .bind(a.masked_items().as_str())
                .bind(a.made_here)
                .bind(a.stored_ms)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}
