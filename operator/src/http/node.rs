//! The node protocol (SPEC §4): join with a one-time key, the desired-state long-poll and
//! the observed report.

use super::app::App;
use super::auth;
use super::body::{parse_json, read_bytes};
use super::error::ApiError;
use super::limits::{BODY_LIMIT as LIMIT, JOIN_LIMIT, MAX_WAIT_SECONDS};
use crate::clock;
use crate::store::{Id, JoinError, ReportOutcome};
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use fleet_api::{codes, protocol, validate, DesiredState, ErrorBody, JoinRequest, JoinResponse, ObservedReport};
use std::sync::Arc;
use std::time::Duration;

/// Join with a one-time key (§4.1). The node token is shown once.
#[utoipa::path(post, path = "/api/v1/nodes:join", tag = "node", request_body = JoinRequest,
    responses((status = 201, body = JoinResponse),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 401, description = "join_key_invalid", body = ErrorBody),
              (status = 409, description = "node_name_taken", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 20 failed joins a second", body = ErrorBody),
              (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn join(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Result<Reply, ApiError> {
    join_admitted(&app)?;
    let bytes = read_bytes(&headers, body, JOIN_LIMIT).await;
    join_with(&app, bytes.as_deref()).await
}

/// `429` while failed joins in this second reached the limit.
pub fn join_admitted(app: &App) -> Result<(), ApiError> {
    if app.joins_throttled() {
        app.metrics.join("throttled");
        return Err(ApiError::too_many("too many failed joins; try again in a second"));
    }
    Ok(())
}

/// A join from its body (or the error reading it): `201` with the node's id and token.
pub async fn join_with(app: &App, body: Result<&[u8], &ApiError>) -> Result<Reply, ApiError> {
    let result = async {
        let req: JoinRequest = parse_json(body.map_err(Clone::clone)?, false)?;
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
            let body = serde_json::to_vec(&resp).map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(Reply::Joined(body.into()))
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

/// What a node route answers when it succeeds, with the exchange offered (SPEC §4.2).
#[derive(Debug)]
pub enum Reply {
    /// `201` with the join's answer.
    Joined(Bytes),
    /// `200` with the desired state.
    Desired(Bytes),
    /// `304`: the generation is unchanged.
    NotModified,
    /// `204`: the report was taken.
    Accepted,
}

impl Reply {
    pub fn status(&self) -> StatusCode {
        match self {
            Reply::Joined(_) => StatusCode::CREATED,
            Reply::Desired(_) => StatusCode::OK,
            Reply::NotModified => StatusCode::NOT_MODIFIED,
            Reply::Accepted => StatusCode::NO_CONTENT,
        }
    }
}

impl Reply {
    /// The JSON body, for the answers that have one.
    pub fn into_body(self) -> Option<Bytes> {
        match self {
            Reply::Joined(b) | Reply::Desired(b) => Some(b),
            Reply::NotModified | Reply::Accepted => None,
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let status = self.status();
        let offer = [(protocol::EXCHANGE_HEADER, protocol::EXCHANGE_PATH)];
        match self {
            Reply::Joined(body) | Reply::Desired(body) => {
                (status, offer, [(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
            Reply::NotModified | Reply::Accepted => (status, offer).into_response(),
        }
    }
}

/// `since` and `wait` of a long-poll or an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub since: Option<u64>,
    pub seconds: u64,
}

/// Reads `since` and `wait` from a raw query string; `400` names the bad one.
pub fn parse_wait(query: Option<&str>) -> Result<Wait, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|_| ApiError::invalid_request("query: cannot be decoded (since=<generation>&wait=<seconds>)"))?;
    // The last of a repeated parameter counts, as with any map of the query.
    let value = |name: &str| pairs.iter().rev().find(|(k, v)| k == name && !v.is_empty()).map(|(_, v)| v.as_str());
    let since = match value("since") {
        None => None,
        // Generations are stored as SQLite integers: 0 … 2^63-1, as the contract says.
        Some(s) => match s.parse::<i64>() {
            Ok(g) if g >= 0 => Some(g as u64),
            _ => return Err(ApiError::invalid_request("since: must be a generation number (0 … 2^63-1)")),
        },
    };
    let seconds = match value("wait") {
        None => 0,
        Some(s) => match s.parse::<u64>() {
            Ok(w) if w <= MAX_WAIT_SECONDS => w,
            _ => return Err(ApiError::invalid_request(format!("wait: must be 0–{MAX_WAIT_SECONDS} seconds"))),
        },
    };
    Ok(Wait { since, seconds })
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
    RawQuery(query): RawQuery,
) -> Result<Reply, ApiError> {
    app.metrics.node_request("desired");
    let node = auth::node(&app.store, &headers, app.offline_after).await?;
    // The header values are slices of hyper's read buffer: held through a long-poll they keep
    // that buffer alive, and hyper allocates a second one for the connection's next read.
    drop(headers);
    let wait = parse_wait(query.as_deref())?;
    hold(&app, &node, wait).await
}

/// The long-poll once the node is known: at once when the generation differs from `since`,
/// `304` for `wait` 0, else held until it changes or `wait` runs out.
pub async fn hold(app: &App, node: &Id, wait: Wait) -> Result<Reply, ApiError> {
    let Some((mut generation, mut body)) = app.store.desired_body(node) else {
        return Err(ApiError::node_token_invalid());
    };
    // The node has a newer generation than this replica: another replica served it before
    // this one heard of it (SPEC §3.9). Read it from the database rather than answer with an
    // older one.
    if wait.since.is_some_and(|s| s > generation) && app.store.db.is_shared() {
        if let Err(e) = Box::pin(app.store.refresh_desired(node)).await {
            tracing::warn!(error = %e, "cannot read a node's newest desired state; answering with this replica's");
        }
        if let Some((g, b)) = app.store.desired_body(node) {
            (generation, body) = (g, b);
        }
    }
    if wait.since != Some(generation) {
        return Box::pin(desired_reply(app, node, body)).await;
    }
    // The node has this generation: its body can go.
    drop(body);
    app.store.delivered(node, generation);
    if wait.seconds == 0 {
        return Ok(Reply::NotModified);
    }
    let Some(_held) = app.store.hub.hold(node) else {
        return Err(ApiError::too_many("this node already holds the most long-polls allowed (4)"));
    };
    let mut rx = app.store.hub.subscribe(node);
    // A bump between the read above and the subscription is seen here.
    if let Some((g, body)) = app.store.desired_body(node) {
        if g != generation {
            return Box::pin(desired_reply(app, node, body)).await;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(wait.seconds), rx.changed()).await;
    match app.store.desired_body(node) {
        Some((g, body)) if g != generation => Box::pin(desired_reply(app, node, body)).await,
        Some(_) => Ok(Reply::NotModified),
        // Deleted while the poll was held (SPEC §10.1).
        None => Err(ApiError::node_token_invalid()),
    }
}

/// The desired state as served: the held body, or the stored one read back.
async fn desired_reply(app: &App, node: &Id, body: Option<Bytes>) -> Result<Reply, ApiError> {
    if let Some(b) = body {
        return Ok(Reply::Desired(b));
    }
    match app.store.load_desired(node).await {
        Ok(Some((_, b))) => Ok(Reply::Desired(b)),
        Ok(None) => Err(ApiError::node_token_invalid()),
        Err(e) => {
            tracing::error!(node = %node, error = %e, "cannot read a node's stored desired state");
            Err(e.into())
        }
    }
}

/// What the node has (§4.2). Unknown fields are refused, naming the field.
#[utoipa::path(put, path = "/api/v1/nodes/me/observed", tag = "node", security(("node" = [])), request_body = ObservedReport,
    responses((status = 204, description = "accepted (or ignored as stale)"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody), (status = 401, description = "node_token_invalid", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn observed(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Result<Reply, ApiError> {
    app.metrics.node_request("observed");
    let node = auth::node(&app.store, &headers, app.offline_after).await?;
    let bytes = read_bytes(&headers, body, LIMIT).await.map_err(|e| report_rejected(&app, &node, e))?;
    accept_report(&app, &node, &bytes)?;
    Ok(Reply::Accepted)
}

/// The report and the long-poll in one request, so a node keeps one connection (SPEC §4.2):
/// the body is taken as by `PUT observed`, then the answer is that of `GET desired` with the
/// same `since` and `wait`. A refused report is answered `400` and nothing is held.
#[utoipa::path(post, path = "/api/v1/nodes/me/exchange", tag = "node", security(("node" = [])), request_body = ObservedReport,
    params(("since" = Option<i64>, Query, description = "the generation the node has", minimum = 0),
           ("wait" = Option<u64>, Query, description = "seconds to hold, 0…60 (default 0)", minimum = 0, maximum = 60)),
    responses((status = 200, body = DesiredState), (status = 304, description = "report taken; generation unchanged"),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 408, description = "request_timeout", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody),
              (status = 429, description = "too_many_requests: more than 4 held polls", body = ErrorBody), (status = 401, description = "node_token_invalid", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn exchange(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: Body,
) -> Result<Reply, ApiError> {
    app.metrics.node_request("exchange");
    let node = auth::node(&app.store, &headers, app.offline_after).await?;
    let wait = parse_wait(query.as_deref())?;
    let bytes = read_bytes(&headers, body, LIMIT).await.map_err(|e| report_rejected(&app, &node, e))?;
    drop(headers);
    accept_report(&app, &node, &bytes)?;
    drop(bytes);
    hold(&app, &node, wait).await
}

/// Counts and logs a refused report, and passes the error on.
pub fn report_rejected(app: &App, node: &Id, e: ApiError) -> ApiError {
    app.metrics.report("rejected");
    tracing::warn!(node = %node, code = e.code, message = %e.message, "observed report rejected (is the node newer than the controller?)");
    e
}

/// Takes a report body for `node`: strict JSON (`400` naming the field), then the registry.
pub fn accept_report(app: &App, node: &Id, body: &[u8]) -> Result<(), ApiError> {
    let parsed = parse_json::<ObservedReport>(body, false)
        .and_then(|r| validate::observed(&r).map(|()| r).map_err(|e| ApiError::invalid_request(e.to_string())));
    let report = parsed.map_err(|e| report_rejected(app, node, e))?;
    match app.store.report(node, report, clock::now_ms(), app.offline_after) {
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
    Ok(())
}
