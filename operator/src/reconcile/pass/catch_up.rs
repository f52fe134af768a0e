//! A store older than the fleet (docs/behaviour.md#a-store-older-than-the-fleet): a node
//! reports a generation newer than the store has for it — the store was restored from a
//! backup, or PostgreSQL recovered to an earlier point — or a restore marked the store so.
//! This phase notices it, marks the store (stored with the pass, so a restart goes on), asks
//! for every pair's PAT to be issued again (the issue walks the idempotency keys past those
//! issued after the store's time, `work::items`), holds the body of a node that is ahead
//! until every PAT it gets is new, then builds it past the generation the node has, and
//! clears the mark once no node is ahead and no pair holds a PAT from before it.

use super::memo::Memo;
use super::plan::Plan;
use super::snapshot::Snapshot;
use crate::model::Id;
use crate::reconcile::work::{Ctx, WorkKey};
use crate::store::records::catch_up::{CatchUp, KEY};
use crate::store::State;
use std::collections::{HashMap, HashSet};

/// What the bodies of this pass must do for the nodes that are ahead.
#[derive(Debug, Default)]
pub struct Ahead {
    /// Nodes whose every pair has a new PAT: built now past the generation each has.
    pub build: HashMap<Id, u64>,
    /// Nodes not built: those ahead still waiting for a PAT, and while the store catches up
    /// every node not heard from since the store was loaded — its generation, and what it
    /// runs, are not known yet; a body built for it could take it back, or carry another
    /// content under the generation it has. They keep what they run.
    pub hold: HashSet<Id>,
    /// The nodes heard from while the store catches up: looked at again every pass (their
    /// bodies built where their inputs changed, those held before among them).
    pub heard: Vec<Id>,
}

/// The phase: the mark set, kept or cleared, the PAT work it asks for, and the nodes ahead.
pub fn look(ctx: &Ctx, memo: &Memo, snap: &Snapshot, plan: &mut Plan) -> Ahead {
    let st = ctx.store.read();
    let candidates: Vec<Id> = if snap.full || st.catch_up().is_some() {
        st.nodes().map(|n| n.id.clone()).collect()
    } else {
        snap.changes.ahead.iter().cloned().collect()
    };
    let ahead: Vec<(Id, u64)> = candidates.into_iter().filter_map(|n| Some((n.clone(), st.ahead(&n)?))).collect();
    let mark = match st.catch_up() {
        Some(m) if snap.full => {
            tracing::warn!(why = %m.why, "the store is older than the fleet; catching up (docs/behaviour.md#a-store-older-than-the-fleet)");
            sweep_unplaced(memo, &st, plan);
            m.clone()
        }
        Some(m) => m.clone(),
        None if ahead.is_empty() => return Ahead::default(),
        None => start(memo, snap, &st, &ahead, plan),
    };
    if ahead.is_empty() && settled(ctx, &st, &mark, snap.now) && caught_up(&st, &mark) {
        tracing::info!(since = %crate::clock::rfc3339_ms(mark.since_ms), "the store caught up with the fleet: no node is ahead of it, every PAT is new since then, and those issued after its time are known");
        plan.rows.kv_delete.push((KEY.to_string(), None));
        plan.publish.catch_up = Some(None);
        return Ahead::default();
    }
    let mut out = split(memo, &st, &mark, ahead, plan);
    for n in st.nodes() {
        match n.reported {
            false => drop(out.hold.insert(n.id.clone())),
            true if !out.hold.contains(&n.id) && !out.build.contains_key(&n.id) => out.heard.push(n.id.clone()),
            true => {}
        }
    }
    out
}

/// Marks the store, logs why, and asks for every placed pair's PAT work.
fn start(memo: &Memo, snap: &Snapshot, st: &State, ahead: &[(Id, u64)], plan: &mut Plan) -> CatchUp {
    let (node, theirs) = &ahead[0];
    let ours = st.desired(node).map_or(0, |d| d.generation);
    let mark = CatchUp::node_ahead(snap.now, memo.name(node), *theirs, ours);
    tracing::warn!(why = %mark.why, nodes_ahead = ahead.len(), "the store is older than the fleet (restored from a backup?); catching up: every PAT is issued again past those issued since, and each node ahead gets a generation past its own");
    plan.rows.kv.push((KEY.to_string(), mark.to_json()));
    plan.publish.catch_up = Some(Some(mark.clone()));
    ask_every_pat(memo, plan);
    sweep_unplaced(memo, st, plan);
    mark
}

/// Every pair the store keeps a counter for and no longer places: PATs of it issued after the
/// store's time (a rotation, a retirement whose revocation was still waiting) are found and
/// revoked.
fn sweep_unplaced(memo: &Memo, st: &State, plan: &mut Plan) {
    let placed = |agent: &Id, node: &Id| memo.per_node.get(node).is_some_and(|m| m.contains_key(agent));
    let unplaced = st.pairs().filter(|(agent, node)| !placed(agent, node));
    plan.work.extend(unplaced.map(|(agent, node)| WorkKey::Sweep(agent.clone(), node.clone())));
}

/// Every placed pair's PAT work, once: the work item replaces each PAT from before the mark.
fn ask_every_pat(memo: &Memo, plan: &mut Plan) {
    for (node, m) in &memo.per_node {
        plan.work.extend(m.keys().map(|agent| WorkKey::Pat(agent.clone(), node.clone())));
    }
}

/// Whether `issued_ms` is a PAT from before the mark.
pub fn stale(mark: &CatchUp, issued_ms: i64) -> bool {
    issued_ms < mark.since_ms
}

/// Every node that runs has reported since the mark: the longest offline threshold of the
/// fleet has passed (a node that reports not within it is offline). Cleared before, a node
/// that had not reported yet would find the store older than it again, and every pair would
/// get a second new PAT.
fn settled(ctx: &Ctx, st: &State, mark: &CatchUp, now: i64) -> bool {
    let observe = st.nodes().filter_map(|n| n.info.observe_seconds).max().unwrap_or(0);
    let threshold = ctx.cfg.node_offline_after.max(std::time::Duration::from_secs(3 * u64::from(observe)));
    now >= mark.since_ms + threshold.as_millis() as i64
}

/// No live PAT from before the mark is left.
fn caught_up(st: &State, mark: &CatchUp) -> bool {
    st.live_creds().all(|(_, _, c)| !stale(mark, c.issued_ms))
}

/// The nodes ahead whose every placed pair has a PAT issued since the mark, and the others.
fn split(memo: &Memo, st: &State, mark: &CatchUp, ahead: Vec<(Id, u64)>, plan: &mut Plan) -> Ahead {
    let mut out = Ahead::default();
    for (node, theirs) in ahead {
        let agents = memo.per_node.get(&node).map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        let ready =
            agents.iter().all(|a| st.live_cred(&(a.clone(), node.clone())).is_some_and(|c| !stale(mark, c.issued_ms)));
        if ready {
            sweep(st, &node, &agents, plan);
            out.build.insert(node, theirs);
        } else {
            out.hold.insert(node);
        }
    }
    out
}

/// The agents the node runs that the store does not place there: their PATs there, issued
/// after the store's time, are found and revoked (`work::items`, the sweep), once, as the
/// node is built past its generation.
fn sweep(st: &State, node: &Id, placed: &[Id], plan: &mut Plan) {
    let Some(n) = st.node(node) else { return };
    let mut runs: Vec<&Id> = n.info.replicas.iter().map(|r| &r.agent_key).filter(|a| !placed.contains(a)).collect();
    runs.sort();
    runs.dedup();
    plan.work.extend(runs.into_iter().map(|agent| WorkKey::Sweep(agent.clone(), node.clone())));
}
