#![forbid(unsafe_code)]
//! `fleet-node`: a thin shell over the library.

use clap::{Parser, Subcommand};
use fleet_node::config::NodeConfig;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "fleet-node",
    version,
    propagate_version = true,
    about = "Runs a machine's share of the fleet: joins with a one-time key, pulls its desired state and runs the agents' containers through Docker."
)]
struct Cli {
    /// node.yaml (docs/reference.md#node-configuration-nodeyaml).
    #[arg(long, global = true, env = "FLEET_NODE_CONFIG", default_value = "/etc/fleet-node/node.yaml")]
    config: PathBuf,
    /// The node protocol (docs/behaviour.md#desired-state-and-observed-report): `auto` speaks the exchange (one connection) when the
    /// controller offers it, else the two routes; `two-routes` keeps to `GET desired` and `PUT
    /// observed`, as nodes before the exchange did (for a proxy that cannot hold a POST).
    #[arg(long, global = true, env = "FLEET_NODE_PROTOCOL", value_enum, default_value_t = Protocol::Auto)]
    protocol: Protocol,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Auto,
    TwoRoutes,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node (the default).
    Run,
    /// Validate the configuration, print what the node would announce, and exit.
    Check,
    /// Run the Docker API guard for this node: a proxy between fleet-node and the engine that
    /// admits only what fleet-node uses and refuses privileged or foreign containers (point
    /// node.yaml's dockerUrl at it).
    DockerGuard {
        /// Where to listen: unix://PATH (shared with the node) or ADDR:PORT.
        #[arg(long)]
        listen: String,
        /// The Docker engine: unix://PATH or tcp://HOST:PORT.
        #[arg(long, default_value = "unix:///var/run/docker.sock")]
        docker: String,
        /// The node's UID:GID (owner of its PAT files; its agents' user where a kind names
        /// none). Default: the owner of hostStateDir.
        #[arg(long, value_name = "UID:GID")]
        node_user: Option<String>,
    },
}

/// Fields as the default text format writes them (`name=value`, the message bare), with
/// every control character in a value escaped.
fn escaping_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = fleet_api::text::escape_controls(&text);
        match field.name() {
            "message" => write!(w, "{text}"),
            name => write!(w, "{name}={text}"),
        }
    })
    .delimited(" ")
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colours only on a terminal: logs written to files and collectors stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // Text lines escape control characters in every field: what a node, the CP or a client
    // wrote cannot start a line of its own (docs/behaviour.md#hardening).
    let b = b.fmt_fields(escaping_fields());
    if std::env::var("FLEET_LOG_FORMAT").as_deref() == Ok("json") {
        b.json().init();
    } else {
        b.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match NodeConfig::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet-node: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command.unwrap_or(Command::Run) {
        Command::Check => {
            println!("{}: ok", cli.config.display());
            println!("node {} → {}", cfg.name, cfg.controller_url);
            println!("kinds: {}", cfg.kinds().join(", "));
            for (kind, e) in &cfg.executors {
                let res = |r: &Option<fleet_node::config::ResourceLimits>| match r {
                    Some(r) => format!("cpus {:?}, memoryMb {:?}", r.cpus, r.memory_mb),
                    None => "none".into(),
                };
                println!(
                    "  {kind}: image {}, capAdd [{}], pidsLimit {}, user {}, defaultResources {}, maxResources {}",
                    e.image,
                    e.cap_add.join(", "),
                    e.pids_limit.unwrap_or(fleet_node::runtime::DEFAULT_PIDS_LIMIT),
                    e.user.as_deref().unwrap_or("(the node's own)"),
                    res(&e.default_resources),
                    res(&e.max_resources),
                );
            }
            println!("labels: {}", cfg.sorted_labels().join(", "));
            let present = fleet_node::plan::read_secrets(&cfg.secrets_dir);
            println!("secrets: {}", present.iter().cloned().collect::<Vec<_>>().join(", "));
            for (kind, offered) in cfg.offered_secrets(&present) {
                println!("  offered to {kind}: {}", offered.join(", "));
            }
            for w in cfg.secret_warnings(&present) {
                println!("warning: {w}");
            }
            ExitCode::SUCCESS
        }
        Command::DockerGuard { listen, docker, node_user } => {
            init_logs();
            match docker_guard(&cfg, &listen, &docker, node_user.as_deref()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("fleet-node docker-guard: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run => {
            init_logs();
            match fleet_node::daemon::run(cfg, cli.protocol == Protocol::Auto).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    eprintln!("fleet-node: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn docker_guard(cfg: &NodeConfig, listen: &str, docker: &str, node_user: Option<&str>) -> Result<(), String> {
    fleet_node::guard::start(cfg, listen, docker, node_user).await
}
