//! Errors the proxy itself answers (upstream unreachable, timeout, body too large), in the
//! error shape of the API the client speaks, so its SDK reports them like the API's own.

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, StatusCode};

use super::route::Upstream;

/// A JSON error response shaped like `upstream`'s own errors.
// TODO(dialect): move to the dialect module's `error_body` once it lands, so that wire
// shapes live in one place.
pub fn api_error(upstream: Upstream, status: StatusCode, message: &str) -> Response {
    let body = match upstream {
        Upstream::OpenAi => serde_json::json!({
            "error": {
                "message": message,
                "type": "loopwarden_error",
                "param": null,
                "code": status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_"),
            }
        }),
        Upstream::Anthropic => serde_json::json!({
            "type": "error",
            "error": {
                "type": if status == StatusCode::PAYLOAD_TOO_LARGE { "request_too_large" } else { "api_error" },
                "message": message,
            }
        }),
        Upstream::Gemini => serde_json::json!({
            "error": {
                "code": status.as_u16(),
                "message": message,
                "status": match status {
                    StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
                    StatusCode::PAYLOAD_TOO_LARGE | StatusCode::BAD_REQUEST => "INVALID_ARGUMENT",
                    _ => "UNAVAILABLE",
                },
            }
        }),
    };
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
