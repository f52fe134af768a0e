//! The records the registry keeps, each in its own module with the size test that guards it:
//! nodes and their lifecycle, identities and PATs, desired states, reported replicas, sealed
//! boxes and events, and the mark of a store older than the fleet. Records are plain data with the rules that read them; how they change is
//! the registry's business (`store::registry`).

pub mod catch_up;
pub mod claims;
pub mod cred;
pub mod desired;
pub mod event;
pub mod linger;
pub mod node;
pub mod rollout;
pub mod sealed;
pub mod seen;

pub use cred::{Cred, IdentityRec, MaybeMs, PairRec, RetiringCred};
pub use desired::DesiredRec;
pub use linger::Linger;
pub use node::{Action, Deleted, DrainProgress, Lifecycle, NodeInfo, NodeRec};
pub use rollout::{NodeStep, Rollout};
pub use sealed::Sealed;
pub use seen::Seen;
