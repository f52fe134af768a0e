//! Why the node process ends: the error every piece of the daemon returns or sends when the
//! node cannot go on, with the messages of the two ends the operator must act on.

pub const NOT_JOINED: &str = "node is not joined and no join key file is configured";
pub const CREDENTIAL_REJECTED: &str = "the controller no longer accepts this node's credential";

/// Ends the process with a message and a non-zero exit.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fatal(pub String);

impl From<crate::state::StateError> for Fatal {
    fn from(e: crate::state::StateError) -> Self {
        Fatal(e.to_string())
    }
}
