//! Drain progress (docs/behaviour.md#node-lifecycle): for each draining node, the replicas still bound to it and
//! those blocked there, from the pass's per-node bindings; and the node events of the pass
//! (liveness flips).

use super::memo::Memo;
use crate::model::Id;
use crate::reconcile::rules::placement::Outcome;
use crate::store::events::{Batch, Event, Kind};
use crate::store::DrainProgress;
use rustc_hash::FxHashMap as HashMap;

/// Why a replica stays on its draining node: no other node fits it.
pub const NO_OTHER_NODE: &str = "no_other_node";
/// Why a replica stays on its draining node: its agent's disruption budget is spent.
pub const BUDGET: &str = "budget";
/// Why a replica stays on its draining node: it is busy, within its hold.
pub const BUSY: &str = "busy";

/// Every draining node's progress. Costs one look at each node's facts; only draining nodes
/// do more.
pub fn progress(memo: &Memo, outcome: &Outcome) -> HashMap<Id, DrainProgress> {
    let mut out: HashMap<Id, DrainProgress> = memo
        .facts
        .iter()
        .filter(|f| f.draining.is_some())
        .map(|f| {
            // Bound there: a moved replica that still runs there until its new node runs it
            // is listed in the memo's bindings but no longer bound.
            let bound = |(agent, reps): (&Id, &crate::reconcile::rules::node_agents::Reps)| {
                reps.iter().filter(|&&r| outcome.bindings.get(agent, r) == Some(&f.id)).count() as u32
            };
            let remaining = memo.per_node.get(&f.id).map(|m| m.iter().map(bound).sum()).unwrap_or(0);
            (f.id.clone(), DrainProgress { remaining, blocked: Vec::new() })
        })
        .collect();
    if out.is_empty() {
        return out;
    }
    let blocked = outcome.blocked.iter().map(|k| (k, NO_OTHER_NODE));
    let held = outcome.held.iter().map(|k| (k, if outcome.held_busy.contains(k) { BUSY } else { BUDGET }));
    for (key, why) in blocked.chain(held) {
        if let Some(p) = outcome.bindings.get(&key.0, key.1).and_then(|node| out.get_mut(node)) {
            p.blocked.push((key.0.clone(), key.1, why));
        }
    }
    for p in out.values_mut() {
        p.blocked.sort_unstable();
    }
    out
}

/// `node_online` / `node_offline` for the nodes whose state flipped (not in a full pass,
/// where every node is loaded offline and "comes online").
pub fn flip_events(memo: &Memo, flips: &[Id], full: bool, events: &mut Batch) {
    if full {
        return;
    }
    for id in flips {
        let Some(f) = memo.node(id) else { continue };
        let (kind, msg) = if f.online {
            (Kind::NodeOnline, "online")
        } else {
            (Kind::NodeOffline, "offline: no report within its threshold")
        };
        events.push(Event::new(kind, msg).node(id, &f.name));
    }
}
