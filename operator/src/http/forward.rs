//! Admin reads on a follower (docs/behaviour.md#high-availability). What the admin API reads — placements, verdicts,
//! explanations, the summary — is computed by the leader's pass, so a replica that does not
//! lead sends such a request on to the replica that does (the URL it advertised in the lease)
//! and answers with the leader's answer, as Vault standbys and Nomad followers do. Writes
//! are not forwarded: join keys, cordons, drains and deletions go to the database from the
//! replica that took them, and the leader follows (`store/follow.rs`). The node protocol and
//! joins never leave the replica they reached.
//!
//! A forwarded request carries `x-fleet-forwarded`; a replica that receives one and does not
//! lead either (the lease is changing hands) answers 503 instead of forwarding again.

use super::error::ApiError;
use super::App;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;

pub const FORWARDED: &str = "x-fleet-forwarded";
/// A forwarded answer is read whole; admin answers are pages, far below this.
const MAX_BODY: usize = 64 << 20;

#[derive(Clone)]
pub struct Forwarder {
    http: reqwest::Client,
}

impl Forwarder {
    pub fn new(ca_certs: &[reqwest::Certificate]) -> Forwarder {
        let mut b =
            reqwest::Client::builder().timeout(Duration::from_secs(30)).redirect(reqwest::redirect::Policy::none());
        for c in ca_certs {
            b = b.add_root_certificate(c.clone());
        }
        Forwarder { http: b.build().unwrap_or_default() }
    }

    /// Sends the read (`path` with its query) and the headers that matter to the leader.
    async fn send(
        &self,
        leader: &str,
        path: &str,
        headers: Vec<(header::HeaderName, HeaderValue)>,
        me: &str,
    ) -> Result<Response, ApiError> {
        let mut out = self.http.get(format!("{leader}{path}")).header(FORWARDED, me);
        for (name, v) in headers {
            out = out.header(name.as_str(), v.as_bytes());
        }
        let unreachable = |e: String| ApiError::not_ready(format!("the leader ({leader}) does not answer: {e}; retry"));
        let answer = out.send().await.map_err(|e| unreachable(e.to_string()))?;
        let status = answer.status();
        let kind = answer.headers().get(header::CONTENT_TYPE).cloned();
        let etag = answer.headers().get(header::ETAG).cloned();
        if answer.content_length().is_some_and(|n| n as usize > MAX_BODY) {
            return Err(unreachable("its answer is too large".into()));
        }
        let body = answer.bytes().await.map_err(|e| unreachable(e.to_string()))?;
        let mut resp = Response::new(Body::from(body));
        *resp.status_mut() = axum::http::StatusCode::from_u16(status.as_u16()).unwrap_or_default();
        for (name, v) in [(header::CONTENT_TYPE, kind), (header::ETAG, etag)] {
            if let Some(v) = v.and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
                resp.headers_mut().insert(name, v);
            }
        }
        Ok(resp)
    }
}

/// Whether the leader answers this request: an admin read (`GET /api/v1/…`) other than the
/// node protocol's.
fn leader_answers(method: &Method, path: &str) -> bool {
    method == Method::GET && path.starts_with("/api/v1/") && !path.starts_with("/api/v1/nodes/me/")
}

/// The middleware: on a follower, sends admin reads to the leader.
pub async fn follower_gate(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let Some(r) = &app.reconciler else { return next.run(req).await };
    if r.role.leading() || !leader_answers(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    if req.headers().contains_key(FORWARDED) {
        return ApiError::not_ready("this replica does not lead either: the lease is changing hands; retry")
            .into_response();
    }
    let Some(leader) = r.role.leader_url() else {
        return ApiError::not_ready(
            "no replica leads right now (a takeover takes up to FLEET_LEADER_LEASE_SECONDS); retry",
        )
        .into_response();
    };
    let path = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let headers: Vec<_> = [header::AUTHORIZATION, header::ACCEPT, header::IF_NONE_MATCH]
        .into_iter()
        .filter_map(|name| req.headers().get(&name).cloned().map(|v| (name, v)))
        .collect();
    drop(req);
    match r.forward.send(&leader, &path, headers, &r.replica).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_admin_reads_go_to_the_leader() {
        assert!(leader_answers(&Method::GET, "/api/v1/placements"));
        assert!(leader_answers(&Method::GET, "/api/v1/agents/a/placement"));
        assert!(!leader_answers(&Method::GET, "/api/v1/nodes/me/desired"), "the node protocol stays");
        assert!(!leader_answers(&Method::POST, "/api/v1/join-keys"), "writes stay");
        assert!(!leader_answers(&Method::POST, "/api/v1/nodes:join"));
        assert!(!leader_answers(&Method::GET, "/readyz"));
        assert!(!leader_answers(&Method::GET, "/ui/app.js"));
    }
}
