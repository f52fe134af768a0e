#![forbid(unsafe_code)]
//! The wire contract shared by `fleet-controller` and `fleet-node`: the node-protocol and
//! admin-API types (docs/reference.md#http-api, docs/behaviour.md#node-protocol), validation of names, labels, secret names and capacity,
//! label matching (docs/behaviour.md#placement), image allow-list matching (docs/behaviour.md#images-an-agent-may-name),
//! the allowances of what a node may claim (docs/behaviour.md#what-a-node-may-claim) and the sealed-box helpers that
//! carry a PAT to exactly one node (docs/behaviour.md#identity-and-pats). It knows no transport: no tokio, axum or Docker.

pub mod claims;
pub mod codes;
pub mod failpoint;
pub mod images;
pub mod labels;
pub mod names;
pub mod ops;
pub mod protocol;
pub mod rollout;
pub mod seal;
pub mod text;
pub mod types;
pub mod urls;
pub mod validate;
pub mod windows;

pub use ops::*;
pub use rollout::{RolloutPolicy, RolloutState, RolloutView};
pub use types::*;
