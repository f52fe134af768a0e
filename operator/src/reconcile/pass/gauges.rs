//! The nodes and placements gauges, kept by delta: a pass moves only the nodes and agents it
//! touched from one label set to another, then sets the families from the counts.

use crate::metrics::{Metrics, NodeLabels, PlacementLabels};
use crate::model::Id;
use crate::store::kept::Item;
use rustc_hash::FxHashMap as HashMap;

/// (status, health) of a node as the gauge counts it.
type NodeKey = (&'static str, &'static str);

#[derive(Default)]
pub struct Gauges {
    nodes: HashMap<NodeKey, i64>,
    /// What each node counts as now.
    counted: HashMap<Id, NodeKey>,
    /// (status, reason) → (replicas, items).
    placements: HashMap<(&'static str, String), (i64, i64)>,
}

impl Gauges {
    pub fn clear_nodes(&mut self) {
        self.nodes.clear();
        self.counted.clear();
    }

    pub fn clear_placements(&mut self) {
        self.placements.clear();
    }

    /// Moves a node to its current (status, health).
    pub fn count_node(&mut self, id: Id, online: bool, health: fleet_api::Health) {
        let key = (if online { "online" } else { "offline" }, health.as_str());
        if let Some(old) = self.counted.insert(id, key) {
            *self.nodes.entry(old).or_default() -= 1;
        }
        *self.nodes.entry(key).or_default() += 1;
    }

    /// Adds (`sign` 1) or takes away (-1) some items' share of the placements gauge.
    pub fn count_views(&mut self, items: &[Item], sign: i64) {
        for v in items {
            let key = (v.status.as_str(), v.reason.as_deref().unwrap_or_default().to_string());
            let e = self.placements.entry(key.clone()).or_default();
            e.0 += sign * v.replicas as i64;
            e.1 += sign;
            if e.1 == 0 {
                self.placements.remove(&key);
            }
        }
    }

    /// Replicas per (status, reason), as the placements gauge shows them.
    pub fn placement_replicas(&self) -> impl Iterator<Item = (&'static str, &str, i64)> + '_ {
        self.placements.iter().map(|((s, r), (replicas, _))| (*s, r.as_str(), *replicas))
    }

    pub fn publish_nodes(&mut self, metrics: &Metrics) {
        self.nodes.retain(|_, v| *v != 0);
        metrics.nodes.clear();
        for ((status, health), v) in &self.nodes {
            metrics.nodes.get_or_create(&NodeLabels { status, health }).set(*v);
        }
    }

    pub fn publish_placements(&self, metrics: &Metrics) {
        metrics.placements.clear();
        for (status, reason, replicas) in self.placement_replicas() {
            metrics.placements.get_or_create(&PlacementLabels { status, reason: reason.to_string() }).set(replicas);
        }
    }
}
