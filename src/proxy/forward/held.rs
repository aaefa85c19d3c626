//! A request held for a human, in HTTP terms: the webhooks that announce it (sent with the
//! proxy's own HTTP client) and the stream that keeps a streaming client waiting. What a
//! held request is, and how it is decided, is `crate::intervene::pause`.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::intervene::pause::HeldInfo;
use crate::intervene::PauseConfig;
use crate::proxy::upstream;

/// Posts a held request to every webhook ([`crate::proxy::upstream::post_all`]).
pub fn notify(client: &upstream::Client, config: &PauseConfig, info: &HeldInfo) {
    if config.webhooks.is_empty() {
        return;
    }
    let payload = serde_json::json!({
        "event": "loopwarden.pause",
        "pending": info,
        "decide": {
            "method": "POST",
            "path": format!("/admin/api/pending/{}", info.id),
            "content_type": "application/json",
            "body": {"decision": "continue | nudge | halt"},
        },
    });
    post_to_webhooks(client, config, &payload);
}

/// Posts a pause event to every webhook of `config`.
fn post_to_webhooks(client: &upstream::Client, config: &PauseConfig, payload: &serde_json::Value) {
    let timeout = Duration::from_millis(config.webhook_timeout_ms);
    upstream::post_all(
        client,
        &config.webhooks,
        payload,
        timeout,
        "pause webhook",
        |_| {},
    );
}

/// Tells every webhook that a held request was abandoned (its client went away before
/// anyone decided), so that whoever was asked to decide it knows.
pub fn notify_abandoned(
    client: &upstream::Client,
    config: &PauseConfig,
    id: &str,
    conversation: &str,
) {
    if config.webhooks.is_empty() {
        return;
    }
    let payload = serde_json::json!({
        "event": "loopwarden.pause.abandoned",
        "pending": {"id": id, "conversation_id": conversation},
        "reason": "the request's client went away before anyone decided",
    });
    post_to_webhooks(client, config, &payload);
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
