//! The container runtime behind a small trait: the bollard implementation drives the real
//! Docker engine; the in-memory fake lets the supervisor's timing be tested on tokio's paused
//! clock. Only `/_ping`, `/version`, containers and volumes endpoints are used (docs/behaviour.md#the-agent-container).

mod contract;
pub mod docker;
pub mod fake;

pub use contract::{
    Bind, ContainerSpec, Hardening, RtError, RunInfo, Runtime, Seen, DEFAULT_PIDS_LIMIT, LABEL_AGENT, LABEL_KIND,
    LABEL_MANAGED, LABEL_NODE, LABEL_REPLICA, LABEL_SPEC, LABEL_SPEC_ID, NOT_THE_GUARDS_FILES,
};
