//! The reconcile pass (SPEC §3.4): level-based and single-flight. It reads the agents, marks
//! liveness, places replicas, asks the work queue for identities and PATs, rebuilds each
//! node's desired state (bumping a generation only when the content changed), retires PATs
//! no longer needed and computes statuses — queueing a CP write only where one changed.

use super::placement::{self, Bindings, Demand, NodeFacts, Outcome};
use super::status::{self, ReplicaInput, StatusBody, StatusInput};
use super::views::placement_views;
use super::work::{rotate_at_ms, WorkKey};
use crate::clock;
use crate::context::Ctx;
use crate::metrics::labels;
use crate::model::{Agent, AgentState, IdentityKind};
use crate::platform::cp::AgentsFetch;
use crate::store::db::PassWrite;
use crate::store::{DesiredRec, Id};
use fleet_api::{DesiredAgent, DesiredIdentity, Executor, SealedCredential};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet, FxHasher as DefaultHasher};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Revoke delay for a PAT whose agent left the active list entirely.
pub const VANISHED_DRAIN: Duration = Duration::from_secs(30);

/// The pass loop: runs on every trigger (coalesced) and every `FLEET_RECONCILE_SECONDS`.
pub async fn run(ctx: Arc<Ctx>) {
    // The earliest instant an online node crosses its offline threshold: a node going silent
    // is no event, so the loop wakes for it. With healthy reports this instant keeps receding.
    let mut next_offline: Option<i64> = None;
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
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        match pass(&ctx).await {
            Ok(at) => next_offline = at,
            Err(e) => {
                ctx.metrics.pass_errors.inc();
                tracing::error!(error = %e, "reconcile pass failed; the next one retries");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        ctx.metrics.passes.inc();
        ctx.metrics.pass_seconds.observe(started.elapsed().as_secs_f64());
        ctx.metrics.queue_depth.set(ctx.queue.depth() as i64);
        ctx.metrics.longpolls_held.set(ctx.store.hub.held_total() as i64);
    }
}

/// How often the CP watcher asks whether the agent list changed. With the ETag an unchanged
/// list costs one `304`, so agent changes reach nodes in seconds whatever the tick.
pub const CP_WATCH_EVERY: Duration = Duration::from_secs(2);

/// Watches the CP's agent list and triggers a pass when it changed (the "CP change" trigger).
pub async fn watch_cp(ctx: Arc<Ctx>) {
    loop {
        tokio::time::sleep(CP_WATCH_EVERY).await;
        let mut w = PassWrite::default();
        if refresh_agents(&ctx, &mut w).await {
            if let Err(e) = ctx.store.db.apply_pass(&w).await {
                tracing::error!(error = %e, "cannot store the agent list");
            }
            ctx.kick();
        }
    }
}

/// Reads the agent list; returns whether it changed (and stores it in memory; the caller persists `w`).
async fn refresh_agents(ctx: &Ctx, w: &mut PassWrite) -> bool {
    let etag = ctx.store.state.read().agents_etag.clone();
    match ctx.cp.list_agents(etag.as_deref()).await {
        Ok(AgentsFetch::NotModified) => {
            ctx.metrics.call("cp", "list_agents", "not_modified");
            false
        }
        Ok(AgentsFetch::List { mut agents, skipped, etag }) => {
            ctx.metrics.call("cp", "list_agents", "ok");
            for s in &skipped {
                ctx.metrics.agents_skipped.inc();
                tracing::error!(agent = s.key.as_deref().unwrap_or("?"), reason = %s.reason, "CP agent item skipped");
            }
            agents.sort_by(|a, b| a.key.cmp(&b.key));
            let changed = {
                let st = ctx.store.state.read();
                *st.agents != agents || st.agents_etag != etag
            };
            if changed {
                w.kv.push(("agents".into(), serde_json::to_string(&agents).unwrap_or_else(|_| "[]".into())));
                w.kv.push(("agents_etag".into(), etag.clone().unwrap_or_default()));
                let mut st = ctx.store.state.write();
                st.set_agents(Arc::new(agents));
                st.agents_etag = etag;
            }
            changed
        }
        Err(e) => {
            ctx.metrics.call("cp", "list_agents", e.outcome());
            tracing::warn!(error = %e, "cannot read agents from the CP; using the last known list");
            false
        }
    }
}

fn demand(a: &Agent) -> Option<Demand> {
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

/// Hash of what a node's desired state is built from: when it is unchanged the body is too,
/// and the pass skips serialising it.
/// One agent on one node: the agent, its replica indexes there, the pair's credential.
type Entry<'a> = (&'a Agent, &'a [u32], &'a crate::store::Cred);

fn input_hash(entries: &[Entry], fingerprints: &HashMap<&str, u64>) -> u64 {
    let mut h = DefaultHasher::default();
    for (a, reps, c) in entries {
        a.key.hash(&mut h);
        fingerprints.get(a.key.as_str()).hash(&mut h);
        reps.hash(&mut h);
        c.id.hash(&mut h);
    }
    h.finish()
}

/// Everything of an agent that goes into a desired state.
fn agent_fingerprint(a: &Agent) -> u64 {
    let mut h = DefaultHasher::default();
    a.revision.hash(&mut h);
    a.executor.hash(&mut h);
    serde_json::to_string(&a.placement).unwrap_or_default().hash(&mut h);
    a.drain_seconds.hash(&mut h);
    h.finish()
}

fn desired_agent(a: &Agent, reps: &[u32], c: &crate::store::Cred, tenant: &str) -> DesiredAgent {
    let spec = a.placed_spec();
    DesiredAgent {
        agent_key: a.key.clone(),
        revision: a.revision,
        replica_indexes: reps.to_vec(),
        executor: Executor { kind: a.executor.kind.clone(), image: a.executor.image.clone() },
        secrets: spec.map(|s| s.secrets.clone()).unwrap_or_default(),
        resources: a.resources(),
        drain_seconds: a.drain_seconds,
        identity: DesiredIdentity {
            principal_id: c.principal_id.clone(),
            tenant_id: tenant.to_string(),
            credential: SealedCredential {
                credential_id: c.id.clone(),
                ciphertext: c.ciphertext.clone(),
                expires_at: clock::rfc3339_ms(c.expires_ms),
            },
        },
    }
}

/// One pass. Returns the instant (ms) the next online node would go offline, if any.
pub async fn pass(ctx: &Ctx) -> Result<Option<i64>, crate::store::db::DbError> {
    let mut w = PassWrite::default();
    let mut phases = Phases::new();
    refresh_agents(ctx, &mut w).await;
    phases.mark("agents");
    let now = clock::now_ms();
    let offline_after = ctx.cfg.node_offline_after;

    // Snapshot what the pure parts need; no lock is held past this block.
    let (agents, facts, previous, creds) = {
        let st = ctx.store.state.read();
        let facts: Vec<NodeFacts> = st
            .nodes
            .values()
            .map(|n| NodeFacts {
                id: n.id.clone(),
                name: n.name.clone(),
                online: n.online(now, offline_after),
                kinds: n.info.executor_kinds.clone(),
                images: n.allow.clone(),
                labels: n.info.labels.clone(),
                secrets: n.info.secrets.clone(),
                capacity: n.info.capacity.clone(),
            })
            .collect();
        let creds: HashMap<(Id, Id), Arc<crate::store::Cred>> =
            st.active.iter().filter_map(|(pair, id)| st.creds.get(id).map(|c| (pair.clone(), c.clone()))).collect();
        // The last outcome is shared, not copied: this pass builds a new one.
        (st.agents.clone(), facts, st.outcome.clone(), creds)
    };
    let online: HashMap<Id, bool> = facts.iter().map(|f| (f.id.clone(), f.online)).collect();
    let next_offline = {
        let st = ctx.store.state.read();
        st.nodes
            .values()
            .filter(|n| n.online(now, offline_after))
            .map(|n| n.last_seen_ms + n.threshold(offline_after).as_millis() as i64 + 1)
            .min()
    };
    let names: HashMap<Id, Id> = facts.iter().map(|f| (f.id.clone(), f.name.clone())).collect();

    phases.mark("snapshot");
    // Place.
    let demands: Vec<Demand> = agents.iter().filter_map(demand).collect();
    let outcome = placement::place(&demands, &facts, &previous.bindings);
    diff_bindings(&previous.bindings, &outcome, &names, &mut w);
    drop(previous);

    phases.mark("place");
    // Identities and PATs: collect what is missing or due; queued after publishing, since
    // the workers check the published placements.
    let mut work: Vec<WorkKey> = Vec::new();
    let by_key: HashMap<&str, &Agent> = agents.iter().map(|a| (a.key.as_str(), a)).collect();
    {
        let st = ctx.store.state.read();
        for a in agents.iter() {
            if a.identity.kind != IdentityKind::Agent {
                continue;
            }
            if !st.identities.get(a.key.as_str()).is_some_and(|i| i.bound) {
                work.push(WorkKey::Identity(a.key.as_str().into()));
            }
        }
    }
    // What each agent contributes to a desired state, hashed once per pass rather than once
    // per (agent, node).
    let fingerprints: HashMap<&str, u64> = agents.iter().map(|a| (a.key.as_str(), agent_fingerprint(a))).collect();
    let mut needed: HashSet<(Id, Id)> = HashSet::default();
    let mut per_node: HashMap<Id, BTreeMap<Id, Vec<u32>>> = HashMap::default();
    for ((agent, r), node) in &outcome.bindings {
        needed.insert((agent.clone(), node.clone()));
        per_node.entry(node.clone()).or_default().entry(agent.clone()).or_default().push(*r);
    }
    let ttl_ms = ctx.cfg.token_ttl_seconds as i64 * 1000;
    for pair in &needed {
        match creds.get(pair) {
            Some(c) if now < rotate_at_ms(c, ttl_ms) => {}
            _ => work.push(WorkKey::Pat(pair.0.clone(), pair.1.clone())),
        }
    }

    phases.mark("identity work");
    // Desired states: only nodes whose inputs changed are serialised and compared.
    let mut new_desired: Vec<(Id, DesiredRec)> = Vec::new();
    let node_ids: Vec<Id> = facts.iter().map(|f| f.id.clone()).collect();
    // Hash every node's inputs without a lock, then keep the nodes whose hash moved.
    let hashed: Vec<(Id, u64, Vec<Entry>)> = node_ids
        .iter()
        .map(|node| {
            let entries: Vec<Entry> = per_node
                .get(node)
                .into_iter()
                .flatten()
                .filter_map(|(agent, reps)| {
                    let a = by_key.get(&**agent)?;
                    let c = creds.get(&(agent.clone(), node.clone()))?;
                    Some((*a, reps.as_slice(), &**c))
                })
                .collect();
            let h = input_hash(&entries, &fingerprints);
            (node.clone(), h, entries)
        })
        .collect();
    // (node, new hash, entries, the desired state it has now)
    type Changed<'a> = (Id, u64, Vec<Entry<'a>>, Option<DesiredRec>);
    let changed: Vec<Changed> = {
        let st = ctx.store.state.read();
        hashed
            .into_iter()
            .filter(|(node, h, _)| st.desired_hashes.get(node) != Some(h))
            .map(|(node, h, e)| {
                let current = st.desired.get(&node).cloned();
                (node, h, e, current)
            })
            .collect()
    };
    let mut new_hashes: Vec<(Id, u64)> = Vec::with_capacity(changed.len());
    for (node, h, entries, current) in changed {
        new_hashes.push((node.clone(), h));
        let body: Vec<DesiredAgent> =
            entries.iter().map(|(a, reps, c)| desired_agent(a, reps, c, &ctx.cfg.iam_tenant)).collect();
        let json: Arc<str> = serde_json::to_string(&body).unwrap_or_else(|_| "[]".into()).into();
        if current.as_ref().map(|d| &*d.agents) != Some(&*json) {
            let generation = current.map_or(0, |d| d.generation) + 1;
            tracing::info!(node = %names.get(&node).map(|n| &**n).unwrap_or("?"), generation, agents = body.len(), "desired state changed");
            w.desired.push((node.to_string(), generation, json.to_string()));
            new_desired.push((node.clone(), DesiredRec { generation, agents: json }));
        }
    }

    phases.mark("desired");
    // PATs no longer needed are retired: revoked after the drain window, or at once when
    // their node is offline (nothing there can use it for a draining run).
    let mut retired: Vec<(String, i64)> = Vec::new();
    for (pair, c) in &creds {
        if needed.contains(pair) {
            continue;
        }
        let delay = if !online.get(&pair.1).copied().unwrap_or(false) {
            Duration::ZERO
        } else {
            match by_key.get(&*pair.0) {
                Some(a) => Duration::from_secs(a.drain_seconds),
                None => VANISHED_DRAIN,
            }
        };
        let at = now + delay.as_millis() as i64;
        tracing::info!(agent = %pair.0, node = %names.get(&pair.1).map(|n| &**n).unwrap_or("?"), credential = %c.id, in_seconds = delay.as_secs(), "PAT no longer needed; revoking after the drain window");
        retired.push((c.id.clone(), at));
        w.retire.push((c.id.clone(), at));
    }

    phases.mark("retire");
    // Statuses.
    let statuses = compute_statuses(&agents, &outcome, &online, &names, &creds, ctx);

    phases.mark("statuses");
    // Persist, then publish.
    ctx.store.db.apply_pass(&w).await?;
    phases.mark("persist");
    let views = placement_views(&agents, &outcome);
    set_gauges(ctx, &views, now);
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
        for (id, at) in retired {
            if let Some(c) = st.creds.get_mut(&id).map(Arc::make_mut) {
                c.revoke_ms = Some(at);
                let pair = (c.agent.clone(), c.node.clone());
                if st.active.get(&pair) == Some(&id) {
                    st.active.remove(&pair);
                }
            }
            ctx.queue.add_after(WorkKey::Revoke(id), Duration::from_millis((at - now).max(0) as u64));
        }
        st.outcome = Arc::new(outcome);
        st.placed_pairs = needed;
        st.views = Arc::new(views);
        st.statuses_want.clear();
        for (key, body) in statuses {
            if st.statuses_sent.get(&key) != Some(&body) {
                to_send.push(key.clone());
                st.statuses_want.insert(key, body);
            }
        }
    }
    for key in work {
        ctx.queue.add(key);
    }
    for key in to_send {
        ctx.queue.add(WorkKey::Status(key));
    }
    phases.mark("publish");
    phases.log();
    Ok(next_offline)
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

    fn log(&self) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let parts: Vec<String> =
                self.marks.iter().map(|(p, d)| format!("{p} {:.1}ms", d.as_secs_f64() * 1e3)).collect();
            tracing::debug!(total_ms = self.start.elapsed().as_secs_f64() * 1e3, phases = %parts.join(", "), "pass timing");
        }
    }
}

fn compute_statuses(
    agents: &[Agent],
    outcome: &Outcome,
    online: &HashMap<Id, bool>,
    names: &HashMap<Id, Id>,
    creds: &HashMap<(Id, Id), Arc<crate::store::Cred>>,
    ctx: &Ctx,
) -> Vec<(Id, StatusBody)> {
    let st = ctx.store.state.read();
    let (identities, identity_errors) = (&st.identities, &st.identity_errors);
    let mut out = Vec::new();
    for a in agents.iter().filter(|a| a.gets_status()) {
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
            let node =
                bound.map(|n| (names.get(n).map(|x| &**x).unwrap_or("?"), online.get(n).copied().unwrap_or(false)));
            let report = bound
                .and_then(|n| st.nodes.get(n))
                .and_then(|n| n.info.replicas.iter().find(|p| p.agent_key == a.key && p.replica == r));
            if let Some(n) = bound {
                if pending_pat.is_none() && !creds.contains_key(&(key.clone(), n.clone())) {
                    pending_pat =
                        Some(format!("issuing the PAT for node {}", names.get(n).map(|x| &**x).unwrap_or("?")));
                }
            }
            let stuck = !outcome.stuck.is_empty() && outcome.stuck.contains(&(key.clone(), r));
            replicas.push(ReplicaInput { replica: r, node, stuck, report });
        }
        let identity_ready = identities.get(&key).is_some_and(|i| i.bound);
        let identity_pending = match (identity_errors.get(&key), identity_ready, pending_pat) {
            (Some(e), _, _) => Some(e.clone()),
            (None, false, _) => Some("creating the agent's IAM identity".to_string()),
            (None, true, p) => p,
        };
        let input = StatusInput {
            stopped,
            desired,
            replicas,
            waiting: outcome.waiting.get(&key).map(|w| w.1),
            identity_pending,
        };
        out.push((key, status::derive(&input)));
    }
    out
}

/// Walks the previous and the new bindings together (both ordered by (agent, replica)):
/// records what to store and logs every placement decision, in one linear merge.
fn diff_bindings(prev: &Bindings, next: &Outcome, names: &HashMap<Id, Id>, w: &mut PassWrite) {
    use std::cmp::Ordering;
    let name = |id: &Id| names.get(id).map(|n| n.to_string()).unwrap_or_else(|| id.to_string());
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
                tracing::info!(agent = %agent, replica = r, node = %name(node), reason = why, "replica unbound");
                w.unbind.push((agent.to_string(), *r));
            }
            Ordering::Greater => {
                let ((agent, r), node) = b.next().expect("peeked");
                tracing::info!(agent = %agent, replica = r, node = %name(node), "replica placed");
                w.bind.push((agent.to_string(), *r, node.to_string()));
            }
            Ordering::Equal => {
                let (_, old) = a.next().expect("peeked");
                let ((agent, r), node) = b.next().expect("peeked");
                if old != node {
                    tracing::info!(agent = %agent, replica = r, from = %name(old), to = %name(node), "replica moved");
                    w.bind.push((agent.to_string(), *r, node.to_string()));
                }
            }
        }
    }
}

fn set_gauges(ctx: &Ctx, views: &[fleet_api::PlacementView], now: i64) {
    let st = ctx.store.state.read();
    let mut nodes: HashMap<(&str, &str), i64> = HashMap::default();
    for n in st.nodes.values() {
        let status = if n.online(now, ctx.cfg.node_offline_after) { "online" } else { "offline" };
        let health = n.info.health.unwrap_or(fleet_api::Health::Ok).as_str();
        *nodes.entry((status, health)).or_default() += 1;
    }
    drop(st);
    ctx.metrics.nodes.clear();
    for ((s, h), v) in nodes {
        ctx.metrics.nodes.get_or_create(&labels(&[("status", s), ("health", h)])).set(v);
    }
    let mut pl: HashMap<(&str, &str), i64> = HashMap::default();
    for v in views {
        *pl.entry((v.status.as_str(), v.reason.as_deref().unwrap_or_default())).or_default() += v.replicas as i64;
    }
    ctx.metrics.placements.clear();
    for ((s, r), v) in pl {
        ctx.metrics.placements.get_or_create(&labels(&[("status", s), ("reason", r)])).set(v);
    }
}
