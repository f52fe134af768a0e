//! The two custom resources the mirror writes (docs/behaviour.md#kubernetes-mirror): `FleetNode` and `FleetPlacement`,
//! group `fleet.taimen.dev`, version `v1alpha1`, namespaced, with a status subresource.
//! The spec only names what is mirrored; everything shown lives in `status`, which only the
//! controller writes. `crds/` is generated from these types (`fleet-controller crds`).

// kube-derive takes one `printcolumn(...)` per column; their repeated `type_ = ...` are not
// duplicates.
#![allow(clippy::duplicated_attributes)]

use kube::core::CustomResourceExt;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "fleet.taimen.dev";
pub const VERSION: &str = "v1alpha1";
/// The field manager of every write: `kubectl get -o yaml --show-managed-fields` names it.
pub const FIELD_MANAGER: &str = "fleet-controller";
/// Label on every mirror: Fleet made it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fleet-controller");
/// Label on every mirror: the fleet (the controller and its replicas, by the id kept in their
/// store) that owns it. A controller watches, writes and deletes only objects with its own.
pub const FLEET_LABEL: &str = "fleet.taimen.dev/fleet";

/// Which store node a `FleetNode` mirrors.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "fleet.taimen.dev",
    version = "v1alpha1",
    kind = "FleetNode",
    namespaced,
    status = "FleetNodeStatus",
    shortname = "fnode",
    category = "fleet",
    annotation("helm.sh/resource-policy", "keep"),
    doc = "A Docker host joined to Fleet, mirrored from the controller's store (read-only: edits are put back).",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.status", description = "online or offline"),
    printcolumn(
        name = "Health",
        type_ = "string",
        json_path = ".status.health",
        description = "ok or degraded, as the node reports"
    ),
    printcolumn(
        name = "Scheduling",
        type_ = "string",
        json_path = ".status.scheduling",
        description = "schedulable, cordoned, draining (N left) or drained"
    ),
    printcolumn(
        name = "Slots",
        type_ = "string",
        json_path = ".status.slots",
        description = "replica slots used/total"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version", description = "fleet-node version"),
    printcolumn(
        name = "Last Seen",
        type_ = "date",
        json_path = ".status.lastSeenAt",
        description = "last report (refreshed at most once a minute)"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.name",
        priority = 1,
        description = "the node's own name (the object's name is a hash when the node's is not a DNS name)"
    ),
    printcolumn(
        name = "Kinds",
        type_ = "string",
        json_path = ".status.executorKinds",
        priority = 1,
        description = "executor kinds the node runs"
    ),
    printcolumn(
        name = "Drain Blocked",
        type_ = "integer",
        json_path = ".status.drainBlocked",
        priority = 1,
        description = "replicas a drain left with nowhere else to go"
    ),
    printcolumn(
        name = "Fleet",
        type_ = "string",
        json_path = ".metadata.labels.fleet\\.taimen\\.dev/fleet",
        priority = 1,
        description = "the fleet (controller) that mirrors this node"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct FleetNodeSpec {
    /// The node's id in the controller's store.
    pub node_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetNodeStatus {
    /// The node's name (node.yaml `name`).
    pub name: String,
    pub labels: Vec<String>,
    pub executor_kinds: Vec<String>,
    pub capacity: MirrorCapacity,
    /// `ok` or `degraded`.
    pub health: String,
    /// `online` or `offline`.
    pub status: String,
    /// RFC 3339; refreshed at most once a minute when nothing else changed.
    pub last_seen_at: String,
    pub version: String,
    /// Replicas placed on this node.
    pub placed_replicas: u32,
    /// `used/total` slots, for the printer column.
    pub slots: String,
    /// `schedulable`, `cordoned`, `draining (N left)` or `drained` (docs/behaviour.md#node-lifecycle).
    #[serde(default)]
    pub scheduling: String,
    /// Replicas left on a draining node with nowhere else to go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_blocked: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorCapacity {
    pub slots: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// Which agent a `FleetPlacement` belongs to; one object per item of `GET /api/v1/placements`.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "fleet.taimen.dev",
    version = "v1alpha1",
    kind = "FleetPlacement",
    namespaced,
    status = "FleetPlacementStatus",
    shortname = "fplace",
    category = "fleet",
    annotation("helm.sh/resource-policy", "keep"),
    doc = "Replicas of one agent on one node (or pending / stopped), mirrored from the controller's store (read-only: edits are put back).",
    printcolumn(name = "Agent", type_ = "string", json_path = ".status.agentKey"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.node"),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(
        name = "Busy",
        type_ = "integer",
        json_path = ".status.busyReplicas",
        description = "replicas busy with work that voluntary disruptions wait for (docs/behaviour.md#busy-replicas)"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        json_path = ".status.status",
        description = "placed, pending or stopped"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        description = "why replicas wait (the reason codes of docs/behaviour.md#placement)"
    ),
    printcolumn(
        name = "Rollout",
        type_ = "string",
        json_path = ".status.rollout",
        description = "the agent's rollout when not complete: progressing, paused, halted or reverted"
    ),
    printcolumn(
        name = "Revision",
        type_ = "integer",
        json_path = ".status.revision",
        priority = 1,
        description = "the agent revision the placement was computed for"
    ),
    printcolumn(
        name = "Fleet",
        type_ = "string",
        json_path = ".metadata.labels.fleet\\.taimen\\.dev/fleet",
        priority = 1,
        description = "the fleet (controller) that mirrors this placement"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct FleetPlacementSpec {
    pub agent_key: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetPlacementStatus {
    pub agent_key: String,
    /// The agent revision this placement was computed for.
    pub revision: u64,
    /// The node's name; absent for pending and stopped items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    pub replicas: u32,
    /// `placed`, `pending` or `stopped`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The agent's rollout when one is not complete: `progressing`, `paused`, `halted`,
    /// `reverted` or `waiting_for_window` (docs/behaviour.md#rolling-out-a-change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    /// How many of these replicas are busy (docs/behaviour.md#busy-replicas); always written, 0
    /// when none is, so the field is the controller's (the API server shows the schema's
    /// default on an object an older controller wrote).
    #[serde(default)]
    pub busy_replicas: u32,
    /// Each busy replica and until when, by replica; always written (empty when none is).
    #[serde(default)]
    pub busy: Vec<MirrorBusy>,
}

/// A busy replica of a `FleetPlacement`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorBusy {
    pub replica: u32,
    /// RFC 3339, rounded up to the minute: a replica that renews its lease every few seconds
    /// changes the mirror at most once a minute.
    pub until: String,
}

/// The CRD YAML for both resources, as `fleet-controller crds` prints it and `crds/` holds it.
pub fn crds_yaml() -> String {
    let mut out = String::from("# Generated by `fleet-controller crds` from operator/src/k8s/crd.rs. Do not edit.\n");
    for crd in [FleetNode::crd(), FleetPlacement::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD always serialises"));
    }
    out
}
