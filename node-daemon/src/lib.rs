#![forbid(unsafe_code)]
//! fleet-node: joins the fleet with a one-time key, pulls its desired state, reports what it
//! has, and runs the agents' containers through the Docker Engine API by the container rules
//! of docs/behaviour.md#container-rules. `main.rs` is a thin shell over [`daemon`].

pub mod client;
pub mod config;
pub mod daemon;
pub mod guard;
pub mod lease;
pub mod plan;
pub mod runtime;
pub mod state;
pub mod supervisor;
