//! The registry's writers for what a pass and the workers publish: desired states (the
//! pass's, another replica's, one read back), the placement outcome and items, drains, the
//! agent list, and the statuses wanted and sent.

use super::state::State;
use crate::model::{AgentList, Id};
use crate::store::kept::{Outcome, Placements, Sent};
use crate::store::records::{DesiredRec, DrainProgress, Linger, Rollout};
use std::sync::Arc;

impl State {
    /// A committed pass's desired states and the hashes of their inputs.
    pub(in crate::store) fn put_desired(&mut self, desired: &mut Vec<(Id, DesiredRec)>, hashes: Vec<(Id, u64)>) {
        for (node, rec) in desired.drain(..) {
            self.desired.insert(node, rec);
        }
        self.desired_hashes.extend(hashes);
    }

    /// A stored desired state newer than the one held (another replica's): taken, and
    /// `true`; an older one, or one of an unknown node, is ignored. A generation never goes
    /// backwards here.
    pub(in crate::store) fn follow_desired(&mut self, node: &Id, generation: u64, agents: &str) -> bool {
        if !self.nodes.contains_key(node) || self.desired.get(node).is_some_and(|d| d.generation >= generation) {
            return false;
        }
        self.desired.insert(node.clone(), DesiredRec::new(generation, agents));
        true
    }

    /// The body of `node`'s current generation, read back from the database because it was
    /// let go: `Err(held generation)` when the stored one is another.
    pub(in crate::store) fn read_back(
        &mut self,
        node: &Id,
        stored: Option<(u64, &str)>,
    ) -> Result<Option<&DesiredRec>, u64> {
        let Some(rec) = self.desired.get_mut(node) else { return Ok(None) };
        if !rec.is_held() {
            match stored {
                Some((g, agents)) if g == rec.generation => *rec = DesiredRec::new(g, agents),
                _ => return Err(rec.generation),
            }
        }
        Ok(Some(rec))
    }

    /// A new agent list (in key order) and its ETag; returns the old list, for the caller to
    /// drop outside the lock.
    pub(in crate::store) fn put_agents(&mut self, agents: AgentList, etag: Option<String>) -> AgentList {
        self.agents_etag = etag;
        self.set_agents(agents)
    }

    /// The CP's ETag moved over the same agents: the list held stays.
    pub(in crate::store) fn put_agents_etag(&mut self, etag: Option<String>) {
        self.agents_etag = etag;
    }

    /// What a pass publishes after its nodes are woken; returns the items it replaced (to
    /// drop outside the lock) and the agents whose wanted status the CP does not have.
    pub(in crate::store) fn publish(
        &mut self,
        outcome: Option<Arc<Outcome>>,
        placements: Option<Placements>,
        drains: Option<impl IntoIterator<Item = (Id, DrainProgress)>>,
        reset_statuses: bool,
        statuses: Vec<(Id, Option<Sent>)>,
    ) -> (Option<Placements>, Vec<Id>) {
        if let Some(outcome) = outcome {
            self.outcome = outcome;
        }
        let replaced = placements.map(|p| std::mem::replace(&mut self.placements, p));
        if let Some(d) = drains {
            self.drains = d.into_iter().collect();
        }
        (replaced, self.want_statuses(reset_statuses, statuses))
    }

    /// The mark of a store older than the fleet, as the pass stored it.
    pub(in crate::store) fn set_catch_up(&mut self, mark: Option<crate::store::records::catch_up::CatchUp>) {
        self.catch_up = mark;
    }

    /// The rollouts a pass changed: `None` lets one go.
    pub(in crate::store) fn put_rollouts(&mut self, changed: Vec<(Id, Option<Arc<Rollout>>)>) {
        for (agent, r) in changed {
            match r {
                Some(r) => drop(self.rollouts.insert(agent, r)),
                None => drop(self.rollouts.remove(&agent)),
            }
        }
    }

    /// The lingering replicas a pass started (`Some`) or ended (`None`).
    pub(in crate::store) fn put_lingering(&mut self, changed: Vec<((Id, u32), Option<Linger>)>) {
        for (key, l) in changed {
            match l {
                Some(l) => drop(self.lingering.insert(key, l)),
                None => drop(self.lingering.remove(&key)),
            }
        }
    }

    /// Records the statuses a pass computed; returns the agents to send one for.
    fn want_statuses(&mut self, reset: bool, statuses: Vec<(Id, Option<Sent>)>) -> Vec<Id> {
        if reset {
            self.statuses_want.clear();
        }
        let mut to_send = Vec::new();
        for (key, body) in statuses {
            match body {
                Some(want) if self.statuses_sent.get(&key) != Some(&want) => {
                    to_send.push(key.clone());
                    self.statuses_want.insert(key, want);
                }
                _ => {
                    self.statuses_want.remove(&key);
                }
            }
        }
        to_send
    }

    /// The CP accepted `sent` as the agent's status, derived while the pass wanted `wanted`:
    /// that want is settled unless a later pass set another. Returns the phase before.
    pub(in crate::store) fn status_accepted(&mut self, agent: &Id, sent: Sent, wanted: Sent) -> Option<Sent> {
        if self.statuses_want.get(agent).is_some_and(|w| *w == sent || *w == wanted) {
            self.statuses_want.remove(agent);
        }
        self.statuses_sent.insert(agent.clone(), sent)
    }

    /// The unsettled-status marks a committed pass stored and cleared.
    pub(in crate::store) fn put_unsettled(&mut self, marks: crate::store::kept::Marks) {
        for agent in &marks.clear {
            self.unsettled.remove(agent);
        }
        self.unsettled.extend(marks.set);
        if self.unsettled.capacity() > 256 && self.unsettled.capacity() > 4 * self.unsettled.len() {
            self.unsettled.shrink_to(self.unsettled.len() * 2);
        }
    }

    /// Sets a wanted status without a pass (tests only).
    #[cfg(test)]
    pub(in crate::store) fn want_status(&mut self, agent: &Id, sent: Sent) {
        self.statuses_want.insert(agent.clone(), sent);
    }
}
