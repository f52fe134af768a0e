//! Admin routes: join keys, nodes, one node, placements. Every route checks its scope.

use super::auth::{SCOPE_ADMIN, SCOPE_READ};
use super::body::read_json;
use super::error::ApiError;
use super::App;
use crate::clock;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use fleet_api::{
    ErrorBody, JoinKeyRequest, JoinKeyResponse, List, NodeDetail, NodeView, PlacementView, JOIN_KEY_TTL_DEFAULT,
    JOIN_KEY_TTL_MAX, JOIN_KEY_TTL_MIN,
};
use std::sync::Arc;
use std::time::Duration;

/// Issue a one-time join key.
#[utoipa::path(post, path = "/api/v1/join-keys", tag = "admin", security(("admin" = ["fleet:admin"])),
    request_body(content = JoinKeyRequest, description = "ttlSeconds 60…604800 (default 3600); an empty body takes the defaults"),
    responses((status = 201, description = "the key, shown once", body = JoinKeyResponse),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn create_join_key(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<JoinKeyResponse>), ApiError> {
    let admin = app.jwks.admin(&headers, SCOPE_ADMIN).await?;
    let req: JoinKeyRequest = read_json(&headers, body, true).await?;
    let ttl = req.ttl_seconds.unwrap_or(JOIN_KEY_TTL_DEFAULT);
    if !(JOIN_KEY_TTL_MIN..=JOIN_KEY_TTL_MAX).contains(&ttl) {
        return Err(ApiError::invalid_request(format!(
            "ttlSeconds: must be {JOIN_KEY_TTL_MIN}–{JOIN_KEY_TTL_MAX}, got {ttl}"
        )));
    }
    let note = req.note.unwrap_or_default();
    if note.len() > 200 {
        return Err(ApiError::invalid_request("note: at most 200 characters"));
    }
    let (key, expires) = app.store.issue_join_key(Duration::from_secs(ttl), &note).await?;
    tracing::info!(by = %admin.sub, note = %super::error::cut(&note), ttl_seconds = ttl, "join key issued");
    Ok((StatusCode::CREATED, Json(JoinKeyResponse { join_key: key, expires_at: clock::rfc3339_ms(expires) })))
}

/// Every node with its announced attributes and liveness.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "admin", security(("admin" = ["fleet:read"])),
    responses((status = 200, body = List<NodeView>), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn list_nodes(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Json<List<NodeView>>, ApiError> {
    app.jwks.admin(&headers, SCOPE_READ).await?;
    let now = clock::now_ms();
    let mut items: Vec<NodeView> =
        app.store.state.read().nodes.values().map(|n| n.view(now, app.offline_after)).collect();
    items.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(List { items }))
}

/// One node with the replicas it last reported.
#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("id" = String, Path, description = "node id")),
    responses((status = 200, body = NodeDetail), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn get_node(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    app.jwks.admin(&headers, SCOPE_READ).await?;
    let st = app.store.state.read();
    let n = st.nodes.get(id.as_str()).ok_or_else(|| ApiError::not_found(format!("no node with id {id:?}")))?;
    Ok(Json(NodeDetail {
        node: n.view(clock::now_ms(), app.offline_after),
        generation: st.desired.get(id.as_str()).map(|d| d.generation).unwrap_or(0),
        applied_generation: n.info.applied_generation,
        replicas: n.info.replicas.clone(),
    }))
}

/// Placements: one item per (agent, node) with a replica count, plus pending and stopped items.
#[utoipa::path(get, path = "/api/v1/placements", tag = "admin", security(("admin" = ["fleet:read"])),
    responses((status = 200, body = List<PlacementView>), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn list_placements(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> Result<Json<List<PlacementView>>, ApiError> {
    app.jwks.admin(&headers, SCOPE_READ).await?;
    let views = app.store.state.read().views.clone();
    Ok(Json(List { items: views.to_vec() }))
}
