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
use crate::store::rollouts::Pending;
use crate::store::Rollout;
use fleet_api::rollout::RolloutState;
use one::One;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

/// Rollouts looked at under one read lock of the registry; those whose counts or readiness
/// alone moved are then published at once, a batch at a time (`Store::refresh_rollouts`).
const BATCH: usize = 256;

/// Runs the phase: rows and events go to the plan and `placed.events`.
pub fn roll(
    ctx: &Ctx,
    memo: &Memo,
    snap: &Snapshot,
    placed: &mut Placed,
    orders: Vec<Pending>,
    lingering: &[(Id, Id)],
    plan: &mut Plan,
) -> Rolled {
    let mut out = Rolled::default();
    let mut templates = Shared::default();
    let mut by_agent: HashMap<Id, Vec<Pending>> = HashMap::default();
    for o in orders {
        by_agent.entry(o.0.clone()).or_default().push(o);
    }
    let mut keys: BTreeSet<Id> =
        ctx.store.read().rollouts().filter(|r| r.state != RolloutState::Complete).map(|r| r.agent.clone()).collect();
    keys.extend(by_agent.keys().cloned());
    let mut lingering_on: HashMap<&Id, Vec<&Id>> = HashMap::default();
    for (agent, node) in lingering {
        lingering_on.entry(agent).or_default().push(node);
    }
    if snap.replaced.is_some() {
        keys.extend(snap.changed_agents.iter().cloned());
    }
    let keys: Vec<Id> = keys.into_iter().collect();
    for batch in keys.chunks(BATCH) {
        let st = ctx.store.read();
        let mut refreshed = Vec::new();
        for key in batch {
            let key = key.clone();
            // The stored record, shared; the copy the phase works on shares its node list
            // until a step or a readiness moves.
            let before = st.rollout(&key).cloned();
            let agent_orders = by_agent.remove(&key).unwrap_or_default();
            for (agent, value, _) in &agent_orders {
                plan.rows
                    .kv_delete
                    .push((format!("{}{agent}", crate::store::rollouts::ORDER_PREFIX), Some(value.clone())));
            }
            let Some(a) = memo.agent(&key).filter(|a| a.placed_spec().is_some()) else {
                if before.is_some() {
                    out.changed.insert(key.clone(), None);
                }
                if snap.replaced.as_ref().is_some_and(|r| r.was_listed(&key)) && memo.agent(&key).is_none() {
                    plan.rows.kv_delete.push((Rollout::key(&key), None));
                }
                continue;
            };
            let lingering = lingering_on.get(&key).cloned().unwrap_or_default();
            let mut one = One {
                ctx,
                memo,
                snap,
                placed: &*placed,
                a,
                lingering,
                events: Vec::new(),
                out: &mut out,
                templates: &mut templates,
                st: &st,
            };
            let mut r = before.as_deref().cloned();
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
            if r.as_ref() == before.as_deref() {
                continue;
            }
            let Some(r) = r else { continue };
            let keep = r.worth_keeping(&Template::of(a, 0));
            match before.as_deref() {
                // Counts and readiness change with every report; they are stored with the
                // next change that matters (a restart recomputes them from the reports).
                Some(b) if b.same_stored(&r) => match keep {
                    true => refreshed.push((key, Arc::new(r))),
                    false => drop(out.changed.insert(key, None)),
                },
                _ => {
                    let r = Arc::new(r);
                    plan.rows.rollouts.push(r.clone());
                    out.changed.insert(key, keep.then_some(r));
                }
            }
        }
        drop(st);
        ctx.store.refresh_rollouts(refreshed);
    }
    out
}
