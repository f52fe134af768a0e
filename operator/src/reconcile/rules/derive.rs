//! What the pass and the audit both derive from the registry: an agent's placement demand, a
//! node's placement facts, the bindings grouped by node, a node's desired-state entries and
//! an agent's status. One definition, so the audit holds the pass to the same rules.

use super::desired::{Entry, Look};
use super::node_agents::NodeAgents;
use super::placement::{Demand, NodeFacts, Outcome};
use super::status::{self, ReplicaInput, StatusBody, StatusInput};
use crate::model::{Agent, AgentState, Id, SpecId, Template};
use crate::store::{Cred, Linger, NodeRec, Rollout, State};
use rustc_hash::FxHashMap as HashMap;
use std::borrow::Cow;
use std::sync::Arc;

/// What placement needs of an agent; `None` for one that is not placed.
pub fn demand(a: &Agent) -> Option<Demand<'_>> {
    let spec = a.placed_spec()?;
    let res = a.resources();
    Some(Demand {
        key: a.key.clone(),
        replicas: spec.replicas,
        kind: Cow::Borrowed(&a.executor.kind),
        image: a.executor.image.as_deref().map(Cow::Borrowed),
        requires: Cow::Borrowed(&spec.requires),
        secrets: Cow::Borrowed(&spec.secrets),
        cpus: res.cpus,
        memory_mb: res.memory_mb,
        spread: a.spread().map(Cow::Borrowed),
        priority: a.priority(),
    })
}

/// What placement needs of a node. `online` is the caller's.
pub fn facts_of(n: &NodeRec, online: bool) -> NodeFacts {
    NodeFacts {
        id: n.id.clone(),
        name: n.name.clone(),
        online,
        schedulable: n.lifecycle.schedulable(),
        draining: n.lifecycle.draining(),
        kinds: n.info.executor_kinds.clone(),
        images: n.allow.clone(),
        labels: n.info.labels.clone(),
        secrets: n.info.secrets.clone(),
        kind_secrets: n.info.executor_secrets.as_deref().cloned().unwrap_or_default(),
        capacity: n.info.capacity.clone(),
    }
}

/// node → agent → its replica indexes there (sorted).
pub type PerNode = HashMap<Id, NodeAgents>;

pub fn per_node_of(outcome: &Outcome) -> PerNode {
    let mut per_node: PerNode = HashMap::default();
    // Bindings come in (agent, replica) order, so each node's agents are appended in order.
    for (agent, r, node) in outcome.bindings.iter() {
        per_node.entry(node.clone()).or_default().entry(agent).push(r);
    }
    per_node.values_mut().for_each(NodeAgents::shrink_to_fit);
    per_node
}

/// The bindings by node, with every replica a drain moved that still runs on its old node
/// listed there too, and the agent of one being stopped there listed with no replica
/// (docs/behaviour.md#rolling-out-a-change).
pub fn per_node_lingering(outcome: &Outcome, lingering: &std::collections::BTreeMap<(Id, u32), Linger>) -> PerNode {
    let mut per_node = per_node_of(outcome);
    for ((agent, r), l) in lingering {
        let reps = per_node.entry(l.from.clone()).or_default().entry(agent);
        if let (Err(at), None) = (reps.binary_search(r), l.released_ms) {
            reps.insert(at, *r);
        }
    }
    per_node
}

/// Whether the (agent, node) pair has a replica bound.
pub fn is_placed(per_node: &PerNode, pair: &(Id, Id)) -> bool {
    per_node.get(&pair.1).is_some_and(|m| m.contains_key(&pair.0))
}

/// A node's desired-state entries: every agent bound there whose credential for the node
/// exists (docs/behaviour.md#desired-state-and-observed-report: an agent enters only once it does),
/// one entry for each template its replicas there are sent.
pub fn entries_of<'a>(
    per_node: &'a PerNode,
    node: &Id,
    agent: impl Fn(&str) -> Option<&'a Agent>,
    cred: impl Fn(&(Id, Id)) -> Option<Arc<Cred>>,
    look: impl Fn(&Agent, &Id, u32) -> Look,
) -> Vec<Entry<'a>> {
    let mut out = Vec::new();
    for (key, reps) in per_node.get(node).into_iter().flatten() {
        let Some(a) = agent(key) else { continue };
        let Some(c) = cred(&(key.clone(), node.clone())) else { continue };
        for (reps, look) in by_look(reps.as_slice(), |r| look(a, node, r)) {
            out.push((a, reps, c.clone(), look));
        }
    }
    out
}

/// Replicas grouped by the template each is sent, in the order the templates first come; all
/// of them as they are when they share one (the common case: no copy).
fn by_look(reps: &[u32], look: impl Fn(u32) -> Look) -> Vec<(Cow<'_, [u32]>, Look)> {
    // An agent kept with no replica (a drain's released move, stopping with the agent's
    // drain) still has its one entry, `replicaIndexes: []`: without it the node would stop
    // the container as one whose agent left, with 30 s.
    if reps.is_empty() {
        return vec![(Cow::Borrowed(reps), look(0))];
    }
    let looks: Vec<Look> = reps.iter().map(|r| look(*r)).collect();
    if looks.windows(2).all(|w| w[0].id() == w[1].id()) {
        return looks.into_iter().next().map(|l| (Cow::Borrowed(reps), l)).into_iter().collect();
    }
    let mut groups: Vec<(Vec<u32>, Look)> = Vec::new();
    for (r, l) in reps.iter().zip(looks) {
        match groups.iter_mut().find(|(_, g)| g.id() == l.id()) {
            Some((g, _)) => g.push(*r),
            None => groups.push((vec![*r], l)),
        }
    }
    groups.into_iter().map(|(g, l)| (Cow::Owned(g), l)).collect()
}

/// The template a replica is sent on a node: its rollout's for it, else the agent's own
/// (`own` gives its id when known without hashing it again).
pub fn look_of(a: &Agent, node: &Id, replica: u32, rollout: Option<&Arc<Rollout>>, own: Option<SpecId>) -> Look {
    match rollout {
        Some(r) => Look::Rolled(r.template_of(node, replica).clone()),
        None => Look::Own(own.unwrap_or_else(|| Template::of(a, 0).id())),
    }
}

/// How a status looks up a node (name, online) and whether a pair has its PAT.
pub struct Lookup<'a> {
    pub node: &'a dyn Fn(&Id) -> Option<(&'a str, bool)>,
    pub has_cred: &'a dyn Fn(&(Id, Id)) -> bool,
}

/// One agent's status from its bindings, the nodes' reports and its identity.
pub fn agent_status(a: &Agent, outcome: &Outcome, st: &State, lookup: &Lookup) -> StatusBody {
    let key: Id = a.key.clone();
    let desired = a.desired_replicas();
    let mut replicas = Vec::with_capacity(desired as usize);
    let mut pending_pat: Option<String> = None;
    // One range walk over this agent's bindings instead of a lookup per replica.
    let mut bound_to: Vec<Option<&Id>> = vec![None; desired as usize];
    for (r, n) in outcome.bindings.of_agent(&key).take_while(|(r, _)| *r < desired) {
        bound_to[r as usize] = Some(n);
    }
    for (r, bound) in (0..desired).zip(bound_to) {
        let node = bound.map(|n| (lookup.node)(n).unwrap_or(("?", false)));
        let report = bound.and_then(|n| st.node(n)).and_then(|n| n.info.replica(&a.key, r));
        if let Some(n) = bound {
            if pending_pat.is_none() && !(lookup.has_cred)(&(key.clone(), n.clone())) {
                let name = (lookup.node)(n).map(|x| x.0).unwrap_or("?");
                pending_pat = Some(format!("issuing the PAT for node {name}"));
            }
        }
        let stuck = !outcome.stuck.is_empty() && outcome.stuck.contains(&(key.clone(), r));
        replicas.push(ReplicaInput { replica: r, node, stuck, report });
    }
    let input = StatusInput {
        stopped: a.state == AgentState::Stopped,
        desired,
        replicas,
        waiting: outcome.waiting.get(&key).map(|w| w.1),
        identity_pending: identity_pending(st, &key, pending_pat),
    };
    status::derive(&input)
}

/// Agent `a`'s status as the registry stands at `now`: what the explanation shows, and what
/// a status work item sends (the pass keeps only the hash of the body it wants sent).
pub fn status_now(a: &Agent, st: &State, now: i64, offline_after: std::time::Duration) -> StatusBody {
    let node = |id: &Id| st.node(id).map(|n| (&*n.name, n.online(now, offline_after)));
    let has_cred = |pair: &(Id, Id)| st.live_cred(pair).is_some();
    agent_status(a, st.outcome(), st, &Lookup { node: &node, has_cred: &has_cred })
}

/// Why the agent's identity is not ready yet, if it is not: a recorded error first, then a
/// missing binding, then a PAT still being issued.
fn identity_pending(st: &State, key: &Id, pending_pat: Option<String>) -> Option<String> {
    let identity_ready = st.identity(key).is_some_and(|i| i.bound);
    match (st.identity_error(key), identity_ready, pending_pat) {
        (Some(e), _, _) => Some(e.clone()),
        (None, false, _) => Some("creating the agent's IAM identity".to_string()),
        (None, true, p) => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent kept on a node with no replica still has its entry (`replicaIndexes: []`), so
    /// the node stops its old container with the agent's drain; replicas on one template share
    /// one entry, those on two get two.
    #[test]
    fn an_empty_replica_list_keeps_one_entry_and_templates_split_the_rest() {
        let own = |id: u32| move |_: u32| Look::Own(SpecId(id));
        assert_eq!(by_look(&[], own(1)).iter().map(|(r, _)| r.len()).collect::<Vec<_>>(), [0]);
        assert_eq!(by_look(&[0, 2], own(1)).len(), 1);
        let split = by_look(&[0, 1, 2], |r| Look::Own(SpecId(r % 2)));
        assert_eq!(split.iter().map(|(r, _)| r.to_vec()).collect::<Vec<_>>(), [vec![0, 2], vec![1]]);
    }
}
