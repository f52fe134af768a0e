//! Times the controller's read of the CP agent list against devkit (20,000 agents, pages of
//! 500, as in fleet-sim), without the simulator's load: `cargo run --release --example
//! list_profile -p fleet-controller [agents] [rounds]`.

use fleet_controller::config::ClientCredentials;
use fleet_controller::platform::cp::{AgentsFetch, CpClient};
use fleet_controller::platform::token::TokenSource;
use fleet_devkit::state::synthetic_agent;
use fleet_devkit::{Devkit, DevkitConfig};
use std::sync::Arc;
use std::time::Instant;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(20_000);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    let cfg = DevkitConfig { page_size: 500, ..Default::default() };
    let creds = ClientCredentials { client_id: cfg.client_id.clone(), client_secret: cfg.client_secret.clone() };
    let dk = Devkit::start(cfg, "127.0.0.1:0".parse()?).await?;
    dk.put_agents((0..n).map(|i| synthetic_agent(i, 5)).collect());
    let http = reqwest::Client::new();
    let tokens = Arc::new(TokenSource::new(
        http.clone(),
        &dk.url,
        Some(creds),
        fleet_controller::platform::CallGate::always("test"),
    ));
    let cp = CpClient::new(http, &dk.url, tokens, fleet_controller::platform::CallGate::always("test"));
    let mut times = Vec::new();
    // The list in force, as the controller passes it: the first read has none.
    let mut previous = Arc::new(Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        match cp.list_agents(None, &previous).await? {
            AgentsFetch::List { agents, .. } => {
                assert_eq!(agents.len(), n);
                previous = Arc::new(agents);
            }
            AgentsFetch::NotModified => anyhow::bail!("304 without an ETag"),
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{n} agents, {rounds} reads: min {:.1} ms, median {:.1} ms, max {:.1} ms",
        times[0],
        times[rounds / 2],
        times[rounds - 1]
    );
    Ok(())
}
