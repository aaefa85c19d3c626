//! Pause for a human: a request the policy stops is held open instead of halted. It is
//! listed by `GET /admin/api/pending`, announced to the configured webhooks, and decided by
//! `POST /admin/api/pending/{id}` (`continue`, `nudge` or `halt`); when nobody decides in
//! time, the configured default applies. A held streaming request receives SSE comments
//! (`: keep-alive`) meanwhile, so neither the client nor anything in between times out.
//!
//! Held requests live in memory: a restart answers them (the client's connection is gone).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::oneshot;

use super::{PauseConfig, Verdict};

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
    pub reason: String,
    /// The findings behind the pause (summary and suggestion of each).
    pub findings: Vec<FindingInfo>,
    pub stream: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FindingInfo {
    pub detector: String,
    pub summary: String,
    pub suggestion: String,
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

/// Posts a held request to every webhook, each in its own task with its own timeout: a
/// slow or failing hook never delays the request or the other hooks.
pub fn notify(client: &reqwest::Client, config: &PauseConfig, info: &HeldInfo) {
    if config.webhooks.is_empty() {
        return;
    }
    let payload = serde_json::json!({
        "event": "loopwarden.pause",
        "pending": info,
        "decide": {
            "method": "POST",
            "path": format!("/admin/api/pending/{}", info.id),
            "body": {"decision": "continue | nudge | halt"},
        },
    });
    let timeout = Duration::from_millis(config.webhook_timeout_ms);
    let body = payload.to_string();
    for url in &config.webhooks {
        let request = client
            .post(url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .body(body.clone());
        let url = url.clone();
        crate::spawn::task("pause webhook", async move {
            match request.send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => {
                    tracing::warn!(%url, status = r.status().as_u16(), "pause webhook refused")
                }
                Err(e) => tracing::warn!(%url, error = %e, "pause webhook failed"),
            }
        });
    }
}

/// The comment a held streaming request receives now and then; every SSE client ignores it.
pub const KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// A streaming body that sends `: keep-alive` comments every `interval` (the first one at
/// once, so the client sees the answer begin) until `then` yields the real answer's body,
/// whose frames follow. The first keep-alive goes out with the response head, so a client
/// waiting for a first byte does not give up while a human decides.
pub fn keepalive_body<F>(interval: Duration, then: F) -> axum::body::Body
where
    F: Future<Output = axum::body::Body> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, axum::Error>>(16);
    crate::spawn::task("held request keep-alive", async move {
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
        tokio::pin!(then);
        let body = loop {
            tokio::select! {
                body = &mut then => break body,
                _ = tick.tick() => {
                    if tx.send(Ok(Bytes::from_static(KEEPALIVE))).await.is_err() {
                        return; // the client went away; dropping `then` withdraws the hold
                    }
                }
            }
        };
        use http_body_util::BodyExt;
        let mut body = body;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        if tx.send(Ok(data)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    axum::body::Body::from_stream(stream)
}
