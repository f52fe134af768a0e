//! What the pass keeps from one run to the next, so that it recomputes only what the changes
//! since then touch, and the rolling resync that re-derives a slice of it from the registry
//! every pass (docs/behaviour.md#the-reconcile-pass: a change that was never recorded is healed within [`RESYNC`]). The
//! first pass (and the one after a failed pass) starts from an empty memo and computes
//! everything.

use super::gauges::Gauges;
use super::replaced::Replaced;
use crate::model::{Agent, AgentList, Id, SpecId};
use crate::reconcile::rules::derive::{facts_of, PerNode};
use crate::reconcile::rules::placement::NodeFacts;
use crate::store::kept::Listed;
use crate::store::{AgentIndex, Changes, State};
use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Every node and agent is derived again from the registry at least this often, a slice per
/// pass in proportion to the time since the last pass.
pub const RESYNC: Duration = Duration::from_secs(300);

#[derive(Default)]
pub struct Memo {
    pub primed: bool,
    /// The agent list the last pass saw (in key order), and the registry's index of it.
    pub agents: AgentList,
    pub index: AgentIndex,
    /// What the placement items say of each agent of `agents`, in its order: the published
    /// items share it until the list changes.
    pub listed: Arc<[Listed]>,
    /// What the agents changed since the last committed pass were then; set by a pass that
    /// saw a new list, cleared once one commits. A pass that fails leaves it for the next.
    pub replaced: Option<Arc<Replaced>>,
    /// Each agent's [`agent_fingerprint`](crate::reconcile::rules::desired::agent_fingerprint), at its position
    /// in `agents` (a map by key would be ~0.8 MB at 20,000 agents).
    /// With it, the id of the agent's own template (docs/behaviour.md#rolling-out-a-change).
    pub fingerprints: Vec<(u64, SpecId)>,
    /// Every node's placement facts as of the last pass, online state included.
    pub facts: Vec<NodeFacts>,
    pub fact_at: HashMap<Id, usize>,
    pub per_node: PerNode,
    /// No online node goes offline before this instant (ms); `i64::MAX`: none online.
    pub next_check: i64,
    pub gauges: Gauges,
    /// Where the rolling resync continues, and when the last pass ran (ms).
    resync_nodes: usize,
    resync_agents: usize,
    pub last_pass_ms: i64,
}

impl Memo {
    /// A memo to start over from (a new term, a failed pass, a deleted node), knowing only
    /// the agent list the last committed pass worked from: a template change the CP made since
    /// is still a change to the next pass, which starts its rollout. Started from nothing, the
    /// pass would take every agent for new and the change would go unseen.
    pub fn after(applied: AgentList) -> Memo {
        Memo { agents: applied, ..Memo::default() }
    }

    /// An empty memo that keeps the agent list and what the passes since the last committed
    /// one replaced of it: the changes are still changes to the next pass.
    pub fn start_over(&mut self) -> Memo {
        Memo { agents: std::mem::take(&mut self.agents), replaced: self.replaced.take(), ..Memo::default() }
    }

    pub fn node(&self, id: &Id) -> Option<&NodeFacts> {
        self.fact_at.get(id).map(|&i| &self.facts[i])
    }

    pub fn name<'a>(&'a self, id: &'a Id) -> &'a str {
        self.node(id).map(|f| &*f.name).unwrap_or(id)
    }

    /// The node's name as the registry's own string (an event per replica keeps one).
    pub fn name_id(&self, id: &Id) -> Id {
        self.node(id).map_or_else(|| id.clone(), |f| f.name.clone())
    }

    pub fn agent(&self, key: &str) -> Option<&Agent> {
        self.index.get(key).and_then(|&i| self.agents.get(i))
    }

    /// The fingerprint of the agent of this key.
    pub fn fingerprint(&self, key: &str) -> Option<u64> {
        self.index.get(key).and_then(|&i| self.fingerprints.get(i)).map(|p| p.0)
    }

    /// The id of the agent's own template, as the CP describes it.
    pub fn own_spec(&self, key: &str) -> Option<SpecId> {
        self.index.get(key).and_then(|&i| self.fingerprints.get(i)).map(|p| p.1)
    }

    /// How many of `len` items the resync re-derives in a pass at `now` (ms): all of them
    /// every [`RESYNC`], at least one a pass.
    pub fn slice(&self, len: usize, now: i64) -> usize {
        let elapsed = if self.primed { (now - self.last_pass_ms).max(0) } else { 0 };
        ((len as i64 * elapsed / RESYNC.as_millis() as i64) as usize + 1).min(len)
    }

    /// Loads every node's facts (offline, so every online node counts as a flip): the start
    /// of a full pass. Credentials are not copied: the pass reads them from the registry,
    /// where each change is recorded with it.
    pub fn load(&mut self, st: &State) {
        self.facts = st.nodes().map(|n| facts_of(n, false)).collect();
        self.fact_at = self.facts.iter().enumerate().map(|(i, f)| (f.id.clone(), i)).collect();
    }

    /// Brings the facts the recorded changes name up to date.
    pub fn update(&mut self, st: &State, changes: &Changes) {
        // Room for the registry's nodes and no more: grown by doubling, a table of 10,000
        // nodes' facts would hold room for 16,384 (~1.3 MB).
        if st.node_count() > self.facts.capacity() {
            self.facts.reserve_exact(st.node_count() - self.facts.len());
        }
        for id in &changes.facts {
            let Some(n) = st.node(id) else { continue };
            match self.fact_at.get(id) {
                // The online state is kept, so a node that comes back with new facts still
                // counts as a flip.
                Some(&i) => self.facts[i] = facts_of(n, self.facts[i].online),
                None => {
                    self.fact_at.insert(id.clone(), self.facts.len());
                    self.facts.push(facts_of(n, false));
                }
            }
        }
    }

    /// The nodes' share of the resync: `count` nodes from where the last pass stopped are
    /// read again from the registry. Facts that differ from the memo are added to `changes` as
    /// if recorded (so placement, desired states, PAT work and statuses follow); each node
    /// also gets its liveness and gauge checked.
    pub fn resync_nodes(&mut self, st: &State, count: usize, changes: &mut Changes) {
        for _ in 0..count {
            self.resync_nodes = (self.resync_nodes + 1) % self.facts.len();
            let f = &self.facts[self.resync_nodes];
            let Some(n) = st.node(&f.id) else { continue };
            if facts_of(n, f.online) != *f {
                changes.facts.insert(f.id.clone());
            }
            changes.seen.insert(f.id.clone());
        }
    }

    /// The agents' share of the resync: what they take from the registry besides the list
    /// (reports and identities, so their statuses and identity work) is looked at again.
    pub fn resync_agents(&mut self, agents: &[Agent], count: usize) -> Vec<Id> {
        let mut out = Vec::with_capacity(count);
        if agents.is_empty() {
            return out;
        }
        for _ in 0..count {
            self.resync_agents = (self.resync_agents + 1) % agents.len();
            out.push(agents[self.resync_agents].key.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeRec;

    fn node(id: &str, labels: &[&str]) -> NodeRec {
        let mut n = NodeRec::bare(id, id);
        n.info.labels = labels.iter().map(|l| l.to_string()).collect();
        n
    }

    /// What the registry says but the memo missed (no change was recorded) is found by the
    /// resync, and the sweep goes round every node.
    #[test]
    fn the_resync_finds_unrecorded_changes_and_sweeps_every_node() {
        let mut st = State::default();
        let mut memo = Memo::default();
        for id in ["n0", "n1", "n2"] {
            let rec = node(id, &[]);
            memo.fact_at.insert(id.into(), memo.facts.len());
            memo.facts.push(facts_of(&rec, true));
            st = st.with_node(rec);
        }
        // n1 gained a label behind the memo's back.
        let mut n1 = node("n1", &[]);
        n1.info.labels = vec!["gpu".into()];
        st = st.with_node(n1);

        let mut changes = Changes::default();
        memo.resync_nodes(&st, 1, &mut changes);
        assert_eq!(changes.seen.len(), 1, "one node per slice of one");
        memo.resync_nodes(&st, 2, &mut changes);
        assert_eq!(changes.seen.len(), 3, "the sweep wraps round every node");
        assert_eq!(changes.facts.iter().map(|i| &**i).collect::<Vec<_>>(), vec!["n1"]);
    }
}
