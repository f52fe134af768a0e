//! `--hostile`: after cold convergence, the fleet before, during and after an attack by
//! clients without credentials ([`crate::attack_phase`]) in place of the other phases, with
//! the fleet's size beside its figures.

use super::Sim;
use crate::attack_phase;
use crate::hostile::Mix;
use serde_json::{json, Value};
use std::time::Duration;

/// The attack phase's results (see [`attack_phase::run`]) and `nodes`, `agents`, `replicas`.
pub async fn measure(sim: &Sim<'_>) -> anyhow::Result<Value> {
    let (args, ctl) = (sim.args, sim.leader());
    let fleet = attack_phase::Fleet {
        dk: sim.dk,
        shared: sim.shared,
        http: sim.http,
        pid: ctl.child.id(),
        agents: args.agents,
        addr: ctl.url.trim_start_matches("http://").parse()?,
        metrics_url: &ctl.metrics_url,
    };
    let mix = Mix {
        idle: args.hostile_idle as usize,
        head: args.hostile_head as usize,
        body: args.hostile_body as usize,
        big_head: args.hostile_big_head as usize,
        big_join: args.hostile_big_join as usize,
    };
    let mut results = attack_phase::run(&fleet, mix, Duration::from_secs(args.hostile_seconds)).await?;
    results["nodes"] = json!(args.nodes);
    results["agents"] = json!(args.agents);
    results["replicas"] = json!(args.total_replicas());
    Ok(results)
}
