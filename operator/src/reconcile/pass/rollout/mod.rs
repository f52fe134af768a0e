//! The rollout phase (docs/behaviour.md#rolling-out-a-change), after placement and before
//! the desired states: a change of an agent's template starts a rollout, admins' orders are
//! applied, and each rollout under way takes its steps by the step rule
//! (`rules::rollout`). The desired states then send each node the template its rollout
//! handed it. Only agents with a rollout under way, a change or an order are looked at: an
//! agent with none costs the pass nothing.

mod orders;
mod slots;

use super::memo::Memo;
use super::place::Placed;
use super::plan::Plan;
use super::snapshot::Snapshot;
use crate::model::{find_agent, Agent, Id, SpecId, Template};
use crate::reconcile::rules::rollout::{self as rule, Decision};
use crate::reconcile::work::Ctx;
use crate::store::events::{Event, Kind};
use crate::store::rollouts::Pending;
use crate::store::{NodeStep, Rollout, State};
use fleet_api::rollout::{FailedReplica, OnFailure, RolloutState};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What the phase decided.
#[derive(Default)]
pub struct Rolled {
    /// The rollouts this pass changed; `None` lets one go from memory.
    pub changed: HashMap<Id, Option<Arc<Rollout>>>,
    /// Nodes whose template of some agent changed: their desired states are built again.
    pub nodes: HashSet<Id>,
    /// The earliest instant (ms) a rollout needs another look: a replica's `minReadySeconds`
    /// or progress deadline running out.
    pub next_due: Option<i64>,
}

impl Rolled {
    /// The agent's rollout as this pass leaves it.
    pub fn get<'a>(&'a self, st: &'a State, key: &str) -> Option<&'a Arc<Rollout>> {
        match self.changed.get(key) {
            Some(r) => r.as_ref(),
            None => st.rollout(key),
        }
    }

    fn due(&mut self, at: i64) {
        self.next_due = Some(self.next_due.map_or(at, |d| d.min(at)));
    }
}

/// Runs the phase: rows and events go to the plan and `placed.events`.
pub fn roll(ctx: &Ctx, memo: &Memo, snap: &Snapshot, placed: &mut Placed, orders: Vec<Pending>, plan: &mut Plan) -> Rolled {
    let mut out = Rolled::default();
    let st = ctx.store.read();
    let mut by_agent: HashMap<Id, Vec<Pending>> = HashMap::default();
    for o in orders {
        by_agent.entry(o.0.clone()).or_default().push(o);
    }
    let mut keys: BTreeSet<Id> = st.rollouts().filter(|r| r.state != RolloutState::Complete).map(|r| r.agent.clone()).collect();
    keys.extend(by_agent.keys().cloned());
    if snap.old_agents.is_some() {
        keys.extend(snap.changed_agents.iter().cloned());
    }
    for key in keys {
        let before = st.rollout(&key).map(|r| (**r).clone());
        let agent_orders = by_agent.remove(&key).unwrap_or_default();
        for (agent, value, _) in &agent_orders {
            plan.rows.kv_delete.push((format!("{}{agent}", crate::store::rollouts::ORDER_PREFIX), Some(value.clone())));
        }
        let Some(a) = memo.agent(&key).filter(|a| a.placed_spec().is_some()) else {
            if before.is_some() {
                out.changed.insert(key.clone(), None);
            }
            if snap.old_agents.as_ref().is_some_and(|old| find_agent(old, &key).is_some()) && memo.agent(&key).is_none() {
                plan.rows.kv_delete.push((Rollout::key(&key), None));
            }
            continue;
        };
        let mut one = One { ctx, memo, snap, placed: &*placed, a, events: Vec::new(), out: &mut out, st: &st };
        let mut r = before.clone();
        one.cp_change(&mut r);
        for (_, _, order) in agent_orders {
            one.order(&mut r, order);
        }
        if let Some(r) = &mut r {
            one.evaluate(r);
        }
        let events = std::mem::take(&mut one.events);
        for e in events {
            placed.events.push(e);
        }
        if r == before {
            continue;
        }
        let Some(r) = r else { continue };
        match serde_json::to_string(&r) {
            Ok(row) => plan.rows.kv.push((Rollout::key(&key), row)),
            Err(e) => tracing::error!(agent = %key, error = %e, "cannot store the rollout"),
        }
        for (_, node) in placed.outcome.bindings.of_agent(&key) {
            out.nodes.insert(node.clone());
        }
        let keep = r.worth_keeping(&Template::of(a, 0));
        out.changed.insert(key, keep.then(|| Arc::new(r)));
    }
    out
}

/// One agent's share of the phase.
struct One<'a> {
    ctx: &'a Ctx,
    memo: &'a Memo,
    snap: &'a Snapshot,
    placed: &'a Placed,
    a: &'a Agent,
    events: Vec<Event>,
    out: &'a mut Rolled,
    st: &'a State,
}

impl One<'_> {
    fn event(&mut self, kind: Kind, message: String) {
        tracing::info!(agent = %self.a.key, event = kind.as_str(), "{message}");
        self.events.push(Event::new(kind, message).agent(&self.a.key));
    }

    /// A change of the template in the CP item starts a rollout (a change of `revision`
    /// alone only renames the target's revision).
    fn cp_change(&mut self, r: &mut Option<Rollout>) {
        let Some(old) = self.snap.old_agents.as_ref().and_then(|l| find_agent(l, &self.a.key)) else { return };
        let restart = r.as_ref().map_or(0, |r| r.target.restart);
        let (was, now) = (Template::of(old, restart), Template::of(self.a, restart));
        if !was.same(&now) {
            let image = now.executor.image.clone().unwrap_or_else(|| "the kind's image".into());
            self.start(r, was, now);
            self.event(Kind::RolloutStarted, format!("the CP changed the template (image {image}, revision {})", self.a.revision));
        } else if let Some(r) = r.as_mut().filter(|r| r.target.same(&now) && r.target.revision != now.revision) {
            Arc::make_mut(&mut r.target).revision = now.revision;
        }
    }

    /// Makes `to` the target: a new rollout from `from` (the template the replicas run), or
    /// one superseding the rollout under way.
    fn start(&mut self, r: &mut Option<Rollout>, from: Template, to: Template) {
        let now = self.snap.now;
        let (policy, policy_error) = rule::policy(self.a.rollout(), &self.ctx.cfg.rollout);
        if let Some(e) = &policy_error {
            tracing::warn!(agent = %self.a.key, problem = %e, "invalid rollout policy");
        }
        let to = Arc::new(to);
        match r {
            Some(x) if x.state != RolloutState::Complete => {
                let old = std::mem::replace(&mut x.target, to);
                let known = x.previous.iter().chain(x.older.iter()).any(|t| t.same(&old));
                if !known && x.nodes.iter().any(|s| s.on == old.id()) {
                    x.older.push(old);
                }
            }
            Some(x) => {
                let old = std::mem::replace(&mut x.target, to);
                x.nodes = self.seed(old.id());
                x.previous = Some(old);
                x.older.clear();
            }
            None => {
                let from = Arc::new(from);
                *r = Some(Rollout {
                    agent: self.a.key.clone(),
                    state: RolloutState::Progressing,
                    target: to,
                    nodes: self.seed(from.id()),
                    previous: Some(from),
                    older: Vec::new(),
                    paused: false,
                    policy: policy.clone(),
                    policy_error: None,
                    failed: Vec::new(),
                    counts: Default::default(),
                    started_ms: now,
                    changed_ms: now,
                    message: None,
                });
            }
        }
        let x = r.as_mut().expect("set above");
        x.state = RolloutState::Progressing;
        x.policy = policy;
        x.policy_error = policy_error;
        x.failed.clear();
        x.started_ms = now;
        x.changed_ms = now;
        x.message = None;
    }

    /// Every node the agent is bound to, on template `on`.
    fn seed(&self, on: SpecId) -> Vec<NodeStep> {
        let nodes: BTreeSet<&Id> = self.placed.outcome.bindings.of_agent(&self.a.key).map(|(_, n)| n).collect();
        nodes
            .into_iter()
            .map(|n| NodeStep { node: n.clone(), on, stepped_ms: 0, ready_since_ms: 0, restarts: 0 })
            .collect()
    }

    /// One look at a rollout that is not complete: its slots, the step rule, and what it
    /// decided applied.
    fn evaluate(&mut self, r: &mut Rollout) {
        if r.state == RolloutState::Complete {
            return;
        }
        let now = self.snap.now;
        let gathered = slots::gather(self, r);
        let desired = self.a.desired_replicas();
        let budget = r.policy.max_unavailable.budget(desired);
        let input = rule::Input {
            slots: &gathered.slots,
            desired,
            budget,
            canary: r.policy.canary,
            stepping: r.state == RolloutState::Progressing && !r.paused,
        };
        let decision = rule::decide(&input);
        let target = r.target.id();
        match decision {
            Decision::Halt { slot, reason } if matches!(r.state, RolloutState::Progressing) => {
                let (node, replica) = gathered.who[slot].clone();
                self.halt(r, node, replica, reason);
            }
            Decision::Complete => {
                r.state = RolloutState::Complete;
                r.nodes.clear();
                r.older.clear();
                r.failed.clear();
                r.changed_ms = now;
                let image = r.target.executor.image.clone().unwrap_or_default();
                self.event(Kind::RolloutCompleted, format!("every replica runs template {target} ({image}) and is ready"));
            }
            Decision::Step(steps) => {
                for i in steps {
                    let (node, _) = gathered.who[i].clone();
                    self.step(r, &node, target);
                }
                r.changed_ms = now;
            }
            _ => {}
        }
        let updated = match r.state {
            RolloutState::Complete => gathered.slots.iter().map(|s| s.replicas).sum(),
            _ => r.nodes.iter().filter(|s| s.on == target).map(|s| gathered.replicas_on(&s.node)).sum(),
        };
        let ready: u32 = gathered.slots.iter().map(|s| s.ready).sum();
        r.counts = crate::store::records::rollout::Counts {
            desired,
            updated,
            ready,
            unavailable: desired.saturating_sub(ready),
            budget,
        };
        if let Some(due) = gathered.due {
            self.out.due(due);
        }
    }

    fn step(&mut self, r: &mut Rollout, node: &Id, target: SpecId) {
        let now = self.snap.now;
        if let Ok(i) = r.nodes.binary_search_by(|s| s.node.cmp(node)) {
            r.nodes[i] = NodeStep { node: node.clone(), on: target, stepped_ms: now, ready_since_ms: 0, restarts: 0 };
        }
        self.out.nodes.insert(node.clone());
        let reps: Vec<u32> =
            self.placed.outcome.bindings.of_agent(&self.a.key).filter(|(_, n)| *n == node).map(|(r, _)| r).collect();
        let name = self.memo.name_id(node);
        let msg = format!("node {name}: replicas {reps:?} get template {target}");
        tracing::info!(agent = %self.a.key, event = "rollout_step", "{msg}");
        self.events.push(Event::new(Kind::RolloutStep, msg).agent(&self.a.key).node(node, &name));
    }

    /// The first failure: no further step; with `onFailure: revert` the updated replicas get
    /// the previous template back.
    fn halt(&mut self, r: &mut Rollout, node: Id, replica: u32, reason: String) {
        let now = self.snap.now;
        let name = self.memo.name_id(&node);
        r.failed = vec![FailedReplica { replica, node: node.to_string(), reason: reason.clone() }];
        r.changed_ms = now;
        let target = r.target.id();
        let revert = r.policy.on_failure == OnFailure::Revert && r.previous.is_some();
        let what = format!("replica {replica} on node {name} failed: {reason}");
        if revert {
            let back = r.previous.as_ref().expect("checked").id();
            for s in r.nodes.iter_mut().filter(|s| s.on == target) {
                *s = NodeStep { node: s.node.clone(), on: back, stepped_ms: now, ready_since_ms: 0, restarts: 0 };
                self.out.nodes.insert(s.node.clone());
            }
            r.state = RolloutState::Reverted;
            r.message = Some(format!("{what}; the updated replicas got template {back} back"));
            self.event(Kind::RolloutReverted, r.message.clone().unwrap_or_default());
        } else {
            r.state = RolloutState::Halted;
            r.message = Some(format!("{what}; no further replica gets template {target}"));
            self.event(Kind::RolloutHalted, r.message.clone().unwrap_or_default());
        }
        let _ = self.st;
    }
}
