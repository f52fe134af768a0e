//! The incremental pass checked against a recompute from scratch.

use super::gauges::Gauges;
use crate::clock;
use crate::metrics::{NodeLabels, PlacementLabels};
use crate::reconcile::rules::derive::{
    agent_status, demand, entries_of, facts_of, look_of, per_node_lingering, Lookup, PerNode,
};
use crate::reconcile::rules::desired::{desired_json, Boxes, Entry};
use crate::reconcile::rules::move_budget::{move_budget, Sources};
use crate::reconcile::rules::placement::{self, NodeFacts};
use crate::reconcile::rules::views::agent_views;
use crate::reconcile::work::rotation::due_second;
use crate::reconcile::work::Ctx;
use crate::reconcile::work::{first_rotation_ms, WorkKey};
use crate::store::db::DbError;
use crate::store::{Cred, Id};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

/// Recomputes what the published state should be from scratch (placement, placed pairs,
/// every desired state, every status, the placement items, retirements) and lists where
/// it differs from what the passes published. Empty when the incremental passes kept up;
/// meant for tests and for debugging, on a quiet fleet (a node crossing its offline
/// threshold since the last pass is a real difference until the next pass). Reads every
/// live PAT's sealed box from the database first (the registry keeps few of them).
pub async fn audit(ctx: &Ctx) -> Result<Vec<String>, DbError> {
    let ids: Vec<String> = ctx.store.read().live_creds().map(|(_, _, c)| c.id().into_owned()).collect();
    let boxes: Boxes = ctx.store.db().ciphertexts(&ids).await?.into_iter().collect();
    Ok(compare(ctx, &boxes))
}

fn compare(ctx: &Ctx, boxes: &Boxes) -> Vec<String> {
    let mut diffs = Vec::new();
    let now = clock::now_ms();
    let st = ctx.store.read();
    let facts: Vec<NodeFacts> = st.nodes().map(|n| facts_of(n, n.online(now, ctx.cfg.node_offline_after))).collect();
    let by_id: HashMap<&str, &NodeFacts> = facts.iter().map(|f| (&*f.id, f)).collect();
    let per_node = per_node_lingering(st.outcome(), st.lingering());
    if fresh_placement(ctx, &st, &facts, &per_node) != **st.outcome() {
        diffs.push("placement: a fresh placement differs from the published outcome".to_string());
    }
    let mut pairs: HashSet<(Id, Id)> = st.outcome().bindings.iter().map(|(a, _, n)| (a.clone(), n.clone())).collect();
    pairs.extend(st.lingering().iter().map(|((a, _), l)| (a.clone(), l.from.clone())));
    let creds: HashMap<(Id, Id), &Arc<Cred>> = st.live_creds().map(|(a, n, c)| ((a.clone(), n.clone()), c)).collect();
    for pair in creds.keys() {
        if !pairs.contains(pair) {
            diffs.push(format!("credential of {} on {} is live but not needed", pair.0, pair.1));
        }
    }
    // Every placed pair has its PAT work pending: issuing, retrying, or the next rotation (an
    // entry of its node at or before its PAT's rotation instant).
    let wanted = ctx.work.rotations.wanted_pairs();
    let rotations = ctx.work.rotations.earliest_by_node();
    let ttl_ms = ctx.cfg.token_ttl_seconds as i64 * 1000;
    let rotation_due = |pair: &(Id, Id)| {
        let (Some(c), Some(at)) = (creds.get(pair), rotations.get(&pair.1)) else { return false };
        *at <= 1000 * due_second(first_rotation_ms(c, ttl_ms))
    };
    for pair in &pairs {
        if !wanted.contains(pair)
            && !rotation_due(pair)
            && !ctx.work.queue.scheduled(&WorkKey::Pat(pair.0.clone(), pair.1.clone()))
        {
            diffs.push(format!("the PAT of {} on {} has nothing scheduled (issue or rotation)", pair.0, pair.1));
        }
    }
    for f in &facts {
        let entries: Vec<Entry> = entries_of(
            &per_node,
            &f.id,
            |k| st.agent(k),
            |p| creds.get(p).map(|&c| Arc::clone(c)),
            |a, n, r| look_of(a, n, r, st.rollout(&a.key), None),
        );
        let json = desired_json(&entries, &ctx.cfg.iam_tenant, boxes);
        if !st.desired(&f.id).is_some_and(|d| d.same_agents(&json)) {
            diffs.push(format!("desired state of node {} is stale", f.name));
        }
    }
    let lookup = Lookup {
        node: &|id: &Id| by_id.get(&**id).map(|f| (&*f.name, f.online)),
        has_cred: &|pair: &(Id, Id)| creds.contains_key(pair),
    };
    for a in st.agents().iter().filter(|a| a.gets_status()) {
        let body = agent_status(a, st.outcome(), &st, &lookup);
        let published = match st.status_wanted(a.key.as_ref()) {
            Some(want) => want.is(&body),
            None => st.status_sent(a.key.as_ref()).is_some_and(|s| s.is(&body)),
        };
        if !published {
            diffs.push(format!("status of agent {} is stale", a.key));
        }
    }
    if !st.placements().of(st.agents(), st.outcome()) && st.placements().to_vec() != fresh_placements(&st) {
        diffs.push("placement items are not those of the agents and the outcome".to_string());
    }
    diffs.extend(gauge_diffs(ctx, &st, &facts));
    diffs
}

/// Where the nodes and placements gauges differ from the registry they count.
fn gauge_diffs(ctx: &Ctx, st: &crate::store::State, facts: &[NodeFacts]) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut node_gauge: HashMap<(&'static str, &'static str), i64> = HashMap::default();
    for f in facts {
        let health = st.node(&f.id).and_then(|n| n.info.health).unwrap_or(fleet_api::Health::Ok).as_str();
        *node_gauge.entry((if f.online { "online" } else { "offline" }, health)).or_default() += 1;
    }
    for ((status, health), count) in node_gauge {
        let shown = ctx.metrics.nodes.get_or_create(&NodeLabels { status, health }).get();
        if shown != count {
            diffs.push(format!("nodes gauge {status}/{health}: {shown}, the registry says {count}"));
        }
    }
    let mut gauge = Gauges::default();
    for a in st.agents().iter() {
        gauge.count_views(&agent_views(a, st.outcome()).items, 1);
    }
    for (status, reason, replicas) in gauge.placement_replicas() {
        let shown = ctx.metrics.placements.get_or_create(&PlacementLabels { status, reason: reason.to_string() }).get();
        if shown != replicas {
            diffs.push(format!("placements gauge {status}/{reason}: {shown}, items say {replicas}"));
        }
    }
    diffs
}

/// Placement from scratch over the published bindings, with the drain moves the agents'
/// budgets allow as the pass computes them.
fn fresh_placement(ctx: &Ctx, st: &crate::store::State, facts: &[NodeFacts], per_node: &PerNode) -> placement::Outcome {
    let agent = |k: &str| st.agent(k);
    let by_id: HashMap<&str, bool> = facts.iter().map(|f| (&*f.id, f.online)).collect();
    let online = |id: &Id| by_id.get(&**id).copied().unwrap_or(false);
    let budget = move_budget(&Sources {
        draining: facts.iter().filter(|f| f.drain_paced()).map(|f| &f.id).collect(),
        per_node,
        bindings: &st.outcome().bindings,
        agent: &agent,
        online: &online,
        st,
        defaults: &ctx.cfg.rollout,
        now_ms: crate::clock::now_ms(),
    });
    placement::place_within(st.agents().iter().filter_map(demand), facts, &**st.outcome(), budget)
}

/// The placement items of the registry's agents and outcome, built afresh.
fn fresh_placements(st: &crate::store::State) -> Vec<fleet_api::PlacementView> {
    crate::store::kept::Placements::of_list(st.agents(), st.outcome().clone()).to_vec()
}
