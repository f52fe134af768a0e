//! Rollout routes (docs/behaviour.md#rolling-out-a-change): an agent's rollout view, the
//! list of rollouts not complete, and the orders pause, resume, undo and restart. An order is
//! stored (any replica may take it) and the leader's pass applies it; the route answers once
//! it is applied, with the view as it then stands.

use super::app::App;
use super::caller::{CanAdmin, CanRead};
use super::error::ApiError;
use crate::clock;
use crate::model::{Agent, SpecId, Template};
use crate::store::rollouts::{Command, ORDER_WAIT};
use crate::store::{Rollout, State as Registry};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use fleet_api::rollout::{RolloutDefaults, RolloutState};
use fleet_api::{codes, ErrorBody, List, ReplicaState, RolloutView};
use std::sync::Arc;
use std::time::Duration;

/// A node's name by its id, for the views (the id itself for a node that is gone).
fn node_name(st: &Registry) -> impl Fn(&str) -> String + '_ {
    |id| st.node(id).map_or_else(|| id.to_string(), |n| n.name.to_string())
}

fn unknown_agent(key: &str) -> ApiError {
    ApiError::not_found(format!("no agent {:?} in the active list", super::error::cut(key)))
}

/// The view of an agent with no rollout in memory: the stored one (complete), else its own
/// template, complete.
fn at_rest(st: &Registry, a: &Agent, stored: Option<Rollout>, defaults: &RolloutDefaults) -> RolloutView {
    let name = node_name(st);
    let own = Template::of(a, 0);
    let mut view = match stored.filter(|r| r.target.same(&own)) {
        Some(r) => r.view(&name),
        None => {
            let (policy, policy_error) = crate::reconcile::rules::rollout::policy(a.rollout().as_ref(), defaults);
            Rollout::at_rest(a.key.clone(), Arc::new(own.clone()), policy, policy_error, 0).view(&name)
        }
    };
    view.state = RolloutState::Complete;
    view.target.revision = a.revision;
    let desired = a.desired_replicas();
    let (ready, elsewhere) = running_replicas(st, a, own.id());
    // Replicas on another template with no rollout held: the controller has read a new
    // template and its pass has not started the rollout yet (a moment).
    if elsewhere > 0 {
        view.state = RolloutState::Progressing;
        view.message = Some("the pass has not taken this template yet".into());
    }
    view.desired_replicas = desired;
    view.updated_replicas = desired - elsewhere.min(desired);
    view.ready_replicas = ready;
    view.unavailable_replicas = desired.saturating_sub(ready);
    view.budget = view.policy.max_unavailable.budget(desired);
    view
}

/// The agent's replicas reported running where they are bound, and those reported on a
/// template other than `own`.
fn running_replicas(st: &Registry, a: &Agent, own: SpecId) -> (u32, u32) {
    let desired = a.desired_replicas();
    let (mut running, mut elsewhere) = (0, 0);
    for (r, node) in st.outcome().bindings.of_agent(&a.key).take_while(|(r, _)| *r < desired) {
        let Some(p) = st.node(node).and_then(|n| n.info.replica(&a.key, r)) else {
            continue;
        };
        running += u32::from(p.state == ReplicaState::Running);
        elsewhere += u32::from(p.spec != 0 && p.spec != own.0);
    }
    (running, elsewhere)
}

/// The agent's view, saying which CP read it reflects and when it was built.
async fn view_of(app: &App, key: &str) -> Result<RolloutView, ApiError> {
    // Looked up before the view is built: the registry then holds at least what that read
    // brought (the watcher notes a read only once a pass has committed its result).
    let cp_read = cp_read_ms(app).await?;
    let view = current_view(app, key).await?;
    Ok(stamped(view, cp_read))
}

/// When the latest CP read a pass committed began: this replica's own while it leads and has
/// read, else the one the leader stored.
async fn cp_read_ms(app: &App) -> Result<Option<i64>, ApiError> {
    let Some(r) = &app.reconciler else { return Ok(None) };
    if let Some(ms) = r.pass_clock.cp_read_ms().filter(|_| r.role.leading()) {
        return Ok(Some(ms));
    }
    let row = app.store.db().get_kv(crate::reconcile::pass::agents::CP_READ_KEY).await?;
    Ok(row.and_then(|v| v.parse().ok()))
}

/// The view with `cpReadAt` and `asOf`, both on this controller's clock: a client compares
/// them with each other, never with its own clock.
fn stamped(mut v: RolloutView, cp_read_ms: Option<i64>) -> RolloutView {
    v.cp_read_at = cp_read_ms.map(clock::rfc3339_millis);
    v.as_of = Some(clock::rfc3339_millis(clock::now_ms()));
    v
}

async fn current_view(app: &App, key: &str) -> Result<RolloutView, ApiError> {
    let stored = {
        let st = app.store.read();
        let a = st.agent(key).ok_or_else(|| unknown_agent(key))?;
        if let Some(r) = st.rollout(key) {
            return Ok(r.view(node_name(&st)));
        }
        a.placed_spec().is_some()
    };
    let row = if stored { app.store.stored_rollout(key).await? } else { None };
    let st = app.store.read();
    let a = st.agent(key).ok_or_else(|| unknown_agent(key))?;
    let defaults = app.reconciler.as_ref().map(|r| r.rollout_defaults.clone()).unwrap_or_default();
    Ok(at_rest(&st, a, row, &defaults))
}

/// An agent's rollout: its state, policy, target and previous templates, progress and failure.
#[utoipa::path(get, path = "/api/v1/agents/{key}/rollout", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("key" = String, Path, description = "agent key")),
    responses((status = 200, body = RolloutView), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn get_rollout(
    State(app): State<Arc<App>>,
    Path(key): Path<String>,
    _: CanRead,
) -> Result<Json<RolloutView>, ApiError> {
    view_of(&app, &key).await.map(Json)
}

/// The rollout views of every agent whose rollout is not complete, by agent key.
#[utoipa::path(get, path = "/api/v1/rollouts", tag = "admin", security(("admin" = ["fleet:read"])),
    responses((status = 200, body = List<RolloutView>), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn list_rollouts(State(app): State<Arc<App>>, _: CanRead) -> Result<Json<List<RolloutView>>, ApiError> {
    let cp_read = cp_read_ms(&app).await?;
    let st = app.store.read();
    let name = node_name(&st);
    let mut items: Vec<RolloutView> = st
        .rollouts()
        .map(|r| r.view(&name))
        .filter(|v| v.state != RolloutState::Complete)
        .map(|v| stamped(v, cp_read))
        .collect();
    items.sort_by(|a, b| a.agent_key.cmp(&b.agent_key));
    Ok(Json(List::all(items)))
}

/// `POST /api/v1/agents/{key}/rollout:{action}`.
#[utoipa::path(post, path = "/api/v1/agents/{key}/rollout:{action}", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("key" = String, Path, description = "agent key"),
           ("action" = String, Path, description = "pause, resume, undo or restart")),
    responses((status = 200, body = RolloutView), (status = 404, description = "not_found", body = ErrorBody), (status = 409, description = "no_previous_template", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured or not_ready", body = ErrorBody)))]
pub async fn act(
    State(app): State<Arc<App>>,
    Path((key, action)): Path<(String, String)>,
    admin: CanAdmin,
) -> Result<Json<RolloutView>, ApiError> {
    let command = match action.as_str() {
        "pause" => Command::Pause,
        "resume" => Command::Resume,
        "restart" => Command::Restart,
        "undo" => Command::Undo { to: previous_template(&app, &key).await? },
        other => {
            return Err(ApiError::not_found(format!(
                "unknown rollout action {:?}: use :pause, :resume, :undo or :restart",
                super::error::cut(other)
            )))
        }
    };
    // A follower does not hold the agent list: the leader's pass judges the order there.
    let leading = app.reconciler.as_ref().is_none_or(|r| r.role.leading());
    if leading && app.store.read().agent(&key).is_none() {
        return Err(unknown_agent(&key));
    }
    let value = app.store.order_rollout(&key, command, admin.sub()).await?;
    app.kick();
    let until = tokio::time::Instant::now() + ORDER_WAIT;
    while !app.store.order_applied(&key, &value).await? {
        if tokio::time::Instant::now() >= until {
            return Err(ApiError::not_ready(format!(
                "the order is stored but no pass applied it within {} s (is a replica leading?); it applies when one runs",
                ORDER_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if leading {
        return view_of(&app, &key).await.map(Json);
    }
    // As the leader stored it with the order's effect; `GET` shows the live counts.
    let cp_read = cp_read_ms(&app).await?;
    let stored = app.store.stored_rollout(&key).await?.ok_or_else(|| unknown_agent(&key))?;
    let view = stored.view(node_name(&app.store.read()));
    Ok(Json(stamped(view, cp_read)))
}

/// The template `undo` brings back: the rollout's previous one.
async fn previous_template(app: &App, key: &str) -> Result<Template, ApiError> {
    let held = {
        let st = app.store.read();
        let leading = app.reconciler.as_ref().is_none_or(|r| r.role.leading());
        if leading && st.agent(key).is_none() {
            return Err(unknown_agent(key));
        }
        st.rollout(key).map(|r| r.previous.clone())
    };
    let previous = match held {
        Some(p) => p.map(|t| (*t).clone()),
        None => app.store.stored_rollout(key).await?.and_then(|r| r.previous.map(|t| (*t).clone())),
    };
    previous.ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            codes::NO_PREVIOUS_TEMPLATE,
            format!("agent {key} has no previous template: no rollout of it has started since it was listed"),
        )
    })
}
