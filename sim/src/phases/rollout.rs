//! `--rollout` (docs/behaviour.md#rolling-out-a-change): after cold convergence, a window of
//! the fleet at rest, then every agent's template changes at once — a new `resources.cpus` —
//! and `--rollout-failing-percent` of the agents get one that crash-loops on the simulated
//! nodes ([`crate::node::CRASHING_CPUS`]). Measured: the time until every healthy agent
//! completes, that exactly the failing agents halt with at most their budget on the bad
//! template, the largest unavailable count seen against the budget, the pass durations
//! before and during, the controller's peak RSS, and how long a CP change made meanwhile
//! takes to reach its node ([`super::mid_rollout`]).

use super::Sim;
use crate::node::CRASHING_CPUS;
use anyhow::bail;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Agents whose rollout views are read each round (a list of every rollout view at 20,000
/// agents would be ~12 MB a second, and measure the listing rather than the rollout).
const SAMPLED: usize = 200;

pub async fn measure(sim: &Sim<'_>) -> anyhow::Result<Value> {
    let args = sim.args;
    let keys: Vec<String> = (0..args.agents).map(|i| format!("agent-{i:05}")).collect();
    let every = (100 / args.rollout_failing_percent.max(1)) as usize;
    let failing: HashSet<String> = keys.iter().step_by(every.max(1)).cloned().collect();
    let window = Duration::from_secs(args.steady_seconds);
    let h0 = super::steady::pass_durations(sim).await.unwrap_or_default();
    tokio::time::sleep(window).await;
    let h1 = super::steady::pass_durations(sim).await.unwrap_or_default();
    let rss_before = sim.replicas.rss_mib();
    // A node holding more of an agent's replicas than its budget is stepped alone: that many
    // are down at once by the rule, the one exception to the budget.
    let packed = crate::placements::placements(sim.http, &sim.leader().url, sim.admin).await?.most_on_a_node;

    start_busy(sim);
    change_templates(sim, &keys, &failing);
    let t0 = Instant::now();
    eprintln!("fleet-sim: every agent's template changed; {} of them crash", failing.len());
    let sampled: Vec<&String> = keys.iter().step_by((keys.len() / SAMPLED).max(1)).collect();
    let (mut worst_unavailable, mut worst_over, mut over_budget) = (0u64, 0u64, 0u64);
    let mut mid = super::mid_rollout::MidChanges::new(args.mid_rollout_agents, args.agents + 1_000);
    let completed_in = loop {
        mid.tick(sim.dk);
        for k in &sampled {
            let v = get(sim, &format!("/api/v1/agents/{k}/rollout")).await.unwrap_or_default();
            let (u, b) = (v["unavailableReplicas"].as_u64().unwrap_or(0), v["budget"].as_u64().unwrap_or(0));
            worst_unavailable = worst_unavailable.max(u);
            worst_over = worst_over.max(u.saturating_sub(b));
            let allowed = b.max(packed.get(k.as_str()).copied().unwrap_or(0));
            if u > allowed && v["state"] != "complete" {
                over_budget += 1;
                if over_budget <= 5 {
                    eprintln!("fleet-sim: over its budget: {v}");
                }
            }
        }
        let gauges = rollout_gauges(sim).await;
        if gauges.0 == 0 && gauges.1 == failing.len() as u64 {
            break t0.elapsed();
        }
        if t0.elapsed() > sim.phase_limit() {
            bail!(
                "the rollout did not settle in {:?}: progressing {}, halted {}",
                sim.phase_limit(),
                gauges.0,
                gauges.1
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let h2 = super::steady::pass_durations(sim).await.unwrap_or_default();
    let mid = mid.latencies(sim.shared).await;
    let halted = get(sim, "/api/v1/rollouts").await.unwrap_or_default();
    let items = halted["items"].as_array().cloned().unwrap_or_default();
    let halted_keys: HashSet<String> = items
        .iter()
        .filter(|v| v["state"] == "halted")
        .filter_map(|v| v["agentKey"].as_str().map(str::to_string))
        .collect();
    let over: Vec<&Value> = items.iter().filter(|v| v["updatedReplicas"].as_u64() > v["budget"].as_u64()).collect();
    let (before, during) = (h1.since(&h0), h2.since(&h1));
    Ok(json!({
        "nodes": args.nodes, "agents": args.agents, "replicas": args.total_replicas(),
        "failingAgents": failing.len(),
        "haltedAgents": halted_keys.len(),
        "exactlyTheFailingHalted": halted_keys == failing,
        "haltedOverBudget": over.len(),
        "secondsUntilHealthyComplete": completed_in.as_secs_f64(),
        "worstUnavailableSampled": worst_unavailable,
        "worstOverBudgetSampled": worst_over,
        "agentsPackedPastBudget": packed.values().filter(|n| **n > 1).count(),
        "sampledOverBudgetAndNode": over_budget,
        "passP99MsBefore": before.quantile_ms(0.99), "passP99MsDuring": during.quantile_ms(0.99),
        "passesBefore": before.count, "passesDuring": during.count,
        "rssBeforeMiB": rss_before,
        "peakRssMiB": sim.replicas.peak_rss_mib(),
        "midRolloutChangeToNodeMs": mid,
        "busyPercent": args.rollout_busy_percent,
    }))
}

/// From now, `--rollout-busy-percent` of the replicas say they are busy, each for 0–120 s.
fn start_busy(sim: &Sim<'_>) {
    sim.shared.busy.start_now();
    if sim.args.rollout_busy_percent > 0 {
        eprintln!("fleet-sim: {} % of the replicas say they are busy for 0–120 s", sim.args.rollout_busy_percent);
    }
}

/// Every agent's template changes at once (revision 2): a new `resources.cpus`, the one that
/// crash-loops for the failing agents.
fn change_templates(sim: &Sim<'_>, keys: &[String], failing: &HashSet<String>) {
    let args = sim.args;
    sim.dk.put_agents(
        (0..args.agents)
            .map(|i| {
                let mut a = args.agent_fields.agent(i, args.replicas, args.zones as usize);
                let cpus = if failing.contains(&keys[i]) { CRASHING_CPUS } else { 0.5 };
                a["placement"]["resources"] = json!({"cpus": cpus});
                a["placement"]["rollout"] = json!({"minReadySeconds": args.rollout_min_ready_seconds});
                a["revision"] = json!(2);
                a
            })
            .collect(),
    );
}

/// (progressing, halted) from the leader's `fleet_rollouts` gauge.
async fn rollout_gauges(sim: &Sim<'_>) -> (u64, u64) {
    let text = match sim.http.get(&sim.leader().metrics_url).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return (u64::MAX, 0),
    };
    let g = |state: &str| {
        crate::measure::sample(&text, &format!("fleet_rollouts{{state=\"{state}\"}}")).unwrap_or(0.0) as u64
    };
    (g("progressing") + g("paused"), g("halted"))
}

async fn get(sim: &Sim<'_>, path: &str) -> Option<Value> {
    let r = sim.http.get(format!("{}{path}", sim.leader().url)).bearer_auth(sim.admin).send().await.ok()?;
    r.json().await.ok()
}

pub fn print_table(r: &Value) {
    println!("{:<52} {:>12}", "rollout", "value");
    for (label, key) in [
        ("nodes / agents / replicas", "nodes"),
        ("replicas busy for 0–120 s at the change (%)", "busyPercent"),
        ("agents given a crashing template", "failingAgents"),
        ("agents halted", "haltedAgents"),
        ("exactly the failing agents halted", "exactlyTheFailingHalted"),
        ("halted agents with more than their budget updated", "haltedOverBudget"),
        ("seconds until every healthy agent completed", "secondsUntilHealthyComplete"),
        ("largest unavailable count sampled", "worstUnavailableSampled"),
        ("most over the budget sampled (a node taken alone)", "worstOverBudgetSampled"),
        ("agents with 2+ replicas on one node", "agentsPackedPastBudget"),
        ("samples over max(budget, replicas on one node)", "sampledOverBudgetAndNode"),
        ("pass p99 before (ms)", "passP99MsBefore"),
        ("pass p99 during (ms)", "passP99MsDuring"),
        ("passes before / during", "passesBefore"),
        ("controller RSS before (MiB)", "rssBeforeMiB"),
        ("controller peak RSS (MiB)", "peakRssMiB"),
        ("CP change mid-rollout to a node, p50 / p99 ms", "midRolloutChangeToNodeMs"),
    ] {
        let v = match key {
            "nodes" => format!("{} / {} / {}", r["nodes"], r["agents"], r["replicas"]),
            "passesBefore" => format!("{} / {}", r["passesBefore"], r["passesDuring"]),
            "midRolloutChangeToNodeMs" => {
                let m = &r[key];
                let f = |q: &str| m[q].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
                format!("{} / {}", f("p50"), f("p99"))
            }
            _ => r[key].to_string(),
        };
        println!("{label:<52} {v:>12}");
    }
}
