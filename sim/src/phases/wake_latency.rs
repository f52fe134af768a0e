//! Wake latency: `--wake-samples` agent changes in the CP, one after the other, each timed
//! until a node's long-poll returns it ([`crate::wake`]).

use super::Sim;
use crate::wake;
use std::time::Duration;

/// The samples, sorted.
pub async fn measure(sim: &Sim<'_>) -> anyhow::Result<wake::Samples> {
    let mut samples = wake::Samples::default();
    for _ in 0..sim.args.wake_samples {
        wake::sample(sim.dk, sim.shared, sim.args.agents, &mut samples).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(samples.finish())
}
