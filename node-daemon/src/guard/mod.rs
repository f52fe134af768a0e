//! `fleet-node docker-guard` (docs/behaviour.md#packaging-and-the-docker-guard [ext]): a reverse proxy for the Docker Engine API that
//! stands between fleet-node and the engine and admits only what fleet-node uses, with every
//! create body held to this node's node.yaml ([`policy`]). It runs outside the node's process
//! (in the compose file, as its own container with the Docker socket), so a compromised node
//! cannot escape through Docker: no privileged container, no host bind, no exec.
//!
//! The engine decodes bodies with Go's `encoding/json`, which reads keys without case and
//! merges repeated ones; so the guard reads strictly ([`json`], [`shape`]) into its own typed
//! body ([`body`]) and forwards that, never the bytes it received. Queries and paths likewise
//! ([`query`], [`route`]). The engine resolves names and bind paths when it acts, not when the
//! guard checks: so the guard names each container by the engine's id ([`engine`]) and binds
//! only files it wrote itself ([`files`]).

mod body;
pub mod busy;
mod calls;
mod engine;
pub mod files;
mod forward;
mod json;
mod listing;
pub mod policy;
mod proxy;
mod query;
mod refusal;
pub mod route;
mod setup;
mod shape;
mod upstream;

pub use forward::Guard;
pub use proxy::{serve, Listener};
pub use setup::{prepare, start};
pub use upstream::Upstream;
