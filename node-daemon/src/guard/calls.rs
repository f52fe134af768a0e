//! The calls the guard admits, one function each (docs/behaviour.md#what-the-guard-checks-and-why):
//! a create is judged by the policy, its volumes by their labels, its binds copied into the
//! guard's own files; a call on one container is made on the engine's full id of the one
//! container the client named, and only when it is this node's; anything not the node's own
//! answers `404` as the engine answers for what does not exist.

use super::engine::{self, Found};
use super::files::{Owner, Source};
use super::forward::{answer, forward, json_response, Body, Guard, Sent};
use super::route::{Action, Call, Refusal};
use crate::runtime::{LABEL_AGENT, LABEL_KIND};
use hyper::{Method, Response, StatusCode};
use std::path::PathBuf;

/// What a call comes to: an answer made here, or one of the engine's.
pub type Outcome = Result<Response<Body>, Refusal>;

/// `POST /containers/create`.
pub async fn create_container(g: &Guard, call: &Call, bytes: &[u8]) -> Outcome {
    let mut admitted = g.policy.container_request(call.query.get("name"), bytes)?;
    for volume in &admitted.volumes {
        check_volume(g, &call.version, volume, true).await?;
    }
    let dir = g.tree.new_dir().map_err(Refusal)?;
    let mounts = admitted.body.host_config.as_mut().and_then(|h| h.mounts.as_mut());
    if let Err(e) = copy_files(g, &dir, &admitted.files, admitted.owner, mounts) {
        g.tree.remove_dir(&dir);
        return Err(e);
    }
    let sent = forward(g, &Method::POST, &call.forward_path(""), Some(super::body::to_bytes(&admitted.body))).await;
    if !matches!(&sent, Sent::Answer(r) if r.status().is_success()) {
        g.tree.remove_dir(&dir);
    }
    Ok(sent.into_response())
}

/// Each bound file copied into `dir`, and its mount pointed at the copy.
fn copy_files(
    g: &Guard,
    dir: &std::path::Path,
    files: &[(usize, Source)],
    owner: Owner,
    mounts: Option<&mut Vec<super::body::Mount>>,
) -> Result<(), Refusal> {
    let mounts = mounts.ok_or_else(|| Refusal("HostConfig.Mounts changed under the guard".into()))?;
    for (i, source) in files {
        let copy = g.tree.copy(dir, source, owner).map_err(|e| Refusal(format!("bind source refused: {e}")))?;
        mounts[*i].source = Some(copy.display().to_string());
    }
    Ok(())
}

/// `POST /volumes/create`: a name that exists already must be one of this node's volumes
/// (the engine answers a create of an existing name with that volume, whatever its labels).
pub async fn create_volume(g: &Guard, call: &Call, bytes: &[u8]) -> Outcome {
    let body = g.policy.volume_request(bytes)?;
    check_volume(g, &call.version, body.name.as_deref().unwrap_or(""), false).await?;
    Ok(forward(g, &Method::POST, &call.forward_path(""), Some(super::body::to_bytes(&body))).await.into_response())
}

/// A volume is this node's by its labels; `must_exist` for one a container mounts.
async fn check_volume(g: &Guard, version: &str, name: &str, must_exist: bool) -> Result<(), Refusal> {
    let labels = engine::volume_labels(&g.upstream, version, name).await.map_err(Refusal)?;
    match labels {
        Some(l) if g.policy.owns(|k| l.get(k).map(String::as_str)) => Ok(()),
        Some(_) => Err(Refusal(format!("volume {name:?} is not this node's (its fleet.node label)"))),
        None if must_exist => {
            Err(Refusal(format!("volume {name:?} does not exist: create it through the guard first")))
        }
        None => Ok(()),
    }
}

/// Inspect, start, stop or remove the container `reference` names.
pub async fn container(g: &Guard, call: &Call, reference: &str, action: Action) -> Outcome {
    let found = match engine::container(&g.upstream, &call.version, reference).await {
        Ok(Some(f)) if g.policy.owns(|k| f.labels.get(k).map(String::as_str)) => f,
        Ok(_) => return Ok(no_such("container", reference)),
        Err(e) => return Ok(answer(StatusCode::BAD_GATEWAY, &e)),
    };
    let path = call.forward_path(&found.id);
    match action {
        Action::Inspect => Ok(json_response(StatusCode::OK, found.raw.to_vec())),
        Action::Start => {
            refresh_files(g, &found)?;
            Ok(forward(g, &Method::POST, &path, None).await.into_response())
        }
        Action::Stop => Ok(forward(g, &Method::POST, &path, None).await.into_response()),
        Action::Remove => Ok(remove(g, &found, &path).await),
    }
}

/// Before a start: every bind is one of the guard's files, written again from its source.
/// A container whose binds lead elsewhere (made before the guard copied files, or not by
/// it) is not started: the engine would resolve a path the node can write.
fn refresh_files(g: &Guard, found: &Found) -> Result<(), Refusal> {
    let owner =
        Owner::parse(&found.user).ok_or_else(|| Refusal(format!("container user {:?} is not numeric", found.user)))?;
    for bind in &found.binds {
        let Some((dir, source)) = g.tree.parse(bind, found.label(LABEL_AGENT)) else {
            return Err(Refusal(format!(
                "container {} binds {bind:?}, which {}: remove it and let fleet-node create it again",
                found.id,
                crate::runtime::NOT_THE_GUARDS_FILES
            )));
        };
        if let Source::Secret(name) = &source {
            if !g.policy.secret_allowed(found.label(LABEL_KIND), name) {
                return Err(Refusal(format!(
                    "secret {name:?} is no longer offered to kind {}",
                    found.label(LABEL_KIND)
                )));
            }
        }
        ensure_dir(&dir).map_err(Refusal)?;
        g.tree.copy(&dir, &source, owner).map_err(|e| Refusal(format!("bind source refused: {e}")))?;
    }
    Ok(())
}

/// A container's directory made again where it is gone (a `guardDir` on tmpfs after a reboot).
fn ensure_dir(dir: &PathBuf) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(format!("cannot make {}: {e}", dir.display())),
        _ => Ok(()),
    }
}

/// Removes the container, then its directory of files.
async fn remove(g: &Guard, found: &Found, path: &str) -> Response<Body> {
    let sent = forward(g, &Method::DELETE, path, None).await;
    if matches!(&sent, Sent::Answer(r) if r.status().is_success()) {
        let agent = found.label(LABEL_AGENT);
        let dirs: std::collections::BTreeSet<PathBuf> =
            found.binds.iter().filter_map(|b| g.tree.parse(b, agent)).map(|(d, _)| d).collect();
        dirs.iter().for_each(|d| g.tree.remove_dir(d));
    }
    sent.into_response()
}

/// `GET /fleet/v1/containers/{name}/busy`: the lease of one of this node's containers as
/// `{"lease": {"text", "writtenMs"} | null}`, or `{"problem"}` when its file is not one the
/// node may count (a link, not a regular file, too long); anything not the node's answers 404.
pub async fn busy(g: &Guard, reference: &str) -> Response<Body> {
    let found = match engine::container(&g.upstream, "", reference).await {
        Ok(Some(f)) if g.policy.owns(|k| f.labels.get(k).map(String::as_str)) => f,
        Ok(_) => return no_such("container", reference),
        Err(e) => return answer(StatusCode::BAD_GATEWAY, &e),
    };
    let body = match g.tree.lease(&found.binds, found.label(LABEL_AGENT)) {
        Ok(lease) => serde_json::json!({ "lease": lease.map(|l| serde_json::json!({
            "text": l.text,
            "writtenMs": l.written.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
        })) }),
        Err(e) => serde_json::json!({ "problem": e }),
    };
    json_response(StatusCode::OK, body.to_string().into_bytes())
}

/// `GET /images/{name}/json`, for an image one of the node's kinds may run only.
pub async fn inspect_image(g: &Guard, call: &Call, name: &str) -> Outcome {
    if !g.policy.image_allowed(name) {
        return Ok(no_such("image", name));
    }
    Ok(forward(g, &Method::GET, &call.forward_path(""), None).await.into_response())
}

/// The engine's own answer for what does not exist: the node learns nothing of what is not its own.
fn no_such(what: &str, name: &str) -> Response<Body> {
    answer(StatusCode::NOT_FOUND, &format!("No such {what}: {name}"))
}
