//! The registry's tables — nodes by id with their token and name indexes, the agent list and
//! its key index, the published placement outcome and items, identities, PATs by pair, desired
//! states, statuses, drains — and the reads of them.

use super::changes::Changes;
use super::pairs::Pairs;
use crate::clock;
use crate::model::{Agent, AgentList, Id};
use crate::store::kept::{Outcome, Placements, Sent};
use crate::store::records::catch_up::CatchUp;
use crate::store::records::Lifecycle;
use crate::store::records::{
    Cred, DesiredRec, DrainProgress, IdentityRec, Linger, NodeRec, PairRec, RetiringCred, Rollout,
};
use crate::store::secret::hash;
use fleet_api::NodeView;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Each agent's position in an agent list, built once per list of keys and shared.
pub type AgentIndex = Arc<HashMap<Id, usize>>;

/// The registry's tables. Their fields are private to `store::registry`: the rest of the
/// controller reads them through the accessors below and changes them through the store's
/// write-through methods, each of which records its change for the pass.
#[derive(Default)]
pub struct State {
    /// Boxed: a record is ~430 bytes, and inline the table's empty slots would take as much
    /// each.
    pub(super) nodes: HashMap<Id, Box<NodeRec>>,
    pub(super) by_token: HashMap<[u8; 32], Id>,
    pub(super) by_name: HashMap<Id, Id>,
    pub(super) agents: AgentList,
    /// Each agent's position in `agents`, shared with the pass's memo: a binary search
    /// instead, under the registry's write lock for every reported replica, would be nearly a
    /// fifth of the controller's CPU at 10,000 nodes (two cache misses a comparison).
    pub(super) agent_index: AgentIndex,
    pub(super) agents_etag: Option<String>,
    pub(super) outcome: Arc<Outcome>,
    /// The placement items the API lists, of the agents and outcome the last pass placed.
    pub(super) placements: Placements,
    pub(super) identities: HashMap<Id, IdentityRec>,
    pub(super) identity_errors: HashMap<Id, String>,
    /// Each pair's PAT counter and live credential.
    pub(super) pairs: Pairs,
    /// Credentials no longer live, waiting for their revocation (`revoke_ms` is set), by id.
    pub(super) retiring: HashMap<Id, RetiringCred>,
    pub(super) desired: HashMap<Id, DesiredRec>,
    /// Hash of the inputs each node's desired state was last built from (memory only).
    pub(super) desired_hashes: HashMap<Id, u64>,
    pub(super) statuses_sent: HashMap<Id, Sent>,
    /// The bodies computed by the last pass that differ from what the CP accepted, as hashes:
    /// a status work item derives the body again when it sends it (20,000 agents' bodies
    /// waiting to be sent would be ~10 MB while a fleet comes up).
    pub(super) statuses_want: HashMap<Id, Sent>,
    /// The agents whose unsettled-status mark is stored ([`crate::reconcile::pass::unsettled`]):
    /// few at rest, each agent whose status changed within the last second or so.
    pub(super) unsettled: HashSet<Id>,
    /// Nodes whose report is newer than the database copy.
    pub(super) dirty_nodes: HashSet<Id>,
    /// Each draining node's progress, as the last pass saw it.
    pub(super) drains: HashMap<Id, DrainProgress>,
    /// The rollouts that hold something the agents' own items do not say, by agent
    /// (docs/behaviour.md#rolling-out-a-change); written by the pass only.
    pub(super) rollouts: HashMap<Id, Arc<Rollout>>,
    /// Replicas a drain moved that still run on their old node, by (agent, replica); written
    /// by the pass only.
    pub(super) lingering: BTreeMap<(Id, u32), Linger>,
    /// Until when (Unix seconds) each replica a node reported said it is busy, by position in
    /// its report, 0 idle (docs/behaviour.md#busy-replicas): only nodes with a busy replica are
    /// here, so a fleet at rest pays nothing for it. Memory only: a node says it again in its
    /// next report.
    pub(super) busy: HashMap<Id, Box<[u32]>>,
    /// The maintenance windows of the nodes that name any, read once when announced
    /// (docs/behaviour.md#maintenance-windows).
    pub(super) windows: HashMap<Id, Arc<[fleet_api::windows::Window]>>,
    /// The token hashes of deleted nodes: such a token is refused as revoked (the node exits),
    /// any other unknown one as unknown to this store (the node keeps running;
    /// docs/behaviour.md#a-store-older-than-the-fleet).
    pub(super) deleted_tokens: HashSet<[u8; 32]>,
    /// The store is older than the fleet, since when and why; `None` while it is not.
    pub(super) catch_up: Option<CatchUp>,
    /// What changed since the pass last looked, recorded with each change under the same
    /// lock: the pass recomputes only what these touch.
    pub(super) changes: Changes,
}

impl State {
    /// Replaces the agent list (in key order) and returns the old one (for the caller to drop
    /// outside the lock). The key index is rebuilt only when the keys changed.
    pub(in crate::store) fn set_agents(&mut self, agents: AgentList) -> AgentList {
        debug_assert!(agents.is_sorted_by(|a, b| a.key < b.key), "agents in key order, each once");
        if !same_keys(&self.agents, &agents) {
            self.agent_index = Arc::new(agents.iter().enumerate().map(|(i, a)| (a.key.clone(), i)).collect());
        }
        std::mem::replace(&mut self.agents, agents)
    }

    pub fn agent(&self, key: &str) -> Option<&Agent> {
        self.agent_index.get(key).and_then(|&i| self.agents.get(i))
    }

    /// Whether the published outcome binds a replica of `agent` to `node` (a walk over the
    /// agent's few bindings, so no set of pairs is kept beside them).
    pub fn is_placed(&self, agent: &Id, node: &Id) -> bool {
        self.outcome.bindings.of_agent(agent).any(|(_, n)| n == node)
    }

    pub fn node_id_by_token(&self, token: &str) -> Option<Id> {
        self.by_token.get(&hash(token)).cloned()
    }

    /// Whether `token` was the token of a node deleted from this store.
    pub fn was_deleted(&self, token: &str) -> bool {
        self.deleted_tokens.contains(&hash(token))
    }

    /// The mark of a store older than the fleet, while it is.
    pub fn catch_up(&self) -> Option<&CatchUp> {
        self.catch_up.as_ref()
    }

    /// Whether the node holds a newer generation than this store has for it: its report says
    /// it applied one (docs/behaviour.md#a-store-older-than-the-fleet).
    pub fn ahead(&self, node: &str) -> Option<u64> {
        let applied = self.nodes.get(node)?.info.applied_generation;
        (applied > self.desired.get(node)?.generation).then_some(applied)
    }
}

/// Reads of the tables.
impl State {
    pub fn node(&self, id: &str) -> Option<&NodeRec> {
        self.nodes.get(id).map(|n| &**n)
    }

    /// Every node, in no particular order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeRec> {
        self.nodes.values().map(|n| &**n)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The active agent list, in key order.
    pub fn agents(&self) -> &AgentList {
        &self.agents
    }

    /// Each agent's position in [`State::agents`].
    pub fn agent_index(&self) -> &AgentIndex {
        &self.agent_index
    }

    /// The CP's ETag of the agent list held.
    pub fn agents_etag(&self) -> Option<&str> {
        self.agents_etag.as_deref()
    }

    /// The outcome the last pass placed by.
    pub fn outcome(&self) -> &Arc<Outcome> {
        &self.outcome
    }

    /// The placement items the API lists.
    pub fn placements(&self) -> &Placements {
        &self.placements
    }

    /// A node's desired state.
    pub fn desired(&self, node: &str) -> Option<&DesiredRec> {
        self.desired.get(node)
    }

    /// The hash of the inputs a node's desired state was last built from.
    pub fn desired_hash(&self, node: &str) -> Option<u64> {
        self.desired_hashes.get(node).copied()
    }

    /// The status the CP last accepted for an agent, as its hash.
    pub fn status_sent(&self, agent: &str) -> Option<&Sent> {
        self.statuses_sent.get(agent)
    }

    /// The agents whose status the CP may not have yet, as the stored marks say.
    pub fn unsettled(&self) -> &HashSet<Id> {
        &self.unsettled
    }

    /// The status the last pass wants sent for an agent, as its hash.
    pub fn status_wanted(&self, agent: &str) -> Option<&Sent> {
        self.statuses_want.get(agent)
    }

    /// Every node's desired generation.
    pub fn generations(&self) -> impl Iterator<Item = (&Id, u64)> {
        self.desired.iter().map(|(id, d)| (id, d.generation))
    }

    /// A draining node's progress, as the last pass saw it.
    pub fn drain(&self, node: &str) -> Option<&DrainProgress> {
        self.drains.get(node)
    }
}

/// Reads of what only the store's write-through methods change.
impl State {
    pub fn rollout(&self, agent: &str) -> Option<&Arc<Rollout>> {
        self.rollouts.get(agent)
    }

    pub fn rollouts(&self) -> impl Iterator<Item = &Arc<Rollout>> {
        self.rollouts.values()
    }

    /// Replicas a drain moved that still run on their old node (make-before-break).
    pub fn lingering(&self) -> &BTreeMap<(Id, u32), Linger> {
        &self.lingering
    }

    pub fn identity(&self, agent: &str) -> Option<&IdentityRec> {
        self.identities.get(agent)
    }

    pub fn identity_error(&self, agent: &str) -> Option<&String> {
        self.identity_errors.get(agent)
    }

    /// The live credential of an (agent, node) pair.
    pub fn live_cred(&self, pair: &(Id, Id)) -> Option<&Arc<Cred>> {
        self.pairs.get(&pair.0, &pair.1)?.live.as_ref()
    }

    /// Every live credential with its pair: (agent, node, credential).
    pub fn live_creds(&self) -> impl Iterator<Item = (&Id, &Id, &Arc<Cred>)> {
        self.pairs.iter().filter_map(|(agent, node, p)| Some((agent, node, p.live.as_ref()?)))
    }

    /// Every (agent, node) pair the store keeps a PAT counter for, placed or not.
    pub fn pairs(&self) -> impl Iterator<Item = (&Id, &Id)> {
        self.pairs.iter().map(|(agent, node, _)| (agent, node))
    }

    /// The agents whose pair with `node` has a live credential, in key order.
    pub fn live_agents_on(&self, node: &str) -> Vec<Id> {
        self.pairs.of_node(node).iter().filter(|(_, p)| p.live.is_some()).map(|(a, _)| a.clone()).collect()
    }

    /// A credential waiting for its revocation.
    pub fn retiring(&self, id: &str) -> Option<&RetiringCred> {
        self.retiring.get(id)
    }

    /// Every credential waiting for its revocation.
    pub fn retiring_creds(&self) -> impl Iterator<Item = &RetiringCred> {
        self.retiring.values()
    }

    /// The PAT counter of an (agent, node) pair (docs/behaviour.md#iam-calls).
    pub fn pair(&self, pair: &(Id, Id)) -> PairRec {
        self.pairs.get(&pair.0, &pair.1).cloned().unwrap_or_default()
    }

    /// Makes `c` its pair's live credential without recording a change (for tests that
    /// put the registry behind the pass's back).
    #[cfg(test)]
    pub(crate) fn put_live_cred(&mut self, pair: &(Id, Id), c: Arc<Cred>) {
        self.pairs.entry(&pair.0, &pair.1).live = Some(c);
    }

    /// Sets an agent's identity without recording a change (tests only, as above).
    #[cfg(test)]
    pub(crate) fn put_identity(&mut self, agent: &str, rec: IdentityRec) {
        self.identities.insert(agent.into(), rec);
    }

    /// Nodes whose reports the database does not have yet.
    #[cfg(test)]
    pub(crate) fn dirty_count(&self) -> usize {
        self.dirty_nodes.len()
    }

    /// What changed since the pass last took the record.
    pub(in crate::store) fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }
}

/// Whether two agent lists hold the same keys in the same order.
pub fn same_keys(a: &[Agent], b: &[Agent]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.key == y.key)
}

/// A node by id or name, and its view.
impl State {
    /// The node with this id, or else this name.
    pub fn resolve(&self, id_or_name: &str) -> Option<Id> {
        if let Some(n) = self.nodes.get(id_or_name) {
            return Some(n.id.clone());
        }
        self.by_name.get(id_or_name).cloned()
    }

    /// The node's view with its drain's progress.
    pub fn node_view(&self, n: &NodeRec, now_ms: i64, offline_after: Duration) -> NodeView {
        let mut v = n.view(now_ms, offline_after);
        if let Some(free) = self.outcome.free_of(&n.id) {
            v.slots_used = n.info.capacity.slots.saturating_sub(free.slots);
        }
        if let Lifecycle::Draining { started_ms, force, .. } = n.lifecycle {
            let p = self.drains.get(&n.id).cloned().unwrap_or_default();
            v.drain = Some(fleet_api::DrainView {
                started_at: clock::rfc3339_ms(started_ms),
                remaining: p.remaining,
                blocked: p
                    .blocked
                    .iter()
                    .map(|(a, r, why)| fleet_api::BlockedReplica {
                        agent_key: a.to_string(),
                        replica: *r,
                        reason: why.to_string(),
                    })
                    .collect(),
                force,
            });
        }
        v
    }
}

/// A registry built by hand, outside any store (tests, benchmarks): these take and give back
/// a value, never the shared registry, so nothing here bypasses a live store's change record.
impl State {
    pub fn with_node(mut self, rec: NodeRec) -> State {
        self.insert_node(rec);
        self
    }

    pub fn without_node(mut self, id: &str) -> State {
        if let Some(rec) = self.nodes.remove(id) {
            self.by_token.remove(&rec.token_hash);
            self.by_name.remove(&rec.name);
        }
        self
    }

    pub fn with_outcome(mut self, outcome: Arc<Outcome>) -> State {
        self.outcome = outcome;
        self
    }

    /// `agents` in key order.
    pub fn with_agents(mut self, agents: AgentList) -> State {
        self.set_agents(agents);
        self
    }
}
