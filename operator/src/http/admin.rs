//! Admin routes: join keys, nodes, one node, placements (paged on request). Every route
//! takes its caller, checked for its scope ([`CanRead`], [`CanAdmin`]), before its own work.

use super::app::App;
use super::body::read_json;
use super::caller::{CanAdmin, CanRead};
use super::error::ApiError;
use super::page::{self, Page};
use crate::clock;
use crate::store::kept::Placements;
use crate::store::{Id, NodeRec};
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use fleet_api::claims::Allowance;
use fleet_api::{
    ErrorBody, JoinKeyRequest, JoinKeyResponse, JoinKeyView, List, NodeDetail, NodeView, PlacementView,
    JOIN_KEY_TTL_DEFAULT, JOIN_KEY_TTL_MAX, JOIN_KEY_TTL_MIN,
};
use std::sync::Arc;
use std::time::Duration;

/// Issue a one-time join key.
#[utoipa::path(post, path = "/api/v1/join-keys", tag = "admin", security(("admin" = ["fleet:admin"])),
    request_body(content = JoinKeyRequest, description = "ttlSeconds 60…604800 (default 3600); allowedLabels and allowedKinds limit what the node may claim (absent: anything); an empty body takes the defaults"),
    responses((status = 201, description = "the key, shown once", body = JoinKeyResponse),
              (status = 400, description = "invalid_request", body = ErrorBody),
              (status = 413, description = "payload_too_large", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn create_join_key(
    State(app): State<Arc<App>>,
    admin: CanAdmin,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<JoinKeyResponse>), ApiError> {
    let req: JoinKeyRequest = read_json(&headers, body, true).await?;
    let ttl = req.ttl_seconds.unwrap_or(JOIN_KEY_TTL_DEFAULT);
    if !(JOIN_KEY_TTL_MIN..=JOIN_KEY_TTL_MAX).contains(&ttl) {
        return Err(ApiError::invalid_request(format!(
            "ttlSeconds: must be {JOIN_KEY_TTL_MIN}–{JOIN_KEY_TTL_MAX}, got {ttl}"
        )));
    }
    let note = req.note.unwrap_or_default();
    if note.len() > 200 {
        return Err(ApiError::invalid_request("note: at most 200 characters"));
    }
    let allowed = Allowance { allowed_labels: req.allowed_labels, allowed_kinds: req.allowed_kinds };
    allowed.validate().map_err(|e| ApiError::invalid_request(e.to_string()))?;
    let (key, expires) = app.store.issue_join_key(Duration::from_secs(ttl), &note, &allowed).await?;
    tracing::info!(by = %admin.sub(), note = %super::error::cut(&note), ttl_seconds = ttl, "join key issued");
    Ok((StatusCode::CREATED, Json(JoinKeyResponse { join_key: key, expires_at: clock::rfc3339_ms(expires) })))
}

/// The join keys still of interest (unexpired, or used within a week), newest first, at most
/// 1,000: never the keys themselves.
#[utoipa::path(get, path = "/api/v1/join-keys", tag = "admin", security(("admin" = ["fleet:read"])),
    responses((status = 200, body = List<JoinKeyView>), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn list_join_keys(State(app): State<Arc<App>>, _: CanRead) -> Result<Json<List<JoinKeyView>>, ApiError> {
    Ok(Json(List::page(app.store.join_keys().await?, None)))
}

/// Ends a join key now: no node joins with it, and the node it joined cannot join again with it.
#[utoipa::path(delete, path = "/api/v1/join-keys/{id}", tag = "admin", security(("admin" = ["fleet:admin"])),
    params(("id" = String, Path, description = "the key's id, as GET /api/v1/join-keys lists it")),
    responses((status = 204, description = "revoked (or already expired)"), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn revoke_join_key(
    State(app): State<Arc<App>>,
    admin: CanAdmin,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let found = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) && app.store.revoke_join_key(&id).await?;
    if !found {
        return Err(ApiError::not_found(format!("no join key with id {:?}", super::error::cut(&id))));
    }
    tracing::info!(by = %admin.sub(), id = %id, "join key revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// Every node with its announced attributes, liveness and lifecycle, by name.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("limit" = Option<u32>, Query, description = "at most this many (1…5000); without it, every node"),
           ("cursor" = Option<String>, Query, description = "the nextCursor of the last page")),
    responses((status = 200, body = List<NodeView>), (status = 400, description = "invalid_request", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn list_nodes(State(app): State<Arc<App>>, _: CanRead, page: Page) -> Result<Response, ApiError> {
    let now = clock::now_ms();
    let st = app.store.read();
    let mut nodes: Vec<&NodeRec> = st.nodes().filter(|n| page.after.as_deref().is_none_or(|a| &*n.name > a)).collect();
    nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let Some(limit) = page.limit else {
        let ids: Arc<[Id]> = nodes.into_iter().map(|n| n.id.clone()).collect();
        drop(st);
        return Ok(([(header::CONTENT_TYPE, "application/json")], whole_node_list(app, ids, now)).into_response());
    };
    let more = nodes.len() > limit;
    nodes.truncate(limit);
    let next_cursor = more.then(|| nodes.last().map(|n| page::encode(&n.name))).flatten();
    let items = nodes.into_iter().map(|n| st.node_view(n, now, app.offline_after)).collect();
    Ok(Json(List::page(items, next_cursor)).into_response())
}

/// Nodes of the unpaged list written into one chunk of its body.
const NODE_CHUNK: usize = 500;

/// The unpaged node list, [`NODE_CHUNK`] nodes a chunk, each chunk under its own short read
/// of the registry: the whole list at 10,000 nodes is ~9 MB of views and JSON.
fn whole_node_list(app: Arc<App>, ids: Arc<[Id]>, now: i64) -> Body {
    stream_items(0, move |start, items| {
        let st = app.store.read();
        node_chunk(&st, app.offline_after, &ids, start, now, items)
    })
}

/// The nodes of `ids` from `start` into `items` (a node deleted meanwhile is left out), and
/// where the next chunk starts.
fn node_chunk(
    st: &crate::store::State,
    offline_after: Duration,
    ids: &[Id],
    start: usize,
    now: i64,
    items: &mut Items,
) -> Option<usize> {
    let end = (start + NODE_CHUNK).min(ids.len());
    for n in ids[start..end].iter().filter_map(|id| st.node(id)) {
        items.push(&st.node_view(n, now, offline_after));
    }
    (end < ids.len()).then_some(end)
}

/// One node (by id or name) with the replicas it last reported.
#[utoipa::path(get, path = "/api/v1/nodes/{id}", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("id" = String, Path, description = "node id or name")),
    responses((status = 200, body = NodeDetail), (status = 404, description = "not_found", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn get_node(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    _: CanRead,
) -> Result<Json<NodeDetail>, ApiError> {
    let st = app.store.read();
    let n = st.resolve(&id).and_then(|id| st.node(&id)).ok_or_else(|| super::ops::unknown_node(&id))?;
    let now = clock::now_ms();
    Ok(Json(NodeDetail {
        node: st.node_view(n, now, app.offline_after),
        generation: st.desired(&n.id).map(|d| d.generation).unwrap_or(0),
        applied_generation: n.info.applied_generation,
        replicas: st.replica_reports(n, now),
    }))
}

/// Placements: one item per (agent, node) with a replica count, plus pending and stopped items.
#[utoipa::path(get, path = "/api/v1/placements", tag = "admin", security(("admin" = ["fleet:read"])),
    params(("limit" = Option<u32>, Query, description = "at most this many items (1…5000); without it, every item"),
           ("cursor" = Option<String>, Query, description = "the nextCursor of the last page")),
    responses((status = 200, body = List<PlacementView>), (status = 400, description = "invalid_request", body = ErrorBody), (status = 401, description = "invalid_token", body = ErrorBody), (status = 403, description = "insufficient_scope", body = ErrorBody), (status = 503, description = "not_configured", body = ErrorBody)))]
pub async fn list_placements(State(app): State<Arc<App>>, _: CanRead, page: Page) -> Result<Response, ApiError> {
    let placements = app.store.read().placements().clone();
    let Some(limit) = page.limit else {
        return Ok(([(header::CONTENT_TYPE, "application/json")], whole_list(placements)).into_response());
    };
    // The cursor is "<index within the agent's items>:<agent key>" of the next item.
    let (skip, from) = match page.after.as_deref().and_then(|a| a.split_once(':')) {
        Some((i, key)) => (i.parse::<usize>().unwrap_or(0), key.to_string()),
        None => (0, String::new()),
    };
    let mut items = Vec::with_capacity(limit.min(1024));
    let mut next_cursor = None;
    'agents: for (key, list) in placements.range_from(&from) {
        let start = if **key == *from { skip } else { 0 };
        for (i, v) in list.items.iter().enumerate().skip(start) {
            if items.len() == limit {
                next_cursor = Some(page::encode(&format!("{i}:{key}")));
                break 'agents;
            }
            items.push(v.view(key, list.revision));
        }
    }
    // A page names its nodes: the reader needs no whole node list to show them.
    let names = {
        let st = app.store.read();
        let ids = items.iter().filter_map(|v: &PlacementView| v.node_id.as_deref());
        ids.filter_map(|id| st.node(id).map(|n| (id.to_string(), n.name.to_string()))).collect()
    };
    Ok(Json(List { items, next_cursor, node_names: Some(names) }).into_response())
}

/// Items of the unpaged placement list written into one chunk of its body.
const LIST_CHUNK: usize = 1_000;

/// The unpaged placement list, [`LIST_CHUNK`] items a chunk built from the published agents
/// and outcome, which the stream shares. At 100,000 replicas the list is ~15 MB of JSON and
/// its views more again; built whole, every reader of it (a dashboard, a script polling it)
/// made that a peak of the controller's memory.
fn whole_list(placements: Placements) -> Body {
    stream_items((String::new(), 0), move |(from, skip), items| list_chunk(&placements, &from, skip, items))
}

/// The placement items from (`from` agent, `skip` of its items) into `items`, and where the
/// next chunk starts.
fn list_chunk(placements: &Placements, from: &str, skip: usize, items: &mut Items) -> Option<(String, usize)> {
    let mut written = 0;
    for (key, list) in placements.range_from(from) {
        let start = if **key == *from { skip } else { 0 };
        for (i, item) in list.items.iter().enumerate().skip(start) {
            if written == LIST_CHUNK {
                return Some((key.to_string(), i));
            }
            items.push(&item.view(key, list.revision));
            written += 1;
        }
    }
    None
}

/// One chunk of an unpaged list's body being written.
struct Items {
    out: Vec<u8>,
    /// An item was written before this one, in this chunk or an earlier one.
    any: bool,
}

impl Items {
    fn push(&mut self, item: &impl serde::Serialize) {
        if self.any {
            self.out.push(b',');
        }
        // Views of plain strings and numbers always serialise.
        let _ = serde_json::to_writer(&mut self.out, item);
        self.any = true;
    }
}

/// Where an unpaged list's body stands between chunks: the next chunk's start, whether an
/// item was written yet, whether the head is still to be written.
type Framing<P> = (P, bool, bool);

/// One chunk of an unpaged list: `{"items":[` first, the items `fill` writes from the
/// position, `]}` once `fill` says there is no next chunk.
fn frame<P>(
    (at, any, first): Framing<P>,
    fill: &mut impl FnMut(P, &mut Items) -> Option<P>,
) -> (Bytes, Option<Framing<P>>) {
    let mut items = Items { out: Vec::with_capacity(if first { 1024 } else { 64 * 1024 }), any };
    if first {
        items.out.extend_from_slice(b"{\"items\":[");
    }
    let next = fill(at, &mut items);
    if next.is_none() {
        items.out.extend_from_slice(b"]}");
    }
    let any = items.any;
    (items.out.into(), next.map(|p| (p, any, false)))
}

/// An unpaged list (`{"items":[…]}`, as [`List::all`] serialises) written as it is sent, a
/// chunk at a time from `start`: the list is never held whole.
fn stream_items<P: Send + 'static>(
    start: P,
    mut fill: impl FnMut(P, &mut Items) -> Option<P> + Send + 'static,
) -> Body {
    let chunks = futures::stream::unfold(Some((start, false, true)), move |at| {
        let chunk = at.map(|at| frame(at, &mut fill));
        std::future::ready(chunk.map(|(bytes, next)| (Ok::<_, std::io::Error>(bytes), next)))
    });
    Body::from_stream(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::PlacementStatus;

    /// `n` replicas of agents of three and four, each on its own node: chunks end inside an
    /// agent's items, between agents and at the very end.
    fn placements(n: usize) -> Placements {
        use crate::store::kept::Outcome;
        let (mut agents, mut bound) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < n {
            let (key, replicas) = (format!("agent-{:05}", agents.len()), (3 + agents.len() % 2).min(n - i));
            let agent = serde_json::json!({"key": key, "revision": 1, "state": "running", "identity": {"kind": "agent"},
                "executor": {"kind": "k", "image": null}, "placement": {"replicas": replicas}});
            agents.push(serde_json::from_value(agent).unwrap());
            for r in 0..replicas {
                bound.push((Id::from(key.as_str()), r as u32, Id::from(format!("node-{i:05}"))));
                i += 1;
            }
        }
        let outcome = Outcome { bindings: bound.into_iter().collect(), ..Outcome::default() };
        Placements::of_list(&agents, Arc::new(outcome))
    }

    /// The chunks of an unpaged list, in order, as its body streams them.
    fn chunks<P>(start: P, mut fill: impl FnMut(P, &mut Items) -> Option<P>) -> Vec<Bytes> {
        let (mut out, mut at) = (Vec::new(), Some((start, false, true)));
        while let Some(framing) = at {
            let (bytes, next) = frame(framing, &mut fill);
            out.push(bytes);
            at = next;
        }
        out
    }

    fn node(i: usize) -> NodeRec {
        NodeRec {
            id: format!("id-{i}").into(),
            name: format!("n-{i:05}").into(),
            token_hash: [0; 32],
            public_key: [0; 32],
            joined_ms: 0,
            last_seen_ms: 0,
            info: Default::default(),
            allow: Default::default(),
            allowed: None,
            lifecycle: Default::default(),
            reported: false,
        }
    }

    #[test]
    fn the_unpaged_node_list_streams_in_chunks_and_leaves_out_deleted_nodes() {
        let after = Duration::from_secs(60);
        for n in [0, 1, NODE_CHUNK, NODE_CHUNK + 1, 1_203] {
            let mut st = (0..n).fold(crate::store::State::default(), |st, i| st.with_node(node(i)));
            let ids: Vec<Id> = (0..n).map(|i| Id::from(format!("id-{i}"))).collect();
            // Deleted after the list was taken: the first node of the second chunk.
            if n > NODE_CHUNK {
                st = st.without_node(&ids[NODE_CHUNK]);
            }
            let body = chunks(0, |start, items| node_chunk(&st, after, &ids, start, 0, items)).concat();
            let views: Vec<NodeView> =
                ids.iter().filter_map(|id| st.node(id)).map(|r| st.node_view(r, 0, after)).collect();
            let whole = serde_json::to_vec(&List::page(views, None)).unwrap();
            assert_eq!(String::from_utf8(body).unwrap(), String::from_utf8(whole).unwrap(), "{n} nodes");
        }
    }

    #[test]
    fn the_unpaged_list_streams_in_chunks_that_make_the_whole_list() {
        for n in [0, 1, LIST_CHUNK, 2_503] {
            let placements = placements(n);
            assert_eq!(placements.iter().filter(|v| v.status == PlacementStatus::Placed).count(), n);
            let parts = chunks((String::new(), 0), |(from, skip), items| list_chunk(&placements, &from, skip, items));
            assert_eq!(parts.len(), n.div_ceil(LIST_CHUNK).max(1), "{n} items");
            let body: Vec<u8> = parts.concat();
            let whole = serde_json::to_vec(&List::all(placements.to_vec())).unwrap();
            assert_eq!(String::from_utf8(body).unwrap(), String::from_utf8(whole).unwrap(), "{n} items");
        }
    }
}
