#![forbid(unsafe_code)]
//! `fleet-sim`: Fleet's scale instrument (docs/performance.md#fleet-sim). Starts devkit (CP + IAM in memory) with M
//! agents and the controller as its own process, then N simulated nodes as tokio tasks in this
//! process (join, long-poll, report `running` on a jittered period), and measures:
//! cold convergence, steady pass duration (controller metrics), long-poll wake latency after an
//! agent change, sustained and burst report throughput, controller peak RSS and CPU, and
//! recovery when a share of the nodes goes silent. Prints a table and JSON.
//!
//! Defaults reproduce the target run (10,000 nodes, 20,000 agents × 5 = 100,000 replicas);
//! flags shrink it: `fleet-sim --nodes 500 --agents 1000`. `--hostile` measures the fleet
//! under an attack by clients without credentials instead ([`attack_phase`]).
//! `main` is the sequence of [`phases`]; each returns its figures for [`results`].

mod args;
mod attack_phase;
mod controller;
mod fleet;
mod hostile;
mod measure;
mod node;
mod phases;
mod placements;
mod results;
mod wake;

use args::Args;
use clap::Parser;
use controller::{Database, Replicas};
use fleet::Connections;
use fleet_devkit::{Devkit, DevkitConfig};
use phases::Sim;
use std::sync::atomic::Ordering;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    args.check()?;
    if args.compare_fields {
        return phases::compare::run(&args).await;
    }
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;

    let dk = Devkit::start(DevkitConfig { page_size: 500, ..Default::default() }, "127.0.0.1:0".parse()?).await?;
    dk.put_agents((0..args.agents).map(|i| args.agent_fields.agent(i, args.replicas, args.zones as usize)).collect());
    let database = Database::for_run(&args)?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(4096).build()?;
    let mut replicas = Replicas::start(&args, &dk, &dir, &database, &http).await?;
    let admin = admin_token(&args, &dk)?;
    announce(&args, &replicas);

    let keys = fleet::join_keys(&http, &replicas.leader().url, &admin, args.nodes).await?;
    let conns = Connections::choose(&args);
    let shared = fleet::shared(&args, &http, &replicas, conns);
    let nodes = fleet::nodes(&args);
    let sim =
        Sim { args: &args, dk: &dk, http: &http, replicas: &replicas, admin: &admin, shared: &shared, nodes: &nodes };

    let cold = phases::cold::converge(&sim, keys).await?;
    if args.takeover_kills > 0 {
        let mut ctl = phases::takeover::Ctl {
            args: &args,
            dk: &dk,
            http: &http,
            replicas: &mut replicas,
            dir: &dir,
            database: &database,
            shared: &shared,
        };
        let results = phases::takeover::measure(&mut ctl).await?;
        return results::emit(&results, phases::takeover::print_table, args.json.as_deref());
    }
    if args.rollout {
        let results = phases::rollout::measure(&sim).await?;
        return results::emit(&results, phases::rollout::print_table, args.json.as_deref());
    }
    if args.hostile {
        let results = phases::hostile::measure(&sim).await?;
        return results::emit(&results, attack_phase::print_table, args.json.as_deref());
    }
    let steady = phases::steady::measure(&sim).await;
    if args.cold_and_steady {
        let results = phases::compare::figures(&sim, &cold, &steady).await;
        return results::emit(&results, phases::compare::print_one, args.json.as_deref());
    }
    let wake = phases::wake_latency::measure(&sim).await?;
    let burst = phases::burst::measure(&sim).await;
    let recovery = phases::recovery::measure(&sim).await?;
    let figures = results::Figures {
        cold,
        steady,
        wake,
        burst,
        recovery,
        replica_peak_rss: replicas.peak_rss_mib(),
        reports_failed: shared.reports_failed.load(Ordering::Relaxed),
    };
    results::emit(&figures.json(&args, conns), results::print_table, args.json.as_deref())
}

/// An admin token for a day; with `--dir` also written there, for looking inside during the
/// run: `FLEET_URL=… FLEET_TOKEN=$(cat DIR/admin-token) fleetctl …`.
fn admin_token(args: &Args, dk: &Devkit) -> anyhow::Result<String> {
    let admin = dk.mint("fleet", &["fleet:admin"], 24 * 3600);
    if let Some(dir) = &args.dir {
        std::fs::write(dir.join("admin-token"), &admin)?;
    }
    Ok(admin)
}

/// Says which controller process is measured and on how large a fleet.
fn announce(args: &Args, replicas: &Replicas) {
    let ctl = replicas.leader();
    eprintln!(
        "fleet-sim: controller pid {} at {} (log {}), {} agents × {} replicas, {} nodes",
        ctl.child.id(),
        ctl.url,
        ctl.log.display(),
        args.agents,
        args.replicas,
        args.nodes
    );
}
