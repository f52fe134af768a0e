//! The node's side of the guard's lease route (docs/behaviour.md#busy-replicas): behind the
//! guard a container's lease directory is the guard's own, which the node cannot read, so it
//! asks the guard, `GET /fleet/v1/containers/{name}/busy`, and reads the answer as the lease.

use super::upstream::Upstream;
use crate::lease::Lease;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use std::time::{Duration, UNIX_EPOCH};

/// The most of the guard's answer read.
const MAX_ANSWER: usize = 4096;
/// How long the guard may take to answer.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The lease of this node's container `name`, as the guard at `guard` reads it.
pub async fn ask(guard: &Upstream, name: &str) -> Result<Option<Lease>, String> {
    match tokio::time::timeout(TIMEOUT, ask_once(guard, name)).await {
        Ok(r) => r,
        Err(_) => Err("the Docker guard did not answer in time".into()),
    }
}

async fn ask_once(guard: &Upstream, name: &str) -> Result<Option<Lease>, String> {
    let req = hyper::Request::get(super::route::busy_path(name))
        .header("host", "docker")
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = guard.send(req).await?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_ANSWER).collect().await.map_err(|e| e.to_string())?.to_bytes();
    if !status.is_success() {
        return Err(format!("the Docker guard answered {status}: {}", String::from_utf8_lossy(&body)));
    }
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| format!("the Docker guard's lease: {e}"))?;
    if let Some(problem) = v["problem"].as_str() {
        return Err(problem.to_string());
    }
    let lease = &v["lease"];
    let Some(text) = lease["text"].as_str() else { return Ok(None) };
    let written = UNIX_EPOCH + Duration::from_millis(lease["writtenMs"].as_u64().unwrap_or(0));
    Ok(Some(Lease { text: text.to_string(), written }))
}
