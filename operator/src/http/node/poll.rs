//! The desired-state long-poll (docs/behaviour.md#desired-state-and-observed-report): `since` and `wait` read from the query, then the
//! answer at once when the node's generation differs from `since`, `304` for `wait` 0, else
//! held until the generation changes or `wait` runs out.

use super::reply::{Outcome, Reply};
use crate::http::app::App;
use crate::http::error::ApiError;
use crate::http::limits::MAX_WAIT_SECONDS;
use crate::store::Id;
use axum::body::Bytes;
use std::time::Duration;

/// `since` and `wait` of a long-poll or an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub since: Option<u64>,
    pub seconds: u64,
}

/// Reads `since` and `wait` from a raw query string; `400` names the bad one.
pub fn parse_wait(query: Option<&str>) -> Result<Wait, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|_| ApiError::invalid_request("query: cannot be decoded (since=<generation>&wait=<seconds>)"))?;
    // The last of a repeated parameter counts, as with any map of the query.
    let value = |name: &str| pairs.iter().rev().find(|(k, v)| k == name && !v.is_empty()).map(|(_, v)| v.as_str());
    let since = match value("since") {
        None => None,
        // Generations are stored as SQLite integers: 0 … 2^63-1, as the contract says.
        Some(s) => match s.parse::<i64>() {
            Ok(g) if g >= 0 => Some(g as u64),
            _ => return Err(ApiError::invalid_request("since: must be a generation number (0 … 2^63-1)")),
        },
    };
    let seconds = match value("wait") {
        None => 0,
        Some(s) => match s.parse::<u64>() {
            Ok(w) if w <= MAX_WAIT_SECONDS => w,
            _ => return Err(ApiError::invalid_request(format!("wait: must be 0–{MAX_WAIT_SECONDS} seconds"))),
        },
    };
    Ok(Wait { since, seconds })
}

/// The long-poll once the node is known: at once when the generation differs from `since`,
/// `304` for `wait` 0, else held until it changes or `wait` runs out — and then answered only
/// while its token is still the node's (a re-join or a deletion meanwhile ends it with `401`).
pub async fn hold(app: &App, node: &Id, tag: u64, wait: Wait) -> Outcome {
    let Some((mut generation, mut body)) = app.store.desired_body(node) else {
        return Err(ApiError::node_token_invalid());
    };
    // The node has a newer generation than this replica: another replica served it before
    // this one heard of it (docs/behaviour.md#high-availability). Read it from the database rather than answer with an
    // older one.
    if wait.since.is_some_and(|s| s > generation) && app.store.db().is_shared() {
        if let Err(e) = Box::pin(app.store.refresh_desired(node)).await {
            tracing::warn!(error = %e, "cannot read a node's newest desired state; answering with this replica's");
        }
        if let Some((g, b)) = app.store.desired_body(node) {
            (generation, body) = (g, b);
        }
    }
    if newer(generation, wait.since) {
        return Box::pin(desired_reply(app, node, generation, body)).await;
    }
    // The node has this generation (its body can go), or a newer one than this store has:
    // it is held as if nothing changed until the pass moves past it
    // (docs/behaviour.md#a-store-older-than-the-fleet). An older body would take the node
    // back.
    drop(body);
    app.store.delivered(node, generation);
    if wait.seconds == 0 {
        return Ok(Reply::NotModified);
    }
    let Some(_held) = app.store.hub().hold(node) else {
        return Err(ApiError::too_many("this node already holds the most long-polls allowed (4)"));
    };
    let mut rx = app.store.hub().subscribe(node);
    // A bump between the read above and the subscription is seen here.
    if let Some((g, body)) = app.store.desired_body(node) {
        if g != generation && newer(g, wait.since) {
            return Box::pin(desired_reply(app, node, g, body)).await;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(wait.seconds), rx.changed()).await;
    if app.store.read().node(node).map(|n| token_tag(&n.token_hash)) != Some(tag) {
        return Err(ApiError::node_token_invalid());
    }
    match app.store.desired_body(node) {
        Some((g, body)) if g != generation && newer(g, wait.since) => Box::pin(desired_reply(app, node, g, body)).await,
        Some(_) => Ok(Reply::NotModified),
        // Deleted while the poll was held (docs/behaviour.md#node-lifecycle).
        None => Err(ApiError::node_token_invalid()),
    }
}

/// The first 8 bytes of a token's hash: what a held long-poll keeps of its token (every byte
/// a held connection keeps is kept 10,000 times over), enough to tell it from the token a
/// re-join made.
pub fn token_tag(token_hash: &[u8; 32]) -> u64 {
    u64::from_le_bytes(token_hash[..8].try_into().expect("8 of 32 bytes"))
}

/// Whether generation `g` is news to a node that has `since`: it has none, or an older one.
/// A node with a newer one than `g` is ahead of this store, never served backwards.
fn newer(g: u64, since: Option<u64>) -> bool {
    since.is_none_or(|s| g > s)
}

/// The desired state as served: the held body, or the stored one read back. Once served,
/// the registry lets the body go: the answer holds it until it is written, and a node that
/// did not get it asks again and has it read back, as after a restart. Held until the node's
/// next ask instead, a fleet-wide change kept every body for as long as its node took to
/// apply it (docs/performance.md#bodies-let-go-once-served-the-ninth-run).
async fn desired_reply(app: &App, node: &Id, generation: u64, body: Option<Bytes>) -> Outcome {
    if let Some(b) = body {
        app.store.delivered(node, generation);
        return Ok(Reply::Desired(b));
    }
    match app.store.load_desired(node).await {
        Ok(Some((g, b))) => {
            app.store.delivered(node, g);
            Ok(Reply::Desired(b))
        }
        Ok(None) => Err(ApiError::node_token_invalid()),
        Err(e) => {
            tracing::error!(node = %node, error = %e, "cannot read a node's stored desired state");
            Err(e.into())
        }
    }
}
