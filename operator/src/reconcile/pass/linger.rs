//! Make-before-break for drains (docs/behaviour.md#rolling-out-a-change), right after
//! placement. A running replica that a drain moved *lingers* on its draining node:
//!
//! 1. it keeps running there — the node keeps it in its desired state, with its PAT — until
//!    its new node reports it running, or its agent's `progressDeadlineSeconds` passes;
//! 2. then it is *released*: the node's desired state keeps the agent with no replica for the
//!    agent's `drainSeconds` and [`RELEASE_SLACK`], so the node stops the old container with
//!    that drain (a node stops a container whose agent left its desired state with 30 s);
//! 3. then the agent leaves that node's desired state, and its PAT there is retired.
//!
//! The memo's per-node bindings list a lingering replica on its old node (so that node's
//! desired state, its PAT and its retirement follow), and the store keeps it, so a restart
//! or a new leader goes on where this one stood. A move that is not a drain's (the old node
//! offline or deleted, the agent stopped or lowered) is never delayed, and a lingering
//! replica ends at once when one of those happens.

use super::memo::Memo;
use super::place::Placed;
use super::plan::Plan;
use super::snapshot::Snapshot;
use crate::model::Id;
use crate::reconcile::rules::rollout::progress_deadline_ms;
use crate::reconcile::work::Ctx;
use crate::store::events::{Event, Kind};
use crate::store::{Linger, State};
use fleet_api::ReplicaState;
use std::collections::BTreeMap;

/// How long past the agent's drain a released replica's agent stays on its old node: the
/// node learns of the release within a long-poll's wake, and its stop then takes the drain.
pub const RELEASE_SLACK_MS: i64 = 5_000;

/// What the phase decided.
#[derive(Default)]
pub struct Lingered {
    /// Started or changed (`Some`) or ended (`None`), to store and publish.
    pub changed: Vec<((Id, u32), Option<Linger>)>,
    /// The lingering replicas after this pass: (agent, their draining node, replica).
    pub from: Vec<(Id, Id, u32)>,
    /// When the next one needs another look (ms).
    pub next_due: Option<i64>,
}

/// What becomes of one lingering replica in this pass.
enum Fate {
    Stays,
    Released,
    Ends(&'static str),
}

pub fn track(ctx: &Ctx, memo: &mut Memo, snap: &Snapshot, placed: &mut Placed, plan: &mut Plan) -> Lingered {
    let st = ctx.store.read();
    if st.lingering().is_empty() && placed.relocated.is_empty() && placed.unbound.is_empty() {
        return Lingered::default();
    }
    // (the replica, whether it is stored).
    let mut current: BTreeMap<(Id, u32), (Linger, bool)> =
        st.lingering().iter().map(|(k, l)| (k.clone(), (l.clone(), true))).collect();
    // Old nodes to let go of a replica: (agent, replica, node), done once every linger is
    // looked at, so an agent leaves a node only when nothing of it remains there.
    let mut let_go: Vec<(Id, u32, Id)> = Vec::new();
    for (agent, r, from, to) in std::mem::take(&mut placed.relocated) {
        if drained_while_running(memo, &st, &agent, r, &from) {
            let l = Linger { from, to, since_ms: snap.now, released_ms: None };
            // A replica that lingered elsewhere and is drained again: its first old node
            // lets go (the new row takes the stored one's key).
            if let Some((old, true)) = current.insert((agent.clone(), r), (l, false)) {
                let_go.push((agent, r, old.from));
            }
        }
    }
    for (agent, r, from) in std::mem::take(&mut placed.unbound) {
        if let Some(until) = scaled_down_while_busy(memo, &st, &agent, r, &from, snap.now) {
            scale_down_waits(memo, placed, (&agent, r, &from), until);
            let l = Linger { from: from.clone(), to: from, since_ms: snap.now, released_ms: None };
            current.entry((agent, r)).or_insert((l, false));
        }
    }
    let mut out = Lingered::default();
    for ((agent, r), (mut l, stored)) in current {
        let followed = follow(placed, &agent, r, &mut l);
        let changed = match fate(ctx, memo, &st, placed, &agent, r, &l, snap.now) {
            Fate::Ends(why) => {
                if stored {
                    tracing::info!(agent = %agent, replica = r, node = %memo.name(&l.from), reason = why, "moved replica's old node let go of it");
                    plan.rows.kv_delete.push((Linger::key(&agent, r), None));
                    out.changed.push(((agent.clone(), r), None));
                    let_go.push((agent, r, l.from));
                }
                continue;
            }
            Fate::Released if l.to == l.from => {
                scale_down_ends(memo, &st, placed, (&agent, r, &l.from), snap.now);
                l.released_ms = Some(snap.now);
                true
            }
            Fate::Released => {
                tracing::info!(agent = %agent, replica = r, node = %memo.name(&l.from), "moved replica runs on its new node; its old container stops with the agent's drain");
                l.released_ms = Some(snap.now);
                true
            }
            Fate::Stays => !stored || followed,
        };
        if !stored {
            tracing::info!(agent = %agent, replica = r, from = %memo.name(&l.from), to = %memo.name(&l.to), "moved replica keeps running on its draining node until its new node runs it");
        }
        list(memo, placed, &agent, r, &l);
        if changed {
            match serde_json::to_string(&l) {
                Ok(row) => plan.rows.kv.push((Linger::key(&agent, r), row)),
                Err(e) => tracing::error!(agent = %agent, error = %e, "cannot store a lingering replica"),
            }
            out.changed.push(((agent.clone(), r), Some(l.clone())));
        }
        let due = due(ctx, memo, &agent, &l);
        out.next_due = Some(out.next_due.map_or(due, |d: i64| d.min(due)));
        out.from.push((agent, l.from, r));
    }
    for (agent, r, from) in let_go {
        let keep_agent = out.from.iter().any(|(a, f, _)| *a == agent && *f == from);
        unlist(memo, placed, &agent, r, &from, keep_agent);
    }
    out
}

/// Until when a replica a scale-down removed is busy, if it is and runs on an online node:
/// it then waits there (its hold, `maxBusySeconds`, from now).
fn scaled_down_while_busy(memo: &Memo, st: &State, agent: &str, r: u32, from: &Id, now: i64) -> Option<i64> {
    let a = memo.agent(agent).filter(|a| a.placed_spec().is_some() && r >= a.desired_replicas())?;
    memo.node(from).filter(|f| f.online)?;
    st.busy_until_ms(from, &a.key, r, now)
}

fn scale_down_waits(memo: &Memo, placed: &mut Placed, (agent, r, node): (&Id, u32, &Id), until: i64) {
    let name = memo.name_id(node);
    let msg = format!(
        "the scale-down waits for replica {r} on node {name}, busy, until {} (or its hold) at the latest",
        crate::clock::rfc3339_ms(until)
    );
    tracing::info!(agent = %agent, event = "disruption_waiting", "{msg}");
    placed.events.push(Event::new(Kind::DisruptionWaiting, msg).agent(agent).node(node, &name).replica(r));
}

/// A replica the scale-down waited for stops now: idle, or its hold ended (`busy_hold_expired`).
fn scale_down_ends(memo: &Memo, st: &State, placed: &mut Placed, (agent, r, node): (&Id, u32, &Id), now: i64) {
    let name = memo.name_id(node);
    if st.busy_until_ms(node, agent, r, now).is_none() {
        tracing::info!(agent = %agent, replica = r, node = %name, "replica the scale-down removed is idle: it stops with the agent's drain");
        return;
    }
    let msg = format!(
        "replica {r} on node {name}, removed by a scale-down, is still busy after maxBusySeconds: it stops now"
    );
    tracing::info!(agent = %agent, event = "busy_hold_expired", "{msg}");
    placed.events.push(Event::new(Kind::BusyHoldExpired, msg).agent(agent).node(node, &name).replica(r));
}

/// A lingering replica that moved on from its new node (that node lost, drained) before it
/// ran there follows the move: its old copy keeps running until the next node runs it.
fn follow(placed: &Placed, agent: &str, r: u32, l: &mut Linger) -> bool {
    match placed.outcome.bindings.get(agent, r) {
        Some(n) if l.released_ms.is_none() && *n != l.to && *n != l.from => {
            l.to = n.clone();
            true
        }
        _ => false,
    }
}

/// Whether a move is a drain's of a replica that was running: the old node drains without
/// force and is online, and reported the replica running.
fn drained_while_running(memo: &Memo, st: &State, agent: &str, r: u32, from: &Id) -> bool {
    memo.node(from).is_some_and(|f| f.drain_paced())
        && st.node(from).and_then(|n| n.info.replica(agent, r)).is_some_and(|p| p.state == ReplicaState::Running)
}

#[allow(clippy::too_many_arguments)]
fn fate(ctx: &Ctx, memo: &Memo, st: &State, placed: &Placed, agent: &str, r: u32, l: &Linger, now: i64) -> Fate {
    let Some(a) = memo.agent(agent).filter(|a| a.placed_spec().is_some()) else {
        return Fate::Ends("agent no longer placed");
    };
    if !memo.node(&l.from).is_some_and(|f| f.online) {
        return Fate::Ends("old node offline or deleted");
    }
    if let Some(at) = l.released_ms {
        let stopped = now >= at + a.drain_seconds as i64 * 1000 + RELEASE_SLACK_MS;
        return if stopped { Fate::Ends("its drain has passed") } else { Fate::Stays };
    }
    if l.to == l.from {
        return scaled_down_fate(ctx, st, a, r, l, now);
    }
    if r >= a.desired_replicas() {
        return Fate::Ends("replicas lowered");
    }
    if placed.outcome.bindings.get(agent, r) != Some(&l.to) {
        return Fate::Ends("bound to its old node again, or unbound");
    }
    let running =
        st.node(&l.to).and_then(|n| n.info.replica(agent, r)).is_some_and(|p| p.state == ReplicaState::Running);
    let late = now - l.since_ms > deadline_ms(ctx, memo, agent);
    if (running && memo.node(&l.to).is_some_and(|f| f.online)) || late {
        return Fate::Released;
    }
    Fate::Stays
}

/// A replica a scale-down removed stays while it is busy, up to the agent's hold, then stops
/// with the agent's drain; the agent raised again ends it (it is bound again, or placed anew).
fn scaled_down_fate(ctx: &Ctx, st: &State, a: &crate::model::Agent, r: u32, l: &Linger, now: i64) -> Fate {
    if r < a.desired_replicas() {
        return Fate::Ends("replicas raised again");
    }
    let busy = st.busy_until_ms(&l.from, &a.key, r, now).is_some();
    if busy && now < l.since_ms + max_busy_ms(ctx, a) {
        return Fate::Stays;
    }
    Fate::Released
}

fn max_busy_ms(ctx: &Ctx, a: &crate::model::Agent) -> i64 {
    crate::reconcile::rules::rollout::max_busy_ms(a.rollout().as_ref(), &ctx.cfg.rollout)
}

/// When a lingering replica needs another look without a change: its deadline, or the end
/// of its release.
fn due(ctx: &Ctx, memo: &Memo, agent: &str, l: &Linger) -> i64 {
    match l.released_ms {
        Some(at) => {
            let drain = memo.agent(agent).map_or(0, |a| a.drain_seconds as i64 * 1000);
            at + drain + RELEASE_SLACK_MS
        }
        None if l.to == l.from => l.since_ms + memo.agent(agent).map_or(0, |a| max_busy_ms(ctx, a)) + 1,
        None => l.since_ms + deadline_ms(ctx, memo, agent) + 1,
    }
}

fn deadline_ms(ctx: &Ctx, memo: &Memo, agent: &str) -> i64 {
    progress_deadline_ms(memo.agent(agent).and_then(|a| a.rollout()).as_ref(), &ctx.cfg.rollout)
}

/// Lists the lingering replica on its old node in the memo's bindings: the replica while it
/// runs there, the agent alone once released (the replica off the list unless bound there
/// again). Touches what it changed.
fn list(memo: &mut Memo, placed: &mut Placed, agent: &Id, r: u32, l: &Linger) {
    let bound_there = placed.outcome.bindings.get(agent, r) == Some(&l.from);
    let agents = memo.per_node.entry(l.from.clone()).or_default();
    let mut changed = !agents.contains_key(agent);
    let reps = agents.entry(agent);
    match (reps.binary_search(&r), l.released_ms) {
        (Err(at), None) => {
            reps.insert(at, r);
            changed = true;
        }
        (Ok(at), Some(_)) if !bound_there => {
            reps.remove(at);
            changed = true;
        }
        _ => {}
    }
    if changed {
        touch(placed, agent, &l.from);
    }
}

/// Takes replica `r` off its old node in the memo's bindings (unless it is bound there
/// again), and the agent with it when it has no other replica there and `keep_agent` is
/// false (no other linger of it there).
fn unlist(memo: &mut Memo, placed: &mut Placed, agent: &Id, r: u32, from: &Id, keep_agent: bool) {
    if let Some(m) = memo.per_node.get_mut(from) {
        if let Some(reps) = m.get_mut(agent) {
            if placed.outcome.bindings.get(agent, r) != Some(from) {
                reps.retain(|x| *x != r);
            }
            if reps.is_empty() && !keep_agent {
                m.remove(agent);
            }
        }
    }
    touch(placed, agent, from);
}

fn touch(placed: &mut Placed, agent: &Id, node: &Id) {
    placed.touched_agents.insert(agent.clone());
    placed.touched_nodes.insert(node.clone());
    placed.touched_pairs.entry((agent.clone(), node.clone())).or_insert(true);
}
