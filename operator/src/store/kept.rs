//! What the store keeps of the reconciler's results: the placement outcome, the status bodies
//! sent to the CP and the placement items the API lists. They are defined here, where the
//! store owns them, so the store depends on nothing in `reconcile`; the reconciler computes
//! them (`reconcile::placement`, `status`, `views` re-export them under their old names).

use crate::model::Id;
use fleet_api::{PlacementView, ReplicaState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One replica: (agent key, replica index).
pub type ReplicaKey = (Arc<str>, u32);

/// (agent key, replica index) → node id.
pub type Bindings = BTreeMap<ReplicaKey, Arc<str>>;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Every bound replica, including those stuck on an offline node.
    pub bindings: Bindings,
    /// Replicas bound to an offline node because no other node fits (`node_unavailable`).
    pub stuck: BTreeSet<(Arc<str>, u32)>,
    /// Replicas left on a draining node because no other node fits them (SPEC §10.1).
    pub blocked: BTreeSet<(Arc<str>, u32)>,
    /// Agents with unplaced replicas: how many, and the first filter that left no node.
    pub waiting: BTreeMap<Arc<str>, (u32, &'static str)>,
    /// What each node has left after this placement: the explanation's capacity filter
    /// (SPEC §10.2) reads it instead of summing every binding.
    pub free: rustc_hash::FxHashMap<Arc<str>, Free>,
}

/// A node's room left: slots, and cpus (thousandths) and memory where the node declares them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Free {
    pub slots: u32,
    pub cpus_milli: Option<u64>,
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Stopped,
    WaitingForNode,
    Pending,
    CrashLooping,
    NodeUnavailable,
    Running,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub replica: u32,
    pub node: Option<String>,
    pub state: ReplicaState,
    pub restarts: u32,
    pub last_exit_code: Option<i64>,
    pub message: Option<String>,
}

/// Body of `PUT {CP}/api/v1/agents/{key}/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusBody {
    pub phase: Phase,
    pub reason: Option<Reason>,
    pub node: Option<String>,
    pub observed_revision: Option<u64>,
    pub ready_replicas: u32,
    pub desired_replicas: u32,
    pub replicas: Vec<ReplicaStatus>,
}

/// Placement items by agent key; iterating yields them in the API's order
/// (agent key, node id, status).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ViewMap(BTreeMap<Id, Arc<[PlacementView]>>);

impl ViewMap {
    /// Groups items (in any order) by agent.
    pub fn from_views(mut views: Vec<PlacementView>) -> ViewMap {
        views.sort_by(order);
        let mut map: BTreeMap<Id, Vec<PlacementView>> = BTreeMap::new();
        for v in views {
            map.entry(v.agent_key.as_str().into()).or_default().push(v);
        }
        ViewMap(map.into_iter().map(|(k, v)| (k, v.into())).collect())
    }

    /// Sets one agent's items (none removes the agent).
    pub fn set(&mut self, agent: Id, views: Vec<PlacementView>) {
        if views.is_empty() {
            self.0.remove(&agent);
        } else {
            self.0.insert(agent, views.into());
        }
    }

    /// Each agent's items from `agent` on, in key order.
    pub fn range_from<'a>(&'a self, agent: &str) -> impl Iterator<Item = (&'a Id, &'a [PlacementView])> + 'a {
        let from: Id = agent.into();
        self.0.range(from..).map(|(k, v)| (k, &v[..]))
    }

    /// One agent's items.
    pub fn get(&self, agent: &str) -> &[PlacementView] {
        self.0.get(agent).map(|v| &v[..]).unwrap_or_default()
    }

    pub fn iter(&self) -> impl Iterator<Item = &PlacementView> {
        self.0.values().flat_map(|v| v.iter())
    }

    pub fn len(&self) -> usize {
        self.0.values().map(|v| v.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn to_vec(&self) -> Vec<PlacementView> {
        self.iter().cloned().collect()
    }
}

/// The API's order of placement items: agent key, node id, status.
pub fn order(x: &PlacementView, y: &PlacementView) -> std::cmp::Ordering {
    (&x.agent_key, &x.node_id, x.status).cmp(&(&y.agent_key, &y.node_id, y.status))
}
