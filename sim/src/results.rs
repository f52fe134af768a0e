//! A run's results: the phases' figures as the JSON other tools and docs/performance.md read
//! (field names are an interface), the table printed above it, and where both go.

use crate::args::Args;
use crate::fleet::Connections;
use crate::measure;
use crate::phases::burst::Burst;
use crate::phases::cold::Cold;
use crate::phases::recovery::Recovery;
use crate::phases::steady::Steady;
use crate::wake;
use serde_json::{json, Value};
use std::path::Path;

/// Every phase's figures, and what the run measured across them.
pub struct Figures {
    pub cold: Cold,
    pub steady: Steady,
    pub wake: wake::Samples,
    pub burst: Burst,
    pub recovery: Recovery,
    /// Each replica's peak resident set, MiB.
    pub replica_peak_rss: Vec<f64>,
    /// Reports the controller did not accept over the whole run.
    pub reports_failed: u64,
}

impl Figures {
    /// The results' JSON: the run's size and settings beside every phase's figures.
    pub fn json(&self, args: &Args, conns: Connections) -> Value {
        let Figures { cold, steady, wake, burst, recovery, replica_peak_rss, reports_failed } = self;
        let passes = &steady.passes;
        let peak_rss = replica_peak_rss.iter().copied().fold(0.0, f64::max);
        json!({
            "nodes": args.nodes, "agents": args.agents, "replicas": args.total_replicas(),
            "coldConvergenceSeconds": cold.converged.as_secs_f64(),
            "allPlacedSeconds": cold.all_placed.as_secs_f64(),
            "coldCpuSeconds": cold.cpu_seconds,
            "livePats": cold.live_pats,
            "steadyPassP50Ms": passes.quantile_ms(0.5), "steadyPassP99Ms": passes.quantile_ms(0.99), "steadyPasses": passes.count,
            "wakeP50Ms": wake.wake_p(0.5), "wakeP99Ms": wake.wake_p(0.99),
            "listedToNodeP50Ms": measure::percentile(&wake.listed, 0.5), "listedToNodeP99Ms": measure::percentile(&wake.listed, 0.99),
            "cpEditToNodeP50Ms": measure::percentile(&wake.edit, 0.5), "cpEditToNodeP99Ms": measure::percentile(&wake.edit, 0.99),
            "steadyReportsPerSecond": steady.reports_per_second, "steadyCpuPercent": steady.cpu_percent,
            "burstReportsPerSecond": burst.reports_per_second, "burstCpuPercent": burst.cpu_percent,
            "peakRssMiB": peak_rss, "controllers": args.controllers, "replicaPeakRssMiB": replica_peak_rss,
            "silentNodes": recovery.silent_nodes, "silentReplicas": recovery.silent_replicas,
            "recoverySeconds": recovery.duration.as_secs_f64(), "offlineThresholdSeconds": args.offline_seconds,
            "reportsFailed": reports_failed,
            "protocol": conns.protocol(),
            "reportConnections": conns.reports(),
        })
    }
}

/// Prints `results` as `table` then as JSON, and writes the JSON to `--json`'s file, if any.
pub fn emit(results: &Value, table: fn(&Value), json_file: Option<&Path>) -> anyhow::Result<()> {
    table(results);
    println!("{}", serde_json::to_string_pretty(results)?);
    if let Some(p) = json_file {
        std::fs::write(p, serde_json::to_string_pretty(results)?)?;
    }
    Ok(())
}

/// The table of a run's results, one measure a line beside its target.
pub fn print_table(r: &Value) {
    let f = |k: &str| match &r[k] {
        Value::Number(n) => format!("{:.1}", n.as_f64().unwrap_or(0.0)),
        Value::Null => "-".into(),
        v => v.to_string(),
    };
    let rows = [
        ("cold convergence (placed, PATs, running in CP)", f("coldConvergenceSeconds") + " s", "≤ 60 s"),
        ("  all replicas placed", f("allPlacedSeconds") + " s", ""),
        ("steady pass p50 (bucket bound)", f("steadyPassP50Ms") + " ms", ""),
        ("steady pass p99 (bucket bound)", f("steadyPassP99Ms") + " ms", "≤ 50 ms"),
        ("wake p50 (CP list served → node has it)", f("wakeP50Ms") + " ms", ""),
        ("wake p99", f("wakeP99Ms") + " ms", "≤ 100 ms"),
        ("  last page of the list served → node p50", f("listedToNodeP50Ms") + " ms", ""),
        ("  last page of the list served → node p99", f("listedToNodeP99Ms") + " ms", ""),
        ("  CP edit → node p99 (incl. 2 s CP poll)", f("cpEditToNodeP99Ms") + " ms", ""),
        ("reports/s, steady", f("steadyReportsPerSecond"), ""),
        ("controller CPU at steady rate", f("steadyCpuPercent") + " %", "≤ 25 % at 500/s"),
        ("reports/s, burst", f("burstReportsPerSecond"), "≥ 5000"),
        ("controller peak RSS (the largest replica)", f("peakRssMiB") + " MiB", "≤ 128 MiB"),
        (
            "  each replica's peak RSS",
            r["replicaPeakRssMiB"]
                .as_array()
                .map(|a| a.iter().map(|v| format!("{:.0}", v.as_f64().unwrap_or(0.0))).collect::<Vec<_>>().join(" / "))
                .unwrap_or_default()
                + " MiB",
            "",
        ),
        ("recovery after 10 % silent (incl. offline threshold)", f("recoverySeconds") + " s", ""),
    ];
    println!("{:<52} {:>14}  target", "measure", "value");
    for (m, v, t) in rows {
        println!("{m:<52} {v:>14}  {t}");
    }
}
