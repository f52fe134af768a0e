//! The items of `GET /api/v1/placements` (SPEC §3.3), derived from the agents and the last
//! placement outcome: one item per (agent, node) with a count, one `pending` item for the
//! unplaced replicas, `pending / node_unavailable` for replicas stuck on an offline node,
//! and one `stopped` item per stopped agent.

use super::placement::Outcome;
use crate::model::{Agent, AgentState, IdentityKind, Placement};
use fleet_api::{codes, PlacementStatus, PlacementView};
use std::collections::BTreeMap;
use std::sync::Arc;

pub fn placement_views(agents: &[Agent], outcome: &Outcome) -> Vec<PlacementView> {
    let mut out = Vec::new();
    // bindings are ordered by (agent, replica): walk them once per agent via a range.
    let mut per_agent: BTreeMap<&str, BTreeMap<(&str, bool), u32>> = BTreeMap::new();
    for ((key, r), node) in &outcome.bindings {
        let stuck = !outcome.stuck.is_empty() && outcome.stuck.contains(&(key.clone(), *r));
        *per_agent.entry(key).or_default().entry((node, stuck)).or_default() += 1;
    }
    for a in agents {
        if a.identity.kind != IdentityKind::Agent || matches!(a.placement, Placement::None(_)) {
            continue;
        }
        if a.state == AgentState::Stopped {
            out.push(PlacementView {
                agent_key: a.key.clone(),
                revision: a.revision,
                node_id: None,
                replicas: 0,
                status: PlacementStatus::Stopped,
                reason: None,
            });
            continue;
        }
        if let Some(nodes) = per_agent.get(a.key.as_str()) {
            for ((node, stuck), count) in nodes {
                out.push(PlacementView {
                    agent_key: a.key.clone(),
                    revision: a.revision,
                    node_id: Some(node.to_string()),
                    replicas: *count,
                    status: if *stuck { PlacementStatus::Pending } else { PlacementStatus::Placed },
                    reason: stuck.then(|| codes::NODE_UNAVAILABLE.to_string()),
                });
            }
        }
        if let Some((count, reason)) = outcome.waiting.get(&Arc::<str>::from(a.key.as_str())) {
            out.push(PlacementView {
                agent_key: a.key.clone(),
                revision: a.revision,
                node_id: None,
                replicas: *count,
                status: PlacementStatus::Pending,
                reason: Some(reason.to_string()),
            });
        }
    }
    out.sort_by(|x, y| (&x.agent_key, &x.node_id, x.status).cmp(&(&y.agent_key, &y.node_id, y.status)));
    out
}
