//! From the desired state to what each replica should be (docs/behaviour.md#container-rules, docs/behaviour.md#the-agent-container, docs/behaviour.md#images-an-agent-may-name and docs/behaviour.md#secrets): a container spec
//! with its `fleet.spec` hash, or a refusal that costs nothing (no container, no restarts).

use crate::config::NodeConfig;
use crate::guard::files::Owner;
use crate::runtime::{
    Bind, ContainerSpec, Hardening, DEFAULT_PIDS_LIMIT, LABEL_AGENT, LABEL_KIND, LABEL_MANAGED, LABEL_NODE,
    LABEL_REPLICA, LABEL_SPEC, LABEL_SPEC_ID,
};
use crate::state::StateDir;
use fleet_api::images::AllowList;
use fleet_api::{names, DesiredAgent, DesiredState};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

/// Stop timeout of containers whose agent left the desired state entirely.
pub const VANISHED_STOP: Duration = Duration::from_secs(30);
/// The longest drain the node honours.
pub const MAX_DRAIN: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Run(Box<ContainerSpec>),
    Refuse(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub agent: String,
    pub replica: u32,
    pub revision: u64,
    pub drain: Duration,
    pub plan: Plan,
    /// The template's name the controller gave (docs/behaviour.md#rolling-out-a-change).
    pub spec_id: Option<String>,
}

/// The whole plan for one desired state.
#[derive(Debug, Clone, Default)]
pub struct NodePlan {
    pub wanted: Vec<Wanted>,
    /// Drain of every agent in the desired state (for replicas lowered away).
    pub drains: HashMap<String, Duration>,
}

pub fn container_name(prefix: &str, agent: &str, replica: u32) -> String {
    format!("{prefix}-{agent}-{replica}")
}

pub fn volume_name(prefix: &str, agent: &str, replica: u32) -> String {
    format!("{prefix}-{agent}-{replica}-data")
}

/// Secret names announced: files of `secretsDir` matching the name rule, never `agent-pat`.
pub fn read_secrets(dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeSet::new() };
    entries
        .flatten()
        // Regular files only (`file_type` does not follow links): a symlink could point an
        // agent's mount anywhere on the host (docs/behaviour.md#hardening).
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| names::is_secret_name(n))
        .collect()
}

use fleet_api::codes::refusal;
pub use fleet_api::codes::refusal::{image_not_allowed, CREDENTIAL_UNOPENABLE};

fn refusal(a: &DesiredAgent, cfg: &NodeConfig, secrets: &BTreeSet<String>) -> Result<String, String> {
    let kind = a.executor.kind.as_str();
    let Some(exec) = cfg.executors.get(kind) else {
        return Err(refusal::executor_kind_missing(kind));
    };
    let image = match &a.executor.image {
        Some(img) => {
            let allowed = AllowList::parse(&exec.images).map(|l| l.admits(img)).unwrap_or(false);
            if !allowed {
                return Err(image_not_allowed(img, kind));
            }
            img.clone()
        }
        None => exec.image.clone(),
    };
    // A secret outside the kind's list is refused before its file is looked at: whether it
    // exists is none of that agent's business (docs/behaviour.md#secrets).
    for s in &a.secrets {
        if !cfg.secret_allowed(kind, s) {
            return Err(refusal::secret_not_allowed(s, kind));
        }
        if !names::is_secret_name(s) || !secrets.contains(s) {
            return Err(refusal::secret_missing(s));
        }
    }
    Ok(image)
}

/// Builds the plan; opens and writes each agent's PAT (0600) as a side effect.
pub fn plan(desired: &DesiredState, cfg: &NodeConfig, state: &StateDir, secret_key: &[u8; 32]) -> NodePlan {
    let secrets = read_secrets(&cfg.secrets_dir);
    let mut out = NodePlan::default();
    for a in &desired.agents {
        if !names::is_agent_key(&a.agent_key) {
            tracing::error!(agent = %a.agent_key, "desired agent has an invalid key; skipped");
            continue;
        }
        let drain = Duration::from_secs(a.drain_seconds).min(MAX_DRAIN);
        out.drains.insert(a.agent_key.clone(), drain);
        let mut replicas: Vec<u32> = a.replica_indexes.clone();
        replicas.sort_unstable();
        replicas.dedup();
        let planned = refusal(a, cfg, &secrets).and_then(|image| {
            let pat = fleet_api::seal::open(secret_key, &a.identity.credential.ciphertext)
                .map_err(|_| CREDENTIAL_UNOPENABLE.to_string())?;
            let owner = pat_owner(&cfg.executors[&a.executor.kind]);
            state.write_pat(&a.agent_key, &pat, owner).map_err(|e| format!("cannot write the PAT: {e}"))?;
            Ok(image)
        });
        for r in replicas {
            let plan = match &planned {
                Ok(image) => Plan::Run(Box::new(spec(a, r, image, cfg))),
                Err(msg) => Plan::Refuse(msg.clone()),
            };
            let spec_id = a.spec_id.clone().filter(|s| fleet_api::validate::is_spec_id(s));
            out.wanted.push(Wanted {
                agent: a.agent_key.clone(),
                replica: r,
                revision: a.revision,
                drain,
                plan,
                spec_id,
            });
        }
    }
    out
}

/// The node's own uid and gid.
fn own_ids() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    static OWN: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| std::fs::metadata("/proc/self").ok().map(|m| (m.uid(), m.gid())))
}

/// The user agent containers run as when their kind names no `user`: the node's own, so they
/// read the PAT and secret files only the node's user may read (0600) — and never root: a
/// node running as root gives them `65534:65534` (docs/behaviour.md#hardening).
fn own_user() -> Option<String> {
    own_ids().map(|ids| Owner::of_node(ids).to_string())
}

/// Whom the node gives an agent's PAT file: nobody else, unless it runs as root and the
/// kind's containers as another user, who could not read a file of root's.
fn pat_owner(exec: &crate::config::Executor) -> Option<(u32, Option<u32>)> {
    give_to(&exec.user.clone().or_else(own_user)?)
}

/// Whom the node gives a file a container of `user` must reach: nobody but a numeric user
/// other than root, and only by a node running as root (no other may give files away).
pub fn give_to(user: &str) -> Option<(u32, Option<u32>)> {
    let owner = Owner::parse(user)?;
    (own_ids()?.0 == 0 && owner.uid != 0).then_some((owner.uid, owner.gid))
}

/// The resources a replica runs with (docs/behaviour.md#hardening): the agent's, else the kind's
/// `defaultResources`, each clamped to `maxResources` (and the maximum itself when neither
/// sets one: a kind's maximum is a limit every container has); and, when one was clamped, the
/// note its report carries.
fn resources(a: &DesiredAgent, exec: &crate::config::Executor) -> (Option<f64>, Option<u64>, Option<String>) {
    let default = exec.default_resources.as_ref();
    let cpus = a.resources.cpus.or(default.and_then(|d| d.cpus));
    let memory_mb = a.resources.memory_mb.or(default.and_then(|d| d.memory_mb));
    let max = exec.max_resources.as_ref();
    let mut clamped = Vec::new();
    let cpus = match (cpus, max.and_then(|m| m.cpus)) {
        (Some(c), Some(m)) if c > m => {
            clamped.push(format!("cpus {c} → {m}"));
            Some(m)
        }
        (None, m) => m,
        (c, _) => c,
    };
    let memory_mb = match (memory_mb, max.and_then(|m| m.memory_mb)) {
        (Some(c), Some(m)) if c > m => {
            clamped.push(format!("memoryMb {c} → {m}"));
            Some(m)
        }
        (None, m) => m,
        (c, _) => c,
    };
    let note = (!clamped.is_empty())
        .then(|| format!("resources clamped to executors.{}.maxResources: {}", a.executor.kind, clamped.join(", ")));
    (cpus, memory_mb, note)
}

/// The container of one replica. `fleet.spec` hashes exactly what forces a recreate: image,
/// final environment, secret names and mount sources, PAT credential id, resources (after the
/// kind's defaults and maximum), the kind's capabilities, pids limit and user, network,
/// dataPath and the container name.
pub fn spec(a: &DesiredAgent, replica: u32, image: &str, cfg: &NodeConfig) -> ContainerSpec {
    let exec = &cfg.executors[&a.executor.kind];
    let prefix = &cfg.container_prefix;
    let name = container_name(prefix, &a.agent_key, replica);
    let mut env: BTreeMap<String, String> = cfg.agent_env.clone();
    env.extend(exec.env.clone());
    env.insert("CONTROL_PLANE_AGENT_KEY".into(), a.agent_key.clone());
    env.insert("IAM_PRINCIPAL".into(), a.identity.principal_id.clone());
    env.insert("CONTROL_PLANE_IAM_TENANT".into(), a.identity.tenant_id.clone());
    env.insert("FLEET_REPLICA".into(), replica.to_string());
    let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    let host_state = cfg.host_state_dir();
    let host_secrets = cfg.host_secrets_dir();
    let mut binds = vec![Bind {
        source: host_state.join("agents").join(&a.agent_key).join("agent-pat").display().to_string(),
        target: "/run/secrets/agent-pat".into(),
    }];
    let mut secrets = a.secrets.clone();
    secrets.sort();
    secrets.dedup();
    for s in &secrets {
        binds.push(Bind { source: host_secrets.join(s).display().to_string(), target: format!("/run/secrets/{s}") });
    }
    let volume = exec.data_path.as_ref().map(|p| (volume_name(prefix, &a.agent_key, replica), p.clone()));
    let (cpus, memory_mb, note) = resources(a, exec);
    let nano_cpus = cpus.filter(|c| c.is_finite() && *c > 0.0).map(|c| (c * 1e9) as i64);
    let memory_bytes = memory_mb.map(|m| (m as i64).saturating_mul(1024 * 1024));
    let hardening = Hardening {
        cap_add: exec.cap_add.clone(),
        pids_limit: exec.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT),
        user: exec.user.clone().or_else(own_user),
    };
    let mut s = ContainerSpec {
        name: name.clone(),
        image: image.to_string(),
        env,
        labels: BTreeMap::new(),
        binds,
        volume,
        nano_cpus,
        memory_bytes,
        network: cfg.network.clone(),
        hardening,
        note,
        lease_dir: Some(crate::lease::Leases::new(&cfg.state_dir, host_state).host_dir(&name).display().to_string()),
    };
    let digest = {
        let mut h = Sha256::new();
        h.update(serde_json::to_vec(&s).unwrap_or_default());
        h.update(a.identity.credential.credential_id.as_bytes());
        // A restart stamp recreates the container with nothing else changed; without one the
        // hash is what it was before stamps existed.
        if a.restart != 0 {
            h.update(format!("restart {}", a.restart).as_bytes());
        }
        h.finalize()
    };
    let hash: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    s.labels = [
        (LABEL_MANAGED, "1".to_string()),
        (LABEL_NODE, cfg.name.clone()),
        (LABEL_AGENT, a.agent_key.clone()),
        (LABEL_KIND, a.executor.kind.clone()),
        (LABEL_REPLICA, replica.to_string()),
        (LABEL_SPEC, hash),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(id) = a.spec_id.as_ref().filter(|s| fleet_api::validate::is_spec_id(s)) {
        s.labels.insert(LABEL_SPEC_ID.to_string(), id.clone());
    }
    s
}

#[cfg(test)]
mod tests;
