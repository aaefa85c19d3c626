//! Answers the proxy gives itself, in the error shape of the API the client speaks, so its
//! SDK reports them like the API's own: an upstream that cannot be reached or does not
//! answer (shapes from the dialect module, which owns wire formats), and a request the
//! proxy refuses to read (too large, broken off).

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, StatusCode};

use super::route::Upstream;
use crate::dialect::{Dialect, UpstreamFailure};

/// The dialect whose error shape an API family uses (both OpenAI APIs share one).
fn dialect_of(upstream: Upstream) -> Dialect {
    match upstream {
        Upstream::OpenAi => Dialect::OpenAiChat,
        Upstream::Anthropic => Dialect::Anthropic,
        Upstream::Gemini => Dialect::Gemini,
    }
}

/// 502 or 504 in `upstream`'s error shape.
pub fn upstream_failure(upstream: Upstream, failure: UpstreamFailure, message: &str) -> Response {
    let status = StatusCode::from_u16(failure.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    json(status, dialect_of(upstream).error_body(message, failure))
}

/// A 4xx for a request the proxy will not read, in `upstream`'s error shape. (The
/// dialect module has shapes for upstream failures only; these are the same shapes with
/// the client-error type of each API.)
pub fn refused(upstream: Upstream, status: StatusCode, message: &str) -> Response {
    let body = match upstream {
        Upstream::OpenAi => serde_json::json!({
            "error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}
        }),
        Upstream::Anthropic => serde_json::json!({
            "type": "error",
            "error": {
                "type": if status == StatusCode::PAYLOAD_TOO_LARGE { "request_too_large" } else { "invalid_request_error" },
                "message": message,
            }
        }),
        Upstream::Gemini => serde_json::json!({
            "error": {"code": status.as_u16(), "message": message, "status": "INVALID_ARGUMENT"}
        }),
    };
    json(status, body.to_string().into_bytes())
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
