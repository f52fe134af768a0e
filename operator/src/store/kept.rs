//! What the store keeps of the reconciler's results: the placement outcome, the status bodies
//! sent to the CP and the placement items the API lists. They are defined here, where the
//! store owns them, so the store depends on nothing in `reconcile`; the reconciler computes
//! them (`reconcile::placement`, `status`, `views` re-export them under their old names).

use crate::model::Id;
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
    /// Replicas left on a draining node because no other node fits them (SPEC §10.1).
    pub blocked: BTreeSet<(Arc<str>, u32)>,
    /// Agents with unplaced replicas: how many, and the first filter that left no node.
    pub waiting: BTreeMap<Arc<str>, (u32, &'static str)>,
    /// What each node has left after this placement, in the order of the bindings' node
    /// table (empty before the first placement): the explanation's capacity filter (SPEC
    /// §10.2) reads it instead of summing every binding.
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

/// Placement items by agent key; iterating yields them in the API's order
/// (agent key, node id, status).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ViewMap(BTreeMap<Id, (u64, Arc<[Item]>)>);

impl ViewMap {
    /// Groups items (in any order) by agent.
    pub fn from_views(views: Vec<PlacementView>) -> ViewMap {
        let mut map: BTreeMap<Id, AgentItems> = BTreeMap::new();
        for v in views {
            let e = map.entry(v.agent_key.as_str().into()).or_default();
            e.revision = v.revision;
            e.items.push(Item {
                node_id: v.node_id.map(Id::from),
                replicas: v.replicas,
                status: v.status,
                reason: v.reason.map(String::into_boxed_str),
            });
        }
        let mut out = ViewMap::default();
        for (k, mut v) in map {
            v.sort();
            out.set(k, v);
        }
        out
    }

    /// Sets one agent's items (none removes the agent).
    pub fn set(&mut self, agent: Id, items: AgentItems) {
        if items.items.is_empty() {
            self.0.remove(&agent);
        } else {
            self.0.insert(agent, (items.revision, items.items.into()));
        }
    }

    /// Each agent's items from `agent` on, in key order: (key, revision, items).
    pub fn range_from<'a>(&'a self, agent: &str) -> impl Iterator<Item = (&'a Id, u64, &'a [Item])> + 'a {
        let from: Id = agent.into();
        self.0.range(from..).map(|(k, (rev, v))| (k, *rev, &v[..]))
    }

    /// One agent's items and revision.
    pub fn get(&self, agent: &str) -> Option<(u64, &[Item])> {
        self.0.get(agent).map(|(rev, v)| (*rev, &v[..]))
    }

    /// One agent's items.
    pub fn items(&self, agent: &str) -> &[Item] {
        self.get(agent).map(|(_, v)| v).unwrap_or_default()
    }

    /// Every item as kept, with its agent's key and revision.
    pub fn entries(&self) -> impl Iterator<Item = (&Id, u64, &Item)> + '_ {
        self.0.iter().flat_map(|(k, (rev, v))| v.iter().map(move |i| (k, *rev, i)))
    }

    /// Every item as the API lists it (each built as it is reached).
    pub fn iter(&self) -> impl Iterator<Item = PlacementView> + '_ {
        self.0.iter().flat_map(|(k, (rev, v))| v.iter().map(move |i| i.view(k, *rev)))
    }

    pub fn len(&self) -> usize {
        self.0.values().map(|v| v.1.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn to_vec(&self) -> Vec<PlacementView> {
        self.iter().collect()
    }
}

/// What is kept of a status the CP accepted: its phase (for the phase-change event) and a
/// keyed hash of the whole body, to tell whether a new body differs. The body itself is not
/// kept (20,000 agents' bodies were ~14 MB); a restart reads the stored ones back as hashes.
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

/// SipHash with a key chosen at start: a peer cannot craft two values of one hash.
pub fn keyed_hash<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(Default::default).hash_one(value)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Items are kept compact and listed as the API's items, in its order.
    #[test]
    fn items_are_listed_as_the_api_has_them_in_its_order() {
        let view = |agent: &str, node: Option<&str>, status, reason: Option<&str>| PlacementView {
            agent_key: agent.into(),
            revision: 7,
            node_id: node.map(str::to_string),
            replicas: 2,
            status,
            reason: reason.map(str::to_string),
        };
        let given = vec![
            view("b", Some("n1"), PlacementStatus::Placed, None),
            view("a", None, PlacementStatus::Pending, Some("no_capacity")),
            view("a", Some("n2"), PlacementStatus::Placed, None),
        ];
        let map = ViewMap::from_views(given.clone());
        let listed = map.to_vec();
        assert_eq!(
            listed,
            vec![given[1].clone(), given[2].clone(), given[0].clone()],
            "agent key, then node id (none first)"
        );
        assert_eq!(map.len(), 3);
        let (revision, items) = map.get("a").unwrap();
        assert_eq!((revision, items.len()), (7, 2));
    }
}
