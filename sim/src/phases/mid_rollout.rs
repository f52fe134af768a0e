//! With `--rollout`: CP changes made while the fleet-wide rollout runs (`--mid-rollout-agents`,
//! one new agent of one replica a round of the rollout's sampling, about one a second), each
//! timed from its edit in the CP until a node holds it — how long other work waits behind the
//! rollout's passes.

use crate::measure::percentile;
use crate::node::Shared;
use fleet_devkit::Devkit;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long an agent added mid-rollout may take to reach a node before it counts as missing.
const REACH_WITHIN: Duration = Duration::from_secs(60);

/// The agents added so far: (key, when the CP had it).
pub struct MidChanges {
    wanted: u32,
    first: usize,
    added: Vec<(String, Instant)>,
}

impl MidChanges {
    /// `wanted` agents, numbered from `first` (past the fleet's own and the takeover's).
    pub fn new(wanted: u32, first: usize) -> MidChanges {
        MidChanges { wanted, first, added: Vec::new() }
    }

    /// Adds the next agent, while fewer than wanted were.
    pub fn tick(&mut self, dk: &Devkit) {
        if self.added.len() >= self.wanted as usize {
            return;
        }
        let i = self.first + self.added.len();
        dk.put_agent(fleet_devkit::state::synthetic_agent(i, 1));
        self.added.push((format!("agent-{i:05}"), Instant::now()));
    }

    /// Each added agent's time to a node (ms), waiting for the last ones: p50, p99, max, and
    /// how many never reached one.
    pub async fn latencies(&self, shared: &Shared) -> Value {
        let deadline = Instant::now() + REACH_WITHIN;
        loop {
            let (mut ms, missing) = self.reached(shared);
            if missing == 0 || Instant::now() > deadline {
                ms.sort_by(f64::total_cmp);
                return json!({
                    "changes": self.added.len(), "missing": missing,
                    "p50": percentile(&ms, 0.5), "p99": percentile(&ms, 0.99), "max": ms.last(),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn reached(&self, shared: &Shared) -> (Vec<f64>, usize) {
        let received = shared.received.lock();
        let mut ms = Vec::with_capacity(self.added.len());
        for (key, at) in &self.added {
            if let Some(got) = received.get(&(key.clone(), 1)) {
                ms.push(got.saturating_duration_since(*at).as_secs_f64() * 1000.0);
            }
        }
        let missing = self.added.len() - ms.len();
        (ms, missing)
    }
}
