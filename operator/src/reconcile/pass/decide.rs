//! The deciding phases after placement. Each reads the memo and the snapshot, and adds its
//! part to the [`Plan`]: identity and PAT work, the credentials to retire, the statuses and
//! the placement items; and it lists the nodes whose desired states may have changed, built
//! as they are stored ([`super::bodies`]). None of them writes.

use super::memo::Memo;
use super::place::Placed;
use super::plan::{Plan, VANISHED_DRAIN};
use super::rollout::Rolled;
use super::snapshot::Snapshot;
use crate::model::{Agent, Id, IdentityKind};
use crate::reconcile::rules::derive::{agent_status, is_placed, Lookup};
use crate::reconcile::rules::views::{agent_views, listed_views};
use crate::reconcile::work::Ctx;
use crate::reconcile::work::{rotate_at_ms, WorkKey};
use crate::store::kept::{Listed, Sent};
use rustc_hash::FxHashSet as HashSet;
use std::time::Duration;

/// Identities to ensure: every agent of kind `agent` whose identity is not bound yet, among
/// the agents this pass looks at.
pub fn identity_work(ctx: &Ctx, memo: &Memo, snap: &Snapshot, plan: &mut Plan) {
    let st = ctx.store.read();
    let needs_identity =
        |a: &Agent| a.identity.kind == IdentityKind::Agent && !st.identity(a.key.as_ref()).is_some_and(|i| i.bound);
    if snap.full {
        let keys = snap.agents.iter().filter(|a| needs_identity(a)).map(|a| WorkKey::Identity(a.key.clone()));
        plan.work.extend(keys);
        return;
    }
    for key in snap.changed_agents.iter().chain(snap.resynced_agents.iter()) {
        if memo.agent(key).is_some_and(needs_identity) {
            plan.work.push(WorkKey::Identity(key.clone()));
        }
    }
}

/// PATs to issue: new pairs and pairs whose credential changed or is due. Rotations due
/// later are scheduled by the worker that issued the PAT; after a start the full pass
/// schedules them again (the queue lives in memory).
pub fn pat_work(ctx: &Ctx, memo: &Memo, snap: &Snapshot, placed: &Placed, plan: &mut Plan) {
    let ttl_ms = ctx.cfg.token_ttl_seconds as i64 * 1000;
    let now = snap.now;
    let st = ctx.store.read();
    // A store older than the fleet replaces every PAT from before its mark
    // (docs/behaviour.md#a-store-older-than-the-fleet).
    let mark = st.catch_up();
    let stale = |issued_ms: i64| mark.is_some_and(|m| super::catch_up::stale(m, issued_ms));
    let wants_pat =
        |pair: &(Id, Id)| st.live_cred(pair).is_none_or(|c| now >= rotate_at_ms(c, ttl_ms) || stale(c.issued_ms));
    if !snap.full {
        for pair in placed.touched_pairs.keys().chain(snap.changes.creds.iter()) {
            if is_placed(&memo.per_node, pair) && wants_pat(pair) {
                plan.work.push(WorkKey::Pat(pair.0.clone(), pair.1.clone()));
            }
        }
        return;
    }
    for (node, m) in &memo.per_node {
        for agent in m.keys() {
            let pair = (agent.clone(), node.clone());
            match st.live_cred(&pair) {
                Some(c) if !wants_pat(&pair) => plan.rotations.push((pair.1, rotate_at_ms(c, ttl_ms))),
                _ => plan.work.push(WorkKey::Pat(pair.0, pair.1)),
            }
        }
    }
}

/// The nodes whose desired states the pass looks at again ([`super::bodies::commit`] builds
/// those whose inputs changed): those a move touched, whose credentials changed, and those
/// running an agent that changed or whose rollout stepped; every node in a full pass.
pub fn dirty_nodes(memo: &Memo, snap: &Snapshot, placed: &Placed, rolled: &Rolled) -> Vec<Id> {
    if snap.full {
        return memo.facts.iter().map(|f| f.id.clone()).collect();
    }
    let mut set = placed.touched_nodes.clone();
    set.extend(rolled.nodes.iter().cloned());
    set.extend(snap.changes.creds.iter().map(|p| p.1.clone()));
    for key in &snap.changed_agents {
        for (_, node) in placed.outcome.bindings.of_agent(key) {
            set.insert(node.clone());
        }
    }
    set.into_iter().collect()
}

/// PATs no longer needed are retired: revoked once the node's stop has run its course, or at
/// once when their node is offline (nothing there can use it for a draining run). A retired
/// pair's agent has left that node's desired state, and the node stops such a container with
/// a 30 s timeout whatever the agent's `drainSeconds` (docs/behaviour.md#identity-and-pats, docs/behaviour.md#container-rules), so that is the wait.
pub fn retire(ctx: &Ctx, memo: &Memo, snap: &Snapshot, placed: &Placed, plan: &mut Plan) {
    let st = ctx.store.read();
    // A full pass looks at every live credential (the pairs are built for it); an incremental
    // one only at the pairs it touched, by reference.
    let every: Vec<(Id, Id)>;
    let candidates: HashSet<&(Id, Id)> = if snap.full {
        every = st.live_creds().map(|(agent, node, _)| (agent.clone(), node.clone())).collect();
        every.iter().collect()
    } else {
        placed.touched_pairs.keys().chain(snap.changes.creds.iter()).collect()
    };
    for pair in candidates {
        if is_placed(&memo.per_node, pair) {
            continue;
        }
        let Some(c) = st.live_cred(pair) else { continue };
        let online = memo.node(&pair.1).is_some_and(|f| f.online);
        let delay = if online { VANISHED_DRAIN } else { Duration::ZERO };
        let at = snap.now + delay.as_millis() as i64;
        tracing::info!(agent = %pair.0, node = %memo.name(&pair.1), credential = %c.id(), in_seconds = delay.as_secs(), "PAT no longer needed; revoking after the drain window");
        let id = c.id();
        plan.rows.retire.push((id.to_string(), at));
        plan.publish.retired.push((pair.clone(), id.into(), at));
        // A store older than the fleet may not know the pair's PATs issued since its time:
        // they are found by their keys and revoked too (docs/behaviour.md#a-store-older-than-the-fleet).
        if st.catch_up().is_some() {
            plan.work.push(WorkKey::Sweep(pair.0.clone(), pair.1.clone()));
        }
    }
}

/// The agents whose status may have changed: those the pass saw change, those resynced,
/// those whose bindings, identity or credentials changed, and those on nodes that reported
/// or flipped.
fn status_agents(memo: &Memo, snap: &Snapshot, placed: &Placed) -> Vec<Id> {
    if snap.full {
        return snap.agents.iter().map(|a| a.key.clone()).collect();
    }
    let mut set = snap.changed_agents.clone();
    set.extend(snap.resynced_agents.iter().cloned());
    set.extend(placed.touched_agents.iter().cloned());
    set.extend(snap.changes.identities.iter().cloned());
    set.extend(snap.changes.creds.iter().map(|p| p.0.clone()));
    for node in snap.changes.reports.iter().chain(snap.flips.iter()) {
        if let Some(m) = memo.per_node.get(node) {
            set.extend(m.keys().cloned());
        }
    }
    set.into_iter().collect()
}

pub fn statuses(ctx: &Ctx, memo: &Memo, snap: &Snapshot, placed: &Placed, plan: &mut Plan) {
    let agents = status_agents(memo, snap, placed);
    let st = ctx.store.read();
    let lookup = Lookup {
        node: &|id: &Id| memo.node(id).map(|f| (&*f.name, f.online)),
        has_cred: &|pair: &(Id, Id)| st.live_cred(pair).is_some(),
    };
    plan.publish.reset_statuses = snap.full;
    plan.publish.statuses = agents
        .into_iter()
        .map(|key| {
            let body =
                memo.agent(&key).filter(|a| a.gets_status()).map(|a| agent_status(a, &placed.outcome, &st, &lookup));
            (key, body.as_ref().map(Sent::of))
        })
        .collect();
}

/// Placement items of the agents whose agent or placement changed, against what they were
/// (the agent as the last pass saw it, by the last outcome): the placements gauge follows the
/// difference. The items themselves are built when listed.
pub fn items(memo: &mut Memo, snap: &Snapshot, placed: &Placed, plan: &mut Plan) {
    let agents: Vec<Id> = if snap.full {
        memo.gauges.clear_placements();
        snap.agents.iter().map(|a| a.key.clone()).collect()
    } else {
        let set: HashSet<&Id> = snap.changed_agents.iter().chain(placed.touched_agents.iter()).collect();
        set.into_iter().cloned().collect()
    };
    plan.views_changed = snap.full;
    for key in agents {
        let items = memo.agent(&key).map(|a| agent_views(a, &placed.outcome)).unwrap_or_default();
        let before = match snap.full {
            true => Default::default(),
            false => last_seen(memo, snap, &key).map(|a| listed_views(&a, &placed.previous)).unwrap_or_default(),
        };
        if !snap.full && before == items {
            continue;
        }
        plan.views_changed = true;
        memo.gauges.count_views(&before.items, -1);
        memo.gauges.count_views(&items.items, 1);
    }
}

/// What the items said of the agent as the last pass saw it: as it was, if the list changed
/// it, else as the memo's list has it.
fn last_seen(memo: &Memo, snap: &Snapshot, key: &str) -> Option<Listed> {
    match snap.replaced.as_ref().and_then(|r| r.get(key)) {
        Some(was) => was.map(|w| w.listed.clone()),
        None => memo.agent(key).map(Listed::of),
    }
}
