//! Pause for a human: a request the policy stops is held open instead of halted. It is
//! listed by `GET /admin/api/pending`, announced to the configured webhooks, and decided by
//! `POST /admin/api/pending/{id}` (`continue`, `nudge` or `halt`); when nobody decides in
//! time, the configured default applies. A held streaming request receives SSE comments
//! (`: keep-alive`) meanwhile, so neither the client nor anything in between times out
//! (the webhooks and the comments are the proxy's: `crate::proxy::forward::held`).
//!
//! Held requests live in memory. When the proxy stops, each is answered at once as its
//! timeout would answer it ([`Pending::release_all`], [`DecidedBy::Shutdown`]): nobody
//! could decide it any more (the admin API is closed), and a stop must not wait
//! `timeout_secs` for it.
//! Replicas sharing a PostgreSQL database also list them there ([`Pending::share`]), so
//! that any replica's admin API lists and decides them: a verdict given elsewhere reaches
//! the holder through `crate::replicas`, and a replica that dies holding requests has them
//! marked abandoned by the others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::oneshot;

use super::Verdict;
use crate::store::{Masked, Store};

/// What the admin API and the webhooks show of a held request.
#[derive(Debug, Clone, Serialize)]
pub struct HeldInfo {
    pub id: String,
    pub conversation_id: String,
    /// The team the held request named: who may decide it with a team's admin token.
    pub team: Option<String>,
    pub created_ms: i64,
    /// When `on_timeout` applies.
    pub deadline_ms: i64,
    pub on_timeout: Verdict,
    pub detector: String,
    pub reason: Masked,
    /// The findings behind the pause (summary and suggestion of each).
    pub findings: Vec<FindingInfo>,
    pub stream: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FindingInfo {
    pub detector: String,
    pub summary: Masked,
    pub suggestion: Masked,
}

struct Held {
    info: HeldInfo,
    decide: oneshot::Sender<Verdict>,
}

/// The requests currently held, by id.
#[derive(Clone)]
pub struct Pending {
    held: Arc<Mutex<HashMap<String, Held>>>,
    /// The latest requests withdrawn undecided (their client went away), newest last, at
    /// most [`ABANDONED_KEPT`]: so that a human deciding one is told it was abandoned.
    abandoned: Arc<Mutex<std::collections::VecDeque<HeldInfo>>>,
    next: Arc<AtomicU64>,
    /// Where they are listed for other replicas, once shared.
    shared: Arc<OnceLock<Shared>>,
    /// Turns `true` when the proxy stops: every held request, and any held later, gets its
    /// timeout's verdict at once.
    stopping: Arc<tokio::sync::watch::Sender<bool>>,
}

/// The shared database and this replica's name in it.
struct Shared {
    store: Store,
    replica: String,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            held: Arc::default(),
            abandoned: Arc::default(),
            next: Arc::default(),
            shared: Arc::default(),
            stopping: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

/// How a held request was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    Human,
    Timeout,
    /// The proxy stopped: the timeout's verdict, given at once.
    Shutdown,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Human => "human",
            DecidedBy::Timeout => "timeout",
            DecidedBy::Shutdown => "shutdown",
        }
    }
}

/// Abandoned held requests remembered for a human who comes to decide one.
const ABANDONED_KEPT: usize = 256;

/// The held requests as the admin API lists them ([`Pending::list_everywhere`]).
#[derive(Debug, Serialize)]
pub struct Listing {
    pub pending: Vec<serde_json::Value>,
    /// Why the list may be missing some (the shared database could not be read); `None`
    /// when it is complete.
    pub incomplete: Option<Masked>,
}

/// A held request waiting for its verdict; dropping it withdraws the request from the list.
pub struct Ticket {
    id: String,
    pending: Pending,
    rx: Option<oneshot::Receiver<Verdict>>,
    /// The conversation and the request's JSON, to list it for other replicas (shared only).
    listed: Option<(String, String)>,
}

impl Ticket {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Waits for a human's verdict, or applies `default` after `timeout`.
    pub async fn verdict(mut self, timeout: Duration, default: Verdict) -> (Verdict, DecidedBy) {
        let Some(rx) = self.rx.take() else {
            return (default, DecidedBy::Timeout);
        };
        if let (Some(shared), Some((conversation, info))) =
            (self.pending.shared.get(), self.listed.take())
        {
            // Listed before waiting, so that its withdrawal (at the drop) comes after.
            if let Err(e) = shared
                .store
                .hold_shared(&shared.replica, &self.id, &conversation, &info)
                .await
            {
                tracing::warn!(error = %e, id = %self.id, "cannot list the held request for the other replicas: only this one can decide it");
            }
        }
        let mut stopping = self.pending.stopping.subscribe();
        let decided = tokio::select! {
            decided = tokio::time::timeout(timeout, rx) => match decided {
                Ok(Ok(v)) => (v, DecidedBy::Human),
                _ => (default, DecidedBy::Timeout),
            },
            // It only ever turns `true`; its sender lives as long as `self.pending`.
            _ = stopping.wait_for(|stopping| *stopping) => (default, DecidedBy::Shutdown),
        };
        // Decided (by a human or the timeout): off the list, so that the drop does not
        // take it for abandoned.
        self.pending.lock().remove(&self.id);
        decided
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Still listed: nobody decided it, its client went away.
        if let Some(held) = self.pending.lock().remove(&self.id) {
            let mut abandoned = self.pending.abandoned_list();
            if abandoned.len() == ABANDONED_KEPT {
                abandoned.pop_front();
            }
            abandoned.push_back(held.info);
        }
        // Off a runtime (a process tearing down) the next sync withdraws it instead.
        let on_runtime = tokio::runtime::Handle::try_current().is_ok();
        if let (Some(shared), true) = (self.pending.shared.get(), on_runtime) {
            let (store, id) = (shared.store.clone(), std::mem::take(&mut self.id));
            crate::spawn::task("held request withdrawal", async move {
                if let Err(e) = store.release_shared(&id).await {
                    tracing::warn!(error = %e, id, "cannot withdraw the held request from the shared list");
                }
            });
        }
    }
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn abandoned_list(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<HeldInfo>> {
        self.abandoned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request held here that was withdrawn undecided (its client went away), if it is
    /// among the latest ones.
    pub fn abandoned(&self, id: &str) -> Option<HeldInfo> {
        self.abandoned_list().iter().find(|h| h.id == id).cloned()
    }

    /// Lists held requests in `store` too, as `replica`'s (several replicas on one
    /// PostgreSQL; once, at start).
    pub fn share(&self, store: Store, replica: String) {
        let _ = self.shared.set(Shared { store, replica });
    }

    /// Holds a request; `info.id` is assigned here.
    pub fn hold(&self, mut info: HeldInfo) -> (Ticket, HeldInfo) {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        info.id = format!("p{n}-{}", fastrand::u32(..));
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            info.id.clone(),
            Held {
                info: info.clone(),
                decide: tx,
            },
        );
        (
            Ticket {
                id: info.id.clone(),
                pending: self.clone(),
                rx: Some(rx),
                listed: self.shared.get().and_then(|_| {
                    let json = serde_json::to_string(&info).ok()?;
                    Some((info.conversation_id.clone(), json))
                }),
            },
            info,
        )
    }

    /// The proxy stops: every request held now or later gets its timeout's verdict at
    /// once ([`DecidedBy::Shutdown`]). Returns how many were held.
    pub fn release_all(&self) -> usize {
        self.stopping.send_replace(true);
        self.lock().len()
    }

    /// Every held request, oldest first.
    pub fn list(&self) -> Vec<HeldInfo> {
        let mut list: Vec<HeldInfo> = self.lock().values().map(|h| h.info.clone()).collect();
        list.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        list
    }

    /// Delivers a verdict; `None` when no request is held under that id (decided already,
    /// timed out, or its client went away).
    pub fn decide(&self, id: &str, verdict: Verdict) -> Option<HeldInfo> {
        let held = self.lock().remove(id)?;
        let info = held.info.clone();
        held.decide.send(verdict).ok().map(|_| info)
    }

    /// Every held request, this replica's and (shared) the others', oldest first, as the
    /// admin API shows them. When the database cannot be read the others' are left out,
    /// and the listing says so (`incomplete`), as does the process log: an empty list
    /// must not read as "nobody is waiting" when it only means "cannot tell".
    pub async fn list_everywhere(&self) -> Listing {
        let mine = self.list();
        let mut all: Vec<serde_json::Value> = mine
            .iter()
            .filter_map(|h| serde_json::to_value(h).ok())
            .collect();
        let mut incomplete = None;
        if let Some(shared) = self.shared.get() {
            match shared.store.held_elsewhere(&shared.replica).await {
                Ok(theirs) => all.extend(
                    theirs
                        .iter()
                        .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok()),
                ),
                Err(e) => {
                    let error = Masked::from(format!(
                        "the other replicas' held requests could not be read: {e}"
                    ));
                    tracing::warn!(error = %error.as_str(), "held requests listed in part");
                    incomplete = Some(error);
                }
            }
            all.sort_by_key(|h| h["created_ms"].as_i64().unwrap_or(0));
        }
        Listing {
            pending: all,
            incomplete,
        }
    }

    /// Delivers a verdict to a request held here or (shared) on another replica, which
    /// releases it at its next sync; the request as the admin API shows it, or `None` when
    /// none is held under that id.
    pub async fn decide_anywhere(
        &self,
        id: &str,
        verdict: Verdict,
    ) -> Result<Option<serde_json::Value>, crate::store::Error> {
        if let Some(info) = self.decide(id, verdict) {
            return Ok(serde_json::to_value(info).ok());
        }
        let Some(shared) = self.shared.get() else {
            return Ok(None);
        };
        let theirs = shared.store.decide_shared(id, verdict.as_str()).await?;
        Ok(theirs.and_then(|json| serde_json::from_str(&json).ok()))
    }

    /// Delivers the verdicts other replicas gave requests held here, and withdraws from
    /// the shared list what is no longer held here (`crate::replicas`).
    pub async fn take_verdicts(&self) -> Result<(), crate::store::Error> {
        let Some(shared) = self.shared.get() else {
            return Ok(());
        };
        let held: Vec<String> = self.lock().keys().cloned().collect();
        shared.store.withdraw_gone(&shared.replica, &held).await?;
        for (id, verdict) in shared.store.take_verdicts(&shared.replica).await? {
            let verdict = serde_json::from_value(serde_json::Value::String(verdict));
            match verdict {
                Ok(verdict) => {
                    self.decide(&id, verdict);
                }
                Err(e) => tracing::warn!(error = %e, id, "a held request's verdict is not one"),
            }
        }
        Ok(())
    }
}
