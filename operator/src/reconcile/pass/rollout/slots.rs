//! Where an agent's replicas stand, node by node, for the step rule: the template each node
//! was handed, how many of its replicas are ready, and whether an updated one failed
//! (docs/behaviour.md#rolling-out-a-change). The rollout's node list follows the bindings
//! here: a node the agent left is dropped, a node it came to is added on the template a new
//! replica gets.

use crate::model::{Agent, Id, SpecId};
use crate::reconcile::pass::memo::Memo;
use crate::reconcile::rules::placement::Outcome;
use crate::reconcile::rules::rollout::Slot;
use crate::store::records::rollout::step_count;
use crate::store::{NodeStep, Rollout, Seen, State};
use fleet_api::codes::refusal;
use fleet_api::ReplicaState;
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct Gathered {
    /// In node-name order.
    pub slots: Vec<Slot>,
    /// Nodes found running the target they were not handed (a step the store lost): taken
    /// as stepped, so their bodies are built again with it.
    pub adopted: Vec<Id>,
    /// Each slot's node and its first replica (for the failure's report).
    pub who: Vec<(Id, u32)>,
    /// When the next readiness or deadline runs out (ms).
    pub due: Option<i64>,
}

/// What the slots are read from.
pub struct Sources<'a> {
    pub a: &'a Agent,
    pub memo: &'a Memo,
    pub st: &'a State,
    pub outcome: &'a Outcome,
    /// The nodes a moved replica of the agent still runs on: they keep their template.
    pub lingering: &'a [&'a Id],
    pub now: i64,
}

pub fn gather(one: &Sources, r: &mut Rollout) -> Gathered {
    let key = &one.a.key;
    let desired = one.a.desired_replicas();
    let mut by_node: BTreeMap<Id, Vec<u32>> = BTreeMap::new();
    for (rep, node) in one.outcome.bindings.of_agent(key).take_while(|(rep, _)| *rep < desired) {
        by_node.entry(node.clone()).or_default().push(rep);
    }
    sync_nodes(r, &by_node, one.lingering, one.now);
    let mut order: Vec<(&str, &Id)> = by_node.keys().map(|n| (one.memo.name(n), n)).collect();
    order.sort();
    let mut g = Gathered { slots: Vec::new(), adopted: Vec::new(), who: Vec::new(), due: None };
    // A store older than the fleet lost the steps taken since its time: a node that runs the
    // target already is taken as stepped, never handed the old template back
    // (docs/behaviour.md#a-store-older-than-the-fleet).
    let adopt = one.st.catch_up().is_some() && r.state == fleet_api::rollout::RolloutState::Progressing;
    let min_ready = r.policy.min_ready_seconds as i64 * 1000;
    let deadline = r.policy.progress_deadline_seconds as i64 * 1000;
    let target = r.target.id();
    for (_, node) in order {
        let reps = &by_node[node];
        let online = one.memo.node(node).is_some_and(|f| f.online);
        let reports: Vec<Option<&Seen>> = reps
            .iter()
            .map(|rep| {
                let n = one.st.node(node)?;
                n.info.replica(key, *rep)
            })
            .collect();
        let i = r.nodes.binary_search_by(|s| s.node.cmp(node)).expect("synced above");
        // Worked on apart, and written back only when it moved: the list stays shared.
        let mut step = r.nodes[i].clone();
        step.replicas = step_count(reps.len());
        if adopt && step.on != target && runs(&reports, target) {
            step.on = target;
            step.stepped_ms = one.now;
            g.adopted.push(node.clone());
        }
        let slot = if step.on == target {
            updated_slot(&mut step, &reports, online, target, one.now, min_ready, deadline, &mut g.due)
        } else {
            old_slot(&reports, online)
        };
        if step != r.nodes[i] {
            Arc::make_mut(&mut r.nodes)[i] = step;
        }
        g.slots.push(slot);
        g.who.push((node.clone(), reps[0]));
    }
    g
}

/// The rollout's nodes as the bindings stand: a node new to the agent is handed what a new
/// replica gets (the target, or while halted the last template that completed). A node a
/// moved replica still runs on keeps its step until the replica is let go there: what it
/// runs must not change under it.
fn sync_nodes(r: &mut Rollout, by_node: &BTreeMap<Id, Vec<u32>>, lingering: &[&Id], now: i64) {
    let stays = |s: &NodeStep| by_node.contains_key(&s.node) || lingering.contains(&&s.node);
    let new = |n: &&Id| r.nodes.binary_search_by(|s| s.node.cmp(n)).is_err();
    if r.nodes.iter().all(stays) && !by_node.keys().any(|n| new(&n)) {
        return;
    }
    // The list is a shared slice: built again, which the bindings of an agent under a
    // rollout seldom call for.
    let added: Vec<NodeStep> = by_node
        .keys()
        .filter(new)
        .map(|node| {
            let on = r.template_on(node).id();
            NodeStep { node: node.clone(), on, stepped_ms: now, ready_since_ms: 0, restarts: 0, replicas: 0 }
        })
        .collect();
    let mut nodes: Vec<NodeStep> = r.nodes.iter().filter(|s| stays(s)).cloned().chain(added).collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    r.nodes = nodes.into();
}

/// Whether every replica reports running `target` (an older node, which reports no template,
/// never counts).
fn runs(reports: &[Option<&Seen>], target: SpecId) -> bool {
    reports.iter().all(|p| p.is_some_and(|p| p.state == ReplicaState::Running && p.spec == target.0 && p.spec != 0))
}

/// Replicas on a template older than the target: ready while running on an online node.
fn old_slot(reports: &[Option<&Seen>], online: bool) -> Slot {
    let running = reports.iter().flatten().filter(|p| p.state == ReplicaState::Running).count() as u32;
    Slot { replicas: reports.len() as u32, on_target: false, ready: if online { running } else { 0 }, failure: None }
}

/// Replicas handed the target: ready once every one has run it `min_ready` without a
/// restart; failed when one crash-loops on it, is refused or blocked, or the deadline passes.
#[allow(clippy::too_many_arguments)]
fn updated_slot(
    step: &mut NodeStep,
    reports: &[Option<&Seen>],
    online: bool,
    target: SpecId,
    now: i64,
    min_ready: i64,
    deadline: i64,
    due: &mut Option<i64>,
) -> Slot {
    let replicas = reports.len() as u32;
    let on_it = |p: &Seen| p.spec == target.0 || p.spec == 0;
    let failure = reports.iter().flatten().find_map(|p| failure_of(p, on_it(p)));
    let all_running = online
        && reports.iter().all(|p| p.is_some_and(|p| p.state == ReplicaState::Running && on_it(p) && !is_blocked(p)));
    let restarts = step_count(reports.iter().flatten().map(|p| p.restarts as usize).sum());
    if !all_running {
        step.ready_since_ms = 0;
    } else if step.ready_since_ms == 0 || restarts > step.restarts {
        step.ready_since_ms = now;
        step.restarts = restarts;
    }
    let ready = step.ready_since_ms > 0 && now - step.ready_since_ms >= min_ready;
    let mut soonest = |at: i64| *due = Some(due.map_or(at, |d: i64| d.min(at)));
    let failure = failure.or_else(|| {
        let late = !ready && step.stepped_ms > 0 && now - step.stepped_ms > deadline;
        late.then(|| format!("not ready within progressDeadlineSeconds ({} s)", deadline / 1000))
    });
    if !ready && failure.is_none() {
        if step.ready_since_ms > 0 {
            soonest(step.ready_since_ms + min_ready);
        }
        if step.stepped_ms > 0 {
            soonest(step.stepped_ms + deadline + 1);
        }
    }
    Slot { replicas, on_target: true, ready: if ready { replicas } else { 0 }, failure }
}

fn is_blocked(p: &Seen) -> bool {
    p.message.as_deref().is_some_and(|m| refusal::code_of(m) == Some(refusal::UPDATE_BLOCKED))
}

/// Why a replica handed the target failed, if it did.
fn failure_of(p: &Seen, on_target: bool) -> Option<String> {
    let message = p.message.as_deref();
    if is_blocked(p) {
        return message.map(str::to_string);
    }
    match p.state {
        ReplicaState::Crashloop if on_target => {
            Some(format!("crashloop ({})", message.unwrap_or("exited with a failure")))
        }
        // A refusal, or a create that failed (`start failed: No such image: …`).
        ReplicaState::Stopped | ReplicaState::Starting => {
            message.filter(|m| refusal::code_of(m).is_some()).map(str::to_string)
        }
        _ => None,
    }
}
