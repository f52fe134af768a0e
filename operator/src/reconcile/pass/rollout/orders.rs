//! An admin's order applied to an agent's rollout (docs/behaviour.md#rolling-out-a-change):
//! pause and resume, undo (the previous template becomes the target, as a new rollout) and
//! restart (a new restart stamp: every container recreated, in steps).

use super::one::One;
use crate::model::Template;
use crate::store::events::Kind;
use crate::store::rollouts::{Command, Order};
use crate::store::Rollout;
use fleet_api::rollout::RolloutState;
use std::sync::Arc;

impl One<'_> {
    pub fn order(&mut self, r: &mut Option<Rollout>, order: Order) {
        let by = order.by;
        match order.command {
            Command::Pause => {
                let x = self.complete_if_none(r);
                x.paused = true;
                x.changed_ms = self.snap.now;
                self.event(Kind::RolloutPaused, format!("paused by {by}: no further step"));
            }
            Command::Resume => {
                let Some(x) = r.as_mut() else { return };
                x.paused = false;
                x.changed_ms = self.snap.now;
                if matches!(x.state, RolloutState::Halted | RolloutState::Reverted) {
                    x.state = RolloutState::Progressing;
                    x.rare.failed.clear();
                    x.rare.message = None;
                    // Retried from where it stopped: the updated nodes get a new deadline.
                    let (target, now) = (x.target.id(), self.snap.now);
                    for s in Arc::make_mut(&mut x.nodes).iter_mut().filter(|s| s.on == target) {
                        s.stepped_ms = now;
                        s.ready_since_ms = 0;
                    }
                }
                self.event(Kind::RolloutResumed, format!("resumed by {by}"));
            }
            Command::Undo { to } => {
                let from = self.current(r);
                let image = to.executor.image.clone().unwrap_or_default();
                let id = to.id();
                self.start(r, from, to);
                self.event(Kind::RolloutStarted, format!("undo by {by}: back to template {id} ({image})"));
            }
            Command::Restart => {
                let from = self.current(r);
                let to = from.restarted();
                let id = to.id();
                self.start(r, from, to);
                self.event(Kind::RolloutStarted, format!("restart by {by}: template {id} recreates every replica"));
            }
        }
    }

    /// The template the agent's replicas are meant to run now: the rollout's target, else the
    /// agent's own.
    fn current(&self, r: &Option<Rollout>) -> Arc<Template> {
        match r {
            Some(x) => x.target.clone(),
            None => Arc::new(Template::of(self.a, 0)),
        }
    }

    /// The rollout, or a complete one of the agent's own template to hold a pause.
    fn complete_if_none<'r>(&self, r: &'r mut Option<Rollout>) -> &'r mut Rollout {
        r.get_or_insert_with(|| {
            let (policy, policy_error) =
                crate::reconcile::rules::rollout::policy(self.a.rollout().as_ref(), &self.ctx.cfg.rollout);
            Rollout::at_rest(self.a.key.clone(), Arc::new(Template::of(self.a, 0)), policy, policy_error, self.snap.now)
        })
    }
}
