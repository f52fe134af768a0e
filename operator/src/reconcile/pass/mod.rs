//! The reconcile pass (docs/behaviour.md#the-reconcile-pass): level-based and single-flight. It reads the agents, marks
//! liveness, places replicas, asks the work queue for identities and PATs, rebuilds each
//! node's desired state (bumping a generation only when the content changed), retires PATs
//! no longer needed and computes statuses — queueing a CP write only where one changed.
//!
//! It runs in named phases, the compute/apply split of kube-runtime and linkerd2's
//! policy-controller: [`snapshot`] reads what changed, [`place`] and [`decide`] each add their
//! part to one [`Plan`] without writing anything, then the plan is persisted with the
//! desired bodies it changed, built as they are stored a chunk of nodes at a time
//! ([`bodies`]: the store writes the rows and wakes the nodes), and published (the rest of
//! the registry, the work queue, the gauges).
//!
//! It is incremental, because at 10,000 nodes whole-fleet work costs half a second a pass:
//! the [`Memo`] keeps what the last pass computed, and the registry records what changed since
//! ([`crate::store::Changes`]: node facts and reports, credentials, identities); the agent
//! list is diffed against the last one and every node's liveness is checked. Placement runs
//! only when something it reads changed; desired states, statuses, placement items and
//! retirements are recomputed for the agents and nodes a change touched. The first pass
//! computes everything. [`audit::audit`] recomputes from scratch and lists where the
//! published state differs; the tests hold the incremental pass to it.

pub mod agents;
pub mod audit;
mod bodies;
mod catch_up;
mod decide;
mod drains;
pub mod gauges;
mod linger;
pub mod liveness;
pub mod memo;
mod place;
mod plan;
mod replaced;
mod rollout;
mod snapshot;
pub mod unsettled;

pub use memo::{Memo, RESYNC};
pub use plan::{Plan, VANISHED_DRAIN};

use crate::clock;
use crate::model::{AgentList, Id};
use crate::reconcile::work::Ctx;
use crate::reconcile::work::WorkKey;
use crate::store::db::DbError;
use crate::store::kept::Placements;
use place::Placed;
use snapshot::Snapshot;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Rollout orders stored by other replicas are read at least this often (one stored on this
/// replica is read by the next pass).
const ORDERS_EVERY: Duration = Duration::from_secs(1);

/// How long a triggered pass waits for more triggers to land in it. Short: a pass costs
/// what changed, so coalescing buys little, and every node's wake waits for it.
const SETTLE: Duration = Duration::from_millis(5);

/// A changed status is sent this long after its first change, with whatever it says by
/// then: an agent coming up changes its status every few milliseconds (each PAT, each
/// replica reported), and the CP needs the result, not every step.
pub const STATUS_DEBOUNCE: Duration = Duration::from_secs(1);

/// The pass loop: runs on every trigger (coalesced) and every `FLEET_RECONCILE_SECONDS`.
/// It runs for the life of the controller; its end is a fault the supervisor reports.
///
/// `applied`: the agent list the store was loaded with, which the last committed pass worked
/// from (the CP watcher stores a list only after that).
pub async fn run(ctx: Arc<Ctx>, applied: AgentList) {
    // The earliest instant an online node crosses its offline threshold: a node going silent
    // is no event, so the loop wakes for it. With healthy reports this instant keeps receding.
    let mut next_offline: Option<i64> = None;
    let mut memo = Memo::after(applied);
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
        if fleet_api::failpoint::on("stall-pass") {
            continue;
        }
        let span = tracing::info_span!("pass", full = !memo.primed);
        let number = ctx.pass_clock.begin();
        let result = {
            let _timer = ctx.metrics.pass_timer();
            pass(&ctx, &mut memo).instrument(span).await
        };
        match result {
            Ok(at) => {
                next_offline = at;
                ctx.pass_clock.committed(number, clock::now_ms());
            }
            Err(e) => {
                // The memo may be ahead of what was stored: start over with a full pass, which
                // still sees the agents changed since the last committed one as changed.
                memo = memo.start_over();
                ctx.metrics.pass_errors.inc();
                tracing::error!(error = %e, "reconcile pass failed; the next one retries");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        ctx.metrics.passes.inc();
        ctx.metrics.queue_depth.set((ctx.work.queue.depth() + ctx.work.rotations.len()) as i64);
        ctx.metrics.longpolls_held.set(ctx.store.hub().held_total() as i64);
        ctx.metrics.sample_memory();
    }
}

/// One pass. Returns the instant (ms) the next online node would go offline, if any.
pub async fn pass(ctx: &Ctx, memo: &mut Memo) -> Result<Option<i64>, DbError> {
    let mut phases = Phases::new();
    let mut plan = Plan::default();
    // Admins' rollout orders: read before the snapshot, so the pass applies what was asked
    // before it looked.
    let orders = ctx.store.pending_orders(clock::now_ms(), ORDERS_EVERY).await?;
    let mut snap = snapshot::take(ctx, memo, clock::now_ms());
    // Credentials of deleted nodes: revoked now, with no drain window (docs/behaviour.md#node-lifecycle).
    for id in std::mem::take(&mut snap.changes.revoke_now) {
        ctx.work.queue.add(WorkKey::Revoke(id.into()));
    }
    phases.mark("snapshot");
    let ahead = catch_up::look(ctx, memo, &snap, &mut plan);
    let mut placed = place::place(ctx, memo, &mut snap, &mut plan.rows);
    drains::flip_events(memo, &snap.flips, snap.full, &mut placed.events);
    let lingered = linger::track(ctx, memo, &snap, &mut placed, &mut plan);
    phases.mark("place");
    let rolled = rollout::roll(ctx, memo, &snap, &mut placed, orders, &lingered.from, &mut plan).await?;
    phases.mark("rollouts");
    decide::identity_work(ctx, memo, &snap, &mut plan);
    decide::pat_work(ctx, memo, &snap, &placed, &mut plan);
    phases.mark("identity work");
    decide::retire(ctx, memo, &snap, &placed, &mut plan);
    phases.mark("retire");
    decide::statuses(ctx, memo, &snap, &placed, &mut plan);
    unsettled::mark(ctx, &mut plan);
    phases.mark("statuses");
    decide::items(memo, &snap, &placed, &mut plan);
    let mut dirty = decide::dirty_nodes(memo, &snap, &placed, &rolled);
    let more: HashSet<&Id> = ahead.build.keys().chain(&ahead.heard).filter(|n| !dirty.contains(n)).collect();
    dirty.extend(more.into_iter().cloned());
    phases.mark("desired");
    if fleet_api::failpoint::on("fail-pass") {
        return Err(DbError::Other("the fail-pass failpoint is set".into()));
    }
    let mut rows = std::mem::take(&mut plan.rows);
    // The pass's events commit with its rows: what a reader sees done is in the history.
    rows.events = std::mem::take(&mut placed.events).finish();
    let rollouts_changed = !rolled.changed.is_empty() || snap.full;
    bodies::commit(ctx, memo, (snap.now, &ahead), &rolled, rows, dirty, lingered.changed).await?;
    if rollouts_changed {
        count_rollouts(ctx);
    }
    phases.mark("persist");
    let drain_due = placed.next_due;
    let drained = publish(ctx, memo, &snap, placed, plan);
    count_nodes(ctx, memo, &snap);
    for id in drained {
        ctx.store.drain_done(&id).await?;
    }
    memo.primed = true;
    memo.last_pass_ms = snap.now;
    memo.replaced = None;
    phases.mark("publish");
    phases.log(snap.full);
    let due = [snap.next_offline, rolled.next_due, lingered.next_due, drain_due].into_iter().flatten().min();
    Ok(due)
}

/// Publishes what the plan decided besides the desired states (already out): the outcome,
/// placed pairs, items, retirements, statuses, drain progress and events, then queues the
/// work they call for. Returns the draining nodes with no replica left.
fn publish(ctx: &Ctx, memo: &Memo, snap: &Snapshot, placed: Placed, mut plan: Plan) -> Vec<Id> {
    // The items are built from the agents and the outcome as they are listed; a pass that
    // changed either publishes the pair.
    if snap.full || placed.replaced || snap.replaced.is_some() {
        plan.publish.placements = Some(Placements::new(memo.listed.clone(), placed.outcome.clone()));
    }
    if plan.views_changed {
        memo.gauges.publish_placements(&ctx.metrics);
    }
    let mut drained = Vec::new();
    if placed.replaced {
        let progress = drains::progress(memo, &placed.outcome);
        drained = progress.iter().filter(|(_, p)| p.remaining == 0).map(|(id, _)| id.clone()).collect();
        plan.publish.drains = Some(progress);
        plan.publish.outcome = Some(placed.outcome);
    }
    let retired = plan.publish.retired.clone();
    let to_send = ctx.store.publish_pass(plan.publish);
    // Revocations are queued once their credential says when (the worker reads it).
    for (_, id, at) in retired {
        ctx.work.queue.add_after(WorkKey::Revoke(id), Duration::from_millis((at - snap.now).max(0) as u64));
    }
    queue_work(ctx, plan.work);
    for (node, due_ms) in plan.rotations {
        ctx.work.rotations.schedule(node, due_ms);
    }
    // Behind the PATs this pass and the ones before it asked for (`backlog`).
    ctx.work.rotations.want_now(to_send.into_iter().map(WorkKey::Status));
    drained
}

/// Queues identity and PAT work. A node's PATs are issued together (the queue is first in,
/// first out), so its desired state changes once or twice while a fleet comes up instead of
/// once per replica: each change is a new body built, stored, sent and applied by the node.
/// (Ordered by agent, each node would get ~10 desired states, and no agent would be ready
/// sooner: an agent is ready only when its last replica's node has its PAT.)
///
/// PAT work goes to the rotation feeder's backlog, which queues it as the workers take it
/// (`rotation::FEED_AHEAD`): 100,000 keys in the queue at once would take ~17 MB.
fn queue_work(ctx: &Ctx, work: Vec<WorkKey>) {
    let mut pats = Vec::new();
    for key in work {
        match key {
            WorkKey::Pat(agent, node) => pats.push((node, agent)),
            other => ctx.work.queue.add(other),
        }
    }
    pats.sort_unstable();
    ctx.work.rotations.want_now(pats.into_iter().map(|(node, agent)| WorkKey::Pat(agent, node)));
}

/// The rollouts gauge, from the rollouts held (those not complete, and a few complete ones
/// that hold a restart stamp or an undone target).
fn count_rollouts(ctx: &Ctx) {
    use fleet_api::rollout::RolloutState as S;
    let mut counts = [0i64; 4];
    for r in ctx.store.read().rollouts() {
        match (r.state, r.paused) {
            (S::Progressing, true) => counts[1] += 1,
            (S::Progressing, false) => counts[0] += 1,
            (S::Halted, _) => counts[2] += 1,
            (S::Reverted, _) => counts[3] += 1,
            (S::Complete | S::Paused | S::WaitingForWindow, _) => {}
        }
    }
    for (state, n) in ["progressing", "paused", "halted", "reverted"].into_iter().zip(counts) {
        ctx.metrics.rollouts.get_or_create(&crate::metrics::StateLabels { state }).set(n);
    }
}

/// Moves the nodes this pass looked at to their current (status, health) in the nodes gauge.
fn count_nodes(ctx: &Ctx, memo: &mut Memo, snap: &Snapshot) {
    let nodes: Vec<Id> = if snap.full {
        memo.gauges.clear_nodes();
        memo.facts.iter().map(|f| f.id.clone()).collect()
    } else {
        let c = &snap.changes;
        snap.flips.iter().chain(&c.reports).chain(&c.facts).chain(&c.seen).cloned().collect()
    };
    if nodes.is_empty() {
        return;
    }
    {
        let st = ctx.store.read();
        for id in nodes {
            let Some(online) = memo.node(&id).map(|f| f.online) else { continue };
            let health = st.node(&id).and_then(|n| n.info.health).unwrap_or(fleet_api::Health::Ok);
            memo.gauges.count_node(id, online, health);
        }
    }
    memo.gauges.publish_nodes(&ctx.metrics);
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
