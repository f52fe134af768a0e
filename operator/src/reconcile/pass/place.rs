//! The place phase: run placement when anything it reads changed (otherwise the last outcome
//! stands: placement is a fixed point of its own output), log and record every binding that
//! moved, and work out which agents, nodes and pairs the moves touched.

use super::memo::Memo;
use super::snapshot::Snapshot;
use crate::model::Id;
use crate::reconcile::rules::derive::{demand, is_placed, per_node_lingering, per_node_of};
use crate::reconcile::rules::move_budget::{move_budget, Sources};
use crate::reconcile::rules::placement::{self, Bindings, MoveBudget, Outcome, ReplicaKey};
use crate::reconcile::work::Ctx;
use crate::store::db::PassWrite;
use crate::store::events::{Batch, Event, Kind};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

/// The outcome of the place phase.
pub struct Placed {
    /// Placement ran (the outcome is new, possibly equal to the last).
    pub replaced: bool,
    pub outcome: Arc<Outcome>,
    /// The outcome of the last pass (the same when placement did not run): the placement
    /// items of the agents touched are compared against it.
    pub previous: Arc<Outcome>,
    /// Agents whose bindings, waiting count or stuck replicas changed.
    pub touched_agents: HashSet<Id>,
    /// Nodes that gained or lost a replica.
    pub touched_nodes: HashSet<Id>,
    /// Pairs whose presence may have changed, with whether they were placed before.
    pub touched_pairs: HashMap<(Id, Id), bool>,
    /// Replicas that moved from one node to another: (agent, replica, from, to).
    pub relocated: Vec<(Id, u32, Id, Id)>,
    /// Replicas unbound with no new node (a scale-down, the agent gone): (agent, replica, from).
    pub unbound: Vec<(Id, u32, Id)>,
    /// What moved, for the event history.
    pub events: Batch,
    /// When a drain's busy replica ends its lease or hold (ms): the pass looks again then.
    pub next_due: Option<i64>,
}

pub fn place(ctx: &Ctx, memo: &mut Memo, snap: &mut Snapshot, rows: &mut PassWrite) -> Placed {
    let previous = snap.previous.take().unwrap_or_default();
    // Replicas a drain holds move as others become ready: a report, or an agent's new
    // policy, may free their budget.
    let held = !previous.held.is_empty() && (!snap.changes.reports.is_empty() || !snap.changed_agents.is_empty());
    // A run that preempted is followed by another: the replicas it unbound may fit elsewhere
    // or take lower ones' room in turn, and room it left over may fit a waiting replica.
    let preempted = !previous.preemptions.is_empty();
    // A drain's busy replica moves when its lease or hold ends, report or not.
    let busy_ended = previous.busy_ends.is_some_and(|at| snap.now >= at);
    let replaced = snap.full
        || busy_ended
        || snap.demand_changed
        || !snap.changes.facts.is_empty()
        || !snap.flips.is_empty()
        || held
        || preempted;
    let mut placed = Placed {
        replaced,
        outcome: previous.clone(),
        previous: previous.clone(),
        touched_agents: HashSet::default(),
        touched_nodes: HashSet::default(),
        touched_pairs: HashMap::default(),
        relocated: Vec::new(),
        unbound: Vec::new(),
        events: Batch::default(),
        next_due: previous.busy_ends,
    };
    if !replaced {
        return placed;
    }
    // The demands borrow the agents and are taken one by one, not collected.
    let demands = snap.agents.iter().filter_map(demand);
    let budget = budget(ctx, memo, &previous, snap);
    let busy = budget.busy.clone();
    placed.outcome = Arc::new(placement::place_within(demands, &memo.facts, &*previous, budget));
    let busy_now =
        |node: &Id, key: &(Arc<str>, u32)| ctx.store.read().busy_until_ms(node, &key.0, key.1, snap.now).is_some();
    busy_drain_events(&previous, &placed.outcome, &busy, &busy_now, memo, &mut placed.events);
    placed.next_due = placed.outcome.busy_ends;
    preemption_events(&placed.outcome, memo, &mut placed.events);
    if !placed.outcome.preemptions.is_empty() {
        // The run after a preemption places what it unbound: at once, not a period later.
        ctx.kick();
    }
    let moves = diff_bindings(&previous.bindings, &placed.outcome, memo, rows, &mut placed.events);
    placed.relocated =
        moves.iter().filter_map(|(a, r, from, to)| Some((a.clone(), *r, from.clone()?, to.clone()?))).collect();
    placed.unbound = moves
        .iter()
        .filter(|m| m.3.is_none())
        .filter_map(|(a, r, from, _)| Some((a.clone(), *r, from.clone()?)))
        .collect();
    waiting_events(&previous, &placed.outcome, &mut placed.events);
    if snap.full {
        memo.per_node = per_node_of(&placed.outcome);
    } else {
        track_moves(memo, moves, &mut placed);
        touched_by_waiting(&previous, &mut placed);
    }
    placed
}

/// The drain moves each agent may take in this run: none to compute unless a node drains.
fn budget(ctx: &Ctx, memo: &Memo, previous: &Outcome, snap: &Snapshot) -> MoveBudget {
    let draining: Vec<&Id> = memo.facts.iter().filter(|f| f.drain_paced()).map(|f| &f.id).collect();
    let st = ctx.store.read();
    let mut busy_anywhere = st.busy_replicas(snap.now);
    busy_anywhere.sort_unstable();
    if draining.is_empty() {
        return MoveBudget { busy_anywhere, ..MoveBudget::default() };
    }
    // A full pass has no bindings by node yet: they are derived as the last pass left them.
    let derived = snap.full.then(|| per_node_lingering(previous, st.lingering()));
    let agent = |k: &str| memo.agent(k);
    let online = |id: &Id| memo.node(id).is_some_and(|f| f.online);
    let budget = move_budget(&Sources {
        draining,
        per_node: derived.as_ref().unwrap_or(&memo.per_node),
        bindings: &previous.bindings,
        agent: &agent,
        online: &online,
        st: &st,
        defaults: &ctx.cfg.rollout,
        now_ms: snap.now,
    });
    MoveBudget { busy_anywhere, ..budget }
}

/// `disruption_waiting` when a drain first holds a busy replica, and `busy_hold_expired`
/// when one it held moves while still busy (its hold ended).
fn busy_drain_events(
    previous: &Outcome,
    next: &Outcome,
    busy: &[(ReplicaKey, i64)],
    busy_now: &dyn Fn(&Id, &ReplicaKey) -> bool,
    memo: &Memo,
    events: &mut Batch,
) {
    let node_of = |o: &Outcome, key: &(Arc<str>, u32)| o.bindings.get(&key.0, key.1).cloned();
    for key in next.held_busy.difference(&previous.held_busy) {
        let Some(node) = node_of(next, key) else { continue };
        let until = busy.binary_search_by(|(k, _)| k.cmp(key)).map_or(0, |at| busy[at].1);
        let name = memo.name_id(&node);
        let msg = format!(
            "the drain of node {name} waits for replica {} of {}, busy, until {} at the latest",
            key.1,
            key.0,
            crate::clock::rfc3339_ms(until)
        );
        tracing::info!(agent = %key.0, event = "disruption_waiting", "{msg}");
        events.push(Event::new(Kind::DisruptionWaiting, msg).agent(&key.0).node(&node, &name).replica(key.1));
    }
    for key in previous.held_busy.difference(&next.held_busy) {
        let (Some(from), Some(to)) = (node_of(previous, key), node_of(next, key)) else { continue };
        if from != to && busy_now(&from, key) && memo.node(&from).is_some_and(|f| f.drain_paced()) {
            let name = memo.name_id(&from);
            let msg = format!(
                "replica {} of {} on draining node {name} reached its hold while busy: it moves now",
                key.1, key.0
            );
            tracing::info!(agent = %key.0, event = "busy_hold_expired", "{msg}");
            events.push(Event::new(Kind::BusyHoldExpired, msg).agent(&key.0).node(&from, &name).replica(key.1));
        }
    }
}

/// A replica's move between two passes: (agent, replica, from, to).
type Move = (Id, u32, Option<Id>, Option<Id>);

/// Applies the moves to the memo's per-node bindings and notes what they touched.
fn track_moves(memo: &mut Memo, moves: Vec<Move>, placed: &mut Placed) {
    for (agent, r, from, to) in moves {
        placed.touched_agents.insert(agent.clone());
        if let Some(node) = from {
            placed.touched_pairs.entry((agent.clone(), node.clone())).or_insert(true);
            if let Some(m) = memo.per_node.get_mut(&node) {
                if let Some(reps) = m.get_mut(&agent) {
                    reps.retain(|x| *x != r);
                    if reps.is_empty() {
                        m.remove(&agent);
                    }
                }
            }
            placed.touched_nodes.insert(node);
        }
        if let Some(node) = to {
            let pair = (agent.clone(), node.clone());
            let was = is_placed(&memo.per_node, &pair);
            placed.touched_pairs.entry(pair).or_insert(was);
            let reps = memo.per_node.entry(node.clone()).or_default().entry(&agent);
            if let Err(at) = reps.binary_search(&r) {
                reps.insert(at, r);
            }
            placed.touched_nodes.insert(node);
        }
    }
}

/// Agents whose waiting count or stuck replicas changed are touched too.
fn touched_by_waiting(previous: &Outcome, placed: &mut Placed) {
    let outcome = &placed.outcome;
    for (key, w) in previous.waiting.iter().chain(outcome.waiting.iter()) {
        if previous.waiting.get(key) != Some(w) || outcome.waiting.get(key) != Some(w) {
            placed.touched_agents.insert(key.clone());
        }
    }
    for k in previous.stuck.symmetric_difference(&outcome.stuck) {
        placed.touched_agents.insert(k.0.clone());
    }
    for k in previous.blocked.symmetric_difference(&outcome.blocked) {
        placed.touched_agents.insert(k.0.clone());
    }
    for k in previous.held.symmetric_difference(&outcome.held) {
        placed.touched_agents.insert(k.0.clone());
    }
    for k in previous.preempted.symmetric_difference(&outcome.preempted) {
        placed.touched_agents.insert(k.0.clone());
    }
}

/// Each preemption: one event on the replica that went, naming who took its room.
fn preemption_events(next: &Outcome, memo: &Memo, events: &mut Batch) {
    for p in &next.preemptions {
        let name = memo.name_id(&p.node);
        tracing::info!(agent = %p.victim.0, replica = p.victim.1, node = %name, by = %p.by.0, by_replica = p.by.1,
            priority = p.victim_priority, by_priority = p.by_priority, "replica preempted");
        let msg = format!(
            "preempted on {name}: replica {} of {} (priority {}) took its room (priority {})",
            p.by.1, p.by.0, p.by_priority, p.victim_priority
        );
        events
            .push(Event::new(Kind::ReplicaPreempted, msg).agent(&p.victim.0).node(&p.node, &name).replica(p.victim.1));
    }
}

/// An agent whose waiting count or reason changed: one event.
fn waiting_events(previous: &Outcome, next: &Outcome, events: &mut Batch) {
    for (key, w) in &next.waiting {
        if previous.waiting.get(key) != Some(w) {
            let (n, what) = (w.0, if w.0 == 1 { "replica" } else { "replicas" });
            let msg =
                format!("{n} {what} waiting: {} ({})", w.1, crate::reconcile::rules::status::waiting_message(w.1));
            events.push(Event::new(Kind::ReplicaWaiting, msg).agent(key));
        }
    }
}

/// Walks the previous and the new bindings together (both ordered by (agent, replica)):
/// records what to store, logs every placement decision and returns the moves, in one
/// linear merge.
fn diff_bindings(prev: &Bindings, next: &Outcome, memo: &Memo, rows: &mut PassWrite, events: &mut Batch) -> Vec<Move> {
    use std::cmp::Ordering;
    let mut moves = Vec::new();
    let mut a = prev.iter().peekable();
    let mut b = next.bindings.iter().peekable();
    loop {
        let ord = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((ka, ra, _)), Some((kb, rb, _))) => (ka, ra).cmp(&(kb, rb)),
        };
        match ord {
            Ordering::Less => {
                let (agent, r, node) = a.next().expect("peeked");
                let why = next.waiting.get(agent).map(|w| w.1).unwrap_or("no longer wanted");
                tracing::info!(agent = %agent, replica = r, node = %memo.name(node), reason = why, "replica unbound");
                let name = memo.name_id(node);
                let msg = format!("unbound from {name}: {why}");
                events.push(Event::new(Kind::ReplicaUnbound, msg).agent(agent).node(node, &name).replica(r));
                rows.unbind.push((agent.clone(), r));
                moves.push((agent.clone(), r, Some(node.clone()), None));
            }
            Ordering::Greater => {
                let (agent, r, node) = b.next().expect("peeked");
                tracing::info!(agent = %agent, replica = r, node = %memo.name(node), "replica placed");
                let name = memo.name_id(node);
                let msg = format!("placed on {name}");
                events.push(Event::new(Kind::ReplicaPlaced, msg).agent(agent).node(node, &name).replica(r));
                rows.bind.push((agent.clone(), r, node.clone()));
                moves.push((agent.clone(), r, None, Some(node.clone())));
            }
            Ordering::Equal => {
                let (_, _, old) = a.next().expect("peeked");
                let (agent, r, node) = b.next().expect("peeked");
                if old != node {
                    tracing::info!(agent = %agent, replica = r, from = %memo.name(old), to = %memo.name(node), "replica moved");
                    let name = memo.name_id(node);
                    let msg = format!("moved from {} to {name}", memo.name(old));
                    events.push(Event::new(Kind::ReplicaMoved, msg).agent(agent).node(node, &name).replica(r));
                    rows.bind.push((agent.clone(), r, node.clone()));
                    moves.push((agent.clone(), r, Some(old.clone()), Some(node.clone())));
                }
            }
        }
    }
    moves
}
