//! Wire types of the day-two routes (docs/behaviour.md#day-two-operations): node lifecycle, the placement explanation,
//! events and list pages. Answers only: clients are lenient readers of them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `POST /api/v1/nodes/{id}:drain`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DrainRequest {
    /// Unbind replicas that have nowhere to go instead of leaving them on the node.
    #[serde(default)]
    pub force: Option<bool>,
}

/// A node's drain in progress (or done: `remaining` 0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainView {
    pub started_at: String,
    /// Replicas still bound to the node.
    pub remaining: u32,
    /// Replicas that stay: no other node fits them, or their agent's disruption budget is
    /// spent for now.
    pub blocked: Vec<BlockedReplica>,
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlockedReplica {
    pub agent_key: String,
    pub replica: u32,
    /// `no_other_node`: no other node fits it (it stays until one does, or a forced drain
    /// unbinds it); `budget`: its agent has as many replicas unavailable as its rollout
    /// policy allows, and it moves once another is ready; `busy`: it said it is busy, and
    /// moves when it is idle or its hold (`maxBusySeconds` from the drain's start) ends.
    #[serde(default)]
    pub reason: String,
}

/// One event of `GET /api/v1/events` (docs/behaviour.md#events).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub seq: i64,
    pub at: String,
    pub kind: String,
    pub agent_key: Option<String>,
    pub node_id: Option<String>,
    pub node: Option<String>,
    pub replica: Option<u32>,
    pub message: String,
}

/// One filter of the placement explanation, in the order of docs/behaviour.md#placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilterCount {
    pub filter: String,
    /// Nodes left before this filter.
    pub before: u32,
    /// Nodes this filter removed.
    pub excluded: u32,
    /// `labels` and `secrets`: per required label or secret, the nodes (of those before the
    /// filter) lacking it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<BTreeMap<String, u32>>,
    /// `capacity`: the nodes short of each resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exhausted: Option<Exhausted>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Exhausted {
    pub slots: u32,
    pub cpus: u32,
    pub memory_mb: u32,
}

/// Where one replica is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaPlacement {
    pub replica: u32,
    pub node_id: Option<String>,
    pub node: Option<String>,
    /// The node's report (`running`, `crashloop`, …), `pending` before one.
    pub state: String,
    pub message: Option<String>,
    /// Until when the replica said it is busy (docs/behaviour.md#busy-replicas); absent when idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_until: Option<String>,
}

/// One node's verdict for the agent (`?nodes=true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeVerdict {
    pub node_id: String,
    pub name: String,
    pub fits: bool,
    /// The first filter the node fails, as a docs/behaviour.md#placement code.
    pub reason: Option<String>,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReasonView {
    pub code: String,
    pub message: String,
}

/// `GET /api/v1/agents/{key}/placement` (docs/behaviour.md#why-an-agent-is-where-it-is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementExplanation {
    pub agent_key: String,
    pub revision: u64,
    pub phase: String,
    pub reason: Option<ReasonView>,
    pub desired_replicas: u32,
    pub replicas: Vec<ReplicaPlacement>,
    pub filters: Vec<FilterCount>,
    pub hint: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeVerdict>>,
    /// With `placement.spread`: the label and the agent's bound replicas per value of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<SpreadView>,
    /// `placement.priority` as placement uses it (0: the default, not shown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// What is wrong with the agent's `placement.spread` or `placement.priority` (each then
    /// takes its default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

fn is_zero(p: &i32) -> bool {
    *p == 0
}

/// An agent's replicas over the values of its spread label (`""`: nodes without it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpreadView {
    pub label: String,
    pub counts: BTreeMap<String, u32>,
}

impl crate::NodeView {
    /// `schedulable`, `cordoned`, `draining (N left)` or `drained`: one word or two for
    /// tables and printer columns.
    pub fn scheduling(&self) -> String {
        match &self.drain {
            Some(d) if d.remaining == 0 => "drained".into(),
            Some(d) => format!("draining ({} left)", d.remaining),
            None if !self.schedulable => "cordoned".into(),
            None => "schedulable".into(),
        }
    }
}

/// `GET /api/v1/summary`: the fleet at a glance (the web view's overview).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetSummary {
    pub nodes: NodeCounts,
    pub replicas: ReplicaCounts,
    /// Pending replicas by reason code.
    pub pending_by_reason: BTreeMap<String, u32>,
    /// Agents with replicas waiting, by key: at most 100.
    pub waiting: Vec<WaitingAgent>,
    /// More agents wait than `waiting` lists.
    pub waiting_truncated: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeCounts {
    pub total: u32,
    pub online: u32,
    pub offline: u32,
    pub degraded: u32,
    pub cordoned: u32,
    pub draining: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaCounts {
    pub placed: u64,
    pub pending: u64,
    /// Agents stopped in the CP.
    pub stopped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingAgent {
    pub agent_key: String,
    pub replicas: u32,
    pub reason: String,
}
