//! Side calls as per-object work items (docs/behaviour.md#the-reconcile-pass): each key is handled idempotently from the
//! registry's current state, so a duplicate, a retry or a crash in the middle is harmless.
//! A failing agent backs off on its own key and never stalls the pass or the others.

use super::key::{first_rotation_ms, rotate_at_ms, WorkKey};
use super::queue::Outcome;
use super::queues::Ctx;
use crate::clock;
use crate::model::IdentityKind;
use crate::platform::iam::PatRequest;
use crate::platform::PlatformError;
use crate::reconcile::rules::ceiling::ceiling;
use crate::reconcile::rules::derive::status_now;
use crate::store::records::catch_up::CatchUp;
use crate::store::{Cred, Id, Sealed};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// Concurrent work items on SQLite: enough to hide IAM latency and the group commit's (a PAT
/// waits for one commit), few enough not to flood IAM. More (32) bring a 10,000-node fleet up
/// no sooner.
pub const WORKERS: usize = 16;
/// On PostgreSQL: its commit is a few round trips over the network, the fence's check among
/// them, and an identity waits for two, so more items wait at once (docs/performance.md,
/// "Three replicas at full scale").
pub const WORKERS_SHARED: usize = 32;

/// The workers a leader runs on its database.
pub fn workers(shared_db: bool) -> usize {
    if shared_db {
        WORKERS_SHARED
    } else {
        WORKERS
    }
}

/// One worker ([`workers`] run): takes the next due key, waits until outside calls may start,
/// handles it and tells the queue how it went. It runs for the life of the controller; its end is a
/// fault the supervisor reports (`server.rs`).
pub async fn worker(ctx: Arc<Ctx>) {
    loop {
        let key = ctx.work.queue.next().await;
        ctx.gate.opened().await;
        let outcome = handle(&ctx, &key).await;
        if ctx.work.queue.done(&key, outcome).is_some() {
            ctx.metrics.work_retries.inc();
        }
    }
}

/// One work item, in a span naming its kind and key, timed and counted by kind.
async fn handle(ctx: &Ctx, key: &WorkKey) -> Outcome {
    let kind = key.kind();
    let span = match key {
        WorkKey::Identity(agent) | WorkKey::Status(agent) => tracing::info_span!("work", kind, agent = %agent),
        WorkKey::Pat(agent, node) | WorkKey::Sweep(agent, node) => {
            tracing::info_span!("work", kind, agent = %agent, node = %node)
        }
        WorkKey::Revoke(id) => tracing::info_span!("work", kind, credential = %id),
    };
    let _timer = ctx.metrics.work_timer(kind);
    let outcome = async {
        match key {
            WorkKey::Identity(agent) => identity(ctx, agent).await,
            WorkKey::Pat(agent, node) => pat(ctx, agent, node).await,
            WorkKey::Revoke(id) => revoke(ctx, id).await,
            WorkKey::Status(agent) => status(ctx, agent).await,
            WorkKey::Sweep(agent, node) => sweep(ctx, agent, node).await,
        }
    }
    .instrument(span)
    .await;
    if outcome == Outcome::Failed {
        ctx.metrics.work_failures.get_or_create(&crate::metrics::WorkLabels { kind }).inc();
    }
    outcome
}

fn note_error(ctx: &Ctx, agent: &Id, msg: String) {
    if ctx.store.identity_failed(agent, msg.clone()) {
        tracing::warn!(error = %msg, "identity not ready; retrying with backoff");
        ctx.kick();
    }
}

async fn identity(ctx: &Ctx, agent: &Id) -> Outcome {
    let (wanted, rec) = {
        let st = ctx.store.read();
        let wanted = st.agent(agent).is_some_and(|a| a.identity.kind == IdentityKind::Agent);
        (wanted, st.identity(agent).cloned())
    };
    if !wanted {
        return Outcome::Done;
    }
    let principal = match rec {
        Some(r) if r.bound => return Outcome::Done,
        Some(r) => r.principal_id.to_string(),
        None => match ctx.iam.create_principal(agent).await {
            Ok(id) => {
                ctx.metrics.call("iam", "create_principal", "ok");
                if let Err(e) = ctx.store.identity_created(agent, &id).await {
                    tracing::error!(error = %e, "cannot store principal");
                    return Outcome::Failed;
                }
                tracing::info!(principal = %id, "IAM principal ready");
                id
            }
            Err(e) => {
                ctx.metrics.call("iam", "create_principal", e.outcome());
                note_error(ctx, agent, format!("creating the IAM principal: {e}"));
                return Outcome::Failed;
            }
        },
    };
    match ctx.cp.put_identity(agent, &ctx.cfg.iam_issuer, &ctx.cfg.iam_tenant, &principal).await {
        Ok(()) => {
            ctx.metrics.call("cp", "put_identity", "ok");
            if let Err(e) = ctx.store.identity_bound(agent, &principal).await {
                tracing::error!(error = %e, "cannot store identity binding");
                return Outcome::Failed;
            }
            tracing::info!("identity bound in the CP");
            ctx.kick();
            Outcome::Done
        }
        Err(e) => {
            ctx.metrics.call("cp", "put_identity", e.outcome());
            note_error(ctx, agent, format!("binding the identity in the CP: {e}"));
            Outcome::Failed
        }
    }
}

/// What is true of a pair now, read in one look at the registry.
struct PairNow {
    /// The agent (`None` for a sweep: its pair is not placed, its agent may be gone).
    a: Option<crate::model::Agent>,
    node_name: Id,
    pk: [u8; 32],
    principal: Option<Id>,
    active: Option<Arc<Cred>>,
    next_n: u64,
    /// The store is older than the fleet (docs/behaviour.md#a-store-older-than-the-fleet).
    mark: Option<CatchUp>,
    /// The pair's node holds a newer generation than the store.
    ahead: bool,
}

/// The pair must still be placed, the node known; `None` when there is nothing to do.
fn pair_now(ctx: &Ctx, agent: &Id, node: &Id) -> Option<PairNow> {
    let st = ctx.store.read();
    let a = st.agent(agent).cloned()?;
    let n = st.node(node)?;
    if !st.is_placed(agent, node) {
        return None;
    }
    let pair = (agent.clone(), node.clone());
    Some(PairNow {
        a: Some(a),
        node_name: n.name.clone(),
        pk: n.public_key,
        principal: st.identity(agent).map(|i| i.principal_id.clone()),
        active: st.live_cred(&pair).cloned(),
        next_n: st.pair(&pair).next_n,
        mark: st.catch_up().cloned(),
        ahead: st.ahead(node).is_some(),
    })
}

async fn pat(ctx: &Ctx, agent: &Id, node: &Id) -> Outcome {
    let ttl_ms = ctx.cfg.token_ttl_seconds as i64 * 1000;
    let now = clock::now_ms();
    let Some(p) = pair_now(ctx, agent, node) else { return Outcome::Done };
    if let Some(c) = &p.active {
        if let Some(wait) = rotation_waits(ctx, (agent, node), &p, c, now, ttl_ms) {
            return wait;
        }
    }
    let Some(principal) = p.principal.clone() else {
        // The identity item runs first; come back when it has had its chance.
        ctx.work.rotating.abandoned(&(agent.clone(), node.clone()));
        ctx.work.queue.add(WorkKey::Identity(agent.clone()));
        return Outcome::Failed;
    };
    let Some(a) = &p.a else { return Outcome::Done };
    let ceil = ceiling(a, &ctx.cfg.token_audiences, &ctx.cfg.token_scopes);
    let req = PatRequest {
        audiences: ceil.audiences,
        scope_ceiling: ceil.scopes,
        expires_in_seconds: ctx.cfg.token_ttl_seconds,
        description: format!("fleet: agent {agent} on node {}", p.node_name),
    };
    let (issued, n) = match issue(ctx, (agent, node), &p, &principal, &req).await {
        Ok(done) => done,
        Err(outcome) => return outcome,
    };
    store_issued(ctx, (agent, node), &p, (issued, n, principal), now, ttl_ms).await
}

/// Whether the live PAT's rotation waits (the outcome to return), or goes now. A rotation
/// recreates the container: a step in the agent's budget — unless half the time from its due
/// point to its expiry has gone waiting (an expired PAT stops the agent for sure), or the
/// store is older than the fleet and the node, ahead of it, waits for this PAT to be served.
fn rotation_waits(
    ctx: &Ctx,
    (agent, node): (&Id, &Id),
    p: &PairNow,
    c: &Cred,
    now: i64,
    ttl_ms: i64,
) -> Option<Outcome> {
    // A PAT from before a store's catch-up mark is replaced now (docs/behaviour.md#a-store-older-than-the-fleet).
    let stale = p.mark.as_ref().is_some_and(|m| c.issued_ms < m.since_ms);
    let due = if stale { now } else { rotate_at_ms(c, ttl_ms) };
    if now < due {
        return Some(rotate_at(ctx, node, due));
    }
    let pair = (agent.clone(), node.clone());
    let urgent = now >= due + (c.expires_ms - due) / 2;
    let rotating = &ctx.work.rotating;
    if urgent || (stale && p.ahead) {
        rotating.started(pair.clone(), now);
        if urgent {
            tracing::warn!(agent = %agent, node = %p.node_name, "PAT rotation waited half its time to expiry for the disruption budget, a busy replica or a window; rotating now, before the PAT expires");
        }
    } else if let Some(until) = rotation_held(ctx, &pair, due, now) {
        return Some(rotate_at(ctx, node, until.min(now + HELD_LOOK_MS).min(due + (c.expires_ms - due) / 2)));
    } else if !rotating.may_rotate(&ctx.store.read(), &ctx.cfg.rollout, ctx.cfg.node_offline_after, &pair, now) {
        tracing::debug!(agent = %agent, node = %p.node_name, "PAT rotation due; waiting for the agent's disruption budget");
        return Some(rotate_at(ctx, node, now + super::rotating::WAIT.as_millis() as i64));
    }
    None
}

/// How often a rotation held by a busy replica or a window looks again at most: a lease may
/// end early (the replica goes idle).
const HELD_LOOK_MS: i64 = 5_000;

/// Until when a due rotation waits for a busy replica or a closed window, if it does; the
/// event that says so is recorded.
fn rotation_held(ctx: &Ctx, pair: &(Id, Id), due: i64, now: i64) -> Option<i64> {
    let (hold, event) = ctx.work.rotating.held(&ctx.store.read(), &ctx.cfg.rollout, pair, due, now);
    if let Some(e) = event {
        ctx.store.events().record(e);
    }
    hold.map(|h| h.until())
}

/// The most PATs one item finds issued after a store's time before it gives up on IAM
/// (an IAM that replays every key would otherwise hold a worker for good).
const MOST_FOUND: u64 = 1_000;

/// Issues the pair's next PAT under its key's counter (docs/behaviour.md#iam-calls). `next_n`
/// is stored and is raised only in the commit that stores the PAT it keyed, so until that
/// commit every attempt — a retry, or the first one after a crash — uses the same n and IAM
/// replays instead of minting a second PAT; once it is stored, the next PAT gets n + 1 and
/// never replays an old one. A pair without a row has never had a PAT stored: its n is 0.
/// While the store is older than the fleet a replay is a PAT issued after the store's time:
/// it is stored to be revoked, and the next n is tried, until IAM makes a new one.
async fn issue(
    ctx: &Ctx,
    (agent, node): (&Id, &Id),
    p: &PairNow,
    principal: &Id,
    req: &PatRequest,
) -> Result<(crate::platform::iam::IssuedPat, u64), Outcome> {
    let mut n = p.next_n;
    loop {
        let idem = format!("fleet-pat-{agent}-{node}-{n}");
        match ctx.iam.issue_pat(principal, &idem, req).await {
            Ok(issued) if issued.replayed && p.mark.is_some() && n < p.next_n + MOST_FOUND => {
                ctx.metrics.call("iam", "issue_pat", "ok");
                found(ctx, (agent, node), p, issued, (n, principal)).await?;
                n += 1;
            }
            Ok(issued) => {
                ctx.metrics.call("iam", "issue_pat", "ok");
                return Ok((issued, n));
            }
            Err(e) => {
                ctx.metrics.call("iam", "issue_pat", e.outcome());
                ctx.metrics.pat("failed");
                note_error(ctx, agent, format!("issuing the PAT for node {}: {}", p.node_name, describe(&e)));
                ctx.work.rotating.abandoned(&(agent.clone(), node.clone()));
                return Err(Outcome::Failed);
            }
        }
    }
}

/// A PAT issued after the store's time, found by replaying its key: stored as retiring and
/// revoked after the grace (its node may still run it until the new one reaches it).
async fn found(
    ctx: &Ctx,
    (agent, node): (&Id, &Id),
    p: &PairNow,
    issued: crate::platform::iam::IssuedPat,
    (n, principal): (u64, &Id),
) -> Result<(), Outcome> {
    let now = clock::now_ms();
    let grace = ctx.cfg.token_revoke_grace;
    let cred = Cred {
        sealed: Sealed::raw(&issued.id, &fleet_api::seal::seal_raw(&p.pk, issued.token.as_bytes())),
        n,
        principal_id: principal.clone(),
        expires_ms: clock::parse_rfc3339_ms(&issued.expires_at).unwrap_or(now),
        issued_ms: now,
        revoke_ms: Some(now + grace.as_millis() as i64).into(),
    };
    drop(issued.token);
    let id = Id::from(cred.id());
    if let Err(e) = ctx.store.credential_found(&(agent.clone(), node.clone()), cred).await {
        tracing::error!(error = %e, "cannot store a PAT found by its key; the retry finds it again");
        return Err(Outcome::Failed);
    }
    tracing::info!(node_name = %p.node_name, credential = %id, n, "a PAT issued after the store's time, found by its idempotency key; revoked after the grace");
    ctx.work.queue.add_after(WorkKey::Revoke(id), grace);
    Ok(())
}

/// A pair the store does not place, whose node (ahead of the store) runs the agent: every PAT
/// of it issued after the store's time is found by its key and revoked after the grace; the
/// walk ends at the first key IAM had not used, whose new PAT is revoked with them.
async fn sweep(ctx: &Ctx, agent: &Id, node: &Id) -> Outcome {
    let p = {
        let st = ctx.store.read();
        let (Some(n), Some(i), Some(mark)) = (st.node(node), st.identity(agent), st.catch_up()) else {
            return Outcome::Done;
        };
        if st.is_placed(agent, node) {
            return Outcome::Done;
        }
        PairNow {
            a: None,
            node_name: n.name.clone(),
            pk: n.public_key,
            principal: Some(i.principal_id.clone()),
            active: None,
            next_n: st.pair(&(agent.clone(), node.clone())).next_n,
            mark: Some(mark.clone()),
            ahead: true,
        }
    };
    let principal = p.principal.clone().unwrap_or_default();
    // A replay answers whatever the key made; a key IAM had not used makes a PAT of the
    // narrowest kind, revoked at once.
    let req = PatRequest {
        audiences: vec!["control-plane".into()],
        scope_ceiling: Vec::new(),
        expires_in_seconds: ctx.cfg.token_ttl_seconds,
        description: format!("fleet: agent {agent} on node {} (found after a restore; revoked)", p.node_name),
    };
    match issue(ctx, (agent, node), &p, &principal, &req).await {
        Ok((last, n)) => match found(ctx, (agent, node), &p, last, (n, &principal)).await {
            Ok(()) => Outcome::Done,
            Err(outcome) => outcome,
        },
        Err(outcome) => outcome,
    }
}

/// Stores the new PAT as the pair's live one, retiring the one it replaces after the grace.
async fn store_issued(
    ctx: &Ctx,
    (agent, node): (&Id, &Id),
    p: &PairNow,
    (issued, n, principal): (crate::platform::iam::IssuedPat, u64, Id),
    now: i64,
    ttl_ms: i64,
) -> Outcome {
    let ciphertext = fleet_api::seal::seal_raw(&p.pk, issued.token.as_bytes());
    let expires_ms = clock::parse_rfc3339_ms(&issued.expires_at).unwrap_or(now + ttl_ms);
    drop(issued.token);
    let grace = ctx.cfg.token_revoke_grace;
    let retire = p.active.as_ref().map(|c| (Id::from(c.id()), now + grace.as_millis() as i64));
    let cred = Cred {
        sealed: Sealed::raw(&issued.id, &ciphertext),
        n,
        principal_id: principal,
        expires_ms,
        issued_ms: now,
        revoke_ms: crate::store::MaybeMs::NONE,
    };
    let (id, due) = (Id::from(cred.id()), first_rotation_ms(&cred, ttl_ms));
    if let Err(e) = ctx.store.credential_stored(&(agent.clone(), node.clone()), cred, retire.clone()).await {
        tracing::error!(error = %e, "cannot store credential; the retry replays it");
        ctx.work.rotating.abandoned(&(agent.clone(), node.clone()));
        return Outcome::Failed;
    }
    if let Some((old, _)) = retire {
        ctx.metrics.pat("rotated");
        tracing::info!(node_name = %p.node_name, credential = %id, old = %old, "PAT rotated; the old one is revoked after the grace");
        ctx.work.queue.add_after(WorkKey::Revoke(old), grace);
    } else {
        tracing::info!(node_name = %p.node_name, credential = %id, "PAT issued and sealed to the node");
    }
    ctx.metrics.pat("issued");
    ctx.store.identity_ok(agent);
    ctx.kick();
    rotate_at(ctx, node, due)
}

/// The pair's next rotation waits in the rotation index (by node), not as a delayed queue key.
fn rotate_at(ctx: &Ctx, node: &Id, due_ms: i64) -> Outcome {
    ctx.work.rotations.schedule(node.clone(), due_ms);
    Outcome::Done
}

fn describe(e: &PlatformError) -> String {
    match e {
        PlatformError::Status { status: 422, body, .. } if body.contains("expiry_too_long") => {
            format!("IAM refused: expiry_too_long (FLEET_TOKEN_TTL_SECONDS exceeds IAM's cap) — {e}")
        }
        PlatformError::Status { status: 422, body, .. } if body.contains("invalid_scope_ceiling") => {
            format!("IAM refused: invalid_scope_ceiling (check FLEET_TOKEN_SCOPES) — {e}")
        }
        PlatformError::Status { status: 403, .. } => {
            format!("IAM refused: the controller's service account lacks iam:agents — {e}")
        }
        _ => e.to_string(),
    }
}

async fn revoke(ctx: &Ctx, id: &str) -> Outcome {
    let now = clock::now_ms();
    let Some(r) = ctx.store.read().retiring(id).cloned() else { return Outcome::Done };
    let (c, agent) = (&r.cred, &r.pair.0);
    let Some(at) = c.revoke_ms.get() else { return Outcome::Done };
    if now < at {
        return Outcome::RequeueAfter(Duration::from_millis((at - now) as u64));
    }
    if let Err(e) = ctx.iam.revoke_pat(&c.principal_id, &c.id()).await {
        ctx.metrics.call("iam", "revoke_pat", e.outcome());
        tracing::warn!(agent = %agent, error = %e, "PAT revoke failed; retrying");
        return Outcome::Failed;
    }
    ctx.metrics.call("iam", "revoke_pat", "ok");
    if let Err(e) = ctx.store.credential_revoked(&r).await {
        tracing::error!(error = %e, "cannot delete revoked credential");
        return Outcome::Failed;
    }
    ctx.metrics.pat("revoked");
    tracing::info!(agent = %agent, "PAT revoked");
    Outcome::Done
}

/// Sends the agent's status as it stands now. The pass kept only the hash of the body it
/// wanted; what has changed since is the newer truth, and the pass that sees the change
/// settles what is wanted against what was sent.
async fn status(ctx: &Ctx, agent: &Id) -> Outcome {
    let (body, wanted) = {
        let st = ctx.store.read();
        let Some(&wanted) = st.status_wanted(agent) else { return Outcome::Done };
        let body = match st.agent(agent).filter(|a| a.gets_status()) {
            Some(a) => status_now(a, &st, clock::now_ms(), ctx.cfg.node_offline_after),
            None => return Outcome::Done,
        };
        // The CP has this body already (an earlier send carried it, or the state came back
        // to it since the pass): nothing to send; the next pass settles the want.
        if st.status_sent(agent).is_some_and(|s| s.is(&body)) {
            return Outcome::Done;
        }
        (body, wanted)
    };
    match ctx.cp.put_status(agent, &body).await {
        Ok(()) => {
            ctx.metrics.call("cp", "put_status", "ok");
            tracing::info!(phase = %body.phase, ready = body.ready_replicas, desired = body.desired_replicas, "status sent to the CP");
            ctx.store.status_sent(agent, body, wanted).await;
            // A pass clears the agent's unsettled mark, so a takeover soon after does not
            // send it again (reconcile::pass::unsettled).
            ctx.trigger.kick();
            Outcome::Done
        }
        Err(e) => {
            ctx.metrics.call("cp", "put_status", e.outcome());
            tracing::warn!(error = %e, "status write to the CP failed; retrying");
            Outcome::Failed
        }
    }
}
