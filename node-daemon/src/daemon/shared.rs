//! What the converge loop learns and the link reports: the replicas' states, whether Docker
//! answers, the generation last applied, and when a report cannot wait for its period.

use fleet_api::ReplicaReport;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64};
use tokio::sync::Notify;

/// What the loops share.
#[derive(Default)]
pub struct Shared {
    pub reports: Mutex<Vec<ReplicaReport>>,
    pub degraded: AtomicBool,
    pub applied_generation: AtomicU64,
    /// A replica went busy or idle: the link reports before its period is up.
    pub report_now: Notify,
}
