//! Starting the guard (docs/behaviour.md#the-guards-own-files): who the node is, the guard's
//! own directory made or checked, what node.yaml asks that the guard cannot give, and a
//! look at the engine — another node's objects named with this node's prefix refuse the
//! start, and directories of containers that are gone are removed.

use super::engine;
use super::files::Tree;
use super::forward::Guard;
use super::policy::Policy;
use super::proxy::{serve, Listener};
use super::upstream::Upstream;
use crate::config::NodeConfig;
use crate::runtime::{LABEL_AGENT, LABEL_MANAGED, LABEL_NODE};
use serde_json::Value;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Runs `fleet-node docker-guard` until the process ends; `node_user` is `--node-user`.
pub async fn start(cfg: &NodeConfig, listen: &str, docker: &str, node_user: Option<&str>) -> Result<(), String> {
    let guard = prepare(cfg, node_user, Upstream::parse(docker)?)?;
    look_at_the_engine(&guard).await?;
    let listener = Listener::bind(listen).await?;
    tracing::info!(%listen, node = %cfg.name, upstream = ?guard.upstream, guard_dir = %cfg.guard_dir.display(),
        node_user = %guard.tree.node_uid(), "docker-guard serving");
    serve(guard, listener).await;
    Ok(())
}

/// The guard of `cfg`, its directory made or checked, before it serves.
pub fn prepare(cfg: &NodeConfig, node_user: Option<&str>, upstream: Upstream) -> Result<Guard, String> {
    let user = node_user_of(cfg, node_user)?;
    let policy = Policy::from_config(cfg, user);
    policy.check_users()?;
    own_dir(&cfg.guard_dir)?;
    warn_if_node_writes(cfg.host_secrets_dir(), user.0);
    let tree = Tree::new(cfg.guard_dir.clone(), policy.agents_dir.clone(), policy.secrets_dir.clone(), user.0);
    Ok(Guard { policy, tree, upstream })
}

/// `--node-user UID:GID`, else the owner of `hostStateDir` (the node's own directory).
fn node_user_of(cfg: &NodeConfig, flag: Option<&str>) -> Result<(u32, u32), String> {
    if let Some(f) = flag {
        let parsed = f.split_once(':').and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
        return parsed.ok_or_else(|| format!("--node-user {f:?} must be UID:GID, numbers"));
    }
    let dir = cfg.host_state_dir();
    let m = std::fs::metadata(dir).map_err(|e| {
        format!("cannot tell the node's user from hostStateDir {}: {e} (pass --node-user UID:GID)", dir.display())
    })?;
    Ok((m.uid(), m.gid()))
}

/// `guardDir`, made `0700` where missing; one that another user owns, or others may write, is
/// refused: the files in it are what containers bind.
fn own_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot make guardDir {}: {e}", dir.display()))?;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("guardDir {}: {e}", dir.display()))?;
    let me = std::fs::metadata("/proc/self").map(|s| s.uid()).unwrap_or(u32::MAX);
    if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "guardDir {} must be a directory of the guard's own user (uid {me}) that no one else may write \
             (chown {me} and chmod 0700 it)",
            dir.display()
        ));
    }
    Ok(())
}

/// A secrets directory the node may write lets a compromised node read every secret and
/// rename one kind's secret to another's name: said once at start.
fn warn_if_node_writes(dir: &Path, node_uid: u32) {
    let Ok(m) = std::fs::metadata(dir) else { return };
    if node_uid != 0 && (m.uid() == node_uid || m.permissions().mode() & 0o002 != 0) {
        tracing::warn!(dir = %dir.display(), "hostSecretsDir is the node's to write: a compromised node could read \
            every secret in it and give one kind's secret to another; make it root's (chown root, chmod 0750, \
            group of the node) with files root's 0600 (docs/behaviour.md#the-guards-own-files)");
    }
}

/// Another node's containers or volumes named with this node's prefix refuse the start; the
/// directories of this node's containers that are gone are removed.
async fn look_at_the_engine(g: &Guard) -> Result<(), String> {
    let managed = format!("{{\"label\":[\"{LABEL_MANAGED}=1\"]}}");
    let query = format!("?all=1&filters={}", super::query::encode(&managed));
    let (containers, volumes) =
        match (list(g, &format!("/containers/json{query}")).await, list(g, &format!("/volumes{query}")).await) {
            (Ok(c), Ok(v)) => (c, v),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "docker-guard cannot look at the engine at start; it does once it serves");
                return Ok(());
            }
        };
    let volumes = volumes["Volumes"].as_array().cloned().unwrap_or_default();
    let names = containers.as_array().into_iter().flatten().chain(&volumes).filter_map(|o| foreign_name(g, o));
    if let Some((name, node)) = names.into_iter().next() {
        return Err(format!(
            "node {node:?}'s {name:?} on this engine is named with this node's prefix {:?}: give each node on one \
             engine a containerPrefix that is not the start of another's",
            g.policy.prefix
        ));
    }
    sweep(g, &containers).await;
    Ok(())
}

/// A name of another node's object that reads as this node's (`<prefix>-…`).
fn foreign_name(g: &Guard, o: &Value) -> Option<(String, String)> {
    let node = o["Labels"][LABEL_NODE].as_str().unwrap_or("");
    let name = o["Names"][0].as_str().or(o["Name"].as_str())?.trim_start_matches('/');
    (node != g.policy.node && name.starts_with(&format!("{}-", g.policy.prefix)))
        .then(|| (name.to_string(), node.to_string()))
}

/// Removes the directories in `guardDir` that no container of this node binds.
async fn sweep(g: &Guard, containers: &Value) {
    let mut in_use = std::collections::BTreeSet::new();
    for c in containers.as_array().into_iter().flatten().filter(|c| c["Labels"][LABEL_NODE] == g.policy.node.as_str()) {
        let Some(id) = c["Id"].as_str() else { continue };
        let Ok(Some(found)) = engine::container(&g.upstream, "", id).await else { return };
        in_use.extend(found.binds.iter().filter_map(|b| g.tree.parse(b, found.label(LABEL_AGENT))).map(|(d, _)| d));
    }
    let Ok(entries) = std::fs::read_dir(&g.tree.dir) else { return };
    for dir in entries.flatten().map(|e| e.path()) {
        let ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.len() == 16 && n.bytes().all(|b| b.is_ascii_hexdigit()));
        if ours && !in_use.contains(&dir) {
            g.tree.remove_dir(&dir);
        }
    }
}

async fn list(g: &Guard, path: &str) -> Result<Value, String> {
    let (status, body) = engine::get(&g.upstream, path, super::proxy::MAX_LIST).await?;
    if !status.is_success() {
        return Err(format!("Docker engine answered {status} to {path}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("Docker engine's list: {e}"))
}
