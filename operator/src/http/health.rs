//! The health routes: liveness (`/healthz`, always) and readiness (`/readyz`, docs/behaviour.md#high-availability).

use super::app::App;
use super::error::ApiError;
use axum::extract::State;
use axum::Json;
use fleet_api::ErrorBody;
use std::sync::Arc;

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
