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
    JoinKeyRequest, JoinKeyResponse, List, NodeDetail, NodeView, PlacementView, JOIN_KEY_TTL_DEFAULT, JOIN_KEY_TTL_MAX,
    JOIN_KEY_TTL_MIN,
};
use std::sync::Arc;
use std::time::Duration;

pub async fn create_join_key(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<JoinKeyResponse>), ApiError> {
    app.jwks.admin(&headers, SCOPE_ADMIN).await?;
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
    tracing::info!(note = %note, ttl_seconds = ttl, "join key issued");
    Ok((StatusCode::CREATED, Json(JoinKeyResponse { join_key: key, expires_at: clock::rfc3339_ms(expires) })))
}

pub async fn list_nodes(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Json<List<NodeView>>, ApiError> {
    app.jwks.admin(&headers, SCOPE_READ).await?;
    let now = clock::now_ms();
    let mut items: Vec<NodeView> =
        app.store.state.read().nodes.values().map(|n| n.view(now, app.offline_after)).collect();
    items.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(List { items }))
}

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

pub async fn list_placements(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
) -> Result<Json<List<PlacementView>>, ApiError> {
    app.jwks.admin(&headers, SCOPE_READ).await?;
    let views = app.store.state.read().views.clone();
    Ok(Json(List { items: views.as_ref().clone() }))
}
