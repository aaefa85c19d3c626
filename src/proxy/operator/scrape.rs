//! `GET /metrics`: the Prometheus exposition of [`crate::metrics`].
//!
//! Access: with `metrics.token` set, `Authorization: Bearer <metrics.token>` (a scraper
//! need not hold the admin token); otherwise the admin API's rules
//! ([`super::admin::check`]: the admin token, or a loopback client naming this machine).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header;

use super::admin;
use crate::metrics::Snapshot;
use crate::proxy::forward::App;

/// The exposition, or the admin API's refusal.
pub async fn metrics(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let token = match app.config.metrics.token.as_str() {
        "" => app.config.admin.token.as_str(),
        own => own,
    };
    let listen = app.config.listen_addr().ok().map(|a| a.ip());
    if let Err(denied) = admin::check(token, listen, peer, request.method(), request.headers()) {
        let body = Json(serde_json::json!({ "error": denied.message() }));
        return (denied.status(), body).into_response();
    }
    let log = app.store.health();
    let now = Snapshot {
        live_conversations: app.analyser.memory.held().conversations as u64,
        held_requests: app.interventions.pending.list().len() as u64,
        log_queue_depth: app.store.queue_depth() as u64,
        log,
        reloads: app.policies.counts().map(|(o, n)| (o.as_str(), n)),
    };
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        app.metrics.encode(now),
    )
        .into_response()
}
