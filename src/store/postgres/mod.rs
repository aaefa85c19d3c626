//! The log in PostgreSQL (issue 36: several replicas on one database). Migrated at open
//! (`migrations/postgres/`, the same tables and columns as SQLite's), read through a sqlx
//! pool ([`read`], the conversations' controls), and written by the log's writer thread
//! ([`write`]) on a connection of its own, with the same queue, batching, counters and
//! retry policy as SQLite's (`super::writer`).

pub(crate) mod dashboard;
pub(crate) mod read;
pub(crate) mod shared;
pub(crate) mod write;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::writer::{self, Handle};
use super::{Label, LoggedSpend, Masked, StoreOptions};

/// Whether a database URL names PostgreSQL (`postgres://` or `postgresql://`).
pub fn is_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// How long the read side waits for a connection: a request for the admin API fails
/// rather than hangs while the database is unreachable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// The read side of a PostgreSQL log.
#[derive(Clone)]
pub(crate) struct Postgres {
    pool: PgPool,
}

/// Connects and migrates (replicas starting together migrate one at a time: sqlx holds an
/// advisory lock while it migrates), and starts the writer thread.
pub(super) async fn open(url: &str, options: StoreOptions) -> anyhow::Result<(Postgres, Handle)> {
    // The error names no part of the URL: it may hold a password.
    let connect: PgConnectOptions = url
        .parse()
        .map_err(|e| anyhow::anyhow!("bad PostgreSQL URL in store.db: {e}"))?;
    let at = describe(&connect);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(connect.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot open database {at}: {e}"))?;
    sqlx::migrate!("./migrations/postgres")
        .run(&pool)
        .await
        .map_err(|e| anyhow::anyhow!("cannot migrate database {at}: {e}"))?;
    let handle = writer::start(&options, move |queue| write::run(connect, queue))
        .map_err(|e| anyhow::anyhow!("cannot start the log writer: {e}"))?;
    Ok((Postgres { pool }, handle))
}

/// Where the URL points, without its credentials, for messages.
fn describe(connect: &PgConnectOptions) -> String {
    let database = connect.get_database().unwrap_or("(default)");
    format!(
        "postgres://{}:{}/{database}",
        connect.get_host(),
        connect.get_port()
    )
}

impl Postgres {
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Replaces this replica's rows of the conversations given (`replica_spend`).
    pub(crate) async fn publish_spend(
        &self,
        replica: &str,
        spend: &[LoggedSpend],
    ) -> Result<(), sqlx::Error> {
        let now = super::now_ms();
        for chunk in spend.chunks(1000) {
            let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(
                "INSERT INTO replica_spend (replica, conversation_id, policy, requests, unpriced,
                   steps, input_tokens, cached_input_tokens, cache_write_tokens, output_tokens,
                   cost_usd, first_ms, last_ms, updated_ms) ",
            );
            q.push_values(chunk, |mut v, s| {
                v.push_bind(replica)
                    .push_bind(&s.conversation_id)
                    .push_bind(&s.policy)
                    .push_bind(s.requests)
                    .push_bind(s.unpriced)
                    .push_bind(s.steps)
                    .push_bind(s.input_tokens)
                    .push_bind(s.cached_input_tokens)
                    .push_bind(s.cache_write_tokens)
                    .push_bind(s.output_tokens)
                    .push_bind(s.cost_usd)
                    .push_bind(s.first_ms)
                    .push_bind(s.last_ms)
                    .push_bind(now);
            });
            q.push(
                " ON CONFLICT (replica, conversation_id) DO UPDATE SET policy = excluded.policy,
                   requests = excluded.requests, unpriced = excluded.unpriced,
                   steps = excluded.steps, input_tokens = excluded.input_tokens,
                   cached_input_tokens = excluded.cached_input_tokens,
                   cache_write_tokens = excluded.cache_write_tokens,
                   output_tokens = excluded.output_tokens, cost_usd = excluded.cost_usd,
                   first_ms = excluded.first_ms, last_ms = excluded.last_ms,
                   updated_ms = excluded.updated_ms",
            );
            q.build().execute(&self.pool).await?;
        }
        Ok(())
    }

    /// The other replicas' spend per conversation, for the conversations published since
    /// `since_ms`; the policy is that of the latest answer.
    pub(crate) async fn others_spend(
        &self,
        replica: &str,
        since_ms: i64,
    ) -> Result<Vec<LoggedSpend>, sqlx::Error> {
        sqlx::query_as(
            "SELECT conversation_id, sum(requests)::BIGINT AS requests, max(steps) AS steps,
                    sum(input_tokens)::BIGINT AS input_tokens,
                    sum(cached_input_tokens)::BIGINT AS cached_input_tokens,
                    sum(cache_write_tokens)::BIGINT AS cache_write_tokens,
                    sum(output_tokens)::BIGINT AS output_tokens, sum(cost_usd) AS cost_usd,
                    sum(unpriced)::BIGINT AS unpriced, min(first_ms) AS first_ms,
                    max(last_ms) AS last_ms,
                    (array_agg(policy ORDER BY last_ms DESC))[1] AS policy
             FROM replica_spend
             WHERE replica <> $1 AND conversation_id IN
               (SELECT conversation_id FROM replica_spend WHERE updated_ms >= $2 AND replica <> $1)
             GROUP BY conversation_id",
        )
        .bind(replica)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await
    }
}

/// A new, empty database on the server at `admin_url` (for tests: each test its own), and
/// its URL.
#[doc(hidden)]
pub async fn scratch_database(admin_url: &str) -> anyhow::Result<String> {
    use sqlx::Connection;
    use std::sync::atomic::{AtomicU64, Ordering};
    static MADE: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "lw_{}_{}_{}",
        std::process::id(),
        super::now_ms(),
        MADE.fetch_add(1, Ordering::Relaxed)
    );
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let (server, _) = admin_url
        .rsplit_once('/')
        .ok_or_else(|| anyhow::anyhow!("{admin_url}: no database in the URL"))?;
    Ok(format!("{server}/{name}"))
}

/// Types kept as text, read back through `From<String>` (as in SQLite: `Masked` text read
/// back is masked again).
macro_rules! text_column {
    ($($t:ty),*) => {$(
        impl sqlx::Type<sqlx::Postgres> for $t {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <String as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <String as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $t {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<$t, sqlx::error::BoxDynError> {
                <String as sqlx::Decode<sqlx::Postgres>>::decode(value).map(<$t>::from)
            }
        }
    )*};
}

text_column!(Label, Masked);
