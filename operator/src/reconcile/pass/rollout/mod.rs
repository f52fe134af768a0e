//! The rollout phase (docs/behaviour.md#rolling-out-a-change), after placement and before
//! the desired states: a change of an agent's template starts a rollout, admins' orders are
//! applied, and each rollout under way takes its steps by the step rule
//! (`rules::rollout`). The desired states then send each node the template its rollout
//! handed it. Only agents with a rollout under way, a change or an order are looked at: an
//! agent with none costs the pass nothing.

mod one;
mod orders;
mod rolled;
mod slots;

pub use rolled::Rolled;

use super::memo::Memo;
use super::place::Placed;
use super::plan::Plan;
use super::snapshot::Snapshot;
use crate::model::{Id, Shared, Template};
use crate::reconcile::work::Ctx;
use crate::store::db::{DbError, PassWrite};
use crate::store::rollouts::Pending;
use crate::store::{Rollout, State};
use fleet_api::rollout::RolloutState;
use one::One;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Rollouts looked at under one read lock of the registry; those whose counts or readiness
/// alone moved are then published at once, a batch at a time (`Store::refresh_rollouts`).
const BATCH: usize = 256;

/// Runs the phase: rows go to the plan, events to `placed.events` (a commit in the middle of
/// the phase takes those recorded so far, the pass's and the phase's, with its rows).
///
/// Rollouts whose stored part changed are committed and published as the phase goes,
/// `rollouts_at_once` at a time ([`crate::config::ROLLOUTS_AT_ONCE`], 2,048) with their
/// agents' orders, so the records they replace are let go as it goes: a fleet-wide change
/// steps nearly every rollout in every pass, and holding each new record beside the one it
/// replaces until the pass's own transaction doubled what the rollouts hold
/// (docs/performance.md#smaller-rollout-records-the-tenth-run). The last few are left to
/// the pass's transaction. Either way they commit before the desired bodies: a body derives
/// from the rollout that handed its node a template.
pub async fn roll(
    ctx: &Ctx,
    memo: &Memo,
    snap: &Snapshot,
    placed: &mut Placed,
    orders: Vec<Pending>,
    lingering: &[(Id, Id, u32)],
    plan: &mut Plan,
) -> Result<Rolled, DbError> {
    let mut phase = Phase {
        ctx,
        memo,
        snap,
        by_agent: HashMap::default(),
        lingering_on: HashMap::default(),
        templates: Shared::default(),
        out: Rolled::default(),
        stored: Stored::default(),
    };
    for o in orders {
        phase.by_agent.entry(o.0.clone()).or_default().push(o);
    }
    let mut keys: BTreeSet<Id> =
        ctx.store.read().rollouts().filter(|r| r.state != RolloutState::Complete).map(|r| r.agent.clone()).collect();
    keys.extend(phase.by_agent.keys().cloned());
    for (agent, node, replica) in lingering {
        phase.lingering_on.entry(agent).or_default().push((node, *replica));
    }
    if snap.replaced.is_some() {
        keys.extend(snap.changed_agents.iter().cloned());
    }
    let keys: Vec<Id> = keys.into_iter().collect();
    for batch in keys.chunks(BATCH) {
        let refreshed = phase.batch(batch, placed, plan);
        ctx.store.refresh_rollouts(refreshed);
        if phase.stored.rows.rollouts.len() >= ctx.cfg.rollouts_at_once.max(1) {
            let Stored { mut rows, publish } = std::mem::take(&mut phase.stored);
            rows.events = placed.events.take_recorded();
            ctx.store.commit_pass(&rows, Vec::new(), Vec::new(), publish, Vec::new()).await?;
        }
    }
    plan.rows.rollouts.append(&mut phase.stored.rows.rollouts);
    plan.rows.kv_delete.append(&mut phase.stored.rows.kv_delete);
    phase.out.unpublished = std::mem::take(&mut phase.stored.publish);
    Ok(phase.out)
}

/// What the phase carries from one batch to the next.
struct Phase<'a> {
    ctx: &'a Ctx,
    memo: &'a Memo,
    snap: &'a Snapshot,
    /// Admins' orders by agent.
    by_agent: HashMap<Id, Vec<Pending>>,
    lingering_on: HashMap<&'a Id, Vec<(&'a Id, u32)>>,
    templates: Shared,
    out: Rolled,
    stored: Stored,
}

impl Phase<'_> {
    /// One batch under one read lock of the registry (let go before the phase commits);
    /// returns the rollouts whose counts or readiness alone moved.
    fn batch(&mut self, batch: &[Id], placed: &mut Placed, plan: &mut Plan) -> Vec<(Id, Arc<Rollout>)> {
        let st = self.ctx.store.read();
        batch.iter().filter_map(|key| self.one(&st, key.clone(), placed, plan)).collect()
    }

    /// One agent: the CP's change, the admins' orders and the step rule applied to its
    /// rollout, and what changed put where it goes.
    fn one(&mut self, st: &State, key: Id, placed: &mut Placed, plan: &mut Plan) -> Option<(Id, Arc<Rollout>)> {
        // The stored record, shared; the copy the phase works on shares its node list until
        // a step or a readiness moves.
        let before = st.rollout(&key).cloned();
        let agent_orders = self.by_agent.remove(&key).unwrap_or_default();
        for (agent, value, _) in &agent_orders {
            let order = format!("{}{agent}", crate::store::rollouts::ORDER_PREFIX);
            self.stored.rows.kv_delete.push((order, Some(value.clone())));
        }
        let Some(a) = self.memo.agent(&key).filter(|a| a.placed_spec().is_some()) else {
            if before.is_some() {
                self.let_go(key.clone());
            }
            if self.snap.replaced.as_ref().is_some_and(|r| r.was_listed(&key)) && self.memo.agent(&key).is_none() {
                plan.rows.kv_delete.push((Rollout::key(&key), None));
            }
            return None;
        };
        let lingering = self.lingering_on.get(&key).cloned().unwrap_or_default();
        let mut one = One {
            ctx: self.ctx,
            memo: self.memo,
            snap: self.snap,
            placed: &*placed,
            a,
            lingering,
            events: Vec::new(),
            out: &mut self.out,
            templates: &mut self.templates,
            st,
        };
        let mut r = before.as_deref().cloned();
        one.cp_change(&mut r);
        for (_, _, order) in agent_orders {
            one.order(&mut r, order);
        }
        if let Some(r) = &mut r {
            one.evaluate(r);
        }
        for e in std::mem::take(&mut one.events) {
            placed.events.push(e);
        }
        if r.as_ref() == before.as_deref() {
            return None;
        }
        let mut r = r?;
        r.rare.tidy();
        let keep = r.worth_keeping(&Template::of(a, 0));
        match before.as_deref() {
            // Counts and readiness change with every report; they are stored with the next
            // change that matters (a restart recomputes them from the reports).
            Some(b) if b.same_stored(&r) => match keep {
                true => return Some((key, Arc::new(r))),
                false => self.let_go(key),
            },
            _ => {
                let r = Arc::new(r);
                self.stored.rows.rollouts.push(r.clone());
                self.stored.publish.push((key.clone(), keep.then(|| r.clone())));
                self.out.changed.insert(key, keep.then_some(r));
            }
        }
        None
    }

    /// The agent's rollout goes from memory when the phase's rows commit.
    fn let_go(&mut self, key: Id) {
        self.stored.publish.push((key.clone(), None));
        self.out.changed.insert(key, None);
    }
}

/// Rows of changed rollouts and their orders not yet committed, and what the registry gets
/// when they are (a rollout, or `None` to let one go).
#[derive(Default)]
struct Stored {
    rows: PassWrite,
    publish: Vec<(Id, Option<Arc<Rollout>>)>,
}
