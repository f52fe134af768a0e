//! Kubernetes (docs/behaviour.md#kubernetes-mirror): the `FleetNode` / `FleetPlacement` custom
//! resources and the mirror that projects the store into them when
//! `FLEET_KUBERNETES_MIRROR=true`. The mirror is a task of its own beside the leader's work
//! (`task`); it checks the cluster (`check`), watches this fleet's objects (`watch`) into a
//! belief learnt from the server (`belief`), plans what differs from the store (`desired`,
//! `plan`) and writes it (`mirror`), taking back what other field managers set (`fields`), and
//! says once when the API server goes and comes back (`health`).

pub mod belief;
pub mod check;
pub mod crd;
pub mod desired;
pub mod fields;
pub mod health;
pub mod kind;
pub mod mirror;
pub mod names;
pub mod plan;
pub mod task;
pub mod watch;

pub use task::SYNC_PERIOD;
