//! The pure rules: functions of their inputs, no I/O and no clock of their own.

pub mod ceiling;
pub mod derive;
pub mod desired;
pub mod explain;
pub mod move_budget;
pub mod node_agents;
pub mod placement;
pub mod rollout;
pub mod status;
pub mod views;
