//! The dashboard's SQL on SQLite (`crate::store::dashboard_sql`).

crate::store::dashboard_sql::dashboard_reads!(sqlx::SqlitePool);
