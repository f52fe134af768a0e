//! A replica a drain moved that still runs on its old node (docs/behaviour.md#rolling-out-a-change):
//! drains move make-before-break, so the old node keeps the replica in its desired state
//! until the new node reports it running, or the agent's progress deadline passes; then it
//! keeps the agent with no replica while the old container stops with the agent's drain.

use crate::model::Id;
use serde::{Deserialize, Serialize};

/// Key prefix of the stored records: `linger/<agent>/<replica>`.
pub const PREFIX: &str = "linger/";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Linger {
    /// The draining node the replica still runs on.
    pub from: Id,
    /// The node it moved to; `from` itself for a replica a scale-down removed that waits
    /// there while it is busy (docs/behaviour.md#busy-replicas).
    pub to: Id,
    /// When it moved (ms).
    pub since_ms: i64,
    /// When the old node was told to stop it (ms): it keeps the agent, with no replica, for
    /// the agent's drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_ms: Option<i64>,
}

impl Linger {
    pub fn key(agent: &str, replica: u32) -> String {
        format!("{PREFIX}{agent}/{replica}")
    }

    /// The (agent, replica) of a stored key.
    pub fn parse_key(key: &str) -> Option<(&str, u32)> {
        let (agent, replica) = key.strip_prefix(PREFIX)?.rsplit_once('/')?;
        Some((agent, replica.parse().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back() {
        assert_eq!(Linger::parse_key(&Linger::key("coder", 3)), Some(("coder", 3)));
        assert_eq!(Linger::parse_key("linger/coder"), None);
        assert_eq!(Linger::parse_key("rollout/coder"), None);
        assert_eq!(Linger::parse_key("linger/coder/x"), None);
    }
}
