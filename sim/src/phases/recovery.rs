//! Recovery: `--silent-percent` of the nodes go silent (no reports, no polls), and the clock
//! runs until no replica is placed on them, every replica is placed elsewhere and every
//! agent runs again — which includes the controller's offline threshold.

use super::Sim;
use crate::placements::{agents_running, placements};
use anyhow::bail;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What recovery took.
pub struct Recovery {
    pub silent_nodes: usize,
    /// Replicas the silent nodes held when they went silent.
    pub silent_replicas: usize,
    /// From the nodes going silent until everything ran elsewhere.
    pub duration: Duration,
}

/// Silences the share of nodes and waits for the fleet to recover.
pub async fn measure(sim: &Sim<'_>) -> anyhow::Result<Recovery> {
    let ids = node_ids(sim).await?;
    let silent = silence(sim, &ids);
    let silent_replicas: usize =
        sim.nodes.iter().filter(|n| n.silent.load(Ordering::Relaxed)).map(|n| n.replica_count()).sum();
    let t_silent = Instant::now();
    eprintln!("fleet-sim: {} nodes silent holding {silent_replicas} replicas", silent.len());
    let (total, limit) = (sim.args.total_replicas(), sim.phase_limit());
    let duration = loop {
        let p = placements(sim.http, &sim.leader().url, sim.admin).await.unwrap_or_default();
        let moved = p.all_placed(total) && !p.by_node.keys().any(|id| silent.contains(id));
        if moved && agents_running(sim.dk, sim.args.replicas) == sim.args.agents {
            break t_silent.elapsed();
        }
        if t_silent.elapsed() > limit {
            bail!("recovery did not finish in {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    Ok(Recovery { silent_nodes: silent.len(), silent_replicas, duration })
}

/// The controller's node id of every node, by name.
async fn node_ids(sim: &Sim<'_>) -> anyhow::Result<HashMap<String, String>> {
    let url = format!("{}/api/v1/nodes", sim.leader().url);
    let v: Value = sim.http.get(url).bearer_auth(sim.admin).send().await?.json().await?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| (n["name"].as_str().unwrap_or_default().to_string(), n["id"].as_str().unwrap_or_default().to_string()))
        .collect())
}

/// Silences `--silent-percent` of the nodes: every (100 / percent)-th; with other than four
/// zones, runs of ten consecutive ones instead, so no zone (index mod 10) is lost whole and the replicas
/// that require it have somewhere to go. Their ids.
fn silence(sim: &Sim<'_>, ids: &HashMap<String, String>) -> HashSet<String> {
    let every = 100 / sim.args.silent_percent.max(1);
    let runs = sim.args.zones != 4;
    sim.nodes
        .iter()
        .filter(|n| if runs { (n.index / 10).is_multiple_of(every) } else { n.index.is_multiple_of(every) })
        .filter_map(|n| {
            n.silent.store(true, Ordering::Relaxed);
            ids.get(&n.name).cloned()
        })
        .collect()
}
