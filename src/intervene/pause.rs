//! Pause for a human: a request the policy stops is held open instead of halted. It is
//! listed by `GET /admin/api/pending`, announced to the configured webhooks, and decided by
//! `POST /admin/api/pending/{id}` (`continue`, `nudge` or `halt`); when nobody decides in
//! time, the configured default applies. A held streaming request receives SSE comments
//! (`: keep-alive`) meanwhile, so neither the client nor anything in between times out
//! (the webhooks and the comments are the proxy's: `crate::proxy::held`).
//!
//! Held requests live in memory: a restart answers them (the client's connection is gone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::oneshot;

use super::Verdict;
use crate::store::Masked;

/// What the admin API and the webhooks show of a held request.
#[derive(Debug, Clone, Serialize)]
pub struct HeldInfo {
    pub id: String,
    pub conversation_id: String,
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
#[derive(Clone, Default)]
pub struct Pending {
    held: Arc<Mutex<HashMap<String, Held>>>,
    next: Arc<AtomicU64>,
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
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Human => "human",
            DecidedBy::Timeout => "timeout",
        }
    }
}

/// A held request waiting for its verdict; dropping it withdraws the request from the list.
pub struct Ticket {
    id: String,
    pending: Pending,
    rx: Option<oneshot::Receiver<Verdict>>,
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
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(v)) => (v, DecidedBy::Human),
            _ => (default, DecidedBy::Timeout),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.pending.lock().remove(&self.id);
    }
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
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
            },
            info,
        )
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
}
