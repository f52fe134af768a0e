//! Report throughput: `--burst-nodes` nodes report back to back for `--burst-seconds` on top
//! of the fleet's own rate.

use super::Sim;
use crate::node;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The burst's figures.
pub struct Burst {
    pub reports_per_second: f64,
    /// The controller's CPU, percent of one core.
    pub cpu_percent: f64,
}

/// Runs the burst and measures the reports accepted during it.
pub async fn measure(sim: &Sim<'_>) -> Burst {
    let (r0, b0) = (sim.reports_ok(), Instant::now());
    let c0 = sim.replicas.cpu_seconds();
    let stop = Arc::new(AtomicBool::new(false));
    let bursters: Vec<_> = sim
        .nodes
        .iter()
        .take(sim.args.burst_nodes)
        .map(|n| tokio::spawn(node::burst(n.clone(), sim.shared.clone(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(sim.args.burst_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for b in bursters {
        let _ = b.await;
    }
    let secs = b0.elapsed().as_secs_f64();
    let burst = Burst {
        reports_per_second: (sim.reports_ok() - r0) as f64 / secs,
        cpu_percent: (sim.replicas.cpu_seconds() - c0) / secs * 100.0,
    };
    eprintln!("fleet-sim: burst {:.0} reports/s at {:.0}% of a core", burst.reports_per_second, burst.cpu_percent);
    burst
}
