//! Deciding what should be: placement, PAT ceilings and agent status are pure functions;
//! the pass drives them over the registry; work items carry out the side calls.

pub mod agents;
pub mod audit;
pub mod backlog;
pub mod ceiling;
pub mod derive;
pub mod desired;
pub mod explain;
pub mod gauges;
pub mod gc;
pub mod liveness;
pub mod memo;
pub mod node_agents;
pub mod pass;
pub mod placement;
pub mod queue;
pub mod rotation;
pub mod status;
pub mod views;
pub mod work;
