//! The node protocol (SPEC §4): join with a one-time key, the desired-state long-poll and
//! the observed report.

use super::auth;
use super::body::{read_json, read_json_within, JOIN_LIMIT};
use super::error::ApiError;
use super::App;
use crate::clock;
use crate::store::{JoinError, ReportOutcome};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use fleet_api::{codes, validate, DesiredState, ErrorBody, JoinRequest, JoinResponse, ObservedReport};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Longest a desired-state poll may be held.
pub const MAX_WAIT_SECONDS: u64 = 60;

/// Join with a one-time key (§4.1). The node token is shown once.
#[utoipa::path(post, path = "/api/v1/nodes:join", tag = "node", request_body = JoinRequest,
    responses((status = 201, body = JoinResponse),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 401, description = "join_key_invalid", body = ErrorBody),
              (status = 409, description = "node_name_taken", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 20 failed joins a second", body = ErrorBody),
              (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn join(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    if app.joins_throttled() {
        app.metrics.join("throttled");
        return Err(ApiError::too_many("too many failed joins; try again in a second"));
    }
    let result = async {
        let req: JoinRequest = read_json_within(&headers, body, false, JOIN_LIMIT).await?;
        validate::join(&req).map_err(|e| ApiError::invalid_request(e.to_string()))?;
        match app.store.join(&req).await {
            Ok(resp) => {
                tracing::info!(node = %resp.node_id, name = %req.name, labels = ?req.labels, kinds = ?req.executor_kinds, "node joined");
                Ok(resp)
            }
            Err(JoinError::KeyInvalid) => {
                Err(ApiError::new(StatusCode::UNAUTHORIZED, codes::JOIN_KEY_INVALID, "the join key is unknown, used or expired"))
            }
            Err(JoinError::NameTaken(n)) => Err(ApiError::new(
                StatusCode::CONFLICT,
                codes::NODE_NAME_TAKEN,
                format!("a node named {n:?} already exists (a lost stateDir needs a new name)"),
            )),
            Err(JoinError::Db(e)) => Err(e.into()),
        }
    }
    .await;
    match result {
        Ok(resp) => {
            app.metrics.join("joined");
            app.kick();
            Ok((StatusCode::CREATED, axum::Json(resp)).into_response())
        }
        Err(e) => {
            if e.status != StatusCode::INTERNAL_SERVER_ERROR {
                app.note_failed_join();
            }
            app.metrics.join(e.code);
            tracing::info!(code = e.code, message = %e.message, "join refused");
            Err(e)
        }
    }
}

fn desired_response(body: axum::body::Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The node's desired state; held until the generation differs from `since` or `wait` runs out.
#[utoipa::path(get, path = "/api/v1/nodes/me/desired", tag = "node", security(("node" = [])),
    params(("since" = Option<i64>, Query, description = "the generation the node has", minimum = 0),
           ("wait" = Option<u64>, Query, description = "seconds to hold, 0…60 (default 0)", minimum = 0, maximum = 60)),
    responses((status = 200, body = DesiredState), (status = 304, description = "unchanged"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 4 held polls", body = ErrorBody), (status = 401, description = "node_token_invalid", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn desired(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let node = auth::node(&app.store, &headers, app.offline_after).await?;
    // The header values are slices of hyper's read buffer: held through a long-poll they keep
    // that buffer alive, and hyper allocates a second one for the connection's next read.
    drop(headers);
    let since = match q.get("since").filter(|s| !s.is_empty()) {
        None => None,
        // Generations are stored as SQLite integers: 0 … 2^63-1, as the contract says.
        Some(s) => match s.parse::<i64>() {
            Ok(g) if g >= 0 => Some(g as u64),
            _ => return Err(ApiError::invalid_request("since: must be a generation number (0 … 2^63-1)")),
        },
    };
    let wait = match q.get("wait").filter(|s| !s.is_empty()) {
        None => 0,
        Some(s) => match s.parse::<u64>() {
            Ok(w) if w <= MAX_WAIT_SECONDS => w,
            _ => return Err(ApiError::invalid_request(format!("wait: must be 0–{MAX_WAIT_SECONDS} seconds"))),
        },
    };
    let Some((mut generation, mut body)) = app.store.desired_body(&node) else {
        return Err(ApiError::node_token_invalid());
    };
    // The node has a newer generation than this replica: another replica served it before
    // this one heard of it (SPEC §3.9). Read it from the database rather than answer with an
    // older one.
    if since.is_some_and(|s| s > generation) && app.store.db.is_shared() {
        if let Err(e) = app.store.refresh_desired(&node).await {
            tracing::warn!(error = %e, "cannot read a node's newest desired state; answering with this replica's");
        }
        if let Some((g, b)) = app.store.desired_body(&node) {
            (generation, body) = (g, b);
        }
    }
    if since != Some(generation) {
        return Ok(desired_response(body));
    }
    if wait == 0 {
        return Ok(StatusCode::NOT_MODIFIED.into_response());
    }
    let Some(_held) = app.store.hub.hold(&node) else {
        return Err(ApiError::too_many("this node already holds the most long-polls allowed (4)"));
    };
    let mut rx = app.store.hub.subscribe(&node);
    // A bump between the read above and the subscription is seen here.
    if let Some((g, body)) = app.store.desired_body(&node) {
        if g != generation {
            return Ok(desired_response(body));
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(wait), rx.changed()).await;
    match app.store.desired_body(&node) {
        Some((g, body)) if g != generation => Ok(desired_response(body)),
        Some(_) => Ok(StatusCode::NOT_MODIFIED.into_response()),
        // Deleted while the poll was held (SPEC §10.1).
        None => Err(ApiError::node_token_invalid()),
    }
}

/// What the node has (§4.2). Unknown fields are refused, naming the field.
#[utoipa::path(put, path = "/api/v1/nodes/me/observed", tag = "node", security(("node" = [])), request_body = ObservedReport,
    responses((status = 204, description = "accepted (or ignored as stale)"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody), (status = 401, description = "node_token_invalid", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn observed(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Result<StatusCode, ApiError> {
    let node = auth::node(&app.store, &headers, app.offline_after).await?;
    let parsed = async {
        let r: ObservedReport = read_json(&headers, body, false).await?;
        validate::observed(&r).map_err(|e| ApiError::invalid_request(e.to_string()))?;
        Ok::<_, ApiError>(r)
    }
    .await;
    let report = match parsed {
        Ok(r) => r,
        Err(e) => {
            app.metrics.report("rejected");
            tracing::warn!(node = %node, code = e.code, message = %e.message, "observed report rejected (is the node newer than the controller?)");
            return Err(e);
        }
    };
    match app.store.report(&node, report, clock::now_ms(), app.offline_after) {
        ReportOutcome::Accepted { changed, was_online } => {
            app.metrics.report("accepted");
            if !was_online {
                tracing::info!(node = %node, "node is online again");
            }
            if changed || !was_online {
                app.kick();
            }
        }
        ReportOutcome::Stale => {
            app.metrics.report("stale");
        }
    }
    Ok(StatusCode::NO_CONTENT)
}
