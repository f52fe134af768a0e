//! The desired states a pass changed, built, stored and published a chunk of nodes at a time.
//!
//! A fleet-wide change (a rollout's first step, a new leader's first pass) rebuilds nearly
//! every node's body: all of them at once would be ~46 MB held until one transaction
//! commits, and their entries ~8 MB more. So the dirty nodes are taken a chunk at a time:
//! each node's entries are gathered and hashed, and only those whose hash moved are built
//! and compared. The first chunk's bodies go in the transaction of the pass's other rows;
//! each later chunk is stored in its own and published as it lands, so its nodes fetch it
//! while the next is built, and each body is let go once it is served. The pass's rows
//! commit first because the bodies derive from them: after a crash between two chunks, the
//! stored input hashes of the nodes not yet written no longer match, and the next pass (or
//! leader) builds those again from what was committed.

use super::catch_up::Ahead;
use super::memo::Memo;
use super::rollout::Rolled;
use crate::model::{Agent, Id};
use crate::reconcile::rules::derive::{entries_of, look_of};
use crate::reconcile::rules::desired::{hash_salt, input_hash, missing_box, stored_boxes, write_agents, Boxes, Entry};
use crate::reconcile::work::Ctx;
use crate::store::db::{DbError, PassWrite};
use crate::store::{Cred, DesiredRec, Linger, Rollout};
use std::sync::Arc;

/// Stores the pass's rows with its first chunk of dirty nodes' bodies
/// (`desired_nodes_at_once` nodes, each chunk's sealed boxes read back at once), then the
/// rest a chunk at a time; each commit publishes its bodies (waking their nodes), and the
/// first the rollouts the rollout phase left unpublished and the lingering replicas too.
pub async fn commit(
    ctx: &Ctx,
    memo: &Memo,
    (now, ahead): (i64, &Ahead),
    rolled: &Rolled,
    mut rows: PassWrite,
    dirty: Vec<Id>,
    mut lingering: Vec<((Id, u32), Option<Linger>)>,
) -> Result<(), DbError> {
    forget_finished_rotations(ctx, memo, now);
    let mut rollouts: Vec<(Id, Option<Arc<Rollout>>)> = rolled.unpublished.clone();
    let salt = hash_salt(&ctx.cfg.iam_tenant);
    let mut chunks = dirty.chunks(ctx.cfg.desired_nodes_at_once.max(1)).peekable();
    loop {
        let chunk = chunks.next().unwrap_or_default();
        let rebuilds = to_rebuild(ctx, memo, rolled, salt, (chunk, ahead));
        let (desired, hashes) = build(ctx, memo, rebuilds, &mut rows).await?;
        let (r, l) = (std::mem::take(&mut rollouts), std::mem::take(&mut lingering));
        ctx.store.commit_pass(&rows, desired, hashes, r, l).await?;
        if chunks.peek().is_none() {
            return Ok(());
        }
        rows = PassWrite::default();
    }
}

/// PAT rotations under way are recorded as the bodies carrying them are published
/// ([`build`]); those done (the node runs the new PAT, or the agent's progress deadline
/// passed) are let go first.
fn forget_finished_rotations(ctx: &Ctx, memo: &Memo, now: i64) {
    if ctx.work.rotating.is_empty() {
        return;
    }
    let deadline = |key: &Id| {
        crate::reconcile::rules::rollout::progress_deadline_ms(
            memo.agent(key).and_then(|a| a.rollout()).as_ref(),
            &ctx.cfg.rollout,
        )
    };
    ctx.work.rotating.prune(&ctx.store.read(), now, deadline);
}

/// A node whose desired state's inputs changed since its body was built: the new hash of
/// its inputs, its entries and the desired state it has now. The entries hold handles to the
/// credentials, so the body is built after the registry's lock is let go. `past`: the node
/// holds this newer generation than the store (docs/behaviour.md#a-store-older-than-the-fleet):
/// its body is built past it whatever its inputs.
struct Rebuild<'a> {
    node: Id,
    hash: u64,
    entries: Vec<Entry<'a>>,
    current: Option<DesiredRec>,
    past: Option<u64>,
}

/// The nodes of `chunk` whose inputs' hash is not the one their body was built from, and
/// those ahead of the store that are to be built past their generation; never one ahead
/// that still waits for its new PATs.
fn to_rebuild<'m>(
    ctx: &Ctx,
    memo: &'m Memo,
    rolled: &Rolled,
    salt: u64,
    (chunk, ahead): (&[Id], &Ahead),
) -> Vec<Rebuild<'m>> {
    let st = ctx.store.read();
    chunk
        .iter()
        .filter(|node| !ahead.hold.contains(*node))
        .filter_map(|node| {
            let look = |a: &Agent, n: &Id, r: u32| look_of(a, n, r, rolled.get(&st, &a.key), memo.own_spec(&a.key));
            let entries = entries_of(&memo.per_node, node, |k| memo.agent(k), |p| st.live_cred(p).cloned(), look);
            let hash = input_hash(salt, &entries, |key| memo.fingerprint(key));
            let current = st.desired(node).cloned();
            let past = ahead.build.get(node).copied();
            let stale = st.desired_hash(node) != Some(hash) || past.is_some();
            stale.then(|| Rebuild { node: node.clone(), hash, entries, current, past })
        })
        .collect()
}

/// The chunk's new bodies: each node's input hash goes to `rows` whether its body changed or
/// not; a body that changed gets the next generation and goes to `rows` too. Returns the
/// bodies to publish and the hashes to keep.
async fn build(
    ctx: &Ctx,
    memo: &Memo,
    chunk: Vec<Rebuild<'_>>,
    rows: &mut PassWrite,
) -> Result<(Vec<(Id, DesiredRec)>, Vec<(Id, u64)>), DbError> {
    let (mut desired, mut hashes) = (Vec::new(), Vec::with_capacity(chunk.len()));
    if chunk.is_empty() {
        return Ok((desired, hashes));
    }
    // The boxes the registry no longer holds (their nodes have them) are read back.
    let wanted: Vec<String> = chunk.iter().flat_map(|r| stored_boxes(&r.entries)).collect();
    let boxes: Boxes = ctx.store.db().ciphertexts(&wanted).await?.into_iter().collect();
    for Rebuild { node, hash, entries, current, past } in chunk {
        if let Some(id) = missing_box(&entries, &boxes) {
            // Only a deleted row does this, and a live PAT's row is deleted with its node;
            // the node's desired state is left as it is and built again when it next changes.
            tracing::error!(node = %memo.name(&node), credential = %id, "a live PAT's sealed box is not in the database; desired state not rebuilt");
            continue;
        }
        rows.input_hashes.push((node.to_string(), hash));
        hashes.push((node.clone(), hash));
        if past.is_none() && entries.is_empty() && current.as_ref().is_some_and(|d| d.same_agents(b"[]")) {
            // A node that joined and has no agent yet: nothing to build.
            continue;
        }
        ctx.metrics.desired_built.inc();
        // Built as the next generation in the buffer that is served and stored; dropped at
        // once when its agents are what the node already has — unless the node holds a newer
        // generation than the store, which the new one goes past.
        let generation = current.as_ref().map_or(0, |d| d.generation).max(past.unwrap_or(0)) + 1;
        let rec = DesiredRec::build(generation, |out| write_agents(out, &entries, &ctx.cfg.iam_tenant, &boxes));
        let Some(agents) = rec.agents_bytes() else { continue };
        if past.is_none() && current.as_ref().is_some_and(|d| d.same_agents(&agents)) {
            continue;
        }
        if let Some(theirs) = past {
            tracing::info!(node = %memo.name(&node), theirs, generation, "a node ahead of the store gets a generation past its own");
        }
        tracing::info!(node = %memo.name(&node), generation, agents = entries.len(), "desired state changed");
        if !ctx.work.rotating.is_empty() {
            for (a, _, c, _) in &entries {
                ctx.work.rotating.published(&a.key, &node, c.issued_ms, generation);
            }
        }
        rows.desired.push((node.to_string(), generation, agents));
        let let_go = boxes_to_let_go(memo, &node, &entries);
        desired.push((node, rec.carrying(let_go)));
    }
    Ok((desired, hashes))
}

/// The boxes a body lets go once its node has it: those it carries from the registry's
/// memory, when every agent bound to the node has its PAT in it. While PATs are still being
/// issued for a node (a start, a node that just received replicas) each new one rebuilds its
/// body, and letting the boxes go at every step would read them back at the next one.
fn boxes_to_let_go(memo: &Memo, node: &Id, entries: &[Entry]) -> Vec<(Id, Arc<Cred>)> {
    let bound = memo.per_node.get(node).map_or(0, |m| m.keys().count());
    if entries.len() < bound {
        return Vec::new();
    }
    entries.iter().filter(|(_, _, c, _)| c.sealed.has_box()).map(|(a, _, c, _)| (a.key.clone(), c.clone())).collect()
}
