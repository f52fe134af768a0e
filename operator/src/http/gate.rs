//! The two gates in front of every route: `503 not_configured` while the controller has no
//! service account (all but the health routes, the contract and the web view), and on a
//! follower the admin reads, which the leader answers (docs/behaviour.md#high-availability).

use super::app::App;
use super::error::ApiError;
use super::forward;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// `503 not_configured` in the not-configured mode. The node routes' own path checks the
/// same first (`node::sequence`), for the requests it serves without this router.
pub async fn configured(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    // The web view loads without a service account and shows the API's 503.
    let open = matches!(path, "/healthz" | "/readyz" | "/openapi.json") || path == "/ui" || path.starts_with("/ui/");
    if app.reconciler.is_none() && !open {
        return ApiError::not_configured().into_response();
    }
    next.run(req).await
}

/// On a follower, sends admin reads to the leader.
pub async fn follower(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(r) = &app.reconciler else { return next.run(req).await };
    if r.role.leading() || !forward::leader_answers(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    // The token is checked here, not by the leader: only the verified caller is forwarded.
    let caller = match super::auth::bearer(req.headers()) {
        Some(token) => app.jwks.verify(token).await,
        None => Err(ApiError::invalid_token("an admin bearer token is required")),
    };
    match caller {
        Ok(admin) => r.forward.answer(&r.role, &r.replica, &admin, req).await,
        Err(e) => e.into_response(),
    }
}
