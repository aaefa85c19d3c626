//! The admin API's reads in PostgreSQL (`crate::store::read`).

crate::store::read::reads!(sqlx::PgPool);
