#![forbid(unsafe_code)]
//! `fleet-sim`: the scale instrument of issue #7. Starts devkit (CP + IAM in memory) with M
//! agents and the controller as its own process, then N simulated nodes as tokio tasks in this
//! process (join, long-poll, report `running` on a jittered period), and measures:
//! cold convergence, steady pass duration (controller metrics), long-poll wake latency after an
//! agent change, sustained and burst report throughput, controller peak RSS and CPU, and
//! recovery when a share of the nodes goes silent. Prints a table and JSON.
//!
//! Defaults reproduce the target run (10,000 nodes, 20,000 agents × 5 = 100,000 replicas);
//! flags shrink it: `fleet-sim --nodes 500 --agents 1000`. `--hostile` measures the fleet
//! under an attack by clients without credentials instead (issue #19, [`attack_phase`]).

mod attack_phase;
mod hostile;
mod measure;
mod node;
mod wake;

use anyhow::{bail, Context};
use clap::Parser;
use fleet_devkit::{Devkit, DevkitConfig};
use node::{Shared, SimNode};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "fleet-sim",
    version,
    about = "Simulate a large fleet against a real fleet-controller process and measure it"
)]
struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Agents in the CP.
    #[arg(long, default_value_t = 20_000)]
    agents: usize,
    /// Replicas per agent.
    #[arg(long, default_value_t = 5)]
    replicas: u32,
    /// Slots per node (the controller takes 0–100).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=100))]
    slots: u32,
    /// Report period of every node (jittered ±10 %).
    #[arg(long, default_value_t = 20)]
    report_seconds: u64,
    /// Length of the steady window (pass duration, CPU at the steady report rate).
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Agent changes whose wake latency is measured.
    #[arg(long, default_value_t = 30)]
    wake_samples: usize,
    /// Nodes that report back-to-back in the throughput probe.
    #[arg(long, default_value_t = 500)]
    burst_nodes: usize,
    #[arg(long, default_value_t = 10)]
    burst_seconds: u64,
    /// Share of nodes that go silent in the recovery phase, percent.
    #[arg(long, default_value_t = 10)]
    silent_percent: usize,
    /// FLEET_NODE_OFFLINE_SECONDS for the controller.
    #[arg(long, default_value_t = 60)]
    offline_seconds: u64,
    /// Give up on a phase after this long.
    #[arg(long, default_value_t = 600)]
    phase_timeout_seconds: u64,
    /// The controller binary (default: fleet-controller next to this program).
    #[arg(long)]
    controller: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the controller's data directory and log here instead of a temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Extra environment for the controller, NAME=VALUE (repeatable), e.g. RUST_LOG=info.
    #[arg(long = "controller-env", value_parser = parse_env)]
    controller_env: Vec<(String, String)>,
    /// How nodes send their reports: `own` — a keep-alive connection per node, as real nodes
    /// do, so the controller holds two connections per node; `shared` — through the one client
    /// pool the long-polls use (fewer controller connections: under-states its memory);
    /// `auto` — `own` when the open-file limit allows two sockets per node, else `shared`.
    #[arg(long, value_enum, default_value_t = ReportConnections::Auto)]
    report_connections: ReportConnections,
    /// The node protocol (SPEC §4.2): `exchange` — one connection per node carries its join,
    /// reports and long-polls, as fleet-node does with a controller that offers it;
    /// `two-routes` — `GET desired` and `PUT observed`, as older nodes do (see
    /// `--report-connections`).
    #[arg(long, value_enum, default_value_t = Protocol::Exchange)]
    protocol: Protocol,
    /// After cold convergence, measure the fleet before, during and after an attack by
    /// clients without credentials (SPEC §11) instead of the steady, burst and recovery
    /// phases: `fleet-sim --nodes 1000 --agents 2000 --hostile`.
    #[arg(long)]
    hostile: bool,
    /// Hostile connections that connect and send nothing.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    hostile_idle: u32,
    /// Hostile connections that trickle a request head that never ends.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    hostile_head: u32,
    /// Hostile connections that send a join's head and trickle its body.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    hostile_body: u32,
    /// Length of each measured window (before and during the attack).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(10..=600))]
    hostile_seconds: u64,
    /// Controller replicas on one PostgreSQL (SPEC §3.9), nodes spread across them. More than
    /// one needs a database: `--database`, or one this program starts from Debian's
    /// PostgreSQL packages.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    controllers: u32,
    /// FLEET_DATABASE_URL of every controller (postgres://…); SQLite in the data directory
    /// when unset and there is one controller.
    #[arg(long)]
    database: Option<String>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Exchange,
    TwoRoutes,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ReportConnections {
    Auto,
    Own,
    Shared,
}

/// Sockets this process needs beyond two per node (devkit's server and clients, the files).
const SPARE_FILES: u64 = 1024;

impl ReportConnections {
    /// Whether nodes report over connections of their own, given the open-file limit.
    fn own(self, nodes: usize, open_file_limit: Option<u64>) -> bool {
        match self {
            ReportConnections::Own => true,
            ReportConnections::Shared => false,
            ReportConnections::Auto => open_file_limit.is_none_or(|l| l >= 2 * nodes as u64 + SPARE_FILES),
        }
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

struct Controller {
    child: std::process::Child,
    url: String,
    metrics_url: String,
    log: PathBuf,
}

impl Drop for Controller {
    /// SIGTERM first (the controller flushes and exits; a profiler wrapping it writes its
    /// output), SIGKILL after 10 s.
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts replica `i` of the controller; `database`: the shared PostgreSQL, if any.
fn start_controller(
    args: &Args,
    dk: &Devkit,
    dir: &std::path::Path,
    i: u32,
    database: Option<&str>,
) -> anyhow::Result<Controller> {
    let bin = match &args.controller {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("fleet-controller"),
    };
    let (port, mport) = (free_port(), free_port());
    let (dir, log) = match args.controllers {
        1 => (dir.to_path_buf(), dir.join("controller.log")),
        _ => (dir.join(format!("replica-{i}")), dir.join(format!("controller-{i}.log"))),
    };
    std::fs::create_dir_all(&dir)?;
    let c = &dk.config;
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("serve").env_clear();
    if let Some(url) = database {
        cmd.env("FLEET_DATABASE_URL", url).env("FLEET_REPLICA_NAME", format!("sim-{i}"));
    }
    let child = cmd
        .env("FLEET_LISTEN", format!("127.0.0.1:{port}"))
        .env("FLEET_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
        .env("FLEET_DATA_DIR", &dir)
        .env("FLEET_CONTROL_PLANE_URL", &dk.url)
        .env("FLEET_IAM_URL", &dk.url)
        .env("FLEET_IAM_ISSUER", dk.issuer())
        .env("FLEET_IAM_TENANT", &c.tenant)
        .env("FLEET_JWKS_URL", dk.jwks_url())
        .env("FLEET_CLIENT_ID", &c.client_id)
        .env("FLEET_CLIENT_SECRET", &c.client_secret)
        .env("FLEET_TOKEN_AUDIENCES", "notification-service")
        .env("FLEET_TOKEN_SCOPES", "control-plane:read notification-service=notifications:send")
        .env("FLEET_NODE_OFFLINE_SECONDS", args.offline_seconds.to_string())
        .env("RUST_LOG", "warn")
        .envs(args.controller_env.iter().cloned())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| {
            format!("cannot start {} (build it: cargo build --release -p fleet-controller)", bin.display())
        })?;
    Ok(Controller {
        child,
        url: format!("http://127.0.0.1:{port}"),
        metrics_url: format!("http://127.0.0.1:{mport}/metrics"),
        log,
    })
}

/// The index of the replica that leads, once one does (the only one on SQLite).
async fn leader_of(http: &reqwest::Client, ctls: &[Controller]) -> anyhow::Result<usize> {
    if ctls.len() == 1 {
        return Ok(0);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (i, c) in ctls.iter().enumerate() {
            let Ok(r) = http.get(&c.metrics_url).send().await else { continue };
            if r.text().await.unwrap_or_default().lines().any(|l| l == "fleet_leader 1") {
                eprintln!("fleet-sim: replica {i} leads ({})", c.url);
                return Ok(i);
            }
        }
        if Instant::now() > deadline {
            bail!("no controller replica took the lease within 60 s (see the controller logs)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Agents whose CP status says running with every replica ready.
fn agents_running(dk: &Devkit, replicas: u32) -> usize {
    let st = dk.state.lock();
    st.statuses
        .values()
        .filter(|h| {
            h.last().is_some_and(|s| s["phase"] == "running" && s["readyReplicas"].as_u64() == Some(replicas as u64))
        })
        .count()
}

#[derive(Default)]
struct Placements {
    placed: u64,
    pending: u64,
    /// Replicas placed per node id.
    by_node: HashMap<String, u64>,
    /// Pending replicas by reason code.
    reasons: std::collections::BTreeMap<String, u64>,
}

async fn placements(http: &reqwest::Client, url: &str, token: &str) -> anyhow::Result<Placements> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Item {
        #[serde(default)]
        replicas: u64,
        #[serde(default)]
        status: String,
        #[serde(default)]
        node_id: Option<String>,
        #[serde(default)]
        reason: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct List {
        items: Vec<Item>,
    }
    let list: List = http.get(format!("{url}/api/v1/placements")).bearer_auth(token).send().await?.json().await?;
    let mut p = Placements::default();
    for it in list.items {
        match it.status.as_str() {
            "placed" => {
                p.placed += it.replicas;
                *p.by_node.entry(it.node_id.unwrap_or_default()).or_default() += it.replicas;
            }
            "pending" => {
                p.pending += it.replicas;
                *p.reasons.entry(it.reason.unwrap_or_default()).or_default() += it.replicas;
            }
            _ => {}
        }
    }
    Ok(p)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let total = args.agents as u64 * args.replicas as u64;
    if (args.nodes as u64) * (args.slots as u64) < total {
        bail!("{} nodes × {} slots cannot hold {total} replicas", args.nodes, args.slots);
    }
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;

    let dk = Devkit::start(DevkitConfig { page_size: 500, ..Default::default() }, "127.0.0.1:0".parse()?).await?;
    dk.put_agents((0..args.agents).map(|i| fleet_devkit::state::synthetic_agent(i, args.replicas)).collect());
    if args.hostile && args.controllers > 1 {
        bail!("--hostile measures one controller; leave --controllers at 1");
    }
    // Several replicas share a PostgreSQL: the one given, or one started here.
    let own_pg = match (&args.database, args.controllers) {
        (None, n) if n > 1 => Some(fleet_devkit::postgres::Postgres::start()?),
        _ => None,
    };
    let database = match (&args.database, &own_pg) {
        (Some(url), _) => Some(url.clone()),
        (None, Some(pg)) => Some(pg.database()?),
        (None, None) => None,
    };
    let mut ctls = Vec::new();
    for i in 0..args.controllers {
        ctls.push(start_controller(&args, &dk, &dir, i, database.as_deref())?);
    }
    let pids: Vec<u32> = ctls.iter().map(|c| c.child.id()).collect();
    let http = reqwest::Client::builder().pool_max_idle_per_host(4096).build()?;
    for c in &ctls {
        measure::wait_until(Duration::from_secs(30), "the controller's /healthz", || {
            std::net::TcpStream::connect(c.url.trim_start_matches("http://")).is_ok()
        })
        .await?;
    }
    let leader = leader_of(&http, &ctls).await?;
    let ctl = &ctls[leader];
    let pid = ctl.child.id();
    let cpu = || pids.iter().map(|p| measure::cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let rss = || pids.iter().map(|p| measure::rss_mib(*p).unwrap_or(0.0)).fold(0.0, f64::max);
    let admin = dk.mint("fleet", &["fleet:admin"], 24 * 3600);
    if let Some(dir) = &args.dir {
        // For looking inside during the run: FLEET_URL=… FLEET_TOKEN=$(cat DIR/admin-token) fleetctl …
        std::fs::write(dir.join("admin-token"), &admin)?;
    }
    eprintln!(
        "fleet-sim: controller pid {pid} at {} (log {}), {} agents × {} replicas, {} nodes",
        ctl.url,
        ctl.log.display(),
        args.agents,
        args.replicas,
        args.nodes
    );

    // Join keys first: issuing them is admin work, not part of convergence.
    let mut keys = Vec::with_capacity(args.nodes);
    for chunk in (0..args.nodes).collect::<Vec<_>>().chunks(64) {
        let futs = chunk.iter().map(|_| {
            let http = http.clone();
            let (url, admin) = (ctl.url.clone(), admin.clone());
            async move {
                let v: Value = http
                    .post(format!("{url}/api/v1/join-keys"))
                    .bearer_auth(admin)
                    .json(&json!({"ttlSeconds": 7200}))
                    .send()
                    .await?
                    .json()
                    .await?;
                anyhow::Ok(v["joinKey"].as_str().unwrap_or_default().to_string())
            }
        });
        // 64 requests in flight at a time.
        for k in futures::future::join_all(futs).await {
            keys.push(k?);
        }
    }

    let limit = measure::open_file_limit();
    let exchange = args.protocol == Protocol::Exchange;
    let own_report_connections = !exchange && args.report_connections.own(args.nodes, limit);
    if !exchange && !own_report_connections && args.report_connections == ReportConnections::Auto {
        eprintln!(
            "fleet-sim: the open-file limit ({}) is below two sockets per node plus {SPARE_FILES}: \
             reports share the long-polls' client pool, so the controller holds fewer connections \
             than {} real nodes would and its peak RSS is understated",
            limit.unwrap_or(0),
            args.nodes
        );
    }
    let shared = Arc::new(Shared {
        http: http.clone(),
        exchange,
        own_report_connections,
        urls: ctls.iter().map(|c| c.url.clone()).collect(),
        report_period: Duration::from_secs(args.report_seconds),
        reports_ok: AtomicU64::new(0),
        reports_failed: AtomicU64::new(0),
        joined: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        received: Mutex::new(HashMap::new()),
    });
    let nodes: Vec<Arc<SimNode>> = (0..args.nodes).map(|i| Arc::new(SimNode::new(i, args.slots))).collect();
    let cpu0 = cpu();
    let t0 = Instant::now();
    for (n, k) in nodes.iter().zip(keys) {
        tokio::spawn(node::run(n.clone(), shared.clone(), k));
    }

    // Phase 1: cold convergence.
    let limit = Duration::from_secs(args.phase_timeout_seconds);
    let mut t_placed = None;
    let mut last_print = Instant::now();
    let mut p = Placements::default();
    let t_converged = loop {
        // The placement list is ~15 MB at full scale: it is read only until everything is
        // placed (every agent running with all its replicas implies it stays so), since
        // reading it twice a second costs the controller and this process a share of the
        // cores whose convergence is being measured.
        if t_placed.is_none() {
            p = placements(&http, &ctl.url, &admin).await.unwrap_or_default();
            if p.placed == total && p.pending == 0 {
                t_placed = Some(t0.elapsed());
            }
        }
        let running = agents_running(&dk, args.replicas);
        if t_placed.is_some() && running == args.agents {
            break t0.elapsed();
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "  {:>5.1}s joined {} placed {}/{}{} running agents {}/{} rss {:.0} MiB",
                t0.elapsed().as_secs_f64(),
                shared.joined.load(Ordering::Relaxed),
                p.placed,
                total,
                if p.reasons.is_empty() { String::new() } else { format!(" (pending: {:?})", p.reasons) },
                running,
                args.agents,
                rss()
            );
            last_print = Instant::now();
        }
        let refused = shared.refused.load(Ordering::Relaxed);
        if refused > 0 {
            bail!(
                "the controller refused {refused} node(s) their join (why is logged above): the fleet cannot converge"
            );
        }
        if t0.elapsed() > limit {
            bail!(
                "cold convergence did not finish in {limit:?}: placed {}/{total}, running {running}/{}",
                p.placed,
                args.agents
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let cold_cpu = cpu() - cpu0;
    let live_pats = dk.pats().iter().filter(|p| !p.revoked).count();
    eprintln!("fleet-sim: converged in {:.1}s ({live_pats} live PATs)", t_converged.as_secs_f64());

    if args.hostile {
        return hostile_measurement(&args, &dk, &shared, &http, pid, ctl).await;
    }

    // Phase 2: steady state at the fleet's natural report rate.
    let metrics = |http: reqwest::Client, url: String| async move {
        let text = http.get(url).send().await.ok()?.text().await.ok()?;
        Some(measure::Histogram::parse(&text, "fleet_pass_duration_seconds"))
    };
    tokio::time::sleep(Duration::from_secs(args.report_seconds)).await; // let the post-convergence reports settle
    let h0 = metrics(http.clone(), ctl.metrics_url.clone()).await.unwrap_or_default();
    let (c0, r0, s0) = (cpu(), shared.reports_ok.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let h1 = metrics(http.clone(), ctl.metrics_url.clone()).await.unwrap_or_default();
    let secs = s0.elapsed().as_secs_f64();
    let steady_cpu = (cpu() - c0) / secs * 100.0;
    let steady_rate = (shared.reports_ok.load(Ordering::Relaxed) - r0) as f64 / secs;
    let passes = h1.since(&h0);
    eprintln!(
        "fleet-sim: steady {steady_rate:.0} reports/s, controller {steady_cpu:.1}% of a core, {} passes",
        passes.count
    );

    // Phase 3: wake latency after agent changes.
    let mut wake = wake::Samples::default();
    for _ in 0..args.wake_samples {
        wake::sample(&dk, &shared, args.agents, &mut wake).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let wake = wake.finish();

    // Phase 4: report throughput, some nodes reporting back-to-back.
    let (r0, b0) = (shared.reports_ok.load(Ordering::Relaxed), Instant::now());
    let c0 = cpu();
    let burst_stop = Arc::new(AtomicBool::new(false));
    let mut bursters = Vec::new();
    for n in nodes.iter().take(args.burst_nodes) {
        let (n, sh, stop) = (n.clone(), shared.clone(), burst_stop.clone());
        bursters.push(tokio::spawn(node::burst(n, sh, stop)));
    }
    tokio::time::sleep(Duration::from_secs(args.burst_seconds)).await;
    burst_stop.store(true, Ordering::Relaxed);
    for b in bursters {
        let _ = b.await;
    }
    let burst_secs = b0.elapsed().as_secs_f64();
    let burst_rate = (shared.reports_ok.load(Ordering::Relaxed) - r0) as f64 / burst_secs;
    let burst_cpu = (cpu() - c0) / burst_secs * 100.0;
    eprintln!("fleet-sim: burst {burst_rate:.0} reports/s at {burst_cpu:.0}% of a core");

    // Phase 5: a share of the nodes goes silent; everything moves and runs again.
    let ids: HashMap<String, String> = {
        let v: Value = http.get(format!("{}/api/v1/nodes", ctl.url)).bearer_auth(&admin).send().await?.json().await?;
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                (n["name"].as_str().unwrap_or_default().to_string(), n["id"].as_str().unwrap_or_default().to_string())
            })
            .collect()
    };
    let silent: HashSet<String> = nodes
        .iter()
        .filter(|n| n.index.is_multiple_of(100 / args.silent_percent.max(1)))
        .filter_map(|n| {
            n.silent.store(true, Ordering::Relaxed);
            ids.get(&n.name).cloned()
        })
        .collect();
    let silent_replicas: usize =
        nodes.iter().filter(|n| n.silent.load(Ordering::Relaxed)).map(|n| n.replica_count()).sum();
    let t_silent = Instant::now();
    eprintln!("fleet-sim: {} nodes silent holding {silent_replicas} replicas", silent.len());
    let recovery = loop {
        let p = placements(&http, &ctl.url, &admin).await.unwrap_or_default();
        let moved = p.placed == total && p.pending == 0 && !p.by_node.keys().any(|id| silent.contains(id));
        if moved && agents_running(&dk, args.replicas) == args.agents {
            break t_silent.elapsed();
        }
        if t_silent.elapsed() > limit {
            bail!("recovery did not finish in {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let replica_rss: Vec<f64> = pids.iter().map(|p| measure::peak_rss_mib(*p).unwrap_or(0.0)).collect();
    let peak_rss = replica_rss.iter().copied().fold(0.0, f64::max);

    let results = json!({
        "nodes": args.nodes, "agents": args.agents, "replicas": total,
        "coldConvergenceSeconds": t_converged.as_secs_f64(),
        "allPlacedSeconds": t_placed.map(|d| d.as_secs_f64()),
        "coldCpuSeconds": cold_cpu,
        "livePats": live_pats,
        "steadyPassP50Ms": passes.quantile_ms(0.5), "steadyPassP99Ms": passes.quantile_ms(0.99), "steadyPasses": passes.count,
        "wakeP50Ms": wake.wake_p(0.5), "wakeP99Ms": wake.wake_p(0.99),
        "listedToNodeP50Ms": measure::percentile(&wake.listed, 0.5), "listedToNodeP99Ms": measure::percentile(&wake.listed, 0.99),
        "cpEditToNodeP50Ms": measure::percentile(&wake.edit, 0.5), "cpEditToNodeP99Ms": measure::percentile(&wake.edit, 0.99),
        "steadyReportsPerSecond": steady_rate, "steadyCpuPercent": steady_cpu,
        "burstReportsPerSecond": burst_rate, "burstCpuPercent": burst_cpu,
        "peakRssMiB": peak_rss, "controllers": args.controllers, "replicaPeakRssMiB": replica_rss,
        "silentNodes": silent.len(), "silentReplicas": silent_replicas,
        "recoverySeconds": recovery.as_secs_f64(), "offlineThresholdSeconds": args.offline_seconds,
        "reportsFailed": shared.reports_failed.load(Ordering::Relaxed),
        "protocol": if exchange { "exchange" } else { "two-routes" },
        "reportConnections": if exchange { "one per node (the exchange)" } else if own_report_connections { "own" } else { "shared" },
    });
    print_table(&results);
    println!("{}", serde_json::to_string_pretty(&results)?);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&results)?)?;
    }
    Ok(())
}

/// `--hostile`: the measurement of [`attack_phase`], printed and written like the others.
async fn hostile_measurement(
    args: &Args,
    dk: &Devkit,
    shared: &Shared,
    http: &reqwest::Client,
    pid: u32,
    ctl: &Controller,
) -> anyhow::Result<()> {
    let fleet = attack_phase::Fleet {
        dk,
        shared,
        http,
        pid,
        agents: args.agents,
        addr: ctl.url.trim_start_matches("http://").parse()?,
        metrics_url: &ctl.metrics_url,
    };
    let mix = hostile::Mix {
        idle: args.hostile_idle as usize,
        head: args.hostile_head as usize,
        body: args.hostile_body as usize,
    };
    let mut results = attack_phase::run(&fleet, mix, Duration::from_secs(args.hostile_seconds)).await?;
    results["nodes"] = json!(args.nodes);
    results["agents"] = json!(args.agents);
    results["replicas"] = json!(args.agents as u64 * args.replicas as u64);
    attack_phase::print_table(&results);
    println!("{}", serde_json::to_string_pretty(&results)?);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&results)?)?;
    }
    Ok(())
}

fn print_table(r: &Value) {
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

#[cfg(test)]
mod report_connection_tests {
    use super::ReportConnections;

    #[test]
    fn auto_gives_nodes_their_own_report_connection_only_when_the_sockets_fit() {
        // Two sockets per node (long-poll and report) plus the spare must fit the limit.
        assert!(ReportConnections::Auto.own(4_000, Some(20_000)));
        assert!(!ReportConnections::Auto.own(10_000, Some(20_000)));
        assert!(ReportConnections::Auto.own(10_000, Some(21_024)));
        assert!(ReportConnections::Auto.own(10_000, None));
        // An explicit choice stands either way.
        assert!(ReportConnections::Own.own(10_000, Some(20_000)));
        assert!(!ReportConnections::Shared.own(10, Some(1_000_000)));
    }
}
