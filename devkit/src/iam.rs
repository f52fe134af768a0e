//! The IAM side: client-credentials tokens, the JWKS, agent principals and PATs with
//! idempotency keys (replayed with the token), the TTL cap and scope admissibility.

use crate::cp::gate;
use crate::{Devkit, PatRecord};
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn routes() -> Router<Devkit> {
    Router::new()
        .route("/oauth2/token", post(token))
        .route("/.well-known/jwks.json", get(jwks))
        .route("/tenants/{t}/agents", post(create_principal))
        .route("/tenants/{t}/agents/{id}/platform-access-tokens", post(issue_pat))
        .route("/tenants/{t}/agents/{id}/platform-access-tokens/{cid}", delete(revoke_pat))
        .route("/devkit/pats", get(list_pats))
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn err(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({"error": code, "message": message}))).into_response()
}

fn random_token(prefix: &str) -> String {
    use base64::Engine;
    let b: [u8; 24] = rand::random();
    format!("{prefix}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

async fn token(State(dk): State<Devkit>, Form(f): Form<HashMap<String, String>>) -> Response {
    let latency = dk.state.lock().faults.latency_ms;
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let mut st = dk.state.lock();
    if st.faults.iam_down {
        return err(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "IAM is down (devkit fault)");
    }
    if f.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return err(StatusCode::BAD_REQUEST, "unsupported_grant_type", "grant_type must be client_credentials");
    }
    if f.get("client_id") != Some(&st.client_id) || f.get("client_secret") != Some(&st.client_secret) {
        return err(StatusCode::UNAUTHORIZED, "invalid_client", "unknown client or wrong secret");
    }
    let aud = f.get("audience").cloned().unwrap_or_default();
    if !st.controller_audiences.contains(&aud) {
        return err(StatusCode::BAD_REQUEST, "invalid_audience", "the client may not ask for this audience");
    }
    let t = random_token("svc_");
    st.service_tokens.insert(t.clone(), (aud, now() + 3600));
    st.count("token");
    Json(json!({"access_token": t, "token_type": "Bearer", "expires_in": 3600})).into_response()
}

async fn jwks(State(dk): State<Devkit>) -> Response {
    let faults = dk.state.lock().faults.clone();
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    dk.state.lock().count("jwks");
    if faults.jwks_down {
        return err(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the JWKS is down (devkit fault)");
    }
    if faults.jwks_empty {
        return Json(json!({"keys": []})).into_response();
    }
    Json(dk.signer().jwks()).into_response()
}

fn idem(headers: &HeaderMap) -> Option<String> {
    headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string).filter(|s| !s.is_empty())
}

async fn create_principal(
    State(dk): State<Devkit>,
    headers: HeaderMap,
    Path(t): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&dk, &headers, "iam", |f| f.iam_down).await {
        return r;
    }
    let mut st = dk.state.lock();
    if t != st.tenant {
        return err(StatusCode::NOT_FOUND, "not_found", "unknown tenant");
    }
    if st.faults.iam_forbidden {
        return err(StatusCode::FORBIDDEN, "forbidden", "the service account lacks iam:agents");
    }
    let Some(key) = idem(&headers) else {
        return err(StatusCode::BAD_REQUEST, "invalid_request", "Idempotency-Key is required");
    };
    let Some(name) = body.get("name").and_then(|v| v.as_str()).map(str::to_string) else {
        return err(StatusCode::BAD_REQUEST, "invalid_request", "name is required");
    };
    if let Some(id) = st.principals.get(&key) {
        return (StatusCode::OK, Json(json!({"id": id}))).into_response();
    }
    let id = format!("prn_{}", uuid::Uuid::new_v4().simple());
    st.principals.insert(key, id.clone());
    st.principal_agent.insert(id.clone(), name);
    st.count("create_principal");
    (StatusCode::CREATED, Json(json!({"id": id}))).into_response()
}

fn rfc3339(secs: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

async fn issue_pat(
    State(dk): State<Devkit>,
    headers: HeaderMap,
    Path((t, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&dk, &headers, "iam", |f| f.iam_down).await {
        return r;
    }
    let (status, answer, delay) = match issue_locked(&dk, &headers, &t, &id, &body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    (status, Json(answer)).into_response()
}

/// The decision under the lock; the answer-delay fault is applied by the caller.
fn issue_locked(
    dk: &Devkit,
    headers: &HeaderMap,
    t: &str,
    id: &str,
    body: &Value,
) -> Result<(StatusCode, Value, u64), Box<Response>> {
    let mut st = dk.state.lock();
    if t != st.tenant || !st.principal_agent.contains_key(id) {
        return Err(Box::new(err(StatusCode::NOT_FOUND, "not_found", "unknown tenant or principal")));
    }
    if st.faults.iam_forbidden {
        return Err(Box::new(err(StatusCode::FORBIDDEN, "forbidden", "the service account lacks iam:agents")));
    }
    let Some(key) = idem(headers) else {
        return Err(Box::new(err(StatusCode::BAD_REQUEST, "invalid_request", "Idempotency-Key is required")));
    };
    if let Some(&i) = st.pat_by_key.get(&key) {
        st.count("issue_pat_replay");
        let p = &st.pats[i];
        return Ok((StatusCode::OK, json!({"id": p.id, "token": p.token, "expiresAt": p.expires_at}), 0));
    }
    let strings = |f: &str| -> Option<Vec<String>> {
        body.get(f)?.as_array()?.iter().map(|v| v.as_str().map(str::to_string)).collect()
    };
    let (Some(audiences), Some(scopes), Some(ttl)) =
        (strings("audiences"), strings("scopeCeiling"), body.get("expiresInSeconds").and_then(|v| v.as_u64()))
    else {
        return Err(Box::new(err(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "audiences, scopeCeiling and expiresInSeconds are required",
        )));
    };
    if ttl > st.max_ttl_seconds {
        return Err(Box::new(err(
            StatusCode::UNPROCESSABLE_ENTITY,
            "expiry_too_long",
            "agent PATs live at most 7 days",
        )));
    }
    within_grants(&st, &audiences, &scopes)?;
    let exp = now() + st.faults.pat_lifetime_seconds.unwrap_or(ttl) as i64;
    let rec = PatRecord {
        id: format!("cred_{}", uuid::Uuid::new_v4().simple()),
        principal_id: id.to_string(),
        agent_key: st.principal_agent.get(id).cloned(),
        token: random_token("pat_"),
        audiences,
        scope_ceiling: scopes,
        expires_at: rfc3339(exp),
        expires_in_seconds: ttl,
        description: body.get("description").and_then(|v| v.as_str()).unwrap_or("").to_string(),
        idempotency_key: key.clone(),
        revoked: false,
    };
    let answer = json!({"id": rec.id, "token": rec.token, "expiresAt": rec.expires_at});
    st.pats.push(rec);
    let i = st.pats.len() - 1;
    st.pat_by_key.insert(key, i);
    st.count("issue_pat");
    Ok((StatusCode::CREATED, answer, st.faults.pat_answer_delay_ms))
}

/// Whether the controller's grants admit a PAT for these audiences and this scope ceiling:
/// every audience is the controller's, every scope is one an audience asked for admits and
/// one the controller holds.
fn within_grants(st: &crate::state::DevState, audiences: &[String], scopes: &[String]) -> Result<(), Box<Response>> {
    for a in audiences {
        if !st.controller_audiences.contains(a) {
            return Err(Box::new(err(StatusCode::FORBIDDEN, "forbidden", "audience beyond the controller's grants")));
        }
    }
    for s in scopes {
        let (aud, scope) = match s.split_once('=') {
            Some((a, sc)) => (a.to_string(), sc.to_string()),
            None => (s.split(':').next().unwrap_or("").to_string(), s.clone()),
        };
        let admitted = audiences.contains(&aud)
            && st.audience_scopes.get(&aud).is_some_and(|l| l.contains(&scope))
            && st.controller_scopes.contains(&scope);
        if !admitted {
            return Err(Box::new(err(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_scope_ceiling",
                &format!("no audience admits {s}"),
            )));
        }
    }
    Ok(())
}

async fn revoke_pat(
    State(dk): State<Devkit>,
    headers: HeaderMap,
    Path((t, id, cid)): Path<(String, String, String)>,
) -> Response {
    if let Err(r) = gate(&dk, &headers, "iam", |f| f.iam_down).await {
        return r;
    }
    let mut st = dk.state.lock();
    if t != st.tenant {
        return err(StatusCode::NOT_FOUND, "not_found", "unknown tenant");
    }
    match st.pats.iter_mut().find(|p| p.id == cid && p.principal_id == id && !p.revoked) {
        Some(p) => {
            p.revoked = true;
            st.count("revoke_pat");
            StatusCode::NO_CONTENT.into_response()
        }
        None => err(StatusCode::NOT_FOUND, "not_found", "no such live credential"),
    }
}

async fn list_pats(State(dk): State<Devkit>) -> Json<Value> {
    Json(json!({"items": dk.pats()}))
}
