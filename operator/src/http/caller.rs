//! The caller of an admin route as an axum extractor: an admin token, verified, that holds
//! the route's scope (`401 invalid_token`, `403 insufficient_scope`; docs/behaviour.md#admin-tokens). A handler
//! names the scope in its signature ([`CanRead`], [`CanAdmin`]). Extractors run in the order
//! of the handler's arguments and all before its body is read, so the precedence of docs/reference.md#http-api holds: `401`/`403` before the route's `400`/`413`.

use super::app::App;
use super::auth::{self, SCOPE_ADMIN, SCOPE_READ};
use super::error::ApiError;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use std::marker::PhantomData;
use std::sync::Arc;

/// A scope an admin route needs.
pub trait Scope {
    const NAME: &'static str;
}

/// `fleet:read`: the reads.
pub enum ReadScope {}

/// `fleet:admin`: everything that changes the fleet (and the reads).
pub enum AdminScope {}

impl Scope for ReadScope {
    const NAME: &'static str = SCOPE_READ;
}

impl Scope for AdminScope {
    const NAME: &'static str = SCOPE_ADMIN;
}

/// A caller whose token holds the scope `S` (`fleet:admin` holds both).
pub struct Caller<S> {
    admin: auth::Admin,
    scope: PhantomData<fn() -> S>,
}

/// A caller that may read.
pub type CanRead = Caller<ReadScope>;

/// A caller that may change the fleet.
pub type CanAdmin = Caller<AdminScope>;

impl<S> Caller<S> {
    /// Who the token speaks for (its `sub`, cut and escaped), for logs and events.
    pub fn sub(&self) -> &str {
        &self.admin.sub
    }
}

impl<S: Scope> FromRequestParts<Arc<App>> for Caller<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let admin = match (&app.reconciler, parts.headers.contains_key(super::forward::FORWARDED)) {
            // Another replica verified the token and signed who it speaks for.
            (Some(r), true) => auth::holds(r.forward.forwarded_caller(parts)?, S::NAME)?,
            _ => app.jwks.admin(&parts.headers, S::NAME).await?,
        };
        Ok(Caller { admin, scope: PhantomData })
    }
}
