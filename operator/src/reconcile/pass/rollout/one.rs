//! One agent's share of the rollout phase: a template change from the CP, the step rule's
//! decision applied (steps, the halt or revert, the end), and the events that say so.

use super::rolled::Rolled;
use super::slots::{self, Sources};
use crate::model::{Agent, Id, Shared, SpecId, Template};
use crate::reconcile::pass::memo::Memo;
use crate::reconcile::pass::place::Placed;
use crate::reconcile::pass::snapshot::Snapshot;
use crate::reconcile::rules::rollout::{self as rule, Decision};
use crate::reconcile::work::Ctx;
use crate::store::events::{Event, Kind};
use crate::store::records::rollout::{WaitReason, Waiting};
use crate::store::{NodeStep, Rollout, State};
use fleet_api::rollout::{FailedReplica, OnFailure, RolloutState};
use std::collections::BTreeSet;
use std::sync::Arc;

/// At most this many waiting replicas are kept for the view: a fleet-wide rollout outside its
/// windows would otherwise keep one a replica.
const MAX_WAITING_SHOWN: usize = 8;

/// One agent's share of the phase.
pub struct One<'a> {
    pub ctx: &'a Ctx,
    pub memo: &'a Memo,
    pub snap: &'a Snapshot,
    pub placed: &'a Placed,
    pub a: &'a Agent,
    /// The replicas of the agent a drain moved that still run on their old node: (node, replica).
    pub lingering: Vec<(&'a Id, u32)>,
    pub events: Vec<Event>,
    pub out: &'a mut Rolled,
    /// The templates the phase made so far, for rollouts to share.
    pub templates: &'a mut Shared,
    pub st: &'a State,
}

impl One<'_> {
    pub fn event(&mut self, kind: Kind, message: String) {
        tracing::info!(agent = %self.a.key, event = kind.as_str(), "{message}");
        self.events.push(Event::new(kind, message).agent(&self.a.key));
    }

    /// A change of the template in the CP item starts a rollout (a change of `revision`
    /// alone only renames the target's revision). A rollout that already has the new template
    /// as its target goes on as it stands: a leader that reloaded the store after the pass
    /// that started it, but before the list that changed was stored, sees the change again.
    pub fn cp_change(&mut self, r: &mut Option<Rollout>) {
        let Some(replaced) = &self.snap.replaced else { return };
        let restart = r.as_ref().map_or(0, |r| r.target.restart);
        let now = Template::of(self.a, restart);
        let was = match replaced.get(&self.a.key) {
            // Not listed at the last committed pass: a new agent has nothing to roll from.
            Some(None) => return,
            Some(Some(was)) if restart == 0 => was.template.clone(),
            Some(Some(was)) => Arc::new(was.template.with_restart(restart)),
            // Unchanged since then.
            None => Arc::new(now.clone()),
        };
        let already = r.as_ref().is_some_and(|r| r.target.same(&now));
        if !was.same(&now) && !already {
            let image = now.executor.image.clone().map_or_else(|| "the kind's image".into(), |i| format!("image {i}"));
            self.start(r, was, now);
            self.event(
                Kind::RolloutStarted,
                format!("the CP changed the template ({image}, revision {})", self.a.revision),
            );
        } else if let Some(r) = r.as_mut().filter(|r| r.target.same(&now) && r.target.revision != now.revision) {
            Arc::make_mut(&mut r.target).revision = now.revision;
        }
    }

    /// Makes `to` the target: a new rollout from `from` (the template the replicas run), or
    /// one superseding the rollout under way.
    pub fn start(&mut self, r: &mut Option<Rollout>, from: Arc<Template>, to: Template) {
        let now = self.snap.now;
        let (policy, policy_error) = rule::policy(self.a.rollout().as_ref(), &self.ctx.cfg.rollout);
        if let Some(e) = &policy_error {
            tracing::warn!(agent = %self.a.key, problem = %e, "invalid rollout policy");
        }
        let to = self.templates.share(to);
        match r {
            Some(x) if x.state != RolloutState::Complete => {
                let old = std::mem::replace(&mut x.target, to);
                let known = x.previous.iter().chain(x.rare.older.iter()).any(|t| t.same(&old));
                if !known && x.nodes.iter().any(|s| s.on == old.id()) {
                    x.rare.older.push(old);
                }
            }
            Some(x) => {
                let old = std::mem::replace(&mut x.target, to);
                x.nodes = self.seed(old.id());
                x.previous = Some(old);
                x.rare.older.clear();
            }
            None => {
                let from = self.templates.share_arc(from);
                let mut x = Rollout::at_rest(self.a.key.clone(), to, policy.clone(), None, now);
                x.nodes = self.seed(from.id());
                x.previous = Some(from);
                *r = Some(x);
            }
        }
        let x = r.as_mut().expect("set above");
        x.state = RolloutState::Progressing;
        x.policy = policy;
        x.rare.policy_error = policy_error;
        x.rare.failed.clear();
        x.rare.message = None;
        x.started_ms = now;
        x.changed_ms = now;
    }

    /// Every replica the agent has bound, on template `on`.
    fn seed(&self, on: SpecId) -> Arc<[NodeStep]> {
        let bound: BTreeSet<(&Id, u32)> =
            self.placed.outcome.bindings.of_agent(&self.a.key).map(|(r, n)| (n, r)).collect();
        bound.into_iter().map(|(n, r)| NodeStep::new(n.clone(), r, on, 0)).collect()
    }

    /// One look at a rollout that is not complete: its slots, the step rule, and what it
    /// decided applied.
    pub fn evaluate(&mut self, r: &mut Rollout) {
        if r.state == RolloutState::Complete {
            return;
        }
        let now = self.snap.now;
        let lingering = &self.lingering;
        let sources =
            Sources { a: self.a, memo: self.memo, st: self.st, outcome: &self.placed.outcome, lingering, now };
        let gathered = slots::gather(&sources, r);
        for node in &gathered.adopted {
            tracing::info!(agent = %self.a.key, node = %self.memo.name(node), "the node runs the rollout's target already: taken as stepped");
            self.out.nodes.insert(node.clone());
        }
        let desired = self.a.desired_replicas();
        let budget = r.policy.max_unavailable.budget(desired);
        let input = rule::Input {
            slots: &gathered.slots,
            desired,
            budget,
            canary: r.policy.canary,
            stepping: r.state == RolloutState::Progressing && !r.paused,
        };
        let (decision, held) = rule::decide_held(&input);
        let stepped = matches!(&decision, Decision::Step(s) if !s.is_empty());
        let mut recreated = 0;
        tracing::debug!(agent = %self.a.key, slots = ?gathered.slots, ?decision, "rollout step rule");
        let target = r.target.id();
        match decision {
            Decision::Halt { slot, reason } if matches!(r.state, RolloutState::Progressing) => {
                let (node, replica) = gathered.who[slot].clone();
                self.halt(r, node, replica, reason);
            }
            Decision::Complete => {
                r.state = RolloutState::Complete;
                r.nodes = Arc::default();
                r.rare.older.clear();
                r.rare.failed.clear();
                r.changed_ms = now;
                let image = r.target.executor.image.clone().unwrap_or_else(|| "the kind's image".into());
                let ready: u32 = gathered.slots.iter().map(|s| s.ready).sum();
                let message = match desired.saturating_sub(ready) {
                    0 => format!("every replica runs template {target} ({image}) and is ready"),
                    n => format!(
                        "every placed replica runs template {target} ({image}); {n} of {desired} not ready or not placed (fleetctl why {})",
                        self.a.key
                    ),
                };
                self.event(Kind::RolloutCompleted, message);
            }
            Decision::Step(steps) => {
                for &i in &steps {
                    let (node, replica) = gathered.who[i].clone();
                    if held.expired.contains(&i) {
                        self.hold_expired(&node, replica, r.policy.max_busy_seconds);
                    }
                    self.step(r, &node, replica, target);
                    // Being recreated now: not ready, whatever the last report said.
                    recreated += gathered.slots[i].ready;
                }
                r.changed_ms = now;
            }
            _ => {}
        }
        self.note_waits(r, &gathered, &held, stepped);
        let updated = match r.state {
            RolloutState::Complete => gathered.slots.iter().map(|s| s.replicas).sum(),
            _ => r.updated(),
        };
        let ready: u32 = gathered.slots.iter().map(|s| s.ready).sum::<u32>() - recreated;
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

    /// What the next steps wait for, as the view shows it and when to look again: busy
    /// replicas (a wait's hold counted from its first pass, with an event then) and closed
    /// windows (the rollout `waiting_for_window` when nothing else moved).
    fn note_waits(&mut self, r: &mut Rollout, g: &slots::Gathered, held: &rule::Held, stepped: bool) {
        let mut waiting = Vec::new();
        for &i in &held.busy {
            let (node, replica) = g.who[i].clone();
            let w = g.waits[i];
            let until = w.busy_until.unwrap_or(w.hold_ends).min(w.hold_ends);
            self.start_busy_wait(r, &node, replica, until);
            self.out.due(until);
            if waiting.len() < MAX_WAITING_SHOWN {
                waiting.push(Waiting { node, replica, reason: WaitReason::Busy, until_ms: until });
            }
        }
        let opens = held.window.iter().filter_map(|&i| g.waits[i].opens).min();
        for &i in held.window.iter().take(MAX_WAITING_SHOWN.saturating_sub(waiting.len())) {
            let (node, replica) = g.who[i].clone();
            let until = g.waits[i].opens.unwrap_or(i64::MAX);
            waiting.push(Waiting { node, replica, reason: WaitReason::Window, until_ms: until });
        }
        if let Some(at) = opens {
            self.out.due(at);
        }
        r.rare.window_opens_ms = opens.filter(|_| !stepped && held.busy.is_empty());
        r.rare.waiting = waiting;
    }

    /// A step waits for a busy replica: from now, its hold runs (the step's `ready_since_ms`),
    /// and an event says so once.
    fn start_busy_wait(&mut self, r: &mut Rollout, node: &Id, replica: u32, until: i64) {
        let Ok(i) = r.find(node, replica) else { return };
        if r.nodes[i].ready_since_ms > 0 {
            return;
        }
        Arc::make_mut(&mut r.nodes)[i].ready_since_ms = self.snap.now;
        let name = self.memo.name_id(node);
        let msg = format!(
            "the rollout waits for replica {replica} on node {name}, busy, until {} at the latest",
            crate::clock::rfc3339_ms(until)
        );
        tracing::info!(agent = %self.a.key, event = "disruption_waiting", "{msg}");
        self.events
            .push(Event::new(Kind::DisruptionWaiting, msg).agent(&self.a.key).node(node, &name).replica(replica));
    }

    /// A busy replica is stepped: its hold is over.
    fn hold_expired(&mut self, node: &Id, replica: u32, max_busy: u32) {
        let name = self.memo.name_id(node);
        let msg = format!(
            "replica {replica} on node {name} is still busy after maxBusySeconds ({max_busy} s): it is updated now"
        );
        tracing::info!(agent = %self.a.key, event = "busy_hold_expired", "{msg}");
        self.events.push(Event::new(Kind::BusyHoldExpired, msg).agent(&self.a.key).node(node, &name).replica(replica));
    }

    fn step(&mut self, r: &mut Rollout, node: &Id, replica: u32, target: SpecId) {
        let now = self.snap.now;
        if let Ok(i) = r.find(node, replica) {
            Arc::make_mut(&mut r.nodes)[i] = NodeStep::new(node.clone(), replica, target, now);
        }
        self.out.nodes.insert(node.clone());
        self.ctx.metrics.rollout_replicas_updated.inc();
        let name = self.memo.name_id(node);
        let msg = format!("node {name}: replica {replica} gets template {target}");
        tracing::info!(agent = %self.a.key, event = "rollout_step", "{msg}");
        self.events.push(Event::new(Kind::RolloutStep, msg).agent(&self.a.key).node(node, &name).replica(replica));
    }

    /// The first failure: no further step; with `onFailure: revert` the updated replicas get
    /// the previous template back.
    fn halt(&mut self, r: &mut Rollout, node: Id, replica: u32, reason: String) {
        let now = self.snap.now;
        let name = self.memo.name_id(&node);
        r.rare.failed = vec![FailedReplica { replica, node: node.to_string(), reason: reason.clone() }];
        r.changed_ms = now;
        let target = r.target.id();
        let revert = r.policy.on_failure == OnFailure::Revert && r.previous.is_some();
        let what = format!("replica {replica} on node {name} failed: {reason}");
        if revert {
            let back = r.previous.as_ref().expect("checked").id();
            for s in Arc::make_mut(&mut r.nodes).iter_mut().filter(|s| s.on == target) {
                *s = NodeStep { on: back, stepped_ms: now, ready_since_ms: 0, restarts: 0, ..s.clone() };
                self.out.nodes.insert(s.node.clone());
            }
            r.state = RolloutState::Reverted;
            r.rare.message = Some(format!("{what}; the updated replicas got template {back} back"));
            self.event(Kind::RolloutReverted, r.rare.message.clone().unwrap_or_default());
        } else {
            r.state = RolloutState::Halted;
            r.rare.message = Some(format!("{what}; no further replica gets template {target}"));
            self.event(Kind::RolloutHalted, r.rare.message.clone().unwrap_or_default());
        }
    }
}
