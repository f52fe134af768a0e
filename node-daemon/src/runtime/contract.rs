//! What the node asks of a container runtime: the container spec it creates from, what it
//! sees of a container, the labels that mark Fleet's containers, and the [`Runtime`] trait the
//! Docker adapter and the in-memory fake implement.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

pub const LABEL_MANAGED: &str = "fleet.managed";
pub const LABEL_NODE: &str = "fleet.node";
pub const LABEL_AGENT: &str = "fleet.agent";
pub const LABEL_REPLICA: &str = "fleet.replica";
pub const LABEL_SPEC: &str = "fleet.spec";
/// The controller's name of the template the container runs (docs/behaviour.md#rolling-out-a-change).
pub const LABEL_SPEC_ID: &str = "fleet.spec-id";
/// The executor kind: the Docker guard holds the container to that kind's limits.
pub const LABEL_KIND: &str = "fleet.kind";

/// What the Docker guard says of a container whose binds are not its own copies (one made
/// before the guard copied what containers bind): it will not start it, and fleet-node makes it
/// anew (docs/behaviour.md#the-guards-own-files).
pub const NOT_THE_GUARDS_FILES: &str = "is not one of the guard's files";

/// A read-only bind mount from the host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Bind {
    pub source: String,
    pub target: String,
}

/// Everything a replica's container is created with. Its JSON is what `fleet.spec` hashes
/// (`plan::spec`), so it is a contract across versions: a field added here must be left out of
/// the JSON while it holds its default (`skip_serializing_if`), as the restart stamp is left out
/// of the hash while it is 0 — else a node upgraded onto the new build recreates every
/// container it adopts (docs/behaviour.md#container-rules; `node-daemon/tests/corpus.rs` holds
/// each build to the containers earlier releases created).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    /// `KEY=VALUE`, ordered by key.
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub binds: Vec<Bind>,
    /// (volume name, mount target).
    pub volume: Option<(String, String)>,
    pub nano_cpus: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub network: Option<String>,
    /// What the container may do beyond nothing (docs/behaviour.md#hardening): every capability is dropped but
    /// these, no new privileges, at most `pids_limit` processes, as `user` (the kind's, else
    /// the node's own uid:gid, so it can read the 0600 PAT and secret files).
    pub hardening: Hardening,
    /// Said in the replica's report while it runs (resources clamped to the kind's maximum);
    /// not part of the spec hash.
    #[serde(skip)]
    pub note: Option<String>,
    /// The host directory bound writable at `/run/fleet/busy` for the replica's busy lease
    /// (`crate::lease`). Not part of the spec hash: a container made before leases existed is
    /// adopted as it is, and gets one when it is next made.
    #[serde(skip)]
    pub lease_dir: Option<String>,
}

/// The kind's limits on what an agent container may do (node.yaml `executors.<kind>`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Hardening {
    pub cap_add: Vec<String>,
    pub pids_limit: i64,
    pub user: Option<String>,
}

/// Processes an agent container may run when its kind sets no `pidsLimit`.
pub const DEFAULT_PIDS_LIMIT: i64 = 1024;

impl Default for Hardening {
    fn default() -> Self {
        Hardening { cap_add: Vec::new(), pids_limit: DEFAULT_PIDS_LIMIT, user: None }
    }
}

impl ContainerSpec {
    pub fn hash(&self) -> &str {
        self.labels.get(LABEL_SPEC).map(String::as_str).unwrap_or("")
    }
}

/// A container of this node as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub running: bool,
    /// The host path bound at `/run/fleet/busy`, if the container has a lease directory.
    pub lease_source: Option<String>,
}

/// What `inspect` tells about a container's last run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInfo {
    pub running: bool,
    pub exit_code: Option<i64>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RtError {
    #[error("Docker is unreachable: {0}")]
    Unreachable(String),
    #[error("no such container")]
    NotFound,
    #[error("{0}")]
    Failed(String),
}

pub trait Runtime: Clone + Send + Sync + 'static {
    fn ping(&self) -> impl Future<Output = Result<(), RtError>> + Send;
    /// Containers carrying this node's `fleet.managed` and `fleet.node` labels.
    fn list(&self) -> impl Future<Output = Result<Vec<Seen>, RtError>> + Send;
    fn inspect(&self, id: &str) -> impl Future<Output = Result<RunInfo, RtError>> + Send;
    /// Creates the data volume if needed, then the container (not started).
    fn create(&self, spec: &ContainerSpec) -> impl Future<Output = Result<String, RtError>> + Send;
    fn start(&self, id: &str) -> impl Future<Output = Result<(), RtError>> + Send;
    /// SIGTERM, then SIGKILL after `timeout`.
    fn stop(&self, id: &str, timeout: Duration) -> impl Future<Output = Result<(), RtError>> + Send;
    fn remove(&self, id: &str) -> impl Future<Output = Result<(), RtError>> + Send;
    /// `Err` with the engine's own words (`No such image: agent-runner:1.5.0`) when the image
    /// is not present: the node never pulls.
    fn image_present(&self, image: &str) -> impl Future<Output = Result<(), RtError>> + Send;
}
