//! `fleet-controller dev` (SPEC §9): the controller on SQLite in a local directory with an
//! embedded devkit seeded with example agents; prints an admin token, a fresh join key and
//! the line that starts a node — the whole fleet on one machine in one command.

use crate::config::{ClientCredentials, Config, LogFormat, StoreConfig};
use crate::server;
use fleet_devkit::{Devkit, DevkitConfig};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Directory for the store, the node's files and the join key.
    #[arg(long, default_value = ".fleet-dev")]
    pub dir: PathBuf,
    /// Controller API address.
    #[arg(long, default_value = "127.0.0.1:8040")]
    pub listen: SocketAddr,
    /// Prometheus metrics address.
    #[arg(long, default_value = "127.0.0.1:9040")]
    pub metrics_listen: SocketAddr,
    /// The embedded devkit (CP + IAM) address.
    #[arg(long, default_value = "127.0.0.1:8041")]
    pub devkit_listen: SocketAddr,
    /// YAML list of agents (CP items) to seed instead of the examples.
    #[arg(long)]
    pub agents: Option<PathBuf>,
    /// Executor kind of the example agents and of the printed node.yaml.
    #[arg(long, default_value = "claude-code")]
    pub executor_kind: String,
    /// Image the printed node.yaml runs for that kind.
    #[arg(long, default_value = "fleet-dev-agent:latest")]
    pub image: String,
    /// Exit after printing (for scripts and tests) instead of serving until Ctrl-C.
    #[arg(long, hide = true)]
    pub print_and_exit: bool,
}

pub const DEV_TOKEN_AUDIENCES: &str = "notification-service";
pub const DEV_TOKEN_SCOPES: &str = "control-plane:read control-plane:write notification-service=notifications:send";

/// What `dev` started, for the caller to print or use.
pub struct DevFleet {
    pub devkit: Devkit,
    pub controller: server::Running,
    pub admin_token: String,
    pub join_key: String,
    pub node_yaml: PathBuf,
}

fn abs(p: &Path) -> PathBuf {
    std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
}

pub async fn start(args: &DevArgs) -> anyhow::Result<DevFleet> {
    let dir = abs(&args.dir);
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let dk_cfg = DevkitConfig::default();
    let devkit = Devkit::start(dk_cfg.clone(), args.devkit_listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the devkit on {}: {e}", args.devkit_listen))?;
    let agents = match &args.agents {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
            fleet_devkit::state::agents_from_yaml(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => fleet_devkit::state::example_agents(&args.executor_kind),
    };
    for a in agents {
        devkit.put_agent(a);
    }
    let cfg = Config {
        listen: args.listen,
        metrics_listen: args.metrics_listen,
        store: StoreConfig {
            data_dir: dir.display().to_string(),
            database_url: format!("sqlite://{}/fleet.sqlite", dir.display()),
        },
        control_plane_url: devkit.url.clone(),
        iam_url: devkit.url.clone(),
        iam_issuer: devkit.issuer(),
        iam_tenant: dk_cfg.tenant.clone(),
        jwks_url: devkit.jwks_url(),
        credentials: Some(ClientCredentials {
            client_id: dk_cfg.client_id.clone(),
            client_secret: dk_cfg.client_secret.clone(),
        }),
        audience: crate::config::defaults::AUDIENCE.into(),
        token_audiences: DEV_TOKEN_AUDIENCES.split_whitespace().map(str::to_string).collect(),
        token_scopes: DEV_TOKEN_SCOPES.split_whitespace().map(str::to_string).collect(),
        token_ttl_seconds: crate::config::defaults::TOKEN_TTL_SECONDS,
        reconcile_every: Duration::from_secs(crate::config::defaults::RECONCILE_SECONDS),
        node_offline_after: Duration::from_secs(crate::config::defaults::NODE_OFFLINE_SECONDS),
        token_revoke_grace: Duration::from_secs(crate::config::defaults::TOKEN_REVOKE_GRACE_SECONDS),
        kubernetes_mirror: false,
        kubernetes_namespace: None,
        log_format: LogFormat::Text,
    };
    let controller = server::start(cfg).await?;
    let admin_token = devkit.mint("fleet", &["fleet:admin"], 86_400);
    let (join_key, _) = controller.store.issue_join_key(Duration::from_secs(3600), "dev").await?;
    let key_file = dir.join("join-key");
    std::fs::write(&key_file, &join_key)?;
    let node_yaml = dir.join("node.yaml");
    let yaml = format!(
        "# Written by `fleet-controller dev`: a node on this machine's Docker.\n\
         controllerUrl: http://{addr}\n\
         name: dev-node\n\
         labels: []\n\
         capacity: {{slots: 4}}\n\
         executors:\n  {kind}: {{image: \"{image}\", dataPath: /data}}\n\
         stateDir: {dir}/node-state\n\
         secretsDir: {dir}/secrets\n\
         joinKeyFile: {key}\n\
         observeSeconds: 5\n",
        addr = controller.addr,
        kind = args.executor_kind,
        image = args.image,
        dir = dir.display(),
        key = key_file.display(),
    );
    std::fs::write(&node_yaml, yaml)?;
    Ok(DevFleet { devkit, controller, admin_token, join_key, node_yaml })
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let fleet = start(&args).await?;
    let api = format!("http://{}", fleet.controller.addr);
    println!();
    println!("Fleet dev controller  {api}   (metrics http://{}/metrics)", fleet.controller.metrics_addr);
    println!("devkit CP + IAM       {}   (agents: GET {}/devkit/agents)", fleet.devkit.url, fleet.devkit.url);
    println!("store                 {}", abs(&args.dir).join("fleet.sqlite").display());
    println!();
    println!("Admin token (fleet:admin, 24 h):");
    println!("  export FLEET_TOKEN={}", fleet.admin_token);
    println!("  curl -s -H \"Authorization: Bearer $FLEET_TOKEN\" {api}/api/v1/placements");
    println!();
    println!("Join key (one use, 1 h): {}", fleet.join_key);
    println!();
    println!("Start a node on this machine's Docker:");
    println!("  cargo run -p fleet-node -- --config {}", fleet.node_yaml.display());
    println!();
    if args.print_and_exit {
        fleet.controller.shutdown().await;
        return Ok(());
    }
    println!("Serving; Ctrl-C stops.");
    let _ = tokio::signal::ctrl_c().await;
    fleet.controller.shutdown().await;
    Ok(())
}
