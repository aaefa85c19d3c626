//! Several replicas on one PostgreSQL (issue 36): what one replica decides about a
//! conversation holds on the others. The request path never queries the database for it:
//! it reads each replica's memory (`crate::intervene::controls::Controls`,
//! `crate::budget::Ledger`), which this task brings up to date every [`SYNC_EVERY`]:
//!
//! - controls (sticky halts and resumes): the rows of `conversation_controls` changed
//!   since the last sync are merged in, the newest of each conversation winning;
//! - spend: this replica publishes its own spend of the conversations it charged lately
//!   (`replica_spend`, a row per replica and conversation), and reads back the others'
//!   sums, which the ledger adds to its own;
//! - held requests (`crate::intervene::pause::Pending`): the verdicts given through other
//!   replicas on the requests this one holds are delivered; and a heartbeat (`replicas`)
//!   lets the others mark abandoned the held requests of a replica silent for
//!   [`SILENT_MS`] (it died with them). A verdict also wakes its holder at once
//!   (`LISTEN loopwarden_pending`): polling is the fallback.
//!
//! So a halt, a resume or another replica's spend is seen here at most about
//! [`SYNC_EVERY`] × 2 after it was made (its writer's sync, then ours), plus the time a
//! query takes. Reads go back [`LOOKBACK_MS`] before the last sync, so that a row stamped
//! by a replica whose clock is a little behind, or committed late, is not missed.

use std::sync::Arc;
use std::time::Duration;

use crate::budget::Ledger;
use crate::intervene::controls::Controls;
use crate::intervene::pause::Pending;
use crate::store::{now_ms, Store};

/// How often a replica syncs. Two syncs (the publisher's and the reader's) stay within
/// the second the issue allows.
pub const SYNC_EVERY: Duration = Duration::from_millis(250);

/// How far before the last sync each read starts.
const LOOKBACK_MS: i64 = 5_000;

/// A replica that has not synced for this long is taken for dead: its held requests are
/// marked abandoned.
pub const SILENT_MS: i64 = 10_000;

/// A proxy's name among the replicas: unique per start (host, process, time, and a count
/// for several in one process), so a restarted replica's earlier spend stays counted under
/// its old name.
pub fn replica_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let n = STARTED.fetch_add(1, Ordering::Relaxed);
    format!("{host}:{}:{}:{n}", std::process::id(), now_ms())
}

/// What the sync reads and updates.
pub struct Shared {
    pub replica: String,
    pub store: Store,
    pub ledger: Ledger,
    pub controls: Controls,
    pub pending: Pending,
}

/// The running sync, shared by its task and the proxy's shutdown.
pub struct Replicas {
    sync: Arc<tokio::sync::Mutex<Sync>>,
}

impl Replicas {
    /// Syncs once (so that the others' halts and spend are known before the first request),
    /// then every [`SYNC_EVERY`], or at once when woken, while `alive` says so.
    pub async fn start(shared: Shared, alive: impl Fn() -> bool + Send + 'static) -> Replicas {
        let mut woken = shared.store.listen_pending().await;
        let sync = Arc::new(tokio::sync::Mutex::new(Sync::new(shared)));
        sync.lock().await.once().await;
        let task_sync = sync.clone();
        crate::spawn::task("replica sync", async move {
            let mut tick = tokio::time::interval(SYNC_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while alive() {
                match &mut woken {
                    Some(listener) => {
                        tokio::select! {
                            _ = tick.tick() => {}
                            _ = listener.recv() => {}
                        }
                    }
                    None => {
                        tick.tick().await;
                    }
                }
                task_sync.lock().await.once().await;
            }
        });
        Replicas { sync }
    }

    /// One last sync at shutdown, once no request is served any more: this replica's
    /// spend is published up to its last answer.
    pub async fn last_sync(&self) {
        self.sync.lock().await.once().await;
    }
}

/// The sync's state: where each read resumes.
struct Sync {
    shared: Shared,
    id: String,
    /// When the last successful publish, spend read and controls read began.
    published_ms: i64,
    spend_ms: i64,
    controls_ms: i64,
    /// The last sync failed (said once in the process log, and once when it recovers).
    failing: bool,
}

impl Sync {
    fn new(shared: Shared) -> Sync {
        let now = now_ms();
        Sync {
            id: shared.replica.clone(),
            shared,
            // Everything charged before this process started is in the log of an earlier
            // one (read back as another replica's).
            published_ms: now,
            spend_ms: now - Ledger::REMEMBER_MS,
            // `Controls::load` read every control at start.
            controls_ms: now - LOOKBACK_MS,
            failing: false,
        }
    }

    async fn once(&mut self) {
        let started = now_ms();
        let result = self.exchange(started).await;
        match (result, self.failing) {
            (Ok(()), true) => {
                self.failing = false;
                tracing::info!("replica sync works again: shared halts and spend are current");
            }
            (Err(e), false) => {
                self.failing = true;
                tracing::warn!(error = %e, "replica sync failed: other replicas' halts and spend are not seen until it works again");
            }
            _ => {}
        }
    }

    async fn exchange(&mut self, started: i64) -> Result<(), crate::store::Error> {
        let Shared {
            replica,
            store,
            ledger,
            controls,
            pending,
        } = &self.shared;
        pending.take_verdicts().await?;
        let abandoned = store.heartbeat(replica, SILENT_MS).await?;
        if abandoned > 0 {
            tracing::warn!(
                abandoned,
                "held requests of a replica that stopped syncing marked abandoned"
            );
        }
        let mine = ledger.charged_since(self.published_ms - LOOKBACK_MS);
        if !mine.is_empty() {
            store.publish_spend(&self.id, &mine).await?;
        }
        self.published_ms = started;
        let theirs = store
            .others_spend(&self.id, self.spend_ms - LOOKBACK_MS)
            .await?;
        ledger.merge_others(theirs);
        self.spend_ms = started;
        let changed = store.controls_since(self.controls_ms - LOOKBACK_MS).await?;
        controls.merge(changed);
        self.controls_ms = started;
        Ok(())
    }
}
