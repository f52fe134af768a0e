//! The measured phases of a run, one module each, in the order `main` runs them: cold
//! convergence, the steady state, wake latency, the report burst and recovery from silent
//! nodes, or the hostile-client measurement after cold convergence. Each takes the running
//! simulation ([`Sim`]) and returns its figures; [`crate::results`] makes the table and JSON.

pub mod burst;
pub mod cold;
pub mod compare;
pub mod hostile;
pub mod mid_rollout;
pub mod recovery;
pub mod rollout;
pub mod steady;
pub mod takeover;
pub mod wake_latency;

use crate::args::Args;
use crate::controller::{Controller, Replicas};
use crate::node::{Shared, SimNode};
use fleet_devkit::Devkit;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What the phases measure and act on: the devkit, the controller's replicas, the nodes.
pub struct Sim<'a> {
    pub args: &'a Args,
    pub dk: &'a Devkit,
    pub http: &'a reqwest::Client,
    pub replicas: &'a Replicas,
    /// An admin token for the controller's API.
    pub admin: &'a str,
    pub shared: &'a Arc<Shared>,
    pub nodes: &'a [Arc<SimNode>],
}

impl Sim<'_> {
    /// The replica whose placements and metrics are read.
    pub fn leader(&self) -> &Controller {
        self.replicas.leader()
    }

    /// How long a phase may take before the run gives up.
    pub fn phase_limit(&self) -> Duration {
        Duration::from_secs(self.args.phase_timeout_seconds)
    }

    /// Reports the controller accepted so far.
    pub fn reports_ok(&self) -> u64 {
        self.shared.reports_ok.load(Ordering::Relaxed)
    }
}
