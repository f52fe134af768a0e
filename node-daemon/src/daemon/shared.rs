//! What the converge loop learns and the link reports: the replicas' states, whether Docker
//! answers, and the generation last applied.

use fleet_api::ReplicaReport;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64};

/// What the loops share.
#[derive(Default)]
pub struct Shared {
    pub reports: Mutex<Vec<ReplicaReport>>,
    pub degraded: AtomicBool,
    pub applied_generation: AtomicU64,
}
