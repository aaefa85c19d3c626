//! The store's side of the state replicas share (issue 36: `crate::replicas`,
//! `crate::intervene::pause`). Only PostgreSQL shares anything: on SQLite, which one
//! process owns, each of these does nothing and finds nothing.

use std::time::Duration;

use super::postgres::shared as pg;
use super::{Backend, Error, Store};

/// Wakes a replica when another decides one of its held requests (PostgreSQL's `LISTEN`).
pub struct PendingListener(sqlx::postgres::PgListener);

impl PendingListener {
    /// Waits for a notification. A lost connection is made again by the next call; a
    /// failed one waits a moment first, so that a database down does not spin its caller.
    pub async fn recv(&mut self) {
        if let Err(e) = self.0.recv().await {
            tracing::debug!(error = %e, "LISTEN connection lost; polling meanwhile");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Store {
    /// Lists a request held on `replica` for the other replicas (`info`: its JSON).
    pub async fn hold_shared(
        &self,
        replica: &str,
        id: &str,
        conversation: &str,
        info: &str,
    ) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(db) => {
                Ok(pg::hold(db.pool(), replica, id, conversation, info).await?)
            }
        }
    }

    /// Withdraws a held request from the list (answered, or its client gone).
    pub async fn release_shared(&self, id: &str) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(db) => Ok(pg::release(db.pool(), id).await?),
        }
    }

    /// The requests other replicas hold, as their JSON, oldest first.
    pub async fn held_elsewhere(&self, replica: &str) -> Result<Vec<String>, Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Vec::new()),
            Backend::Postgres(db) => Ok(pg::held_elsewhere(db.pool(), replica).await?),
        }
    }

    /// Decides a request another replica holds; its JSON, or `None` when none is held
    /// under that id.
    pub async fn decide_shared(&self, id: &str, verdict: &str) -> Result<Option<String>, Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(None),
            Backend::Postgres(db) => Ok(pg::decide(db.pool(), id, verdict).await?),
        }
    }

    /// The verdicts other replicas gave this replica's held requests, `(id, verdict)`.
    pub async fn take_verdicts(&self, replica: &str) -> Result<Vec<(String, String)>, Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(Vec::new()),
            Backend::Postgres(db) => Ok(pg::take_verdicts(db.pool(), replica).await?),
        }
    }

    /// Withdraws `replica`'s listed requests other than `held` (the ones it still holds).
    pub async fn withdraw_gone(&self, replica: &str, held: &[String]) -> Result<(), Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(db) => Ok(pg::withdraw_gone(db.pool(), replica, held).await?),
        }
    }

    /// Says `replica` is alive, and marks abandoned the held requests of replicas silent
    /// for `silent_ms`; returns how many were.
    pub async fn heartbeat(&self, replica: &str, silent_ms: i64) -> Result<u64, Error> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(0),
            Backend::Postgres(db) => Ok(pg::heartbeat(db.pool(), replica, silent_ms).await?),
        }
    }

    /// A listener for the verdicts on this replica's held requests; `None` on SQLite, or
    /// when it cannot listen (the sync's polling delivers them then).
    pub async fn listen_pending(&self) -> Option<PendingListener> {
        let Backend::Postgres(db) = &self.backend else {
            return None;
        };
        let listen = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(db.pool()).await?;
            listener.listen(pg::PENDING_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listen.await {
            Ok(listener) => Some(PendingListener(listener)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot LISTEN for verdicts: polling for them");
                None
            }
        }
    }
}
