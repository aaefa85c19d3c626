//! The admin API under `/admin/api/`, and `/healthz`.
//!
//! Access: with `admin.token` set, every call needs `Authorization: Bearer <token>`;
//! without one, only loopback clients are answered (the log holds what agents did).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{header, HeaderMap, StatusCode};
use serde::Deserialize;

use super::App;
use crate::store::query;

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

fn internal(e: sqlx::Error) -> Response {
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
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(params): Query<ListParams>,
) -> Response {
    if !allowed(&app.config.admin.token, &headers, peer) {
        return refuse(&app);
    }
    let limit = params.limit.unwrap_or(100).clamp(1, 10_000);
    match query::conversations(app.store.pool(), limit).await {
        Ok(list) => Json(serde_json::json!({ "conversations": list })).into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/conversations/{id}`: the timeline.
pub async fn conversation(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if !allowed(&app.config.admin.token, &headers, peer) {
        return refuse(&app);
    }
    match query::timeline(app.store.pool(), &id).await {
        Ok(Some(timeline)) => Json(timeline).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": "no such conversation" })),
        )
            .into_response(),
        Err(e) => internal(e),
    }
}

/// `GET /admin/api/stats`: the proxy's own overhead and the log's health.
pub async fn stats(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    if !allowed(&app.config.admin.token, &headers, peer) {
        return refuse(&app);
    }
    match query::overhead(app.store.pool(), 1000).await {
        Ok(overhead) => {
            let (cached_messages, cached_bytes) = app.cache.size();
            Json(serde_json::json!({
                "proxy_overhead_us": overhead,
                "log": app.store.health(),
                "recorder_dropped": app.recorder.dropped(),
                "cache": { "messages": cached_messages, "bytes": cached_bytes },
            }))
            .into_response()
        }
        Err(e) => internal(e),
    }
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
