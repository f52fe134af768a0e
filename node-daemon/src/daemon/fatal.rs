//! Why the node process ends: the error every piece of the daemon returns or sends when the
//! node cannot go on, with the messages of the two ends the operator must act on.

pub const NOT_JOINED: &str = "node is not joined and no join key file is configured";
pub const CREDENTIAL_REJECTED: &str = "the controller no longer accepts this node's credential";
/// Logged, not fatal: the controller's store does not know this node (docs/behaviour.md#a-store-older-than-the-fleet).
pub const NODE_UNKNOWN: &str = "the controller does not know this node (its store is older than this node's join: \
restored from a backup?); the agents keep running on the last desired state; to be served again, join it with a new \
join key: stop fleet-node, remove token and node-id from stateDir, put the key in joinKeyFile, start it";

/// Ends the process with a message and a non-zero exit.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fatal(pub String);

impl From<crate::state::StateError> for Fatal {
    fn from(e: crate::state::StateError) -> Self {
        Fatal(e.to_string())
    }
}
