//! The reconcile pass (SPEC §3.4): level-based and single-flight. It reads the agents, marks
//! liveness, places replicas, asks the work queue for identities and PATs, rebuilds each
//! node's desired state (bumping a generation only when the content changed), retires PATs
//! no longer needed and computes statuses — queueing a CP write only where one changed.
//!
//! It is incremental, because at 10,000 nodes whole-fleet work costs half a second a pass:
//! [`Memo`] keeps what the last pass computed, and the registry records what changed since
//! ([`crate::store::Changes`]: node facts and reports, credentials, identities); the agent
//! list is diffed against the last one and every node's liveness is checked. Placement runs
//! only when something it reads changed; desired states, statuses, placement items and
//! retirements are recomputed for the agents and nodes a change touched. The first pass
//! computes everything. [`super::audit::audit`] recomputes from scratch and lists where the published
//! state differs (`audit.rs`); the tests hold the incremental pass to it. The agent list
//! comes from the CP watcher (`agents.rs`), desired-state bodies from `desired.rs`.

use super::desired::{agent_fingerprint, desired_json, input_hash, Entry};
use super::placement::{self, Bindings, Demand, NodeFacts, Outcome};
use super::status::{self, ReplicaInput, StatusBody, StatusInput};
use super::views::{agent_views, ViewMap};
use super::work::{rotate_at_ms, WorkKey};
use crate::clock;
use crate::context::Ctx;
use crate::metrics::labels;
use crate::model::{Agent, AgentList, AgentState, IdentityKind};
use crate::store::db::PassWrite;
use crate::store::{Cred, DesiredRec, Id, NodeRec};
use fleet_api::PlacementView;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a triggered pass waits for more triggers to land in it. Short: a pass costs
/// what changed, so coalescing buys little, and every node's wake waits for it.
const SETTLE: Duration = Duration::from_millis(5);

/// A changed status is sent this long after its first change, with whatever it says by
/// then: an agent coming up changes its status every few milliseconds (each PAT, each
/// replica reported), and the CP needs the result, not every step.
const STATUS_DEBOUNCE: Duration = Duration::from_secs(1);

/// Every node and agent is derived again from the registry at least this often, a slice per
/// pass in proportion to the time since the last one. The registry records its changes for
/// the pass, but the pass stays level-based (SPEC §3.4: a missed event breaks nothing): a
/// change that was never recorded is healed within this period.
pub const RESYNC: Duration = Duration::from_secs(300);

/// Revoke delay for a PAT whose agent left the active list entirely.
pub const VANISHED_DRAIN: Duration = Duration::from_secs(30);

/// The pass loop: runs on every trigger (coalesced) and every `FLEET_RECONCILE_SECONDS`.
pub async fn run(ctx: Arc<Ctx>) {
    // The earliest instant an online node crosses its offline threshold: a node going silent
    // is no event, so the loop wakes for it. With healthy reports this instant keeps receding.
    let mut next_offline: Option<i64> = None;
    let mut memo = Memo::default();
    loop {
        let tick = match next_offline {
            Some(at) => ctx.cfg.reconcile_every.min(Duration::from_millis((at - clock::now_ms()).max(0) as u64)),
            None => ctx.cfg.reconcile_every,
        };
        tokio::select! {
            _ = ctx.trigger.notified() => {}
            _ = tokio::time::sleep(tick) => {}
        }
        // A short settle lets a burst of reports land in one pass.
        tokio::time::sleep(SETTLE).await;
        let started = Instant::now();
        match pass(&ctx, &mut memo).await {
            Ok(at) => next_offline = at,
            Err(e) => {
                // The memo may be ahead of what was stored: start over with a full pass.
                memo = Memo::default();
                ctx.metrics.pass_errors.inc();
                tracing::error!(error = %e, "reconcile pass failed; the next one retries");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        ctx.metrics.passes.inc();
        ctx.metrics.pass_seconds.observe(started.elapsed().as_secs_f64());
        ctx.metrics.queue_depth.set(ctx.queue.depth() as i64);
        ctx.metrics.longpolls_held.set(ctx.store.hub.held_total() as i64);
        ctx.metrics.sample_memory();
    }
}

pub(super) fn demand(a: &Agent) -> Option<Demand> {
    let spec = a.placed_spec()?;
    let res = a.resources();
    Some(Demand {
        key: a.key.as_str().into(),
        replicas: spec.replicas,
        kind: a.executor.kind.clone(),
        image: a.executor.image.clone(),
        requires: spec.requires.clone(),
        secrets: spec.secrets.clone(),
        cpus: res.cpus,
        memory_mb: res.memory_mb,
    })
}

/// What placement needs of a node. `online` is filled in by the caller.
pub(super) fn facts_of(n: &NodeRec, online: bool) -> NodeFacts {
    NodeFacts {
        id: n.id.clone(),
        name: n.name.clone(),
        online,
        kinds: n.info.executor_kinds.clone(),
        images: n.allow.clone(),
        labels: n.info.labels.clone(),
        secrets: n.info.secrets.clone(),
        capacity: n.info.capacity.clone(),
    }
}

/// node → agent → its replica indexes there (sorted).
type PerNode = HashMap<Id, BTreeMap<Id, Vec<u32>>>;

pub(super) fn per_node_of(outcome: &Outcome) -> PerNode {
    let mut per_node: PerNode = HashMap::default();
    for ((agent, r), node) in &outcome.bindings {
        per_node.entry(node.clone()).or_default().entry(agent.clone()).or_default().push(*r);
    }
    per_node
}

fn is_placed(per_node: &PerNode, pair: &(Id, Id)) -> bool {
    per_node.get(&pair.1).is_some_and(|m| m.contains_key(&pair.0))
}

/// What the pass keeps from one run to the next, so that it recomputes only what the
/// changes since then touch. The first pass (and the one after a failed pass) starts from
/// an empty memo and computes everything.
#[derive(Default)]
pub struct Memo {
    primed: bool,
    /// The agent list the last pass saw, and each key's position in it.
    agents: AgentList,
    index: HashMap<Id, usize>,
    fingerprints: HashMap<Id, u64>,
    /// Every node's placement facts as of the last pass, online state included.
    facts: Vec<NodeFacts>,
    fact_at: HashMap<Id, usize>,
    per_node: PerNode,
    /// The live credential of each (agent, node) pair.
    creds: HashMap<(Id, Id), Arc<Cred>>,
    views: ViewMap,
    /// No online node goes offline before this instant (ms); `i64::MAX`: none online.
    next_check: i64,
    /// The nodes gauge by (status, health), and what each node counts as; kept by delta.
    node_gauge: HashMap<(&'static str, &'static str), i64>,
    node_counted: HashMap<Id, (&'static str, &'static str)>,
    /// Where the rolling resync continues, and when the last pass ran (ms).
    resync_nodes: usize,
    resync_agents: usize,
    last_pass_ms: i64,
    /// The placements gauge by (status, reason): replicas and items, kept by delta.
    placement_gauge: HashMap<(&'static str, String), (i64, i64)>,
}

impl Memo {
    fn node(&self, id: &Id) -> Option<&NodeFacts> {
        self.fact_at.get(id).map(|&i| &self.facts[i])
    }

    fn name<'a>(&'a self, id: &'a Id) -> &'a str {
        self.node(id).map(|f| &*f.name).unwrap_or(id)
    }

    fn agent(&self, key: &str) -> Option<&Agent> {
        self.index.get(key).map(|&i| &self.agents[i])
    }
}

/// One pass. Returns the instant (ms) the next online node would go offline, if any.
pub async fn pass(ctx: &Ctx, memo: &mut Memo) -> Result<Option<i64>, crate::store::db::DbError> {
    let mut w = PassWrite::default();
    let mut phases = Phases::new();
    let now = clock::now_ms();
    let offline_after = ctx.cfg.node_offline_after;
    let full = !memo.primed;

    // What changed since the last pass; then read what it touched. No lock is held past
    // these blocks.
    let mut changes = std::mem::take(&mut ctx.store.state.write().changes);
    let mut flips: Vec<Id> = Vec::new();
    // The resync slices: the share of nodes and agents re-derived by this pass.
    let elapsed = if full { 0 } else { (now - memo.last_pass_ms).max(0) };
    let slice = |len: usize| ((len as i64 * elapsed / RESYNC.as_millis() as i64) as usize + 1).min(len);
    let (agents, previous, next_offline) = {
        let st = ctx.store.state.read();
        if full {
            // Online starts false so that every online node counts as a flip below.
            memo.facts = st.nodes.values().map(|n| facts_of(n, false)).collect();
            memo.fact_at = memo.facts.iter().enumerate().map(|(i, f)| (f.id.clone(), i)).collect();
            memo.creds =
                st.active.iter().filter_map(|(pair, id)| st.creds.get(id).map(|c| (pair.clone(), c.clone()))).collect();
        } else {
            resync_nodes(&st, memo, slice(memo.facts.len()), &mut changes);
            for id in &changes.facts {
                let Some(n) = st.nodes.get(id) else { continue };
                match memo.fact_at.get(id) {
                    // The online state is kept, so a node that comes back with new facts
                    // still counts as a flip.
                    Some(&i) => memo.facts[i] = facts_of(n, memo.facts[i].online),
                    None => {
                        memo.fact_at.insert(id.clone(), memo.facts.len());
                        memo.facts.push(facts_of(n, false));
                    }
                }
            }
            for pair in &changes.creds {
                match st.active.get(pair).and_then(|id| st.creds.get(id)) {
                    Some(c) => memo.creds.insert(pair.clone(), c.clone()),
                    None => memo.creds.remove(pair),
                };
            }
        }
        // Liveness is time. No online node can go offline before the earliest deadline the
        // last whole scan found (last seen only grows), so the whole fleet is scanned only
        // once that instant has come; in between, only the nodes that reported after being
        // offline, changed their report period or joined are looked at.
        let mut check = |f: &mut NodeFacts, next: &mut i64| {
            let Some(n) = st.nodes.get(&f.id) else { return };
            let online = n.online(now, offline_after);
            if online != f.online {
                f.online = online;
                flips.push(f.id.clone());
            }
            if online {
                *next = (*next).min(n.last_seen_ms + n.threshold(offline_after).as_millis() as i64 + 1);
            }
        };
        if full || now >= memo.next_check {
            let mut next = i64::MAX;
            for f in memo.facts.iter_mut() {
                check(f, &mut next);
            }
            memo.next_check = next;
        } else {
            let mut next = memo.next_check;
            for id in changes.seen.iter().chain(changes.facts.iter()) {
                if let Some(&i) = memo.fact_at.get(id) {
                    check(&mut memo.facts[i], &mut next);
                }
            }
            memo.next_check = next;
        }
        let next_offline = (memo.next_check != i64::MAX).then_some(memo.next_check);
        (st.agents.clone(), st.outcome.clone(), next_offline)
    };

    // Agents added, removed or edited since the last pass. The old list is dropped at the
    // end of the pass, after the nodes have their new desired states.
    let mut changed_agents: HashSet<Id> = HashSet::default();
    let mut demand_changed = full;
    let mut old_agents: Option<AgentList> = None;
    if full || !Arc::ptr_eq(&memo.agents, &agents) {
        let old = std::mem::replace(&mut memo.agents, agents.clone());
        let mut note = |before: Option<&Agent>, after: Option<&Agent>, memo: &mut Memo| {
            let key: Id = before.or(after).map(|a| a.key.as_str()).unwrap_or_default().into();
            demand_changed |= before.and_then(demand) != after.and_then(demand);
            match after {
                Some(a) => memo.fingerprints.insert(key.clone(), agent_fingerprint(a)),
                None => memo.fingerprints.remove(&key),
            };
            changed_agents.insert(key);
        };
        if !full && crate::store::same_keys(&old, &agents) {
            // The usual edit: same keys in the same order; compare in place, keep the index.
            for (before, after) in old.iter().zip(agents.iter()) {
                if before != after {
                    note(Some(before), Some(after), memo);
                }
            }
        } else {
            let old_index = std::mem::take(&mut memo.index);
            memo.index = agents.iter().enumerate().map(|(i, a)| (Id::from(a.key.as_str()), i)).collect();
            for a in agents.iter() {
                let before = old_index.get(a.key.as_str()).map(|&i| &old[i]);
                if before != Some(a) {
                    note(before, Some(a), memo);
                }
            }
            for (key, &i) in &old_index {
                if !memo.index.contains_key(key) {
                    note(Some(&old[i]), None, memo);
                }
            }
        }
        old_agents = Some(old);
    }
    // The agents' share of the resync: what they take from the registry besides the list
    // (reports and identities, so their statuses and identity work) is looked at again.
    let mut resynced_agents: Vec<Id> = Vec::new();
    if !full && !agents.is_empty() {
        for _ in 0..slice(agents.len()) {
            memo.resync_agents = (memo.resync_agents + 1) % agents.len();
            resynced_agents.push(agents[memo.resync_agents].key.as_str().into());
        }
    }
    phases.mark("snapshot");

    // Place, when anything placement reads has changed; otherwise the last outcome stands
    // (placement is a fixed point of its own output).
    let replaced = full || demand_changed || !changes.facts.is_empty() || !flips.is_empty();
    let outcome: Arc<Outcome> = if replaced {
        let demands: Vec<Demand> = agents.iter().filter_map(demand).collect();
        Arc::new(placement::place(&demands, &memo.facts, &previous.bindings))
    } else {
        previous.clone()
    };
    // Agents whose bindings, waiting count or stuck replicas changed; nodes that gained or
    // lost a replica; pairs whose presence may have changed, with whether they were placed.
    let mut touched_agents: HashSet<Id> = HashSet::default();
    let mut touched_nodes: HashSet<Id> = HashSet::default();
    let mut touched_pairs: HashMap<(Id, Id), bool> = HashMap::default();
    if replaced {
        let events = diff_bindings(&previous.bindings, &outcome, memo, &mut w);
        if full {
            memo.per_node = per_node_of(&outcome);
        } else {
            for (agent, r, from, to) in events {
                touched_agents.insert(agent.clone());
                if let Some(node) = from {
                    let pair = (agent.clone(), node.clone());
                    touched_pairs.entry(pair).or_insert(true);
                    if let Some(m) = memo.per_node.get_mut(&node) {
                        if let Some(reps) = m.get_mut(&agent) {
                            reps.retain(|x| *x != r);
                            if reps.is_empty() {
                                m.remove(&agent);
                            }
                        }
                    }
                    touched_nodes.insert(node);
                }
                if let Some(node) = to {
                    let pair = (agent.clone(), node.clone());
                    let was = is_placed(&memo.per_node, &pair);
                    touched_pairs.entry(pair).or_insert(was);
                    let reps = memo.per_node.entry(node.clone()).or_default().entry(agent.clone()).or_default();
                    if let Err(at) = reps.binary_search(&r) {
                        reps.insert(at, r);
                    }
                    touched_nodes.insert(node);
                }
            }
            for (key, w) in previous.waiting.iter().chain(outcome.waiting.iter()) {
                if previous.waiting.get(key) != Some(w) || outcome.waiting.get(key) != Some(w) {
                    touched_agents.insert(key.clone());
                }
            }
            for k in previous.stuck.symmetric_difference(&outcome.stuck) {
                touched_agents.insert(k.0.clone());
            }
        }
    }
    drop(previous);

    phases.mark("place");
    // Identities and PATs: what is missing or due; queued after publishing, since the
    // workers check the published placements. Due rotations requeue themselves in the
    // work queue; a pass looks at new pairs and changed credentials.
    let mut work: Vec<WorkKey> = Vec::new();
    {
        let st = ctx.store.state.read();
        let needs_identity = |a: &Agent| {
            a.identity.kind == IdentityKind::Agent && !st.identities.get(a.key.as_str()).is_some_and(|i| i.bound)
        };
        if full {
            work.extend(agents.iter().filter(|a| needs_identity(a)).map(|a| WorkKey::Identity(a.key.as_str().into())));
        } else {
            for key in changed_agents.iter().chain(resynced_agents.iter()) {
                if memo.agent(key).is_some_and(needs_identity) {
                    work.push(WorkKey::Identity(key.clone()));
                }
            }
        }
    }
    let ttl_ms = ctx.cfg.token_ttl_seconds as i64 * 1000;
    let wants_pat = |memo: &Memo, pair: &(Id, Id)| match memo.creds.get(pair) {
        Some(c) => now >= rotate_at_ms(c, ttl_ms),
        None => true,
    };
    // Rotations already due later are scheduled by the worker that issued the PAT; after a
    // start the full pass schedules them again (the queue lives in memory).
    let mut rotations: Vec<(WorkKey, Duration)> = Vec::new();
    if full {
        for (node, m) in &memo.per_node {
            for agent in m.keys() {
                let pair = (agent.clone(), node.clone());
                match memo.creds.get(&pair) {
                    Some(c) if !wants_pat(memo, &pair) => {
                        let due = Duration::from_millis((rotate_at_ms(c, ttl_ms) - now).max(0) as u64);
                        rotations.push((WorkKey::Pat(pair.0, pair.1), due));
                    }
                    _ => work.push(WorkKey::Pat(pair.0, pair.1)),
                }
            }
        }
    } else {
        for pair in touched_pairs.keys().chain(changes.creds.iter()) {
            if is_placed(&memo.per_node, pair) && wants_pat(memo, pair) {
                work.push(WorkKey::Pat(pair.0.clone(), pair.1.clone()));
            }
        }
    }

    phases.mark("identity work");
    // Desired states of the nodes a change touched: their inputs are hashed, and only those
    // whose hash moved are serialised and compared.
    let dirty_nodes: Vec<Id> = if full {
        memo.facts.iter().map(|f| f.id.clone()).collect()
    } else {
        let mut set = touched_nodes;
        set.extend(changes.creds.iter().map(|p| p.1.clone()));
        for key in &changed_agents {
            for (_, node) in outcome.bindings.range((key.clone(), 0)..=(key.clone(), u32::MAX)) {
                set.insert(node.clone());
            }
        }
        set.into_iter().collect()
    };
    let mut new_desired: Vec<(Id, DesiredRec)> = Vec::new();
    let mut new_hashes: Vec<(Id, u64)> = Vec::new();
    {
        let memo = &*memo;
        let entries_of = |node: &Id| -> Vec<Entry> {
            memo.per_node
                .get(node)
                .into_iter()
                .flatten()
                .filter_map(|(agent, reps)| {
                    let a = memo.agent(agent)?;
                    let c = memo.creds.get(&(agent.clone(), node.clone()))?;
                    Some((a, reps.as_slice(), &**c))
                })
                .collect()
        };
        let hashed: Vec<(&Id, u64, Vec<Entry>)> = dirty_nodes
            .iter()
            .map(|node| {
                let entries = entries_of(node);
                let h = input_hash(&entries, &memo.fingerprints);
                (node, h, entries)
            })
            .collect();
        // (node, new hash, entries, the desired state it has now)
        type Changed<'a> = (&'a Id, u64, Vec<Entry<'a>>, Option<DesiredRec>);
        let changed: Vec<Changed> = {
            let st = ctx.store.state.read();
            hashed
                .into_iter()
                .filter(|(node, h, _)| st.desired_hashes.get(*node) != Some(h))
                .map(|(node, h, e)| {
                    let current = st.desired.get(node).cloned();
                    (node, h, e, current)
                })
                .collect()
        };
        for (node, h, entries, current) in changed {
            new_hashes.push((node.clone(), h));
            let json = desired_json(&entries, &ctx.cfg.iam_tenant);
            if current.as_ref().map(DesiredRec::agents) != Some(&*json) {
                let generation = current.map_or(0, |d| d.generation) + 1;
                tracing::info!(node = %memo.name(node), generation, agents = entries.len(), "desired state changed");
                w.desired.push((node.to_string(), generation, json.to_string()));
                new_desired.push((node.clone(), DesiredRec::new(generation, &json)));
            }
        }
    }

    phases.mark("desired");
    // PATs no longer needed are retired: revoked after the drain window, or at once when
    // their node is offline (nothing there can use it for a draining run).
    let candidates: Vec<(Id, Id)> = if full {
        memo.creds.keys().cloned().collect()
    } else {
        touched_pairs.keys().chain(changes.creds.iter()).cloned().collect()
    };
    let mut retired: Vec<(String, i64)> = Vec::new();
    for pair in candidates {
        if is_placed(&memo.per_node, &pair) {
            continue;
        }
        let Some(c) = memo.creds.remove(&pair) else { continue };
        let delay = if !memo.node(&pair.1).is_some_and(|f| f.online) {
            Duration::ZERO
        } else {
            match memo.agent(&pair.0) {
                Some(a) => Duration::from_secs(a.drain_seconds),
                None => VANISHED_DRAIN,
            }
        };
        let at = now + delay.as_millis() as i64;
        tracing::info!(agent = %pair.0, node = %memo.name(&pair.1), credential = %c.id, in_seconds = delay.as_secs(), "PAT no longer needed; revoking after the drain window");
        retired.push((c.id.clone(), at));
        w.retire.push((c.id.clone(), at));
    }

    phases.mark("retire");
    // Statuses of the agents a change touched.
    let status_agents: Vec<Id> = if full {
        agents.iter().map(|a| Id::from(a.key.as_str())).collect()
    } else {
        let mut set = changed_agents.clone();
        set.extend(resynced_agents);
        set.extend(touched_agents.iter().cloned());
        set.extend(changes.identities.iter().cloned());
        set.extend(changes.creds.iter().map(|p| p.0.clone()));
        for node in changes.reports.iter().chain(flips.iter()) {
            if let Some(m) = memo.per_node.get(node) {
                set.extend(m.keys().cloned());
            }
        }
        set.into_iter().collect()
    };
    let statuses: Vec<(Id, Option<StatusBody>)> = {
        let st = ctx.store.state.read();
        let lookup = Lookup {
            node: &|id: &Id| memo.node(id).map(|f| (&*f.name, f.online)),
            has_cred: &|pair: &(Id, Id)| memo.creds.contains_key(pair),
        };
        status_agents
            .into_iter()
            .map(|key| {
                let body =
                    memo.agent(&key).filter(|a| a.gets_status()).map(|a| agent_status(a, &outcome, &st, &lookup));
                (key, body)
            })
            .collect()
    };

    phases.mark("statuses");
    // Placement items of the agents whose agent or placement changed.
    let view_agents: Vec<Id> = if full {
        memo.views = ViewMap::default();
        agents.iter().map(|a| Id::from(a.key.as_str())).collect()
    } else {
        let mut set = changed_agents;
        set.extend(touched_agents);
        set.into_iter().collect()
    };
    let mut views_changed = full;
    if full {
        memo.placement_gauge.clear();
    }
    for key in view_agents {
        let items = memo.agent(&key).map(|a| agent_views(a, &outcome)).unwrap_or_default();
        if !full && memo.views.get(&key) == items.as_slice() {
            continue;
        }
        views_changed = true;
        count_views(&mut memo.placement_gauge, memo.views.get(&key), -1);
        count_views(&mut memo.placement_gauge, &items, 1);
        memo.views.set(key, items);
    }

    // Persist, then publish.
    ctx.store.db.apply_pass(&w).await?;
    phases.mark("persist");
    let mut to_send = Vec::new();
    {
        let mut st = ctx.store.state.write();
        for (node, rec) in new_desired {
            ctx.store.hub.publish(&node, rec.generation);
            st.desired.insert(node, rec);
        }
        for (node, h) in new_hashes {
            st.desired_hashes.insert(node, h);
        }
    }
    // The nodes are woken first; copying the placement items (an `Arc` per agent) comes after.
    let views = views_changed.then(|| Arc::new(memo.views.clone()));
    {
        let mut st = ctx.store.state.write();
        for (id, at) in retired {
            if let Some(c) = st.creds.get_mut(&id).map(Arc::make_mut) {
                c.revoke_ms = Some(at);
                let pair = (c.agent.clone(), c.node.clone());
                st.unset_active(pair, &id);
            }
            ctx.queue.add_after(WorkKey::Revoke(id), Duration::from_millis((at - now).max(0) as u64));
        }
        if replaced {
            st.outcome = outcome.clone();
            if full {
                st.placed_pairs = memo
                    .per_node
                    .iter()
                    .flat_map(|(node, m)| m.keys().map(move |agent| (agent.clone(), node.clone())))
                    .collect();
            } else {
                for pair in touched_pairs.into_keys() {
                    if is_placed(&memo.per_node, &pair) {
                        st.placed_pairs.insert(pair);
                    } else {
                        st.placed_pairs.remove(&pair);
                    }
                }
            }
        }
        if let Some(v) = &views {
            st.views = v.clone();
        }
        if full {
            st.statuses_want.clear();
        }
        for (key, body) in statuses {
            match body {
                Some(body) if st.statuses_sent.get(&key) != Some(&body) => {
                    to_send.push(key.clone());
                    st.statuses_want.insert(key, body);
                }
                _ => {
                    st.statuses_want.remove(&key);
                }
            }
        }
    }
    // A node's PATs are issued together (the queue is first in, first out), so its desired
    // state changes once or twice while a fleet comes up instead of once per replica: each
    // change is a new body built, stored, sent and applied by the node. (Ordered by agent,
    // a 10,000-node fleet saw ~10 desired states per node, and converged no sooner: an
    // agent is ready only when its last replica's node has its PAT.)
    work.sort_unstable_by(|a, b| match (a, b) {
        (WorkKey::Pat(a1, n1), WorkKey::Pat(a2, n2)) => (n1, a1).cmp(&(n2, a2)),
        (WorkKey::Pat(..), _) => std::cmp::Ordering::Greater,
        (_, WorkKey::Pat(..)) => std::cmp::Ordering::Less,
        _ => std::cmp::Ordering::Equal,
    });
    for key in work {
        ctx.queue.add(key);
    }
    for (key, due) in rotations {
        ctx.queue.add_after(key, due);
    }
    for key in to_send {
        ctx.queue.add_after(WorkKey::Status(key), STATUS_DEBOUNCE);
    }
    let gauge_nodes: Vec<Id> = if full {
        memo.node_gauge.clear();
        memo.node_counted.clear();
        memo.facts.iter().map(|f| f.id.clone()).collect()
    } else {
        flips
            .iter()
            .chain(changes.reports.iter())
            .chain(changes.facts.iter())
            .chain(changes.seen.iter())
            .cloned()
            .collect()
    };
    if !gauge_nodes.is_empty() {
        count_nodes(ctx, memo, gauge_nodes);
    }
    if views.is_some() {
        set_placement_gauges(ctx, &memo.placement_gauge);
    }
    memo.primed = true;
    memo.last_pass_ms = now;
    drop(old_agents);
    phases.mark("publish");
    phases.log(full);
    Ok(next_offline)
}

/// The nodes' share of the resync: `count` nodes from where the last pass stopped are read
/// again from the registry. Facts or credentials that differ from the memo are added to
/// `changes` as if recorded (so placement, desired states, PAT work and statuses follow);
/// each node also gets its liveness and gauge checked.
fn resync_nodes(st: &crate::store::State, memo: &mut Memo, count: usize, changes: &mut crate::store::Changes) {
    for _ in 0..count {
        memo.resync_nodes = (memo.resync_nodes + 1) % memo.facts.len();
        let f = &memo.facts[memo.resync_nodes];
        let Some(n) = st.nodes.get(&f.id) else { continue };
        if facts_of(n, f.online) != *f {
            changes.facts.insert(f.id.clone());
        }
        changes.seen.insert(f.id.clone());
        let node = f.id.clone();
        for agent in memo.per_node.get(&node).into_iter().flat_map(|m| m.keys()) {
            let pair = (agent.clone(), node.clone());
            let live = st.active.get(&pair).and_then(|id| st.creds.get(id));
            if live.map(|c| &c.id) != memo.creds.get(&pair).map(|c| &c.id) {
                changes.creds.insert(pair);
            }
        }
    }
}

/// How a status looks up a node (name, online) and whether a pair has its PAT.
pub(super) struct Lookup<'a> {
    pub(super) node: &'a dyn Fn(&Id) -> Option<(&'a str, bool)>,
    pub(super) has_cred: &'a dyn Fn(&(Id, Id)) -> bool,
}

/// One agent's status from its bindings, the nodes' reports and its identity.
pub(super) fn agent_status(a: &Agent, outcome: &Outcome, st: &crate::store::State, lookup: &Lookup) -> StatusBody {
    let key: Id = a.key.as_str().into();
    let desired = a.desired_replicas();
    let stopped = a.state == AgentState::Stopped;
    let mut replicas = Vec::with_capacity(desired as usize);
    let mut pending_pat: Option<String> = None;
    // One range walk over this agent's bindings instead of a lookup per replica.
    let mut bound_to: Vec<Option<&Id>> = vec![None; desired as usize];
    for ((_, r), n) in outcome.bindings.range((key.clone(), 0)..(key.clone(), desired)) {
        bound_to[*r as usize] = Some(n);
    }
    for (r, bound) in (0..desired).zip(bound_to) {
        let node = bound.map(|n| (lookup.node)(n).unwrap_or(("?", false)));
        let report = bound
            .and_then(|n| st.nodes.get(n))
            .and_then(|n| n.info.replicas.iter().find(|p| p.agent_key == a.key && p.replica == r));
        if let Some(n) = bound {
            if pending_pat.is_none() && !(lookup.has_cred)(&(key.clone(), n.clone())) {
                let name = (lookup.node)(n).map(|x| x.0).unwrap_or("?");
                pending_pat = Some(format!("issuing the PAT for node {name}"));
            }
        }
        let stuck = !outcome.stuck.is_empty() && outcome.stuck.contains(&(key.clone(), r));
        replicas.push(ReplicaInput { replica: r, node, stuck, report });
    }
    let identity_ready = st.identities.get(&key).is_some_and(|i| i.bound);
    let identity_pending = match (st.identity_errors.get(&key), identity_ready, pending_pat) {
        (Some(e), _, _) => Some(e.clone()),
        (None, false, _) => Some("creating the agent's IAM identity".to_string()),
        (None, true, p) => p,
    };
    let input =
        StatusInput { stopped, desired, replicas, waiting: outcome.waiting.get(&key).map(|w| w.1), identity_pending };
    status::derive(&input)
}

/// A replica's move between two passes: (agent, replica, from, to).
type Event = (Id, u32, Option<Id>, Option<Id>);

/// Walks the previous and the new bindings together (both ordered by (agent, replica)):
/// records what to store, logs every placement decision and returns the changes, in one
/// linear merge.
fn diff_bindings(prev: &Bindings, next: &Outcome, memo: &Memo, w: &mut PassWrite) -> Vec<Event> {
    use std::cmp::Ordering;
    let mut events = Vec::new();
    let mut a = prev.iter().peekable();
    let mut b = next.bindings.iter().peekable();
    loop {
        let ord = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.cmp(kb),
        };
        match ord {
            Ordering::Less => {
                let ((agent, r), node) = a.next().expect("peeked");
                let why = next.waiting.get(agent).map(|w| w.1).unwrap_or("no longer wanted");
                tracing::info!(agent = %agent, replica = r, node = %memo.name(node), reason = why, "replica unbound");
                w.unbind.push((agent.to_string(), *r));
                events.push((agent.clone(), *r, Some(node.clone()), None));
            }
            Ordering::Greater => {
                let ((agent, r), node) = b.next().expect("peeked");
                tracing::info!(agent = %agent, replica = r, node = %memo.name(node), "replica placed");
                w.bind.push((agent.to_string(), *r, node.to_string()));
                events.push((agent.clone(), *r, None, Some(node.clone())));
            }
            Ordering::Equal => {
                let (_, old) = a.next().expect("peeked");
                let ((agent, r), node) = b.next().expect("peeked");
                if old != node {
                    tracing::info!(agent = %agent, replica = r, from = %memo.name(old), to = %memo.name(node), "replica moved");
                    w.bind.push((agent.to_string(), *r, node.to_string()));
                    events.push((agent.clone(), *r, Some(old.clone()), Some(node.clone())));
                }
            }
        }
    }
    events
}

/// Moves `nodes` to their current (status, health) in the nodes gauge.
fn count_nodes(ctx: &Ctx, memo: &mut Memo, nodes: Vec<Id>) {
    {
        let st = ctx.store.state.read();
        for id in nodes {
            let Some(f) = memo.node(&id) else { continue };
            let status = if f.online { "online" } else { "offline" };
            let health = st.nodes.get(&id).and_then(|n| n.info.health).unwrap_or(fleet_api::Health::Ok).as_str();
            if let Some(old) = memo.node_counted.insert(id, (status, health)) {
                *memo.node_gauge.entry(old).or_default() -= 1;
            }
            *memo.node_gauge.entry((status, health)).or_default() += 1;
        }
    }
    memo.node_gauge.retain(|_, v| *v != 0);
    ctx.metrics.nodes.clear();
    for ((s, h), v) in &memo.node_gauge {
        ctx.metrics.nodes.get_or_create(&labels(&[("status", s), ("health", h)])).set(*v);
    }
}

/// Adds (`sign` 1) or takes away (-1) some items' share of the placements gauge.
pub(super) fn count_views(gauge: &mut HashMap<(&'static str, String), (i64, i64)>, items: &[PlacementView], sign: i64) {
    for v in items {
        let key = (v.status.as_str(), v.reason.clone().unwrap_or_default());
        let e = gauge.entry(key.clone()).or_default();
        e.0 += sign * v.replicas as i64;
        e.1 += sign;
        if e.1 == 0 {
            gauge.remove(&key);
        }
    }
}

fn set_placement_gauges(ctx: &Ctx, gauge: &HashMap<(&'static str, String), (i64, i64)>) {
    ctx.metrics.placements.clear();
    for ((s, r), (replicas, _)) in gauge {
        ctx.metrics.placements.get_or_create(&labels(&[("status", s), ("reason", r)])).set(*replicas);
    }
}

/// Where a pass spends its time, logged at debug level
/// (`RUST_LOG=fleet_controller::reconcile::pass=debug`): the first thing to read when passes
/// are slow.
struct Phases {
    last: Instant,
    start: Instant,
    marks: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn new() -> Phases {
        let now = Instant::now();
        Phases { last: now, start: now, marks: Vec::with_capacity(10) }
    }

    fn mark(&mut self, phase: &'static str) {
        let now = Instant::now();
        self.marks.push((phase, now - self.last));
        self.last = now;
    }

    fn log(&self, full: bool) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let parts: Vec<String> =
                self.marks.iter().map(|(p, d)| format!("{p} {:.1}ms", d.as_secs_f64() * 1e3)).collect();
            tracing::debug!(total_ms = self.start.elapsed().as_secs_f64() * 1e3, full, phases = %parts.join(", "), "pass timing");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NodeInfo, State};

    fn node(id: &str, labels: &[&str]) -> NodeRec {
        NodeRec {
            id: id.into(),
            name: id.into(),
            token_hash: [0; 32],
            public_key: [0; 32],
            joined_ms: 0,
            last_seen_ms: 0,
            info: NodeInfo { labels: labels.iter().map(|l| l.to_string()).collect(), ..Default::default() },
            allow: BTreeMap::new(),
        }
    }

    fn cred(id: &str, agent: &str, node: &str) -> Arc<Cred> {
        Arc::new(Cred {
            id: id.into(),
            agent: agent.into(),
            node: node.into(),
            n: 0,
            principal_id: "p".into(),
            ciphertext: "c".into(),
            expires_ms: 0,
            issued_ms: 0,
            revoke_ms: None,
        })
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
            st.nodes.insert(id.into(), rec);
        }
        // n1 gained a label behind the memo's back; a1's PAT on n2 was replaced.
        st.nodes.get_mut("n1").unwrap().info.labels = vec!["gpu".into()];
        memo.per_node.entry("n2".into()).or_default().insert("a1".into(), vec![0]);
        let pair: (Id, Id) = ("a1".into(), "n2".into());
        memo.creds.insert(pair.clone(), cred("old", "a1", "n2"));
        st.creds.insert("new".into(), cred("new", "a1", "n2"));
        st.active.insert(pair.clone(), "new".into());

        let mut changes = crate::store::Changes::default();
        resync_nodes(&st, &mut memo, 1, &mut changes);
        assert_eq!(changes.seen.len(), 1, "one node per slice of one");
        resync_nodes(&st, &mut memo, 2, &mut changes);
        assert_eq!(changes.seen.len(), 3, "the sweep wraps round every node");
        assert_eq!(changes.facts.iter().map(|i| &**i).collect::<Vec<_>>(), vec!["n1"]);
        assert_eq!(changes.creds.iter().cloned().collect::<Vec<_>>(), vec![pair]);
    }
}
