//! Who reconciles (docs/behaviour.md#high-availability). On SQLite the one replica leads for as long as it runs. On
//! PostgreSQL every replica serves nodes, joins and the admin API, and campaigns for the
//! lease; the one holding it runs the leader's tasks — the pass, the workers (IAM, CP), the
//! CP watcher and node GC — for one term (the Kubernetes mirror follows the role from a task
//! of its own, so the API server never delays a term):
//!
//! - taking the lease, it loads the store again (what the others wrote, a fresh liveness
//!   grace), arms its writes' fence with the new epoch and starts the term's tasks;
//! - it holds a session advisory lock on a connection of its own for the term, which
//!   PostgreSQL releases the moment the process ends: followers try for it every 250 ms and
//!   the one that gets it takes the lease over at once, unexpired (fast takeover). A holder
//!   paused or cut off keeps its lock, so a follower that finds its lease expired ends its
//!   session first;
//! - it renews every third of the TTL; a renewal refused, or none succeeding for two thirds
//!   of the TTL, or its lock's session ending, ends the term before the lease can pass to
//!   another replica: the fence is dropped first (no leader write can start), then the tasks
//!   are stopped;
//! - SIGTERM releases the lease at once (`server::Running::shutdown`).
//!
//! A term's task that ends or panics is a fault, as on SQLite: the campaign ends, and with it
//! the process (`supervisor.rs`).

use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::Id;
use crate::platform::gate::LOCK_FRESH;
use crate::platform::CallGate;
use crate::reconcile::pass::{self, agents};
use crate::reconcile::work;
use crate::reconcile::work::{Ctx, Work};
use crate::store::db::Fence;
use crate::store::{lease, Store};
use crate::supervisor::Supervisor;
use crate::trigger::{PassClock, Trigger};
use parking_lot::RwLock;
use sqlx::PgConnection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// This replica's role as the HTTP side and the metrics see it.
#[derive(Debug, Default)]
pub struct Role {
    leading: AtomicBool,
    /// The API URL the current leader advertised, when another replica leads.
    leader_url: RwLock<Option<String>>,
}

impl Role {
    /// The role of the only replica (SQLite): always the leader.
    pub fn single() -> Arc<Role> {
        Arc::new(Role { leading: AtomicBool::new(true), leader_url: RwLock::new(None) })
    }

    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    /// Where to send what only the leader answers; `None` while no other replica leads.
    pub fn leader_url(&self) -> Option<String> {
        self.leader_url.read().clone()
    }

    fn set(&self, leading: bool, leader_url: Option<String>) {
        self.leading.store(leading, Ordering::Relaxed);
        *self.leader_url.write() = leader_url;
    }
}

/// What a term needs, and the HTTP side shares: the trigger the admin routes kick, the clock
/// `/readyz` reads.
#[derive(Clone)]
pub struct Shared {
    pub cfg: Config,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub trigger: Arc<Trigger>,
    pub pass_clock: Arc<PassClock>,
    pub role: Arc<Role>,
    /// Whether the leader may call out (IAM, CP, Kubernetes): opened by a term's lease.
    pub gate: Arc<CallGate>,
}

/// Starts the leader's tasks into `tasks`, each a core task: the workers, the pass, node GC
/// and the CP watcher; returns their context. (The Kubernetes mirror runs beside them, in a
/// task of the process: `server.rs`.)
pub async fn start_term(s: &Shared, tasks: &mut Supervisor) -> anyhow::Result<Arc<Ctx>> {
    let (cfg, store, metrics) = (s.cfg.clone(), s.store.clone(), s.metrics.clone());
    let ctx = Ctx::new(cfg, store, metrics, s.trigger.clone(), s.pass_clock.clone(), s.gate.clone(), Work::default());
    // Time-driven work survives a restart and a takeover: re-arm the pending revocations.
    let now = crate::clock::now_ms();
    for r in s.store.read().retiring_creds() {
        if let Some(at) = r.cred.revoke_ms.get() {
            ctx.work
                .queue
                .add_after(work::WorkKey::Revoke(r.cred.id().into()), Duration::from_millis((at - now).max(0) as u64));
        }
    }
    for _ in 0..work::workers(s.store.db().is_shared()) {
        tasks.spawn("worker", work::worker(ctx.clone()));
    }
    let timer = ctx.clone();
    tasks.spawn("rotations", async move {
        let live_agents = |node: &Id| timer.store.read().live_agents_on(node);
        timer.work.rotations.run(&timer.work.queue, pass::STATUS_DEBOUNCE, live_agents).await
    });
    let applied = s.store.read().agents().clone();
    tasks.spawn("pass", pass::run(ctx.clone(), applied));
    if let Some(after) = s.cfg.node_gc_after {
        tasks.spawn("node-gc", crate::reconcile::work::gc::run(ctx.clone(), after));
    }
    tasks.spawn("cp-watcher", agents::watch_cp(ctx.clone()));
    ctx.kick();
    Ok(ctx)
}

/// A term in progress.
struct Term {
    fence: Fence,
    tasks: Supervisor,
    /// When the last successful renewal was sent (the lease runs at least TTL from then).
    renewed: Instant,
    /// The session holding the advisory lock: when it ends, the lock passes at once.
    lock: PgConnection,
}

/// How often a follower tries for the lock, and a leader checks that its lock's session lives.
const LOCK_EVERY: Duration = Duration::from_millis(250);
/// A lock session that does not answer a check within this is given up.
const LOCK_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Campaigns for the lease and leads while holding it, until a term's task fails.
pub async fn campaign(s: Shared) {
    let Some(pool) = s.store.db().pg().cloned() else { return };
    let renew_every = s.cfg.leader_lease / 3;
    let mut term: Option<Term> = None;
    let mut lock_slot: Option<PgConnection> = None;
    let mut next_renewal = Instant::now();
    loop {
        let Some(t) = term.as_mut() else {
            term = try_lead(&s, &pool, &mut lock_slot).await;
            match term {
                Some(_) => next_renewal = Instant::now() + renew_every,
                None => tokio::time::sleep(LOCK_EVERY).await,
            }
            continue;
        };
        let ended = tokio::select! {
            ended = t.tasks.ended() => Some(ended),
            () = tokio::time::sleep(LOCK_EVERY) => None,
        };
        if let Some(ended) = ended {
            let fence = t.fence.clone();
            tracing::error!(epoch = fence.epoch, "{ended}; giving the lease up");
            if let Some(t) = term.take() {
                step_down(&s, t, &ended.to_string());
            }
            let _ = lease::release(&pool, &fence).await;
            return;
        }
        // Test-only: a leader stalled (as in a long pause) that has not noticed it lost the
        // lease; its writes meet the fence (operator/tests/ha.rs).
        if fleet_api::failpoint::on("lease-stall") {
            continue;
        }
        if let Err(why) = check_lock(&s.gate, &mut t.lock).await {
            if let Some(t) = term.take() {
                step_down(&s, t, &why);
            }
            continue;
        }
        if Instant::now() >= next_renewal {
            match renew(&s, t).await {
                Ok(true) => next_renewal = Instant::now() + renew_every,
                // Tried again at the next check, while the step-down deadline allows.
                Ok(false) => next_renewal = Instant::now(),
                Err(why) => {
                    if let Some(t) = term.take() {
                        step_down(&s, t, &why);
                    }
                }
            }
        }
    }
}

/// The lock's session answers: when it does not, another replica may hold the lock already.
async fn check_lock(gate: &CallGate, lock: &mut PgConnection) -> Result<(), String> {
    let sent = Instant::now();
    match tokio::time::timeout(LOCK_CHECK_TIMEOUT, lease::ping(lock)).await {
        Ok(Ok(())) => {
            gate.lock_seen(sent);
            Ok(())
        }
        Ok(Err(e)) => Err(format!("the session holding the leader's lock ended: {e}")),
        Err(_) => Err("the session holding the leader's lock does not answer".to_string()),
    }
}

/// Renews the lease: `Ok(true)` renewed, `Ok(false)` failed but to be tried again, `Err` ends
/// the term. The term must end two thirds of the TTL after the last renewal, leaving a third
/// of the lease to spare before another replica may take it; a renewal that hangs is abandoned
/// at that deadline, and a refused one ends the term at once. It goes over the lock's session:
/// on the pool it would wait behind a busy pass's transactions, and the lock checks with it.
async fn renew(s: &Shared, t: &mut Term) -> Result<bool, String> {
    let ttl = s.cfg.leader_lease;
    let deadline = t.renewed + ttl * 2 / 3;
    let sent = Instant::now();
    let left = deadline.saturating_duration_since(sent);
    if left.is_zero() {
        return Err("cannot renew it in time: two thirds of the lease passed without a renewal".to_string());
    }
    let (refused, why) = match tokio::time::timeout(left.min(ttl / 3), lease::renew(&mut t.lock, &t.fence, ttl)).await {
        Ok(Ok(true)) => {
            t.renewed = sent;
            s.gate.lease_runs_until(sent + ttl);
            return Ok(true);
        }
        Ok(Ok(false)) => (true, "another replica holds the lease now".to_string()),
        Ok(Err(e)) => (false, format!("cannot renew it: {e}")),
        Err(_) => (false, "cannot renew it: the database does not answer".to_string()),
    };
    if refused || Instant::now() >= deadline {
        return Err(why);
    }
    tracing::warn!(epoch = t.fence.epoch, "{why}; trying again");
    Ok(false)
}

/// Tries for the advisory lock and, holding it, the lease; then loads the store and starts a
/// term. `lock_slot` keeps the follower's lock session between tries.
///
/// The lease is taken at once, so from then on the old holder's writes meet the fence; the
/// store is loaded and the term's tasks start while the old holder's last outside calls are
/// waited out ([`HOLDER_QUIET`]); the gate opens for this term's calls only after that wait.
async fn try_lead(s: &Shared, pool: &sqlx::PgPool, lock_slot: &mut Option<PgConnection>) -> Option<Term> {
    let taken = match take_lock_and_lease(s, pool, lock_slot).await {
        Ok(Some(taken)) => taken,
        Ok(None) => {
            follow(s, pool).await;
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot campaign for the lease; trying again");
            *lock_slot = None;
            s.role.set(false, None);
            return None;
        }
    };
    let Taken { fence, sent, quiet_until } = taken;
    let mut lock = lock_slot.take()?;
    let loading = Instant::now();
    if let Err(e) = s.store.reload().await {
        tracing::error!(error = %e, epoch = fence.epoch, "took the lease but cannot load the store; giving it up");
        let _ = lease::release(pool, &fence).await;
        return None;
    }
    tracing::info!(
        epoch = fence.epoch,
        ms = loading.elapsed().as_millis() as u64,
        "took the lease and loaded the store"
    );
    s.store.db().set_fence(Some(fence.clone()));
    s.pass_clock.finished(crate::clock::now_ms());
    let mut tasks = Supervisor::default();
    if let Err(e) = start_term(s, &mut tasks).await {
        tracing::error!(error = %e, epoch = fence.epoch, "cannot start the leader's tasks; giving the lease up");
        s.store.db().set_fence(None);
        let _ = lease::release(pool, &fence).await;
        return None;
    }
    // The term's first pass may run meanwhile: it writes under the new fence and calls out
    // only through the gate, still closed.
    tokio::time::sleep_until(quiet_until.into()).await;
    // Said before the gate opens, so every outside call of the term comes after the line.
    tracing::info!(epoch = fence.epoch, replica = %s.cfg.replica_name, "became the leader (epoch {})", fence.epoch);
    s.gate.lease_runs_until(sent + s.cfg.leader_lease);
    // Opens the gate, with the lock's session seen to answer now.
    if let Err(why) = check_lock(&s.gate, &mut lock).await {
        step_down(s, Term { fence, tasks, renewed: sent, lock }, &why);
        return None;
    }
    s.role.set(true, None);
    s.metrics.leader.set(1);
    Some(Term { fence, tasks, renewed: sent, lock })
}

/// A lease just taken.
struct Taken {
    fence: Fence,
    /// When the taking was sent: the lease runs at least its TTL from then.
    sent: Instant,
    /// Before this, the old holder may still start an outside call.
    quiet_until: Instant,
}

/// The lease, when this replica got the lock and the lease could be taken with it; a lock got
/// without the lease is let go again.
async fn take_lock_and_lease(
    s: &Shared,
    pool: &sqlx::PgPool,
    lock_slot: &mut Option<PgConnection>,
) -> Result<Option<Taken>, sqlx::Error> {
    let conn = match lock_slot {
        Some(c) => c,
        None => lock_slot.insert(pool.acquire().await?.detach()),
    };
    if !lease::try_lock(conn).await? {
        return Ok(None);
    }
    // The lock passed before this instant, and with it the old holder's last call could start.
    let locked_at = Instant::now();
    let live = lease::holder(pool).await?.filter(|h| h.live && h.holder != s.cfg.replica_name);
    let sent = Instant::now();
    let Some(fence) =
        lease::acquire_locked(conn, &s.cfg.replica_name, &s.cfg.advertise_url, s.cfg.leader_lease).await?
    else {
        lease::unlock(conn).await?;
        return Ok(None);
    };
    let quiet_until = match live {
        Some(h) => {
            tracing::info!(holder = %h.holder, epoch = h.epoch, "took the lock of a leader whose lease still runs; \
                loading the store while waiting {} ms for its calls to stop", HOLDER_QUIET.as_millis());
            locked_at + HOLDER_QUIET
        }
        // An expired lease needs no wait: its holder's gate closed by its own clock before it ran out.
        None => locked_at,
    };
    Ok(Some(Taken { fence, sent, quiet_until }))
}

/// How long a replica that got the lock of a lease that still runs keeps its gate closed: the
/// holder may be alive (cut off from the database, or its session ended by a follower), and
/// its gate lets a call start up to `LOCK_FRESH` after its lock's session last answered — at
/// the latest when the lock passed. Waited out, no call of the old term is made in the new.
const HOLDER_QUIET: Duration = Duration::from_millis(LOCK_FRESH.as_millis() as u64 + 100);

/// Follows the current leader; a holder whose lease expired with its lock still held (paused,
/// or cut off from the database) has its session ended, so the lock can pass.
async fn follow(s: &Shared, pool: &sqlx::PgPool) {
    let holder = lease::holder(pool).await.ok().flatten();
    if holder.as_ref().is_some_and(|h| !h.live) {
        match lease::end_expired_holder(pool).await {
            Ok(true) => tracing::warn!("ended the database sessions of a leader whose lease expired"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cannot end the sessions of a leader whose lease expired"),
        }
    }
    let leader = holder.filter(|h| h.live && h.holder != s.cfg.replica_name);
    s.role.set(false, leader.map(|h| h.url));
}

/// Ends a term: no leader write can start once the fence is gone; then the tasks stop.
fn step_down(s: &Shared, mut t: Term, why: &str) {
    s.gate.close();
    s.store.db().set_fence(None);
    t.tasks.abort_all();
    s.role.set(false, None);
    s.metrics.leader.set(0);
    tracing::warn!(epoch = t.fence.epoch, "lost the lease (epoch {}): {why}; following", t.fence.epoch);
}
