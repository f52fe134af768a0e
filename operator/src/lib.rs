#![forbid(unsafe_code)]
//! fleet-controller: keeps nodes and placements, places agent replicas, issues their
//! identities and PATs, serves the node protocol and the admin API, and reports agent status
//! to the Control Plane. `main.rs` is a thin shell over [`server`] and [`dev`].

pub mod backup;
pub mod cidr;
pub mod clock;
pub mod config;
pub mod context;
#[cfg(feature = "dev")]
pub mod dev;
pub mod http;
pub mod k8s;
pub mod leader;
pub mod metrics;
pub mod model;
pub mod platform;
pub mod reconcile;
pub mod server;
pub mod store;
pub mod supervisor;
pub mod trigger;
