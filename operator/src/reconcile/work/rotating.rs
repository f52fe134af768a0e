//! PAT rotations as steps in the agent's disruption budget (docs/behaviour.md#rolling-out-a-change):
//! a new PAT recreates the container it is sealed for, so a rotation that is due is issued
//! only while the agent's unavailable replicas, with those being rotated, leave room for the
//! replicas on that node — otherwise it waits a few seconds and asks again (the rotation
//! window of days leaves room for that). A rotation is under way from its issue until the
//! node has applied the desired state that carries the new PAT and reports the agent's
//! replicas there running, or the agent's `progressDeadlineSeconds` passes.
//!
//! Kept in memory: after a restart the rotations under way are not known, and the next ones
//! wait only for replicas reported not running.

use crate::model::Id;
use crate::reconcile::rules::rollout::{policy, Defaults};
use crate::store::State;
use fleet_api::ReplicaState;
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::time::Duration;

/// How long a rotation that must wait for the budget waits before it asks again.
pub const WAIT: Duration = Duration::from_secs(1);

/// One rotation under way.
#[derive(Debug, Clone, Copy)]
struct Flight {
    issued_ms: i64,
    /// The node's desired generation that first carried the new PAT, once published.
    generation: Option<u64>,
}

#[derive(Default)]
pub struct Rotating {
    under_way: Mutex<HashMap<(Id, Id), Flight>>,
}

impl Rotating {
    pub fn is_empty(&self) -> bool {
        self.under_way.lock().is_empty()
    }

    /// The rotated PAT of `pair` was issued at `issued_ms` (a rotation that went without
    /// the budget's leave; one [`Rotating::may_rotate`] let go is under way already, and a
    /// pass may have published it since).
    pub fn started(&self, pair: (Id, Id), issued_ms: i64) {
        self.under_way.lock().entry(pair).or_insert(Flight { issued_ms, generation: None });
    }

    /// Forgets the rotations that are done (see [`done`]): those of an agent that rotates
    /// nothing more would otherwise stay.
    pub fn prune(&self, st: &State, now: i64, deadline_ms: impl Fn(&Id) -> i64) {
        let mut m = self.under_way.lock();
        if !m.is_empty() {
            m.retain(|pair, f| !done(st, pair, *f, now, deadline_ms(&pair.0)));
        }
    }

    /// The pass published `generation` of `node`'s desired state, carrying the PAT of `agent`
    /// issued at `issued_ms`.
    pub fn published(&self, agent: &Id, node: &Id, issued_ms: i64, generation: u64) {
        let mut m = self.under_way.lock();
        if let Some(f) = m.get_mut(&(agent.clone(), node.clone())) {
            if f.generation.is_none() && issued_ms >= f.issued_ms {
                f.generation = Some(generation);
            }
        }
    }

    /// Whether the due rotation of `agent`'s PAT on `node` may be issued now; if so it is
    /// under way from now (checked and taken under one lock: workers rotating PATs of one
    /// agent at once each see the others). Rotations that are done are forgotten on the way.
    pub fn may_rotate(
        &self,
        st: &State,
        defaults: &Defaults,
        offline_after: Duration,
        pair: &(Id, Id),
        now: i64,
    ) -> bool {
        let (agent, node) = pair;
        let Some(a) = st.agent(agent) else { return true };
        let desired = a.desired_replicas();
        let p = policy(a.rollout().as_ref(), defaults).0;
        let budget = p.max_unavailable.budget(desired);
        let deadline = p.progress_deadline_seconds as i64 * 1000;
        let mut m = self.under_way.lock();
        let rotating = under_way_of(&mut m, st, agent, now, deadline);
        let online = |n: &Id| st.node(n).is_some_and(|r| r.online(now, offline_after));
        let (mut ready, mut here) = (0u32, 0u32);
        for (r, n) in st.outcome().bindings.of_agent(agent).take_while(|(r, _)| *r < desired) {
            here += u32::from(n == node);
            let running =
                st.node(n).and_then(|x| x.info.replica(agent, r)).is_some_and(|s| s.state == ReplicaState::Running);
            ready += u32::from(running && online(n) && !rotating.contains(n));
        }
        let unavailable = desired.saturating_sub(ready);
        // Nothing ready: nothing to protect. A node holding more than the budget goes alone.
        let may = ready == 0 || unavailable + here <= budget || unavailable == 0;
        if may {
            m.insert(pair.clone(), Flight { issued_ms: now, generation: None });
        }
        may
    }

    /// A rotation taken by [`Rotating::may_rotate`] that issued nothing (IAM failed): it is
    /// retried, and takes its place again then.
    pub fn abandoned(&self, pair: &(Id, Id)) {
        self.under_way.lock().remove(pair);
    }
}

/// The nodes where `agent`'s PAT is being rotated; forgets the rotations that are done.
fn under_way_of(m: &mut HashMap<(Id, Id), Flight>, st: &State, agent: &Id, now: i64, deadline: i64) -> Vec<Id> {
    let mine: Vec<((Id, Id), Flight)> =
        m.iter().filter(|((a, _), _)| a == agent).map(|(k, f)| (k.clone(), *f)).collect();
    let mut out = Vec::new();
    for (pair, f) in mine {
        if done(st, &pair, f, now, deadline) {
            m.remove(&pair);
        } else {
            out.push(pair.1);
        }
    }
    out
}

/// A rotation is done once its node applied the state carrying the new PAT and reports the
/// agent's replicas there running, when the pair is gone, or at the deadline.
fn done(st: &State, (agent, node): &(Id, Id), f: Flight, now: i64, deadline: i64) -> bool {
    if now - f.issued_ms > deadline || !st.is_placed(agent, node) {
        return true;
    }
    let (Some(generation), Some(n)) = (f.generation, st.node(node)) else { return false };
    let applied = n.info.applied_generation >= generation;
    let reps: Vec<u32> = st.outcome().bindings.of_agent(agent).filter(|(_, x)| *x == node).map(|(r, _)| r).collect();
    applied && reps.iter().all(|r| n.info.replica(agent, *r).is_some_and(|s| s.state == ReplicaState::Running))
}
