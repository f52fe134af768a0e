//! The node daemon (docs/behaviour.md#joining-and-the-state-directory and docs/behaviour.md#the-nodes-loops): two loops over one state. The **link** to the controller
//! gets the desired state and reports what the node has; the **converge** loop moves the
//! containers towards the newest desired state. At start the node applies `desired.json`
//! from disk before the controller answers, so without the controller it keeps working.
//!
//! This module wires the pieces: `join` gets the node's identity, then the
//! link and converge loops run under `loops` until one ends or the node is
//! told to stop.

mod announce;
mod converge;
mod desired;
mod fatal;
mod join;
mod link;
mod loops;
mod shared;

pub use announce::VERSION;
pub use desired::parse_desired;
pub use fatal::{Fatal, CREDENTIAL_REJECTED, NODE_UNKNOWN, NOT_JOINED};
pub use shared::Shared;

use crate::client::Client;
use crate::config::NodeConfig;
use crate::runtime::docker::DockerRuntime;
use crate::runtime::Runtime;
use crate::state::{Identity, StateDir};
use announce::Reporter;
use link::Link;
use loops::Loops;
use std::sync::Arc;
use tokio::sync::watch;

/// Runs the node; `exchange`: speak the exchange when the controller offers it (else only the
/// two routes).
pub async fn run(cfg: NodeConfig, exchange: bool) -> Result<(), Fatal> {
    let state = StateDir::open(&cfg.state_dir)?;
    for w in cfg.secret_warnings(&crate::plan::read_secrets(&cfg.secrets_dir)) {
        tracing::warn!("{w}");
    }
    let client = Client::new(&cfg.controller_url, cfg.ca_file.as_deref()).map_err(|e| Fatal(e.to_string()))?;
    if !exchange {
        tracing::info!("node protocol: the two routes (--protocol two-routes)");
        client.decline();
    }
    let identity = join::identity(&cfg, &state, &client).await?;
    let rt = DockerRuntime::connect(&cfg.docker_url, &cfg.name).map_err(|e| Fatal(e.to_string()))?;
    run_with(Arc::new(cfg), state, client, identity, rt).await
}

/// Runs a joined node on `rt` until a loop ends (an error) or a shutdown signal (`Ok`).
pub async fn run_with<R: Runtime>(
    cfg: Arc<NodeConfig>,
    state: StateDir,
    client: Client,
    identity: Identity,
    rt: R,
) -> Result<(), Fatal> {
    let (tx, rx) = watch::channel(desired::saved(&state)?);
    let shared = Arc::new(Shared::default());
    let identity = Arc::new(identity);
    let reporter = Reporter::new(cfg.clone(), shared.clone());
    let link = Link::new(cfg.clone(), client, identity.clone(), state.clone(), reporter);
    let mut loops = Loops::new();
    let fatal = loops.fatal();
    loops.spawn("controller", link.run(tx, fatal));
    loops.spawn("supervisor", converge::supervise(cfg, state, identity, rt, rx, shared));
    loops.run().await
}
