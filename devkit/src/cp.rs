//! The Control Plane side: `GET /api/v1/agents` with pagination and ETag, identity and
//! status writes, and devkit's own agent-editing endpoints.

use crate::Devkit;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

pub(crate) fn routes() -> Router<Devkit> {
    Router::new()
        .route("/api/v1/agents", get(list_agents))
        .route("/api/v1/agents/{key}/identity", put(put_identity))
        .route("/api/v1/agents/{key}/status", put(put_status))
        .route("/devkit/agents", get(dev_list))
        .route("/devkit/agents/{key}", put(dev_put).delete(dev_delete))
        .route("/devkit/agents/{key}/revision", post(dev_revision))
        .route("/devkit/agents/{key}/replicas", post(dev_replicas))
        .route("/devkit/agents/{key}/template", post(dev_template))
        .route("/devkit/agents/{key}/rollout", put(dev_rollout))
        .route("/devkit/agents/{key}/placement", put(dev_placement))
        .route("/devkit/agents/{key}/stop", post(dev_stop))
        .route("/devkit/agents/{key}/start", post(dev_start))
        .route("/devkit/statuses/{key}", get(dev_status))
        .route("/devkit/faults", put(dev_faults).get(dev_get_faults))
}

/// The unauthenticated route that mints admin tokens: served only on a loopback address,
/// where only this machine's users reach it.
pub(crate) fn mint_route() -> Router<Devkit> {
    Router::new().route("/devkit/admin-token", post(dev_admin_token))
}

fn err(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({"error": code, "message": code}))).into_response()
}

/// Common gate for CP calls: latency, outage, service token for `control-plane`.
pub(crate) async fn gate(
    dk: &Devkit,
    headers: &HeaderMap,
    audience: &str,
    down: fn(&crate::Faults) -> bool,
) -> Result<(), Response> {
    let latency = dk.state.lock().faults.latency_ms;
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let st = dk.state.lock();
    if down(&st.faults) {
        return Err(err(StatusCode::SERVICE_UNAVAILABLE, "unavailable"));
    }
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    match st.service_tokens.get(token) {
        Some((aud, exp)) if aud == audience && *exp > now => Ok(()),
        _ => Err(err(StatusCode::UNAUTHORIZED, "invalid_token")),
    }
}

async fn list_agents(
    State(dk): State<Devkit>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&dk, &headers, "control-plane", |f| f.cp_down).await {
        return r;
    }
    let mut st = dk.state.lock();
    let etag = format!("\"v{}\"", st.version);
    let cursor = q.get("cursor").and_then(|c| c.parse::<usize>().ok());
    if cursor.is_none() && headers.get("if-none-match").and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        st.count("list_agents_304");
        return StatusCode::NOT_MODIFIED.into_response();
    }
    st.count("list_agents");
    if cursor.is_none() {
        let v = st.version;
        st.version_served_at.entry(v).or_insert_with(std::time::Instant::now);
    }
    let start = cursor.unwrap_or(0);
    // Serialised from the stored items under the lock, without copying them: the simulator
    // lists 20,000 agents and shares its cores with the controller it measures.
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Page<'a> {
        items: Vec<&'a serde_json::value::RawValue>,
        next_cursor: Option<String>,
    }
    let items: Vec<&serde_json::value::RawValue> =
        st.agents_json.values().skip(start).take(st.page_size).map(|r| &**r).collect();
    let next = start + items.len();
    let next_cursor = if next < st.agents.len() { Some(next.to_string()) } else { None };
    let last = next_cursor.is_none();
    let body = serde_json::to_vec(&Page { items, next_cursor }).unwrap_or_default();
    if last {
        let v = st.version;
        st.version_listed_at.entry(v).or_insert_with(std::time::Instant::now);
    }
    ([("etag", etag), ("content-type", "application/json".to_string())], body).into_response()
}

async fn put_identity(
    State(dk): State<Devkit>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&dk, &headers, "control-plane", |f| f.cp_down).await {
        return r;
    }
    let mut st = dk.state.lock();
    if !st.agents.contains_key(&key) {
        return err(StatusCode::NOT_FOUND, "not_found");
    }
    for f in ["issuer", "iamTenantId", "iamPrincipalId"] {
        if !body.get(f).is_some_and(|v| v.is_string()) {
            return err(StatusCode::BAD_REQUEST, "invalid_request");
        }
    }
    st.count("put_identity");
    st.identities.insert(key, body);
    StatusCode::NO_CONTENT.into_response()
}

async fn put_status(
    State(dk): State<Devkit>,
    headers: HeaderMap,
    Path(key): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&dk, &headers, "control-plane", |f| f.cp_down).await {
        return r;
    }
    let mut st = dk.state.lock();
    if !st.agents.contains_key(&key) {
        return err(StatusCode::NOT_FOUND, "not_found");
    }
    if !body.get("phase").is_some_and(|v| v.is_string()) || !body.get("replicas").is_some_and(|v| v.is_array()) {
        return err(StatusCode::BAD_REQUEST, "invalid_request");
    }
    st.count("put_status");
    st.statuses.entry(key).or_default().push(body);
    StatusCode::NO_CONTENT.into_response()
}

async fn dev_list(State(dk): State<Devkit>) -> Json<Value> {
    let st = dk.state.lock();
    Json(json!({"items": st.agents.values().cloned().collect::<Vec<_>>()}))
}

async fn dev_put(State(dk): State<Devkit>, Path(key): Path<String>, Json(mut body): Json<Value>) -> StatusCode {
    body["key"] = Value::String(key);
    dk.put_agent(body);
    StatusCode::NO_CONTENT
}

async fn dev_delete(State(dk): State<Devkit>, Path(key): Path<String>) -> StatusCode {
    if dk.remove_agent(&key) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

fn edit(dk: &Devkit, key: &str, f: impl FnOnce(&mut Value)) -> StatusCode {
    if dk.edit_agent(key, f) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn dev_revision(State(dk): State<Devkit>, Path(key): Path<String>) -> StatusCode {
    edit(&dk, &key, |a| {
        let r = a["revision"].as_u64().unwrap_or(0);
        a["revision"] = json!(r + 1);
    })
}

async fn dev_replicas(State(dk): State<Devkit>, Path(key): Path<String>, Json(body): Json<Value>) -> StatusCode {
    let Some(n) = body.get("replicas").and_then(|v| v.as_u64()) else { return StatusCode::BAD_REQUEST };
    edit(&dk, &key, |a| {
        if !a["placement"].is_object() {
            a["placement"] = json!({});
        }
        a["placement"]["replicas"] = json!(n);
    })
}

/// A new template, as the CP would send it: `{image?, secrets?, resources?}` replace those
/// fields, and the revision goes up by one.
async fn dev_template(State(dk): State<Devkit>, Path(key): Path<String>, Json(body): Json<Value>) -> StatusCode {
    let Some(body) = body.as_object().cloned() else { return StatusCode::BAD_REQUEST };
    edit(&dk, &key, |a| {
        if let Some(image) = body.get("image") {
            a["executor"]["image"] = image.clone();
        }
        if !a["placement"].is_object() {
            a["placement"] = json!({});
        }
        for field in ["secrets", "resources"] {
            if let Some(v) = body.get(field) {
                a["placement"][field] = v.clone();
            }
        }
        let r = a["revision"].as_u64().unwrap_or(0);
        a["revision"] = json!(r + 1);
    })
}

/// The agent's `placement.rollout` policy, as given (invalid ones included: the controller
/// judges them).
async fn dev_rollout(State(dk): State<Devkit>, Path(key): Path<String>, Json(body): Json<Value>) -> StatusCode {
    edit(&dk, &key, |a| {
        if !a["placement"].is_object() {
            a["placement"] = json!({});
        }
        a["placement"]["rollout"] = body;
    })
}

/// Merges the body's fields into the item's `placement` (`{"spread": "zone", "priority":
/// 100}`); a field given as null is removed. Anything is taken: the controller judges it.
async fn dev_placement(State(dk): State<Devkit>, Path(key): Path<String>, Json(body): Json<Value>) -> StatusCode {
    let Some(fields) = body.as_object().cloned() else { return StatusCode::BAD_REQUEST };
    edit(&dk, &key, |a| {
        if !a["placement"].is_object() {
            a["placement"] = json!({});
        }
        let placement = a["placement"].as_object_mut().expect("an object");
        for (k, v) in fields {
            if v.is_null() {
                placement.remove(&k);
            } else {
                placement.insert(k, v);
            }
        }
    })
}

async fn dev_stop(State(dk): State<Devkit>, Path(key): Path<String>) -> StatusCode {
    edit(&dk, &key, |a| a["state"] = json!("stopped"))
}

async fn dev_start(State(dk): State<Devkit>, Path(key): Path<String>) -> StatusCode {
    edit(&dk, &key, |a| a["state"] = json!("running"))
}

async fn dev_status(State(dk): State<Devkit>, Path(key): Path<String>) -> Response {
    match dk.status(&key) {
        Some(s) => Json(s).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn dev_faults(State(dk): State<Devkit>, Json(f): Json<crate::Faults>) -> StatusCode {
    dk.set_faults(f);
    StatusCode::NO_CONTENT
}

async fn dev_get_faults(State(dk): State<Devkit>) -> Json<crate::Faults> {
    Json(dk.state.lock().faults.clone())
}

async fn dev_admin_token(State(dk): State<Devkit>, Json(body): Json<Value>) -> Json<Value> {
    let scopes: Vec<String> = body
        .get("scopes")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_else(|| vec!["fleet:admin".into()]);
    let aud = body.get("audience").and_then(|v| v.as_str()).unwrap_or("fleet");
    let ttl = body.get("ttlSeconds").and_then(|v| v.as_i64()).unwrap_or(86_400);
    let refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
    Json(json!({"token": dk.mint(aud, &refs, ttl)}))
}

#[cfg(test)]
mod tests {
    use crate::{Devkit, DevkitConfig};
    use serde_json::{json, Value};

    /// `PUT /devkit/agents/{key}/placement` merges its fields into the item's placement (a
    /// null removes one; anything is taken as written: the controller judges it), and an
    /// unknown agent is `404`.
    #[tokio::test]
    async fn placement_fields_are_merged_into_the_item() {
        let dk = Devkit::start(DevkitConfig::default(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        dk.put_agent(json!({"key": "a", "revision": 1, "state": "running", "identity": {"kind": "agent"},
                            "executor": {"kind": "k"}, "placement": {"replicas": 3}}));
        let http = reqwest::Client::new();
        let put = |key: &str, body: Value| {
            let req = http.put(format!("http://{}/devkit/agents/{key}/placement", dk.addr)).json(&body);
            async move { req.send().await.unwrap().status().as_u16() }
        };
        assert_eq!(put("a", json!({"spread": "zone", "priority": "high"})).await, 204);
        let placement = || async {
            let list: Value =
                http.get(format!("http://{}/devkit/agents", dk.addr)).send().await.unwrap().json().await.unwrap();
            let items = list.as_array().cloned().or_else(|| list["items"].as_array().cloned()).unwrap();
            items.into_iter().find(|a| a["key"] == "a").unwrap()["placement"].clone()
        };
        assert_eq!(placement().await, json!({"replicas": 3, "spread": "zone", "priority": "high"}));
        assert_eq!(put("a", json!({"priority": null})).await, 204);
        assert_eq!(placement().await, json!({"replicas": 3, "spread": "zone"}));
        assert_eq!(put("nope", json!({"spread": "zone"})).await, 404);
    }

    /// The unauthenticated admin-token route exists only where the devkit listens on loopback:
    /// bound to every address, the same machine asking through 127.0.0.1 gets no token.
    #[tokio::test]
    async fn admin_tokens_are_minted_for_loopback_listeners_only() {
        let http = reqwest::Client::new();
        let mint = |port: u16| {
            let req = http.post(format!("http://127.0.0.1:{port}/devkit/admin-token")).json(&json!({}));
            async move { req.send().await.unwrap() }
        };
        let local = Devkit::start(DevkitConfig::default(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
        let answer = mint(local.addr.port()).await;
        assert_eq!(answer.status(), 200);
        assert!(answer.json::<Value>().await.unwrap()["token"].as_str().is_some_and(|t| t.split('.').count() == 3));
        let everywhere = Devkit::start(DevkitConfig::default(), "0.0.0.0:0".parse().unwrap()).await.unwrap();
        let answer = mint(everywhere.addr.port()).await;
        assert_eq!(answer.status(), 404, "a token minted on a non-loopback listener");
        let agents = http.get(format!("http://127.0.0.1:{}/devkit/agents", everywhere.addr.port())).send().await;
        assert_eq!(agents.unwrap().status(), 200, "the rest of the devkit is served");
    }
}
