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
use crate::store::{NodeStep, Rollout, State};
use fleet_api::rollout::{FailedReplica, OnFailure, RolloutState};
use std::collections::BTreeSet;
use std::sync::Arc;

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
        let decision = rule::decide(&input);
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
                self.event(
                    Kind::RolloutCompleted,
                    format!("every replica runs template {target} ({image}) and is ready"),
                );
            }
            Decision::Step(steps) => {
                for i in steps {
                    let (node, replica) = gathered.who[i].clone();
                    self.step(r, &node, replica, target);
                    // Being recreated now: not ready, whatever the last report said.
                    recreated += gathered.slots[i].ready;
                }
                r.changed_ms = now;
            }
            _ => {}
        }
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
