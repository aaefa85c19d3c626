//! The log: SQLite through sqlx, written by one background task.
//!
//! The request path only calls [`Store::log`], which puts a [`Record`] on a bounded queue and
//! returns at once. When the queue is full the record is dropped and counted: a slow or
//! failed disk must never delay or fail a proxied request. The writer drains the queue in
//! batches, one transaction per batch. [`Store::flush`] waits until everything queued before
//! it is written (used at shutdown and by tests).
//!
//! Schema: `migrations/` (embedded, applied at open). Reads for the admin API live in
//! [`query`].

pub mod query;
pub mod redact;

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;
use tokio::sync::{mpsc, oneshot};

/// A conversation was seen (one per request; the writer upserts and counts).
#[derive(Debug, Clone)]
pub struct ConversationSeen {
    pub id: String,
    pub id_source: &'static str,
    pub client: Option<String>,
    pub dialect: Option<&'static str>,
    pub model: Option<String>,
    pub at_ms: i64,
}

/// One proxied request, complete with its outcome. Column meanings: `migrations/0001_log.sql`.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RequestRow {
    pub id: i64,
    pub conversation_id: String,
    pub started_ms: i64,
    pub method: String,
    pub path: String,
    pub upstream: String,
    pub dialect: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    pub parse: String,
    pub parse_error: Option<String>,
    pub steps: Option<i64>,
    pub decision: Option<String>,
    pub applied: String,
    pub status: i64,
    pub outcome: String,
    pub request_bytes: i64,
    pub response_bytes: i64,
    pub upstream_latency_us: Option<i64>,
    pub upstream_total_us: Option<i64>,
    pub proxy_overhead_us: i64,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub stop_reason: Option<String>,
}

/// A tool call, with its result once the history carries it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct ToolCallRow {
    pub conversation_id: String,
    pub step: i64,
    pub call_index: i64,
    pub call_id: String,
    pub name: String,
    pub args_hash: String,
    pub summary: String,
    pub result_hash: Option<String>,
    pub result_summary: Option<String>,
    pub is_error: Option<bool>,
    pub request_id: i64,
    pub seen_ms: i64,
}

/// One detector finding attached to a request.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct FindingRow {
    pub request_id: i64,
    pub conversation_id: String,
    pub created_ms: i64,
    pub detector: String,
    pub confidence: f64,
    pub step: Option<i64>,
    /// JSON array of step indexes.
    pub steps: String,
    pub summary: String,
    pub suggestion: String,
}

/// A decision other than a plain observe, and what the proxy did with it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct DecisionRow {
    pub request_id: i64,
    pub conversation_id: String,
    pub created_ms: i64,
    pub action: String,
    pub applied: String,
    pub step: Option<i64>,
    pub reason: String,
}

/// One intervention (see `crate::intervene` and `migrations/0002_interventions.sql`).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct InterventionRow {
    pub conversation_id: String,
    pub request_id: Option<i64>,
    pub created_ms: i64,
    pub action: String,
    pub applied: String,
    pub source: String,
    pub detector: String,
    pub reason: String,
    pub finding: String,
}

/// Anything the log records.
#[derive(Debug, Clone)]
pub enum Record {
    Conversation(ConversationSeen),
    Request(Box<RequestRow>),
    ToolCall(Box<ToolCallRow>),
    Finding(Box<FindingRow>),
    Decision(Box<DecisionRow>),
    Intervention(Box<InterventionRow>),
}

enum Command {
    Write(Record),
    /// Answered once every record queued before it has been written.
    Flush(oneshot::Sender<()>),
}

/// Counters of the log's health, shown by the admin API.
#[derive(Debug, Default)]
struct Counters {
    written: AtomicU64,
    /// Records dropped because the queue was full.
    dropped: AtomicU64,
    /// Records lost because a write transaction failed.
    failed: AtomicU64,
}

/// Handle to the log: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Command>,
    pool: SqlitePool,
    counters: Arc<Counters>,
}

/// Write-side settings (the `[store]` config table).
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub queue_capacity: usize,
    pub batch_size: usize,
}

/// Snapshot of the counters.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StoreHealth {
    pub written: u64,
    pub dropped: u64,
    pub failed: u64,
}

impl Store {
    /// Opens (creating if missing) and migrates the database, and starts the writer task.
    /// Must be called inside a tokio runtime.
    pub async fn open(url: &str, options: StoreOptions) -> anyhow::Result<Store> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(|e| anyhow::anyhow!("database URL {url:?}: {e}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // WAL + NORMAL: durable across process crashes, fast enough for batched writes.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(connect)
            .await
            .map_err(|e| anyhow::anyhow!("cannot open database {url:?}: {e}"))?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|e| anyhow::anyhow!("cannot migrate database {url:?}: {e}"))?;
        let (tx, rx) = mpsc::channel(options.queue_capacity.max(1));
        let counters = Arc::new(Counters::default());
        tokio::spawn(writer(
            pool.clone(),
            rx,
            options.batch_size.max(1),
            counters.clone(),
        ));
        Ok(Store { tx, pool, counters })
    }

    /// Queues a record without waiting. A full queue drops it (counted, and logged at
    /// powers of two so a flood does not flood the log too).
    pub fn log(&self, record: Record) {
        if self.tx.try_send(Command::Write(record)).is_err() {
            let n = self.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped_total = n, "log queue full: records dropped");
            }
        }
    }

    /// Waits until every record queued before this call is written.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Command::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    pub fn health(&self) -> StoreHealth {
        StoreHealth {
            written: self.counters.written.load(Ordering::Relaxed),
            dropped: self.counters.dropped.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
        }
    }

    /// The read side, for the admin API.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// How long the writer gathers records before writing them (a log entry reaches the
/// database at most this late; [`Store::flush`] does not wait for it).
const BATCH_WINDOW: Duration = Duration::from_millis(50);

/// The writer task: takes what is queued (up to a batch), writes it in one transaction,
/// answers flushes, repeats. Ends when every `Store` handle is gone.
async fn writer(
    pool: SqlitePool,
    mut rx: mpsc::Receiver<Command>,
    batch_size: usize,
    counters: Arc<Counters>,
) {
    let mut commands = Vec::with_capacity(batch_size);
    let mut records = Vec::with_capacity(batch_size);
    let mut flushes = Vec::new();
    loop {
        if rx.recv_many(&mut commands, batch_size).await == 0 {
            return;
        }
        // Gather for a moment before writing: every statement is a hand-off to SQLite's
        // connection thread and back, so one transaction per request at low load cost more
        // CPU (mostly context switches) than the whole request path. A flush stops the wait.
        let deadline = tokio::time::Instant::now() + BATCH_WINDOW;
        while commands.len() < batch_size
            && !commands.iter().any(|c| matches!(c, Command::Flush(_)))
        {
            let room = batch_size - commands.len();
            match tokio::time::timeout_at(deadline, rx.recv_many(&mut commands, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        for command in commands.drain(..) {
            match command {
                Command::Write(record) => records.push(record),
                Command::Flush(done) => flushes.push(done),
            }
        }
        if !records.is_empty() {
            let n = records.len() as u64;
            match write_batch(&pool, &records).await {
                Ok(()) => {
                    counters.written.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    counters.failed.fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(records = n, error = %e, "log write failed: records lost");
                }
            }
            records.clear();
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn write_batch(pool: &SqlitePool, records: &[Record]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    for record in records {
        write_one(&mut tx, record).await?;
    }
    tx.commit().await
}

async fn write_one(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    record: &Record,
) -> Result<(), sqlx::Error> {
    let conn = &mut **tx;
    match record {
        Record::Conversation(c) => {
            sqlx::query(
                "INSERT INTO conversations
                   (id, id_source, client, dialect, model, first_seen_ms, last_seen_ms, requests)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, 1)
                 ON CONFLICT (id) DO UPDATE SET
                   last_seen_ms = max(last_seen_ms, excluded.last_seen_ms),
                   requests = requests + 1,
                   client = coalesce(client, excluded.client),
                   dialect = coalesce(excluded.dialect, dialect),
                   model = coalesce(excluded.model, model)",
            )
            .bind(&c.id)
            .bind(c.id_source)
            .bind(&c.client)
            .bind(c.dialect)
            .bind(&c.model)
            .bind(c.at_ms)
            .execute(conn)
            .await?;
        }
        Record::Request(r) => {
            sqlx::query(
                "INSERT OR REPLACE INTO requests
                   (id, conversation_id, started_ms, method, path, upstream, dialect, model,
                    stream, parse, parse_error, steps, decision, applied, status, outcome,
                    request_bytes, response_bytes, upstream_latency_us, upstream_total_us,
                    proxy_overhead_us, input_tokens, output_tokens, stop_reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                         ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)",
            )
            .bind(r.id)
            .bind(&r.conversation_id)
            .bind(r.started_ms)
            .bind(&r.method)
            .bind(&r.path)
            .bind(&r.upstream)
            .bind(&r.dialect)
            .bind(&r.model)
            .bind(r.stream)
            .bind(&r.parse)
            .bind(&r.parse_error)
            .bind(r.steps)
            .bind(&r.decision)
            .bind(&r.applied)
            .bind(r.status)
            .bind(&r.outcome)
            .bind(r.request_bytes)
            .bind(r.response_bytes)
            .bind(r.upstream_latency_us)
            .bind(r.upstream_total_us)
            .bind(r.proxy_overhead_us)
            .bind(r.input_tokens)
            .bind(r.output_tokens)
            .bind(&r.stop_reason)
            .execute(conn)
            .await?;
        }
        Record::ToolCall(t) => {
            // A result, once known, is never erased by a later sighting without one.
            sqlx::query(
                "INSERT INTO tool_calls
                   (conversation_id, step, call_index, call_id, name, args_hash, summary,
                    result_hash, result_summary, is_error, request_id, seen_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (conversation_id, step, call_index) DO UPDATE SET
                   call_id = excluded.call_id,
                   name = excluded.name,
                   args_hash = excluded.args_hash,
                   summary = excluded.summary,
                   result_hash = coalesce(excluded.result_hash, result_hash),
                   result_summary = coalesce(excluded.result_summary, result_summary),
                   is_error = coalesce(excluded.is_error, is_error),
                   request_id = excluded.request_id,
                   seen_ms = excluded.seen_ms",
            )
            .bind(&t.conversation_id)
            .bind(t.step)
            .bind(t.call_index)
            .bind(&t.call_id)
            .bind(&t.name)
            .bind(&t.args_hash)
            .bind(&t.summary)
            .bind(&t.result_hash)
            .bind(&t.result_summary)
            .bind(t.is_error)
            .bind(t.request_id)
            .bind(t.seen_ms)
            .execute(conn)
            .await?;
        }
        Record::Finding(f) => {
            sqlx::query(
                "INSERT INTO findings
                   (request_id, conversation_id, created_ms, detector, confidence, step, steps,
                    summary, suggestion)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .bind(f.request_id)
            .bind(&f.conversation_id)
            .bind(f.created_ms)
            .bind(&f.detector)
            .bind(f.confidence)
            .bind(f.step)
            .bind(&f.steps)
            .bind(&f.summary)
            .bind(&f.suggestion)
            .execute(conn)
            .await?;
        }
        Record::Decision(d) => {
            sqlx::query(
                "INSERT OR REPLACE INTO decisions
                   (request_id, conversation_id, created_ms, action, applied, step, reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .bind(d.request_id)
            .bind(&d.conversation_id)
            .bind(d.created_ms)
            .bind(&d.action)
            .bind(&d.applied)
            .bind(d.step)
            .bind(&d.reason)
            .execute(conn)
            .await?;
        }
        Record::Intervention(i) => {
            sqlx::query(
                "INSERT INTO interventions (conversation_id, request_id, created_ms, action,
                   applied, source, detector, reason, finding)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .bind(&i.conversation_id)
            .bind(i.request_id)
            .bind(i.created_ms)
            .bind(&i.action)
            .bind(&i.applied)
            .bind(&i.source)
            .bind(&i.detector)
            .bind(&i.reason)
            .bind(&i.finding)
            .execute(conn)
            .await?;
        }
    }
    Ok(())
}

/// Milliseconds since the Unix epoch, the log's time unit.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: i64) -> Record {
        Record::Request(Box::new(RequestRow {
            id,
            conversation_id: "c".into(),
            started_ms: id,
            method: "POST".into(),
            path: "/v1/messages".into(),
            upstream: "anthropic".into(),
            dialect: Some("anthropic".into()),
            model: None,
            stream: true,
            parse: "parsed".into(),
            parse_error: None,
            steps: Some(0),
            decision: Some("observe".into()),
            applied: "forwarded".into(),
            status: 200,
            outcome: "complete".into(),
            request_bytes: 10,
            response_bytes: 20,
            upstream_latency_us: Some(5),
            upstream_total_us: Some(9),
            proxy_overhead_us: 1,
            input_tokens: None,
            output_tokens: None,
            stop_reason: None,
        }))
    }

    async fn open(dir: &tempfile::TempDir, queue_capacity: usize) -> Store {
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        Store::open(
            &url,
            StoreOptions {
                queue_capacity,
                batch_size: 64,
            },
        )
        .await
        .unwrap()
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, 4).await;
        // On this single-threaded runtime the writer cannot run until we yield, so the
        // queue fills up: the caller must never wait for it.
        for id in 1..=100 {
            store.log(request(id));
        }
        store.flush().await;
        let health = store.health();
        assert_eq!(health.dropped, 96);
        assert_eq!(health.written, 4);
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM requests")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(n, 4);
    }

    #[tokio::test]
    async fn a_failed_write_is_counted_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir, 64).await;
        sqlx::query("ALTER TABLE requests RENAME TO requests_gone")
            .execute(store.pool())
            .await
            .unwrap();
        store.log(request(1));
        store.flush().await;
        assert_eq!(store.health().failed, 1);
        sqlx::query("ALTER TABLE requests_gone RENAME TO requests")
            .execute(store.pool())
            .await
            .unwrap();
        store.log(request(2));
        store.flush().await;
        assert_eq!(store.health().written, 1);
    }
}
