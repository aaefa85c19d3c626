//! The admin API's reads in SQLite (`crate::store::read`), on the pool's reader
//! connections (WAL lets them run beside the writer).

crate::store::read::reads!(sqlx::SqlitePool);
