//! The HTTP API (docs/reference.md#http-api): admin routes, the node protocol and the long-poll, with the
//! `503 not_configured` gate in front of everything but `/healthz` and `/openapi.json`.

pub mod admin;
pub mod auth;
pub mod body;
pub mod error;
pub mod forward;
pub mod node;
pub mod nodeconn;
pub mod openapi;
pub mod ops;
pub mod page;
pub mod serve;
pub mod ui;

use crate::metrics::Metrics;
use crate::store::Store;
use crate::trigger::{PassClock, Trigger};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use error::ApiError;
use fleet_api::ErrorBody;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// Failed joins allowed per second, all sources together (docs/reference.md#http-api).
pub const MAX_FAILED_JOINS_PER_SECOND: u32 = 20;

/// The reconciler as the HTTP side knows it: a trigger to kick, a clock to read, and whether
/// this replica leads (docs/behaviour.md#high-availability).
#[derive(Clone)]
pub struct Reconciler {
    pub trigger: Arc<Trigger>,
    pub pass_clock: Arc<PassClock>,
    pub role: Arc<crate::leader::Role>,
    /// Sends admin reads to the leader while this replica follows.
    pub forward: forward::Forwarder,
    /// This replica's name (`FLEET_REPLICA_NAME`).
    pub replica: String,
}

pub struct App {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    /// What the HTTP side sees of the reconciler; `None` in the not-configured mode (no
    /// client credentials), where no pass runs.
    pub reconciler: Option<Reconciler>,
    pub jwks: Arc<auth::Jwks>,
    pub offline_after: Duration,
    failed_joins: Mutex<(u64, u32)>,
}

impl App {
    pub fn new(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        reconciler: Option<Reconciler>,
        jwks: Arc<auth::Jwks>,
        offline_after: Duration,
    ) -> Arc<App> {
        Arc::new(App { store, metrics, reconciler, jwks, offline_after, failed_joins: Mutex::new((0, 0)) })
    }

    fn second() -> u64 {
        (crate::clock::now_ms() / 1000) as u64
    }

    /// Whether failed joins in this second already reached the limit.
    pub fn joins_throttled(&self) -> bool {
        let g = self.failed_joins.lock();
        g.0 == Self::second() && g.1 >= MAX_FAILED_JOINS_PER_SECOND
    }

    pub fn note_failed_join(&self) {
        let mut g = self.failed_joins.lock();
        let now = Self::second();
        if g.0 != now {
            *g = (now, 0);
        }
        g.1 += 1;
    }

    pub fn kick(&self) {
        if let Some(r) = &self.reconciler {
            r.trigger.kick();
        }
    }
}

async fn configured_gate(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // The web view loads without a service account and shows the API's 503.
    let open = matches!(path, "/healthz" | "/readyz" | "/openapi.json") || path == "/ui" || path.starts_with("/ui/");
    if app.reconciler.is_none() && !open {
        return ApiError::not_configured().into_response();
    }
    next.run(req).await
}

/// Liveness: answers even when not configured.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, body = fleet_api::Healthz)))]
pub async fn healthz() -> Json<fleet_api::Healthz> {
    Json(fleet_api::Healthz { status: "ok".into() })
}

/// Readiness (docs/behaviour.md#high-availability): 200 while the store answers and, on the leader, the last pass
/// finished within 3 × `FLEET_RECONCILE_SECONDS` + 30 s; 503 otherwise, and in the
/// not-configured mode. A follower that reaches its store can serve.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = fleet_api::Healthz), (status = 503, description = "not_ready or not_configured", body = ErrorBody)))]
pub async fn readyz(State(app): State<Arc<App>>) -> Result<Json<fleet_api::Healthz>, ApiError> {
    let Some(r) = &app.reconciler else { return Err(ApiError::not_configured()) };
    if let Err(e) = app.store.db().ping().await {
        return Err(ApiError::not_ready(format!("the store does not answer: {e}")));
    }
    if !r.role.leading() {
        return Ok(Json(fleet_api::Healthz { status: "ok".into() }));
    }
    match r.pass_clock.check(crate::clock::now_ms()) {
        Ok(()) => Ok(Json(fleet_api::Healthz { status: "ok".into() })),
        Err(age) => Err(ApiError::not_ready(format!(
            "the last reconcile pass finished {}s ago (limit {}s)",
            age.as_secs(),
            r.pass_clock.limit().as_secs()
        ))),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// A known path with another method: `405` with the JSON error body (docs/reference.md#http-api).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.json", get(openapi::serve))
        .route("/api/v1/join-keys", post(admin::create_join_key))
        .route("/api/v1/nodes", get(admin::list_nodes))
        .route("/api/v1/nodes/{id}", get(admin::get_node).post(ops::node_action).delete(ops::delete_node))
        .route("/api/v1/placements", get(admin::list_placements))
        .route("/api/v1/agents/{key}/placement", get(ops::explain))
        .route("/api/v1/events", get(ops::events))
        .route("/api/v1/summary", get(ops::summary))
        .route("/ui", get(ui::index))
        .route("/ui/", get(ui::slash))
        .route("/ui/app.js", get(ui::script))
        .route("/ui/app.css", get(ui::style))
        .route("/api/v1/nodes:join", post(node::join))
        .route("/api/v1/nodes/me/desired", get(node::desired))
        .route("/api/v1/nodes/me/observed", put(node::observed))
        .route("/api/v1/nodes/me/exchange", post(node::exchange))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), forward::follower_gate))
        .layer(axum::middleware::from_fn_with_state(app.clone(), configured_gate))
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
