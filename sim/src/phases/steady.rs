//! The steady state: the fleet at its natural report rate for `--steady-seconds`, measured
//! as the controller's pass durations (its Prometheus histogram), its CPU and the reports it
//! accepted.

use super::Sim;
use crate::measure::Histogram;
use std::time::{Duration, Instant};

/// The steady window's figures.
pub struct Steady {
    /// The passes the leader ran in the window.
    pub passes: Histogram,
    pub reports_per_second: f64,
    /// The controller's CPU, percent of one core.
    pub cpu_percent: f64,
}

/// Lets the post-convergence reports settle for one report period, then measures the window.
pub async fn measure(sim: &Sim<'_>) -> Steady {
    tokio::time::sleep(Duration::from_secs(sim.args.report_seconds)).await;
    let h0 = pass_durations(sim).await.unwrap_or_default();
    let (c0, r0, s0) = (sim.replicas.cpu_seconds(), sim.reports_ok(), Instant::now());
    tokio::time::sleep(Duration::from_secs(sim.args.steady_seconds)).await;
    let h1 = pass_durations(sim).await.unwrap_or_default();
    let secs = s0.elapsed().as_secs_f64();
    let steady = Steady {
        passes: h1.since(&h0),
        reports_per_second: (sim.reports_ok() - r0) as f64 / secs,
        cpu_percent: (sim.replicas.cpu_seconds() - c0) / secs * 100.0,
    };
    eprintln!(
        "fleet-sim: steady {:.0} reports/s, controller {:.1}% of a core, {} passes",
        steady.reports_per_second, steady.cpu_percent, steady.passes.count
    );
    steady
}

/// The leader's `fleet_pass_duration_seconds` histogram so far.
pub async fn pass_durations(sim: &Sim<'_>) -> Option<Histogram> {
    let text = sim.http.get(&sim.leader().metrics_url).send().await.ok()?.text().await.ok()?;
    Some(Histogram::parse(&text, "fleet_pass_duration_seconds"))
}
