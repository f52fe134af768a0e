//! The API contract, generated from the handlers' annotations and the wire types, checked in
//! as `openapi/fleet.json` (a test fails on drift) and served at `/openapi.json`.

use axum::http::header;
use axum::response::IntoResponse;
use std::sync::OnceLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Fleet controller API",
        description = "Admin API (bearer JWT from IAM, scopes fleet:read / fleet:admin) and node protocol (bearer node token). Errors are {\"error\": code, \"message\": text}. Mounted publicly under /fleet by a prefix-stripping proxy."
    ),
    paths(
        super::health::healthz,
        super::health::readyz,
        super::admin::create_join_key,
        super::admin::list_join_keys,
        super::admin::revoke_join_key,
        super::admin::list_nodes,
        super::admin::get_node,
        super::admin::list_placements,
        super::ops::cordon,
        super::ops::uncordon,
        super::ops::drain,
        super::ops::delete_node,
        super::ops::set_allowed,
        super::ops::explain,
        super::rollout::get_rollout,
        super::rollout::list_rollouts,
        super::rollout::act,
        super::ops::events,
        super::ops::summary,
        super::node::routes::join,
        super::node::routes::desired,
        super::node::routes::observed,
        super::node::routes::exchange,
    ),
    modifiers(&Security)
)]
pub struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let c = api.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "admin",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()),
        );
        c.add_security_scheme(
            "node",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("node token").build()),
        );
    }
}

/// The document as checked in: pretty JSON with a trailing newline.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut api = ApiDoc::openapi();
        api.info.version = env!("CARGO_PKG_VERSION").to_string();
        // Every field of a join-key request is optional, so is the body itself (the macro
        // has no way to say so without also allowing a JSON `null`).
        if let Some(body) = api
            .paths
            .paths
            .get_mut("/api/v1/join-keys")
            .and_then(|p| p.post.as_mut())
            .and_then(|op| op.request_body.as_mut())
        {
            body.required = Some(utoipa::openapi::Required::False);
        }
        let mut s = api.to_pretty_json().expect("the OpenAPI document serialises");
        s.push('\n');
        s
    })
}

pub async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document())
}
