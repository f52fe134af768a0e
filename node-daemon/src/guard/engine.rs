//! What the guard asks the engine itself (docs/behaviour.md#what-the-guard-checks-and-why): one
//! container or volume looked up **once**, by the name or prefix the client gave, so that the
//! call it then forwards names the object by the engine's full id — the object whose labels
//! were checked, not whichever one the engine would resolve the client's words to later.

use super::upstream::Upstream;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use serde_json::Value;
use std::collections::BTreeMap;

/// The most of an inspect answer the guard reads.
const MAX_INSPECT: usize = 4 << 20;

/// A container as the engine describes it.
#[derive(Debug, Clone)]
pub struct Found {
    /// The engine's full id (64 hex digits).
    pub id: String,
    pub labels: BTreeMap<String, String>,
    /// The host paths of its bind mounts, as the engine will resolve them at start.
    pub binds: Vec<String>,
    /// `Config.User`.
    pub user: String,
    /// The engine's answer, whole (an inspect is answered with it).
    pub raw: Bytes,
}

impl Found {
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map(String::as_str).unwrap_or("")
    }
}

/// `GET path` of the engine: its status and body (at most `max` bytes).
pub async fn get(up: &Upstream, path: &str, max: usize) -> Result<(StatusCode, Bytes), String> {
    let req = Request::get(path).header("host", "docker").body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let resp = up.send(req).await?;
    let status = resp.status();
    let body =
        Limited::new(resp.into_body(), max).collect().await.map_err(|e| format!("Docker engine: {e}"))?.to_bytes();
    Ok((status, body))
}

/// The container `reference` names (a name, a full id or an id prefix, resolved by the
/// engine), or `None` where there is none.
pub async fn container(up: &Upstream, version: &str, reference: &str) -> Result<Option<Found>, String> {
    let (status, body) = get(up, &format!("{version}/containers/{reference}/json"), MAX_INSPECT).await?;
    if status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("Docker engine answered {status} to the look-up of container {reference}"));
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("Docker engine's inspect: {e}"))?;
    let id = v["Id"].as_str().filter(|i| i.len() == 64 && i.bytes().all(|b| b.is_ascii_hexdigit()));
    let Some(id) = id else { return Err(format!("Docker engine's inspect of {reference} has no full Id")) };
    Ok(Some(Found {
        id: id.to_string(),
        labels: strings(&v["Config"]["Labels"]),
        binds: binds(&v),
        user: v["Config"]["User"].as_str().unwrap_or("").to_string(),
        raw: body,
    }))
}

/// The labels of volume `name`, or `None` where there is none.
pub async fn volume_labels(
    up: &Upstream,
    version: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, String> {
    let (status, body) = get(up, &format!("{version}/volumes/{name}"), MAX_INSPECT).await?;
    if status == StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(format!("Docker engine answered {status} to the look-up of volume {name}"));
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("Docker engine's volume: {e}"))?;
    Ok(Some(strings(&v["Labels"])))
}

fn strings(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|o| o.iter().filter_map(|(k, x)| Some((k.clone(), x.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

/// Every bind source of a container: its mounts of type `bind` (whichever way they were
/// asked for), and its legacy `HostConfig.Binds`.
fn binds(v: &Value) -> Vec<String> {
    let mounts = v["Mounts"].as_array().into_iter().flatten();
    let mut out: Vec<String> =
        mounts.filter(|m| m["Type"] == "bind").filter_map(|m| m["Source"].as_str().map(str::to_string)).collect();
    for b in v["HostConfig"]["Binds"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        out.push(b.split(':').next().unwrap_or(b).to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_way_of_binding_is_seen() {
        let v = json!({
            "Mounts": [{"Type": "bind", "Source": "/g/a/agent-pat"}, {"Type": "volume", "Source": "/var/lib/docker/volumes/x"}],
            "HostConfig": {"Binds": ["/etc:/host:ro"]}
        });
        assert_eq!(binds(&v), vec!["/g/a/agent-pat".to_string(), "/etc".to_string()]);
        assert!(binds(&json!({})).is_empty());
    }
}
