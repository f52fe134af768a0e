//! Converging (docs/behaviour.md#container-rules): the local loop that plans the containers of the newest desired
//! state and drives the supervisor towards them on every new desired state, on every wake
//! of the supervisor and every second; it keeps the replicas' reports, Docker's health and
//! the applied generation in [`Shared`] for the link to report, and asks the link to report
//! at once when a replica goes busy or idle.

use super::desired::DesiredRx;
use super::shared::Shared;
use crate::config::NodeConfig;
use crate::plan::{self, NodePlan};
use crate::runtime::Runtime;
use crate::state::{Identity, StateDir};
use crate::supervisor::Supervisor;
use fleet_api::{DesiredState, ReplicaReport};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Runs until the link's end of `rx` is gone.
pub(super) async fn supervise<R: Runtime>(
    cfg: Arc<NodeConfig>,
    state: StateDir,
    identity: Arc<Identity>,
    rt: R,
    mut rx: DesiredRx,
    shared: Arc<Shared>,
) {
    let leases = crate::supervisor::LeaseReader::new(
        crate::lease::Leases::new(&cfg.state_dir, cfg.host_state_dir()),
        &cfg.docker_url,
    );
    let mut sup = Supervisor::new(rt).checking_before_stop(cfg.check_before_stop).with_leases(leases);
    let wake = sup.wake.clone();
    let mut current = rx.borrow_and_update().clone();
    let mut planner = Planner::new(Duration::from_secs(u64::from(cfg.observe_seconds)));
    loop {
        let node_plan = planner.plan(current.as_deref(), &cfg, &state, &identity);
        step(&mut sup, current.as_ref().map(|d| (d.generation, node_plan)), &cfg.container_prefix, &shared).await;
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
                current = rx.borrow_and_update().clone();
            }
            _ = wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The plan of the current desired state, made again on a new generation and every report
/// period (secrets come and go).
struct Planner {
    every: Duration,
    plan: NodePlan,
    at: Option<Instant>,
    generation: Option<u64>,
}

impl Planner {
    fn new(every: Duration) -> Planner {
        Planner { every, plan: NodePlan::default(), at: None, generation: None }
    }

    /// The plan for `current`, re-planned when due; deletes the opened PATs of agents that
    /// have left it.
    fn plan(
        &mut self,
        current: Option<&DesiredState>,
        cfg: &NodeConfig,
        state: &StateDir,
        identity: &Identity,
    ) -> &NodePlan {
        let generation = current.map(|d| d.generation);
        if generation != self.generation || self.at.is_none_or(|t| t.elapsed() >= self.every) {
            if let Some(d) = current {
                self.plan = plan::plan(d, cfg, state, &identity.secret_key);
                let keep: HashSet<&str> = d.agents.iter().map(|a| a.agent_key.as_str()).collect();
                for gone in state.prune_pats(&|a| keep.contains(a)) {
                    tracing::info!(agent = %gone, "deleted the opened PAT of a departed agent");
                }
            }
            self.generation = generation;
            self.at = Some(Instant::now());
        }
        &self.plan
    }
}

/// One pass: with a desired state (its generation and plan) the supervisor moves the
/// containers a step towards the plan; without one, only whether Docker answers is noted.
async fn step<R: Runtime>(
    sup: &mut Supervisor<R>,
    planned: Option<(u64, &NodePlan)>,
    container_prefix: &str,
    shared: &Shared,
) {
    let Some((generation, node_plan)) = planned else {
        match sup.runtime().ping().await {
            Err(e) => note_unreachable(shared, &e),
            Ok(()) => shared.degraded.store(false, Ordering::SeqCst),
        }
        return;
    };
    match sup.tick(&node_plan.wanted, &node_plan.drains, container_prefix).await {
        Ok(()) => {
            if shared.degraded.swap(false, Ordering::SeqCst) {
                tracing::info!("Docker is reachable again");
            }
            shared.applied_generation.store(generation, Ordering::SeqCst);
        }
        Err(e) => note_unreachable(shared, &e),
    }
    let reports = sup.reports(&node_plan.wanted);
    let changed = busy_changed(&shared.reports.lock(), &reports);
    *shared.reports.lock() = reports;
    if changed {
        // The controller steps on what the report says: a replica that went idle is taken
        // within its next pass, not a report period later.
        shared.report_now.notify_one();
    }
}

/// Whether a replica went from busy to idle or from idle to busy between two reports.
fn busy_changed(before: &[ReplicaReport], after: &[ReplicaReport]) -> bool {
    let busy = |list: &[ReplicaReport]| -> HashSet<(String, u32)> {
        list.iter().filter(|r| r.busy_until.is_some()).map(|r| (r.agent_key.clone(), r.replica)).collect()
    };
    busy(before) != busy(after)
}

/// Health degraded; logged once until Docker answers again.
fn note_unreachable(shared: &Shared, e: &dyn std::fmt::Display) {
    if !shared.degraded.swap(true, Ordering::SeqCst) {
        tracing::error!(error = %e, "Docker is unreachable; health degraded, retrying");
    }
}
