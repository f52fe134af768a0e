//! How many ready replicas each agent may move off draining nodes in one placement run
//! (docs/behaviour.md#rolling-out-a-change): a drain shares the agent's one disruption
//! budget with its rollouts, so it moves a replica only while the agent's unavailable
//! replicas stay within `maxUnavailable`. The pass and the audit derive it alike, from the
//! bindings before the run and the nodes' reports.

use super::derive::PerNode;
use super::placement::{Bindings, MoveBudget};
use super::rollout::{policy, Defaults};
use crate::model::{Agent, Id};
use crate::store::{Rollout, State};
use fleet_api::ReplicaState;
use std::sync::Arc;

/// What the budget is read from.
pub struct Sources<'a> {
    /// The nodes draining without force that are online: only their replicas are paced.
    pub draining: Vec<&'a Id>,
    pub per_node: &'a PerNode,
    pub bindings: &'a Bindings,
    pub agent: &'a dyn Fn(&str) -> Option<&'a Agent>,
    pub online: &'a dyn Fn(&Id) -> bool,
    pub st: &'a State,
    pub defaults: &'a Defaults,
    pub now_ms: i64,
}

/// The budget of every agent with a replica on a draining node. Costs nothing when no node
/// drains.
pub fn move_budget(s: &Sources) -> MoveBudget {
    let mut out = MoveBudget::default();
    for node in &s.draining {
        let Some(agents) = s.per_node.get(*node) else { continue };
        for (key, reps) in agents {
            let Some(a) = (s.agent)(key) else { continue };
            let rollout = s.st.rollout(key);
            // Bound there: a replica a drain moved away may still be listed on its old node.
            for &r in reps.iter().filter(|&&r| s.bindings.get(key, r) == Some(*node)) {
                if ready(s, a, rollout, r, node) {
                    out.ready.push((key.clone(), r));
                    if let Some(ends) = busy_within_hold(s, a, r, node) {
                        out.busy.push(((key.clone(), r), ends));
                        out.busy_ends = Some(out.busy_ends.map_or(ends, |e| e.min(ends)));
                    }
                }
            }
            if !out.left.contains_key(key) {
                out.left.insert(key.clone(), left(s, a, rollout));
            }
        }
    }
    out.ready.sort_unstable();
    out.ready.dedup();
    out.busy.sort_unstable();
    out.busy.dedup_by(|x, y| x.0 == y.0);
    out
}

/// When a busy replica on a draining node stops holding its move (its lease's end, or its
/// hold's: the drain's start plus the agent's `maxBusySeconds`), if it holds it now.
fn busy_within_hold(s: &Sources, a: &Agent, r: u32, node: &Id) -> Option<i64> {
    let until = s.st.busy_until_ms(node, &a.key, r, s.now_ms)?;
    let started = match s.st.node(node)?.lifecycle {
        crate::store::Lifecycle::Draining { started_ms, .. } => started_ms,
        _ => return None,
    };
    let hold_ends = started + super::rollout::max_busy_ms(a.rollout().as_ref(), s.defaults);
    (s.now_ms < hold_ends).then_some(until.min(hold_ends))
}

/// The agent's budget less its replicas unavailable now.
fn left(s: &Sources, a: &Agent, rollout: Option<&Arc<Rollout>>) -> u32 {
    let desired = a.desired_replicas();
    let budget = policy(a.rollout().as_ref(), s.defaults).0.max_unavailable.budget(desired);
    let ready = s
        .bindings
        .of_agent(&a.key)
        .take_while(|(r, _)| *r < desired)
        .filter(|(r, node)| ready(s, a, rollout, *r, node))
        .count() as u32;
    budget.saturating_sub(desired.saturating_sub(ready))
}

/// Ready for the budget: running on an online node, and on the template its rollout handed
/// that node (one just handed a new template is about to be recreated).
fn ready(s: &Sources, a: &Agent, rollout: Option<&Arc<Rollout>>, r: u32, node: &Id) -> bool {
    if !(s.online)(node) {
        return false;
    }
    let Some(p) = s.st.node(node).and_then(|n| n.info.replica(&a.key, r)) else { return false };
    let handed = rollout.map(|ro| ro.template_of(node, r).id().0);
    p.state == ReplicaState::Running && handed.is_none_or(|id| p.spec == id || p.spec == 0)
}
