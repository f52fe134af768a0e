//! The items of `GET /api/v1/placements` (SPEC §3.3), derived from the agents and the last
//! placement outcome: one item per (agent, node) with a count, one `pending` item for the
//! unplaced replicas, `pending / node_unavailable` for replicas stuck on an offline node,
//! and one `stopped` item per stopped agent.
//!
//! They are kept per agent so a pass rebuilds only the agents it touched; publishing a new
//! map copies one `Arc` per agent, not the items.

use super::placement::Outcome;
use crate::model::{Agent, AgentState, IdentityKind, Placement};
use crate::store::Id;
use fleet_api::{codes, PlacementStatus};
use std::collections::BTreeMap;

pub use crate::store::kept::{AgentItems, Item, ViewMap};

/// Whether the agent has placement items at all (identity-only and service agents do not).
fn listed(a: &Agent) -> bool {
    a.identity.kind == IdentityKind::Agent && !matches!(a.placement, Placement::None(_))
}

/// One agent's items, from its range of the bindings.
pub fn agent_views(a: &Agent, outcome: &Outcome) -> AgentItems {
    let mut out = AgentItems { revision: a.revision, items: Vec::new() };
    if !listed(a) {
        return out;
    }
    let item = |node_id: Option<Id>, replicas, status, reason: Option<&str>| Item {
        node_id,
        replicas,
        status,
        reason: reason.map(Box::from),
    };
    if a.state == AgentState::Stopped {
        out.items.push(item(None, 0, PlacementStatus::Stopped, None));
        return out;
    }
    let key: Id = a.key.clone();
    let mut per_node: BTreeMap<(&Id, bool), u32> = BTreeMap::new();
    for (r, node) in outcome.bindings.of_agent(&key) {
        let stuck = !outcome.stuck.is_empty() && outcome.stuck.contains(&(key.clone(), r));
        *per_node.entry((node, stuck)).or_default() += 1;
    }
    for ((node, stuck), count) in per_node {
        let (status, reason) = if stuck {
            (PlacementStatus::Pending, Some(codes::NODE_UNAVAILABLE))
        } else {
            (PlacementStatus::Placed, None)
        };
        out.items.push(item(Some(node.clone()), count, status, reason));
    }
    if let Some((count, reason)) = outcome.waiting.get(&key) {
        out.items.push(item(None, *count, PlacementStatus::Pending, Some(reason)));
    }
    out.sort();
    out
}

/// Every agent's items, built from scratch.
pub fn placement_views(agents: &[Agent], outcome: &Outcome) -> ViewMap {
    let mut map = ViewMap::default();
    for a in agents {
        map.set(a.key.clone(), agent_views(a, outcome));
    }
    map
}
