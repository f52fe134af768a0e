//! `fleet-node docker-guard` (docs/behaviour.md#packaging-and-the-docker-guard [ext]): a reverse proxy for the Docker Engine API that
//! stands between fleet-node and the engine and admits only what fleet-node uses, with every
//! create body held to this node's node.yaml ([`policy`]). It runs outside the node's process
//! (in the compose file, as its own container with the Docker socket), so a compromised node
//! cannot escape through Docker: no privileged container, no host bind, no exec.

pub mod policy;
mod proxy;

pub use proxy::{serve, Listener, Upstream};
