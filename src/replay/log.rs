//! `loopwarden replay --db`: the conversations the log kept whole (`[log] content = true`)
//! replayed with a candidate config beside the current one, so that a team tries a change
//! on last week's traffic before it applies it; from a SQLite log, or from the PostgreSQL
//! database the replicas share.
//!
//! Each conversation's transcript is rebuilt from its stored head and steps
//! (`migrations/0009_content.sql`), and [`Engine::decisions`] (the proxy's decision for
//! each request, the one sequence `replay` and the tests share) runs over it once per
//! config. What is printed is where the two differ, up to where both configs have stopped
//! the run (after that the agent would have received neither's decisions).
//!
//! The policy of a conversation comes from a resolver given what the log kept of its
//! traffic (team, client, model, API) and the name of the policy its requests were logged
//! under, so that each conversation is replayed under the policy each config puts it under
//! (a team moved to a policy of its own in the candidate is replayed under that one). Beside detection's decisions, what each policy would have done with them is
//! compared (its mode and its budget: [`super::rollout`]), so that a candidate that turns
//! shadow to enforce, or lowers a budget, shows the runs it would have stopped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::rollout::{self, Answered, DoneChange, Spent};
use crate::detect::{Action, Decision, Engine, StoreFacts};
use crate::policy::{Logged, Policy};
use crate::transcript::{Head, Step, Transcript};

/// The policy a conversation is replayed under when the log names none (a log written
/// before policies, or a request without one).
pub const DEFAULT_POLICY: &str = "default";

/// Which logged conversations to replay.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Conversations with a step logged at or after this time (Unix ms)...
    pub since_ms: Option<i64>,
    /// ...and before this one.
    pub until_ms: Option<i64>,
    /// Conversations with a request logged under this policy.
    pub policy: Option<String>,
    pub conversation: Option<String>,
}

/// A decision as the comparison shows it: `nudge(read_loop)`, `observe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub detector: String,
}

impl Verdict {
    fn of(d: &Decision) -> Verdict {
        Verdict {
            action: d.action,
            detector: d.detector.clone(),
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.action, self.detector.as_str()) {
            (Action::Observe, _) | (_, "") => f.write_str(self.action.as_str()),
            (action, detector) => write!(f, "{}({detector})", action.as_str()),
        }
    }
}

/// A request whose decision the candidate changes. `step`: the request's index, the
/// number of steps its history held (as `loopwarden replay` prints it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub step: usize,
    pub current: Verdict,
    pub candidate: Verdict,
}

impl std::fmt::Display for Change {
    /// `step 14: nudge(read_loop) -> halt(read_loop)`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}: {} -> {}",
            self.step, self.current, self.candidate
        )
    }
}

/// One conversation replayed with both configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compared {
    pub id: String,
    /// The policy the current config puts it under.
    pub policy: String,
    /// The candidate's, when it is another.
    pub candidate_policy: Option<String>,
    pub steps: usize,
    /// Detection's decisions that change.
    pub changes: Vec<Change>,
    /// What the policies would have done that changes (mode, budget, and the decisions'
    /// changes as the policies carry them out).
    pub done: Vec<DoneChange>,
}

/// What a replay from the log found, over all conversations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub conversations: usize,
    /// Conversations with content but without their first step (content switched on
    /// midway, or rows lost): not replayed.
    pub incomplete: usize,
    pub changed_conversations: usize,
    pub decisions_changed: usize,
    /// Requests the candidate stops (halt, pause, block) that the current config did not.
    pub halts_added: usize,
    /// Requests the current config stops that the candidate does not.
    pub halts_removed: usize,
    /// Requests the candidate's policies would have done otherwise.
    pub done_changed: usize,
    /// Runs the candidate's policies would have stopped at a request the current ones
    /// did not stop at (a halt or a hold: enforced, not a shadow's would-be).
    pub stops_added: usize,
    pub stops_removed: usize,
}

impl Summary {
    fn add(&mut self, c: &Compared) {
        self.conversations += 1;
        self.changed_conversations += usize::from(!c.changes.is_empty() || !c.done.is_empty());
        self.decisions_changed += c.changes.len();
        self.done_changed += c.done.len();
        self.stops_added += c.done.iter().filter(|d| d.adds_a_stop()).count();
        self.stops_removed += c.done.iter().filter(|d| d.removes_a_stop()).count();
        for change in &c.changes {
            let (was, will) = (
                change.current.action.stops(),
                change.candidate.action.stops(),
            );
            self.halts_added += usize::from(will && !was);
            self.halts_removed += usize::from(was && !will);
        }
    }
}

/// Each request's decision under both engines, and where they differ, up to the request
/// where both have stopped the run.
pub fn compare(current: &Engine, candidate: &Engine, transcript: &Transcript) -> Vec<Change> {
    compare_run(current, candidate, transcript, &[])
}

/// [`compare`] for a run whose history was compacted after each of the step counts in
/// `compactions` ([`Engine::decisions_across`]).
pub fn compare_run(
    current: &Engine,
    candidate: &Engine,
    transcript: &Transcript,
    compactions: &[usize],
) -> Vec<Change> {
    let store = StoreFacts::default();
    let before = current.decisions_across(transcript, &store, compactions);
    let after = candidate.decisions_across(transcript, &store, compactions);
    changes(&before, &after)
}

/// Where two sequences of decisions (`(steps, decision)` per request) differ, up to the
/// request where both have stopped the run.
fn changes(before: &[(usize, Decision)], after: &[(usize, Decision)]) -> Vec<Change> {
    let first_stop = |ds: &[(usize, Decision)]| {
        ds.iter()
            .find(|(_, d)| d.action.stops())
            .map_or(usize::MAX, |(k, _)| *k)
    };
    let last = first_stop(before).max(first_stop(after));
    before
        .iter()
        .zip(after)
        .take_while(|((k, _), _)| *k <= last)
        .filter_map(|((k, b), (_, a))| {
            let (current, candidate) = (Verdict::of(b), Verdict::of(a));
            (current != candidate).then_some(Change {
                step: *k,
                current,
                candidate,
            })
        })
        .collect()
}

/// Replays the selected conversations of the log at `db` (a `sqlite://` URL or a path)
/// under the policies `current` and `candidate` resolve for each one's logged policy, and
/// writes, per conversation, each request whose decision changes and each request the
/// policies would have done otherwise, then the summary.
pub fn replay(
    db: &str,
    selection: &Selection,
    current: &dyn Fn(&Logged, &str) -> Arc<Policy>,
    candidate: &dyn Fn(&Logged, &str) -> Arc<Policy>,
    out: &mut impl Write,
) -> anyhow::Result<Summary> {
    let log = Log::open(db)?;
    if let Some(policy) = &selection.policy {
        let logged = log.policies()?;
        if !logged.contains(policy) {
            anyhow::bail!(
                "--policy {policy:?}: no request in the log is under that policy (the log's \
                 policies: {})",
                if logged.is_empty() {
                    "none".to_string()
                } else {
                    logged.join(", ")
                }
            );
        }
    }
    let mut summary = Summary::default();
    for id in log.conversations(selection)? {
        let policy = log.policy_of(&id)?;
        let Some(transcript) = log.transcript(&id)? else {
            summary.incomplete += 1;
            continue;
        };
        let traffic = log.traffic(&id)?;
        let (now, then) = (current(&traffic, &policy), candidate(&traffic, &policy));
        let compactions = log.compactions(&id)?;
        let store = StoreFacts::default();
        let before = now
            .engine
            .decisions_across(&transcript, &store, &compactions);
        let after = then
            .engine
            .decisions_across(&transcript, &store, &compactions);
        let spent = log.spent(&id)?;
        let compared = Compared {
            changes: changes(&before, &after),
            done: rollout::compare((&now, &before), (&then, &after), &spent),
            steps: transcript.steps.len(),
            id,
            policy: now.name.to_string(),
            candidate_policy: (then.name != now.name).then(|| then.name.to_string()),
        };
        summary.add(&compared);
        write_conversation(out, &compared)?;
    }
    write_summary(out, &summary)?;
    Ok(summary)
}

fn write_conversation(out: &mut impl Write, c: &Compared) -> std::io::Result<()> {
    if c.changes.is_empty() && c.done.is_empty() {
        return Ok(());
    }
    let policy = match &c.candidate_policy {
        Some(candidate) => format!("{} -> {candidate}", c.policy),
        None => c.policy.clone(),
    };
    writeln!(
        out,
        "conversation {} (policy {policy}, {} steps)",
        c.id, c.steps
    )?;
    for change in &c.changes {
        writeln!(out, "  {change}")?;
    }
    for change in &c.done {
        writeln!(out, "  {change}")?;
    }
    Ok(())
}

fn write_summary(out: &mut impl Write, s: &Summary) -> std::io::Result<()> {
    if s.conversations == 0 && s.incomplete == 0 {
        return writeln!(
            out,
            "nothing to replay: no conversation content in the log for this selection \
             (content is logged only with `[log] content = true`)"
        );
    }
    writeln!(
        out,
        "replayed {} conversations ({} skipped: their first steps are not in the log); \
         {} changed, {} decisions changed; would-be halts: {} added, {} removed; \
         {} requests done otherwise (mode, budget); runs stopped: {} added, {} removed",
        s.conversations,
        s.incomplete,
        s.changed_conversations,
        s.decisions_changed,
        s.halts_added,
        s.halts_removed,
        s.done_changed,
        s.stops_added,
        s.stops_removed
    )
}

/// The log, read-only: a SQLite file, or the PostgreSQL database replicas share (the
/// store a team runs in production).
enum Log {
    Sqlite(SqliteLog),
    Postgres(PostgresLog),
}

impl Log {
    fn open(db: &str) -> anyhow::Result<Log> {
        if crate::store::postgres::is_url(db) {
            PostgresLog::open(db).map(Log::Postgres)
        } else {
            SqliteLog::open(db).map(Log::Sqlite)
        }
    }

    fn conversations(&self, s: &Selection) -> anyhow::Result<Vec<String>> {
        match self {
            Log::Sqlite(log) => log.conversations(s),
            Log::Postgres(log) => log.conversations(s),
        }
    }

    /// The policies the log's requests name, sorted.
    fn policies(&self) -> anyhow::Result<Vec<String>> {
        match self {
            Log::Sqlite(log) => log.policies(),
            Log::Postgres(log) => log.policies(),
        }
    }

    fn policy_of(&self, id: &str) -> anyhow::Result<String> {
        let policy = match self {
            Log::Sqlite(log) => log.policy_of(id)?,
            Log::Postgres(log) => log.policy_of(id)?,
        };
        Ok(policy.unwrap_or_else(|| DEFAULT_POLICY.to_string()))
    }

    /// The step counts after which the run's history was compacted: the steps its summary
    /// requests carried. None in a log written before compactions were logged.
    fn compactions(&self, id: &str) -> anyhow::Result<Vec<usize>> {
        let steps = match self {
            Log::Sqlite(log) => log.compactions(id)?,
            Log::Postgres(log) => log.compactions(id)?,
        };
        Ok(steps
            .into_iter()
            .filter_map(|n| usize::try_from(n).ok())
            .collect())
    }

    /// What the log kept of the conversation's traffic, to find its policy by.
    fn traffic(&self, id: &str) -> anyhow::Result<Logged> {
        let row = match self {
            Log::Sqlite(log) => log.traffic(id)?,
            Log::Postgres(log) => log.traffic(id)?,
        };
        let (team, client, model, api) = row.unwrap_or_default();
        Ok(Logged {
            team,
            client,
            model,
            api,
        })
    }

    /// The conversation's answered requests, as its budget counts them.
    fn spent(&self, id: &str) -> anyhow::Result<Spent> {
        let rows = match self {
            Log::Sqlite(log) => log.spent(id)?,
            Log::Postgres(log) => log.spent(id)?,
        };
        let answered = rows
            .into_iter()
            .map(|(steps, started_ms, tokens, dollars)| Answered {
                steps,
                started_ms,
                tokens: tokens.max(0) as u64,
                dollars,
            })
            .collect();
        Ok(Spent { answered })
    }

    /// The conversation's transcript: its head and its steps from the first on, up to
    /// the first one missing. `None` when its first step is not in the log.
    fn transcript(&self, id: &str) -> anyhow::Result<Option<Transcript>> {
        let (head, rows) = match self {
            Log::Sqlite(log) => (log.head(id)?, log.steps(id)?),
            Log::Postgres(log) => (log.head(id)?, log.steps(id)?),
        };
        // A missing head (rows lost) leaves the task empty, for both configs alike.
        let head: Head = match head {
            Some(text) => serde_json::from_str(&text)
                .with_context(|| format!("{id}: the logged head is not readable"))?,
            None => Head::default(),
        };
        let mut steps: Vec<Step> = Vec::new();
        for (index, text) in rows {
            if usize::try_from(index).ok() != Some(steps.len()) {
                break;
            }
            let step: Step = serde_json::from_str(&text)
                .with_context(|| format!("{id}: logged step {index} is not readable"))?;
            steps.push(step);
        }
        Ok((!steps.is_empty()).then(|| head.with_steps(steps)))
    }
}

/// A request's steps, start, tokens (every kind) and dollars.
type SpentRow = (Option<i64>, i64, i64, f64);

/// A conversation's team, client, model and dialect.
type TrafficRow = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A request's tokens (every kind) and dollars, 0 where not logged.
const SPEND_COLUMNS: &str = "coalesce(input_tokens, 0) + coalesce(cached_input_tokens, 0)
    + coalesce(cache_write_tokens, 0) + coalesce(output_tokens, 0), coalesce(cost_usd, 0.0)";

/// A SQLite log.
struct SqliteLog {
    conn: Connection,
    /// Whether the log's rows name their policy (`requests.policy`, written by versions
    /// with policies).
    has_policy: bool,
}

impl SqliteLog {
    fn open(db: &str) -> anyhow::Result<SqliteLog> {
        let path = db_path(db)?;
        if !path.exists() {
            anyhow::bail!("no log at {}", path.display());
        }
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .with_context(|| format!("opening the log {}", path.display()))?;
        let columns = |table: &str| -> anyhow::Result<Vec<String>> {
            let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
            let names = stmt.query_map([], |r| r.get::<_, String>(1))?;
            Ok(names.collect::<Result<_, _>>()?)
        };
        if columns("step_content")?.is_empty() {
            anyhow::bail!(
                "{} holds no conversation content (a log written before content logging: \
                 open it once with this version of `loopwarden serve` to migrate it)",
                path.display()
            );
        }
        let has_policy = columns("requests")?.iter().any(|c| c == "policy");
        Ok(SqliteLog { conn, has_policy })
    }

    /// The selected conversations with content, oldest first.
    fn conversations(&self, s: &Selection) -> anyhow::Result<Vec<String>> {
        if s.policy.is_some() && !self.has_policy {
            anyhow::bail!("this log does not record policies: --policy cannot select from it");
        }
        let by_policy = if s.policy.is_some() {
            "AND conversation_id IN (SELECT conversation_id FROM requests WHERE policy = ?4)"
        } else {
            "AND ?4 IS NULL"
        };
        let sql = format!(
            "SELECT conversation_id FROM step_content
             WHERE (?1 IS NULL OR seen_ms >= ?1) AND (?2 IS NULL OR seen_ms < ?2)
               AND (?3 IS NULL OR conversation_id = ?3) {by_policy}
             GROUP BY conversation_id ORDER BY min(seen_ms), conversation_id"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let ids = stmt.query_map(
            rusqlite::params![s.since_ms, s.until_ms, s.conversation, s.policy],
            |r| r.get::<_, String>(0),
        )?;
        Ok(ids.collect::<Result<_, _>>()?)
    }

    fn policies(&self) -> anyhow::Result<Vec<String>> {
        if !self.has_policy {
            anyhow::bail!("this log does not record policies: --policy cannot select from it");
        }
        let mut stmt = self.conn.prepare(
            "SELECT DISTINCT policy FROM requests WHERE policy IS NOT NULL ORDER BY policy",
        )?;
        let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
        Ok(names.collect::<Result<_, _>>()?)
    }

    /// The policy of a conversation's last request, where the log records one.
    fn policy_of(&self, id: &str) -> anyhow::Result<Option<String>> {
        if !self.has_policy {
            return Ok(None);
        }
        let policy: Option<Option<String>> = self
            .conn
            .query_row(
                "SELECT policy FROM requests WHERE conversation_id = ?1
                 ORDER BY started_ms DESC, id DESC LIMIT 1",
                [id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(policy.flatten())
    }

    fn compactions(&self, id: &str) -> anyhow::Result<Vec<i64>> {
        let has_column = self
            .conn
            .prepare("SELECT compaction FROM requests LIMIT 0")
            .is_ok();
        if !has_column {
            return Ok(Vec::new());
        }
        let mut stmt = self.conn.prepare(
            "SELECT steps FROM requests
             WHERE conversation_id = ?1 AND compaction IS NOT NULL AND steps IS NOT NULL
             ORDER BY steps",
        )?;
        let rows = stmt.query_map([id], |r| r.get::<_, i64>(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The conversation's team (none in a log from before teams were logged), client,
    /// model and dialect.
    fn traffic(&self, id: &str) -> anyhow::Result<Option<TrafficRow>> {
        let has_team = self
            .conn
            .prepare("SELECT team FROM conversations LIMIT 0")
            .is_ok();
        let team = if has_team { "team" } else { "NULL" };
        let row = self
            .conn
            .query_row(
                &format!("SELECT {team}, client, model, dialect FROM conversations WHERE id = ?1"),
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        Ok(row)
    }

    /// Each request's steps, start, tokens and dollars, in the order they started (no
    /// tokens nor dollars in a log from before spend was logged).
    fn spent(&self, id: &str) -> anyhow::Result<Vec<SpentRow>> {
        let has_spend = self
            .conn
            .prepare("SELECT cost_usd FROM requests LIMIT 0")
            .is_ok();
        let spend = match has_spend {
            true => SPEND_COLUMNS,
            false => "0, 0.0",
        };
        let mut stmt = self.conn.prepare(&format!(
            "SELECT steps, started_ms, {spend} FROM requests
             WHERE conversation_id = ?1 ORDER BY started_ms, id"
        ))?;
        let rows = stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn head(&self, id: &str) -> anyhow::Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT content FROM conversation_content WHERE conversation_id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// The conversation's logged steps, by index.
    fn steps(&self, id: &str) -> anyhow::Result<Vec<(i64, String)>> {
        let mut stmt = self.conn.prepare(
            "SELECT step, content FROM step_content WHERE conversation_id = ?1 ORDER BY step",
        )?;
        let rows = stmt.query_map([id], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// A PostgreSQL log (its schema is the current one: the replicas migrate it when they
/// open it), read through a runtime of its own, since the replay is synchronous.
struct PostgresLog {
    runtime: tokio::runtime::Runtime,
    pool: sqlx::PgPool,
}

impl PostgresLog {
    fn open(url: &str) -> anyhow::Result<PostgresLog> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let pool = runtime
            .block_on(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(url),
            )
            // The error, never the URL (it may carry a password).
            .map_err(|e| anyhow::anyhow!("cannot open the PostgreSQL log: {e}"))?;
        Ok(PostgresLog { runtime, pool })
    }

    /// The selected conversations with content, oldest first.
    fn conversations(&self, s: &Selection) -> anyhow::Result<Vec<String>> {
        let query = sqlx::query_scalar(
            "SELECT conversation_id FROM step_content
             WHERE ($1::BIGINT IS NULL OR seen_ms >= $1) AND ($2::BIGINT IS NULL OR seen_ms < $2)
               AND ($3::TEXT IS NULL OR conversation_id = $3)
               AND ($4::TEXT IS NULL OR conversation_id IN
                    (SELECT conversation_id FROM requests WHERE policy = $4))
             GROUP BY conversation_id ORDER BY min(seen_ms), conversation_id",
        )
        .bind(s.since_ms)
        .bind(s.until_ms)
        .bind(&s.conversation)
        .bind(&s.policy);
        Ok(self.runtime.block_on(query.fetch_all(&self.pool))?)
    }

    fn policies(&self) -> anyhow::Result<Vec<String>> {
        let query = sqlx::query_scalar(
            "SELECT DISTINCT policy FROM requests WHERE policy IS NOT NULL ORDER BY policy",
        );
        Ok(self.runtime.block_on(query.fetch_all(&self.pool))?)
    }

    fn policy_of(&self, id: &str) -> anyhow::Result<Option<String>> {
        let query = sqlx::query_scalar::<_, Option<String>>(
            "SELECT policy FROM requests WHERE conversation_id = $1
             ORDER BY started_ms DESC, id DESC LIMIT 1",
        )
        .bind(id);
        Ok(self
            .runtime
            .block_on(query.fetch_optional(&self.pool))?
            .flatten())
    }

    fn compactions(&self, id: &str) -> anyhow::Result<Vec<i64>> {
        let query = sqlx::query_scalar(
            "SELECT steps FROM requests
             WHERE conversation_id = $1 AND compaction IS NOT NULL AND steps IS NOT NULL
             ORDER BY steps",
        )
        .bind(id);
        Ok(self.runtime.block_on(query.fetch_all(&self.pool))?)
    }

    fn traffic(&self, id: &str) -> anyhow::Result<Option<TrafficRow>> {
        let query =
            sqlx::query_as("SELECT team, client, model, dialect FROM conversations WHERE id = $1")
                .bind(id);
        Ok(self.runtime.block_on(query.fetch_optional(&self.pool))?)
    }

    fn spent(&self, id: &str) -> anyhow::Result<Vec<SpentRow>> {
        let sql = format!(
            "SELECT steps, started_ms, {SPEND_COLUMNS} FROM requests
             WHERE conversation_id = $1 ORDER BY started_ms, id"
        );
        let query = sqlx::query_as(&sql).bind(id);
        Ok(self.runtime.block_on(query.fetch_all(&self.pool))?)
    }

    fn head(&self, id: &str) -> anyhow::Result<Option<String>> {
        let query = sqlx::query_scalar(
            "SELECT content FROM conversation_content WHERE conversation_id = $1",
        )
        .bind(id);
        Ok(self.runtime.block_on(query.fetch_optional(&self.pool))?)
    }

    fn steps(&self, id: &str) -> anyhow::Result<Vec<(i64, String)>> {
        let query = sqlx::query_as(
            "SELECT step, content FROM step_content WHERE conversation_id = $1 ORDER BY step",
        )
        .bind(id);
        Ok(self.runtime.block_on(query.fetch_all(&self.pool))?)
    }
}

/// The file a `--db` names: a `sqlite://` URL as `store.db` takes it, or a path.
fn db_path(db: &str) -> anyhow::Result<PathBuf> {
    if !db.starts_with("sqlite:") {
        return Ok(Path::new(db).to_path_buf());
    }
    let options: sqlx::sqlite::SqliteConnectOptions = db
        .parse()
        .with_context(|| format!("not a sqlite URL: {db}"))?;
    Ok(options.get_filename().to_path_buf())
}

/// A time as `--since`/`--until` take it: a day (`2026-11-19`, UTC midnight) or Unix
/// milliseconds. `end_of_day`: a day stands for its end (`--until` includes the day).
pub fn parse_time(text: &str, end_of_day: bool) -> anyhow::Result<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    let parts: Vec<&str> = text.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        anyhow::bail!("{text:?}: expected a day (YYYY-MM-DD) or Unix milliseconds");
    };
    let (y, m, d): (i64, u32, u32) = (
        y.parse().context("year")?,
        m.parse().context("month")?,
        d.parse().context("day")?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        anyhow::bail!("{text:?}: not a day");
    }
    let days = days_from_civil(y, m, d) + i64::from(end_of_day);
    Ok(days * 86_400_000)
}

/// Days from 1970-01-01 to a day of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_read_as_utc_midnights() {
        assert_eq!(parse_time("1970-01-01", false).unwrap(), 0);
        assert_eq!(parse_time("1970-01-01", true).unwrap(), 86_400_000);
        // 2026-11-19T00:00:00Z
        assert_eq!(parse_time("2026-11-19", false).unwrap(), 1_795_046_400_000);
        assert_eq!(parse_time("2000-03-01", false).unwrap(), 951_868_800_000);
        assert_eq!(parse_time("1234", false).unwrap(), 1234);
        assert!(parse_time("2026-13-01", false).is_err());
        assert!(parse_time("yesterday", false).is_err());
    }

    #[test]
    fn verdicts_read_as_action_and_detector() {
        let v = |action, detector: &str| Verdict {
            action,
            detector: detector.into(),
        };
        assert_eq!(
            v(Action::Nudge, "read_loop").to_string(),
            "nudge(read_loop)"
        );
        assert_eq!(v(Action::Observe, "").to_string(), "observe");
        assert_eq!(v(Action::Halt, "").to_string(), "halt");
    }
}
