//! What the store keeps of the reconciler's results: the placement outcome, the status bodies
//! sent to the CP and the placement items the API lists. They are defined here, where the
//! store owns them, so the store depends on nothing in `reconcile`; the reconciler computes
//! them (`reconcile::rules::{placement, status, views}` re-export them).

use crate::model::{Agent, AgentState, Id, IdentityKind, Placement};
use fleet_api::{PlacementStatus, PlacementView, ReplicaState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One replica: (agent key, replica index).
pub type ReplicaKey = (Arc<str>, u32);

pub use super::bindings::Bindings;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Every bound replica, including those stuck on an offline node.
    pub bindings: Bindings,
    /// Replicas bound to an offline node because no other node fits (`node_unavailable`).
    pub stuck: BTreeSet<(Arc<str>, u32)>,
    /// Replicas left on a draining node because no other node fits them (docs/behaviour.md#node-lifecycle).
    pub blocked: BTreeSet<(Arc<str>, u32)>,
    /// Replicas left on a draining node because their agent's disruption budget is spent
    /// (docs/behaviour.md#rolling-out-a-change): they move as others become ready.
    pub held: BTreeSet<(Arc<str>, u32)>,
    /// Those of `held` that wait because they are busy (docs/behaviour.md#busy-replicas).
    pub held_busy: BTreeSet<(Arc<str>, u32)>,
    /// When the first of `held_busy` ends its lease or hold (ms): placement runs again then.
    pub busy_ends: Option<i64>,
    /// Agents with unplaced replicas: how many, and the first filter that left no node.
    pub waiting: BTreeMap<Arc<str>, (u32, &'static str)>,
    /// Replicas a higher-priority replica took the room of, still waiting for room
    /// (docs/behaviour.md#spread-and-priority): their agents wait with reason `preempted`.
    pub preempted: BTreeSet<(Arc<str>, u32)>,
    /// The preemptions of this run, for the events; a run that preempted is followed by
    /// another, so the room it left over and the replicas it unbound are looked at again.
    pub preemptions: Vec<Preemption>,
    /// What each node has left after this placement, in the order of the bindings' node
    /// table (empty before the first placement): the explanation's capacity filter (docs/behaviour.md#why-an-agent-is-where-it-is) reads it instead of summing every binding.
    pub free: Vec<Free>,
}

impl Outcome {
    /// What `node` has left after this placement.
    pub fn free_of(&self, node: &str) -> Option<&Free> {
        if self.free.len() != self.bindings.nodes().len() {
            return None;
        }
        self.bindings.position(node).map(|at| &self.free[at])
    }
}

/// One replica unbound to make room for one of a higher priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    /// The replica that went, and its agent's priority.
    pub victim: (Arc<str>, u32),
    pub victim_priority: i32,
    /// The node whose room was taken.
    pub node: Id,
    /// The replica that took it, and its agent's priority.
    pub by: (Arc<str>, u32),
    pub by_priority: i32,
}

/// A node's room left: slots, and cpus (thousandths) and memory where the node declares them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Free {
    pub slots: u32,
    pub cpus_milli: Option<u64>,
    pub memory_mb: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Stopped,
    WaitingForNode,
    Pending,
    CrashLooping,
    NodeUnavailable,
    Running,
}

impl Phase {
    /// The phase as the API, the CP and the docs spell it (`waiting_for_node`).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stopped => "stopped",
            Phase::WaitingForNode => "waiting_for_node",
            Phase::Pending => "pending",
            Phase::CrashLooping => "crash_looping",
            Phase::NodeUnavailable => "node_unavailable",
            Phase::Running => "running",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reason {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// One placement item as kept: the agent's key and revision are its map entry's, the node id
/// is the binding's own string, and a reason is held only by a pending item (~40 bytes an
/// item instead of a [`PlacementView`]'s ~150 with its three strings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub node_id: Option<Id>,
    pub replicas: u32,
    pub status: PlacementStatus,
    pub reason: Option<Box<str>>,
}

impl Item {
    /// The item as the API lists it.
    pub fn view(&self, agent: &str, revision: u64) -> PlacementView {
        PlacementView {
            agent_key: agent.to_string(),
            revision,
            node_id: self.node_id.as_deref().map(str::to_string),
            replicas: self.replicas,
            status: self.status,
            reason: self.reason.as_deref().map(str::to_string),
        }
    }
}

/// One agent's items, in the API's order (node id, status), with its revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentItems {
    pub revision: u64,
    pub items: Vec<Item>,
}

impl AgentItems {
    pub fn sort(&mut self) {
        self.items.sort_by(|x, y| (&x.node_id, x.status).cmp(&(&y.node_id, y.status)));
    }
}

/// The placement items of `GET /api/v1/placements` (docs/reference.md#http-api), built on demand from the
/// agents and the outcome a pass placed them by: one item per (agent, node) with a count,
/// one `pending` item for the unplaced replicas, `pending / node_unavailable` for replicas
/// stuck on an offline node, and one `stopped` item per stopped agent.
///
/// Kept, the items of 100,000 replicas would be ~5 MB, and two trees of them (the pass's and
/// the published one) ~1.2 MB each, memory nothing reads between two lists. An agent's items
/// are a binary search into the bindings away, so a list builds each as it reaches it. Of
/// the agents it keeps only what the items say ([`Listed`], 32 bytes an agent): holding the
/// agent list itself would keep a replaced list (~9 MB at 20,000 agents) alive until the pass
/// that read the new one publishes.
#[derive(Debug, Clone, Default)]
pub struct Placements {
    /// In key order (the CP lists agents so, and the list is sorted when one does not).
    agents: Arc<[Listed]>,
    outcome: Arc<Outcome>,
}

/// What an agent's placement items say of the agent itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: Id,
    pub revision: u64,
    /// Whether the agent has placement items at all (identity-only and service agents do not).
    pub has_items: bool,
    pub stopped: bool,
}

impl Listed {
    pub fn of(a: &Agent) -> Listed {
        Listed {
            key: a.key.clone(),
            revision: a.revision,
            has_items: a.identity.kind == IdentityKind::Agent && !matches!(a.placement, Placement::None(_)),
            stopped: a.state == AgentState::Stopped,
        }
    }

    /// Every agent of a list, in its order.
    pub fn all(agents: &[Agent]) -> Arc<[Listed]> {
        agents.iter().map(Listed::of).collect()
    }
}

impl Placements {
    pub fn new(agents: Arc<[Listed]>, outcome: Arc<Outcome>) -> Placements {
        debug_assert!(agents.is_sorted_by(|a, b| a.key <= b.key), "agents in key order");
        Placements { agents, outcome }
    }

    /// The items of an agent list (in key order) by an outcome.
    pub fn of_list(agents: &[Agent], outcome: Arc<Outcome>) -> Placements {
        Placements::new(Listed::all(agents), outcome)
    }

    /// Whether these are the items of exactly this list and outcome.
    pub fn of(&self, agents: &[Agent], outcome: &Arc<Outcome>) -> bool {
        Arc::ptr_eq(&self.outcome, outcome)
            && self.agents.len() == agents.len()
            && self.agents.iter().zip(agents).all(|(l, a)| *l == Listed::of(a))
    }

    /// Each listed agent's items from `agent` on, in key order: (key, items).
    pub fn range_from<'a>(&'a self, agent: &str) -> impl Iterator<Item = (&'a Id, AgentItems)> + 'a {
        let start = self.agents.partition_point(|a| &*a.key < agent);
        self.agents[start..]
            .iter()
            .map(|a| (&a.key, listed_views(a, &self.outcome)))
            .filter(|(_, v)| !v.items.is_empty())
    }

    /// Every item as the API lists it, in its order (agent key, node id, status).
    pub fn iter(&self) -> impl Iterator<Item = PlacementView> + '_ {
        self.range_from("").flat_map(|(k, v)| v.items.into_iter().map(move |i| i.view(k, v.revision)))
    }

    pub fn to_vec(&self) -> Vec<PlacementView> {
        self.iter().collect()
    }
}

/// One agent's items, from its range of the bindings.
pub fn agent_views(a: &Agent, outcome: &Outcome) -> AgentItems {
    listed_views(&Listed::of(a), outcome)
}

/// One agent's items, from what they say of it and its range of the bindings.
pub fn listed_views(a: &Listed, outcome: &Outcome) -> AgentItems {
    let mut out = AgentItems { revision: a.revision, items: Vec::new() };
    if !a.has_items {
        return out;
    }
    let item = |node_id: Option<Id>, replicas, status, reason: Option<&str>| Item {
        node_id,
        replicas,
        status,
        reason: reason.map(Box::from),
    };
    if a.stopped {
        out.items.push(item(None, 0, PlacementStatus::Stopped, None));
        return out;
    }
    let key: &Id = &a.key;
    let mut per_node: BTreeMap<(&Id, bool), u32> = BTreeMap::new();
    for (r, node) in outcome.bindings.of_agent(key) {
        let stuck = !outcome.stuck.is_empty() && outcome.stuck.contains(&(key.clone(), r));
        *per_node.entry((node, stuck)).or_default() += 1;
    }
    for ((node, stuck), count) in per_node {
        let (status, reason) = if stuck {
            (PlacementStatus::Pending, Some(fleet_api::codes::NODE_UNAVAILABLE))
        } else {
            (PlacementStatus::Placed, None)
        };
        out.items.push(item(Some(node.clone()), count, status, reason));
    }
    if let Some((count, reason)) = outcome.waiting.get(key) {
        out.items.push(item(None, *count, PlacementStatus::Pending, Some(reason)));
    }
    out.sort();
    out
}

/// What is kept of a status the CP accepted: its phase (for the phase-change event) and a
/// keyed hash of the whole body, to tell whether a new body differs. The body itself is not
/// kept (20,000 agents' bodies would be ~14 MB); a restart reads the stored ones back as
/// hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub phase: Phase,
    hash: u64,
}

impl Sent {
    pub fn of(body: &StatusBody) -> Sent {
        Sent { phase: body.phase, hash: keyed_hash(body) }
    }

    /// Whether `body` is the one the CP has.
    pub fn is(&self, body: &StatusBody) -> bool {
        self.phase == body.phase && self.hash == keyed_hash(body)
    }
}

/// The `kv` rows that mark an agent whose status the CP may not have yet
/// ([`crate::reconcile::pass::unsettled`]).
pub const UNSETTLED_PREFIX: &str = "unsettled-status/";

/// The unsettled-status marks a pass sets and clears.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub set: Vec<crate::model::Id>,
    pub clear: Vec<crate::model::Id>,
}

pub fn unsettled_key(agent: &str) -> String {
    format!("{UNSETTLED_PREFIX}{agent}")
}

/// SipHash with a key chosen at start: a peer cannot craft two values of one hash.
pub fn keyed_hash<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(Default::default).hash_one(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Logs, events and the API spell a phase alike: as serde writes it.
    #[test]
    fn a_phase_is_spelled_as_the_api_spells_it() {
        for p in [
            Phase::Stopped,
            Phase::WaitingForNode,
            Phase::Pending,
            Phase::CrashLooping,
            Phase::NodeUnavailable,
            Phase::Running,
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str(), "{p:?}");
            assert_eq!(p.to_string(), p.as_str());
        }
    }

    fn body(ready: u32, message: Option<&str>) -> StatusBody {
        StatusBody {
            phase: Phase::Running,
            reason: None,
            node: Some("n1".into()),
            observed_revision: Some(3),
            ready_replicas: ready,
            desired_replicas: 2,
            replicas: vec![ReplicaStatus {
                replica: 0,
                node: Some("n1".into()),
                state: ReplicaState::Running,
                restarts: 0,
                last_exit_code: None,
                message: message.map(str::to_string),
            }],
        }
    }

    /// A sent status is kept as its phase and hash: the same body matches, any change in it
    /// (a count, a replica's message) does not.
    #[test]
    fn a_sent_status_tells_the_same_body_from_a_changed_one() {
        let sent = Sent::of(&body(1, None));
        assert!(sent.is(&body(1, None)));
        assert!(!sent.is(&body(2, None)));
        assert!(!sent.is(&body(1, Some("restarting"))));
        let mut stopped = body(1, None);
        stopped.phase = Phase::Stopped;
        assert!(!sent.is(&stopped));
        assert_eq!(sent.phase, Phase::Running);
    }

    fn agent(key: &str, state: &str, kind: &str) -> Agent {
        serde_json::from_value(serde_json::json!({"key": key, "revision": 7, "state": state,
            "identity": {"kind": kind}, "executor": {"kind": "k", "image": null}, "placement": {"replicas": 3}}))
        .unwrap()
    }

    /// Items are built from the agents and the outcome as the API lists them, in its order
    /// (agent key, node id with none first, status); an agent without items is left out, and a
    /// list can start at any agent.
    #[test]
    fn items_are_listed_as_the_api_has_them_in_its_order() {
        let agents = vec![
            agent("a", "running", "agent"),
            agent("b", "running", "agent"),
            agent("c", "running", "service"),
            agent("d", "stopped", "agent"),
        ];
        let bound = [("a", 0, "n2"), ("a", 1, "n1"), ("a", 2, "n2"), ("b", 0, "n1"), ("b", 1, "n3")];
        let mut outcome = Outcome {
            bindings: bound.iter().map(|(a, r, n)| (Id::from(*a), *r, Id::from(*n))).collect(),
            ..Outcome::default()
        };
        outcome.stuck.insert(("b".into(), 1));
        outcome.waiting.insert("b".into(), (1, "no_capacity"));
        let placements = Placements::of_list(&agents, Arc::new(outcome));
        let view = |agent: &str, node: Option<&str>, replicas, status, reason: Option<&str>| PlacementView {
            agent_key: agent.into(),
            revision: 7,
            node_id: node.map(str::to_string),
            replicas,
            status,
            reason: reason.map(str::to_string),
        };
        let (placed, pending, stopped) = (PlacementStatus::Placed, PlacementStatus::Pending, PlacementStatus::Stopped);
        let expected = vec![
            view("a", Some("n1"), 1, placed, None),
            view("a", Some("n2"), 2, placed, None),
            view("b", None, 1, pending, Some("no_capacity")),
            view("b", Some("n1"), 1, placed, None),
            view("b", Some("n3"), 1, pending, Some("node_unavailable")),
            view("d", None, 0, stopped, None),
        ];
        assert_eq!(placements.to_vec(), expected);
        let from_b: Vec<&str> = placements.range_from("b").map(|(k, _)| &**k).collect();
        assert_eq!(from_b, ["b", "d"], "from an agent on, the service agent left out");
        let from_bb: Vec<&str> = placements.range_from("bb").map(|(k, _)| &**k).collect();
        assert_eq!(from_bb, ["d"], "from between two keys");
    }
}
