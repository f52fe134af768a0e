//! Reading bodies over axum after authentication, so the precedence of docs/reference.md#http-api holds
//! (`401`/`403` before `413`/`400`): at most a limit (`413`, by the declared length before a
//! byte is read, else while reading), within the body deadline (`408`), and JSON objects
//! strictly, errors naming the field.

use super::error::ApiError;
use super::limits::{BODY_DEADLINE, BODY_LIMIT};
use super::strangers::Guest;
use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// Whether a body-read error is the length limit (http-body-util's `LengthLimitError`,
/// wrapped by axum; matched by its text since the type is not re-exported).
fn is_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        if err.to_string().contains("length limit exceeded") {
            return true;
        }
        cur = err.source();
    }
    false
}

pub async fn read_json<T: DeserializeOwned>(headers: &HeaderMap, body: Body, empty_ok: bool) -> Result<T, ApiError> {
    let bytes = read_bytes(headers, body, BODY_LIMIT).await?;
    parse_json(&bytes, empty_ok)
}

/// The body as bytes: at most `limit` (`413`), all of it within [`BODY_DEADLINE`] (`408`).
pub async fn read_bytes(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    fits(declared(headers), limit)?;
    read_all(body, limit).await
}

/// The length `content-length` declares, if it does (a chunked body does not).
pub fn declared(headers: &HeaderMap) -> Option<u64> {
    headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// `413` for a declared length over `limit`, before any of the body is read.
pub fn fits(declared: Option<u64>, limit: usize) -> Result<(), ApiError> {
    match declared {
        Some(len) if len > limit as u64 => Err(ApiError::too_large(limit)),
        _ => Ok(()),
    }
}

/// Reads `body` whole: past `limit` is `413` (a body without a declared length), past
/// [`BODY_DEADLINE`] `408`.
pub async fn read_all(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let read = tokio::time::timeout(BODY_DEADLINE, axum::body::to_bytes(body, limit));
    read.await.map_err(|_| ApiError::request_timeout())?.map_err(|e| {
        if is_limit(&e) {
            ApiError::too_large(limit)
        } else {
            ApiError::invalid_request(format!("cannot read the body: {e}"))
        }
    })
}

/// Reads `body` whole as [`read_all`] does, each piece held by `guest` before it is kept: a
/// join's body, read before any credential (docs/behaviour.md#hardening). Shed from the
/// budget, the connection is closed (its task aborted) without an answer.
pub async fn read_held(body: Body, limit: usize, guest: &Arc<Guest>) -> Result<Bytes, ApiError> {
    let read = async {
        let mut frames = body.into_data_stream();
        let mut all = Vec::new();
        while let Some(frame) = frames.next().await {
            let frame = frame.map_err(|e| ApiError::invalid_request(format!("cannot read the body: {e}")))?;
            if all.len() + frame.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            if !guest.hold(all.len() + frame.len()) {
                std::future::pending::<()>().await;
            }
            all.extend_from_slice(&frame);
        }
        Ok(Bytes::from(all))
    };
    tokio::time::timeout(BODY_DEADLINE, read).await.map_err(|_| ApiError::request_timeout())?
}

/// A JSON object from `bytes`; with `empty_ok` an empty body is `{}`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8], empty_ok: bool) -> Result<T, ApiError> {
    let bytes: &[u8] = if empty_ok && bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { bytes };
    // Every body is a JSON object; serde would also build a struct from an array of its
    // fields in order (`[null, null]`), which the contract does not allow.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::invalid_request("invalid body: expected a JSON object"));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid_request(format!("invalid body: {e}")))
}
