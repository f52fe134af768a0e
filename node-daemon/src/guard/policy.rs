//! What the guard admits in a create body (docs/behaviour.md#what-the-guard-checks-and-why),
//! as pure functions of the body: read with no repeated key ([`super::json`]), held to the
//! allow-lists ([`super::shape`]), read into the guard's typed body ([`super::body`]), judged
//! against this node's node.yaml — per kind, named by the container's `fleet.kind` label —
//! and forwarded as that typed body. Each refusal names the rule it broke. What a body binds
//! is named here (the agent's PAT, a secret of the kind) and copied by [`super::files`]: the
//! engine never resolves a path the node can write.

use super::body::{self, ContainerBody, HostConfig, VolumeBody};
use super::files::{Owner, Source};
use super::json::parse_unique;
use super::route::{refuse, Refusal};
use super::shape::{self, Shape};
use crate::config::NodeConfig;
use crate::runtime::{DEFAULT_PIDS_LIMIT, LABEL_AGENT, LABEL_KIND, LABEL_MANAGED, LABEL_NODE};
use fleet_api::images::AllowList;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The node's side of the policy, from its node.yaml.
#[derive(Debug, Clone)]
pub struct Policy {
    pub node: String,
    pub prefix: String,
    /// `hostStateDir/agents`: `<key>/agent-pat` is agent `<key>`'s PAT, as the node wrote it.
    pub agents_dir: PathBuf,
    /// `hostSecretsDir`: its files are the secrets a kind's `secrets` list limits.
    pub secrets_dir: PathBuf,
    /// `hostStateDir/leases`: `<name>` is the lease directory the node asks container `<name>`
    /// to bind; the guard binds a directory of its own instead.
    pub leases_dir: PathBuf,
    network: Option<String>,
    kinds: BTreeMap<String, KindRules>,
    /// Who a container of a kind without `user` runs as: the node's own user, never root.
    default_user: Owner,
}

/// The files a create's binds carry, by the index of their mount.
type Files = Vec<(usize, Source)>;

/// A create the policy admitted: the body to forward once its binds are the guard's copies,
/// and what the proxy still settles with the host and the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    pub body: ContainerBody,
    /// For each bind mount, by its index in `HostConfig.Mounts`, the file it carries.
    pub files: Files,
    /// The volumes it mounts: each must be this node's by its labels.
    pub volumes: Vec<String>,
    /// The user it runs as, who is given its files.
    pub owner: Owner,
}

/// What one executor kind's containers may be (node.yaml `executors.<kind>`).
#[derive(Debug, Clone)]
struct KindRules {
    image: String,
    allow: Option<AllowList>,
    caps: BTreeSet<String>,
    pids_limit: i64,
    user: Option<String>,
    max_nano_cpus: Option<i64>,
    max_memory: Option<i64>,
    /// `executors.<kind>.secrets`: the secret files its containers may mount; `None`: any.
    secrets: Option<Vec<String>>,
}

/// The `SecurityOpt` entries fleet-node sets; any other weakens the container.
const NO_NEW_PRIVILEGES: [&str; 3] = ["no-new-privileges", "no-new-privileges:true", "no-new-privileges=true"];

impl Policy {
    /// The policy of `cfg` for a node running as `node_user` (uid, gid).
    pub fn from_config(cfg: &NodeConfig, node_user: (u32, u32)) -> Policy {
        let kinds = cfg
            .executors
            .iter()
            .map(|(name, e)| {
                let max = e.max_resources.as_ref();
                let rules = KindRules {
                    image: e.image.clone(),
                    allow: AllowList::parse(&e.images).ok(),
                    caps: e.cap_add.iter().cloned().collect(),
                    pids_limit: e.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT),
                    user: e.user.clone(),
                    max_nano_cpus: max.and_then(|m| m.cpus).map(|c| (c * 1e9) as i64),
                    max_memory: max.and_then(|m| m.memory_mb).map(|m| (m as i64).saturating_mul(1024 * 1024)),
                    secrets: e.secrets.clone(),
                };
                (name.clone(), rules)
            })
            .collect();
        Policy {
            node: cfg.name.clone(),
            prefix: cfg.container_prefix.clone(),
            agents_dir: cfg.host_state_dir().join("agents"),
            secrets_dir: cfg.host_secrets_dir().to_path_buf(),
            leases_dir: cfg.host_state_dir().join("leases"),
            network: cfg.network.clone(),
            kinds,
            default_user: Owner::of_node(node_user),
        }
    }

    /// The numeric users of the kinds: the guard gives each container its files, so it must
    /// know the owner by number (a name is the image's to resolve).
    pub fn check_users(&self) -> Result<(), String> {
        let named: Vec<String> = self
            .kinds
            .iter()
            .filter_map(|(k, r)| {
                r.user.as_ref().filter(|u| Owner::parse(u).is_none()).map(|u| format!("executors.{k}.user {u:?}"))
            })
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} must be a numeric uid:gid behind the guard: it gives each container its PAT and secret files by number",
            named.join(", ")
        ))
    }

    /// Whether an image is one a kind of this node may run (its `image`, or one its `images` admits).
    pub fn image_allowed(&self, image: &str) -> bool {
        self.kinds.values().any(|k| k.image == image || k.allow.as_ref().is_some_and(|l| l.admits(image)))
    }

    /// Whether a kind lists the secret (or lists none, admitting every secret).
    pub fn secret_allowed(&self, kind: &str, name: &str) -> bool {
        self.kinds.get(kind).is_some_and(|k| k.secrets.as_ref().is_none_or(|l| l.iter().any(|s| s == name)))
    }

    /// Whether labels say a container or volume is one of this node's.
    pub fn owns<'a>(&self, mut label: impl FnMut(&str) -> Option<&'a str>) -> bool {
        label(LABEL_MANAGED) == Some("1") && label(LABEL_NODE) == Some(self.node.as_str())
    }

    /// A container-create request: the query's `name` and the body.
    pub fn container_request(&self, name: Option<&str>, bytes: &[u8]) -> Result<Admitted, Refusal> {
        self.check_name(name)?;
        let b: ContainerBody = read(bytes, &shape::CONTAINER)?;
        self.check_container(&b, name.unwrap_or(""))
    }

    /// A volume-create body; `Ok` is the body to forward.
    pub fn volume_request(&self, bytes: &[u8]) -> Result<VolumeBody, Refusal> {
        let b: VolumeBody = read(bytes, &shape::VOLUME)?;
        self.check_volume(&b)?;
        Ok(b)
    }

    /// The container's name (the query's, read once) has this node's prefix.
    fn check_name(&self, name: Option<&str>) -> Result<(), Refusal> {
        let own = format!("{}-", self.prefix);
        match name {
            Some(n) if n.starts_with(&own) && super::route::is_container_ref(n) => Ok(()),
            _ => refuse(format!("the container name must start with {own} (the query's name=)")),
        }
    }

    fn check_container(&self, b: &ContainerBody, name: &str) -> Result<Admitted, Refusal> {
        let labels = b.labels.clone().unwrap_or_default();
        if !self.owns(|k| labels.get(k).map(String::as_str)) {
            return refuse(format!("Labels must carry {LABEL_MANAGED}=1 and {LABEL_NODE}={}", self.node));
        }
        let kind_name = labels.get(LABEL_KIND).map(String::as_str).unwrap_or("");
        let Some(kind) = self.kinds.get(kind_name) else {
            return refuse(format!(
                "Labels must name one of node.yaml's executors in {LABEL_KIND} (not {kind_name:?})"
            ));
        };
        let image = b.image.as_deref().unwrap_or("");
        if kind.image != image && !kind.allow.as_ref().is_some_and(|l| l.admits(image)) {
            return refuse(format!(
                "Image {image:?} is neither kind {kind_name}'s image nor admitted by its images list"
            ));
        }
        let owner = self.check_user(b.user.as_deref(), kind, kind_name)?;
        let Some(host) = &b.host_config else {
            return refuse("HostConfig must be set (capabilities dropped, limits, no new privileges)");
        };
        self.check_host(host, kind, kind_name)?;
        let agent = labels.get(LABEL_AGENT).map(String::as_str).unwrap_or("");
        let (files, volumes) = self.mounts(host, agent, kind_name, name)?;
        Ok(Admitted { body: b.clone(), files, volumes, owner })
    }

    /// `User` is the kind's `user`, else the node's own (never root unless node.yaml says so).
    fn check_user(&self, user: Option<&str>, kind: &KindRules, kind_name: &str) -> Result<Owner, Refusal> {
        let want = kind.user.clone().unwrap_or_else(|| self.default_user.to_string());
        match (user, Owner::parse(&want)) {
            (Some(u), Some(owner)) if u == want => Ok(owner),
            _ => {
                let whose = if kind.user.is_some() {
                    format!("executors.{kind_name}.user")
                } else {
                    "the node's own user: set executors.<kind>.user for another".into()
                };
                refuse(format!("User must be {want:?} ({whose})"))
            }
        }
    }

    fn check_host(&self, h: &HostConfig, kind: &KindRules, kind_name: &str) -> Result<(), Refusal> {
        if h.cap_drop.as_deref() != Some(&["ALL".to_string()][..]) {
            return refuse(
                "HostConfig.CapDrop must be [\"ALL\"]: a container gets only the capabilities its kind grants",
            );
        }
        for cap in h.cap_add.iter().flatten() {
            if !kind.caps.contains(cap) {
                return refuse(format!(
                    "HostConfig.CapAdd {cap:?} is not allowed: executors.{kind_name}.capAdd does not grant it"
                ));
            }
        }
        let opts = h.security_opt.as_deref().unwrap_or_default();
        if let Some(opt) = opts.iter().find(|o| !NO_NEW_PRIVILEGES.contains(&o.as_str())) {
            return refuse(format!("HostConfig.SecurityOpt {opt:?} is not allowed: only no-new-privileges"));
        }
        if opts.is_empty() {
            return refuse("HostConfig.SecurityOpt must hold no-new-privileges");
        }
        check_limits(h, kind, kind_name)?;
        if let Some(mode) = h.network_mode.as_deref() {
            let own = self.network.as_deref() == Some(mode);
            if !own && !matches!(mode, "" | "default" | "bridge" | "none") {
                return refuse(format!("HostConfig.NetworkMode {mode:?} is not allowed: only node.yaml's network"));
            }
        }
        if let Some(t) = h.log_config.as_ref().and_then(|l| l.r#type.as_deref()) {
            if !matches!(t, "" | "json-file" | "local") {
                return refuse(format!("HostConfig.LogConfig.Type {t:?} is not allowed: only json-file or local"));
            }
        }
        Ok(())
    }

    /// What each mount carries: a read-only bind, the agent's PAT or a secret the kind may
    /// mount; the one writable bind, the container's own lease directory; a volume, one named
    /// with the prefix.
    fn mounts(&self, h: &HostConfig, agent: &str, kind: &str, name: &str) -> Result<(Files, Vec<String>), Refusal> {
        let (mut files, mut volumes) = (Vec::new(), Vec::new());
        for (i, m) in h.mounts.iter().flatten().enumerate() {
            let source = m.source.as_deref().unwrap_or("");
            match m.r#type.as_deref().unwrap_or("") {
                "bind" if m.read_only == Some(true) => files.push((i, self.bind_source(source, agent, kind)?)),
                "bind" if self.is_lease(m, name) => files.push((i, Source::Lease)),
                "bind" => return refuse(format!("bind mount of {source:?} must be ReadOnly")),
                "volume" => {
                    self.check_volume_name(source)?;
                    volumes.push(source.to_string());
                }
                other => return refuse(format!("mount type {other:?} is not allowed: only bind and volume")),
            }
        }
        Ok((files, volumes))
    }

    /// The writable bind of a container's lease directory: exactly `hostStateDir/leases/<its
    /// name>` at `/run/fleet/busy`. The guard binds a directory it makes instead, so the path
    /// only names what is asked for, and nothing the node writes is ever bound writable.
    fn is_lease(&self, m: &super::body::Mount, name: &str) -> bool {
        let source = Path::new(m.source.as_deref().unwrap_or(""));
        m.read_only == Some(false)
            && m.target.as_deref() == Some(crate::lease::TARGET)
            && super::route::is_container_ref(name)
            && source == self.leases_dir.join(name)
    }

    /// A bind source is the agent's own PAT file or a file of the secrets directory the kind
    /// may mount, named exactly: the guard copies its content, so no link is ever followed.
    fn bind_source(&self, source: &str, agent: &str, kind: &str) -> Result<Source, Refusal> {
        let path = Path::new(source);
        if fleet_api::names::is_agent_key(agent) && path == self.agents_dir.join(agent).join("agent-pat") {
            return Ok(Source::Pat(agent.to_string()));
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.parent() != Some(self.secrets_dir.as_path()) || !fleet_api::names::is_secret_name(name) {
            return refuse(format!(
                "bind source {source:?} is not allowed: only {}/{agent}/agent-pat (this container's agent) and files in {}",
                self.agents_dir.display(),
                self.secrets_dir.display()
            ));
        }
        if !self.secret_allowed(kind, name) {
            return refuse(format!("secret {name:?} is not allowed: executors.{kind}.secrets does not list it"));
        }
        Ok(Source::Secret(name.to_string()))
    }

    fn check_volume_name(&self, name: &str) -> Result<(), Refusal> {
        if name.starts_with(&format!("{}-", self.prefix)) && super::route::is_container_ref(name) {
            return Ok(());
        }
        refuse(format!("volume {name:?} is not allowed: only volumes named {}-…", self.prefix))
    }

    fn check_volume(&self, b: &VolumeBody) -> Result<(), Refusal> {
        self.check_volume_name(b.name.as_deref().unwrap_or(""))?;
        let labels = b.labels.clone().unwrap_or_default();
        if !self.owns(|k| labels.get(k).map(String::as_str)) {
            return refuse(format!("volume Labels must carry {LABEL_MANAGED}=1 and {LABEL_NODE}={}", self.node));
        }
        if let Some(d) = b.driver.as_deref().filter(|d| !d.is_empty() && *d != "local") {
            return refuse(format!("volume Driver {d:?} is not allowed: only local"));
        }
        if b.driver_opts.as_ref().is_some_and(|o| !o.is_empty()) {
            return refuse("volume DriverOpts are not allowed: with them a local volume can bind any host path");
        }
        Ok(())
    }
}

/// PIDs, memory and CPU within the kind's limits; swap no larger than memory.
fn check_limits(h: &HostConfig, kind: &KindRules, kind_name: &str) -> Result<(), Refusal> {
    match h.pids_limit {
        Some(n) if n > 0 && n <= kind.pids_limit => {}
        _ => {
            return refuse(format!(
                "HostConfig.PidsLimit must be set, between 1 and {} (executors.{kind_name}.pidsLimit)",
                kind.pids_limit
            ))
        }
    }
    let within = |v: Option<i64>, max: Option<i64>| match max {
        None => v.is_none_or(|v| v >= 0),
        Some(m) => v.is_some_and(|v| v > 0 && v <= m),
    };
    if !within(h.memory, kind.max_memory) {
        return refuse(format!("HostConfig.Memory must be set within executors.{kind_name}.maxResources.memoryMb"));
    }
    if !within(h.nano_cpus, kind.max_nano_cpus) {
        return refuse(format!("HostConfig.NanoCpus must be set within executors.{kind_name}.maxResources.cpus"));
    }
    // Absent, Docker gives a container as much swap again as its memory.
    if h.memory_swap != h.memory {
        return refuse("HostConfig.MemorySwap must be set and equal HostConfig.Memory: no swap beyond the limit");
    }
    Ok(())
}

/// `bytes` read strictly: no repeated key, every key on the allow-list, into the typed body.
fn read<T: serde::de::DeserializeOwned>(bytes: &[u8], shape: &Shape) -> Result<T, Refusal> {
    let v = parse_unique(bytes).map_err(Refusal)?;
    shape::check(&v, shape, "").map_err(Refusal)?;
    body::typed(v).map_err(Refusal)
}

#[cfg(test)]
mod tests;
