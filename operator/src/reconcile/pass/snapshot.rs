//! The pass's first phase: take the change record, bring the memo up to date (the resync
//! slice, changed facts and credentials), check liveness, and diff the agent list against the
//! last one. Every lock taken here is released before the phase returns.

use super::liveness;
use super::memo::Memo;
use super::replaced::{Replaced, Was};
use crate::model::{Agent, AgentList, Id, Shared, SpecId, Template};
use crate::reconcile::rules::derive::demand;
use crate::reconcile::rules::desired::agent_fingerprint;
use crate::reconcile::rules::placement::Outcome;
use crate::reconcile::work::Ctx;
use crate::store::kept::Listed;
use crate::store::Changes;
use rustc_hash::FxHashSet as HashSet;
use std::sync::Arc;

/// What the pass read, and what changed since the last one.
pub struct Snapshot {
    /// The memo was empty: everything is computed.
    pub full: bool,
    pub now: i64,
    pub changes: Changes,
    /// Nodes whose online state flipped.
    pub flips: Vec<Id>,
    pub agents: AgentList,
    /// The published outcome; placement takes it (and drops it when done).
    pub previous: Option<Arc<Outcome>>,
    /// When the next online node would go offline (ms), if any node is online.
    pub next_offline: Option<i64>,
    /// Agents added, removed or edited since the last pass.
    pub changed_agents: HashSet<Id>,
    /// Whether anything placement reads of the agents changed.
    pub demand_changed: bool,
    /// Set when the list is not the one the last committed pass saw (and in a full pass):
    /// what the agents it changed were then. The replaced list itself is dropped as it is
    /// diffed.
    pub replaced: Option<Arc<Replaced>>,
    /// The agents' share of the rolling resync.
    pub resynced_agents: Vec<Id>,
}

pub fn take(ctx: &Ctx, memo: &mut Memo, now: i64) -> Snapshot {
    let mut changes = ctx.store.take_changes();
    if changes.rebuild {
        // A node was deleted: start from scratch rather than patch every per-node part.
        *memo = memo.start_over();
    }
    let full = !memo.primed;
    let (agents, index, previous, flips) = {
        let st = ctx.store.read();
        if full {
            memo.load(&st);
        } else {
            let count = memo.slice(memo.facts.len(), now);
            memo.resync_nodes(&st, count, &mut changes);
            memo.update(&st, &changes);
        }
        let flips = liveness::check(&st, memo, &changes, full, now, ctx.cfg.node_offline_after);
        (st.agents().clone(), st.agent_index().clone(), st.outcome().clone(), flips)
    };
    let next_offline = (memo.next_check != i64::MAX).then_some(memo.next_check);
    let mut snap = Snapshot {
        full,
        now,
        changes,
        flips,
        agents: agents.clone(),
        previous: Some(previous),
        next_offline,
        changed_agents: HashSet::default(),
        demand_changed: full,
        replaced: None,
        resynced_agents: Vec::new(),
    };
    if full || !Arc::ptr_eq(&memo.agents, &agents) {
        diff_agents(memo, &mut snap);
        // Taken with the list under one read lock: the index of this very list.
        memo.index = index;
    }
    if !full {
        let count = memo.slice(agents.len(), now);
        snap.resynced_agents = memo.resync_agents(&agents, count);
    }
    snap
}

/// What the memo keeps of an agent beside it: its fingerprint and its own template's id.
fn prints_of(a: &Agent) -> (u64, SpecId) {
    (agent_fingerprint(a), Template::of(a, 0).id())
}

/// Agents added, removed or edited since the last pass, with their fingerprints updated, and
/// what they were at the last committed pass (a failed pass's changes are still changes).
fn diff_agents(memo: &mut Memo, snap: &mut Snapshot) {
    let agents = snap.agents.clone();
    let old = std::mem::replace(&mut memo.agents, agents.clone());
    let mut replaced = memo.replaced.take().map(Arc::unwrap_or_clone).unwrap_or_default();
    let mut templates = Shared::default();
    let mut note = |before: Option<&Agent>, after: Option<&Agent>| {
        let key: &Id = &before.or(after).expect("an agent on one side").key;
        snap.demand_changed |= before.and_then(demand) != after.and_then(demand);
        snap.changed_agents.insert(key.clone());
        replaced
            .note(key, || before.map(|b| Was { listed: Listed::of(b), template: templates.share(Template::of(b, 0)) }));
    };
    if !snap.full && crate::store::same_keys(&old, &agents) {
        // The usual edit: same keys in the same order; compare in place.
        for (i, (before, after)) in old.iter().zip(agents.iter()).enumerate() {
            if before != after {
                note(Some(before), Some(after));
                memo.fingerprints[i] = prints_of(after);
            }
        }
    } else {
        // Both lists are in key order: one merge walk finds what was added, removed or edited,
        // and lays the fingerprints out in the new list's order.
        let old_prints = std::mem::take(&mut memo.fingerprints);
        let mut prints = Vec::with_capacity(agents.len());
        let (mut i, mut j) = (0, 0);
        loop {
            match (old.get(i), agents.get(j)) {
                (None, None) => break,
                (Some(before), Some(after)) if before.key == after.key => {
                    if before != after {
                        note(Some(before), Some(after));
                        prints.push(prints_of(after));
                    } else {
                        // A memo started over has the list but not its prints.
                        prints.push(old_prints.get(i).copied().unwrap_or_else(|| prints_of(after)));
                    }
                    (i, j) = (i + 1, j + 1);
                }
                (Some(before), after) if after.is_none_or(|a| before.key < a.key) => {
                    note(Some(before), None);
                    i += 1;
                }
                (_, after) => {
                    let after = after.expect("the other arms took every case without a new agent");
                    note(None, Some(after));
                    prints.push(prints_of(after));
                    j += 1;
                }
            }
        }
        memo.fingerprints = prints;
    }
    drop(old);
    for key in replaced.keys() {
        snap.changed_agents.insert(key.clone());
    }
    memo.listed = Listed::all(&agents);
    let replaced = Arc::new(replaced);
    memo.replaced = Some(replaced.clone());
    snap.replaced = Some(replaced);
}
