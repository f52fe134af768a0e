//! The HTTP API (docs/reference.md#http-api): admin routes, the node protocol and the long-poll, with the
//! `503 not_configured` gate in front of everything but the health routes, the contract and
//! the web view. This module is the façade: it declares the parts and builds the routers
//! from them; what the parts share lives in them (`app`, `limits`, `error`), not here.

pub mod admin;
pub mod answer;
pub mod app;
pub mod auth;
pub mod body;
pub mod caller;
pub mod conn;
pub mod error;
pub mod forward;
pub mod gate;
pub mod health;
pub mod limits;
pub mod node;
pub mod openapi;
pub mod ops;
pub mod page;
pub mod peers;
pub mod rollout;
pub mod serve;
pub mod signed;
#[cfg(test)]
mod sizes;
pub mod strangers;
pub mod throttle;
pub mod ui;

pub use app::{App, Reconciler};

use crate::metrics::Metrics;
use axum::routing::{delete, get, post, put};
use axum::Router;
use error::ApiError;
use std::sync::Arc;

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// A known path with another method: `405` with the JSON error body (docs/reference.md#http-api).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(openapi::serve))
        .route("/api/v1/join-keys", post(admin::create_join_key).get(admin::list_join_keys))
        .route("/api/v1/join-keys/{id}", delete(admin::revoke_join_key))
        .route("/api/v1/nodes", get(admin::list_nodes))
        .route("/api/v1/nodes/{id}", get(admin::get_node).post(ops::node_action).delete(ops::delete_node))
        .route("/api/v1/nodes/{id}/allowed", put(ops::set_allowed))
        .route("/api/v1/placements", get(admin::list_placements))
        .route("/api/v1/agents/{key}/placement", get(ops::explain))
        .route("/api/v1/agents/{key}/rollout", get(rollout::get_rollout))
        .route("/api/v1/agents/{key}/rollout:{action}", post(rollout::act))
        .route("/api/v1/rollouts", get(rollout::list_rollouts))
        .route("/api/v1/events", get(ops::events))
        .route("/api/v1/summary", get(ops::summary))
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::slash))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .route("/api/v1/nodes:join", post(node::routes::join))
        .route("/api/v1/nodes/me/desired", get(node::routes::desired))
        .route("/api/v1/nodes/me/observed", put(node::routes::observed))
        .route("/api/v1/nodes/me/exchange", post(node::routes::exchange))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), gate::follower))
        .layer(axum::middleware::from_fn_with_state(app.clone(), gate::configured))
        .with_state(app)
}

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let m = metrics.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], m.render()) }
        }),
    )
}
