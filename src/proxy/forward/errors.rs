//! Answers the proxy gives itself, in the error shape of the API the client speaks, so its
//! SDK reports them like the API's own: an upstream that cannot be reached or does not
//! answer (shapes from the dialect module, which owns wire formats), and a request the
//! proxy refuses ([`Refusal`]).

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, StatusCode};

use crate::dialect::{Dialect, UpstreamFailure};
use crate::proxy::serve::route::Upstream;

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

/// A request the proxy refuses to forward, decided before its body is read or while it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `CONNECT`: the proxy is no tunnel.
    Connect,
    /// A path whose `..` segments climb above the root (`crate::proxy::serve::route::ClimbsOut`).
    ClimbsOut,
    /// A body larger than `server.max_body_bytes`, announced or as it arrived.
    TooLarge { max: usize },
    /// A body that broke off.
    Unreadable,
    /// A WebSocket upgrade, with `server.websocket = "refuse"`.
    WebSocket,
    /// A body that went `server.body_timeout_secs` without a byte.
    Stalled { secs: u64 },
}

impl Refusal {
    /// The refusal of a body `read_body` could not read within `max` bytes, or without a
    /// byte for `idle_secs`.
    pub fn of_body(e: &axum::BoxError, max: usize, idle_secs: u64) -> Refusal {
        if e.is::<http_body_util::LengthLimitError>() {
            Refusal::TooLarge { max }
        } else if caused_by_stall(e) {
            Refusal::Stalled { secs: idle_secs }
        } else {
            Refusal::Unreadable
        }
    }

    pub fn status(self) -> StatusCode {
        match self {
            Refusal::Connect => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::ClimbsOut | Refusal::Unreadable => StatusCode::BAD_REQUEST,
            Refusal::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::WebSocket => StatusCode::UPGRADE_REQUIRED,
            Refusal::Stalled { .. } => StatusCode::REQUEST_TIMEOUT,
        }
    }

    pub fn message(self) -> String {
        match self {
            Refusal::Connect => "loopwarden: CONNECT is not supported; this is a reverse \
                                 proxy, not a tunnel"
                .to_string(),
            Refusal::ClimbsOut => {
                "loopwarden: the path's \"..\" segments climb above its root".to_string()
            }
            Refusal::TooLarge { max } => {
                format!("loopwarden: request body larger than server.max_body_bytes ({max})")
            }
            Refusal::Unreadable => "loopwarden: could not read the request body".to_string(),
            Refusal::WebSocket => "loopwarden: WebSocket upgrades are refused here \
                                   (server.websocket = \"refuse\"); use HTTP"
                .to_string(),
            Refusal::Stalled { secs } => format!(
                "loopwarden: no byte of the request body for {secs} s (server.body_timeout_secs)"
            ),
        }
    }
}

/// Whether a body error is, or wraps (the body's and the limit's own error types box it),
/// [`super::body::BodyStalled`].
fn caused_by_stall(e: &axum::BoxError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(error) = cause {
        if error.is::<super::body::BodyStalled>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The answer to a refused request, in `upstream`'s error shape. (The dialect module has
/// shapes for upstream failures only; these are the same shapes with the client-error type
/// of each API.)
pub fn refused(upstream: Upstream, refusal: Refusal) -> Response {
    let status = refusal.status();
    let message = refusal.message();
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
