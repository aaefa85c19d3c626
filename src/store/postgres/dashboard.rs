//! The dashboard's SQL on PostgreSQL (`crate::store::dashboard_sql`).

crate::store::dashboard_sql::dashboard_reads!(sqlx::PgPool);
