//! The reconciler's context: the services it shares with the rest of the controller
//! ([`crate::context::Context`]) and its own work — the keyed work queue and the PAT rotation
//! schedule, which no one outside the reconciler touches.

use super::key::WorkKey;
use super::queue::{Backoff, WorkQueue};
use super::rotating::Rotating;
use super::rotation::Rotations;
use std::time::Duration;

/// What the pass, the workers and the audit take.
pub type Ctx = crate::context::Context<Work>;

/// The reconciler's own queue and schedule.
pub struct Work {
    pub queue: WorkQueue<WorkKey>,
    /// When each live PAT is rotated (its work is queued then).
    pub rotations: Rotations,
    /// PAT rotations under way, each a step in its agent's disruption budget.
    pub rotating: Rotating,
}

impl Default for Work {
    fn default() -> Work {
        Work {
            queue: WorkQueue::new(Backoff { base: Duration::from_secs(1), max: Duration::from_secs(300) }),
            rotations: Rotations::default(),
            rotating: Rotating::default(),
        }
    }
}
