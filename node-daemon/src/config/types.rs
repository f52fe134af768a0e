//! The node's configuration as the daemon uses it, one field per node.yaml field
//! (docs/reference.md#node-configuration-nodeyaml), and the views of it the node announces.

use fleet_api::Capacity;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// An executor kind's settings (`executors.<kind>`). Default only as the placeholder of a kind
/// whose settings could not be read.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Executor {
    pub image: String,
    pub images: Vec<String>,
    /// The secrets an agent of this kind may mount (docs/behaviour.md#secrets); `None`: every
    /// secret of `secretsDir`, with a start-up warning.
    pub secrets: Option<Vec<String>>,
    pub env: BTreeMap<String, String>,
    pub data_path: Option<String>,
    /// [ext] Capabilities granted back after dropping all (docs/behaviour.md#hardening), e.g. `[NET_BIND_SERVICE]`.
    pub cap_add: Vec<String>,
    /// [ext] Most processes in one agent container (default 1024).
    pub pids_limit: Option<i64>,
    /// [ext] The user agent containers run as (`uid[:gid]` or a name the image knows).
    pub user: Option<String>,
    /// [ext] Resources of an agent that sets none.
    pub default_resources: Option<ResourceLimits>,
    /// [ext] Most resources an agent of this kind gets; more is clamped.
    pub max_resources: Option<ResourceLimits>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResourceLimits {
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct CapacityConfig {
    pub slots: u32,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    pub controller_url: String,
    pub name: String,
    pub labels: Vec<String>,
    pub capacity: CapacityConfig,
    pub executors: BTreeMap<String, Executor>,
    pub state_dir: PathBuf,
    pub host_state_dir: Option<PathBuf>,
    pub secrets_dir: PathBuf,
    pub host_secrets_dir: Option<PathBuf>,
    /// [ext] The Docker guard's own directory on the host: the files containers bind are
    /// copied there (docs/behaviour.md#the-guards-own-files). Only the guard reads it.
    pub guard_dir: PathBuf,
    pub docker_url: String,
    pub network: Option<String>,
    pub agent_env: BTreeMap<String, String>,
    pub join_key_file: Option<PathBuf>,
    pub observe_seconds: u32,
    pub container_prefix: String,
    pub ca_file: Option<PathBuf>,
    /// [ext] Allows a plain `http://` controllerUrl to a host other than this machine.
    pub insecure: bool,
    /// [ext] `checkBeforeStop`: a running container is stopped for a new template only once
    /// the node has checked the new one can start (docs/behaviour.md#rolling-out-a-change).
    pub check_before_stop: bool,
    /// [ext] `maintenanceWindows`: outside them no voluntary disruption starts on this node
    /// (docs/behaviour.md#maintenance-windows); announced like the labels.
    pub maintenance_windows: Vec<fleet_api::windows::MaintenanceWindow>,
}

impl NodeConfig {
    pub fn capacity(&self) -> Capacity {
        Capacity { slots: self.capacity.slots, cpus: self.capacity.cpus, memory_mb: self.capacity.memory_mb }
    }

    pub fn host_state_dir(&self) -> &Path {
        self.host_state_dir.as_deref().unwrap_or(&self.state_dir)
    }

    pub fn host_secrets_dir(&self) -> &Path {
        self.host_secrets_dir.as_deref().unwrap_or(&self.secrets_dir)
    }

    /// Kinds announced, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.executors.keys().cloned().collect()
    }

    /// Allow-lists announced: kinds with an empty list omitted, entries sorted.
    pub fn images(&self) -> BTreeMap<String, Vec<String>> {
        self.executors
            .iter()
            .filter(|(_, e)| !e.images.is_empty())
            .map(|(k, e)| {
                let mut v = e.images.clone();
                v.sort();
                v.dedup();
                (k.clone(), v)
            })
            .collect()
    }

    /// The secrets offered to each kind that lists its own: those of its list present in
    /// `secretsDir` (`present`), sorted. Kinds without a list are offered every secret and are
    /// not here (docs/behaviour.md#secrets).
    pub fn offered_secrets(&self, present: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
        self.executors
            .iter()
            .filter_map(|(k, e)| {
                let listed = e.secrets.as_ref()?;
                let offered: BTreeSet<&String> = listed.iter().filter(|s| present.contains(*s)).collect();
                Some((k.clone(), offered.into_iter().cloned().collect()))
            })
            .collect()
    }

    /// Whether an agent of `kind` may mount `secret`: its kind lists it, or lists nothing.
    pub fn secret_allowed(&self, kind: &str, secret: &str) -> bool {
        self.executors.get(kind).and_then(|e| e.secrets.as_ref()).is_none_or(|l| l.iter().any(|s| s == secret))
    }

    /// What the node warns of at start about its secrets (docs/behaviour.md#secrets): a kind
    /// without `secrets` (its agents may mount every secret), and a listed secret not in
    /// `secretsDir` now (`present`): an agent naming it is refused until the file is there.
    pub fn secret_warnings(&self, present: &BTreeSet<String>) -> Vec<String> {
        let mut out = Vec::new();
        for (kind, e) in &self.executors {
            match &e.secrets {
                None => out.push(format!(
                    "executors.{kind}.secrets is not set: agents of kind {kind} may mount every secret in secretsDir; list the ones they need"
                )),
                Some(list) => out.extend(list.iter().filter(|s| !present.contains(*s)).map(|s| {
                    format!("executors.{kind}.secrets names {s}, which is not in secretsDir: an agent naming it is refused until the file is there")
                })),
            }
        }
        out
    }

    pub fn sorted_labels(&self) -> Vec<String> {
        let mut v = self.labels.clone();
        v.sort();
        v.dedup();
        v
    }
}
