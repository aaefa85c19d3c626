//! The SQLite batch writer: the statements the log's writer thread runs on its own
//! connection (rusqlite), prepared once each, and how a batch's records become rows.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{params, Connection, OpenFlags, Statement, ToSql};

use super::Database;
use crate::store::batch::{Batch, CallUpdates, Sightings};
use crate::store::runs::{self, RunRecord};
use crate::store::writer::{self, Failure, Queue, Stop, Unwritten};
use crate::store::{FindingRow, Record, RequestRow};

/// Waited between attempts to make a new database when the file was deleted.
const REOPEN_RETRY: Duration = Duration::from_secs(2);

/// The writer thread's body: batch after batch on its own connection (from [`open`]), with
/// statements prepared once on it. Before each write the file at the path is checked to be
/// the one open: a database deleted (or replaced) under the proxy would otherwise be
/// written on, unseen, until the proxy stops. Then the connection is closed and a new
/// database is made at the path, where the writing goes on.
pub(crate) fn run(mut conn: Connection, db: &Database, queue: &Queue) {
    let path = db.path();
    let mut unwritten = Unwritten::default();
    loop {
        let file = FileId::of(path);
        let stop = {
            let mut statements = Statements::new(&conn);
            writer::run(queue, &mut unwritten, &mut |records| {
                if file.is_some() && FileId::of(path) != file {
                    return Err(Failure::Reopen);
                }
                write_batch(&conn, &mut statements, records).map_err(failure)
            })
        };
        if stop == Stop::Closed {
            return;
        }
        tracing::error!(path = %path.display(), "the log's database file was deleted or replaced under the proxy: making a new one there");
        drop(conn);
        conn = match reopen(db, queue) {
            Some(conn) => conn,
            None => return unwritten.spill_rest(queue),
        };
    }
}

/// A new database at the path and the writer's connection to it, tried again every
/// [`REOPEN_RETRY`]; `None` if the log closes first.
fn reopen(db: &Database, queue: &Queue) -> Option<Connection> {
    loop {
        let made = db
            .recreate()
            .and_then(|()| open(db.path()).map_err(anyhow::Error::from));
        match made {
            Ok(conn) => {
                queue.counters.reopened.fetch_add(1, Ordering::Relaxed);
                tracing::info!(path = %db.path().display(), "new log database made");
                return Some(conn);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot make a new log database; trying again");
                if queue.is_closed() {
                    return None;
                }
                std::thread::sleep(REOPEN_RETRY);
            }
        }
    }
}

/// Which file a path names (device and inode): after the database is deleted or replaced,
/// another or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    device: u64,
    inode: u64,
}

impl FileId {
    #[cfg(unix)]
    fn of(path: &Path) -> Option<FileId> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileId {
            device: meta.dev(),
            inode: meta.ino(),
        })
    }

    /// Elsewhere the file is not watched.
    #[cfg(not(unix))]
    fn of(_: &Path) -> Option<FileId> {
        None
    }
}

/// Whether a failed write may succeed if tried again: the database locked (another
/// process holds it longer than the busy timeout), the disk full, an I/O error. Anything
/// else (a constraint, a missing table) would fail the same way.
fn failure(e: rusqlite::Error) -> Failure {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::OutOfMemory,
        ) => Failure::Transient(e.into()),
        _ => Failure::Permanent(e.into()),
    }
}

/// The writer's connection: the database was created and migrated by the read side.
pub(crate) fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    // The read side's connections (sqlx) may hold the write lock for a moment.
    conn.busy_timeout(Duration::from_secs(5))?;
    // WAL (set at open, persistent) + NORMAL: durable across process crashes.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

/// The statements the writer runs, each prepared once and kept for the connection's life.
///
/// `prepare_cached` found each statement by hashing its SQL text and, when the statement
/// was handed back, cleared its bindings and reinserted it in the cache: about 3,400
/// instructions per statement run, nearly a tenth of the log thread's work per request
/// (BENCHMARKS.md, "The log thread (session 4)"). A kept statement survives schema
/// changes: SQLite prepares it again when the schema it was prepared against changes.
struct Statements<'c> {
    conn: &'c Connection,
    prepared: [Option<Statement<'c>>; Sql::COUNT],
    /// `requests[k]` inserts 2^k request rows ([`write_chunked`]).
    requests: Chunks<'c>,
    /// `findings[k]` inserts 2^k findings.
    findings: Chunks<'c>,
}

/// The rows that are many per batch go in by INSERTs of up to 2^(CHUNKS - 1) rows each (a
/// batch of 13: 8 + 4 + 1): a statement run cost about 5,500 instructions beyond binding its
/// row (the program started and halted, a statement journal opened and closed), more than
/// inserting the row. For findings, whose ids are AUTOINCREMENT, each run also reads and
/// rewrites the table's `sqlite_sequence` entry, ~4,500 more. Larger inserts gained little
/// more and cost more in binding: their bound strings outgrow SQLite's per-connection
/// lookaside memory and go to malloc. The values are the same as one row at a time.
const CHUNKS: usize = 4;

/// A table's multi-row inserts, by the power of two of their rows.
type Chunks<'c> = [Option<Statement<'c>>; CHUNKS];

/// A row that goes in by [`write_chunked`]'s multi-row INSERTs.
trait ChunkedRow {
    /// Where the table's inserts are kept.
    fn chunks<'s, 'c>(statements: &'s mut Statements<'c>) -> &'s mut Chunks<'c>;
    const COLUMNS: usize;
    /// The INSERT up to `VALUES`, naming the columns in [`ChunkedRow::bind`]'s order.
    const INSERT: &'static str;
    /// Binds the row to the insert's parameters from `first` (1-based) on.
    fn bind(&self, stmt: &mut Statement<'_>, first: usize) -> rusqlite::Result<()>;
}

/// A row whose id is already in (also earlier in the same statement) replaces it, as it
/// did one by one.
impl ChunkedRow for RequestRow {
    const COLUMNS: usize = 31;
    const INSERT: &'static str = "INSERT OR REPLACE INTO requests
           (id, conversation_id, started_ms, method, path, upstream, dialect, model,
            stream, parse, parse_error, steps, decision, applied, status, outcome,
            request_bytes, response_bytes, upstream_latency_us, upstream_total_us,
            proxy_overhead_us, body_read_us, input_tokens, output_tokens, stop_reason,
            cached_input_tokens, cache_write_tokens, cost_usd, policy, compaction, stated_id)";

    fn chunks<'s, 'c>(statements: &'s mut Statements<'c>) -> &'s mut Chunks<'c> {
        &mut statements.requests
    }

    fn bind(&self, stmt: &mut Statement<'_>, first: usize) -> rusqlite::Result<()> {
        let r = self;
        let values: [&dyn ToSql; Self::COLUMNS] = [
            &r.id,
            &r.conversation_id,
            &r.started_ms,
            &r.method,
            &r.path,
            &r.upstream,
            &r.dialect,
            &r.model,
            &r.stream,
            &r.parse,
            &r.parse_error,
            &r.steps,
            &r.decision,
            &r.applied,
            &r.status,
            &r.outcome,
            &r.request_bytes,
            &r.response_bytes,
            &r.upstream_latency_us,
            &r.upstream_total_us,
            &r.proxy_overhead_us,
            &r.body_read_us,
            &r.input_tokens,
            &r.output_tokens,
            &r.stop_reason,
            &r.cached_input_tokens,
            &r.cache_write_tokens,
            &r.cost_usd,
            &r.policy,
            &r.compaction,
            &r.stated_id,
        ];
        bind_all(stmt, first, values)
    }
}

/// Ids follow the rows' order, as one by one.
impl ChunkedRow for FindingRow {
    const COLUMNS: usize = 9;
    const INSERT: &'static str = "INSERT INTO findings
           (request_id, conversation_id, created_ms, detector, confidence, step, steps,
            summary, suggestion)";

    fn chunks<'s, 'c>(statements: &'s mut Statements<'c>) -> &'s mut Chunks<'c> {
        &mut statements.findings
    }

    fn bind(&self, stmt: &mut Statement<'_>, first: usize) -> rusqlite::Result<()> {
        let f = self;
        let values: [&dyn ToSql; Self::COLUMNS] = [
            &f.request_id,
            &f.conversation_id,
            &f.created_ms,
            &f.detector,
            &f.confidence,
            &f.step,
            &f.steps,
            &f.summary,
            &f.suggestion,
        ];
        bind_all(stmt, first, values)
    }
}

/// Binds a row's values from parameter `first` on. A NULL is left unbound: every parameter
/// of a chunked insert is NULL when its rows are bound ([`write_chunked`] clears the
/// bindings after every use), and a request row's empty columns (a third of them) then
/// cost nothing.
fn bind_all<const N: usize>(
    stmt: &mut Statement<'_>,
    first: usize,
    values: [&dyn ToSql; N],
) -> rusqlite::Result<()> {
    for (i, value) in values.into_iter().enumerate() {
        let value = value.to_sql()?;
        if matches!(
            value,
            ToSqlOutput::Borrowed(ValueRef::Null) | ToSqlOutput::Owned(Value::Null)
        ) {
            continue;
        }
        stmt.raw_bind_parameter(first + i, value)?;
    }
    Ok(())
}

/// `INSERT ... VALUES (?, ...), ...` for `rows` rows of `R`.
fn insert_chunk<R: ChunkedRow>(rows: usize) -> String {
    let one = format!("({})", vec!["?"; R::COLUMNS].join(", "));
    format!("{} VALUES {}", R::INSERT, vec![one; rows].join(", "))
}

/// Writes the rows in their order, in as few statements as [`CHUNKS`] allows.
fn write_chunked<R: ChunkedRow>(
    statements: &mut Statements<'_>,
    rows: &[&R],
) -> rusqlite::Result<()> {
    let mut rest = rows;
    while !rest.is_empty() {
        let k = rest.len().ilog2().min(CHUNKS as u32 - 1) as usize;
        let (chunk, tail) = rest.split_at(1 << k);
        let stmt = statements.chunk::<R>(k)?;
        let done = chunk
            .iter()
            .enumerate()
            .try_for_each(|(i, r)| r.bind(stmt, i * R::COLUMNS + 1))
            .and_then(|()| stmt.raw_execute());
        // Whatever came of it: bound strings are copies that would stay allocated until the
        // next batch, and the next rows are bound over NULLs ([`bind_all`]).
        stmt.clear_bindings();
        done?;
        rest = tail;
    }
    Ok(())
}

/// The writer's statements, by what they write.
#[derive(Clone, Copy)]
enum Sql {
    Conversation,
    ToolCall,
    Decision,
    Intervention,
    HeadContent,
    StepContent,
}

impl Sql {
    const COUNT: usize = 6;

    fn text(self) -> &'static str {
        match self {
            Sql::Conversation => {
                "INSERT INTO conversations
                   (id, id_source, client, dialect, model, first_seen_ms, last_seen_ms, requests,
                    proxy_overhead_us_sum, team)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (id) DO UPDATE SET
                   last_seen_ms = max(last_seen_ms, excluded.last_seen_ms),
                   requests = requests + excluded.requests,
                   proxy_overhead_us_sum = proxy_overhead_us_sum + excluded.proxy_overhead_us_sum,
                   client = coalesce(client, excluded.client),
                   dialect = coalesce(excluded.dialect, dialect),
                   model = coalesce(excluded.model, model),
                   team = coalesce(team, excluded.team)"
            }
            // A result, once known, is never erased by a later sighting without one.
            Sql::ToolCall => {
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
                   seen_ms = excluded.seen_ms"
            }
            Sql::Decision => {
                "INSERT OR REPLACE INTO decisions
                   (request_id, conversation_id, created_ms, action, applied, step, reason,
                    policy)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            }
            Sql::Intervention => {
                "INSERT INTO interventions (conversation_id, request_id, created_ms, action,
                   applied, source, detector, reason, finding, policy)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            }
            // The latest sighting wins: a step's later copy carries more of its results.
            Sql::HeadContent => {
                "INSERT OR REPLACE INTO conversation_content
                   (conversation_id, content, request_id, seen_ms)
                 VALUES (?1, ?2, ?3, ?4)"
            }
            Sql::StepContent => {
                "INSERT OR REPLACE INTO step_content
                   (conversation_id, step, content, request_id, seen_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)"
            }
        }
    }
}

impl<'c> Statements<'c> {
    fn new(conn: &'c Connection) -> Self {
        Statements {
            conn,
            prepared: Default::default(),
            requests: Default::default(),
            findings: Default::default(),
        }
    }

    /// The insert of 2^k rows of `R`, prepared on first use.
    fn chunk<R: ChunkedRow>(&mut self, k: usize) -> rusqlite::Result<&mut Statement<'c>> {
        let conn = self.conn;
        prepared_once(conn, &mut R::chunks(self)[k], || insert_chunk::<R>(1 << k))
    }

    /// The statement, prepared on first use.
    fn get(&mut self, sql: Sql) -> rusqlite::Result<&mut Statement<'c>> {
        prepared_once(self.conn, &mut self.prepared[sql as usize], || sql.text())
    }
}

/// The statement kept in `slot`, prepared from `sql` when the slot is empty (a statement
/// that failed to prepare, say because its table is missing, is tried again next time).
fn prepared_once<'c, 's, S: AsRef<str>>(
    conn: &'c Connection,
    slot: &'s mut Option<Statement<'c>>,
    sql: impl FnOnce() -> S,
) -> rusqlite::Result<&'s mut Statement<'c>> {
    if slot.is_none() {
        *slot = Some(conn.prepare(sql().as_ref())?);
    }
    // Just filled when it was empty.
    slot.as_mut().ok_or(rusqlite::Error::InvalidQuery)
}

fn write_batch(
    conn: &Connection,
    statements: &mut Statements<'_>,
    records: &[Record],
) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    let batch = Batch::of(records);
    write_chunked(statements, &batch.requests)?;
    write_chunked(statements, &batch.findings)?;
    for merged in &batch.sightings {
        write_sightings(statements, merged)?;
    }
    for merged in &batch.calls {
        write_call(statements, merged)?;
    }
    let mut runs = false;
    for record in batch.others {
        runs |= matches!(record, Record::Run(_));
        write_one(statements, record)?;
    }
    if runs {
        let cutoff = crate::store::now_ms() - runs::KEEP_MS;
        for sql in runs::EXPIRE {
            conn.prepare_cached(&numbered(sql))?.execute([cutoff])?;
        }
    }
    tx.commit()
}

fn write_sightings(statements: &mut Statements<'_>, s: &Sightings<'_>) -> rusqlite::Result<()> {
    statements.get(Sql::Conversation)?.execute(params![
        s.first.id,
        s.first.id_source.as_str(),
        s.client,
        s.dialect,
        s.model,
        s.first.at_ms,
        s.last_ms,
        s.requests,
        s.overhead_us,
        s.team
    ])?;
    Ok(())
}

fn write_call(statements: &mut Statements<'_>, c: &CallUpdates<'_>) -> rusqlite::Result<()> {
    let t = c.last;
    statements.get(Sql::ToolCall)?.execute(params![
        t.conversation_id,
        t.step,
        t.call_index,
        t.call_id,
        t.name,
        t.args_hash,
        t.summary,
        c.result_hash,
        c.result_summary,
        c.is_error,
        t.request_id,
        t.seen_ms
    ])?;
    Ok(())
}

/// A decision, an intervention or a content row ([`Batch::others`]).
fn write_one(statements: &mut Statements<'_>, record: &Record) -> rusqlite::Result<()> {
    match record {
        // Gathered per batch by `Batch::of`, never among the others.
        Record::Conversation(_) | Record::ToolCall(_) | Record::Request(_) | Record::Finding(_) => {
        }
        Record::Decision(d) => {
            statements.get(Sql::Decision)?.execute(params![
                d.request_id,
                d.conversation_id,
                d.created_ms,
                d.action,
                d.applied,
                d.step,
                d.reason,
                d.policy
            ])?;
        }
        Record::Intervention(i) => {
            statements.get(Sql::Intervention)?.execute(params![
                i.conversation_id,
                i.request_id,
                i.created_ms,
                i.action,
                i.applied,
                i.source,
                i.detector,
                i.reason,
                i.finding,
                i.policy
            ])?;
        }
        Record::Run(r) => write_run(statements.conn, r)?,
        Record::Content(c) => match c.step {
            None => {
                statements.get(Sql::HeadContent)?.execute(params![
                    c.conversation_id,
                    c.content,
                    c.request_id,
                    c.seen_ms
                ])?;
            }
            Some(step) => {
                statements.get(Sql::StepContent)?.execute(params![
                    c.conversation_id,
                    step,
                    c.content,
                    c.request_id,
                    c.seen_ms
                ])?;
            }
        },
    }
    Ok(())
}

/// A run's row ([`runs`]): rare (a summary request, a continuation, a stored answer), so
/// each is one statement, from SQL shared with PostgreSQL.
fn write_run(conn: &Connection, record: &RunRecord) -> rusqlite::Result<()> {
    match record {
        RunRecord::Compacted(r) => {
            conn.prepare_cached(&numbered(runs::UPSERT_RUN))?
                .execute(params![
                    r.id,
                    r.key_id,
                    r.client,
                    r.team,
                    r.policy,
                    r.compacted_ms,
                    r.awaiting,
                    r.server_compaction,
                    r.carry,
                    r.last_ms
                ])?;
        }
        RunRecord::Linked(l) => {
            conn.prepare_cached(&numbered(runs::UPSERT_LINK))?
                .execute(params![l.conversation_id, l.run_id, l.linked_ms])?;
            conn.prepare_cached(&numbered(runs::CONTINUED))?
                .execute(params![l.run_id, l.linked_ms])?;
        }
        RunRecord::ServerCompacted { run, fingerprint } => {
            conn.prepare_cached(&numbered(runs::SERVER_COMPACTED))?
                .execute(params![run, fingerprint])?;
        }
        RunRecord::Answer(a) => {
            conn.prepare_cached(&numbered(runs::UPSERT_ANSWER))?
                .execute(params![
                    a.id,
                    a.parent_id,
                    a.masked_items().as_str(),
                    a.made_here,
                    a.stored_ms
                ])?;
        }
    }
    Ok(())
}

/// Shared SQL's `$n` parameters as SQLite's `?n`: both numbered, but SQLite numbers `$n`
/// in the order they first appear, whatever `n` says.
fn numbered(sql: &str) -> String {
    sql.replace('$', "?")
}
