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
use crate::store::events::{Event, Kind};
use crate::store::State;
use fleet_api::ReplicaState;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
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
    /// Due rotations that said they wait for a busy replica or a window, so each wait is
    /// said once.
    waiting: Mutex<HashSet<(Id, Id)>>,
}

/// What a due rotation waits for besides the budget, and until when (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// A replica of the agent on the node is busy, within its hold (`maxBusySeconds` from the
    /// rotation's due point).
    Busy { until: i64 },
    /// The agent's or the node's maintenance windows are closed.
    Window { opens: i64 },
}

impl Hold {
    pub fn until(self) -> i64 {
        match self {
            Hold::Busy { until } => until,
            Hold::Window { opens } => opens,
        }
    }
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

    /// Whether the due rotation of `pair` waits for a window or a busy replica
    /// (docs/behaviour.md#busy-replicas), and the event that says so: `disruption_waiting`
    /// the first time it waits, `busy_hold_expired` when it goes while a replica is busy.
    pub fn held(
        &self,
        st: &State,
        defaults: &Defaults,
        pair: &(Id, Id),
        due: i64,
        now: i64,
    ) -> (Option<Hold>, Option<Event>) {
        let Some(a) = st.agent(&pair.0) else { return (None, None) };
        let max_busy = crate::reconcile::rules::rollout::max_busy_ms(a.rollout().as_ref(), defaults);
        let busy = busy_on(st, pair, now);
        let hold = window_hold(st, a, &pair.1, now)
            .or_else(|| busy.filter(|_| now < due + max_busy).map(|u| Hold::Busy { until: u.min(due + max_busy) }));
        let mut waiting = self.waiting.lock();
        let event = match hold {
            Some(h) if waiting.insert(pair.clone()) => Some(waiting_event(st, pair, h)),
            None if waiting.remove(pair) && busy.is_some() => Some(expired_event(st, pair, max_busy / 1000)),
            _ => None,
        };
        (hold, event)
    }

    /// A rotation taken by [`Rotating::may_rotate`] that issued nothing (IAM failed): it is
    /// retried, and takes its place again then.
    pub fn abandoned(&self, pair: &(Id, Id)) {
        self.under_way.lock().remove(pair);
    }
}

/// Until when the first busy replica of the agent on the node says it is busy.
fn busy_on(st: &State, (agent, node): &(Id, Id), now: i64) -> Option<i64> {
    let mut reps = st.outcome().bindings.of_agent(agent).filter(|(_, n)| *n == node).map(|(r, _)| r);
    reps.find_map(|r| st.busy_until_ms(node, agent, r, now))
}

/// When the agent's or the node's windows open, while either is closed.
fn window_hold(st: &State, a: &crate::model::Agent, node: &Id, now: i64) -> Option<Hold> {
    use crate::reconcile::rules::rollout::{closed_until, windows_of};
    let own = windows_of(a.rollout().as_ref()).unwrap_or_default();
    closed_until([&own[..], st.node_windows(node)], now).map(|opens| Hold::Window { opens })
}

fn node_name(st: &State, node: &Id) -> Id {
    st.node(node).map_or_else(|| node.clone(), |n| n.name.clone())
}

fn waiting_event(st: &State, (agent, node): &(Id, Id), h: Hold) -> Event {
    let name = node_name(st, node);
    let why = match h {
        Hold::Busy { .. } => "a replica there is busy",
        Hold::Window { .. } => "outside its maintenance window",
    };
    let until = crate::clock::rfc3339_ms(h.until());
    let msg = format!("the PAT rotation of {agent} on node {name} waits: {why}, until {until} at the latest");
    tracing::info!(agent = %agent, event = "disruption_waiting", "{msg}");
    Event::new(Kind::DisruptionWaiting, msg).agent(agent).node(node, &name)
}

fn expired_event(st: &State, (agent, node): &(Id, Id), max_busy: i64) -> Event {
    let name = node_name(st, node);
    let msg = format!(
        "the PAT rotation of {agent} on node {name} goes while a replica is busy: maxBusySeconds ({max_busy} s) passed"
    );
    tracing::info!(agent = %agent, event = "busy_hold_expired", "{msg}");
    Event::new(Kind::BusyHoldExpired, msg).agent(agent).node(node, &name)
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
