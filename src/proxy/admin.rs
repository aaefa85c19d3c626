//! The admin API under `/admin/api/`, and `/healthz`.
//!
//! Access: with `admin.token` set, every call needs `Authorization: Bearer <token>`;
//! without one, only loopback clients are answered (the log holds what agents did).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, StatusCode};
use serde::Deserialize;

use super::App;

/// Whether a caller may use the admin API.
pub fn allowed(token: &str, headers: &HeaderMap, peer: SocketAddr) -> bool {
    if token.is_empty() {
        return peer.ip().is_loopback();
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    constant_time_eq(presented.as_bytes(), token.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn refuse(app: &App) -> Response {
    let message = if app.config.admin.token.is_empty() {
        "admin API: loopback clients only (set LOOPWARDEN_ADMIN_TOKEN to allow others)"
    } else {
        "admin API: missing or wrong bearer token"
    };
    let status = if app.config.admin.token.is_empty() {
        StatusCode::FORBIDDEN
    } else {
        StatusCode::UNAUTHORIZED
    };
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// The access rule, applied once to every `/admin/api/` route (see [`allowed`]).
pub async fn require_access(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    if !allowed(&app.config.admin.token, request.headers(), peer) {
        return refuse(&app);
    }
    next.run(request).await
}

fn internal(e: crate::store::Error) -> Response {
    tracing::warn!(error = %e, "admin query failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(serde_json::json!({ "error": "log query failed" })),
    )
        .into_response()
}

#[derive(Deserialize)]
pub struct ListParams {
    limit: Option<i64>,
}

/// `GET /admin/api/conversations?limit=N`: newest first, with counts.
pub async fn conversations(
    State(app): State<Arc<App>>,
    Query(params): Query<ListParams>,
) -> Response {
    let limit = params.limit.unwrap_or(100).clamp(1, 10_000);
    match app.store.conversations(limit).await {
        Ok(list) => Json(serde_json::json!({ "conversations": list })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/conversations/{id}`: the timeline.
pub async fn conversation(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.store.timeline(&id).await {
        Ok(Some(timeline)) => Json(timeline).into_response(),
        Ok(None) => no_such_conversation(),
        Err(e) => internal(e),
    }
}

fn no_such_conversation() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "no such conversation" })),
    )
        .into_response()
}

/// `POST /admin/api/conversations/{id}/resume`: releases a halted conversation; its next
/// request goes upstream and detection starts over from there. 404 for an id the proxy
/// has not seen.
pub async fn resume_conversation(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.interventions.operator_resume(&id).await {
        Ok(Some(control)) => Json(serde_json::json!({ "resumed": control })).into_response(),
        Ok(None) => no_such_conversation(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize, Default)]
struct HaltBody {
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /admin/api/conversations/{id}/halt` (optional body `{"reason": "..."}`): halts a
/// conversation by hand; its requests get the halt reply until it is resumed or a human
/// writes to it. 404 for an id the proxy has not seen.
pub async fn halt_conversation(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let parsed: HaltBody = if body.iter().all(u8::is_ascii_whitespace) {
        HaltBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => return bad_request(&format!("expected {{\"reason\": \"...\"}}: {e}")),
        }
    };
    let reason = parsed
        .reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| "no reason given".to_string());
    match app.interventions.operator_halt(&id, &reason).await {
        Ok(Some(control)) => Json(serde_json::json!({ "halted": control })).into_response(),
        Ok(None) => no_such_conversation(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/pending`: requests held for a human, oldest first.
pub async fn pending(State(app): State<Arc<App>>) -> Response {
    Json(serde_json::json!({ "pending": app.interventions.pending.list() })).into_response()
}

#[derive(Deserialize)]
struct DecideBody {
    decision: crate::intervene::Verdict,
}

/// `POST /admin/api/pending/{id}` with `{"decision": "continue" | "nudge" | "halt"}`.
pub async fn decide_pending(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let verdict = match serde_json::from_slice::<DecideBody>(&body) {
        Ok(b) => b.decision,
        Err(e) => {
            return bad_request(&format!(
                "expected {{\"decision\": \"continue\" | \"nudge\" | \"halt\"}}: {e}"
            ))
        }
    };
    match app.interventions.pending.decide(&id, verdict) {
        Some(held) => Json(serde_json::json!({ "decided": verdict.as_str(), "pending": held }))
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": "no request held under that id (decided, timed out or gone)" })),
        )
            .into_response(),
    }
}

fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "error": message })),
    )
        .into_response()
}

/// `GET /admin/api/stats`: the proxy's own overhead and the log's health.
pub async fn stats(State(app): State<Arc<App>>) -> Response {
    match app.store.overhead(1000).await {
        Ok(overhead) => {
            let (cached_messages, cached_bytes) = app.analyser.cache.size();
            Json(serde_json::json!({
                "proxy_overhead_us": overhead,
                "log": app.store.health(),
                "cache": { "messages": cached_messages, "bytes": cached_bytes },
                // Conversations whose state (engine fold, last request) is held in memory;
                // idle ones are dropped, so this falls back to 0 when agents stop.
                "live_conversations": app.analyser.conversations.len(),
                // Open client connections on each serving thread (see `proxy::spread`).
                "connections": app.spread.open(),
            }))
            .into_response()
        }
        Err(e) => internal(e),
    }
}

pub async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "no such admin call" })),
    )
        .into_response()
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules() {
        let loopback: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:5".parse().unwrap();
        let none = HeaderMap::new();
        assert!(allowed("", &none, loopback));
        assert!(!allowed("", &none, remote));
        let mut good = HeaderMap::new();
        good.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
        let mut bad = HeaderMap::new();
        bad.insert(header::AUTHORIZATION, "Bearer s3cres".parse().unwrap());
        assert!(allowed("s3cret", &good, remote));
        assert!(!allowed("s3cret", &bad, loopback));
        assert!(
            !allowed("s3cret", &none, loopback),
            "a token applies to loopback too"
        );
    }
}
