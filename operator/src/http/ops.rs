//! Day-two admin routes (docs/behaviour.md#day-two-operations): cordon, uncordon, drain and delete a node, the placement
//! explanation, and the event history. Reads need `fleet:read`, the rest `fleet:admin`; each
//! route takes its caller so checked ([`CanRead`], [`CanAdmin`]) before its own work.

use super::app::App;
use super::body::read_json;
use super::caller::{CanAdmin, CanRead};
use super::error::ApiError;
use super::page::EventRange;
use crate::clock;
use crate::store::events::Filter;
use crate::store::Action;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fleet_api::claims::Allowance;
use fleet_api::{
    DrainRequest, ErrorBody, EventView, FleetSummary, List, NodeView, PlacementExplanation, PlacementStatus,
    WaitingAgent,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The target of `POST /api/v1/nodes/{id}:{action}`: the router has one route for the node
/// path; the action is the suffix after the last `:` (node names never hold one). A missing
/// or unknown action is `404`, as a route that does not exist, before the caller is checked.
pub struct NodeAction {
    node: String,
    action: ActionName,
}

enum ActionName {
    Cordon,
    Uncordon,
    Drain,
}

impl<S: Send + Sync> FromRequestParts<S> for NodeAction {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<NodeAction, Response> {
        let Path(target) =
            Path::<String>::from_request_parts(parts, state).await.map_err(IntoResponse::into_response)?;
        NodeAction::parse(&target).map_err(IntoResponse::into_response)
    }
}

impl NodeAction {
    fn parse(target: &str) -> Result<NodeAction, ApiError> {
        let Some((node, action)) = target.rsplit_once(':') else {
            return Err(ApiError::not_found(format!(
                "POST /api/v1/nodes/{} needs an action: :cordon, :uncordon or :drain",
                super::error::cut(target)
            )));
        };
        let action = match action {
            "cordon" => ActionName::Cordon,
            "uncordon" => ActionName::Uncordon,
            "drain" => ActionName::Drain,
            other => {
                return Err(ApiError::not_found(format!(
                    "unknown node action {:?}: use :cordon, :uncordon or :drain",
                    super::error::cut(other)
                )))
            }
        };
        Ok(NodeAction { node: node.to_string(), action })
    }
}

/// `POST /api/v1/nodes/{id}:{action}`, to the action's route.
pub async fn node_action(
    State(app): State<Arc<App>>,
    target: NodeAction,
    admin: CanAdmin,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let NodeAction { node, action } = target;
    match action {
        ActionName::Cordon => cordon(State(app), Path(node), admin).await.map(IntoResponse::into_response),
        ActionName::Uncordon => uncordon(State(app), Path(node), admin).await.map(IntoResponse::into_response),
        ActionName::Drain => drain(State(app), Path(node), admin, headers, body).await.map(IntoResponse::into_response),
    }
}

async fn apply(app: &App, by: &str, node: &str, action: Action) -> Result<NodeView, ApiError> {
    let Some(id) = app.store.set_lifecycle(node, action, by).await? else {
        return Err(unknown_node(node));
    };
    app.kick();
    let st = app.store.read();
    let n = st.node(&id).ok_or_else(|| unknown_node(node))?;
    Ok(st.node_view(n, clock::now_ms(), app.offline_after))
}

pub fn unknown_node(node: &str) -> ApiError {
    ApiError::not_found(format!("no node with id or name {:?}", super::error::cut(node)))
}

/// No new replica is placed on the node; those there stay.
#[utoipa::path(post, path = "/api/v1/nodes/{id}:cordon", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = NodeView), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn cordon(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    admin: CanAdmin,
) -> Result<Json<NodeView>, ApiError> {
    apply(&app, admin.sub(), &id, Action::Cordon).await.map(Json)
}

/// Undoes a cordon, and ends a drain.
#[utoipa::path(post, path = "/api/v1/nodes/{id}:uncordon", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = NodeView), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn uncordon(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    admin: CanAdmin,
) -> Result<Json<NodeView>, ApiError> {
    apply(&app, admin.sub(), &id, Action::Uncordon).await.map(Json)
}

/// Cordons the node and moves every replica off; `force` unbinds those with nowhere to go.
#[utoipa::path(post, path = "/api/v1/nodes/{id}:drain", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("id" = String, Path, description = "node id or name")),
    request_body(content = DrainRequest, description = "an empty body drains without force"),
    responses((status = 202, description = "draining; the node view shows the progress", body = NodeView),
              (status = 400, description = "invalid_request", body = ErrorBody), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn drain(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    admin: CanAdmin,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<NodeView>), ApiError> {
    let req: DrainRequest = read_json(&headers, body, true).await?;
    let view = apply(&app, admin.sub(), &id, Action::Drain { force: req.force.unwrap_or(false) }).await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// Changes what the node may claim (docs/behaviour.md#what-a-node-may-claim): the body replaces
/// its allowance (an absent list allows anything of it) and applies at once to what it last
/// claimed.
#[utoipa::path(put, path = "/api/v1/nodes/{id}/allowed", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("id" = String, Path, description = "node id or name")),
    request_body(content = Allowance, description = "allowedLabels (name, name=value or name=*) and allowedKinds; an empty body allows anything"),
    responses((status = 200, description = "the node view, with what is refused now", body = NodeView),
              (status = 400, description = "invalid_request", body = ErrorBody), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn set_allowed(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    admin: CanAdmin,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<NodeView>, ApiError> {
    let allowed: Allowance = read_json(&headers, body, true).await?;
    allowed.validate().map_err(|e| ApiError::invalid_request(e.to_string()))?;
    let Some(node) = app.store.set_allowance(&id, allowed, admin.sub()).await? else {
        return Err(unknown_node(&id));
    };
    app.kick();
    let st = app.store.read();
    let n = st.node(&node).ok_or_else(|| unknown_node(&id))?;
    Ok(Json(st.node_view(n, clock::now_ms(), app.offline_after)))
}

/// The node leaves the fleet now: its token stops working, its name is free, its replicas
/// move, and every PAT sealed to it is revoked with no drain window.
#[utoipa::path(delete, path = "/api/v1/nodes/{id}", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("id" = String, Path, description = "node id or name")),
    responses((status = 204, description = "deleted"), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn delete_node(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    admin: CanAdmin,
) -> Result<StatusCode, ApiError> {
    let why = format!("by {}", admin.sub());
    match app.store.delete_node(&id, &why).await? {
        Some(_) => {
            app.kick();
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(unknown_node(&id)),
    }
}

/// Why the agent is where it is, or why it waits (docs/behaviour.md#why-an-agent-is-where-it-is).
#[utoipa::path(get, path = "/api/v1/agents/{key}/placement", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("key" = String, Path, description = "agent key"),
           ("nodes" = Option<bool>, Query, description = "also every node's verdict")),
    responses((status = 200, body = PlacementExplanation), (status = 404, description = "not_found: not in the active list", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn explain(
    State(app): State<Arc<App>>,
    Path(key): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    _: CanRead,
) -> Result<Json<PlacementExplanation>, ApiError> {
    let with_nodes = match q.get("nodes").map(String::as_str) {
        None | Some("false") => false,
        Some("true") | Some("") => true,
        Some(_) => return Err(ApiError::invalid_request("nodes: must be true or false")),
    };
    let st = app.store.read();
    crate::reconcile::rules::explain::explain(&st, &key, clock::now_ms(), app.offline_after, with_nodes)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no agent {:?} in the active list", super::error::cut(&key))))
}

/// Events, oldest first (`since` is the last `seq` seen) or with `order=desc` newest first
/// (`before` pages back), at most 500 a call.
#[utoipa::path(get, path = "/api/v1/events", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("agent" = Option<String>, Query, description = "only this agent's events"),
           ("node" = Option<String>, Query, description = "only this node's events (id or name)"),
           ("order" = Option<String>, Query, description = "asc (default: oldest first) or desc (newest first)"),
           ("since" = Option<i64>, Query, description = "events after this seq"),
           ("before" = Option<i64>, Query, description = "events before this seq (to page back newest first)"),
           ("limit" = Option<u32>, Query, description = "at most this many (1…500, default 500)"),
           ("cursor" = Option<String>, Query, description = "a nextCursor from the last page (as since; with order=desc as before)")),
    responses((status = 200, body = List<EventView>), (status = 400, description = "invalid_request", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn events(
    State(app): State<Arc<App>>,
    Query(q): Query<HashMap<String, String>>,
    _: CanRead,
    EventRange { since, before, limit, newest_first }: EventRange,
) -> Result<Json<List<EventView>>, ApiError> {
    let (agent, node) = (q.get("agent").cloned(), q.get("node").cloned());
    let filter = Filter { agent, node, since, before, limit, newest_first };
    let items = app.store.read_events(&filter).await?;
    let next_cursor = (items.len() == limit as usize).then(|| items.last().map(|e| e.seq.to_string())).flatten();
    Ok(Json(List::page(items, next_cursor)))
}

/// The fleet at a glance: nodes by status, health and lifecycle; replicas by status; pending
/// replicas by reason; the first 100 waiting agents. One look at each node and each
/// placement item (milliseconds at 10,000 nodes and 100,000 replicas).
#[utoipa::path(get, path = "/api/v1/summary", tag = "admin", security(("admin" = ["fleet:read"])),
    responses((status = 200, body = FleetSummary), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn summary(State(app): State<Arc<App>>, _: CanRead) -> Result<Json<FleetSummary>, ApiError> {
    let now = clock::now_ms();
    let st = app.store.read();
    let mut s = FleetSummary::default();
    for n in st.nodes() {
        let c = &mut s.nodes;
        c.total += 1;
        if n.online(now, app.offline_after) {
            c.online += 1;
        } else {
            c.offline += 1;
        }
        c.degraded += u32::from(n.info.health == Some(fleet_api::Health::Degraded));
        match n.lifecycle {
            crate::store::Lifecycle::Cordoned => c.cordoned += 1,
            crate::store::Lifecycle::Draining { .. } => c.draining += 1,
            crate::store::Lifecycle::Schedulable => {}
        }
    }
    let placements = st.placements().clone();
    drop(st);
    for v in placements.iter() {
        match v.status {
            PlacementStatus::Placed => s.replicas.placed += u64::from(v.replicas),
            PlacementStatus::Stopped => s.replicas.stopped += 1,
            PlacementStatus::Pending => {
                s.replicas.pending += u64::from(v.replicas);
                let reason = v.reason.clone().unwrap_or_default();
                *s.pending_by_reason.entry(reason.clone()).or_default() += v.replicas;
                if v.node_id.is_none() {
                    if s.waiting.len() < 100 {
                        s.waiting.push(WaitingAgent { agent_key: v.agent_key.clone(), replicas: v.replicas, reason });
                    } else {
                        s.waiting_truncated = true;
                    }
                }
            }
        }
    }
    Ok(Json(s))
}
