//! The reconciler's side calls as keyed work items — an agent's identity, a pair's PAT, a
//! revocation, a CP status — handled idempotently from the registry's current state by a
//! fixed set of workers, queued with per-key backoff, plus the PAT rotation schedule, the
//! backlog of work waiting for room, and node GC.

pub mod backlog;
pub mod gc;
pub mod items;
pub mod key;
pub mod queue;
pub mod queues;
pub mod rotating;
pub mod rotation;

pub use items::{worker, workers};
pub use key::{first_rotation_ms, rotate_at_ms, WorkKey};
pub use queues::{Ctx, Work};
