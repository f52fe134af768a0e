//! The one place errors become HTTP answers: a status, `{"error": "<code>", "message":
//! "<text>"}` as JSON, and its content type, built once ([`ApiError::answer`]) for both
//! transports — axum's responses and the node routes' raw HTTP/1.1 path.

use super::answer::Answer;
use super::limits::{BODY_DEADLINE, MAX_HEAD};
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleet_api::{codes, ErrorBody};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    pub fn not_configured() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            codes::NOT_CONFIGURED,
            "the controller has no service account yet: set FLEET_CLIENT_ID and FLEET_CLIENT_SECRET",
        )
    }
    pub fn invalid_token(why: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, codes::INVALID_TOKEN, why)
    }
    pub fn insufficient_scope(need: &str) -> Self {
        Self::new(StatusCode::FORBIDDEN, codes::INSUFFICIENT_SCOPE, format!("this route needs the scope {need}"))
    }
    pub fn node_token_invalid() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, codes::NODE_TOKEN_INVALID, "the node token is missing, unknown or revoked")
    }
    /// A node token this store neither knows nor deleted (docs/behaviour.md#a-store-older-than-the-fleet).
    pub fn node_unknown() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, codes::NODE_UNKNOWN, codes::NODE_UNKNOWN_MESSAGE)
    }
    /// The message names the bad field; what the client sent in it is bounded (docs/behaviour.md#hardening): a
    /// field name of 60,000 characters makes no 60,000-character answer or log line.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, codes::INVALID_REQUEST, bounded(&message.into()))
    }
    pub fn too_large(limit: usize) -> Self {
        let size = size(limit);
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, codes::PAYLOAD_TOO_LARGE, format!("the body is larger than {size}"))
    }
    /// A request head past [`MAX_HEAD`]. hyper answers such a head itself, without a body,
    /// on the connections it serves.
    pub fn head_too_large() -> Self {
        let size = size(MAX_HEAD);
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            codes::INVALID_REQUEST,
            format!("the request head is larger than {size}"),
        )
    }
    pub fn request_timeout() -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            codes::REQUEST_TIMEOUT,
            format!("the body did not arrive within {} s of the request head", BODY_DEADLINE.as_secs()),
        )
    }
    pub fn too_many(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, codes::TOO_MANY_REQUESTS, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, codes::NOT_FOUND, message)
    }
    /// `/readyz` when this replica cannot serve (docs/behaviour.md#high-availability).
    pub fn not_ready(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, codes::NOT_READY, message)
    }
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        let (method, path) = (cut(method), cut(path));
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            codes::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        )
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, codes::INTERNAL, message)
    }
}

/// A limit in bytes as messages give it: `1 MiB`, `64 KiB`.
fn size(limit: usize) -> String {
    if limit >= 1 << 20 {
        format!("{} MiB", limit >> 20)
    } else {
        format!("{} KiB", limit >> 10)
    }
}

/// A message that may quote what a client sent: at most 300 characters (then `…`), control
/// characters replaced.
fn bounded(message: &str) -> String {
    let mut out: String = message.chars().take(300).map(|c| if c.is_control() { '\u{fffd}' } else { c }).collect();
    if message.chars().nth(300).is_some() {
        out.push('…');
    }
    out
}

/// A string from a request as it may appear in a message or a log line: at most 200
/// characters, control characters escaped (docs/behaviour.md#hardening).
pub fn cut(s: &str) -> String {
    s.chars().take(200).collect::<String>().escape_debug().to_string()
}

impl ApiError {
    /// The answer this error is on either transport.
    pub fn answer(self) -> Answer {
        let body = ErrorBody { error: self.code.to_string(), message: self.message };
        // Two strings always serialise.
        let json = serde_json::to_vec(&body).unwrap_or_default();
        Answer { status: self.status, json: Some(Bytes::from(json)), headers: &[] }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.answer().into_response()
    }
}

impl From<crate::store::db::DbError> for ApiError {
    fn from(e: crate::store::db::DbError) -> Self {
        tracing::error!(error = %e, "store failure");
        ApiError::internal("the controller's store failed; try again")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_client_sent_is_bounded_in_messages_and_logs() {
        let long = format!("invalid body: unknown field `{}\n`", "x".repeat(60_000));
        let e = ApiError::invalid_request(long);
        assert_eq!(e.message.chars().count(), 301);
        assert!(e.message.ends_with('…') && !e.message.contains('\n'), "{}", &e.message[..40]);
        assert_eq!(ApiError::invalid_request("ttlSeconds: must be 60–604800").message, "ttlSeconds: must be 60–604800");
        assert_eq!(cut(&"é".repeat(300)).chars().count(), 200);
        assert_eq!(cut("a\nb\u{1b}[31m"), "a\\nb\\u{1b}[31m");
    }
}
