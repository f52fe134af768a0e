//! What the mirrors should show, computed from the store's registry in one short read: one
//! `FleetNode` per node, one `FleetPlacement` per placement item. Each object carries hashes
//! of its spec and of its status without `lastSeenAt`, so the mirror can tell a real change
//! from the once-a-minute refresh of the last-seen time, and which optional status fields it
//! has, so the mirror can tell a field another manager added (docs/behaviour.md#kubernetes-mirror).

use super::crd::{
    FleetNodeSpec, FleetNodeStatus, FleetPlacementSpec, FleetPlacementStatus, MirrorBusy, MirrorCapacity,
};
use super::kind::Kind;
use super::names;
use crate::reconcile::rules::views::Placements;
use crate::store::State;
use fleet_api::{NodeView, PlacementStatus, PlacementView};
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde_json::Value;
use std::hash::{Hash, Hasher};
use std::time::Duration;

/// One mirror object as it should be.
#[derive(Debug, Clone, PartialEq)]
pub struct Want {
    pub name: String,
    pub spec: Value,
    pub status: Value,
    pub spec_hash: u64,
    /// Hash of the status with `lastSeenAt` left out.
    pub status_hash: u64,
    pub last_seen: Option<String>,
    /// Which optional status fields it has (bits of [`Kind::optional_status_fields`]).
    pub optional: u16,
}

#[derive(Debug, Default, Clone)]
pub struct Wanted {
    pub nodes: Vec<Want>,
    pub placements: Vec<Want>,
}

pub fn hash_json(v: &Value) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    v.to_string().hash(&mut h);
    h.finish()
}

/// The hashes and last-seen time of a status value; the same function runs on what the
/// controller wants and on what a watch event shows, so the two compare.
pub fn status_key(status: &Value) -> (u64, Option<String>) {
    let mut s = status.clone();
    let last_seen = s.as_object_mut().and_then(|o| o.remove("lastSeenAt")).and_then(|v| v.as_str().map(str::to_string));
    (hash_json(&s), last_seen)
}

fn want<S: Serialize, T: Serialize>(kind: Kind, name: String, spec: &S, status: &T) -> Want {
    let spec = serde_json::to_value(spec).expect("mirror specs serialise");
    let status = serde_json::to_value(status).expect("mirror statuses serialise");
    let (status_hash, last_seen) = status_key(&status);
    let optional = kind.optional_mask(Some(&status));
    Want { name, spec_hash: hash_json(&spec), spec, status, status_hash, last_seen, optional }
}

/// What the mirror needs from the registry, copied under its read lock; the JSON and the
/// hashing happen after the lock is released.
pub struct Snapshot {
    pub nodes: Vec<NodeView>,
    pub views: Placements,
    /// The state of each rollout not complete, by agent.
    pub rollouts: FxHashMap<String, &'static str>,
    pub busy: BusyReplicas,
}

/// Busy replicas by (agent, node id): each replica and until when (ms). Only nodes with a
/// busy replica are in the registry's busy map, so a fleet with none copies nothing.
pub type BusyReplicas = FxHashMap<(String, String), Vec<(u32, i64)>>;

/// The busy replicas of a placement item, by replica.
fn busy_of(v: &PlacementView, busy: &BusyReplicas) -> Vec<MirrorBusy> {
    let Some(node) = &v.node_id else { return Vec::new() };
    let Some(list) = busy.get(&(v.agent_key.clone(), node.clone())) else { return Vec::new() };
    let mut out: Vec<MirrorBusy> =
        list.iter().map(|&(replica, until)| MirrorBusy { replica, until: busy_minute(until) }).collect();
    out.sort_by_key(|b| b.replica);
    out
}

/// `until_ms` as the mirror shows it: rounded up to the whole minute.
fn busy_minute(until_ms: i64) -> String {
    crate::clock::rfc3339_ms((until_ms + 59_999).div_euclid(60_000) * 60_000)
}

pub fn snapshot(st: &State, now_ms: i64, offline_after: Duration) -> Snapshot {
    Snapshot {
        nodes: st.nodes().map(|n| st.node_view(n, now_ms, offline_after)).collect(),
        views: st.placements().clone(),
        rollouts: st
            .rollouts()
            .map(|r| (r.agent.to_string(), r.view_state().as_str()))
            .filter(|r| r.1 != "complete")
            .collect(),
        busy: {
            let mut busy = BusyReplicas::default();
            for (node, agent, replica, until) in st.busy_leases(now_ms) {
                busy.entry((agent.to_string(), node.to_string())).or_default().push((replica, until));
            }
            busy
        },
    }
}

pub fn wanted(snap: Snapshot) -> Wanted {
    let Snapshot { nodes, views, rollouts, busy } = snap;
    wanted_from(&nodes, || views.iter(), &rollouts, &busy)
}

/// The mirrors of these nodes and placement items; `views` lists the items (it is walked
/// twice, and the items are built as it reaches them).
pub fn wanted_from<I: Iterator<Item = PlacementView>>(
    node_views: &[NodeView],
    views: impl Fn() -> I,
    rollouts: &FxHashMap<String, &'static str>,
    busy: &BusyReplicas,
) -> Wanted {
    let names: FxHashMap<&str, &str> = node_views.iter().map(|n| (n.id.as_str(), n.name.as_str())).collect();
    let mut placed: FxHashMap<String, u32> = FxHashMap::default();
    for v in views() {
        if let (PlacementStatus::Placed, Some(n)) = (v.status, v.node_id) {
            *placed.entry(n).or_default() += v.replicas;
        }
    }
    let mut nodes: Vec<Want> = node_views
        .iter()
        .map(|view| {
            let used = placed.get(view.id.as_str()).copied().unwrap_or(0);
            let status = FleetNodeStatus {
                slots: format!("{used}/{}", view.capacity.slots),
                name: view.name.clone(),
                labels: view.labels.clone(),
                executor_kinds: view.executor_kinds.clone(),
                capacity: MirrorCapacity {
                    slots: view.capacity.slots,
                    cpus: view.capacity.cpus,
                    memory_mb: view.capacity.memory_mb,
                },
                health: view.health.as_str().to_string(),
                status: view.status.as_str().to_string(),
                last_seen_at: view.last_seen_at.clone(),
                version: view.version.clone(),
                placed_replicas: used,
                scheduling: view.scheduling(),
                drain_blocked: view.drain.as_ref().map(|d| d.blocked.len() as u32),
            };
            want(Kind::Node, names::node_object(&view.name), &FleetNodeSpec { node_id: view.id.clone() }, &status)
        })
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut placements: Vec<Want> = views()
        .map(|v| {
            let node_name = v.node_id.as_deref().and_then(|id| names.get(id)).map(|n| n.to_string());
            let status_word = v.status.as_str().to_string();
            // A placement on a node is named after the node; pending and stopped items after
            // their status (a node that vanished in between also counts as pending here).
            let where_ = node_name.clone().unwrap_or_else(|| status_word.clone());
            let busy = busy_of(&v, busy);
            let status = FleetPlacementStatus {
                agent_key: v.agent_key.clone(),
                revision: v.revision,
                node: node_name,
                node_id: v.node_id.clone(),
                replicas: v.replicas,
                status: status_word,
                reason: v.reason.clone(),
                rollout: rollouts.get(&v.agent_key).map(|s| s.to_string()),
                busy_replicas: busy.len() as u32,
                busy,
            };
            want(
                Kind::Placement,
                names::placement_object(&v.agent_key, &where_),
                &FleetPlacementSpec { agent_key: v.agent_key.clone() },
                &status,
            )
        })
        .collect();
    placements.sort_by(|a, b| a.name.cmp(&b.name));
    // Two items share a name only in corner cases (a node literally named `pending`); the
    // mirror is a summary, so the first is kept.
    placements.dedup_by(|b, a| a.name == b.name);
    Wanted { nodes, placements }
}
