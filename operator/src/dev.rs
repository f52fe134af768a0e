//! `fleet-controller dev` (docs/behaviour.md#development-kit): the controller on SQLite in a local directory with an
//! embedded devkit seeded with example agents; prints the controller's, its web view's and
//! the devkit's addresses, an admin token, a fresh join key and the line that starts a node —
//! the whole fleet on one machine in one command.

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
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Name of the node `--with-node` starts; also the prefix of its containers.
    #[arg(long, default_value = "dev-node")]
    pub node_name: String,
    /// Also build a small local agent image and start a `fleet-node` on this machine's Docker.
    #[arg(long)]
    pub with_node: bool,
    /// Exit after printing (for scripts and tests) instead of serving until Ctrl-C.
    #[arg(long, hide = true)]
    pub print_and_exit: bool,
}

/// The example agent: prints its identity and PAT, runs until SIGTERM.
const DEV_AGENT_SCRIPT: &str = r#"bb=/bin/busybox
trap 'echo "agent $CONTROL_PLANE_AGENT_KEY: got SIGTERM, bye"; exit 0' TERM
echo "agent $CONTROL_PLANE_AGENT_KEY replica $FLEET_REPLICA (principal $IAM_PRINCIPAL) started"
[ -r /run/secrets/agent-pat ] && echo "PAT: $($bb wc -c < /run/secrets/agent-pat) bytes in /run/secrets/agent-pat"
while true; do $bb sleep 3600 & wait $!; done
"#;

/// Builds `image` FROM scratch around a static busybox (the engine may have no registry).
fn build_dev_image(image: &str) -> anyhow::Result<()> {
    let busybox = std::path::Path::new("/bin/busybox");
    anyhow::ensure!(
        busybox.exists(),
        "--with-node builds its example agent image around a static busybox: apt-get install busybox-static"
    );
    let dir = std::env::temp_dir().join(format!("fleet-dev-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::copy(busybox, dir.join("busybox"))?;
    std::fs::write(dir.join("agent.sh"), DEV_AGENT_SCRIPT)?;
    std::fs::write(
        dir.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY agent.sh /agent.sh\nENTRYPOINT [\"/bin/busybox\", \"sh\", \"/agent.sh\"]\n",
    )?;
    let out = std::process::Command::new("docker")
        .args(["build", "-q", "-t", image])
        .arg(&dir)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run docker: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(out.status.success(), "docker build {image}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// The `fleet-node` binary: beside this one, on PATH, or built with cargo in this workspace.
fn node_binary() -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe()?.with_file_name("fleet-node");
    if beside.exists() {
        return Ok(beside);
    }
    if let Ok(out) = std::process::Command::new("which").arg("fleet-node").output() {
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !p.is_empty() {
            return Ok(PathBuf::from(p));
        }
    }
    eprintln!("building fleet-node (cargo build -p fleet-node)…");
    let st = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "-q", "-p", "fleet-node"])
        .status()
        .map_err(|e| anyhow::anyhow!("fleet-node is not built and cargo cannot run: {e}"))?;
    anyhow::ensure!(
        st.success() && beside.exists(),
        "cannot build fleet-node; build it with: cargo build -p fleet-node"
    );
    Ok(beside)
}

pub const DEFAULT_IMAGE: &str = "fleet-dev-agent:latest";
pub const DEV_TOKEN_AUDIENCES: &str = "notification-service";
pub const DEV_TOKEN_SCOPES: &str = "control-plane:read control-plane:write notification-service=notifications:send";

/// What `dev` started, for the caller to print or use.
pub struct DevFleet {
    pub devkit: Devkit,
    pub controller: server::Running,
    pub admin_token: String,
    pub join_key: String,
    pub node_yaml: PathBuf,
    /// Where the Kubernetes mirror writes, for the printout.
    pub mirror: String,
}

fn abs(p: &Path) -> PathBuf {
    std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
}

pub async fn start(args: &DevArgs) -> anyhow::Result<DevFleet> {
    let dir = abs(&args.dir);
    anyhow::ensure!(
        fleet_api::names::is_node_name(&args.node_name),
        "--node-name {:?} is not a node name",
        args.node_name
    );
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    // The embedded CP and IAM live in memory: every dev run starts from a fresh store and
    // node state, so nothing refers to principals of an earlier run.
    for stale in ["fleet.sqlite", "fleet.sqlite-wal", "fleet.sqlite-shm"] {
        let _ = std::fs::remove_file(dir.join(stale));
    }
    let _ = std::fs::remove_dir_all(dir.join("node-state"));
    // The mirror's variables, read as `serve` reads them (docs/behaviour.md#development-kit).
    let kubernetes = crate::config::KubernetesConfig::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
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
    let cfg = controller_config(args, &dir, &devkit, &dk_cfg, kubernetes.clone());
    let controller = server::start(cfg).await?;
    let admin_token = devkit.mint("fleet", &["fleet:admin"], 86_400);
    let (join_key, _) = controller.store.issue_join_key(Duration::from_secs(3600), "dev", &Default::default()).await?;
    let key_file = dir.join("join-key");
    write_private(&key_file, join_key.as_bytes())?;
    let node_yaml = dir.join("node.yaml");
    let yaml = format!(
        "# Written by `fleet-controller dev`: a node on this machine's Docker.\n\
         controllerUrl: http://{addr}\n\
         name: {node}\n\
         containerPrefix: {node}\n\
         labels: []\n\
         capacity: {{slots: 4}}\n\
         executors:\n  {kind}: {{image: \"{image}\", dataPath: /data}}\n\
         stateDir: {dir}/node-state\n\
         secretsDir: {dir}/secrets\n\
         joinKeyFile: {key}\n\
         observeSeconds: 5\n\
         checkBeforeStop: true\n",
        addr = controller.addr,
        node = args.node_name,
        kind = args.executor_kind,
        image = args.image,
        dir = dir.display(),
        key = key_file.display(),
    );
    std::fs::write(&node_yaml, yaml)?;
    let mirror = mirror_target(&kubernetes).await;
    Ok(DevFleet { devkit, controller, admin_token, join_key, node_yaml, mirror })
}

/// Where the mirror writes, said in one line: the namespace and the API server, or why not.
async fn mirror_target(k: &crate::config::KubernetesConfig) -> String {
    if !k.mirror {
        return "off (FLEET_KUBERNETES_MIRROR=true mirrors this fleet into the cluster KUBECONFIG names)".into();
    }
    match crate::k8s::task::connect(k).await {
        Ok((_, ns, url)) => format!(
            "FleetNode and FleetPlacement objects in namespace {ns} at {url}\n  \
             kubectl -n {ns} get fleetnodes,fleetplacements"
        ),
        Err(why) => format!("on, but {why}"),
    }
}

/// The controller's configuration: the devkit as its CP and IAM, the store in `dir`, the
/// defaults elsewhere, and the mirror's variables from the environment.
fn controller_config(
    args: &DevArgs,
    dir: &Path,
    devkit: &Devkit,
    dk_cfg: &DevkitConfig,
    kubernetes: crate::config::KubernetesConfig,
) -> Config {
    Config {
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
        node_gc_after: None,
        node_offline_after: Duration::from_secs(crate::config::defaults::NODE_OFFLINE_SECONDS),
        token_revoke_grace: Duration::from_secs(crate::config::defaults::TOKEN_REVOKE_GRACE_SECONDS),
        jwks_refresh: Duration::from_secs(crate::config::defaults::JWKS_REFRESH_SECONDS),
        ca_certs: Vec::new(),
        max_connections: crate::config::defaults::MAX_CONNECTIONS as usize,
        max_connections_per_ip: crate::config::defaults::MAX_CONNECTIONS_PER_IP as u32,
        unauth_buffer_bytes: crate::config::defaults::UNAUTH_BUFFER_BYTES as usize,
        trusted_proxies: Vec::new(),
        kubernetes: kubernetes.clone(),
        log_format: LogFormat::Text,
        http_timeouts: Default::default(),
        leader_lease: Duration::from_secs(crate::config::defaults::LEADER_LEASE_SECONDS),
        replica_name: "dev".into(),
        advertise_url: format!("http://{}", args.listen),
        replica_secret: None,
        rollout: Default::default(),
        desired_nodes_at_once: crate::config::DESIRED_NODES_AT_ONCE,
        rollouts_at_once: crate::config::ROLLOUTS_AT_ONCE,
    }
}

/// A file only this user may read (`0600`): the join key is a secret.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.with_node && args.image == DEFAULT_IMAGE {
        build_dev_image(&args.image)?;
    }
    let mut fleet = start(&args).await?;
    let api = format!("http://{}", fleet.controller.addr);
    println!();
    println!("Fleet dev controller  {api}   (metrics http://{}/metrics)", fleet.controller.metrics_addr);
    println!("web view              {api}/ui");
    println!("devkit CP + IAM       {}   (agents: GET {}/devkit/agents)", fleet.devkit.url, fleet.devkit.url);
    println!("store                 {}", abs(&args.dir).join("fleet.sqlite").display());
    println!("Kubernetes mirror     {}", fleet.mirror);
    println!();
    println!("Admin token (fleet:admin, 24 h), and fleetctl to look and operate:");
    println!("  export FLEET_URL={api} FLEET_TOKEN={}", fleet.admin_token);
    println!("  cargo run -q -p fleetctl -- nodes        # or: fleetctl nodes | placements | why coder | events");
    println!("  curl -s -H \"Authorization: Bearer $FLEET_TOKEN\" {api}/api/v1/placements");
    println!();
    println!("Join key (one use, 1 h): {}", fleet.join_key);
    println!();
    let mut node = None;
    if args.with_node {
        let bin = node_binary()?;
        let log = abs(&args.dir).join("node.log");
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let child = tokio::process::Command::new(&bin)
            .arg("--config")
            .arg(&fleet.node_yaml)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", bin.display()))?;
        println!("Node {} started on this machine's Docker (log: {})", args.node_name, log.display());
        println!("  docker ps --filter label=fleet.node={}", args.node_name);
        println!("  curl -s {}/devkit/statuses/coder", fleet.devkit.url);
        node = Some(child);
    } else {
        println!("Start a node on this machine's Docker:");
        println!("  cargo run -p fleet-node -- --config {}", fleet.node_yaml.display());
        println!("(or run `fleet-controller dev --with-node` to have it started for you)");
    }
    println!();
    if args.print_and_exit {
        fleet.controller.shutdown().await;
        return Ok(());
    }
    println!("Serving; Ctrl-C stops. Agent containers keep running after the node stops;");
    println!("remove them with: docker rm -f $(docker ps -aq --filter label=fleet.node={})", args.node_name);
    // Ctrl-C or SIGTERM: stop the node this command started, then the controller.
    // A core task that ends is a fault here as in `serve`: stop and say which.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let ended = tokio::select! {
        _ = tokio::signal::ctrl_c() => None,
        _ = term.recv() => None,
        e = fleet.controller.ended() => Some(e),
    };
    if let Some(mut n) = node {
        let _ = n.kill().await;
    }
    fleet.controller.shutdown().await;
    match ended {
        Some(e) => anyhow::bail!("{e}"),
        None => Ok(()),
    }
}
