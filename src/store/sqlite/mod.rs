//! The log in SQLite: one database file, created and migrated at open (sqlx, `migrations/`),
//! read through a small sqlx pool ([`read`], the conversations' controls), and written by
//! the log's writer thread on a rusqlite connection of its own ([`write`]).

pub(crate) mod dashboard;
pub(crate) mod read;
pub(crate) mod write;

use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

use super::writer::{self, Handle};
use super::{Label, Masked, StoreOptions};

/// The read side of a SQLite log.
#[derive(Clone)]
pub(crate) struct Sqlite {
    db: Arc<Database>,
}

/// The database at the configured path, shared by the read side and the writer thread,
/// which makes a new one there when the file is deleted under the proxy.
pub(crate) struct Database {
    url: String,
    connect: SqliteConnectOptions,
    /// The read side's pool; replaced with the database.
    pool: RwLock<SqlitePool>,
    /// The runtime that opened the log, which the writer thread makes a new database
    /// through (sqlx, the migrations).
    runtime: tokio::runtime::Handle,
}

impl Database {
    pub(crate) fn pool(&self) -> SqlitePool {
        self.pool
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn path(&self) -> &Path {
        self.connect.get_filename()
    }

    /// Closes the read side's connections to the database whose file is gone, then creates
    /// and migrates a new one at the path. Called from the writer thread once its own
    /// connection is closed: the last connection to the old file to close removes its WAL
    /// files by their names, which must not be the new database's by then.
    pub(crate) fn recreate(&self) -> anyhow::Result<()> {
        self.runtime.block_on(async {
            self.pool().close().await;
            let pool = connect_and_migrate(&self.url, &self.connect).await?;
            *self.pool.write().unwrap_or_else(PoisonError::into_inner) = pool;
            Ok(())
        })
    }
}

/// The read side's pool on the database at `connect` (created if missing), migrated.
async fn connect_and_migrate(
    url: &str,
    connect: &SqliteConnectOptions,
) -> anyhow::Result<SqlitePool> {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(connect.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot open database {url:?}: {e}"))?;
    sqlx::migrate!("./migrations")
        .run(&pool)
        .await
        .map_err(|e| anyhow::anyhow!("cannot migrate database {url:?}: {e}"))?;
    Ok(pool)
}

/// Opens (creating if missing) and migrates the database at `url`, and starts the writer
/// thread on a connection of its own.
pub(crate) async fn open(url: &str, options: StoreOptions) -> anyhow::Result<(Sqlite, Handle)> {
    let connect = SqliteConnectOptions::from_str(url)
        .map_err(|e| anyhow::anyhow!("database URL {url:?}: {e}"))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // WAL + NORMAL: durable across process crashes, fast enough for batched writes.
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    let pool = connect_and_migrate(url, &connect).await?;
    let db = Arc::new(Database {
        url: url.to_string(),
        connect,
        pool: RwLock::new(pool),
        runtime: tokio::runtime::Handle::current(),
    });
    let cannot_write = |e: &dyn std::fmt::Display| {
        anyhow::anyhow!("cannot open database {url:?} for writing: {e}")
    };
    let conn = write::open(db.path()).map_err(|e| cannot_write(&e))?;
    let writer_db = db.clone();
    let handle = writer::start(&options, move |queue| write::run(conn, &writer_db, queue))
        .map_err(|e| cannot_write(&e))?;
    Ok((Sqlite { db }, handle))
}

impl Sqlite {
    pub(crate) fn pool(&self) -> SqlitePool {
        self.db.pool()
    }
}

/// Types kept as text in SQLite, through either library, and read back through
/// `From<String>`. `Masked` text read back is masked again: a log written before a pattern
/// was added is served masked all the same.
macro_rules! text_column {
    ($($t:ty),*) => {$(
        impl sqlx::Type<sqlx::Sqlite> for $t {
            fn type_info() -> sqlx::sqlite::SqliteTypeInfo {
                <String as sqlx::Type<sqlx::Sqlite>>::type_info()
            }
            fn compatible(ty: &sqlx::sqlite::SqliteTypeInfo) -> bool {
                <String as sqlx::Type<sqlx::Sqlite>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Sqlite> for $t {
            fn decode(
                value: sqlx::sqlite::SqliteValueRef<'r>,
            ) -> Result<$t, sqlx::error::BoxDynError> {
                <String as sqlx::Decode<sqlx::Sqlite>>::decode(value).map(<$t>::from)
            }
        }

        impl rusqlite::ToSql for $t {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                self.as_str().to_sql()
            }
        }
    )*};
}

text_column!(Label, Masked);
