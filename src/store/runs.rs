//! What a run needs to go on, kept in the store so that it outlives the process that saw
//! it (issue 52; `migrations/0012_runs.sql`): a run's state at its summary request, the
//! conversations that continue it under another id, and the Responses answers clients
//! asked the API to store. The proxy keeps all of it in memory
//! (`crate::proxy::memory::lineage`, `crate::proxy::upstream::response_chain`); the store
//! is where another replica, or this one after a restart, finds it on a miss.
//!
//! Written like the log: queued ([`Store::log`], [`Store::log_deferred`]) and written by
//! the writer thread, never on the request path; at most a row per summary request,
//! continuation link or stored answer. Rows expire a day after they were last written
//! ([`KEEP_MS`]): the writer deletes them when it writes new ones, and every read skips
//! them.

use serde::{Deserialize, Serialize};

use super::{Backend, Error, Record, Store};

/// How long a run's rows are kept after they were last written: the lineage's day (a
/// budget outlives a lunch break, as the ledger's does).
pub const KEEP_MS: i64 = 24 * 3600 * 1000;

/// What the store is told of runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunRecord {
    /// A run's summary request: the run as it stands there (replaces its row).
    Compacted(RunRow),
    /// A conversation continued the run under another id: it no longer awaits one.
    Linked(RunLink),
    /// The run's state was taken at this compaction by the API.
    ServerCompacted { run: String, fingerprint: i64 },
    /// A Responses answer to keep.
    Answer(StoredAnswer),
}

/// A run that compacted its context (`runs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RunRow {
    pub id: String,
    /// The API key's fingerprint (`crate::policy::key_id`), never the key.
    pub key_id: Option<String>,
    pub client: Option<String>,
    pub team: Option<String>,
    pub policy: String,
    pub compacted_ms: i64,
    /// No conversation continued from its last summary yet.
    pub awaiting: bool,
    pub server_compaction: Option<i64>,
    /// `crate::detect::EngineState::to_stored` at its last summary request.
    pub carry: Vec<u8>,
    pub last_ms: i64,
}

/// A conversation that continues a run under another id (`run_links`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct RunLink {
    pub conversation_id: String,
    pub run_id: String,
    pub linked_ms: i64,
}

/// A Responses answer (`stored_responses`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct StoredAnswer {
    pub id: String,
    pub parent_id: Option<String>,
    /// A JSON array: the request's own input items, then the answer's output items.
    pub items: String,
    pub made_here: bool,
    pub stored_ms: i64,
}

impl StoredAnswer {
    /// The items as the writers store them: credentials masked in every string, as in the
    /// log's content (the items are the conversation's text, kept whatever `[log] content`
    /// says, so that a chain is read whole on any replica). Masked on the writer's thread,
    /// off the request path; items that are not JSON are stored as an empty array.
    pub fn masked_items(&self) -> crate::store::Masked {
        let items = serde_json::from_str::<serde_json::Value>(&self.items)
            .unwrap_or_else(|_| serde_json::Value::Array(Vec::new()));
        crate::store::Masked::json(&items)
    }
}

/// The sender a continuation under a new id must share with a run's summary request
/// (the policy is compared by the caller, which knows it only once the body is read).
#[derive(Debug, Clone, Copy)]
pub struct SentBy<'a> {
    pub key_id: Option<&'a str>,
    pub client: Option<&'a str>,
    pub team: Option<&'a str>,
}

/// What the store knows of a conversation new to a process.
#[derive(Debug, Default, PartialEq)]
pub struct StoredLineage {
    /// The run it continues under its own id, when it was linked to one.
    pub link: Option<RunLink>,
    /// Its own run, its linked run, and the runs of its sender awaiting a continuation.
    pub runs: Vec<RunRow>,
}

/// The SQL of the writes, the same for both backends (`$n` parameters, which SQLite's
/// `rusqlite` binds by position as it does `?n`). Each replaces what it keys on.
pub(super) const UPSERT_RUN: &str = "INSERT INTO runs
      (id, key_id, client, team, policy, compacted_ms, awaiting, server_compaction, carry,
       last_ms)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (id) DO UPDATE SET
      key_id = excluded.key_id, client = excluded.client, team = excluded.team,
      policy = excluded.policy, compacted_ms = excluded.compacted_ms,
      awaiting = excluded.awaiting, server_compaction = excluded.server_compaction,
      carry = excluded.carry, last_ms = excluded.last_ms";
pub(super) const UPSERT_LINK: &str = "INSERT INTO run_links (conversation_id, run_id, linked_ms)
    VALUES ($1, $2, $3)
    ON CONFLICT (conversation_id) DO UPDATE SET
      run_id = excluded.run_id, linked_ms = excluded.linked_ms";
pub(super) const CONTINUED: &str = "UPDATE runs SET awaiting = false,
      last_ms = CASE WHEN last_ms < $2 THEN $2 ELSE last_ms END
    WHERE id = $1";
pub(super) const SERVER_COMPACTED: &str = "UPDATE runs SET server_compaction = $2 WHERE id = $1";
pub(super) const UPSERT_ANSWER: &str = "INSERT INTO stored_responses
      (id, parent_id, items, made_here, stored_ms)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (id) DO UPDATE SET
      parent_id = excluded.parent_id, items = excluded.items,
      made_here = excluded.made_here, stored_ms = excluded.stored_ms";
/// Deletes what is past [`KEEP_MS`] (`$1`: the cutoff); run by the writer with each batch
/// that writes any of these rows, through the tables' time indexes.
pub(super) const EXPIRE: [&str; 3] = [
    "DELETE FROM runs WHERE last_ms < $1",
    "DELETE FROM run_links WHERE linked_ms < $1",
    "DELETE FROM stored_responses WHERE stored_ms < $1",
];

const RUN_COLUMNS: &str = "id, key_id, client, team, policy, compacted_ms, awaiting,
    server_compaction, carry, last_ms";

/// Answers a chain is read back through at most: a longer chain is read from what is
/// left of it (its oldest answers are then missing, as they are when memory forgot them).
const CHAIN_MAX: i64 = 4096;

/// Runs a query on the store's pool, whichever backend it is (the SQL is shared).
macro_rules! on_pool {
    ($store:expr, $query:expr, $how:ident) => {
        match &$store.backend {
            Backend::Sqlite(db) => $query.$how(&db.pool()).await,
            Backend::Postgres(db) => $query.$how(db.pool()).await,
        }
    };
}

/// The runs a conversation new to a process may continue: by id (its own, its link's),
/// through the primary key; and its sender's awaiting a continuation, through the partial
/// index of the awaiting runs (its `WHERE` is the query's own term, as SQLite needs to use
/// it). A run found both ways comes twice (`UNION ALL`: no comparison of the states).
fn lineage_sql() -> String {
    format!(
        "SELECT {RUN_COLUMNS} FROM runs
         WHERE id IN ($1, $2) AND last_ms >= $3
         UNION ALL
         SELECT {RUN_COLUMNS} FROM runs
         WHERE awaiting AND compacted_ms >= $4 AND key_id IS NOT DISTINCT FROM $5
           AND client IS NOT DISTINCT FROM $6 AND team IS NOT DISTINCT FROM $7"
    )
}

impl Store {
    /// Queues what the store is told of a run.
    pub fn log_run(&self, record: RunRecord) {
        self.log(Record::Run(Box::new(record)));
    }

    /// What the store keeps of `conversation` (its link, its run) and of the runs that
    /// `sender` compacted since `awaiting_since_ms` and nobody continued yet. Rows past
    /// [`KEEP_MS`] are not read.
    pub async fn stored_lineage(
        &self,
        conversation: Option<&str>,
        sender: SentBy<'_>,
        awaiting_since_ms: i64,
    ) -> Result<StoredLineage, Error> {
        let kept_since = super::now_ms() - KEEP_MS;
        let link: Option<RunLink> = match conversation {
            Some(id) => on_pool!(
                self,
                sqlx::query_as(
                    "SELECT conversation_id, run_id, linked_ms FROM run_links
                     WHERE conversation_id = $1 AND linked_ms >= $2"
                )
                .bind(id)
                .bind(kept_since),
                fetch_optional
            )?,
            None => None,
        };
        let own = conversation.unwrap_or("");
        let linked = link.as_ref().map_or("", |l| l.run_id.as_str());
        let sql = lineage_sql();
        let runs = on_pool!(
            self,
            sqlx::query_as(&sql)
                .bind(own)
                .bind(linked)
                .bind(kept_since)
                .bind(awaiting_since_ms)
                .bind(sender.key_id)
                .bind(sender.client)
                .bind(sender.team),
            fetch_all
        )?;
        Ok(StoredLineage { link, runs })
    }

    /// The stored answer `id` and the answers it continues, newest first, as far back as
    /// they are kept.
    pub async fn stored_chain(&self, id: &str) -> Result<Vec<StoredAnswer>, Error> {
        let kept_since = super::now_ms() - KEEP_MS;
        // `depth` bounds the walk (and a cycle, which ids chosen by the API never make).
        const SQL: &str = "WITH RECURSIVE chain (id, parent_id, items, made_here, stored_ms,
                 depth) AS (
               SELECT id, parent_id, items, made_here, stored_ms, 0 FROM stored_responses
               WHERE id = $1 AND stored_ms >= $2
               UNION ALL
               SELECT s.id, s.parent_id, s.items, s.made_here, s.stored_ms, c.depth + 1
               FROM stored_responses s JOIN chain c ON s.id = c.parent_id
               WHERE c.depth < $3 AND s.stored_ms >= $2)
             SELECT id, parent_id, items, made_here, stored_ms FROM chain ORDER BY depth";
        on_pool!(
            self,
            sqlx::query_as(SQL)
                .bind(id)
                .bind(kept_since)
                .bind(CHAIN_MAX),
            fetch_all
        )
        .map_err(Error::from)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The rows of a run, a link and a chain of answers, as each backend reads them back:
    /// what another process finds on a miss.
    pub(in crate::store) async fn runs_are_read_back_as_written(store: &Store) {
        let now = crate::store::now_ms();
        let run = |id: &str, key: &str, awaiting: bool, at: i64| RunRow {
            id: id.into(),
            key_id: Some(key.into()),
            client: Some("claude-cli".into()),
            team: None,
            policy: "default".into(),
            compacted_ms: at,
            awaiting,
            server_compaction: None,
            carry: vec![1, 2, 3],
            last_ms: at,
        };
        store.log_run(RunRecord::Compacted(run("r1", "k1", true, now)));
        store.log_run(RunRecord::Compacted(run("r2", "k2", true, now)));
        // Past the day: expired, and not read.
        store.log_run(RunRecord::Compacted(run(
            "old",
            "k1",
            true,
            now - KEEP_MS - 1,
        )));
        store.log_run(RunRecord::ServerCompacted {
            run: "r2".into(),
            fingerprint: -7,
        });
        for (id, parent) in [("a1", None), ("a2", Some("a1")), ("a3", Some("a2"))] {
            store.log_run(RunRecord::Answer(StoredAnswer {
                id: id.into(),
                parent_id: parent.map(Into::into),
                items: format!("[\"{id}\"]"),
                made_here: id == "a2",
                stored_ms: now,
            }));
        }
        store.flush().await;
        let k1 = SentBy {
            key_id: Some("k1"),
            client: Some("claude-cli"),
            team: None,
        };
        // A new conversation of k1's: r1 awaits it; not r2 (another key), nor "old".
        let found = store
            .stored_lineage(Some("s2"), k1, now - 1000)
            .await
            .unwrap();
        assert_eq!(found.link, None);
        assert_eq!(found.runs, vec![run("r1", "k1", true, now)]);
        // Continued: linked, and no longer awaiting.
        store.log_run(RunRecord::Linked(RunLink {
            conversation_id: "s2".into(),
            run_id: "r1".into(),
            linked_ms: now + 5,
        }));
        store.flush().await;
        let other = SentBy {
            key_id: Some("k9"),
            ..k1
        };
        let found = store
            .stored_lineage(Some("s2"), other, now - 1000)
            .await
            .unwrap();
        assert_eq!(found.link.as_ref().map(|l| l.run_id.as_str()), Some("r1"));
        let r1 = RunRow {
            awaiting: false,
            last_ms: now + 5,
            ..run("r1", "k1", true, now)
        };
        assert_eq!(found.runs, vec![r1]);
        let none = store
            .stored_lineage(Some("s3"), k1, now - 1000)
            .await
            .unwrap();
        assert_eq!(none, StoredLineage::default());
        // A run's own id finds it, with what the API's compaction noted.
        let own = store.stored_lineage(Some("r2"), other, now).await.unwrap();
        assert_eq!(own.runs[0].server_compaction, Some(-7));
        // A chain newest first, from any of its answers.
        let chain = store.stored_chain("a3").await.unwrap();
        let ids: Vec<(&str, bool)> = chain.iter().map(|a| (a.id.as_str(), a.made_here)).collect();
        assert_eq!(ids, [("a3", false), ("a2", true), ("a1", false)]);
        assert_eq!(chain[1].items, "[\"a2\"]");
        // An answer's items are the conversation's text: stored with credentials masked.
        let key = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
        store.log_run(RunRecord::Answer(StoredAnswer {
            id: "s1".into(),
            parent_id: None,
            items: format!("[{{\"type\":\"message\",\"content\":\"env: KEY={key}\"}}]"),
            made_here: false,
            stored_ms: now,
        }));
        store.flush().await;
        let stored = &store.stored_chain("s1").await.unwrap()[0].items;
        assert!(
            !stored.contains(key) && stored.contains("env: KEY="),
            "{stored}"
        );
        serde_json::from_str::<serde_json::Value>(stored).unwrap();
        assert!(store.stored_chain("nope").await.unwrap().is_empty());
        // SQLite reads a miss's runs through indexes, never a scan of the runs (whose
        // states are tens of KB each).
        if let Backend::Sqlite(db) = &store.backend {
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(&format!("EXPLAIN QUERY PLAN {}", lineage_sql()))
                    .fetch_all(&db.pool())
                    .await
                    .unwrap();
            let plan: Vec<&str> = plan.iter().map(|(.., detail)| detail.as_str()).collect();
            assert!(
                plan.iter().all(|step| !step.starts_with("SCAN")),
                "{plan:?}"
            );
        }
    }
}
