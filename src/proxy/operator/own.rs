//! The proxy's own paths, answered here and never forwarded: `/` (what this is), `/healthz`,
//! `/readyz`, `/favicon.ico` (asked for by every browser that opens the dashboard), `/admin`
//! and everything under it (the admin API), `/ui` and everything under it (the dashboard:
//! [`super::dashboard`]), and `/metrics` ([`super::scrape`]). An agent whose base URL is the
//! bare proxy never reaches the upstream with these, and they are not logged as requests.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use http::StatusCode;

use super::{admin, dashboard};
use crate::proxy::forward::App;

/// Whether `path` is one of the proxy's own, which [`router`] answers. Every other request
/// is forwarded, and goes straight to `forward::handle` rather than through the router:
/// matching its routes, the peer's address stored in the request (only the admin API reads
/// it) and the mapping of the answer cost ~4.8 k of a serving thread's ~74 k instructions
/// per 8.8 KB request (BENCHMARKS.md, "What was tried"). Paths beside these (`/healthz/`,
/// `/administrator`, `/uix`) are the upstream's.
pub fn answered_here(path: &str) -> bool {
    match path {
        "/" | "/healthz" | "/readyz" | "/favicon.ico" | "/admin" | "/metrics" | "/ui" => true,
        _ => path.starts_with("/admin/") || path.starts_with("/ui/"),
    }
}

/// The router of the paths [`answered_here`] lets through. Its fallback answers the ones
/// without a route (`/metrics`, `/ui`, an unknown admin call): they are the proxy's all the
/// same.
pub fn router(app: Arc<App>) -> Router {
    // About the whole proxy: a team's token is refused (403).
    let global = Router::new()
        .route("/admin/api/policies/reload", post(admin::reload_policies))
        .route_layer(axum::middleware::from_fn(admin::require_global));
    let admin = Router::new()
        .route("/admin/api/conversations", get(admin::conversations))
        .route("/admin/api/conversations/{id}", get(admin::conversation))
        .route("/admin/api/stats", get(admin::stats))
        .route("/admin/api/spend", get(admin::spend))
        .route(
            "/admin/api/conversations/{id}/resume",
            post(admin::resume_conversation),
        )
        .route(
            "/admin/api/conversations/{id}/halt",
            post(admin::halt_conversation),
        )
        .route("/admin/api/pending", get(admin::pending))
        .route("/admin/api/pending/{id}", post(admin::decide_pending))
        .route("/admin/api/overview", get(dashboard::overview))
        .route("/admin/api/access", get(admin::access_of))
        // A team's token reads its own policies there (`admin::policies`).
        .route("/admin/api/policies", get(admin::policies))
        .route("/admin/api/feedback", post(dashboard::feedback))
        .merge(global)
        // Unknown admin calls go through the access rule too: a caller without access
        // learns nothing of which calls exist.
        .route("/admin/{*rest}", any(not_found))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            admin::require_access,
        ));
    // The dashboard's pages, behind the same rules; its login form (with its script and
    // the styles) outside them.
    let pages = Router::new()
        .route("/ui", get(dashboard::index))
        .route("/ui/", get(dashboard::index))
        .route("/ui/app.js", get(dashboard::app_js))
        .route("/ui/{*rest}", any(not_found))
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            dashboard::require_page_access,
        ))
        .route(
            "/ui/login",
            get(dashboard::login_form).post(dashboard::login),
        )
        .route("/ui/login.js", get(dashboard::login_js))
        .route("/ui/app.css", get(dashboard::app_css))
        .layer(axum::middleware::from_fn(dashboard::page_headers));
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/favicon.ico", get(favicon))
        .route("/metrics", get(super::scrape::metrics))
        .merge(admin)
        .merge(pages)
        .fallback(not_found)
        .with_state(app)
}

/// `GET /`: what this is and where to go, for whoever points a browser or `curl` at it.
async fn index() -> Response {
    Json(serde_json::json!({
        "name": "loopwarden",
        "version": env!("CARGO_PKG_VERSION"),
        "about": "a reverse proxy between LLM coding agents and their model APIs: point an \
                  agent's OpenAI, Anthropic or Gemini base URL here",
        "health": "/healthz",
        "admin_api": "/admin/api/",
        "ready": "/readyz",
        "dashboard": "/ui/",
    }))
    .into_response()
}

/// `GET /healthz`: answered to anyone.
async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`, answered to anyone: `200 ready` while the proxy takes new requests,
/// `503 stopping` from the start of a stop (`server.drain_secs`: it still serves them for
/// that long, so that a load balancer polling this stops sending them first).
async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.stopping.load(std::sync::atomic::Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n").into_response()
    } else {
        "ready\n".into_response()
    }
}

/// `GET /favicon.ico`: no icon (`204`), cached for a day. A browser asks for it with every
/// page of the dashboard; forwarded, it would reach the model's provider as traffic.
async fn favicon() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(http::header::CACHE_CONTROL, "max-age=86400")],
    )
        .into_response()
}

/// A path of the proxy's that answers nothing (yet).
async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "not found; the proxy owns this path" })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::answered_here;

    #[test]
    fn the_proxy_owns_its_paths_and_not_the_ones_beside_them() {
        for own in [
            "/",
            "/healthz",
            "/readyz",
            "/favicon.ico",
            "/admin",
            "/admin/",
            "/admin/api/x",
            "/metrics",
            "/ui",
            "/ui/a",
        ] {
            assert!(answered_here(own), "{own}");
        }
        for upstream in [
            "",
            "/healthz/",
            "/administrator",
            "/metrics/",
            "/uix",
            "/v1/models",
            "/c/x/admin",
        ] {
            assert!(!answered_here(upstream), "{upstream}");
        }
    }
}
