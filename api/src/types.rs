//! Wire types, camelCase JSON. Bodies a node sends (join, observed report) are strict:
//! an unknown field is an error naming it, so an upgrade-order problem is said clearly.
//! The desired state a node receives is lenient, since the controller is upgraded first.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `{"error": "<code>", "message": "<human text>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

/// `{items: [...]}` envelope of list routes. With `?limit=`, `nextCursor` is there while more
/// items follow: pass it back as `?cursor=` for the next page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct List<T> {
    pub items: Vec<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// A page of placements: the name of each node the page names by id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<BTreeMap<String, String>>,
}

impl<T> List<T> {
    /// The whole list, unpaged.
    pub fn all(items: Vec<T>) -> List<T> {
        List { items, next_cursor: None, node_names: None }
    }

    /// One page.
    pub fn page(items: Vec<T>, next_cursor: Option<String>) -> List<T> {
        List { items, next_cursor, node_names: None }
    }
}

/// What a node offers: slots always; cpus and memory only where set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capacity {
    pub slots: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// `POST /api/v1/nodes:join` body (docs/behaviour.md#joining).
// Its `Debug` (below) hides the key (docs/behaviour.md#hardening).
#[derive(Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    pub join_key: String,
    pub name: String,
    pub public_key: String,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub executor_kinds: Vec<String>,
    #[serde(default)]
    pub executor_images: BTreeMap<String, Vec<String>>,
    pub capacity: Capacity,
    #[serde(default)]
    pub secrets: Vec<String>,
    /// The secrets offered to each kind that lists its own (`executors.<k>.secrets`); a kind
    /// not here is offered every secret of `secrets` (docs/behaviour.md#secrets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub executor_secrets: BTreeMap<String, Vec<String>>,
    /// node.yaml's `maintenanceWindows` (docs/behaviour.md#maintenance-windows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintenance_windows: Vec<crate::windows::MaintenanceWindow>,
    #[serde(default)]
    pub version: String,
}

// Its `Debug` (below) hides the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinResponse {
    pub node_id: String,
    pub node_token: String,
}

/// `POST /api/v1/join-keys` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinKeyRequest {
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub note: Option<String>,
    /// Label patterns a node joined with this key may claim (docs/behaviour.md#what-a-node-may-claim); absent: any.
    #[serde(default)]
    pub allowed_labels: Option<Vec<String>>,
    /// Executor kinds a node joined with this key may claim; absent: any.
    #[serde(default)]
    pub allowed_kinds: Option<Vec<String>>,
}

// Its `Debug` (below) hides the key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinKeyResponse {
    pub join_key: String,
    pub expires_at: String,
}

/// A join key as `GET /api/v1/join-keys` lists it: never the key itself, which only its
/// creator saw. `id` is the start of the key's hash in hex, enough to revoke it by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinKeyView {
    pub id: String,
    pub note: String,
    pub created_at: String,
    pub expires_at: String,
    /// `unused`, `used` (a node joined with it; it may join that node again within
    /// [`REJOIN_WINDOW_SECONDS`] of its first use) or `expired` (or revoked).
    pub state: String,
    pub used_at: Option<String>,
    pub node_id: Option<String>,
    pub allowed_labels: Option<Vec<String>>,
    pub allowed_kinds: Option<Vec<String>>,
}

/// How long after its first use a join key may join the same node again (a join whose `201`
/// was lost is answered again): minutes, not the key's whole TTL.
pub const REJOIN_WINDOW_SECONDS: i64 = 600;

/// What a derived `Debug` would print of a secret.
const REDACTED: &str = "<redacted>";

impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("join_key", &REDACTED)
            .field("name", &self.name)
            .field("public_key", &self.public_key)
            .field("labels", &self.labels)
            .field("executor_kinds", &self.executor_kinds)
            .field("executor_images", &self.executor_images)
            .field("capacity", &self.capacity)
            .field("secrets", &self.secrets)
            .field("executor_secrets", &self.executor_secrets)
            .field("version", &self.version)
            .finish()
    }
}

impl std::fmt::Debug for JoinResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinResponse").field("node_id", &self.node_id).field("node_token", &REDACTED).finish()
    }
}

impl std::fmt::Debug for JoinKeyResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinKeyResponse").field("join_key", &REDACTED).field("expires_at", &self.expires_at).finish()
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    /// docs/behaviour.md#hardening: no secret in a derived `Debug` (a `?req` in a log line must not leak it).
    #[test]
    fn debug_output_hides_keys_and_tokens() {
        let req = JoinRequest {
            join_key: "fjk_secret".into(),
            name: "n1".into(),
            public_key: "pk".into(),
            labels: vec![],
            executor_kinds: vec![],
            executor_images: BTreeMap::new(),
            capacity: Capacity { slots: 1, cpus: None, memory_mb: None },
            secrets: vec![],
            executor_secrets: BTreeMap::new(),
            version: "1".into(),
            maintenance_windows: Vec::new(),
        };
        let resp = JoinResponse { node_id: "id".into(), node_token: "fnt_secret".into() };
        let key = JoinKeyResponse { join_key: "fjk_other".into(), expires_at: "2030".into() };
        for text in [format!("{req:?}"), format!("{resp:?}"), format!("{key:?}")] {
            assert!(
                !text.contains("fjk_secret") && !text.contains("fnt_secret") && !text.contains("fjk_other"),
                "{text}"
            );
            assert!(text.contains(REDACTED), "{text}");
        }
        assert!(format!("{req:?}").contains("n1"), "the rest is shown");
    }
}

/// Join-key TTL bounds (docs/reference.md#fleet-controller-commands, docs/reference.md#http-api).
pub const JOIN_KEY_TTL_MIN: u64 = 60;
pub const JOIN_KEY_TTL_MAX: u64 = 604_800;
pub const JOIN_KEY_TTL_DEFAULT: u64 = 3600;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesiredState {
    pub generation: u64,
    pub agents: Vec<DesiredAgent>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesiredAgent {
    pub agent_key: String,
    pub revision: u64,
    pub replica_indexes: Vec<u32>,
    pub executor: Executor,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub resources: Resources,
    pub drain_seconds: u64,
    pub identity: DesiredIdentity,
    /// The template's name (docs/behaviour.md#rolling-out-a-change): the node labels the
    /// container with it and reports it back. Absent from an older controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_id: Option<String>,
    /// The restart stamp: a new one recreates every container of the agent with nothing else
    /// changed (`rollout:restart`). `0`, and absent, when never restarted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Executor {
    pub kind: String,
    #[serde(default)]
    pub image: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesiredIdentity {
    pub principal_id: String,
    pub tenant_id: String,
    pub credential: SealedCredential,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SealedCredential {
    pub credential_id: String,
    /// Base64 of a libsodium sealed box to the node's X25519 key.
    pub ciphertext: String,
    pub expires_at: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Ok,
    Degraded,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Degraded => "degraded",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    Starting,
    Running,
    Draining,
    Crashloop,
    Stopped,
    /// Only in status bodies sent to the CP: no report for the replica yet.
    Pending,
}

/// One replica in an observed report (docs/behaviour.md#desired-state-and-observed-report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaReport {
    pub agent_key: String,
    pub revision: u64,
    pub replica: u32,
    pub state: ReplicaState,
    #[serde(default)]
    pub restarts: u32,
    #[serde(default)]
    pub last_exit_code: Option<i64>,
    #[serde(default)]
    pub message: Option<String>,
    /// The template of the container that runs now (null before one exists); absent from an
    /// older node, which counts as running what the controller last sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_id: Option<String>,
    /// Until when the replica said it is busy (RFC 3339; docs/behaviour.md#busy-replicas), only
    /// while it runs; absent or null when idle. The controller clamps it to the agent's hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_until: Option<String>,
}

/// `PUT /api/v1/nodes/me/observed` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObservedReport {
    pub applied_generation: u64,
    pub health: Health,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub executor_kinds: Vec<String>,
    #[serde(default)]
    pub executor_images: BTreeMap<String, Vec<String>>,
    pub capacity: Capacity,
    #[serde(default)]
    pub secrets: Vec<String>,
    /// As in the join: the secrets offered to each kind that lists its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub executor_secrets: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub replicas: Vec<ReplicaReport>,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub boot_id: Option<String>,
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub observe_seconds: Option<u32>,
    /// node.yaml's `maintenanceWindows`: outside them no voluntary disruption starts on the
    /// node (docs/behaviour.md#maintenance-windows). Left out when the node has none, so an
    /// older controller reads the report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintenance_windows: Vec<crate::windows::MaintenanceWindow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeStatus {
    Online,
    Offline,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Online => "online",
            NodeStatus::Offline => "offline",
        }
    }
}

/// One node in `GET /api/v1/nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub id: String,
    pub name: String,
    pub labels: Vec<String>,
    pub executor_kinds: Vec<String>,
    pub executor_images: BTreeMap<String, Vec<String>>,
    pub capacity: Capacity,
    pub secrets: Vec<String>,
    /// The secrets offered to each kind that lists its own; other kinds are offered `secrets`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub executor_secrets: BTreeMap<String, Vec<String>>,
    /// Label patterns the node may claim (docs/behaviour.md#what-a-node-may-claim); absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_labels: Option<Vec<String>>,
    /// Executor kinds the node may claim; absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_kinds: Option<Vec<String>>,
    /// Labels and kinds the node claims and its allowance refuses: placement never sees them.
    #[serde(default)]
    pub refused_facts: crate::claims::RefusedFacts,
    pub health: Health,
    pub status: NodeStatus,
    pub last_seen_at: String,
    pub version: String,
    /// Slots taken by the replicas placed here.
    #[serde(default)]
    pub slots_used: u32,
    /// False when cordoned or draining (docs/behaviour.md#node-lifecycle).
    #[serde(default = "yes")]
    pub schedulable: bool,
    #[serde(default)]
    pub drain: Option<crate::ops::DrainView>,
    /// node.yaml's `maintenanceWindows` as the node announced them
    /// (docs/behaviour.md#maintenance-windows); absent: none, so always open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintenance_windows: Vec<crate::windows::MaintenanceWindow>,
}

fn yes() -> bool {
    true
}

/// `GET /api/v1/nodes/{id}`: the node with what it last reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDetail {
    #[serde(flatten)]
    pub node: NodeView,
    pub generation: u64,
    pub applied_generation: u64,
    pub replicas: Vec<ReplicaReport>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PlacementStatus {
    Placed,
    Pending,
    Stopped,
}

impl PlacementStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacementStatus::Placed => "placed",
            PlacementStatus::Pending => "pending",
            PlacementStatus::Stopped => "stopped",
        }
    }
}

/// One item of `GET /api/v1/placements`: `replicas` is a count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementView {
    pub agent_key: String,
    pub revision: u64,
    pub node_id: Option<String>,
    pub replicas: u32,
    pub status: PlacementStatus,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Healthz {
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_str_is_the_wire_word() {
        let wire = |v: serde_json::Value| v.as_str().unwrap().to_string();
        for h in [Health::Ok, Health::Degraded] {
            assert_eq!(h.as_str(), wire(serde_json::to_value(h).unwrap()));
        }
        for n in [NodeStatus::Online, NodeStatus::Offline] {
            assert_eq!(n.as_str(), wire(serde_json::to_value(n).unwrap()));
        }
        for p in [PlacementStatus::Placed, PlacementStatus::Pending, PlacementStatus::Stopped] {
            assert_eq!(p.as_str(), wire(serde_json::to_value(p).unwrap()));
        }
    }

    #[test]
    fn observed_rejects_unknown_field_by_name() {
        let body = r#"{"appliedGeneration":1,"health":"ok","capacity":{"slots":1},"gpuCount":2}"#;
        let err = serde_json::from_str::<ObservedReport>(body).unwrap_err().to_string();
        assert!(err.contains("gpuCount"), "{err}");
    }

    #[test]
    fn desired_tolerates_unknown_fields() {
        let body = r#"{"generation":3,"futureField":1,"agents":[{"agentKey":"a","revision":1,
          "replicaIndexes":[0],"executor":{"kind":"k","image":null,"x":1},"secrets":[],
          "resources":{},"drainSeconds":60,"newThing":true,
          "identity":{"principalId":"p","tenantId":"t","credential":{"credentialId":"c",
          "ciphertext":"x","expiresAt":"2026-01-01T00:00:00Z"}}}]}"#;
        let d: DesiredState = serde_json::from_str(body).unwrap();
        assert_eq!(d.generation, 3);
        assert_eq!(d.agents[0].executor.kind, "k");
    }

    #[test]
    fn camel_case_on_the_wire() {
        let v = serde_json::to_value(PlacementView {
            agent_key: "a".into(),
            revision: 1,
            node_id: None,
            replicas: 2,
            status: PlacementStatus::Pending,
            reason: Some("no_node".into()),
        })
        .unwrap();
        assert_eq!(v["agentKey"], "a");
        assert_eq!(v["nodeId"], serde_json::Value::Null);
        assert_eq!(v["status"], "pending");
    }
}
