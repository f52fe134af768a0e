//! `--compare-fields`: the cost of the placement fields (docs/behaviour.md#spread-and-priority)
//! at scale. This program runs itself twice, each time on a fresh controller and fleet with
//! `--cold-and-steady` — the agents without the fields, then with `spread-priority` — and
//! prints the two runs' cold convergence, pass durations and memory side by side, with how
//! evenly the spread agents' replicas lie over the zones.

use super::cold::Cold;
use super::steady::Steady;
use super::Sim;
use crate::args::Args;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// The two runs, one after the other, then both side by side.
pub async fn run(args: &Args) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let base = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&base)?;
    let mut runs = Vec::new();
    for fields in ["none", "spread-priority"] {
        let json_file = base.join(format!("{fields}.json"));
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args(child_args(fields, &json_file, &base.join(fields)));
        eprintln!("fleet-sim: --compare-fields: the run with agent fields {fields}");
        let status = cmd.status().await.context("starting this program again")?;
        if !status.success() {
            bail!("the run with agent fields {fields} failed ({status}); its output is above");
        }
        let text = std::fs::read_to_string(&json_file).with_context(|| format!("reading {}", json_file.display()))?;
        runs.push(serde_json::from_str::<Value>(&text)?);
        // Let the first fleet's sockets close before the second starts.
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let results = json!({"without": runs[0], "with": runs[1]});
    crate::results::emit(&results, print_both, args.json.as_deref())
}

/// This program's arguments for one run: the caller's, without those `--compare-fields`
/// decides, and those it sets.
fn child_args(fields: &str, json_file: &Path, dir: &Path) -> Vec<String> {
    const OWN: [&str; 6] = ["--json", "--dir", "--agent-fields", "--compare-fields", "--cold-and-steady", "--zones"];
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in std::env::args().skip(1) {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let name = a.split('=').next().unwrap_or_default();
        if OWN.contains(&name) {
            skip_value = !a.contains('=') && !matches!(name, "--compare-fields" | "--cold-and-steady");
            continue;
        }
        out.push(a);
    }
    let (json_file, dir) = (json_file.display().to_string(), dir.display().to_string());
    out.extend(
        ["--agent-fields", fields, "--cold-and-steady", "--zones", "10", "--json", &json_file, "--dir", &dir]
            .map(String::from),
    );
    out
}

/// A `--cold-and-steady` run's results, with how the spread agents' replicas lie.
pub async fn figures(sim: &Sim<'_>, cold: &Cold, steady: &Steady) -> Value {
    let passes = &steady.passes;
    let spread = spread_evenness(sim).await;
    json!({
        "nodes": sim.args.nodes, "agents": sim.args.agents, "replicas": sim.args.total_replicas(),
        "agentFields": clap::ValueEnum::to_possible_value(&sim.args.agent_fields).map(|v| v.get_name().to_string()),
        "coldConvergenceSeconds": cold.converged.as_secs_f64(),
        "allPlacedSeconds": cold.all_placed.as_secs_f64(),
        "coldCpuSeconds": cold.cpu_seconds,
        "steadyPassP50Ms": passes.quantile_ms(0.5), "steadyPassP99Ms": passes.quantile_ms(0.99), "steadyPasses": passes.count,
        "steadyCpuPercent": steady.cpu_percent,
        "peakRssMiB": sim.replicas.peak_rss_mib().iter().copied().fold(0.0, f64::max),
        "spreadAgents": spread.0, "spreadAgentsUneven": spread.1,
    })
}

/// The agents with a spread (their explanation has one), and how many of them have two
/// replicas more in one zone than in another that holds fewer — zero when every zone has
/// room, as here.
async fn spread_evenness(sim: &Sim<'_>) -> (usize, usize) {
    let (mut spread, mut uneven) = (0, 0);
    let keys: Vec<String> = {
        let st = sim.dk.state.lock();
        st.agents.iter().filter(|(_, a)| a["placement"]["spread"].is_string()).map(|(k, _)| k.clone()).collect()
    };
    for key in keys {
        let url = format!("{}/api/v1/agents/{key}/placement", sim.leader().url);
        let Ok(resp) = sim.http.get(url).bearer_auth(sim.admin).send().await else { continue };
        let Ok(v) = resp.json::<Value>().await else { continue };
        let Some(counts) = v["spread"]["counts"].as_object() else { continue };
        spread += 1;
        let zones = 10u64;
        let placed: u64 = counts.values().filter_map(Value::as_u64).sum();
        let most = counts.values().filter_map(Value::as_u64).max().unwrap_or(0);
        // Counts within one of each other: none over ceil(placed / zones).
        if most > placed.div_ceil(zones) {
            uneven += 1;
        }
    }
    (spread, uneven)
}

/// One `--cold-and-steady` run's table.
pub fn print_one(r: &Value) {
    print_rows(&[r], &["run"]);
}

fn print_both(r: &Value) {
    print_rows(&[&r["without"], &r["with"]], &["without the fields", "spread + priority"]);
}

fn print_rows(runs: &[&Value], heads: &[&str]) {
    let cell = |r: &Value, k: &str| match &r[k] {
        Value::Number(n) => format!("{:.1}", n.as_f64().unwrap_or(0.0)),
        Value::Null => "-".into(),
        v => v.to_string(),
    };
    print!("{:<44}", "measure");
    heads.iter().for_each(|h| print!("{h:>22}"));
    println!();
    for (label, key) in [
        ("cold convergence, s", "coldConvergenceSeconds"),
        ("all placed, s", "allPlacedSeconds"),
        ("controller CPU over convergence, s", "coldCpuSeconds"),
        ("steady pass p50 (bucket bound), ms", "steadyPassP50Ms"),
        ("steady pass p99 (bucket bound), ms", "steadyPassP99Ms"),
        ("controller CPU at steady rate, %", "steadyCpuPercent"),
        ("peak RSS, MiB", "peakRssMiB"),
        ("spread agents", "spreadAgents"),
        ("  with a zone two over another", "spreadAgentsUneven"),
    ] {
        print!("{label:<44}");
        runs.iter().for_each(|r| print!("{:>22}", cell(r, key)));
        println!();
    }
}
