#![forbid(unsafe_code)]
//! The wire contract shared by `fleet-controller` and `fleet-node`: the node-protocol and
//! admin-API types (SPEC §3.3, §4), validation of names, labels, secret names and capacity,
//! label matching (§5.1), image allow-list matching (§6.6) and the sealed-box helpers that
//! carry a PAT to exactly one node (§5.2). It knows no transport: no tokio, axum or Docker.

pub mod codes;
pub mod failpoint;
pub mod images;
pub mod labels;
pub mod names;
pub mod ops;
pub mod protocol;
pub mod seal;
pub mod types;
pub mod urls;
pub mod validate;

pub use ops::*;
pub use types::*;
