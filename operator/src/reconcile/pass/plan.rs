//! What one pass decides, gathered by its phases before anything is written.

use crate::model::Id;
use crate::reconcile::work::WorkKey;
use crate::store::db::PassWrite;
use crate::store::PassPublish;
use std::time::Duration;

/// Revoke delay for a PAT whose pair was retired on an online node: the stop timeout the
/// node uses for an agent that left its desired state (`fleet-node`'s `VANISHED_STOP`).
pub const VANISHED_DRAIN: Duration = Duration::from_secs(30);

/// What one pass decided: the rows to store, what to publish, and the work to queue.
#[derive(Default)]
pub struct Plan {
    pub(super) rows: PassWrite,
    pub(super) publish: PassPublish,
    pub(super) work: Vec<WorkKey>,
    /// PAT rotations to schedule: (node, due in ms).
    pub(super) rotations: Vec<(Id, i64)>,
    pub(super) views_changed: bool,
}
