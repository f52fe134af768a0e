#![forbid(unsafe_code)]
//! `fleetctl`: the Fleet admin's command line (docs/reference.md#fleetctl). Reads like kubectl: tables by
//! default, `-o wide` for more columns, `-o json` for the API's own answer.

mod access;
mod clean;
mod client;
mod commands;
mod rollout;
mod table;

use clap::{Parser, Subcommand, ValueEnum};
use commands::{DrainOptions, EventsFrom, EventsQuery};
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "fleetctl",
    version,
    about = "Look at and operate a Fleet: nodes, placements, why an agent waits, events, cordon, drain, delete, what a node may claim, rollouts, join keys",
    after_help = "Start a dev fleet with `fleet-controller dev`: it prints the FLEET_URL and FLEET_TOKEN to use."
)]
struct Cli {
    /// The controller's URL.
    #[arg(long, env = "FLEET_URL", default_value = "http://127.0.0.1:8040", global = true)]
    url: String,
    /// An admin token (a JWT from IAM with fleet:read, or fleet:admin for changes). Prefer
    /// FLEET_TOKEN or --token-file: a command line is visible to every user in `ps`.
    #[arg(long, global = true, value_name = "TOKEN")]
    token: Option<String>,
    /// Read the admin token from this file (instead of FLEET_TOKEN).
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "token")]
    token_file: Option<std::path::PathBuf>,
    /// Send the token over plain http:// to a host other than this machine.
    #[arg(long, global = true)]
    insecure: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Table,
    Wide,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every node: status, health, scheduling, slots, version, last report.
    Nodes,
    /// One node (id or name) with the replicas it reported.
    Node { node: String },
    /// Every placement: where each agent's replicas are, or why they wait.
    Placements,
    /// Why an agent is where it is, or why it waits: the placement filters with counts.
    Why {
        agent: String,
        /// Also every node's verdict.
        #[arg(long)]
        nodes: bool,
    },
    /// The last 50 events, oldest of them first (the newest at the bottom, as `tail` shows a log).
    Events {
        /// Only this agent's events.
        #[arg(long)]
        agent: Option<String>,
        /// Only this node's events (id or name).
        #[arg(long)]
        node: Option<String>,
        /// Keep printing new events as they happen.
        #[arg(short, long)]
        follow: bool,
        /// Every event kept (up to 10,000), oldest first, instead of the last 50.
        #[arg(long, conflicts_with = "since")]
        all: bool,
        /// Every event after this seq, oldest first, instead of the last 50.
        #[arg(long, value_name = "SEQ")]
        since: Option<u64>,
    },
    /// Place no new replica on the node; those there stay.
    Cordon { node: String },
    /// Make the node eligible again (also ends a drain).
    Uncordon { node: String },
    /// Cordon the node and move every replica off it.
    Drain {
        node: String,
        /// Unbind replicas that have nowhere else to go (their agents wait).
        #[arg(long)]
        force: bool,
        /// Wait until no replica is left, showing progress.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Replace what the node may claim: the labels and kinds given (each flag repeatable); a
    /// flag not given allows anything of it, so no flag lifts every limit.
    Allow {
        node: String,
        /// A label pattern the node may claim (name, name=value or name=*).
        #[arg(long = "label", value_name = "PATTERN")]
        label: Vec<String>,
        /// An executor kind the node may claim.
        #[arg(long = "kind", value_name = "KIND")]
        kind: Vec<String>,
    },
    /// Remove the node from the fleet now: its token stops working and its PATs are revoked.
    Delete {
        node: String,
        /// Do not ask for confirmation.
        #[arg(short, long)]
        yes: bool,
    },
    /// An agent's rollout: its status, or an order (pause, resume, undo, restart).
    Rollout {
        #[command(subcommand)]
        command: RolloutCommand,
    },
    /// Every rollout not complete: progressing, paused, halted or reverted.
    Rollouts,
    /// Issue a one-time join key for a new node.
    JoinKey {
        /// Validity in seconds (60…604800, default 3600).
        #[arg(long)]
        ttl: Option<u64>,
        /// A note kept with the key.
        #[arg(long)]
        note: Option<String>,
        /// A label pattern the node may claim (name, name=value or name=*); repeat it. Without
        /// it the node may claim any label.
        #[arg(long = "allow-label", value_name = "PATTERN")]
        allow_label: Vec<String>,
        /// An executor kind the node may claim; repeat it. Without it, any kind.
        #[arg(long = "allow-kind", value_name = "KIND")]
        allow_kind: Vec<String>,
    },
    /// The join keys still of interest (unused, used within a week), never the keys themselves.
    JoinKeys,
    /// End a join key now, by the id `join-keys` lists: no node joins with it any more.
    RevokeJoinKey { id: String },
}

#[derive(Subcommand, Debug)]
enum RolloutCommand {
    /// The rollout's state and progress; exits 1 when it halted or reverted.
    Status {
        agent: String,
        /// Show a progress line until the rollout completes (exit 0) or halts (exit 1). It
        /// answers only once the controller has read the CP after the watch began, so a
        /// change made just before is in the answer.
        #[arg(short, long)]
        watch: bool,
        /// With --watch: answer only once the rollout's target has this revision or a later one.
        #[arg(long, requires = "watch")]
        revision: Option<u64>,
        /// With --watch: give up after this many seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Take no further step; the steps taken stay.
    Pause { agent: String },
    /// Undo a pause, or retry a halted or reverted rollout from where it stopped.
    Resume { agent: String },
    /// Make the previous template the target again, as a new rollout.
    Undo { agent: String },
    /// Recreate every replica, in steps, with nothing else changed.
    Restart { agent: String },
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    quiet_on_a_closed_pipe();
    let cli = Cli::parse();
    let token = access::token(cli.token.as_deref(), cli.token_file.as_deref(), std::env::var("FLEET_TOKEN").ok())
        .and_then(|(token, warning)| {
            if let Some(w) = warning {
                eprintln!("{w}");
            }
            access::check_transport(&cli.url, token.is_some(), cli.insecure).map(|()| token)
        });
    let token = token.unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    });
    let c = client::Client::new(&cli.url, token);
    let out = cli.output;
    let result = match &cli.command {
        Command::Nodes => commands::nodes(&c, out).await,
        Command::Node { node } => commands::node(&c, out, node).await,
        Command::Placements => commands::placements(&c, out).await,
        Command::Why { agent, nodes } => commands::why(&c, out, agent, *nodes).await,
        Command::Events { agent, node, follow, all, since } => {
            let from = match (all, since) {
                (true, _) => EventsFrom::Seq(0),
                (false, Some(s)) => EventsFrom::Seq(*s),
                (false, None) => EventsFrom::Last(commands::LAST_EVENTS),
            };
            let q = EventsQuery { agent: agent.as_deref(), node: node.as_deref(), follow: *follow, from };
            commands::events(&c, out, q).await
        }
        Command::Cordon { node } => commands::lifecycle_action(&c, out, node, "cordon").await,
        Command::Allow { node, label, kind } => commands::allow(&c, out, node, label, kind).await,
        Command::Uncordon { node } => commands::lifecycle_action(&c, out, node, "uncordon").await,
        Command::Drain { node, force, wait, timeout } => {
            let o = DrainOptions { force: *force, wait: *wait, timeout: Duration::from_secs(*timeout) };
            commands::drain(&c, out, node, o).await
        }
        Command::Delete { node, yes } => commands::delete(&c, node, *yes).await,
        Command::Rollout { command } => match command {
            RolloutCommand::Status { agent, watch, revision, timeout } => {
                let watch =
                    watch.then_some(rollout::Watch { revision: *revision, timeout: Duration::from_secs(*timeout) });
                rollout::status(&c, out, agent, watch).await
            }
            RolloutCommand::Pause { agent } => rollout::action(&c, out, agent, "pause").await,
            RolloutCommand::Resume { agent } => rollout::action(&c, out, agent, "resume").await,
            RolloutCommand::Undo { agent } => rollout::action(&c, out, agent, "undo").await,
            RolloutCommand::Restart { agent } => rollout::action(&c, out, agent, "restart").await,
        },
        Command::Rollouts => rollout::list(&c, out).await,
        Command::JoinKey { ttl, note, allow_label, allow_kind } => {
            commands::join_key(&c, out, *ttl, note.as_deref(), allow_label, allow_kind).await
        }
        Command::JoinKeys => commands::join_keys(&c, out).await,
        Command::RevokeJoinKey { id } => commands::revoke_join_key(&c, id).await,
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// `fleetctl events | head` closes the pipe early: end as a tool killed by SIGPIPE does
/// (status 141, no message), not with a panic's backtrace. Rust ignores SIGPIPE, so the print
/// fails, and `println!` panics with std's own message on a failed write to stdout.
fn quiet_on_a_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload().downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}
