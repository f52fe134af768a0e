//! Admin reads on a follower (docs/behaviour.md#high-availability). What the admin API reads — placements, verdicts,
//! explanations, the summary — is computed by the leader's pass, so a replica that does not
//! lead sends such a request on to the replica that does (the URL it advertised in the lease)
//! and answers with the leader's answer, as Vault standbys and Nomad followers do. Writes
//! are not forwarded: join keys, cordons, drains and deletions go to the database from the
//! replica that took them, and the leader follows (`store/follow.rs`). The node protocol and
//! joins never leave the replica they reached.
//!
//! The follower verifies the admin's token itself and forwards the verified caller, signed
//! ([`super::signed`]): the token never crosses the pod network. A forwarded request carries
//! `x-fleet-forwarded`; a replica that receives one and does not lead either (the lease is
//! changing hands) answers 503 instead of forwarding again. Which requests are sent on is
//! decided in front of the routes (`gate`).

use super::auth::Admin;
use super::error::ApiError;
use super::signed::Signer;
use crate::leader::Role;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Duration;

pub const FORWARDED: &str = "x-fleet-forwarded";
/// A forwarded answer is read whole, and at most this of it (docs/behaviour.md#hardening): admin
/// answers are pages, far below it; a leader that sends more (or a stranger that took its
/// address) costs a follower no more than this per request.
const MAX_BODY: usize = 64 << 20;

#[derive(Clone)]
pub struct Forwarder {
    http: reqwest::Client,
    /// Signs what this replica forwards and checks what it is forwarded; `None` on SQLite,
    /// where nothing is forwarded.
    signer: Option<Arc<Signer>>,
}

impl Forwarder {
    pub fn new(ca_certs: &[reqwest::Certificate], secret: Option<&[u8]>) -> Forwarder {
        let mut b =
            reqwest::Client::builder().timeout(Duration::from_secs(30)).redirect(reqwest::redirect::Policy::none());
        for c in ca_certs {
            b = b.add_root_certificate(c.clone());
        }
        Forwarder { http: b.build().unwrap_or_default(), signer: secret.map(|s| Arc::new(Signer::new(s))) }
    }

    /// The caller of a request another replica forwarded (its `x-fleet-forwarded` names that
    /// replica), from the signed headers: `401 invalid_token` unless they verify.
    pub fn forwarded_caller(&self, parts: &axum::http::request::Parts) -> Result<Admin, ApiError> {
        let from = parts.headers.get(FORWARDED).and_then(|v| v.to_str().ok()).unwrap_or("");
        let Some(signer) = &self.signer else {
            return Err(ApiError::invalid_token("a forwarded request, and this replica has no FLEET_REPLICA_SECRET"));
        };
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        signer.verify(parts.method.as_str(), path, &parts.headers, from, crate::clock::now_ms())
    }

    /// Sends the read (`path` with its query) to the leader: the headers that matter, the
    /// verified caller signed in place of the admin's token.
    async fn send(
        &self,
        leader: &str,
        path: &str,
        headers: Vec<(header::HeaderName, HeaderValue)>,
        caller: (&Admin, &str),
    ) -> Result<Response, ApiError> {
        let (admin, me) = caller;
        let Some(signer) = &self.signer else {
            return Err(ApiError::not_ready("this replica cannot forward: it has no FLEET_REPLICA_SECRET"));
        };
        let mut out = self.http.get(format!("{leader}{path}")).header(FORWARDED, me);
        for (name, v) in signer.headers("GET", path, admin, me, crate::clock::now_ms()) {
            out = out.header(name, v);
        }
        for (name, v) in headers {
            out = out.header(name.as_str(), v.as_bytes());
        }
        let unreachable = |e: String| ApiError::not_ready(format!("the leader ({leader}) does not answer: {e}; retry"));
        let answer = out.send().await.map_err(|e| unreachable(e.to_string()))?;
        let status = answer.status();
        let kind = answer.headers().get(header::CONTENT_TYPE).cloned();
        let etag = answer.headers().get(header::ETAG).cloned();
        let body = read_capped(answer, MAX_BODY).await.map_err(unreachable)?;
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

/// The body of `answer`, at most `cap` bytes: a declared length past it is refused before a
/// byte is read, and a body without one as soon as it passes it.
async fn read_capped(mut answer: reqwest::Response, cap: usize) -> Result<axum::body::Bytes, String> {
    let too_large = || format!("its answer is larger than {} MiB", cap >> 20);
    if answer.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.into())
}

/// Whether the leader answers this request: an admin read (`GET /api/v1/…`) other than the
/// node protocol's.
pub fn leader_answers(method: &Method, path: &str) -> bool {
    method == Method::GET && path.starts_with("/api/v1/") && !path.starts_with("/api/v1/nodes/me/")
}

impl Forwarder {
    /// Answers `req` on a follower with the answer of the leader `role` names; `503` when
    /// no replica leads or the request was forwarded already. `me`: this replica's name.
    pub async fn answer(&self, role: &Role, me: &str, admin: &Admin, req: Request) -> Response {
        if req.headers().contains_key(FORWARDED) {
            return ApiError::not_ready("this replica does not lead either: the lease is changing hands; retry")
                .into_response();
        }
        let Some(leader) = role.leader_url() else {
            return ApiError::not_ready(
                "no replica leads right now (a takeover takes up to FLEET_LEADER_LEASE_SECONDS); retry",
            )
            .into_response();
        };
        let path = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
        let headers: Vec<_> = [header::ACCEPT, header::IF_NONE_MATCH]
            .into_iter()
            .filter_map(|name| req.headers().get(&name).cloned().map(|v| (name, v)))
            .collect();
        drop(req);
        match self.send(&leader, &path, headers, (admin, me)).await {
            Ok(resp) => resp,
            Err(e) => e.into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A leader that answers every request with `answer`, once per connection.
    async fn leader(answer: Vec<u8>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(&answer).await;
                });
            }
        });
        format!("http://{addr}")
    }

    fn chunked(total: usize) -> Vec<u8> {
        let mut a = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..total / chunk.len() {
            a.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            a.extend_from_slice(&chunk);
            a.extend_from_slice(b"\r\n");
        }
        a.extend_from_slice(b"0\r\n\r\n");
        a
    }

    async fn forwarded(url: &str, cap: usize) -> Result<axum::body::Bytes, String> {
        let answer = reqwest::get(format!("{url}/api/v1/placements")).await.unwrap();
        read_capped(answer, cap).await
    }

    #[tokio::test]
    async fn a_leader_s_answer_past_the_cap_is_refused_with_or_without_a_length() {
        let cap = 1 << 20;
        let url = leader(chunked(2 << 20)).await;
        assert_eq!(forwarded(&url, cap).await.unwrap_err(), "its answer is larger than 1 MiB");
        let url = leader(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", 2 << 20).into_bytes()).await;
        assert_eq!(forwarded(&url, cap).await.unwrap_err(), "its answer is larger than 1 MiB");
        let url = leader(chunked(512 << 10)).await;
        assert_eq!(forwarded(&url, cap).await.unwrap().len(), 512 << 10, "below the cap it is read whole");
    }

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
