//! `fleet-sim`'s command line: the fleet's size, the length of each phase, how the
//! controller is started and how the simulated nodes connect to it, and the combinations of
//! flags no run can satisfy.

use anyhow::bail;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "fleet-sim",
    version,
    about = "Simulate a large fleet against a real fleet-controller process and measure it"
)]
pub struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Agents in the CP.
    #[arg(long, default_value_t = 20_000)]
    pub agents: usize,
    /// Replicas per agent.
    #[arg(long, default_value_t = 5)]
    pub replicas: u32,
    /// Slots per node (the controller takes 0–100).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub slots: u32,
    /// Report period of every node (jittered ±10 %).
    #[arg(long, default_value_t = 20)]
    pub report_seconds: u64,
    /// Length of the steady window (pass duration, CPU at the steady report rate).
    #[arg(long, default_value_t = 60)]
    pub steady_seconds: u64,
    /// Agent changes whose wake latency is measured.
    #[arg(long, default_value_t = 30)]
    pub wake_samples: usize,
    /// Nodes that report back-to-back in the throughput probe.
    #[arg(long, default_value_t = 500)]
    pub burst_nodes: usize,
    #[arg(long, default_value_t = 10)]
    pub burst_seconds: u64,
    /// Share of nodes that go silent in the recovery phase, percent.
    #[arg(long, default_value_t = 10)]
    pub silent_percent: usize,
    /// FLEET_NODE_OFFLINE_SECONDS for the controller.
    #[arg(long, default_value_t = 60)]
    pub offline_seconds: u64,
    /// Give up on a phase after this long.
    #[arg(long, default_value_t = 600)]
    pub phase_timeout_seconds: u64,
    /// The controller binary (default: fleet-controller next to this program).
    #[arg(long)]
    pub controller: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep the controller's data directory and log here instead of a temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Extra environment for the controller, NAME=VALUE (repeatable), e.g. RUST_LOG=info.
    #[arg(long = "controller-env", value_parser = parse_env)]
    pub controller_env: Vec<(String, String)>,
    /// How nodes send their reports: `own` — a keep-alive connection per node, as real nodes
    /// do, so the controller holds two connections per node; `shared` — through the one client
    /// pool the long-polls use (fewer controller connections: under-states its memory);
    /// `auto` — `own` when the open-file limit allows two sockets per node, else `shared`.
    #[arg(long, value_enum, default_value_t = ReportConnections::Auto)]
    pub report_connections: ReportConnections,
    /// The node protocol (docs/behaviour.md#desired-state-and-observed-report): `exchange` — one connection per node carries its join,
    /// reports and long-polls, as fleet-node does with a controller that offers it;
    /// `two-routes` — `GET desired` and `PUT observed`, as older nodes do (see
    /// `--report-connections`).
    #[arg(long, value_enum, default_value_t = Protocol::Exchange)]
    pub protocol: Protocol,
    /// After cold convergence, measure the fleet before, during and after an attack by
    /// clients without credentials (docs/behaviour.md#hardening) instead of the steady, burst and recovery
    /// phases: `fleet-sim --nodes 1000 --agents 2000 --hostile`.
    #[arg(long)]
    pub hostile: bool,
    /// After cold convergence, a window at rest, then every agent's template changes at once
    /// and a share of them crash (docs/behaviour.md#rolling-out-a-change), instead of the
    /// steady, burst and recovery phases: `fleet-sim --rollout`.
    #[arg(long, conflicts_with = "hostile")]
    pub rollout: bool,
    /// With --rollout: the percentage of agents whose new template crash-loops.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rollout_failing_percent: u32,
    /// With --rollout: the agents' `placement.rollout.minReadySeconds`.
    #[arg(long, default_value_t = 10)]
    pub rollout_min_ready_seconds: u64,
    /// With --rollout: new agents added in the CP while the rollout runs, about one a second,
    /// each timed until a node holds it.
    #[arg(long, default_value_t = 20)]
    pub mid_rollout_agents: u32,
    /// With --rollout: the percentage of replicas that say they are busy when the templates
    /// change, each for a random 0–120 s (docs/behaviour.md#busy-replicas).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub rollout_busy_percent: u32,
    /// Hostile connections that connect and send nothing.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub hostile_idle: u32,
    /// Hostile connections that trickle a request head that never ends.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub hostile_head: u32,
    /// Hostile connections that send a join's head and trickle its body.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub hostile_body: u32,
    /// Hostile connections that send 63,000 bytes of a head that never ends, then stall: the
    /// strangers' budget (FLEET_UNAUTH_BUFFER_BYTES) sheds them.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub hostile_big_head: u32,
    /// Hostile connections that send a join's head and 64 KiB of its body but the last byte,
    /// then stall.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub hostile_big_join: u32,
    /// Length of each measured window (before and during the attack).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(10..=600))]
    pub hostile_seconds: u64,
    /// Controller replicas on one PostgreSQL (docs/behaviour.md#high-availability), nodes spread across them. More than
    /// one needs a database: `--database`, or one this program starts from Debian's
    /// PostgreSQL packages.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub controllers: u32,
    /// FLEET_DATABASE_URL of every controller (postgres://…); SQLite in the data directory
    /// when unset and there is one controller.
    #[arg(long)]
    pub database: Option<String>,
    /// The agents' placement fields (docs/behaviour.md#spread-and-priority): `none`, or
    /// `spread-priority` — 10 % of the agents spread over the nodes' ten zones, every agent a
    /// priority from five levels.
    #[arg(long, value_enum, default_value_t = AgentFields::None)]
    pub agent_fields: AgentFields,
    /// Zones the nodes lie in (`zone=z0`…): 4, where the even nodes have `gpu` and zone-bound
    /// agents require `z0`; or more (`--compare-fields` runs 10), where half of each zone's
    /// nodes have `gpu` and zone-bound agents require one of them.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=100))]
    pub zones: u32,
    /// After cold convergence, only the steady window (no wake, burst or recovery phase).
    #[arg(long, conflicts_with_all = ["hostile", "rollout"])]
    pub cold_and_steady: bool,
    /// Runs cold convergence and the steady window twice, each on a fresh controller and
    /// fleet — the agents without placement fields, then with `spread-priority` — and prints
    /// the two side by side: `fleet-sim --compare-fields`.
    #[arg(long, conflicts_with_all = ["hostile", "rollout", "cold_and_steady"])]
    pub compare_fields: bool,
    /// After cold convergence, this many times at steady state: `SIGKILL` of the leader and
    /// a new agent in the CP at that moment, timed until another replica leads, has passed,
    /// and a node holds the agent (docs/behaviour.md#high-availability). Needs `--controllers` ≥ 2.
    #[arg(long, default_value_t = 0, conflicts_with_all = ["hostile", "rollout", "cold_and_steady", "compare_fields"])]
    pub takeover_kills: u32,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentFields {
    None,
    SpreadPriority,
}

impl AgentFields {
    /// Agent `i` of the simulated CP with these fields, on a fleet of `zones` zones.
    pub fn agent(self, i: usize, replicas: u32, zones: usize) -> serde_json::Value {
        match self {
            AgentFields::None => fleet_devkit::state::synthetic_agent_in(i, replicas, zones),
            AgentFields::SpreadPriority => fleet_devkit::state::synthetic_agent_with_fields(i, replicas, zones),
        }
    }
}

impl Args {
    /// Replicas in the CP: agents × replicas per agent.
    pub fn total_replicas(&self) -> u64 {
        self.agents as u64 * self.replicas as u64
    }

    /// Refuses a fleet whose slots cannot hold its replicas, and `--hostile` on several
    /// controller replicas.
    pub fn check(&self) -> anyhow::Result<()> {
        let total = self.total_replicas();
        if (self.nodes as u64) * (self.slots as u64) < total {
            bail!("{} nodes × {} slots cannot hold {total} replicas", self.nodes, self.slots);
        }
        if self.hostile && self.controllers > 1 {
            bail!("--hostile measures one controller; leave --controllers at 1");
        }
        if self.takeover_kills > 0 && self.controllers < 2 {
            bail!("--takeover-kills needs a replica to take over: --controllers 2 or more");
        }
        Ok(())
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Exchange,
    TwoRoutes,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportConnections {
    Auto,
    Own,
    Shared,
}

/// Sockets this process needs beyond two per node (devkit's server and clients, the files).
pub const SPARE_FILES: u64 = 1024;

impl ReportConnections {
    /// Whether nodes report over connections of their own, given the open-file limit.
    pub fn own(self, nodes: usize, open_file_limit: Option<u64>) -> bool {
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
