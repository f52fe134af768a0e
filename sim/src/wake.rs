//! Long-poll wake latency: an agent changes in the CP and the time until a simulated node
//! holds the new revision is measured from three points (the CP list that carried it was
//! served, its last page was served, the edit itself).

use crate::measure::{percentile, wait_until};
use crate::node::Shared;
use fleet_devkit::Devkit;
use rand::Rng;
use serde_json::json;
use std::time::{Duration, Instant};

/// Samples in milliseconds, kept sorted by [`Samples::finish`].
#[derive(Debug, Default)]
pub struct Samples {
    /// The CP list carrying the change was served → a node has it.
    pub wake: Vec<f64>,
    /// The list's last page was served → a node has it.
    pub listed: Vec<f64>,
    /// The CP edit → a node has it (includes the controller's CP poll period).
    pub edit: Vec<f64>,
}

impl Samples {
    pub fn finish(mut self) -> Samples {
        for v in [&mut self.wake, &mut self.listed, &mut self.edit] {
            v.sort_by(f64::total_cmp);
        }
        self
    }

    pub fn wake_p(&self, q: f64) -> Option<f64> {
        percentile(&self.wake, q)
    }
}

/// Changes one random agent's revision and records how long until a node received it.
pub async fn sample(dk: &Devkit, shared: &Shared, agents: usize, into: &mut Samples) -> anyhow::Result<()> {
    let key = format!("agent-{:05}", rand::thread_rng().gen_range(0..agents));
    let mut rev = 0;
    dk.edit_agent(&key, |a| {
        rev = a["revision"].as_u64().unwrap_or(1) + 1;
        a["revision"] = json!(rev);
    });
    let version = dk.state.lock().version;
    let t_edit = Instant::now();
    wait_until(Duration::from_secs(30), "a node to receive the changed agent", || {
        shared.received.lock().contains_key(&(key.clone(), rev))
    })
    .await?;
    let recv = shared.received.lock()[&(key.clone(), rev)];
    let (served, listed) = {
        let st = dk.state.lock();
        (st.version_served_at.get(&version).copied(), st.version_listed_at.get(&version).copied())
    };
    let ms = |since: Instant| recv.saturating_duration_since(since).as_secs_f64() * 1000.0;
    into.wake.extend(served.map(ms));
    into.listed.extend(listed.map(ms));
    into.edit.push(ms(t_edit));
    Ok(())
}
