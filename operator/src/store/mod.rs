//! The registry: every read path (API, long-poll, pass) reads memory; the database under it
//! is the durable copy, written first and then published here (SPEC §3.5). Nodes are keyed
//! by node id and indexed by token hash and name. Locks are `parking_lot` and are never held
//! across `.await`: callers copy what they need out, write the database, then publish.

mod backend;
pub mod bindings;
pub mod db;
pub mod events;
pub mod follow;
pub mod hub;
pub mod kept;
pub mod lease;
pub mod lifecycle;
mod pairs;
mod sealed;
pub mod seen;
pub mod writer;
pub mod writes;

pub use lifecycle::{Action, Deleted, DrainProgress, Lifecycle};
pub use sealed::Sealed;
pub use seen::Seen;
pub use writes::PassPublish;

use crate::clock;
use crate::model::{Agent, AgentList};
use axum::body::Bytes;
use db::{CredRow, Db, DbError, JoinOutcome, NodeRow};
use fleet_api::images::AllowList;
use fleet_api::{Capacity, Health, JoinRequest, JoinResponse, NodeStatus, NodeView, ObservedReport};
use kept::{Outcome, Placements, StatusBody};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

pub use crate::model::Id;

/// What a node announced and last reported; stored as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub labels: Vec<String>,
    pub executor_kinds: Vec<String>,
    pub executor_images: BTreeMap<String, Vec<String>>,
    pub capacity: Capacity,
    pub secrets: Vec<String>,
    pub version: String,
    pub health: Option<Health>,
    pub observe_seconds: Option<u32>,
    pub replicas: Vec<Seen>,
    pub applied_generation: u64,
    pub boot_id: Option<String>,
    pub seq: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct NodeRec {
    pub id: Id,
    pub name: Id,
    pub token_hash: [u8; 32],
    pub public_key: [u8; 32],
    pub joined_ms: i64,
    pub last_seen_ms: i64,
    pub info: NodeInfo,
    pub allow: BTreeMap<String, AllowList>,
    pub lifecycle: Lifecycle,
}

impl NodeRec {
    /// Silence after which this node is offline: max(configured, 3 × its report period).
    pub fn threshold(&self, offline_after: Duration) -> Duration {
        offline_after.max(Duration::from_secs(3 * u64::from(self.info.observe_seconds.unwrap_or(0))))
    }

    pub fn online(&self, now_ms: i64, offline_after: Duration) -> bool {
        now_ms - self.last_seen_ms <= self.threshold(offline_after).as_millis() as i64
    }

    pub fn view(&self, now_ms: i64, offline_after: Duration) -> NodeView {
        NodeView {
            id: self.id.to_string(),
            name: self.name.to_string(),
            labels: self.info.labels.clone(),
            executor_kinds: self.info.executor_kinds.clone(),
            executor_images: self.info.executor_images.clone(),
            capacity: self.info.capacity.clone(),
            secrets: self.info.secrets.clone(),
            health: self.info.health.unwrap_or(Health::Ok),
            status: if self.online(now_ms, offline_after) { NodeStatus::Online } else { NodeStatus::Offline },
            last_seen_at: clock::rfc3339_ms(self.last_seen_ms),
            version: self.info.version.clone(),
            slots_used: 0,
            schedulable: self.lifecycle.schedulable(),
            drain: None,
        }
    }

    /// A stored node, seen no earlier than `now`; `None` (logged) for a malformed row.
    fn from_row(r: NodeRow, now: i64) -> Option<NodeRec> {
        let info: NodeInfo = serde_json::from_str(&r.info).unwrap_or_default();
        let (Ok(token_hash), Ok(public_key)) = (r.token_hash.try_into(), r.public_key.try_into()) else {
            tracing::error!(node = %r.id, "stored node has a malformed token hash or key; skipped");
            return None;
        };
        let mut rec = NodeRec {
            id: r.id.into(),
            name: r.name.into(),
            token_hash,
            public_key,
            joined_ms: r.joined_ms,
            last_seen_ms: r.last_seen_ms.max(now),
            info: NodeInfo::default(),
            allow: BTreeMap::new(),
            lifecycle: r.lifecycle,
        };
        rec.set_info(info);
        Some(rec)
    }

    fn set_info(&mut self, info: NodeInfo) {
        self.allow = parse_allow(&info.executor_images);
        self.info = info;
    }
}

fn parse_allow(images: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, AllowList> {
    images.iter().map(|(k, v)| (k.clone(), AllowList::parse(v).unwrap_or_default())).collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityRec {
    /// Shared with every credential of the agent (one string, not one per PAT).
    pub principal_id: Id,
    /// The CP has accepted `PUT …/identity`.
    pub bound: bool,
}

/// What the registry keeps of an (agent, node) pair: one record, one table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairRec {
    /// The n of the pair's next PAT (SPEC §2.1). A stored row's `pending_n` (left by a version
    /// that kept the n in flight) is this n until the PAT it keyed is stored.
    pub next_n: u64,
    /// The pair's live credential, held here rather than in a map by id: a PAT is found by
    /// its pair far more often than by its id, and only a retiring one is ever looked up by id.
    pub live: Option<Arc<Cred>>,
}

/// An instant in ms that may be unset, in 8 bytes (`Option<i64>` takes 16): with it a
/// credential fits jemalloc's 128-byte class instead of the 160-byte one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaybeMs(i64);

impl MaybeMs {
    pub const NONE: MaybeMs = MaybeMs(i64::MIN);

    pub fn get(self) -> Option<i64> {
        (self != Self::NONE).then_some(self.0)
    }
}

impl From<Option<i64>> for MaybeMs {
    fn from(v: Option<i64>) -> MaybeMs {
        // i64::MIN is no instant a clock gives.
        v.map_or(Self::NONE, MaybeMs)
    }
}

/// A PAT as the registry keeps it. Its (agent, node) pair is where it is kept — the pair
/// table for the live one, [`RetiringCred`] for one waiting for its revocation — not in the
/// record: 100,000 live PATs at 10,000 nodes, 32 bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cred {
    /// The PAT's id and sealed box ([`Cred::id`]).
    pub sealed: Sealed,
    pub n: u64,
    pub principal_id: Id,
    pub expires_ms: i64,
    pub issued_ms: i64,
    /// Set once the credential is no longer wanted: revoke at this instant.
    pub revoke_ms: MaybeMs,
}

impl Cred {
    /// The PAT's id (IAM's credential id).
    pub fn id(&self) -> std::borrow::Cow<'_, str> {
        self.sealed.id()
    }

    /// The same PAT with its sealed box left to the database (see [`Sealed::id_only`]).
    pub fn without_box(&self) -> Cred {
        Cred { sealed: self.sealed.id_only(), principal_id: self.principal_id.clone(), ..*self }
    }

    /// A stored credential and its (agent, node) pair. Its box stays in the database: a
    /// node that needs it again has it in its desired state, and a new desired state reads
    /// it back.
    fn from_row(r: CredRow) -> ((Id, Id), Cred) {
        let cred = Cred {
            sealed: Sealed::stored(&r.id),
            n: r.n as u64,
            principal_id: r.principal_id.into(),
            expires_ms: r.expires_ms,
            issued_ms: r.issued_ms,
            revoke_ms: r.revoke_ms.into(),
        };
        ((r.agent_key.into(), r.node_id.into()), cred)
    }
}

/// A credential no longer live, waiting for its revocation, with its (agent, node) pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiringCred {
    pub pair: (Id, Id),
    pub cred: Arc<Cred>,
}

/// A node's desired state as served. The whole body is built once per generation and
/// shared by every response (a clone is a reference count): waking 10,000 long-polls
/// copies nothing. Once the node has the generation (it asks with `since` = it) the body is
/// let go — the database keeps it, and a node that asks again (a restart) has it read back —
/// so at rest the fleet's bodies take no memory. A sealed box is held in memory only until
/// its node has it: the registry keeps a new PAT's box until a body that carries it is
/// delivered, then the id alone ([`Store::delivered`]); a later body reads the box back.
#[derive(Debug, Clone)]
pub struct DesiredRec {
    pub generation: u64,
    /// A keyed hash of the agents array, for [`DesiredRec::same_agents`] once the body is gone.
    agents_hash: u64,
    /// `{"generation":G,"agents":[…]}` while the node may still need it.
    body: Option<Bytes>,
    /// The (agent, live credential) pairs whose boxes the body took from the registry's
    /// memory; kept without their boxes once the node has the body.
    boxed: Box<[(Id, Arc<Cred>)]>,
}

/// SipHash with a key chosen at start: the CP cannot craft two agent lists of one hash.
fn agents_hash(agents: &[u8]) -> u64 {
    kept::keyed_hash(agents)
}

impl DesiredRec {
    /// `agents`: the JSON array of desired agents.
    pub fn new(generation: u64, agents: &str) -> DesiredRec {
        Self::build(generation, |body| body.extend_from_slice(agents.as_bytes()))
    }

    /// The body built in place: `write_agents` appends the JSON array of desired agents
    /// behind the head, so a pass serialises each body once, into the buffer that is served
    /// and whose slice is stored ([`DesiredRec::agents_bytes`]).
    pub fn build(generation: u64, write_agents: impl FnOnce(&mut Vec<u8>)) -> DesiredRec {
        let mut body = Self::head(generation).into_bytes();
        let at = body.len();
        write_agents(&mut body);
        let agents_hash = agents_hash(&body[at..]);
        body.push(b'}');
        body.shrink_to_fit();
        DesiredRec { generation, agents_hash, body: Some(body.into()), boxed: Box::default() }
    }

    /// The body carries these credentials' boxes, held in memory until the node has it.
    pub fn carrying(mut self, boxed: Vec<(Id, Arc<Cred>)>) -> DesiredRec {
        self.boxed = boxed.into_boxed_slice();
        self
    }

    /// A generation whose body is in the database only.
    pub fn stored(generation: u64, agents: &str) -> DesiredRec {
        DesiredRec { generation, agents_hash: agents_hash(agents.as_bytes()), body: None, boxed: Box::default() }
    }

    /// Whether this desired state has exactly these agents (a pass bumps the generation only
    /// when they differ).
    pub fn same_agents(&self, agents: &[u8]) -> bool {
        match self.agents_bytes() {
            Some(held) => held == agents,
            None => self.agents_hash == agents_hash(agents),
        }
    }

    fn head(generation: u64) -> String {
        format!("{{\"generation\":{generation},\"agents\":")
    }

    /// The JSON array of desired agents, while the body is held: a slice of the body that
    /// shares its memory (the pass stores it without a copy).
    pub fn agents_bytes(&self) -> Option<Bytes> {
        let body = self.body.as_ref()?;
        let at = Self::head(self.generation).len();
        Some(body.slice(at..body.len() - 1))
    }

    pub fn body(&self) -> Option<Bytes> {
        self.body.clone()
    }
}

/// Each agent's position in an agent list, built once per list of keys and shared.
pub type AgentIndex = Arc<HashMap<Id, usize>>;

#[derive(Default)]
pub struct State {
    /// Boxed: a record is ~430 bytes, and inline the table's empty slots took as much each
    /// (7 MB at 10,000 nodes, twice that while it doubled; heaptrack, session 16).
    pub nodes: HashMap<Id, Box<NodeRec>>,
    pub by_token: HashMap<[u8; 32], Id>,
    pub by_name: HashMap<Id, Id>,
    pub agents: AgentList,
    /// Each agent's position in `agents`, shared with the pass's memo: a binary search
    /// instead, under the registry's write lock for every reported replica, was 18 % of the
    /// controller's CPU at 10,000 nodes (two cache misses a comparison).
    pub agent_index: AgentIndex,
    pub agents_etag: Option<String>,
    pub outcome: Arc<Outcome>,
    /// The placement items the API lists, of the agents and outcome the last pass placed.
    pub placements: Placements,
    identities: HashMap<Id, IdentityRec>,
    identity_errors: HashMap<Id, String>,
    /// Each pair's PAT counter and live credential.
    pairs: pairs::Pairs,
    /// Credentials no longer live, waiting for their revocation (`revoke_ms` is set), by id.
    retiring: HashMap<Id, RetiringCred>,
    pub desired: HashMap<Id, DesiredRec>,
    /// Hash of the inputs each node's desired state was last built from (memory only).
    pub desired_hashes: HashMap<Id, u64>,
    pub statuses_sent: HashMap<Id, kept::Sent>,
    /// The bodies computed by the last pass that differ from what the CP accepted, as hashes:
    /// a status work item derives the body again when it sends it (20,000 agents' bodies
    /// waiting to be sent were ~10 MB while a fleet came up; heaptrack, session 16).
    pub statuses_want: HashMap<Id, kept::Sent>,
    /// Nodes whose report is newer than the database copy.
    pub dirty_nodes: HashSet<Id>,
    /// Each draining node's progress, as the last pass saw it.
    pub drains: HashMap<Id, DrainProgress>,
    /// What changed since the pass last looked, recorded with each change under the same
    /// lock: the pass recomputes only what these touch.
    changes: Changes,
}

/// Changes the pass has not seen yet. Each writer of the registry records its change here in
/// the critical section that makes it, so a pass that takes these and then reads the state
/// never misses one (a change made in between is read now and recomputed once more later).
#[derive(Debug, Default)]
pub struct Changes {
    /// Nodes that joined or whose placement facts (labels, kinds, images, capacity,
    /// secrets) changed.
    pub facts: HashSet<Id>,
    /// Nodes whose replica reports or health changed.
    pub reports: HashSet<Id>,
    /// Nodes that reported after being offline, or changed their report period (and with
    /// it their offline threshold).
    pub seen: HashSet<Id>,
    /// (agent, node) pairs whose live credential changed.
    pub creds: HashSet<(Id, Id)>,
    /// Agents whose identity or identity error changed.
    pub identities: HashSet<Id>,
    /// A node was deleted: the next pass starts from scratch (deletes are rare; the memo's
    /// per-node parts are simpler rebuilt than patched).
    pub rebuild: bool,
    /// Credentials of deleted nodes, to revoke now.
    pub revoke_now: Vec<String>,
}

impl State {
    /// Replaces the agent list (in key order) and returns the old one (for the caller to drop
    /// outside the lock). The key index is rebuilt only when the keys changed.
    pub fn set_agents(&mut self, agents: AgentList) -> AgentList {
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
}

impl State {
    /// Puts a node in the registry with its token and name indexes.
    fn insert_node(&mut self, rec: NodeRec) {
        self.by_token.insert(rec.token_hash, rec.id.clone());
        self.by_name.insert(rec.name.clone(), rec.id.clone());
        self.nodes.insert(rec.id.clone(), Box::new(rec));
    }

    /// A node that joined now (here or on another replica): in the registry, in the pass's
    /// changes, and with the first desired state unless it has one. Returns whether that
    /// desired state was made (its long-polls are to be woken with generation 1).
    fn add_joined_node(&mut self, rec: NodeRec) -> bool {
        let id = rec.id.clone();
        self.insert_node(rec);
        self.changes.facts.insert(id.clone());
        if self.desired.contains_key(&id) {
            return false;
        }
        self.desired.insert(id, DesiredRec::new(1, "[]"));
        true
    }

    /// Gives node `id` the token hashing to `new`: the previous token stops working.
    fn set_token(&mut self, id: &Id, new: [u8; 32]) {
        let Some(rec) = self.nodes.get_mut(id) else { return };
        let old = std::mem::replace(&mut rec.token_hash, new);
        if old != new {
            self.by_token.remove(&old);
            self.by_token.insert(new, id.clone());
        }
    }

    /// Takes what a node reported (normalised) and seen at `seen_ms`, recording what changed
    /// for the pass. Whether the node was online before it is judged at `now`, as the pass
    /// judges it (a report read back from another replica was seen a moment earlier).
    /// `persist`: the database copy is older (a report taken here, not one read back from
    /// another replica's write).
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &mut self,
        node: &Id,
        info: NodeInfo,
        seen_ms: i64,
        now: i64,
        offline_after: Duration,
        persist: bool,
    ) -> ReportOutcome {
        let Some(rec) = self.nodes.get_mut(node) else { return ReportOutcome::Stale };
        // Compared after normalising, so list order alone is never a change.
        let old = &rec.info;
        let facts_changed = old.labels != info.labels
            || old.executor_kinds != info.executor_kinds
            || old.executor_images != info.executor_images
            || old.capacity != info.capacity
            || old.secrets != info.secrets;
        let reports_changed = old.replicas != info.replicas || old.health != info.health;
        let period_changed = old.observe_seconds != info.observe_seconds;
        let was_online = rec.online(now, offline_after);
        rec.last_seen_ms = seen_ms.max(rec.last_seen_ms);
        rec.set_info(info);
        if persist {
            self.dirty_nodes.insert(node.clone());
        }
        if facts_changed {
            self.changes.facts.insert(node.clone());
        }
        if reports_changed {
            self.changes.reports.insert(node.clone());
        }
        if !was_online || period_changed {
            self.changes.seen.insert(node.clone());
        }
        ReportOutcome::Accepted { changed: facts_changed || reports_changed, was_online }
    }

    /// The registry as the database has it; every node's last-seen time becomes
    /// max(stored, `now`), so an outage of the controller does not make the fleet look
    /// offline (SPEC §3.6).
    fn from_snapshot(snap: db::Snapshot, now: i64) -> State {
        let mut st = State::default();
        for rec in snap.nodes.into_iter().filter_map(|r| NodeRec::from_row(r, now)) {
            st.insert_node(rec);
        }
        let bindings = snap.placements.into_iter().map(|(a, r, n)| (Id::from(a), r as u32, Id::from(n))).collect();
        st.outcome = Arc::new(Outcome { bindings, ..Default::default() });
        for (agent, principal_id, bound) in snap.identities {
            st.identities.insert(agent.into(), IdentityRec { principal_id: principal_id.into(), bound });
        }
        for (agent, node, next_n, pending_n) in snap.pairs {
            st.pairs.entry(&agent.into(), &node.into()).next_n = pending_n.unwrap_or(next_n) as u64;
        }
        for row in snap.credentials {
            let (pair, mut c) = Cred::from_row(row);
            if let Some(i) = st.identities.get(&pair.0).filter(|i| i.principal_id == c.principal_id) {
                c.principal_id = i.principal_id.clone();
            }
            match c.revoke_ms.get() {
                None => st.pairs.entry(&pair.0, &pair.1).live = Some(Arc::new(c)),
                Some(_) => drop(st.retiring.insert(c.id().into(), RetiringCred { pair, cred: Arc::new(c) })),
            }
        }
        // Bodies are read back when a node asks for one it does not have (most have theirs).
        for (node, generation, agents) in snap.desired {
            st.desired.insert(node.into(), DesiredRec::stored(generation as u64, &agents));
        }
        for (agent, body) in snap.statuses {
            if let Ok(b) = serde_json::from_str::<StatusBody>(&body) {
                st.statuses_sent.insert(agent.into(), kept::Sent::of(&b));
            }
        }
        st.set_agents(Arc::new(stored_agents(snap.agents)));
        for (k, v) in snap.kv {
            if k == "agents_etag" {
                st.agents_etag = Some(v);
            }
        }
        st
    }
}

/// The stored agent list in key order; a row that no longer parses is skipped, with an error
/// (the CP's list replaces it at the next read).
fn stored_agents(rows: Vec<String>) -> Vec<Agent> {
    let mut agents: Vec<Agent> = rows
        .into_iter()
        .filter_map(|row| match serde_json::from_str::<Agent>(&row) {
            Ok(mut a) => {
                a.shrink();
                Some(a)
            }
            Err(e) => {
                tracing::error!(error = %e, "a stored agent does not parse; skipped until the CP is read");
                None
            }
        })
        .collect();
    agents.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    agents
}

/// Reads of what only the store's write-through methods change (`writes.rs`).
impl State {
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

    /// The PAT counter of an (agent, node) pair (SPEC §2.1).
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

    /// What changed since the pass last took the record.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }
}

/// Writers of identities and live credentials go through these, so every change is recorded
/// for the pass in the critical section that makes it.
impl State {
    fn set_identity(&mut self, agent: &Id, rec: IdentityRec) {
        self.identities.insert(agent.clone(), rec);
        self.changes.identities.insert(agent.clone());
    }

    /// Sets (`Some`) or clears (`None`) an agent's identity error; returns whether it changed.
    fn set_identity_error(&mut self, agent: &Id, error: Option<String>) -> bool {
        let changed = match error {
            Some(e) => self.identity_errors.insert(agent.clone(), e.clone()).as_ref() != Some(&e),
            None => self.identity_errors.remove(agent).is_some(),
        };
        if changed {
            self.changes.identities.insert(agent.clone());
        }
        changed
    }

    /// Makes `cred` the live credential of `pair`; returns the one it replaces.
    fn set_active(&mut self, pair: &(Id, Id), cred: Arc<Cred>) -> Option<Arc<Cred>> {
        let old = self.pairs.entry(&pair.0, &pair.1).live.replace(cred);
        self.changes.creds.insert(pair.clone());
        old
    }

    /// Takes credential `id` out of `pair` if it is the live one there.
    fn take_active(&mut self, pair: &(Id, Id), id: &str) -> Option<Arc<Cred>> {
        let rec = self.pairs.get_mut(&pair.0, &pair.1)?;
        if rec.live.as_ref().is_none_or(|c| c.id() != id) {
            return None;
        }
        self.changes.creds.insert(pair.clone());
        rec.live.take()
    }

    /// Credential `id` of `pair` is to be revoked at `at` (ms), or sooner if it already was:
    /// it is no longer live, and waits in the retiring credentials.
    fn schedule_revoke(&mut self, pair: &(Id, Id), id: &str, at: impl Fn(Option<i64>) -> i64) {
        let cred = self.take_active(pair, id).or_else(|| self.retiring.remove(id).map(|r| r.cred));
        if let Some(mut c) = cred {
            let m = Arc::make_mut(&mut c);
            m.revoke_ms = Some(at(m.revoke_ms.get())).into();
            self.retiring.insert(c.id().into(), RetiringCred { pair: pair.clone(), cred: c });
        }
    }
}

/// Whether two agent lists hold the same keys in the same order.
pub fn same_keys(a: &[Agent], b: &[Agent]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.key == y.key)
}

pub fn hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

fn random_secret(prefix: &str) -> String {
    use base64::Engine;
    let bytes: [u8; 32] = rand::random();
    format!("{prefix}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("the join key is unknown, used or expired")]
    KeyInvalid,
    #[error("a node named {0:?} already exists")]
    NameTaken(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

#[derive(Debug, PartialEq, Eq)]
pub enum ReportOutcome {
    /// `changed`: something placement or status depends on differs from the last report;
    /// `was_online`: the node was online before this report.
    Accepted { changed: bool, was_online: bool },
    /// Same boot, sequence not above the last one: ignored.
    Stale,
}

pub struct Store {
    pub db: Db,
    pub state: RwLock<State>,
    pub hub: hub::Hub,
    /// Events recorded and not yet written (the report flusher writes them).
    pub events: events::Pending,
}

impl Store {
    /// Opens the database and loads the registry. Every node's last-seen time becomes
    /// max(stored, now): an outage of the controller does not make the fleet look offline.
    pub async fn open(url: &str) -> Result<Store, DbError> {
        Self::open_as(url, "").await
    }

    /// [`Store::open`] for the replica named `replica` (its writes' notifications carry the
    /// name, so it skips its own; SPEC §3.9).
    pub async fn open_as(url: &str, replica: &str) -> Result<Store, DbError> {
        let db = Db::open_as(url, replica).await?;
        let st = State::from_snapshot(db.load().await?, clock::now_ms());
        let hub = hub::Hub::default();
        for (id, d) in &st.desired {
            hub.publish(id, d.generation);
        }
        Ok(Store { db, state: RwLock::new(st), hub, events: events::Pending::default() })
    }

    /// Loads the whole registry again from the database, as a start does (a replica taking
    /// the lease over, SPEC §3.9): what other replicas wrote is in it, every node's liveness
    /// grace starts now, and the next pass starts from scratch. Reports this replica took
    /// and has not flushed yet are kept. Generations only grow: the database has every one
    /// this replica served.
    pub async fn reload(&self) -> Result<(), DbError> {
        self.flush_reports().await?;
        let mut fresh = State::from_snapshot(self.db.load().await?, clock::now_ms());
        fresh.changes.rebuild = true;
        let old = {
            let mut st = self.state.write();
            std::mem::replace(&mut *st, fresh)
        };
        let st = self.state.read();
        for (id, d) in &st.desired {
            if old.desired.get(id).is_none_or(|o| o.generation < d.generation) {
                self.hub.publish(id, d.generation);
            }
        }
        for id in old.nodes.keys().filter(|id| !st.nodes.contains_key(*id)) {
            self.hub.remove(id);
        }
        drop(st);
        drop(old);
        Ok(())
    }

    /// Issues a join key valid for `ttl`; returns the key and its expiry (ms).
    pub async fn issue_join_key(&self, ttl: Duration, note: &str) -> Result<(String, i64), DbError> {
        let key = random_secret("fjk_");
        let now = clock::now_ms();
        let expires = now + ttl.as_millis() as i64;
        self.db.insert_join_key(&hash(&key), expires, note, now).await?;
        Ok((key, expires))
    }

    /// Joins a node (body already validated). The key is looked up in the database, in the
    /// transaction that marks it used and creates the node.
    pub async fn join(&self, req: &JoinRequest) -> Result<JoinResponse, JoinError> {
        let token = random_secret("fnt_");
        let id = uuid::Uuid::new_v4().to_string();
        let public_key = fleet_api::seal::decode_public_key(&req.public_key).unwrap_or_default();
        let now = clock::now_ms();
        let mut info = NodeInfo {
            labels: sorted(&req.labels),
            executor_kinds: sorted(&req.executor_kinds),
            executor_images: req.executor_images.iter().map(|(k, v)| (k.clone(), sorted(v))).collect(),
            capacity: req.capacity.clone(),
            secrets: sorted(&req.secrets),
            version: req.version.clone(),
            health: Some(Health::Ok),
            ..Default::default()
        };
        info.executor_images.retain(|_, v| !v.is_empty());
        let row = NodeRow {
            id: id.clone(),
            name: req.name.clone(),
            token_hash: hash(&token).to_vec(),
            public_key: public_key.to_vec(),
            joined_ms: now,
            last_seen_ms: now,
            info: serde_json::to_string(&info).unwrap_or_default(),
            lifecycle: Lifecycle::default(),
        };
        match self.db.join(&hash(&req.join_key), &row, now).await? {
            JoinOutcome::KeyInvalid => return Err(JoinError::KeyInvalid),
            JoinOutcome::NameTaken => return Err(JoinError::NameTaken(req.name.clone())),
            JoinOutcome::Rejoined { id } => return Ok(self.rejoined(id.into(), token, info, now)),
            JoinOutcome::Joined => {}
        }
        let idr: Id = id.clone().into();
        let name: Id = req.name.as_str().into();
        let mut rec = NodeRec {
            id: idr.clone(),
            name: name.clone(),
            token_hash: hash(&token),
            public_key,
            joined_ms: now,
            last_seen_ms: now,
            info: NodeInfo::default(),
            allow: BTreeMap::new(),
            lifecycle: Lifecycle::default(),
        };
        rec.set_info(info);
        if self.state.write().add_joined_node(rec) {
            self.hub.publish(&idr, 1);
        }
        self.events.record(events::Event::new(events::Kind::NodeJoined, "joined").node(&idr, &name));
        Ok(JoinResponse { node_id: id, node_token: token })
    }

    /// The registry side of a join answered again: the node keeps its id and its state, takes
    /// the new token (the previous one stops working) and what it announced now.
    fn rejoined(&self, id: Id, token: String, info: NodeInfo, now: i64) -> JoinResponse {
        let mut st = self.state.write();
        st.set_token(&id, hash(&token));
        let name = match st.nodes.get_mut(&id) {
            Some(rec) => {
                rec.last_seen_ms = now.max(rec.last_seen_ms);
                let replicas = std::mem::take(&mut rec.info.replicas);
                rec.set_info(NodeInfo { replicas, ..info });
                let name = rec.name.clone();
                st.changes.facts.insert(id.clone());
                st.dirty_nodes.insert(id.clone());
                name
            }
            None => id.clone(),
        };
        drop(st);
        tracing::info!(node = %name, id = %id, "node joined again with its key (the first answer was lost?); its previous token no longer works");
        let msg = "joined again with the same key, name and public key; the previous token no longer works";
        self.events.record(events::Event::new(events::Kind::NodeJoined, msg).node(&id, &name));
        JoinResponse { node_id: id.to_string(), node_token: token }
    }

    /// Takes an observed report (validated). Memory first; the flusher persists it.
    pub fn report(&self, node: &Id, r: ObservedReport, now: i64, offline_after: Duration) -> ReportOutcome {
        let mut st = self.state.write();
        let Some(rec) = st.nodes.get(node) else { return ReportOutcome::Stale };
        if let (Some(b), Some(seq), Some(old_b), Some(old_seq)) = (&r.boot_id, r.seq, &rec.info.boot_id, rec.info.seq) {
            if b == old_b && seq <= old_seq {
                return ReportOutcome::Stale;
            }
        }
        let mut images: BTreeMap<String, Vec<String>> =
            r.executor_images.into_iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k, sorted(&v))).collect();
        images.retain(|k, _| r.executor_kinds.contains(k));
        // Kept until the next report, at its length, each agent's key the list's own. Collected
        // into a vector of its own: collected in place, it kept the parsed list's buffer,
        // grown by doubling for the wire's larger items (1.4 KB a node with ten replicas
        // instead of 720 bytes; heaptrack, session 17).
        let known = |key: &str| st.agent_index.get_key_value(key).map(|(k, _)| k.clone());
        let mut replicas: Vec<Seen> = Vec::with_capacity(r.replicas.len());
        replicas.extend(r.replicas.into_iter().map(|p| Seen::of(p, known)));
        let info = NodeInfo {
            labels: sorted(&r.labels),
            executor_kinds: sorted(&r.executor_kinds),
            executor_images: images,
            capacity: r.capacity,
            secrets: sorted(&r.secrets),
            version: r.version,
            health: Some(r.health),
            observe_seconds: r.observe_seconds,
            replicas,
            applied_generation: r.applied_generation,
            boot_id: r.boot_id,
            seq: r.seq,
        };
        st.observe(node, info, now, now, offline_after, true)
    }

    /// Persists reported node state; called periodically and at shutdown. Returns how many
    /// nodes were written. A fleet that reports at once (10,000 nodes coming up, a burst) is
    /// serialised and written [`FLUSH_CHUNK`] nodes at a time: all at once its rows were
    /// ~15 MB held together. Nodes whose rows could not be written stay dirty.
    pub async fn flush_reports(&self) -> Result<usize, DbError> {
        self.flush_reports_by(FLUSH_CHUNK).await
    }

    async fn flush_reports_by(&self, chunk: usize) -> Result<usize, DbError> {
        let mut written = 0;
        loop {
            let (ids, rows): (Vec<Id>, Vec<(String, i64, String)>) = {
                let mut st = self.state.write();
                let ids: Vec<Id> = st.dirty_nodes.iter().take(chunk).cloned().collect();
                for id in &ids {
                    st.dirty_nodes.remove(id);
                }
                let rows = ids
                    .iter()
                    .filter_map(|id| st.nodes.get(id))
                    .map(|n| (n.id.to_string(), n.last_seen_ms, serde_json::to_string(&n.info).unwrap_or_default()))
                    .collect();
                (ids, rows)
            };
            if rows.is_empty() {
                return Ok(written);
            }
            if let Err(e) = self.db.update_nodes(&rows).await {
                self.state.write().dirty_nodes.extend(ids);
                return Err(e);
            }
            written += rows.len();
            // Reports that land meanwhile wait for the next flush (a second away).
            if ids.len() < chunk || written >= 20 * chunk {
                return Ok(written);
            }
        }
    }

    /// Writes the events recorded since the last call; called with the report flush.
    pub async fn flush_events(&self) -> Result<usize, DbError> {
        events::flush(&self.db, &self.events).await
    }

    /// The events a reader asked for, oldest first.
    pub async fn read_events(&self, f: &events::Filter) -> Result<Vec<fleet_api::EventView>, DbError> {
        events::read(&self.db, f).await
    }

    /// The generation of `node`'s desired state and its body as served
    /// (`{"generation":G,"agents":[…]}`), `None` when it was let go ([`Store::load_desired`]).
    pub fn desired_body(&self, node: &Id) -> Option<(u64, Option<Bytes>)> {
        self.state.read().desired.get(node).map(|d| (d.generation, d.body()))
    }

    /// The node has generation `generation`: its body is let go (the database keeps it), and
    /// so are the sealed boxes of the live credentials it carried — the node has them, and a
    /// later body reads them back.
    pub fn delivered(&self, node: &Id, generation: u64) {
        let held = |st: &State| st.desired.get(node).is_some_and(|d| d.generation == generation && d.body.is_some());
        if !held(&self.state.read()) {
            return;
        }
        let mut st = self.state.write();
        if !held(&st) {
            return;
        }
        let Some(d) = st.desired.get_mut(node) else { return };
        d.body = None;
        let boxed = std::mem::take(&mut d.boxed);
        for (agent, cred) in boxed.iter() {
            let Some(pair) = st.pairs.get_mut(agent, node) else { continue };
            if pair.live.as_ref().is_some_and(|live| Arc::ptr_eq(live, cred)) {
                pair.live = Some(Arc::new(cred.without_box()));
            }
        }
    }

    /// The body of `node`'s current desired state, read back from the database when it was
    /// let go; a newer stored generation (another replica's, SPEC §3.9) is taken on the way.
    /// `None` for a node that is gone.
    pub async fn load_desired(&self, node: &Id) -> Result<Option<(u64, Bytes)>, DbError> {
        let rows = self.db.desired(Some(&[node.to_string()])).await?;
        self.apply_desired(rows.clone());
        let mut st = self.state.write();
        let Some(rec) = st.desired.get_mut(node) else { return Ok(None) };
        if rec.body.is_none() {
            match rows.into_iter().next() {
                Some((_, g, agents)) if g as u64 == rec.generation => *rec = DesiredRec::new(rec.generation, &agents),
                _ => {
                    return Err(DbError::Other(format!(
                        "the stored desired state of node {node} is not generation {}",
                        rec.generation
                    )))
                }
            }
        }
        Ok(rec.body().map(|b| (rec.generation, b)))
    }
}

/// Nodes whose reports one transaction writes ([`Store::flush_reports`]).
pub const FLUSH_CHUNK: usize = 1_000;

fn sorted(v: &[String]) -> Vec<String> {
    let mut v = v.to_vec();
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_api::ReplicaState;

    fn pat(id: &str) -> Arc<Cred> {
        Arc::new(Cred {
            sealed: Sealed::from_base64(id, "c"),
            n: 0,
            principal_id: "p".into(),
            expires_ms: 0,
            issued_ms: 0,
            revoke_ms: MaybeMs::NONE,
        })
    }

    /// A live PAT is found by its pair only; once retired (by a rotation, by the pass, or by
    /// its node's deletion) it leaves the pair and waits by id with its revoke instant, the
    /// earliest one winning on a deletion; each step is recorded for the pass.
    #[test]
    fn a_retired_pat_leaves_its_pair_and_waits_by_id() {
        let mut st = State::default();
        let pair: (Id, Id) = ("a".into(), "n1".into());
        assert!(st.set_active(&pair, pat("p0")).is_none());
        assert_eq!(st.live_cred(&pair).map(|c| c.id().into_owned()).as_deref(), Some("p0"));
        assert!(st.retiring("p0").is_none(), "a live PAT is not kept by id");
        assert!(st.take_changes().creds.contains(&pair));

        // A rotation: the old one is scheduled, then the new one goes live.
        st.schedule_revoke(&pair, "p0", |_| 5_000);
        assert!(st.set_active(&pair, pat("p1")).is_none());
        assert_eq!(st.live_cred(&pair).map(|c| c.id().into_owned()).as_deref(), Some("p1"));
        assert_eq!(st.retiring("p0").and_then(|r| r.cred.revoke_ms.get()), Some(5_000));

        // Naming a PAT that is not the pair's live one leaves the live one alone.
        st.schedule_revoke(&pair, "nope", |_| 1);
        assert_eq!(st.live_cred(&pair).map(|c| c.id().into_owned()).as_deref(), Some("p1"));

        // The node is deleted: both are due now, the earlier instant kept.
        let rec = NodeRec {
            id: "n1".into(),
            name: "one".into(),
            token_hash: [0; 32],
            public_key: [0; 32],
            joined_ms: 0,
            last_seen_ms: 0,
            info: NodeInfo::default(),
            allow: BTreeMap::new(),
            lifecycle: Default::default(),
        };
        let deleted = st.forget_node(&rec, 3_000);
        let mut revoked = deleted.revoke.clone();
        revoked.sort();
        assert_eq!(revoked, ["p0", "p1"]);
        assert!(st.live_cred(&pair).is_none());
        assert_eq!(st.retiring("p0").and_then(|r| r.cred.revoke_ms.get()), Some(3_000));
        assert_eq!(st.retiring("p1").and_then(|r| r.cred.revoke_ms.get()), Some(3_000));
        assert_eq!(st.retiring_creds().count(), 2);
    }

    fn report(labels: &[&str], secrets: &[&str], seq: u64) -> ObservedReport {
        ObservedReport {
            applied_generation: 1,
            health: Health::Ok,
            labels: labels.iter().map(|s| s.to_string()).collect(),
            executor_kinds: vec!["k".into()],
            executor_images: BTreeMap::new(),
            capacity: Capacity { slots: 2, cpus: None, memory_mb: None },
            secrets: secrets.iter().map(|s| s.to_string()).collect(),
            replicas: vec![],
            version: "t".into(),
            boot_id: Some("b".into()),
            seq: Some(seq),
            observe_seconds: None,
        }
    }

    #[test]
    fn a_desired_state_is_served_as_built_and_its_agents_read_back() {
        let agents = r#"[{"agentKey":"a","note":"é"}]"#;
        let d = DesiredRec::new(7, agents);
        assert_eq!(d.agents_bytes().as_deref(), Some(agents.as_bytes()));
        let body: serde_json::Value = serde_json::from_slice(&d.body().unwrap()).unwrap();
        assert_eq!(body["generation"], 7);
        assert_eq!(body["agents"][0]["note"], "é");
        assert_eq!(DesiredRec::new(1, "[]").agents_bytes().as_deref(), Some(&b"[]"[..]));
        let stored = DesiredRec::stored(3, agents);
        assert_eq!(stored.body(), None);
        assert!(stored.same_agents(agents.as_bytes()) && d.same_agents(agents.as_bytes()));
        assert!(!stored.same_agents(b"[]") && !d.same_agents(b"[]"));
    }

    /// A live PAT is one allocation of jemalloc's 80-byte class (its `Arc` header included)
    /// besides the one of its id and sealed box: 100,000 of them at 10,000 nodes.
    #[test]
    fn a_credential_fits_in_80_bytes() {
        assert!(std::mem::size_of::<Cred>() + 16 <= 80, "Cred is {} bytes", std::mem::size_of::<Cred>());
        assert_eq!(MaybeMs::from(Some(5)).get(), Some(5));
        assert_eq!(MaybeMs::from(None).get(), None);
    }

    #[test]
    fn a_body_built_in_place_is_one_buffer_its_stored_agents_share() {
        let agents = r#"[{"agentKey":"b"}]"#;
        let built = DesiredRec::build(4, |b| b.extend_from_slice(agents.as_bytes()));
        assert_eq!(built.body(), DesiredRec::new(4, agents).body());
        let (body, slice) = (built.body().unwrap(), built.agents_bytes().unwrap());
        assert_eq!(&slice[..], agents.as_bytes());
        // The stored slice points into the served body: one copy of the JSON, not two.
        let inside = body.as_ptr_range();
        assert!(inside.contains(&slice.as_ptr()) && slice.as_ptr_range().end < inside.end);
        assert!(DesiredRec::stored(4, agents).same_agents(&slice));
    }

    #[tokio::test]
    async fn a_report_changes_something_only_after_normalising() {
        for fresh in db::testing::each() {
            eprintln!("on {}", fresh.backend);
            a_report_on(&Store::open(&fresh.url).await.unwrap()).await;
        }
    }

    #[tokio::test]
    async fn reports_are_flushed_in_chunks_until_none_is_dirty() {
        let fresh = db::testing::each().into_iter().next().unwrap();
        let store = Store::open(&fresh.url).await.unwrap();
        let mut ids = Vec::new();
        for i in 0..5 {
            ids.push(join_node(&store, &format!("n{i}"), &[]).await);
        }
        let now = clock::now_ms();
        for id in &ids {
            store.report(id, report(&["flushed"], &[], 1), now, Duration::from_secs(60));
        }
        assert_eq!(store.flush_reports_by(2).await.unwrap(), 5, "three chunks of two, two, one");
        assert!(store.state.read().dirty_nodes.is_empty());
        let stored = store.db.nodes(None).await.unwrap();
        assert_eq!(stored.iter().filter(|n| n.info.contains("flushed")).count(), 5);
        assert_eq!(store.flush_reports_by(2).await.unwrap(), 0, "nothing left to write");
    }

    /// A status sent settles the want it was derived for, or a want of the body itself; a
    /// want a later pass set meanwhile (another body) stays to be sent.
    #[tokio::test]
    async fn a_sent_status_settles_the_want_it_was_derived_for() {
        let fresh = db::testing::each().into_iter().next().unwrap();
        let store = Store::open(&fresh.url).await.unwrap();
        let agent: Id = "a".into();
        let body = |ready: u32| StatusBody {
            phase: kept::Phase::Pending,
            reason: None,
            node: None,
            observed_revision: None,
            ready_replicas: ready,
            desired_replicas: 2,
            replicas: vec![],
        };
        let want = |st: &Store| st.state.read().statuses_want.get(&agent).copied();
        let (old, later) = (kept::Sent::of(&body(0)), kept::Sent::of(&body(2)));

        // Derived while the pass wanted `old`; the body sent is newer: the want is settled.
        store.state.write().statuses_want.insert(agent.clone(), old);
        store.status_sent(&agent, body(1), old).await;
        assert_eq!(want(&store), None);
        assert!(store.state.read().statuses_sent.get(&agent).is_some_and(|s| s.is(&body(1))));

        // A later pass wanted another body while this one was on its way: it stays.
        store.state.write().statuses_want.insert(agent.clone(), later);
        store.status_sent(&agent, body(1), old).await;
        assert_eq!(want(&store), Some(later));

        // The body the later pass wanted is the one sent: settled.
        store.status_sent(&agent, body(2), old).await;
        assert_eq!(want(&store), None);
    }

    /// Joins a node named `name` with a fresh key and these labels; its id.
    async fn join_node(store: &Store, name: &str, labels: &[&str]) -> Id {
        let (key, _) = store.issue_join_key(Duration::from_secs(60), "").await.unwrap();
        let (_, pk) = fleet_api::seal::generate_keypair();
        use base64::Engine;
        let req = JoinRequest {
            join_key: key,
            name: name.into(),
            public_key: base64::engine::general_purpose::STANDARD.encode(pk),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            executor_kinds: vec!["k".into()],
            executor_images: BTreeMap::new(),
            capacity: Capacity { slots: 2, cpus: None, memory_mb: None },
            secrets: vec![],
            version: "t".into(),
        };
        store.join(&req).await.unwrap().node_id.into()
    }

    async fn a_report_on(store: &Store) {
        let id = join_node(store, "n", &["b", "a"]).await;
        let now = clock::now_ms();
        let ttl = Duration::from_secs(60);
        let got = store.report(&id, report(&["b", "a", "a"], &[], 1), now, ttl);
        assert_eq!(
            got,
            ReportOutcome::Accepted { changed: false, was_online: true },
            "order and duplicates are no change"
        );
        let got = store.report(&id, report(&["a"], &[], 2), now, ttl);
        assert_eq!(got, ReportOutcome::Accepted { changed: true, was_online: true });
        let mut r = report(&["a"], &[], 3);
        let replica = |i: u32| fleet_api::ReplicaReport {
            agent_key: "x".into(),
            revision: 1,
            replica: i,
            state: ReplicaState::Running,
            restarts: 0,
            last_exit_code: None,
            message: None,
        };
        // Ten replicas in room for sixteen, as parsing leaves them: kept at their length.
        r.replicas = Vec::with_capacity(16);
        r.replicas.extend((0..10).map(replica));
        assert_eq!(store.report(&id, r, now, ttl), ReportOutcome::Accepted { changed: true, was_online: true });
        let kept = store.state.read().nodes[&id].info.replicas.capacity();
        assert_eq!(kept, 10, "the report's replicas are kept at their length");
        assert_eq!(store.report(&id, report(&["a"], &[], 3), now, ttl), ReportOutcome::Stale);
        let later = now + 61_000;
        let got = store.report(&id, report(&["a"], &[], 4), later, ttl);
        assert_eq!(got, ReportOutcome::Accepted { changed: true, was_online: false });
    }
}
