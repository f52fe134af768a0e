//! A join (docs/behaviour.md#joining): the throttle on failed joins (`429`), then the body checked strictly
//! and the one-time key spent with the node's creation (`201`), or the refusal counted.

use super::reply::{Outcome, Reply};
use crate::http::app::App;
use crate::http::body::parse_json;
use crate::http::error::ApiError;
use crate::store::JoinError;
use axum::http::StatusCode;
use fleet_api::{codes, validate, JoinRequest};
use std::net::IpAddr;

/// `429` while failed joins from `client` in this second reached the limit.
pub fn admitted(app: &App, client: Option<IpAddr>) -> Result<(), ApiError> {
    if app.joins_throttled(client) {
        app.metrics.join("throttled");
        return Err(ApiError::too_many("too many failed joins; try again in a second"));
    }
    Ok(())
}

/// A join from its body (or the error reading it): `201` with the node's id and token. A
/// refusal other than the store failing counts towards `client`'s throttle.
pub async fn answer(app: &App, client: Option<IpAddr>, body: Result<&[u8], &ApiError>) -> Outcome {
    let result = async {
        let req: JoinRequest = parse_json(body.map_err(Clone::clone)?, false)?;
        validate::join(&req).map_err(|e| ApiError::invalid_request(e.to_string()))?;
        match app.store.join(&req).await {
            Ok(resp) => {
                tracing::info!(node = %resp.node_id, name = %req.name, labels = ?req.labels, kinds = ?req.executor_kinds, client = ?client, "node joined");
                Ok(resp)
            }
            Err(JoinError::KeyInvalid) => {
                Err(ApiError::new(StatusCode::UNAUTHORIZED, codes::JOIN_KEY_INVALID, "the join key is unknown, used or expired"))
            }
            Err(JoinError::NameTaken(n)) => Err(ApiError::new(
                StatusCode::CONFLICT,
                codes::NODE_NAME_TAKEN,
                format!("a node named {n:?} already exists (a lost stateDir needs a new name)"),
            )),
            Err(JoinError::Db(e)) => Err(e.into()),
        }
    }
    .await;
    match result {
        Ok(resp) => {
            app.metrics.join("joined");
            app.kick();
            let body = serde_json::to_vec(&resp).map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(Reply::Joined(body.into()))
        }
        Err(e) => {
            if e.status != StatusCode::INTERNAL_SERVER_ERROR {
                app.note_failed_join(client);
            }
            app.metrics.join(e.code);
            tracing::info!(code = e.code, message = %e.message, client = ?client, "join refused");
            Err(e)
        }
    }
}
