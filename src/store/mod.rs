//! The log, behind one interface: [`Store`]. Everything else in loopwarden writes and reads
//! through it, never through a database library; where the log lives is its backend's
//! business: SQLite ([`sqlite`], one process) or PostgreSQL ([`postgres`], shared by
//! several replicas), chosen by the URL. Both write through the same queue and writer
//! thread ([`writer`]), group a batch the same way ([`batch`]), and hold the same tables
//! and columns.
//!
//! The request path only calls [`Store::log`] (or [`Store::log_deferred`]), which puts an
//! entry on a bounded queue and returns at once. When the queue is full the entry is
//! dropped and counted: a slow or failed disk must never delay or fail a proxied request.
//! The writer thread ([`writer`]) drains the queue in batches, one transaction per batch.
//! [`Store::flush`] waits until everything queued before it is written (used at shutdown
//! and by tests). The admin API reads ([`query`]'s views), the conversations' controls
//! (sticky halts) and what a run needs to go on in another process ([`runs`]) go through
//! the same handle.
//!
//! Schema: `migrations/` (SQLite) and `migrations/postgres/` (embedded, applied at open).

mod batch;
pub mod dashboard;
mod dashboard_sql;
pub mod postgres;
pub mod query;
mod read;
pub mod redact;
pub mod runs;
mod shared;
mod spill;
mod sqlite;
mod writer;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

pub use query::{ConversationSummary, LoggedSpend, OverheadStats, Timeline};
pub use redact::Masked;
pub use shared::PendingListener;
pub use writer::Deferred;

/// The `[log]` table: what the log keeps beyond what every request gets (its metadata, the
/// tool calls' short redacted summaries, the findings and decisions). A policy overrides it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Keep each step's whole content (masked like the summaries), so that `loopwarden
    /// replay` can replay the logged conversations with another config. Off by default:
    /// prompts and tool output are a team's code and data.
    pub content: bool,
}
use writer::Entry;

/// A conversation was seen (one per request; the writer upserts and counts).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConversationSeen {
    pub id: String,
    pub id_source: Label,
    pub client: Option<String>,
    pub dialect: Option<Label>,
    pub model: Option<String>,
    pub at_ms: i64,
    /// The request's `proxy_overhead_us`, added to the conversation's running sum (set when
    /// the request's row is logged: `crate::proxy::forward::record`).
    pub overhead_us: i64,
    /// The team the request named (`/t/{team}`, `x-loopwarden-team`), for the dashboard's
    /// filter.
    pub team: Option<String>,
}

/// The text of a column with a fixed vocabulary (a request's method, upstream, dialect,
/// parse, decision, applied, outcome) or a name the configuration gives once (a policy's).
/// The proxy names them with `&'static str`s or shares the configuration's `Arc<str>`,
/// which a row carries without allocating (every request logs eight of them); a row read
/// back from the log owns its text.
#[derive(Debug, Clone)]
pub struct Label(LabelText);

#[derive(Debug, Clone)]
enum LabelText {
    Static(&'static str),
    Shared(Arc<str>),
    Owned(String),
}

impl Label {
    pub fn as_str(&self) -> &str {
        match &self.0 {
            LabelText::Static(text) => text,
            LabelText::Shared(text) => text,
            LabelText::Owned(text) => text,
        }
    }

    /// The text, when it is a static name.
    pub fn as_static(&self) -> Option<&'static str> {
        match self.0 {
            LabelText::Static(text) => Some(text),
            LabelText::Shared(_) | LabelText::Owned(_) => None,
        }
    }
}

/// Labels are equal when their texts are, however each holds its text.
impl PartialEq for Label {
    fn eq(&self, other: &Label) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Label {}

impl std::hash::Hash for Label {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl Serialize for Label {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Label, D::Error> {
        String::deserialize(d).map(Label::from)
    }
}

impl From<&'static str> for Label {
    fn from(name: &'static str) -> Label {
        Label(LabelText::Static(name))
    }
}

impl From<Arc<str>> for Label {
    fn from(name: Arc<str>) -> Label {
        Label(LabelText::Shared(name))
    }
}

impl From<String> for Label {
    fn from(text: String) -> Label {
        Label(LabelText::Owned(text))
    }
}

impl std::ops::Deref for Label {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// One proxied request, complete with its outcome. Column meanings: `migrations/0001_log.sql`.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct RequestRow {
    pub id: i64,
    pub conversation_id: String,
    pub started_ms: i64,
    pub method: Label,
    pub path: String,
    pub upstream: Label,
    pub dialect: Option<Label>,
    pub model: Option<String>,
    pub stream: bool,
    pub parse: Label,
    pub parse_error: Option<Masked>,
    pub steps: Option<i64>,
    pub decision: Option<Label>,
    pub applied: Label,
    pub status: i64,
    pub outcome: Label,
    pub request_bytes: i64,
    pub response_bytes: i64,
    pub upstream_latency_us: Option<i64>,
    pub upstream_total_us: Option<i64>,
    pub proxy_overhead_us: i64,
    /// Request head to the body's last byte (`migrations/0003_body_read.sql`).
    pub body_read_us: Option<i64>,
    /// The answer's tokens, split by how they are billed (`crate::budget::Usage`;
    /// `migrations/0008_spend.sql`).
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub stop_reason: Option<String>,
    /// The policy the request was under.
    pub policy: Option<Label>,
    pub cached_input_tokens: Option<i64>,
    pub cache_write_tokens: Option<i64>,
    /// US dollars; `None` when the usage or the model's price is unknown.
    pub cost_usd: Option<f64>,
    /// A summary request's compaction marker (`migrations/0011_lineage.sql`).
    pub compaction: Option<Label>,
    /// The id the request stated, when it is logged under the run it continues under
    /// another id.
    pub stated_id: Option<String>,
}

impl RequestRow {
    /// A complete Anthropic request of conversation `c`, for tests.
    #[cfg(test)]
    pub(crate) fn sample(id: i64) -> RequestRow {
        RequestRow {
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
            body_read_us: Some(0),
            input_tokens: None,
            output_tokens: None,
            stop_reason: None,
            cached_input_tokens: None,
            cache_write_tokens: None,
            cost_usd: None,
            policy: Some("default".into()),
            compaction: None,
            stated_id: None,
        }
    }
}

/// A tool call, with its result once the history carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ToolCallRow {
    pub conversation_id: String,
    pub step: i64,
    pub call_index: i64,
    pub call_id: Masked,
    pub name: Masked,
    pub args_hash: String,
    pub summary: Masked,
    pub result_hash: Option<String>,
    pub result_summary: Option<Masked>,
    pub is_error: Option<bool>,
    pub request_id: i64,
    pub seen_ms: i64,
}

/// One detector finding attached to a request.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct FindingRow {
    pub request_id: i64,
    pub conversation_id: String,
    pub created_ms: i64,
    pub detector: String,
    pub confidence: f64,
    pub step: Option<i64>,
    /// JSON array of step indexes.
    pub steps: String,
    pub summary: Masked,
    pub suggestion: Masked,
}

/// A decision other than a plain observe, and what the proxy did with it.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct DecisionRow {
    pub request_id: i64,
    pub conversation_id: String,
    pub created_ms: i64,
    pub action: String,
    pub applied: String,
    pub step: Option<i64>,
    pub reason: Masked,
    pub policy: Option<String>,
}

/// One intervention (see `crate::intervene` and `migrations/0002_interventions.sql`).
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct InterventionRow {
    pub conversation_id: String,
    pub request_id: Option<i64>,
    pub created_ms: i64,
    pub action: String,
    pub applied: String,
    pub source: String,
    pub detector: String,
    pub reason: Masked,
    pub finding: Masked,
    pub policy: Option<String>,
}

/// A conversation's content (`log.content`, `migrations/0009_content.sql`): one step as
/// JSON ([`crate::transcript::Step`]), or the conversation's head
/// ([`crate::transcript::Head`]), credentials masked in every string ([`Masked::json`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContentRow {
    pub conversation_id: String,
    /// The step's index; `None`: the head.
    pub step: Option<i64>,
    pub content: Masked,
    /// The request whose history carried it (the last one to write the row).
    pub request_id: i64,
    pub seen_ms: i64,
}

/// Anything the log records. Serialised (a line of a spill file, `spill`) as
/// `{"kind": {row}}`, the kind in snake case.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Record {
    Conversation(ConversationSeen),
    Request(Box<RequestRow>),
    ToolCall(Box<ToolCallRow>),
    Finding(Box<FindingRow>),
    Decision(Box<DecisionRow>),
    Intervention(Box<InterventionRow>),
    Content(Box<ContentRow>),
    /// What a run needs to go on in another process ([`runs`]).
    Run(Box<runs::RunRecord>),
}

/// Counters of the log's health, shown by the admin API.
#[derive(Debug, Default)]
struct Counters {
    written: AtomicU64,
    /// Entries dropped because the queue was full (a request's rows, or one record).
    dropped: AtomicU64,
    /// Records lost because writing them failed (at once for a failure that would repeat,
    /// else once `store.retry_rows` is exceeded or at shutdown).
    failed: AtomicU64,
    /// Failed write attempts whose records were kept for another.
    retried: AtomicU64,
    /// Times the database file was found deleted or replaced and made again (SQLite), or
    /// the writer's lost connection was made again (PostgreSQL).
    reopened: AtomicU64,
    /// Records not written by the closing deadline, kept in the spill file for the next
    /// start (`spill`).
    spilled: AtomicU64,
}

/// Handle to the log: cheap to clone, shared by every request.
#[derive(Clone)]
pub struct Store {
    writer: Arc<writer::Handle>,
    backend: Backend,
}

/// Where the log lives.
#[derive(Clone)]
enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
}

/// A read or a write of the log that failed (the database's error, as it said it).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(#[from] sqlx::Error);

/// The stored state of one conversation (`conversation_controls`: see
/// `crate::intervene::controls`).
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Control {
    pub conversation_id: String,
    pub halted: bool,
    /// Why it was halted (shown again in every repeated halt).
    pub reason: Masked,
    /// Who or what halted or released it: `policy` (a loop), `budget` (a spent budget),
    /// `operator` (by hand, or a human's halt verdict) or `human` (a human let it go on).
    pub source: String,
    /// Human messages the conversation held when it was halted; a later request with more
    /// has a human speaking. `None` until the first request after an operator's halt.
    pub humans_at_halt: Option<i64>,
    /// An operator resumed it; the next request records where.
    pub resume_pending: bool,
    /// JSON array of the request indexes (steps carried) at which it was resumed.
    pub resumed_at: String,
    pub updated_ms: i64,
    /// The run the control holds for: the steps its history carried when the control was
    /// made, and their digest (`migrations/0006_control_run.sql`). `None` until a request
    /// binds it.
    pub run_steps: Option<i64>,
    pub run_digest: Option<String>,
}

/// Write-side settings (the `[store]` config table).
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    pub queue_capacity: usize,
    pub batch_size: usize,
    /// How long the writer gathers entries before writing them: a log entry reaches the
    /// database at most this late ([`Store::flush`] does not wait for it).
    pub batch_window: Duration,
    /// Records kept for another attempt after failed writes, at most (`store.retry_rows`).
    pub retry_rows: usize,
}

impl StoreOptions {
    /// Gathering for 50 ms makes a batch out of many requests at any load worth batching,
    /// and is still "at once" for a human reading the admin API.
    pub const BATCH_WINDOW: Duration = Duration::from_millis(50);
}

/// Snapshot of the counters.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StoreHealth {
    pub written: u64,
    pub dropped: u64,
    pub failed: u64,
    pub retried: u64,
    pub reopened: u64,
    /// Records kept in the spill file at shutdown, for the next start.
    pub spilled: u64,
    /// Entries waiting in the queue now (at most `store.queue_capacity`).
    pub queued: usize,
}

/// How the log closed ([`Store::close_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Records kept in the spill file, for the next start to write.
    pub spilled: u64,
    /// Records lost since the stop began: neither written nor spilled (a write that would
    /// fail again, the retry bound passed, the queue full, the spill failed).
    pub lost: u64,
    /// The writer had not finished by the deadline and a last write's time: what it still
    /// held is unaccounted for (the process exits without it).
    pub unfinished: bool,
}

/// How long past its deadline [`Store::close_by`] waits for the writer: one write attempt
/// (SQLite's busy timeout, PostgreSQL's write timeout, both 5 s) may be under way.
const CLOSE_SLACK: Duration = Duration::from_secs(6);

/// How long [`Store::take_in_spill`] waits for the spilled records to be written before
/// the proxy serves anyway (the file is then kept for the next start).
const TAKE_IN_WAIT: Duration = Duration::from_secs(60);

impl Store {
    /// Opens the log at `url` (a `sqlite://` URL: created if missing; or a `postgres://`
    /// one: an existing database) and migrates it, and starts the writer thread. Must be
    /// called inside a tokio runtime.
    pub async fn open(url: &str, options: StoreOptions) -> anyhow::Result<Store> {
        let (backend, writer) = if postgres::is_url(url) {
            let (db, writer) = postgres::open(url, options).await?;
            (Backend::Postgres(db), writer)
        } else {
            let (db, writer) = sqlite::open(url, options).await?;
            (Backend::Sqlite(db), writer)
        };
        Ok(Store {
            writer: Arc::new(writer),
            backend,
        })
    }

    /// Whether the log is shared by several replicas (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// Queues a record without waiting. A full queue drops it (counted, and logged at
    /// powers of two so a flood does not flood the log too).
    pub fn log(&self, record: Record) {
        self.enqueue(Entry::Record(record));
    }

    /// Queues an entry whose records the writer works out (off the request path).
    pub fn log_deferred(&self, entry: Box<dyn Deferred>) {
        self.enqueue(Entry::Deferred(entry));
    }

    fn enqueue(&self, entry: Entry) {
        let queue = &self.writer.queue;
        if !queue.push(entry) {
            let n = queue.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped_total = n, "log queue full: records dropped");
            }
        }
    }

    /// Waits until every record queued before this call is written.
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.writer.queue.flush(done) {
            let _ = wait.await;
        }
    }

    /// Entries queued and not yet taken by the writer (`/metrics`).
    pub fn queue_depth(&self) -> usize {
        self.writer.queue.len()
    }

    pub fn health(&self) -> StoreHealth {
        let counters = &self.writer.queue.counters;
        StoreHealth {
            written: counters.written.load(Ordering::Relaxed),
            dropped: counters.dropped.load(Ordering::Relaxed),
            failed: counters.failed.load(Ordering::Relaxed),
            retried: counters.retried.load(Ordering::Relaxed),
            reopened: counters.reopened.load(Ordering::Relaxed),
            spilled: counters.spilled.load(Ordering::Relaxed),
            queued: self.writer.queue.len(),
        }
    }

    /// Where records not written by the closing deadline go (the writer's spill file).
    pub fn spill_to(&self, path: std::path::PathBuf) {
        let _ = self.writer.queue.spill.set(path);
    }

    /// Closes the log: what is queued is written until `deadline`, and what is left then
    /// is spilled ([`Store::spill_to`]) or, that failing, lost. Waits for the writer to
    /// say so (a little past the deadline at most: [`CLOSE_SLACK`]). Records logged
    /// afterwards are dropped. What was lost is counted from `since` (the log's health
    /// when the stop began).
    pub async fn close_by(&self, deadline: std::time::Instant, since: &StoreHealth) -> Closed {
        let (done, wait) = oneshot::channel();
        let waiting = self.writer.queue.flush(done);
        self.writer.queue.close_by(deadline);
        let limit = deadline.saturating_duration_since(std::time::Instant::now()) + CLOSE_SLACK;
        let unfinished = waiting && tokio::time::timeout(limit, wait).await.is_err();
        let now = self.health();
        Closed {
            spilled: now.spilled - since.spilled,
            lost: (now.failed + now.dropped) - (since.failed + since.dropped),
            unfinished,
        }
    }

    /// Writes the records of the spill file at `path` (left by a shutdown that could not
    /// write them) into the log, and deletes the file once they are written. A line that is
    /// not a record is skipped, reported and kept beside the file (`.rejected`). When some
    /// records cannot be written (the log fails now too), the file is kept for the next
    /// start. Returns how many records were written.
    pub async fn take_in_spill(&self, path: &std::path::Path) -> anyhow::Result<usize> {
        let shown = path.display();
        let spilled = spill::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read the spill file {shown}: {e}"))?;
        let Some(spilled) = spilled else {
            return Ok(0);
        };
        for (line, _, error) in &spilled.rejected {
            tracing::warn!(path = %shown, line, error = %error, "a line of the spill file is not a log record: skipped");
        }
        if !spilled.rejected.is_empty() {
            spill::keep_rejected(path, &spilled.rejected).map_err(|e| {
                anyhow::anyhow!("cannot keep the spill file's unreadable lines beside it: {e}")
            })?;
            tracing::warn!(lines = spilled.rejected.len(), kept = %spill::rejected_path(path).display(), "the spill file's unreadable lines are kept there");
        }
        let n = spilled.records.len();
        let before = self.health();
        // The queue drops what exceeds its capacity: half of it at a time, each written
        // before the next is queued.
        let chunk = (self.writer.queue.capacity() / 2).max(1);
        let written = tokio::time::timeout(TAKE_IN_WAIT, async {
            for records in spilled.records.chunks(chunk) {
                for record in records {
                    self.log(record.clone());
                }
                self.flush().await;
            }
        })
        .await;
        let after = self.health();
        let missing = (after.failed - before.failed) + (after.dropped - before.dropped);
        if written.is_err() || missing > 0 {
            tracing::error!(path = %shown, records = n, not_written = missing, "the spill file's records could not all be written: the file is kept and read again at the next start (the records written now may then be written twice)");
            return Ok(n - (missing as usize).min(n));
        }
        std::fs::remove_file(path).map_err(|e| {
            anyhow::anyhow!("cannot delete the spill file {shown} after writing its records: {e}")
        })?;
        tracing::info!(path = %shown, records = n, "the spill file's records are in the log; file deleted");
        Ok(n)
    }

    /// Conversations, most recently active first.
    pub async fn conversations(&self, limit: i64) -> Result<Vec<ConversationSummary>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::conversations(&db.pool(), limit).await?),
            Backend::Postgres(db) => Ok(postgres::read::conversations(db.pool(), limit).await?),
        }
    }

    /// One conversation's timeline, or `None` when the id is unknown.
    pub async fn timeline(&self, id: &str) -> Result<Option<Timeline>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::timeline(&db.pool(), id).await?),
            Backend::Postgres(db) => Ok(postgres::read::timeline(db.pool(), id).await?),
        }
    }

    /// Whether the log has seen the conversation (a request of it was logged).
    pub async fn has_conversation(&self, id: &str) -> Result<bool, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::has_conversation(&db.pool(), id).await?),
            Backend::Postgres(db) => Ok(postgres::read::has_conversation(db.pool(), id).await?),
        }
    }

    /// The proxy's own overhead over the `last` requests logged.
    pub async fn overhead(&self, last: i64) -> Result<OverheadStats, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::overhead(&db.pool(), last).await?),
            Backend::Postgres(db) => Ok(postgres::read::overhead(db.pool(), last).await?),
        }
    }

    /// The spend of each conversation answered since `since_ms` (ms since the epoch).
    pub async fn recent_spend(&self, since_ms: i64) -> Result<Vec<LoggedSpend>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::recent_spend(&db.pool(), since_ms).await?),
            Backend::Postgres(db) => Ok(postgres::read::recent_spend(db.pool(), since_ms).await?),
        }
    }

    /// Every conversation's stored control.
    pub async fn controls(&self) -> Result<Vec<Control>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::controls(&db.pool()).await?),
            Backend::Postgres(db) => Ok(postgres::read::controls(db.pool()).await?),
        }
    }

    /// The controls changed since `since_ms` (by their `updated_ms`): another replica's
    /// halts and resumes (`crate::replicas`).
    pub async fn controls_since(&self, since_ms: i64) -> Result<Vec<Control>, Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::controls_since(&db.pool(), since_ms).await?),
            Backend::Postgres(db) => Ok(postgres::read::controls_since(db.pool(), since_ms).await?),
        }
    }

    /// Publishes this replica's spend of the conversations given (PostgreSQL: a shared
    /// log; SQLite has no other replica, and keeps nothing).
    pub async fn publish_spend(&self, replica: &str, spend: &[LoggedSpend]) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(db) => Ok(db.publish_spend(replica, spend).await?),
        }
    }

    /// The other replicas' spend, summed per conversation, of the conversations any of
    /// them published since `since_ms` (none in SQLite).
    pub async fn others_spend(
        &self,
        replica: &str,
        since_ms: i64,
    ) -> Result<Vec<LoggedSpend>, Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Vec::new()),
            Backend::Postgres(db) => Ok(db.others_spend(replica, since_ms).await?),
        }
    }

    /// Stores a conversation's control, unless a newer one is stored already.
    pub async fn save_control(&self, control: &Control) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(db) => Ok(sqlite::read::save_control(&db.pool(), control).await?),
            Backend::Postgres(db) => Ok(postgres::read::save_control(db.pool(), control).await?),
        }
    }
}

/// The PostgreSQL server the tests use (`LW_TEST_POSTGRES`, an admin URL: see
/// `scripts/pg_cluster.sh`), as a new database of its own for the caller. The tests that
/// need it are `#[ignore]`d, so that a plain `cargo test` counts them as ignored rather than
/// passed; run (`cargo test -- --include-ignored`, as `.ci/run` does), they fail here when
/// none is configured or it cannot be reached.
#[doc(hidden)]
pub async fn test_postgres() -> anyhow::Result<String> {
    match std::env::var("LW_TEST_POSTGRES") {
        Ok(admin) if !admin.is_empty() => Ok(postgres::scratch_database(&admin).await?),
        _ => anyhow::bail!(
            "this test needs PostgreSQL and LW_TEST_POSTGRES is unset: \
             eval \"$(scripts/pg_cluster.sh start)\" sets it"
        ),
    }
}

/// A new request's id (`requests.id`): unique, and increasing in the order requests start.
///
/// The id is the requests table's rowid, so increasing ids append each row at the end of
/// its B-tree. Random ids (the first version) scattered every batch's rows over the whole
/// table: each commit rewrote (and first read back) a page per row, which made the log
/// thread the proxy's largest CPU cost under load (BENCHMARKS.md, "The log thread").
///
/// `now_ms << 20` plus a per-process count: ids stay unique across restarts as long as a
/// process does not average over a million requests per millisecond, and the order they
/// give is the order requests started within a process.
pub fn next_request_id() -> i64 {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let floor = now_ms() << 20;
    let previous = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(floor.max(last + 1))
        })
        .unwrap_or_else(|last| last);
    floor.max(previous + 1)
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
    use std::str::FromStr;

    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::SqlitePool;

    use super::*;

    fn request(id: i64) -> Record {
        Record::Request(Box::new(RequestRow::sample(id)))
    }

    /// Which backend a test runs on: the log tests run on both ([`on_both_backends`]).
    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Sqlite,
        Postgres,
    }

    /// A store in a new database, and the directory holding it (SQLite).
    struct Opened {
        store: Store,
        _dir: tempfile::TempDir,
    }

    impl std::ops::Deref for Opened {
        type Target = Store;
        fn deref(&self) -> &Store {
            &self.store
        }
    }

    async fn open(kind: Kind, queue_capacity: usize, batch_window: Duration) -> Opened {
        let dir = tempfile::tempdir().unwrap();
        let url = match kind {
            Kind::Sqlite => format!("sqlite://{}", dir.path().join("t.db").display()),
            Kind::Postgres => test_postgres().await.unwrap(),
        };
        let store = Store::open(
            &url,
            StoreOptions {
                queue_capacity,
                batch_size: 64,
                batch_window,
                retry_rows: 65_536,
            },
        )
        .await
        .unwrap();
        Opened { store, _dir: dir }
    }

    /// For each `async fn name(kind: Kind)`, the tests `name::sqlite` and `name::postgres`.
    macro_rules! on_both_backends {
        ($($name:ident),* $(,)?) => {$(
            mod $name {
                #[tokio::test]
                async fn sqlite() {
                    super::$name(super::Kind::Sqlite).await
                }
                #[tokio::test]
                #[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
                async fn postgres() {
                    super::$name(super::Kind::Postgres).await
                }
            }
        )*};
    }

    on_both_backends!(
        a_full_queue_drops_and_counts_instead_of_waiting,
        a_failed_write_is_counted_and_the_log_goes_on,
        a_batchs_sightings_of_a_conversation_leave_the_row_one_by_one_would,
        a_batchs_rows_of_a_tool_call_leave_the_row_one_by_one_would,
        a_batchs_request_rows_are_those_written_one_by_one,
        a_batchs_findings_are_those_written_one_by_one,
        the_overhead_figures_read_the_latest_requests,
        deferred_entries_are_written_and_one_that_fails_loses_only_itself,
        controls_are_stored_unless_a_newer_one_is,
        the_dashboard_reads_the_same_on_both_backends,
        runs_are_read_back_as_written,
    );

    async fn runs_are_read_back_as_written(kind: Kind) {
        let store = open(kind, 64, StoreOptions::BATCH_WINDOW).await;
        super::runs::tests::runs_are_read_back_as_written(&store).await;
    }

    /// Runs a query (an expression of `sqlx::query*`) on the store's database, whichever it
    /// is: the expression is typed once per backend. Test SQL uses `$n` parameters, which
    /// both read as positional.
    macro_rules! fetch {
        ($store:expr, $query:expr, $how:ident) => {
            match &$store.backend {
                Backend::Sqlite(db) => $query.$how(&db.pool()).await.unwrap(),
                Backend::Postgres(db) => $query.$how(db.pool()).await.unwrap(),
            }
        };
    }

    /// Runs a statement on the store's database.
    macro_rules! execute {
        ($store:expr, $sql:expr) => {
            match &$store.backend {
                Backend::Sqlite(db) => drop(sqlx::query($sql).execute(&db.pool()).await.unwrap()),
                Backend::Postgres(db) => drop(sqlx::query($sql).execute(db.pool()).await.unwrap()),
            }
        };
    }

    async fn a_full_queue_drops_and_counts_instead_of_waiting(kind: Kind) {
        // The writer gathers until a flush (the window never ends in this test), so the
        // queue fills up: the caller must never wait for it.
        let store = open(kind, 4, Duration::from_secs(3600)).await;
        for id in 1..=100 {
            store.log(request(id));
        }
        store.flush().await;
        let health = store.health();
        assert_eq!(health.dropped, 96);
        assert_eq!(health.written, 4);
        let n: i64 = fetch!(
            store,
            sqlx::query_scalar("SELECT count(*) FROM requests"),
            fetch_one
        );
        assert_eq!(n, 4);
    }

    /// A write that fails for a while keeps its records (the newest `retry_rows` of them)
    /// and writes them once it succeeds; flushes wait for that.
    #[tokio::test]
    async fn records_of_failing_writes_are_kept_up_to_the_bound_and_written_later() {
        let written: Arc<std::sync::Mutex<Vec<i64>>> = Arc::default();
        let got = written.clone();
        let options = StoreOptions {
            queue_capacity: 64,
            batch_size: 64,
            batch_window: Duration::from_millis(20),
            retry_rows: 3,
        };
        let handle = writer::start(&options, move |queue| {
            let mut attempts = 0;
            let stop = writer::run(queue, &mut writer::Unwritten::default(), &mut |records| {
                attempts += 1;
                if attempts <= 2 {
                    return Err(writer::Failure::Transient(anyhow::anyhow!("locked")));
                }
                let ids = records.iter().filter_map(|r| match r {
                    Record::Request(r) => Some(r.id),
                    _ => None,
                });
                got.lock().unwrap().extend(ids);
                Ok(())
            });
            assert_eq!(stop, writer::Stop::Closed);
        })
        .unwrap();
        for id in 1..=5 {
            assert!(handle.queue.push(Entry::Record(request(id))));
        }
        let (done, wait) = oneshot::channel();
        assert!(handle.queue.flush(done));
        wait.await.unwrap();
        assert_eq!(*written.lock().unwrap(), vec![3, 4, 5]);
        let counters = &handle.queue.counters;
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(
            (
                count(&counters.written),
                count(&counters.failed),
                count(&counters.retried)
            ),
            (3, 2, 2)
        );
    }

    async fn a_failed_write_is_counted_and_the_log_goes_on(kind: Kind) {
        let store = open(kind, 64, StoreOptions::BATCH_WINDOW).await;
        execute!(store, "ALTER TABLE requests RENAME TO requests_gone");
        store.log(request(1));
        store.flush().await;
        assert_eq!(store.health().failed, 1);
        execute!(store, "ALTER TABLE requests_gone RENAME TO requests");
        store.log(request(2));
        store.flush().await;
        assert_eq!(store.health().written, 1);
    }

    #[test]
    fn request_ids_increase_and_carry_the_time() {
        let before = now_ms();
        let ids: Vec<i64> = (0..1000).map(|_| next_request_id()).collect();
        let after = now_ms();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "not increasing");
        for id in [ids[0], ids[999]] {
            // Another test's ids may run ahead of the clock, by their count at most.
            assert!((before..=after + 1).contains(&(id >> 20)), "{id}");
        }
        // From several threads at once: no id twice.
        let threads: Vec<_> = (0..4)
            .map(|i| {
                crate::spawn::thread(format!("ids-{i}"), || {
                    (0..1000).map(|_| next_request_id()).collect::<Vec<_>>()
                })
                .unwrap()
            })
            .collect();
        let mut all: Vec<i64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 4000);
    }

    type ConversationRow = (
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        i64,
        i64,
        i64,
    );

    async fn conversation_row(store: &Store) -> ConversationRow {
        const SQL: &str = "SELECT id_source, client, dialect, model, first_seen_ms, last_seen_ms,
                 requests
             FROM conversations WHERE id = 'c'";
        fetch!(store, sqlx::query_as(SQL), fetch_one)
    }

    async fn a_batchs_sightings_of_a_conversation_leave_the_row_one_by_one_would(kind: Kind) {
        let seen =
            |client: Option<&str>, dialect: Option<&'static str>, model: Option<&str>, at_ms| {
                Record::Conversation(ConversationSeen {
                    id: "c".into(),
                    id_source: "head_hash".into(),
                    client: client.map(Into::into),
                    dialect: dialect.map(Label::from),
                    model: model.map(Into::into),
                    at_ms,
                    overhead_us: at_ms * 10,
                    team: None,
                })
            };
        // Finished in this order, started out of it.
        let sightings = [
            seen(None, None, Some("m1"), 20),
            seen(Some("claude-cli"), Some("anthropic"), None, 10),
            seen(Some("other"), None, Some("m2"), 30),
            seen(None, Some("openai_chat"), None, 25),
        ];
        let (one_batch, each_alone) = one_batch_and_one_by_one(kind, &sightings).await;
        let row = conversation_row(&one_batch).await;
        assert_eq!(row, conversation_row(&each_alone).await);
        assert_eq!(
            row,
            (
                "head_hash".into(),
                Some("claude-cli".into()),
                Some("openai_chat".into()),
                Some("m2".into()),
                20,
                30,
                4
            )
        );
        assert_eq!(one_batch.health().written, 4);
        // A later batch adds to the row.
        one_batch.log(seen(None, None, None, 40));
        one_batch.log(seen(None, None, None, 35));
        one_batch.flush().await;
        let row = conversation_row(&one_batch).await;
        assert_eq!((row.4, row.5, row.6), (20, 40, 6));
        // The overheads are summed as they come, batched or not, and the conversation list
        // shows their mean without reading the requests (none were logged here).
        const SUM: &str = "SELECT proxy_overhead_us_sum FROM conversations";
        let sum: i64 = fetch!(each_alone, sqlx::query_scalar(SUM), fetch_one);
        assert_eq!(sum, (20 + 10 + 30 + 25) * 10);
        let sum: i64 = fetch!(one_batch, sqlx::query_scalar(SUM), fetch_one);
        assert_eq!(sum, (20 + 10 + 30 + 25 + 40 + 35) * 10);
        let listed = one_batch.conversations(10).await.unwrap();
        assert_eq!(listed[0].mean_proxy_overhead_us, Some(1600.0 / 6.0));
    }

    /// A log in a new directory (`t.db`) as the first `last` migrations left it, for a
    /// test of what opening it with this version does.
    async fn log_migrated_to(last: usize) -> (tempfile::TempDir, SqlitePool) {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old-migrations");
        std::fs::create_dir(&old).unwrap();
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut names: Vec<_> = std::fs::read_dir(&here)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in &names[..last] {
            std::fs::copy(here.join(name), old.join(name)).unwrap();
        }
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let options = SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true);
        let pool = SqlitePool::connect_with(options).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        (dir, pool)
    }

    #[tokio::test]
    async fn a_log_from_before_the_running_sum_is_summed_once_when_it_is_opened() {
        // A log as the migrations before the sum left it, holding two requests of one
        // conversation; opening it with this version applies the new migration only.
        let (dir, pool) = log_migrated_to(3).await;
        sqlx::query(
            "INSERT INTO conversations (id, id_source, first_seen_ms, last_seen_ms, requests)
             VALUES ('c', 'path', 1, 2, 2), ('quiet', 'path', 1, 1, 0)",
        )
        .execute(&pool)
        .await
        .unwrap();
        for (id, overhead) in [(1, 30), (2, 50)] {
            sqlx::query(
                "INSERT INTO requests (id, conversation_id, started_ms, method, path, upstream,
                   stream, parse, applied, status, outcome, request_bytes, response_bytes,
                   proxy_overhead_us)
                 VALUES (?1, 'c', ?1, 'POST', '/v1/messages', 'anthropic', 0, 'parsed',
                   'forwarded', 200, 'complete', 1, 1, ?2)",
            )
            .bind(id)
            .bind(overhead)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;

        let store = open_sqlite(&dir).await;
        let listed = store.conversations(10).await.unwrap();
        let mean = |id: &str| {
            listed
                .iter()
                .find(|c| c.id == id)
                .map(|c| c.mean_proxy_overhead_us)
        };
        assert_eq!(mean("c"), Some(Some(40.0)));
        assert_eq!(mean("quiet"), Some(None), "no requests, no mean");
    }

    #[tokio::test]
    async fn a_log_from_before_the_one_vocabulary_says_what_was_applied_in_it() {
        // A log as migrations 1-4 left it: requests and decisions said how the request
        // went, the intervention log what was done.
        let (dir, pool) = log_migrated_to(4).await;
        // 1 forwarded, 2 nudged, 3 halted, 4 held then nudged by a human, 5 an answer the
        // intervention log does not name.
        for (id, applied) in [
            (1, "forwarded"),
            (2, "forwarded_modified"),
            (3, "answered"),
            (4, "forwarded_modified"),
            (5, "answered"),
        ] {
            sqlx::query(
                "INSERT INTO requests (id, conversation_id, started_ms, method, path, upstream,
                   stream, parse, applied, status, outcome, request_bytes, response_bytes,
                   proxy_overhead_us)
                 VALUES (?1, 'c', ?1, 'POST', '/v1/messages', 'anthropic', 0, 'parsed',
                   ?2, 200, 'complete', 1, 1, 0)",
            )
            .bind(id)
            .bind(applied)
            .execute(&pool)
            .await
            .unwrap();
            if id > 1 {
                sqlx::query(
                    "INSERT INTO decisions (request_id, conversation_id, created_ms, action,
                       applied, step, reason) VALUES (?1, 'c', ?1, 'x', ?2, 1, '')",
                )
                .bind(id)
                .bind(applied)
                .execute(&pool)
                .await
                .unwrap();
            }
        }
        for (request, applied) in [(2, "nudged"), (3, "halted"), (4, "held"), (4, "nudged")] {
            sqlx::query(
                "INSERT INTO interventions (conversation_id, request_id, created_ms, action,
                   applied, source, detector, reason, finding)
                 VALUES ('c', ?1, 0, 'x', ?2, 'policy', '', '', '')",
            )
            .bind(request)
            .bind(applied)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;

        let store = open_sqlite(&dir).await;
        let Backend::Sqlite(db) = &store.backend else {
            unreachable!()
        };
        let pool = db.pool();
        let column = |table: &str| {
            let sql = match table {
                "requests" => "SELECT applied FROM requests ORDER BY id",
                _ => "SELECT applied FROM decisions ORDER BY request_id",
            };
            sqlx::query_scalar::<_, String>(sql).fetch_all(&pool)
        };
        let want = ["forwarded", "nudged", "halted", "nudged", "halted"];
        assert_eq!(column("requests").await.unwrap(), want);
        assert_eq!(column("decisions").await.unwrap(), want[1..]);
    }

    /// The SQLite log `t.db` in `dir` (made by [`log_migrated_to`]), opened by this version.
    async fn open_sqlite(dir: &tempfile::TempDir) -> Store {
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let options = StoreOptions {
            queue_capacity: 64,
            batch_size: 64,
            batch_window: Duration::from_millis(10),
            retry_rows: 64,
        };
        Store::open(&url, options).await.unwrap()
    }

    /// `records` written by two logs: in one batch (the writer gathers until the flush),
    /// and one by one (a flush after each).
    async fn one_batch_and_one_by_one(kind: Kind, records: &[Record]) -> (Opened, Opened) {
        let one_batch = open(kind, 64, Duration::from_secs(3600)).await;
        let each_alone = open(kind, 64, Duration::from_secs(3600)).await;
        for r in records {
            one_batch.log(r.clone());
            each_alone.log(r.clone());
            each_alone.flush().await;
        }
        one_batch.flush().await;
        (one_batch, each_alone)
    }

    async fn tool_call_rows(store: &Store) -> Vec<ToolCallRow> {
        const SQL: &str = "SELECT * FROM tool_calls ORDER BY conversation_id, step, call_index";
        fetch!(store, sqlx::query_as(SQL), fetch_all)
    }

    async fn a_batchs_rows_of_a_tool_call_leave_the_row_one_by_one_would(kind: Kind) {
        let call = |step, request_id, result: Option<(&str, bool)>| {
            Record::ToolCall(Box::new(ToolCallRow {
                conversation_id: "c".into(),
                step,
                call_index: 0,
                call_id: format!("call_{request_id}").into(),
                name: "Bash".into(),
                args_hash: format!("h{request_id}"),
                summary: format!("Bash: run {request_id}").into(),
                result_hash: result.map(|(h, _)| h.into()),
                result_summary: result.map(|(h, _)| format!("out {h}").into()),
                is_error: result.map(|(_, e)| e),
                request_id,
                seen_ms: request_id,
            }))
        };
        // Step 1: made by a response, completed by the next request's history, seen again
        // without a result by a repeated request. Step 2: two results, the last one stays.
        // Step 3: only ever seen without a result.
        let rows = [
            call(1, 1, None),
            call(2, 1, Some(("r1", true))),
            call(1, 2, Some(("r2", false))),
            call(3, 2, None),
            call(1, 3, None),
            call(2, 3, Some(("r3", false))),
            call(3, 4, None),
        ];
        let (one_batch, each_alone) = one_batch_and_one_by_one(kind, &rows).await;
        let merged = tool_call_rows(&one_batch).await;
        assert_eq!(merged, tool_call_rows(&each_alone).await);
        let summary: Vec<_> = merged
            .iter()
            .map(|t| {
                (
                    t.step,
                    t.request_id,
                    t.call_id.as_str(),
                    t.result_hash.as_deref(),
                    t.is_error,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (1, 3, "call_3", Some("r2"), Some(false)),
                (2, 3, "call_3", Some("r3"), Some(false)),
                (3, 4, "call_4", None, None),
            ]
        );
        assert_eq!(one_batch.health().written, 7);
        // A later batch without a result keeps the one already written.
        one_batch.log(call(2, 5, None));
        one_batch.flush().await;
        let row = &tool_call_rows(&one_batch).await[1];
        assert_eq!(
            (row.request_id, row.result_summary.as_deref()),
            (5, Some("out r3"))
        );
    }

    async fn request_rows(store: &Store) -> Vec<serde_json::Value> {
        let rows: Vec<RequestRow> = fetch!(
            store,
            sqlx::query_as("SELECT * FROM requests ORDER BY id"),
            fetch_all
        );
        rows.iter()
            .map(|r| serde_json::to_value(r).unwrap())
            .collect()
    }

    async fn a_batchs_request_rows_are_those_written_one_by_one(kind: Kind) {
        // 47 rows in one batch (five inserts of 8 rows, then 4, 2 and 1), of which two repeat an
        // id: the later row replaces the earlier, in the same insert (7 after 3) or across
        // two (40 after 5). Rows differ in every column that can be NULL.
        let row = |n: i64, id: i64| {
            let Record::Request(mut r) = request(id) else {
                unreachable!()
            };
            r.conversation_id = format!("c{}", n % 3);
            r.started_ms = 1000 + n;
            r.dialect = (n % 2 == 0).then(|| "openai_chat".into());
            r.model = (n % 3 == 0).then(|| format!("m{n}"));
            r.stream = n % 2 == 1;
            r.parse_error = (n % 5 == 0).then(|| format!("error {n}").into());
            r.steps = (n % 4 != 0).then_some(n);
            r.decision = (n % 6 != 0).then(|| "observe".into());
            r.outcome = format!("outcome {n}").into();
            r.upstream_latency_us = (n % 7 != 0).then_some(n * 10);
            r.input_tokens = (n % 2 == 0).then_some(n * 100);
            r.output_tokens = (n % 3 == 0).then_some(n);
            r.stop_reason = (n % 2 == 1).then(|| "tool_calls".into());
            Record::Request(r)
        };
        let rows: Vec<Record> = (1..=47)
            .map(|n| {
                let id = match n {
                    7 => 3,
                    40 => 5,
                    n => n,
                };
                row(n, id)
            })
            .collect();
        let (one_batch, each_alone) = one_batch_and_one_by_one(kind, &rows).await;
        let written = request_rows(&one_batch).await;
        assert_eq!(written, request_rows(&each_alone).await);
        assert_eq!(written.len(), 45);
        assert_eq!(written[2]["outcome"], "outcome 7");
        assert_eq!(written[4]["outcome"], "outcome 40");
        assert_eq!(written[4]["model"], serde_json::Value::Null);
        assert_eq!(written[44]["stop_reason"], "tool_calls");
        assert_eq!(one_batch.health().written, 47);
    }

    /// Every column of the findings, id first, in id order.
    #[allow(clippy::type_complexity)]
    async fn finding_rows(
        store: &Store,
    ) -> Vec<(
        i64,
        i64,
        String,
        i64,
        String,
        f64,
        Option<i64>,
        String,
        String,
        String,
    )> {
        const SQL: &str = "SELECT id, request_id, conversation_id, created_ms, detector,
                    confidence, step, steps, summary, suggestion
             FROM findings ORDER BY id";
        fetch!(store, sqlx::query_as(SQL), fetch_all)
    }

    async fn a_batchs_findings_are_those_written_one_by_one(kind: Kind) {
        // 31 findings in one batch (three inserts of 8 rows, then 4, 2 and 1), between
        // requests and a decision, differing in every column; ids follow the order logged.
        let finding = |n: i64| {
            Record::Finding(Box::new(FindingRow {
                request_id: n / 3,
                conversation_id: format!("c{}", n % 4),
                created_ms: 1000 + n,
                detector: ["repeat", "goal_drift", "oscillation"][n as usize % 3].into(),
                confidence: n as f64 / 40.0,
                step: (n % 5 != 0).then_some(n),
                steps: format!("[{}]", n),
                summary: format!("summary {n}").into(),
                suggestion: format!("suggestion {n}").into(),
            }))
        };
        let mut records: Vec<Record> = (1..=31).map(finding).collect();
        records.insert(10, request(1));
        records.insert(
            20,
            Record::Decision(Box::new(DecisionRow {
                request_id: 2,
                conversation_id: "c2".into(),
                created_ms: 1020,
                action: "nudge".into(),
                applied: "nudged".into(),
                step: Some(3),
                reason: "repeat".into(),
                policy: Some("ci".into()),
            })),
        );
        let (one_batch, each_alone) = one_batch_and_one_by_one(kind, &records).await;
        let (written, alone) = (
            finding_rows(&one_batch).await,
            finding_rows(&each_alone).await,
        );
        assert_eq!(written, alone);
        assert_eq!(written.len(), 31);
        for (i, row) in written.iter().enumerate() {
            let n = i as i64 + 1;
            assert_eq!((row.0, row.1, &row.8), (n, n / 3, &format!("summary {n}")));
        }
        assert_eq!(written[4].6, None);
        assert_eq!(one_batch.health().written, 33);
    }

    async fn the_overhead_figures_read_the_latest_requests(kind: Kind) {
        let store = open(kind, 64, StoreOptions::BATCH_WINDOW).await;
        // Ids in start order, as `next_request_id` gives them; overheads 10, 20, ... 100.
        for id in 1..=10 {
            let Record::Request(mut r) = request(id) else {
                unreachable!()
            };
            r.proxy_overhead_us = id * 10;
            r.body_read_us = Some(id);
            store.log(Record::Request(r));
        }
        store.flush().await;
        let stats = store.overhead(3).await.unwrap();
        assert_eq!(stats.requests, 3);
        assert_eq!(stats.overhead.p50_us, Some(90));
        assert_eq!(stats.overhead.max_us, Some(100));
        assert_eq!(stats.after_body_read.max_us, Some(90));
        // In SQLite, the plan walks the rowid B-tree from its end: no sort of the whole table.
        let Backend::Sqlite(db) = &store.backend else {
            return;
        };
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {}", read::OVERHEAD_SQL))
                .bind(3)
                .fetch_all(&db.pool())
                .await
                .unwrap();
        let plan: Vec<&str> = plan.iter().map(|(.., detail)| detail.as_str()).collect();
        assert!(
            plan.iter().all(|step| !step.contains("TEMP B-TREE")),
            "{plan:?}"
        );
    }

    /// A finished request's rows, worked out on the writer thread.
    struct Rows(Vec<i64>);

    impl Deferred for Rows {
        fn records(self: Box<Self>, out: &mut Vec<Record>) {
            assert!(!self.0.is_empty(), "a bug in working out the rows");
            out.extend(self.0.into_iter().map(request));
        }
    }

    async fn deferred_entries_are_written_and_one_that_fails_loses_only_itself(kind: Kind) {
        let store = open(kind, 64, StoreOptions::BATCH_WINDOW).await;
        store.log_deferred(Box::new(Rows(vec![1, 2])));
        store.log_deferred(Box::new(Rows(vec![])));
        store.log(request(3));
        store.flush().await;
        let health = store.health();
        assert_eq!((health.written, health.failed), (3, 1));
        let ids: Vec<i64> = fetch!(
            store,
            sqlx::query_scalar("SELECT id FROM requests ORDER BY id"),
            fetch_all
        );
        assert_eq!(ids, vec![1, 2, 3]);
        // The writer is still there after the failure.
        store.log_deferred(Box::new(Rows(vec![4])));
        store.flush().await;
        assert_eq!(store.health().written, 4);
    }

    async fn controls_are_stored_unless_a_newer_one_is(kind: Kind) {
        let store = open(kind, 64, StoreOptions::BATCH_WINDOW).await;
        let control = |halted, updated_ms| Control {
            conversation_id: "c".into(),
            halted,
            reason: "looping".into(),
            source: "operator".into(),
            humans_at_halt: Some(2),
            resume_pending: !halted,
            resumed_at: "[]".into(),
            updated_ms,
            run_steps: Some(4),
            run_digest: Some("d".into()),
        };
        store.save_control(&control(true, 10)).await.unwrap();
        store.save_control(&control(false, 5)).await.unwrap();
        assert_eq!(store.controls().await.unwrap(), vec![control(true, 10)]);
        store.save_control(&control(false, 11)).await.unwrap();
        assert_eq!(store.controls().await.unwrap(), vec![control(false, 11)]);
    }

    /// The dashboard's SQL (`dashboard_sql`) runs on both backends and reads the same: the
    /// filtered list, a conversation's alerts, a verdict and the precision it makes, the
    /// interventions per bucket, the halted runs and the totals.
    async fn the_dashboard_reads_the_same_on_both_backends(kind: Kind) {
        use crate::store::dashboard::{ConversationFilter, Target, Verdict};
        let store = open(kind, 64, StoreOptions::BATCH_WINDOW).await;
        let mut row = RequestRow::sample(1 << 20);
        row.conversation_id = "run-1".into();
        row.started_ms = 1000;
        row.policy = Some("ci".into());
        row.decision = Some("halt".into());
        row.steps = Some(4);
        row.cost_usd = Some(0.25);
        store.log(Record::Request(Box::new(row)));
        store.log(Record::Conversation(ConversationSeen {
            id: "run-1".into(),
            id_source: "path".into(),
            client: Some("claude-cli".into()),
            dialect: Some("anthropic".into()),
            model: Some("claude-test".into()),
            at_ms: 1000,
            overhead_us: 10,
            team: Some("ci".into()),
        }));
        store.log(Record::Finding(Box::new(FindingRow {
            request_id: 1 << 20,
            conversation_id: "run-1".into(),
            created_ms: 1000,
            detector: "fail_loop".into(),
            confidence: 0.9,
            step: Some(3),
            steps: "[1,2,3]".into(),
            summary: "failed 3 times".into(),
            suggestion: "change something".into(),
        })));
        let intervention = |action: &str, applied: &str, source: &str, at: i64| {
            Record::Intervention(Box::new(InterventionRow {
                conversation_id: "run-1".into(),
                request_id: Some(1 << 20),
                created_ms: at,
                action: action.into(),
                applied: applied.into(),
                source: source.into(),
                detector: if action == "halt" {
                    "fail_loop".into()
                } else {
                    String::new()
                },
                reason: "looping".into(),
                finding: "".into(),
                policy: Some("ci".into()),
            }))
        };
        store.log(intervention("halt", "halted", "policy", 2000));
        store.log(intervention("resume", "resumed", "operator", 3000));
        store.flush().await;

        let ci = ConversationFilter {
            team: Some("ci".into()),
            ..ConversationFilter::default()
        };
        let listed = store.listed_conversations(&ci, 10).await.unwrap();
        assert_eq!(listed.len(), 1, "{kind:?}");
        let other = ConversationFilter {
            policy: Some("dev".into()),
            ..ConversationFilter::default()
        };
        assert!(store
            .listed_conversations(&other, 10)
            .await
            .unwrap()
            .is_empty());
        let alerts = store.alerts("run-1").await.unwrap();
        assert_eq!(
            (alerts.findings.len(), alerts.interventions.len()),
            (1, 2),
            "{kind:?}"
        );
        // The halt a human lifted counts wrong for its detector until someone says otherwise.
        let implied = store.precision(None).await.unwrap();
        let fail_loop = implied.iter().find(|p| p.detector == "fail_loop").unwrap();
        assert_eq!(
            (fail_loop.right, fail_loop.wrong, fail_loop.implied_wrong),
            (0, 1, 1)
        );
        let finding = serde_json::to_value(&alerts.findings[0]).unwrap()["id"]
            .as_i64()
            .unwrap();
        let recorded = store
            .give_feedback(Target::Finding(finding), Verdict::Right, "it was stuck")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(recorded.detector, "fail_loop");
        assert!(store
            .give_feedback(Target::Finding(finding + 1000), Verdict::Right, "")
            .await
            .unwrap()
            .is_none());
        // Each figure for every team (`None`), for the conversation's team, and for another
        // team, which sees none of it.
        for (team, seen) in [(None, 1), (Some("ci"), 1), (Some("payments"), 0)] {
            let after = store.precision(team).await.unwrap();
            let fail_loop = after.iter().find(|p| p.detector == "fail_loop");
            let votes = fail_loop.map_or((0, 0), |p| (p.right, p.wrong));
            assert_eq!(votes, (seen, seen), "{kind:?} {team:?}");
            let counts = store.intervention_counts(0, 3_600_000, team).await.unwrap();
            assert_eq!(
                counts.len() as i64,
                seen,
                "the policy's halt, not the operator's resume: {kind:?} {team:?}"
            );
            let halted = store.halted_runs(0, team).await.unwrap();
            assert_eq!(halted.len() as i64, seen, "{kind:?} {team:?}");
            let totals = store.totals(0, team).await.unwrap();
            assert_eq!(
                (totals.requests, totals.conversations),
                (seen, seen),
                "{kind:?} {team:?}"
            );
        }
        let halted = store.halted_runs(0, None).await.unwrap();
        assert_eq!(halted[0].resumed_ms, Some(3000));
        assert_eq!(
            store.conversation_team("run-1").await.unwrap(),
            Some(Some("ci".into()))
        );
        assert_eq!(store.conversation_team("nope").await.unwrap(), None);
        assert_eq!(
            store
                .alert_conversation(Target::Finding(finding))
                .await
                .unwrap(),
            Some("run-1".into())
        );
        assert_eq!(
            store.team_conversations("ci", 0).await.unwrap(),
            vec!["run-1".to_string()]
        );
    }

    /// PostgreSQL's tables of state shared by replicas (`migrations/postgres/0010_*`), which
    /// one process keeps in memory: not log tables, not in SQLite.
    const SHARED_ONLY: &[&str] = &["replica_spend", "pending_requests", "replicas"];

    /// Every log table's columns, by name, as `(table, column)` in order.
    async fn columns(store: &Store) -> Vec<(String, String)> {
        let mut columns: Vec<(String, String)> = match &store.backend {
            Backend::Sqlite(db) => {
                sqlx::query_as(
                    "SELECT m.name, p.name FROM sqlite_master m, pragma_table_info(m.name) p
                     WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'
                       AND m.name NOT LIKE '_sqlx%'",
                )
                .fetch_all(&db.pool())
                .await
            }
            Backend::Postgres(db) => {
                sqlx::query_as(
                    "SELECT table_name::TEXT, column_name::TEXT FROM information_schema.columns
                     WHERE table_schema = 'public' AND table_name NOT LIKE '_sqlx%'
                       AND table_name <> ALL($1)",
                )
                .bind(SHARED_ONLY)
                .fetch_all(db.pool())
                .await
            }
        }
        .unwrap();
        columns.sort();
        columns
    }

    /// The two backends' migrations make the same tables with the same columns (their
    /// meanings: `migrations/`, which `migrations/postgres/` follows).
    #[tokio::test]
    #[ignore = "needs PostgreSQL (LW_TEST_POSTGRES): cargo test -- --include-ignored"]
    async fn both_backends_have_the_same_columns() {
        let postgres = open(Kind::Postgres, 4, StoreOptions::BATCH_WINDOW).await;
        let sqlite = open(Kind::Sqlite, 4, StoreOptions::BATCH_WINDOW).await;
        let (in_sqlite, in_postgres) = (columns(&sqlite).await, columns(&postgres).await);
        assert!(in_sqlite.len() > 60, "{in_sqlite:?}");
        assert_eq!(in_sqlite, in_postgres);
    }
}
