//! Cold convergence: every node starts at once with its join key, and the clock runs until
//! every replica is placed and every agent's CP status says running with all its replicas
//! ready (which needs the PATs issued and sealed into the nodes' desired states).

use super::Sim;
use crate::node;
use crate::placements::{agents_running, placements, Placements};
use anyhow::bail;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What cold convergence took.
pub struct Cold {
    /// From the first join until everything was placed and running.
    pub converged: Duration,
    /// From the first join until every replica was placed.
    pub all_placed: Duration,
    /// The controller's CPU seconds over the convergence.
    pub cpu_seconds: f64,
    /// PATs the IAM holds unrevoked at the end.
    pub live_pats: usize,
}

/// Starts every node with its key in `keys` and waits for the fleet to converge.
pub async fn converge(sim: &Sim<'_>, keys: Vec<String>) -> anyhow::Result<Cold> {
    let cpu0 = sim.replicas.cpu_seconds();
    let t0 = Instant::now();
    for (n, k) in sim.nodes.iter().zip(keys) {
        tokio::spawn(node::run(n.clone(), sim.shared.clone(), k));
    }
    let (converged, all_placed) = wait_converged(sim, t0).await?;
    let cold = Cold {
        converged,
        all_placed,
        cpu_seconds: sim.replicas.cpu_seconds() - cpu0,
        live_pats: sim.dk.pats().iter().filter(|p| !p.revoked).count(),
    };
    eprintln!("fleet-sim: converged in {:.1}s ({} live PATs)", cold.converged.as_secs_f64(), cold.live_pats);
    Ok(cold)
}

/// Polls twice a second until converged: (converged, all placed), both since `t0`.
async fn wait_converged(sim: &Sim<'_>, t0: Instant) -> anyhow::Result<(Duration, Duration)> {
    let (total, agents, limit) = (sim.args.total_replicas(), sim.args.agents, sim.phase_limit());
    let mut t_placed = None;
    let mut last_print = Instant::now();
    let mut p = Placements::default();
    loop {
        // The placement list is ~15 MB at full scale: it is read only until everything is
        // placed (every agent running with all its replicas implies it stays so), since
        // reading it twice a second costs the controller and this process a share of the
        // cores whose convergence is being measured.
        if t_placed.is_none() {
            p = placements(sim.http, &sim.leader().url, sim.admin).await.unwrap_or_default();
            if p.all_placed(total) {
                t_placed = Some(t0.elapsed());
            }
        }
        let running = agents_running(sim.dk, sim.args.replicas);
        if let (Some(placed), true) = (t_placed, running == agents) {
            return Ok((t0.elapsed(), placed));
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            print_progress(sim, t0, &p, running);
            last_print = Instant::now();
        }
        let refused = sim.shared.refused.load(Ordering::Relaxed);
        if refused > 0 {
            bail!(
                "the controller refused {refused} node(s) their join (why is logged above): the fleet cannot converge"
            );
        }
        if t0.elapsed() > limit {
            bail!(
                "cold convergence did not finish in {limit:?}: placed {}/{total}, running {running}/{agents}",
                p.placed
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn print_progress(sim: &Sim<'_>, t0: Instant, p: &Placements, running: usize) {
    eprintln!(
        "  {:>5.1}s joined {} placed {}/{}{} running agents {}/{} rss {:.0} MiB",
        t0.elapsed().as_secs_f64(),
        sim.shared.joined.load(Ordering::Relaxed),
        p.placed,
        sim.args.total_replicas(),
        if p.reasons.is_empty() { String::new() } else { format!(" (pending: {:?})", p.reasons) },
        running,
        sim.args.agents,
        sim.replicas.rss_mib()
    );
}
